//! Shared by the integration tests: the repository root and a small complete run config.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root (the data and tokenizer live there).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A small but complete run config: fp4 m / fp8 v with stochastic rounding, resets shorter
/// than the run, grad_accum 2, evaluation and checkpoints on intervals.
pub fn base_toml(run_dir: &Path, name: &str) -> String {
    let r = root();
    let r = r.display();
    format!(
        r#"[model]
hidden_size = 32
intermediate_size = 64
num_layers = 1
num_heads = 2

[data]
train = ["{r}/data/c4-sample/en-train.*.json.gz"]
validation = ["{r}/data/c4-sample/en-validation.*.json.gz"]
tokenizer = "{r}/data/tokenizers/t5-tokenizer.json"
seq_len = 32
val_tokens = 512

[optim]
lr = 3e-3
warmup_steps = 2
grad_clip = 1.0

[optim.states]
m_format = "fp4"
v_format = "fp8"
m_rounding = "stochastic"
v_rounding = "stochastic"
block_size = 32
m_reset_every = 2
v_reset_every = 4

[train]
seed = 7
micro_batch = 2
grad_accum = 2
max_steps = 8
eval_every = 3
checkpoint_every = 3
keep_checkpoints = 2

[run]
name = "{name}"
dir = "{dir}"
stall_detail_every = 2
plots = false
"#,
        dir = run_dir.display()
    )
}

