//! Shared by the integration tests of lowbit-train and lowbit-cli (which adds the binary's
//! helpers): the repository root, a small complete run config, run-folder snapshots.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root (the data and tokenizer live there).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A small but complete run config: fp4 m / fp8 v with stochastic rounding, resets shorter
/// than the run, grad_accum 2, evaluation and checkpoints on intervals; the bundled sample's
/// token shards, rows in the default (in-memory, shuffled) order.
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
train = ["{r}/data/c4-sample/en-train.*.tokens.zst"]
validation = ["{r}/data/c4-sample/en-validation.*.tokens.zst"]
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

/// Checkpoint folder names of a run folder, oldest first.
pub fn checkpoints(run: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Every file under `dir` with its size and a hash of its bytes (to show that a folder was
/// not touched).
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, (usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), (bytes.len(), h.finish()));
            }
        }
    }
    out
}
