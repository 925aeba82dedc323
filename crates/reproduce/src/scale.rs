//! How big a reproduction is: the `--set` overrides that shrink a cell's config (the paper's
//! LLaMA-100M run) to a scale, the reset periods at that scale, the default runs per GPU and
//! seeds, and the text that says what the scale can and cannot show.

use super::paper::{Cell, Fmt};

/// `--scale`: how big a reproduction is.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Tiny model on the bundled CPU sample: a pipeline check (minutes on a CPU).
    Smoke,
    /// LLaMA-20M on the shared offline corpus, sized from the measured H200 speed; data read
    /// in file order (the setting the committed h200 tables ran in, before shuffling existed).
    H200,
    /// LLaMA-20M on both offline corpora, shuffled, at 128 x 256 tokens per step and the
    /// learning rate tuned for FP32 states (issue 50's setting; [`H200S_STEPS`]).
    H200Shuffled,
    /// The paper's LLaMA-100M setting, as the config files hold it.
    Full,
}

/// Optimizer steps per second that the runs sharing one H200 make together at the `h200`
/// scale's shape (LLaMA-20M, FP32 model, 16 x 256 tokens per step), measured with the
/// explicit-backward training step: 7 runs of 4000 steps in 345 s, start-up and validation
/// included, twice (about 332k tokens/s; the first fused step made ~60: 22 runs of 1000
/// steps in 371 s, 10 of 3000 in 501 s, whether 10 or 22 ran at once).
pub const H200_STEPS_PER_S: f64 = 81.0;

/// Seconds of runs one device command may hold: 8.5 of its 10 minutes, the rest for the
/// machine's start-up of the processes, validation and the copy back.
pub const COMMAND_RUN_S: f64 = 510.0;

/// Steps of one `h200` run: 4000 x 4096 tokens = 16.4M tokens.
pub const H200_STEPS: u64 = 4000;

/// Steps of one `h200-shuffled` run: 2400 x 32,768 tokens = 78.6M tokens, 1.97 passes over
/// the 40.0M target tokens of the two offline corpora.
pub const H200S_STEPS: u64 = 2400;

/// Peak learning rate of the `h200-shuffled` scale: the best of the FP32-state sweep
/// (`bench/lr_sweep_h200.md`: 1e-3 3.615, 2e-3 3.520, 4e-3 3.501, 6e-3 3.489, 8e-3 3.495).
pub const H200S_LR: f64 = 6e-3;

impl Scale {
    /// The `--scale` value, also part of the table's file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::H200 => "h200",
            Scale::H200Shuffled => "h200-shuffled",
            Scale::Full => "full",
        }
    }
    /// Runs at once per GPU by default (smoke: runs at once on the CPU). `h200`: as many
    /// runs of [`H200_STEPS`] as one GPU finishes in [`COMMAND_RUN_S`] at [`H200_STEPS_PER_S`]
    /// (10: 40,000 steps, ~490 s), so that one command runs each of its runs to the end.
    pub fn jobs_per_gpu(self) -> usize {
        match self {
            Scale::Smoke => 2,
            Scale::H200 => (H200_STEPS_PER_S * COMMAND_RUN_S / H200_STEPS as f64) as usize,
            // one run fills the GPU at 128 x 256, and a full-length run pays ~1.6 s of start-up
            // and validation: one at a time, runs made 0.96-0.97x of one run's tokens/s alone
            // (H100, 12-06: five in 136-138 s), against ~0.90x with 2 at once (H100, 12-05),
            // 0.88x (the main table's 13 runs, H200), 0.94x (A.10's 2, H100) and 0.89x with 3
            // (Table 2's first runs, FP32 model, H100, 12-07). Only 300-step runs, where
            // start-up weighs 8x more, gain from company (bench/training_h100.md)
            Scale::H200Shuffled => 1,
            Scale::Full => 1,
        }
    }
    /// Default `--jobs`: [`Scale::jobs_per_gpu`] times the GPUs found (at least one).
    pub fn default_jobs(self, gpus: usize) -> usize {
        self.jobs_per_gpu() * gpus.max(1)
    }
    /// Default seed count (seeds 0..N) when neither `--seeds` nor `--seed-list` is given.
    pub fn default_seeds(self) -> usize {
        match self {
            Scale::Smoke => 1,
            Scale::H200 => 2,
            Scale::H200Shuffled => 3,
            Scale::Full => 1,
        }
    }
    /// The paper's reset periods are divided by this (smoke 50, the others 1).
    pub fn reset_divisor(self) -> u64 {
        match self {
            Scale::Smoke => 50,
            Scale::H200 | Scale::H200Shuffled | Scale::Full => 1,
        }
    }
}

/// Reset period of a resetting cell at a scale: the paper's period divided by the scale's
/// divisor ([`Scale::reset_divisor`]).
pub fn reset_period(scale: Scale, fmt: Fmt) -> u64 {
    (fmt.paper_reset_period() / scale.reset_divisor()).max(1)
}

/// The `--set` overrides that turn a cell's config into the scale's run (before the run's
/// folder and seed). `full` adds none: the cell as configured.
pub fn scale_overrides(scale: Scale, (fmt, fix): Cell) -> Vec<String> {
    let mut o: Vec<String> = match scale {
        Scale::Full => return vec![],
        Scale::Smoke => [
            "model.preset=\"tiny\"",
            "data.train=[\"data/c4-sample/en-train.*.tokens.zst\"]",
            "data.validation=[\"data/c4-sample/en-validation.*.tokens.zst\"]",
            "data.seq_len=64",
            "data.val_tokens=4096",
            "optim.lr=3e-3",
            "optim.warmup_steps=3",
            "train.micro_batch=4",
            "train.grad_accum=1",
            "train.max_steps=30",
            "train.eval_every=0",
            "train.device=\"cpu\"",
            "train.checkpoint_every=0",
            "train.keep_checkpoints=1",
            "run.plots=false",
            "run.stall_detail_every=0",
        ]
        .map(String::from)
        .to_vec(),
        Scale::H200 => [
            "model.preset=\"llama20m\"",
            "data.train=[\"data/local/corpus/en-train.*.json.gz\"]",
            "data.validation=[\"data/local/corpus/en-validation.*.json.gz\"]",
            "data.seq_len=256",
            "data.val_tokens=250000",
            // the tables were run before the data could be shuffled: in file order
            "data.shuffle=false",
            "optim.lr=1e-3",
            "optim.warmup_steps=400",
            "train.micro_batch=16",
            "train.grad_accum=1",
            "train.eval_every=1000",
            "train.device=\"cuda\"",
            "train.checkpoint_every=0",
            "train.keep_checkpoints=1",
            "run.plots=false",
            "run.stall_detail_every=1000",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!("train.max_steps={H200_STEPS}")])
        .collect(),
        Scale::H200Shuffled => [
            "model.preset=\"llama20m\"",
            "data.train=[\"data/local/tok/corpus/en-train.*.tokens.zst\", \"data/local/tok/extra/en-train.*.tokens.zst\"]",
            "data.validation=[\"data/local/tok/corpus/en-validation.*.tokens.zst\"]",
            "data.seq_len=256",
            "data.val_tokens=250000",
            "train.micro_batch=128",
            "train.grad_accum=1",
            "train.eval_every=600",
            "train.device=\"cuda\"",
            "train.checkpoint_every=0",
            "train.keep_checkpoints=1",
            "run.plots=false",
            "run.stall_detail_every=600",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            format!("optim.lr={H200S_LR}"),
            format!("optim.warmup_steps={}", H200S_STEPS / 10),
            format!("train.max_steps={H200S_STEPS}"),
        ])
        .collect(),
    };
    let (m, v) = fix.reset_periods(reset_period(scale, fmt));
    if m > 0 {
        o.push(format!("optim.states.m_reset_every={m}"));
    }
    if v > 0 {
        o.push(format!("optim.states.v_reset_every={v}"));
    }
    o
}

/// What a scale is and why, for the report's header.
pub fn scale_description(scale: Scale) -> String {
    let periods = |s: Scale| {
        format!(
            "FP32/BF16 states {}, FP8 {}, FP4 {} steps",
            reset_period(s, Fmt::Bf16),
            reset_period(s, Fmt::Fp8),
            reset_period(s, Fmt::Fp4)
        )
    };
    match scale {
        Scale::Smoke => format!(
            "**smoke** — a pipeline check, not evidence. `tiny` preset (hidden 128, 2 layers, 8.6M \
             parameters, almost all in the embedding and head) on the bundled CPU sample \
             `data/c4-sample` (real English text, *not C4*), seq 64, batch 4 sequences (256 \
             tokens/step), 30 steps (7.7k tokens per run), warmup 3, cosine to 10% of lr 3e-3, \
             validation on the first 4096 tokens of the sample's validation shard, CPU.\n\
             Reset periods: the paper's ÷ 50 = {}, so that every reset cell resets at least once \
             (BF16: once, at step 20) with the paper's ratio between formats. At 30 steps the v \
             state (b2 = 0.999, an averaging horizon of ~1000 steps) is young, bias correction \
             dominates, a reset every few steps mostly throws the average away, and the seed \
             spread is larger than every effect studied: the numbers test that every cell runs \
             end to end and that the report renders, not the paper's claims.",
            periods(Scale::Smoke)
        ),
        Scale::H200 => format!(
            "**h200** — sized from the measured speed, **data in file order** (`data.shuffle = \
             false`: the tables were run before lowbit could shuffle, and the scale keeps that \
             setting so its records stay what they measured; on this corpus of long documents \
             file order costs ~0.75 nats at 128 x 256 tokens per step and changes which formats \
             win: read these tables as the in-order setting). `llama20m` preset (hidden 256, 4 layers, \
             19.6M parameters) on the shared offline corpus `data/local/corpus` (real English \
             text, ~18M tokens, *not C4*; `scripts/link_shared_corpus.sh --copy`), seq 256 (the \
             paper's), batch 16 sequences (4096 tokens/step), 4000 steps (16.4M tokens per run, \
             ~0.9 of one pass over the corpus's training text: no token is seen twice), warmup \
             400, cosine to 10% of lr 1e-3, validation every 1000 steps on the whole shared \
             validation shard (~250k tokens), CUDA, {jobs} runs at once per GPU.\n\
             Derivation: runs sharing one H200 at this shape make ~{steps_s:.0} optimizer steps/s \
             together (measured, FP32 model: 7 runs x 4000 steps in 345 s, start-up and \
             validation included, ~332k tokens/s; the BF16 model ~176, 2.2x: 21 runs of 4000 \
             steps, 11 at once, in 478 s). A device command may run 10 minutes; keeping \
             {run_s:.0} s for runs gives {per_gpu:.0} FP32-model steps per GPU, so {jobs} runs of \
             4000 steps per GPU and command (21 of the BF16 model with `--jobs 11`). 4000 steps \
             of 4096 tokens is the least that meets the issue's 16M tokens per run (10x the first \
             h200 tables) at the one shape measured, and stays \
             inside one pass over the corpus. It also serves the effects: the second half \
             (steps 2000-4000), over which stalled fractions are averaged, starts with states \
             2000 steps old (b2 = 0.999 needs ~1000+ to settle), and the reset cells use the \
             paper's own periods, {} (BF16 3 resets per run, FP8 13, FP4 19), where the first \
             h200 tables (1000 steps) had to divide them by 4 and the resets cost 0.06-0.16 nats. \
             The 1000-step tables' seed-to-seed spread was as large as the effects (paired deltas \
             moved by up to 0.04 nats between seeds): 4x the steps, ending at a flatter part of \
             the loss curve, is the cheapest way to a larger effect-to-spread ratio at this \
             budget; a larger model or batch would cut the tokens per run below 16M. Cost: both \
             tables x 2 seeds of one states kind = 54 runs (Table 2: 14 cells, main table: 13) = \
             216k steps; `paper` and `blockwise` share their FP32/BF16 cells (22 runs), so the \
             second of them adds 32 runs (FP8/FP4 cells). An FP32-model command holds 10 runs, a \
             BF16-model one 21 (`--jobs 11`). Still 5x smaller than the paper's model and 160x fewer tokens: expect \
             smaller gaps than the paper's, and call an ordering only when it holds in every seed.",
            periods(Scale::H200),
            steps_s = H200_STEPS_PER_S,
            run_s = COMMAND_RUN_S,
            per_gpu = H200_STEPS_PER_S * COMMAND_RUN_S,
            jobs = Scale::H200.jobs_per_gpu(),
        ),
        Scale::H200Shuffled => format!(
            "**h200-shuffled** — issue 50's setting. `llama20m` preset (19.6M parameters, BF16 or \
             FP32 model as the table says) on both offline corpora, `data/local/tok/corpus` + \
             `data/local/tok/extra` (token shards of `../shared/data/corpus` and `corpus-extra`, \
             `train data tokenize`: 40.0M target tokens at seq 256, real English text, *not C4*), \
             rows **shuffled** in memory with `train.seed`, seq 256, batch 128 sequences (32,768 \
             tokens/step, 1/4 of the paper's), {steps} steps (78.6M tokens per run, **1.97 passes** \
             over the text), warmup {warmup} and cosine to 10% as the paper, peak lr {lr:e} (the best \
             of the FP32-state sweep, `bench/lr_sweep_h200.md`, kept for every cell as the paper \
             keeps its lr across precisions), validation every 600 steps on 250k tokens of the \
             corpus's validation shard, CUDA, {jobs} run(s) at once per GPU by default (`--jobs`). Reset periods: the paper's, {}.\n\
             Why this shape: at 128 x 256 one BF16-model run fills the GPU (~3.3M tokens/s on the \
             H200, ~24 s per run; ~26 s on an H100); 2400 steps is above the issue's 2000-step \
             floor and stays under 2 passes, so the main table's 13 cells x 3 seeds fit one \
             session's device time (an FP32-model run takes ~143 s on an H100: Table 2's 14 x 2, \
             ~67 min, take three sessions or more); the paper's 512 x 256 would \
             leave ~1250 steps within 4 passes. Still 5x smaller than the paper's model and \
             ~30x fewer tokens: expect smaller gaps than the paper's, and call an ordering only \
             when it holds in every seed.",
            periods(Scale::H200Shuffled),
            steps = H200S_STEPS,
            warmup = H200S_STEPS / 10,
            lr = H200S_LR,
            jobs = Scale::H200Shuffled.jobs_per_gpu(),
        ),
        Scale::Full => format!(
            "**full** — the paper's setting as configured (`configs/paper/base_llama100m.toml`): \
             LLaMA-100M, C4 `en` (`data/local/c4`, `train data fetch c4`), T5 tokenizer, seq 256, \
             batch 512 sequences (64 x 8), 20000 steps (2.6B tokens), warmup 2000, cosine to 10% \
             of lr 1e-3, AdamW (0.9, 0.999, eps 1e-6), validation on 10M C4 validation tokens. Reset \
             periods: the paper's, {}. Time on one H200 at the measured LLaMA-100M speed \
             (`bench/training_h200.md`): ~1.9 h per run with a BF16 model (392k tokens/s), ~9.1 \
             h with an FP32 model (79.8k tokens/s; ~2.9 h with `model.matmul_precision = \"tf32\"`, \
             253k, which changes the numerics).",
            periods(Scale::Full)
        ),
    }
}
