//! How big a reproduction is: the `--set` overrides that shrink a cell's config (the paper's
//! LLaMA-100M run) to a scale, the reset periods at that scale, and the default runs per GPU
//! and seeds. What each scale can and cannot show, and why it has its shape:
//! docs/reproduce.md, "Scales"; a report describes its runs from their resolved config
//! ([`crate::setting`]).

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
    /// learning rate tuned for FP32 states, 2400 steps.
    H200Shuffled,
    /// LLaMA-20M on both offline corpora, shuffled, with the paper's number of updates:
    /// 20,000 steps of 32 x 256 tokens (164M tokens, ~4.1 passes), warmup 2000, peak
    /// learning rate 6e-3.
    PaperUpdates,
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

/// Steps of one `paper-updates` run: the paper's 20,000 updates, at 32 x 256 = 8192 tokens per
/// step (164M tokens, ~4.1 passes over the 40.0M target tokens of the two offline corpora: the
/// paper's ceiling on repeats).
pub const PU_STEPS: u64 = 20_000;

/// Peak learning rate of the `paper-updates` scale: the best of the FP32-state sweep at this
/// shape (ablations `paper_updates_lr_*`, seed 0, one H100: 1.5e-3 3.5539, 3e-3 3.5354, 6e-3
/// 3.5247), at the sweep's edge: `paper_updates_lr_1.2e-2` is its next point.
pub const PU_LR: f64 = 6e-3;

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
            Scale::PaperUpdates => "paper-updates",
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
            // a 32 x 256 step leaves most of the GPU idle: three runs at once made 20,000 steps
            // each in 212-220 s on an H100 (~73 s a run: six in 440 s, three in 217 s,
            // device-log-2026-12-07g), five at once in 395 s (~79 s a run), one alone ~145 s
            Scale::PaperUpdates => 3,
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
            Scale::H200Shuffled | Scale::PaperUpdates => 3,
            Scale::Full => 1,
        }
    }
    /// The paper's reset periods are divided by this (smoke 50, the others 1).
    pub fn reset_divisor(self) -> u64 {
        match self {
            Scale::Smoke => 50,
            Scale::H200 | Scale::H200Shuffled | Scale::PaperUpdates | Scale::Full => 1,
        }
    }
}

/// Reset period of a resetting cell at a scale: the paper's period divided by the scale's
/// divisor ([`Scale::reset_divisor`]).
pub fn reset_period(scale: Scale, fmt: Fmt) -> u64 {
    (fmt.paper_reset_period() / scale.reset_divisor()).max(1)
}

/// The overrides of the scales on both offline corpora (`h200-shuffled`, `paper-updates`):
/// LLaMA-20M on the token shards of `corpus` and `corpus-extra`, rows shuffled (the config's
/// default), seq 256, `micro_batch` sequences per step, `steps` steps with a 10% warmup to
/// peak `lr`, validation and per-tensor stall detail every `eval_every` steps on 250k tokens
/// of the corpus's validation shard, CUDA, no checkpoints or plots.
fn offline_corpora(micro_batch: usize, steps: u64, lr: f64, eval_every: u64) -> Vec<String> {
    let fixed = [
        "model.preset=\"llama20m\"",
        "data.train=[\"data/local/tok/corpus/en-train.*.tokens.zst\", \"data/local/tok/extra/en-train.*.tokens.zst\"]",
        "data.validation=[\"data/local/tok/corpus/en-validation.*.tokens.zst\"]",
        "data.seq_len=256",
        "data.val_tokens=250000",
        "train.grad_accum=1",
        "train.device=\"cuda\"",
        "train.checkpoint_every=0",
        "train.keep_checkpoints=1",
        "run.plots=false",
    ];
    let sized = [
        format!("train.micro_batch={micro_batch}"),
        format!("train.eval_every={eval_every}"),
        format!("run.stall_detail_every={eval_every}"),
        format!("optim.lr={lr}"),
        format!("optim.warmup_steps={}", steps / 10),
        format!("train.max_steps={steps}"),
    ];
    fixed.map(String::from).into_iter().chain(sized).collect()
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
        Scale::H200Shuffled => offline_corpora(128, H200S_STEPS, H200S_LR, 600),
        Scale::PaperUpdates => offline_corpora(32, PU_STEPS, PU_LR, 5000),
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
