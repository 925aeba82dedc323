//! `train reproduce`: run every cell of one of the paper's loss tables and write the result
//! as a markdown table beside the paper's numbers.
//!
//! ```text
//! train reproduce --table bf16-model|fp32-model --scale smoke|h200|full [--jobs N] [--seeds N]
//!                 [--states paper|storage|both] [--set section.key=value ...] [--configs DIR]
//!                 [--out DIR] [--force]
//! ```
//!
//! `--states` picks what the FP8 and FP4 cells store their states in (DESIGN.md): `paper`
//! (default) the precision-only formats the paper's cells are reproduced with (FP8 = e8m3,
//! FP4 = e8m2 for v and [`PAPER_FP4_M`] for m), `storage` the block-scaled formats of the
//! config files (real 8- and 4-bit storage), `both` one report each. FP32 and BF16 cells are
//! the same in both and run once.
//!
//! A cell is one config file (`configs/llama100m_<states>_<fix>.toml` for the BF16-model main
//! table, `configs/fp32_model/llama100m_f32model_<states>_<fix>.toml` for the FP32-model
//! Table 2), run at a *scale*: `full` runs the file as written (the paper's LLaMA-100M
//! setting), `smoke` and `h200` add `--set`-style overrides ([`scale_overrides`]) that shrink
//! the run and scale its reset periods. Each (cell, seed) is a child process
//! `train --config CELL --set ...` of the current executable, in its own run folder
//! `runs/reproduce/<table>-<scale>/<cell>-s<seed>`, at most `--jobs` at once. A run folder
//! whose `config.toml` equals the resolved config and whose `summary.json` reports all steps
//! is reused (so a second `--seeds 2` call only runs the new seed; `--force` reruns).
//!
//! The report (`reproduce/<table>-<scale>.md`) is built by pure functions ([`render`],
//! [`evaluate_claim`]) from per-seed final validation losses and stalled fractions: seed
//! means (and standard deviations when seeds > 1), deltas paired by seed (each fix vs plain,
//! each state format vs FP32 states), and the paper's orderings marked holds / does not hold.

use crate::config::RunConfig;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Command-line arguments of `train reproduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReproduceArgs {
    /// Which table: the main table (BF16 model) or Table 2 (FP32 model).
    #[arg(long, value_enum)]
    pub table: Table,
    /// smoke (tiny model, bundled CPU sample, minutes), h200 (LLaMA-20M on the shared corpus,
    /// one GPU, ~10 minutes), full (the paper's LLaMA-100M setting, as configured).
    #[arg(long, value_enum)]
    pub scale: Scale,
    /// Runs at once (default: smoke 2, h200 14, full 1).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Seeds per cell, 0..N, paired across cells (default: smoke 1, h200 2, full 1).
    #[arg(long)]
    pub seeds: Option<usize>,
    /// FP8/FP4 cells on the paper's precision-only formats, on the block-scaled storage
    /// formats of the config files, or both (one report each).
    #[arg(long, value_enum, default_value = "paper")]
    pub states: StatesArg,
    /// Extra override for every run, applied after the scale's (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Folder holding the cell configs.
    #[arg(long, default_value = "configs")]
    pub configs: PathBuf,
    /// Folder of the markdown report.
    #[arg(long, default_value = "reproduce")]
    pub out: PathBuf,
    /// Parent of the run folders.
    #[arg(long, default_value = "runs/reproduce")]
    pub runs: PathBuf,
    /// Rerun cells even when a finished run with the same config exists.
    #[arg(long)]
    pub force: bool,
    /// Only (re)write the report from the run folders that exist; start no run.
    #[arg(long)]
    pub report_only: bool,
}

/// One of the paper's two loss tables.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Table {
    /// Main table: BF16 weights and activations, plain AdamW -> SR + resets.
    #[value(name = "bf16-model")]
    Bf16Model,
    /// Table 2: FP32 model, states x {nearest, SR, resets, SR + resets}.
    #[value(name = "fp32-model")]
    Fp32Model,
}

impl Table {
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Bf16Model => "bf16-model",
            Table::Fp32Model => "fp32-model",
        }
    }
    fn title(self) -> &'static str {
        match self {
            Table::Bf16Model => "main table (BF16 model)",
            Table::Fp32Model => "Table 2 (FP32 model)",
        }
    }
}

/// `--states`: which state formats the FP8/FP4 cells run on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatesArg {
    Paper,
    Storage,
    Both,
}

impl StatesArg {
    /// The kinds to run, in report order.
    pub fn kinds(self) -> Vec<States> {
        match self {
            StatesArg::Paper => vec![States::Paper],
            StatesArg::Storage => vec![States::Storage],
            StatesArg::Both => vec![States::Paper, States::Storage],
        }
    }
}

/// What the FP8 and FP4 cells store their states in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum States {
    /// The precision-only formats (FP32's exponent, 3 or 2 fraction bits: the theory's grids,
    /// the paper's setting as DESIGN.md reads it).
    Paper,
    /// The block-scaled formats of the config files (FP8 E4M3, FP4 E2M1 / unsigned E2M2,
    /// blocks of 128, zero-free v): the product's real memory saving.
    Storage,
}

/// The first moment of the paper's FP4 cells: 2 fraction bits, as its v (the paper does not
/// say whether m keeps E2M1's 1 or E2M2's 2 bits; DESIGN.md, "Precision-only formats").
/// Measured (`bench/long_run_h200.md`, LLaMA-20M, FP32 model, 3000 steps, nearest): e8m2 m
/// ends 0.082 nats above FP32 states, 0.020 from FP8 (e8m3); e8m1 m ends 0.98 above, its m
/// stalled 86% of the time: with 1 fraction bit every grid point is where 0.9 m rounds back to
/// under round-to-nearest, so m barely decays. The paper's FP4 cells sit 0.006 from its FP8
/// ones (Table 2), which only the 2-bit m reproduces.
pub const PAPER_FP4_M: &str = "e8m2";

impl States {
    pub fn as_str(self) -> &'static str {
        match self {
            States::Paper => "paper",
            States::Storage => "storage",
        }
    }
    /// Overrides of a cell's state formats: the precision-only formats for the paper's FP8 and
    /// FP4 cells, none otherwise (the config files hold the storage formats).
    pub fn overrides(self, fmt: Fmt) -> Vec<String> {
        let (m, v) = match (self, fmt) {
            (States::Paper, Fmt::Fp8) => ("e8m3", "e8m3"),
            (States::Paper, Fmt::Fp4) => (PAPER_FP4_M, "e8m2"),
            _ => return vec![],
        };
        vec![format!("optim.states.m_format=\"{m}\""), format!("optim.states.v_format=\"{v}\"")]
    }
    /// Folder of a cell's runs under `--runs`: `<table>-<scale>` for cells the kind does not
    /// change (FP32, BF16 states), `<table>-<scale>-<kind>` for FP8 and FP4 cells.
    pub fn runs_dir(self, root: &Path, table: Table, scale: Scale, fmt: Fmt) -> PathBuf {
        let base = format!("{}-{}", table.as_str(), scale.as_str());
        match fmt {
            Fmt::Fp8 | Fmt::Fp4 => root.join(format!("{base}-{}", self.as_str())),
            Fmt::Fp32 | Fmt::Bf16 => root.join(base),
        }
    }
    /// The report's file name under `--out`: the reproduction (`paper`) keeps the plain name.
    pub fn report_name(self, table: Table, scale: Scale) -> String {
        match self {
            States::Paper => format!("{}-{}.md", table.as_str(), scale.as_str()),
            States::Storage => format!("{}-{}-storage.md", table.as_str(), scale.as_str()),
        }
    }
    /// What the report says about the FP8/FP4 cells' formats.
    pub fn description(self) -> String {
        match self {
            States::Paper => format!(
                "States of the FP8 and FP4 cells: **precision-only formats** (the paper's setting as DESIGN.md \
                 reads it): FP32's sign and exponent, the fraction rounded to 3 bits (FP8 = `e8m3` for m and v) \
                 or 2 bits (FP4: `e8m2` for v, `{PAPER_FP4_M}` for m), stored in 2 bytes: the stall theory's \
                 grids, no range limit, no memory saving. The storage formats' table is `*-storage.md`."
            ),
            States::Storage => "States of the FP8 and FP4 cells: **block-scaled storage formats** (the product's real \
                 memory saving, not the paper's setting): FP8 E4M3 for m and v, FP4 E2M1 for m and unsigned E2M2 for v, \
                 one power-of-two scale per 128 elements, zero-free v (`optim.states.v_zero = \"exclude\"`)."
                .into(),
        }
    }
}

/// How big a reproduction is.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Smoke,
    H200,
    Full,
}

impl Scale {
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::H200 => "h200",
            Scale::Full => "full",
        }
    }
    pub fn default_jobs(self) -> usize {
        match self {
            Scale::Smoke => 2,
            Scale::H200 => 14,
            Scale::Full => 1,
        }
    }
    pub fn default_seeds(self) -> usize {
        match self {
            Scale::Smoke => 1,
            Scale::H200 => 2,
            Scale::Full => 1,
        }
    }
    /// The paper's reset periods are divided by this (smoke 50, h200 4, full 1).
    pub fn reset_divisor(self) -> u64 {
        match self {
            Scale::Smoke => 50,
            Scale::H200 => 4,
            Scale::Full => 1,
        }
    }
}

/// Optimizer-state format of a cell (m and v alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fmt {
    Fp32,
    Bf16,
    Fp8,
    Fp4,
}

impl Fmt {
    pub const ALL: [Fmt; 4] = [Fmt::Fp32, Fmt::Bf16, Fmt::Fp8, Fmt::Fp4];
    pub const LOW: [Fmt; 3] = [Fmt::Bf16, Fmt::Fp8, Fmt::Fp4];
    pub fn as_str(self) -> &'static str {
        match self {
            Fmt::Fp32 => "fp32",
            Fmt::Bf16 => "bf16",
            Fmt::Fp8 => "fp8",
            Fmt::Fp4 => "fp4",
        }
    }
    /// The paper's reset period for this format (DESIGN.md: 1000 bf16 / 300 fp8 / 200 fp4;
    /// FP32 states use the longest, 1000).
    pub fn paper_reset_period(self) -> u64 {
        match self {
            Fmt::Fp32 | Fmt::Bf16 => 1000,
            Fmt::Fp8 => 300,
            Fmt::Fp4 => 200,
        }
    }
}

/// What a cell does against stalling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fix {
    /// Round-to-nearest write-back, no resets (plain AdamW; Table 2's "nearest").
    Plain,
    /// Stochastic rounding, no resets.
    Sr,
    /// Round-to-nearest, m and v reset periodically.
    Reset,
    /// Stochastic rounding and resets.
    SrReset,
}

impl Fix {
    pub const ALL: [Fix; 4] = [Fix::Plain, Fix::Sr, Fix::Reset, Fix::SrReset];
    pub fn as_str(self) -> &'static str {
        match self {
            Fix::Plain => "plain",
            Fix::Sr => "sr",
            Fix::Reset => "reset",
            Fix::SrReset => "sr_reset",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Fix::Plain => "plain (nearest)",
            Fix::Sr => "SR",
            Fix::Reset => "resets",
            Fix::SrReset => "SR + resets",
        }
    }
    pub fn resets(self) -> bool {
        matches!(self, Fix::Reset | Fix::SrReset)
    }
}

/// One cell of a table.
pub type Cell = (Fmt, Fix);

/// The cells of a table, in report order. The BF16-model table has the paper's 3 formats x 4
/// fixes plus FP32 states (plain) as the reference; Table 2 has FP32 states with nearest and
/// resets only, as the paper.
pub fn cells(table: Table) -> Vec<Cell> {
    let mut v = vec![(Fmt::Fp32, Fix::Plain)];
    if table == Table::Fp32Model {
        v.push((Fmt::Fp32, Fix::Reset));
    }
    for f in Fmt::LOW {
        for x in Fix::ALL {
            v.push((f, x));
        }
    }
    v
}

/// The cell's name (= its config file stem).
pub fn cell_name(table: Table, (f, x): Cell) -> String {
    match table {
        Table::Bf16Model => format!("llama100m_{}_{}", f.as_str(), x.as_str()),
        Table::Fp32Model => format!("llama100m_f32model_{}_{}", f.as_str(), x.as_str()),
    }
}

/// The cell's config file under the configs folder.
pub fn cell_config(configs: &Path, table: Table, cell: Cell) -> PathBuf {
    let file = format!("{}.toml", cell_name(table, cell));
    match table {
        Table::Bf16Model => configs.join(file),
        Table::Fp32Model => configs.join("fp32_model").join(file),
    }
}

/// The paper's final validation loss of a cell (DESIGN.md), where published.
pub fn paper_loss(table: Table, (f, x): Cell) -> Option<f64> {
    use Fix::*;
    use Fmt::*;
    match table {
        Table::Bf16Model => match (f, x) {
            (Bf16, Plain) => Some(3.27),
            (Bf16, SrReset) => Some(3.21),
            (Fp8, Plain) => Some(3.33),
            (Fp8, SrReset) => Some(3.22),
            (Fp4, Plain) => Some(3.32),
            (Fp4, SrReset) => Some(3.26),
            _ => None,
        },
        Table::Fp32Model => match (f, x) {
            (Fp32, Plain) => Some(3.155),
            (Fp32, Reset) => Some(3.161),
            (Bf16, Plain) => Some(3.181),
            (Bf16, Sr) => Some(3.156),
            (Bf16, Reset) => Some(3.158),
            (Bf16, SrReset) => Some(3.155),
            (Fp8, Plain) => Some(3.193),
            (Fp8, Sr) => Some(3.160),
            (Fp8, Reset) => Some(3.159),
            (Fp8, SrReset) => Some(3.155),
            (Fp4, Plain) => Some(3.199),
            (Fp4, Sr) => Some(3.182),
            (Fp4, Reset) => Some(3.166),
            (Fp4, SrReset) => Some(3.160),
            _ => None,
        },
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
            "data.train=[\"data/c4-sample/en-train.*.json.gz\"]",
            "data.validation=[\"data/c4-sample/en-validation.*.json.gz\"]",
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
            "optim.lr=1e-3",
            "optim.warmup_steps=100",
            "train.micro_batch=16",
            "train.grad_accum=1",
            "train.max_steps=1000",
            "train.eval_every=500",
            "train.device=\"cuda\"",
            "train.checkpoint_every=0",
            "train.keep_checkpoints=1",
            "run.plots=false",
            "run.stall_detail_every=250",
        ]
        .map(String::from)
        .to_vec(),
    };
    if fix.resets() {
        let k = reset_period(scale, fmt);
        o.push(format!("optim.states.m_reset_every={k}"));
        o.push(format!("optim.states.v_reset_every={k}"));
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
            "**h200** — the largest run that fits one 10-minute command on one H200 with the \
             table's runs sharing the GPU. `llama20m` preset (hidden 256, 4 layers, 19.6M \
             parameters) on the shared offline corpus `data/local/corpus` (real English text, \
             ~18M tokens, *not C4*; `scripts/link_shared_corpus.sh --copy`), seq 256 (the \
             paper's), batch 16 sequences (4096 tokens/step), 1000 steps (4.1M tokens per run, \
             under one epoch), warmup 100, cosine to 10% of lr 1e-3, validation on the whole \
             shared validation shard (~250k tokens), CUDA, up to 14 runs at once.\n\
             Why 1000 steps at a small batch rather than fewer, larger steps: stalled fractions \
             grow with the age of the state and approach the paper's only after ~1000 steps at \
             b2 = 0.999 (DESIGN.md). Reset periods: the paper's ÷ 4 = {}. The paper's periods \
             are set by the states' dynamics (b2 = 0.999, horizon ~1000 steps), not by its run \
             length, so they are not scaled by the run length (÷ 20 would reset v every 10 \
             steps); unscaled, the BF16 cells would reset only at the last step. ÷ 4 keeps the \
             ratio between formats, gives every reset cell at least 3 resets (BF16 3, FP8 13, \
             FP4 19) and keeps each period at least 5 time constants of m (1/(1-b1) = 10 steps). \
             Stalled fractions at this age are still below the paper's, and the model is 5x \
             smaller and sees 600x fewer tokens: expect smaller gaps between cells than the \
             paper's, and call an ordering only when it holds in every seed.",
            periods(Scale::H200)
        ),
        Scale::Full => format!(
            "**full** — the paper's setting as configured (`configs/paper/base_llama100m.toml`): \
             LLaMA-100M, C4 `en` (`data/local/c4`, `scripts/fetch_c4.py`), T5 tokenizer, seq 256, \
             batch 512 sequences (64 x 8), 20000 steps (2.6B tokens), warmup 2000, cosine to 10% \
             of lr 1e-3, AdamW (0.9, 0.999, 1e-8), validation on 10M C4 validation tokens. Reset \
             periods: the paper's, {}.",
            periods(Scale::Full)
        ),
    }
}

// ───────────────────────────── results and statistics ─────────────────────────────

/// The numbers of one finished run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunResult {
    pub val_loss: Option<f64>,
    pub stall_m: Option<f64>,
    pub stall_v: Option<f64>,
    /// BF16 weights (model.dtype = "bf16").
    pub stall_w: Option<f64>,
    /// The run diverged: its final validation loss is not finite or above the initial one.
    pub diverged: bool,
}

/// Per cell, per seed (index = seed), the run's numbers (`None`: missing or failed).
pub type Results = BTreeMap<Cell, Vec<Option<RunResult>>>;

/// Mean over seeds, sample standard deviation (n > 1) and the number of seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub mean: f64,
    pub sd: Option<f64>,
    pub n: usize,
}

impl Stat {
    pub fn of(xs: &[f64]) -> Option<Stat> {
        if xs.is_empty() {
            return None;
        }
        let n = xs.len();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let sd = (n > 1).then(|| (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt());
        Some(Stat { mean, sd, n })
    }
    /// `3.2100`, `3.2100 ± 0.0040`, signed with `sign` (no `-0.0000`).
    pub fn fmt(&self, sign: bool) -> String {
        let mean = if self.mean.abs() < 5e-5 { 0.0 } else { self.mean };
        let m = if sign { format!("{mean:+.4}") } else { format!("{mean:.4}") };
        match self.sd {
            Some(sd) => format!("{m} ± {sd:.4}"),
            None => m,
        }
    }
}

fn losses(r: &Results, c: Cell) -> Vec<Option<f64>> {
    r.get(&c).map_or(vec![], |v| v.iter().map(|x| x.and_then(|x| x.val_loss)).collect())
}

/// Final validation loss of a cell over its seeds.
pub fn loss_stat(r: &Results, c: Cell) -> Option<Stat> {
    Stat::of(&losses(r, c).into_iter().flatten().collect::<Vec<_>>())
}

/// Per-seed differences `a - b` over the seeds where both cells have a loss.
pub fn paired_diffs(r: &Results, a: Cell, b: Cell) -> Vec<f64> {
    losses(r, a)
        .into_iter()
        .zip(losses(r, b))
        .filter_map(|(x, y)| Some(x? - y?))
        .collect()
}

/// Seed-paired `a - b`.
pub fn delta(r: &Results, a: Cell, b: Cell) -> Option<Stat> {
    Stat::of(&paired_diffs(r, a, b))
}

fn stall_stat(r: &Results, c: Cell, pick: fn(&RunResult) -> Option<f64>) -> Option<Stat> {
    let xs: Vec<f64> = r.get(&c).map_or(vec![], |runs| runs.iter().flatten().filter_map(pick).collect());
    Stat::of(&xs)
}

// ───────────────────────────── the paper's orderings ─────────────────────────────

/// How the claim relates `lhs` to `rhs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `lhs` has a lower loss than `rhs`.
    Below,
    /// `lhs` does not have a lower loss than `rhs`.
    NotBelow,
}

/// One of the paper's orderings: `lhs` (relation) `rhs` in final validation loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub text: String,
    pub lhs: Cell,
    pub rhs: Cell,
    pub relation: Relation,
}

/// Verdict on a claim from the seed-paired deltas.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `None` when a cell has no finished run.
    pub holds: Option<bool>,
    /// lhs - rhs, seed-paired.
    pub delta: Option<Stat>,
    /// Seeds in which the relation holds, of the paired seeds.
    pub seeds_holding: usize,
    /// A run of either cell diverged: the comparison means nothing (`holds` is `None`).
    pub diverged: bool,
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self.holds {
            Some(true) => "holds",
            Some(false) => "does not hold",
            None if self.diverged => "n/a (a run diverged)",
            None => "n/a (missing runs)",
        }
    }
}

/// The paper's orderings that a table can check.
pub fn claims(table: Table) -> Vec<Claim> {
    let mut v = Vec::new();
    for f in Fmt::LOW {
        v.push(Claim {
            text: format!("SR + resets below plain, {} states", f.as_str()),
            lhs: (f, Fix::SrReset),
            rhs: (f, Fix::Plain),
            relation: Relation::Below,
        });
    }
    for f in Fmt::LOW {
        v.push(Claim {
            text: format!("resets help {} states (resets below plain)", f.as_str()),
            lhs: (f, Fix::Reset),
            rhs: (f, Fix::Plain),
            relation: Relation::Below,
        });
    }
    if table == Table::Fp32Model {
        v.push(Claim {
            text: "resets do not help fp32 states (resets not below plain)".into(),
            lhs: (Fmt::Fp32, Fix::Reset),
            rhs: (Fmt::Fp32, Fix::Plain),
            relation: Relation::NotBelow,
        });
    }
    for f in Fmt::LOW {
        v.push(Claim {
            text: format!("SR helps {} states (SR below plain)", f.as_str()),
            lhs: (f, Fix::Sr),
            rhs: (f, Fix::Plain),
            relation: Relation::Below,
        });
    }
    if table == Table::Fp32Model {
        for f in Fmt::LOW {
            v.push(Claim {
                text: format!("plain {} states cost loss (above fp32 states)", f.as_str()),
                lhs: (Fmt::Fp32, Fix::Plain),
                rhs: (f, Fix::Plain),
                relation: Relation::Below,
            });
        }
    }
    v
}

fn relation_holds(rel: Relation, d: f64) -> bool {
    match rel {
        Relation::Below => d < 0.0,
        Relation::NotBelow => d >= 0.0,
    }
}

/// Whether any run of a cell diverged.
pub fn any_diverged(r: &Results, c: Cell) -> bool {
    r.get(&c).is_some_and(|v| v.iter().flatten().any(|x| x.diverged))
}

/// Check a claim on results: it holds when the seed-paired mean delta has the claimed sign;
/// no verdict when a cell has no runs or a run of either cell diverged.
pub fn evaluate_claim(r: &Results, c: &Claim) -> Verdict {
    let diffs = paired_diffs(r, c.lhs, c.rhs);
    let delta = Stat::of(&diffs);
    let diverged = any_diverged(r, c.lhs) || any_diverged(r, c.rhs);
    Verdict {
        holds: if diverged { None } else { delta.map(|d| relation_holds(c.relation, d.mean)) },
        delta,
        seeds_holding: diffs.iter().filter(|&&d| relation_holds(c.relation, d)).count(),
        diverged,
    }
}

/// The paper's verdict on a claim, where both cells have a published number.
pub fn paper_verdict(table: Table, c: &Claim) -> Option<(f64, bool)> {
    let d = paper_loss(table, c.lhs)? - paper_loss(table, c.rhs)?;
    Some((d, relation_holds(c.relation, d)))
}

// ───────────────────────────── rendering ─────────────────────────────

/// What the report says about how it was made.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    pub command: String,
    pub seeds: usize,
    pub jobs: usize,
    pub runs_total: usize,
    pub runs_failed: Vec<String>,
    pub wall_s: Option<f64>,
    /// Parameters and tokens per run (from a summary.json).
    pub params: Option<u64>,
    pub tokens_per_run: Option<u64>,
    pub steps: Option<u64>,
    pub runs_dir: String,
    /// Scale text (normally [`scale_description`]).
    pub scale_text: String,
    /// What the FP8/FP4 cells store their states in ([`States::description`]).
    pub states_text: String,
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("—".into(), |v| format!("{v:.digits$}"))
}

fn opt_stat(s: Option<Stat>, sign: bool) -> String {
    s.map_or("—".into(), |s| s.fmt(sign))
}

fn fmt_time(s: f64) -> String {
    if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0).floor() as u64, (s % 60.0).round() as u64)
    } else {
        format!("{s:.0}s")
    }
}

/// The markdown report of a table: header, per-cell table, grid, orderings.
pub fn render(table: Table, scale: Scale, r: &Results, info: &RunInfo) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# Reproduction of the paper's {}, scale `{}`\n", table.title(), scale.as_str());
    let _ = writeln!(w, "Generated by `{}`.", info.command);
    let mut facts = vec![format!("{} runs ({} cells x {} seed{})", info.runs_total, cells(table).len(), info.seeds, if info.seeds == 1 { "" } else { "s" })];
    if let Some(t) = info.wall_s {
        facts.push(format!("wall time {} with up to {} at once", fmt_time(t), info.jobs));
    }
    if let Some(p) = info.params {
        facts.push(format!("{:.1}M parameters", p as f64 / 1e6));
    }
    if let (Some(st), Some(tk)) = (info.steps, info.tokens_per_run) {
        facts.push(format!("{st} steps, {tk} training tokens per run"));
    }
    let _ = writeln!(w, "{}; run folders under `{}/`.\n", facts.join("; "), info.runs_dir);
    if !info.runs_failed.is_empty() {
        let _ = writeln!(w, "**{} run(s) failed or did not finish** (see `train.log` in their folders): {}.\n", info.runs_failed.len(), info.runs_failed.join(", "));
    }
    let _ = writeln!(w, "{}\n", info.scale_text);
    if !info.states_text.is_empty() {
        let _ = writeln!(w, "{}\n", info.states_text);
    }
    let _ = writeln!(
        w,
        "Paper: LLaMA-100M on C4, {} (DESIGN.md). Losses are final validation losses (nats/token); \
         ours are seed means{}; deltas are paired by seed (same initialisation and data order). \
         Stalled fractions (m, v and, for BF16 weights, w) are means over the second half of each run. Ours and the paper's \
         are different models and data: compare deltas and orderings, not absolute losses.\n",
        match table {
            Table::Bf16Model => "BF16 weights and activations",
            Table::Fp32Model => "FP32 weights and activations",
        },
        if info.seeds > 1 { " ± sample standard deviation over seeds" } else { "" }
    );

    // Per-cell table.
    let _ = writeln!(w, "## Final validation loss per cell\n");
    let _ = writeln!(
        w,
        "| states | fix | paper | ours | Δ vs plain (paper) | Δ vs plain (ours) | Δ vs fp32 states (paper) | Δ vs fp32 states (ours) | stalled {} (ours) |",
        if table == Table::Bf16Model { "m / v / w" } else { "m / v" }
    );
    let _ = writeln!(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let base32 = (Fmt::Fp32, Fix::Plain);
    for c in cells(table) {
        let (f, x) = c;
        let plain = (f, Fix::Plain);
        let pd = |a: Cell, b: Cell| match (paper_loss(table, a), paper_loss(table, b)) {
            (Some(p), Some(q)) if a != b => format!("{:+.3}", p - q),
            _ => "—".into(),
        };
        let vs_plain = if x == Fix::Plain { "—".into() } else { opt_stat(delta(r, c, plain), true) };
        let vs_32 = if c == base32 { "—".into() } else { opt_stat(delta(r, c, base32), true) };
        let stall = [stall_stat(r, c, |x| x.stall_m), stall_stat(r, c, |x| x.stall_v), stall_stat(r, c, |x| x.stall_w)];
        let stall = if stall.iter().all(Option::is_none) {
            "—".to_string()
        } else {
            let n = if table == Table::Bf16Model { 3 } else { 2 };
            stall[..n].iter().map(|s| opt(s.map(|s| s.mean), 3)).collect::<Vec<_>>().join(" / ")
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f.as_str(),
            x.label(),
            opt(paper_loss(table, c), 3),
            opt_stat(loss_stat(r, c), false) + if any_diverged(r, c) { " (diverged)" } else { "" },
            if x == Fix::Plain { "—".into() } else { pd(c, plain) },
            vs_plain,
            if c == base32 { "—".into() } else { pd(c, base32) },
            vs_32,
            stall
        );
    }

    // Grid in the paper's layout.
    let _ = writeln!(w, "\n## Grid: ours (paper)\n");
    let _ = writeln!(w, "| states | fp32 | bf16 | fp8 | fp4 |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    let all = cells(table);
    for x in Fix::ALL {
        let mut row = format!("| {} |", x.label());
        for f in Fmt::ALL {
            let c = (f, x);
            if !all.contains(&c) {
                row.push_str(" — |");
                continue;
            }
            let ours = loss_stat(r, c).map_or("—".into(), |s| format!("{:.4}", s.mean))
                + if any_diverged(r, c) { " diverged" } else { "" };
            let paper = paper_loss(table, c).map_or(String::new(), |p| format!(" ({p:.3})"));
            let _ = write!(row, " {ours}{paper} |");
        }
        let _ = writeln!(w, "{row}");
    }

    // Orderings.
    let _ = writeln!(w, "\n## The paper's orderings\n");
    let _ = writeln!(w, "| claim | paper Δ | ours Δ (lhs − rhs) | seeds where it holds | ours |");
    let _ = writeln!(w, "|---|---:|---:|---:|---|");
    for c in claims(table) {
        let v = evaluate_claim(r, &c);
        let paper = match paper_verdict(table, &c) {
            Some((d, h)) => format!("{d:+.3}{}", if h { "" } else { " (!)" }),
            None => "— (Table 2)".into(),
        };
        let paired = v.delta.map_or(0, |d| d.n);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {}/{} | **{}** |",
            c.text,
            paper,
            opt_stat(v.delta, true),
            v.seeds_holding,
            paired,
            v.word()
        );
    }
    let n_hold = claims(table).iter().filter(|c| evaluate_claim(r, c).holds == Some(true)).count();
    let _ = writeln!(w, "\n{n_hold} of {} orderings hold in the seed mean.", claims(table).len());
    let diverged: Vec<String> =
        cells(table).into_iter().filter(|&c| any_diverged(r, c)).map(|c| cell_name(table, c)).collect();
    if !diverged.is_empty() {
        let _ = writeln!(
            w,
            "Diverged (final validation loss above the initial one): {}; orderings involving them are not judged.",
            diverged.join(", ")
        );
    }
    if info.seeds < 2 {
        let _ = writeln!(w, "With one seed, an ordering is not established (DESIGN.md: run at least two seeds).");
    }
    s
}

// ───────────────────────────── running ─────────────────────────────

/// One child run to make.
#[derive(Debug, Clone)]
pub struct Job {
    pub cell: Cell,
    pub seed: usize,
    pub config: PathBuf,
    pub overrides: Vec<String>,
    pub run_dir: PathBuf,
    pub max_steps: u64,
    /// The resolved config (for the reuse check).
    pub resolved: String,
}

/// The overrides of one (cell, seed) run: scale, state formats, then folder and seed, then
/// the user's.
#[allow(clippy::too_many_arguments)]
pub fn run_overrides(
    scale: Scale,
    states: States,
    cell: Cell,
    runs_dir: &Path,
    name: &str,
    seed: usize,
    extra: &[String],
) -> Vec<String> {
    let mut o = scale_overrides(scale, cell);
    o.extend(states.overrides(cell.0));
    o.push(format!("run.dir={}", toml_str(&runs_dir.to_string_lossy())));
    o.push(format!("run.name={}", toml_str(name)));
    o.push(format!("train.seed={seed}"));
    o.extend(extra.iter().cloned());
    o
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Plan every run of one state kind (seed-major, so partial results stay paired), loading
/// each config.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    table: Table,
    scale: Scale,
    states: States,
    seeds: usize,
    configs: &Path,
    runs_root: &Path,
    extra: &[String],
) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    for seed in 0..seeds {
        for cell in cells(table) {
            let config = cell_config(configs, table, cell);
            let name = format!("{}-s{seed}", cell_name(table, cell));
            let runs_dir = states.runs_dir(runs_root, table, scale, cell.0);
            let overrides = run_overrides(scale, states, cell, &runs_dir, &name, seed, extra);
            let cfg = RunConfig::load(&config, &overrides)
                .with_context(|| format!("cell {} (seed {seed})", cell_name(table, cell)))?;
            jobs.push(Job {
                cell,
                seed,
                config,
                run_dir: cfg.run_dir(),
                max_steps: cfg.train.max_steps,
                resolved: cfg.to_toml(),
                overrides,
            });
        }
    }
    Ok(jobs)
}

/// The numbers of a finished run folder, or `None` when it did not finish `max_steps`.
pub fn read_result(run_dir: &Path, max_steps: u64) -> Option<(RunResult, serde_json::Value)> {
    let text = std::fs::read_to_string(run_dir.join("summary.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if v.get("steps")?.as_u64()? < max_steps {
        return None;
    }
    let g = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let r = RunResult {
        val_loss: g("final_val_loss"),
        stall_m: g("mean_stall_m"),
        stall_v: g("mean_stall_v"),
        stall_w: g("mean_stall_w"),
        diverged: match (g("final_val_loss"), g("initial_val_loss")) {
            (Some(f), Some(i)) => !f.is_finite() || f > i,
            (Some(f), None) => !f.is_finite(),
            (None, _) => false,
        },
    };
    Some((r, v))
}

fn reusable(job: &Job) -> bool {
    let same = std::fs::read_to_string(job.run_dir.join("config.toml")).is_ok_and(|c| c == job.resolved);
    same && read_result(&job.run_dir, job.max_steps).is_some()
}

fn spawn(job: &Job, threads: usize) -> Result<Child> {
    // a run that is not reused (another config, unfinished) is moved aside, never mixed into
    if !crate::run_folder::run_files(&job.run_dir).is_empty() {
        crate::run_folder::move_aside(&job.run_dir)?;
    }
    std::fs::create_dir_all(&job.run_dir).with_context(|| format!("cannot create {}", job.run_dir.display()))?;
    let log = std::fs::File::create(job.run_dir.join("train.log"))?;
    let exe = std::env::current_exe().context("cannot find the current executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--config").arg(&job.config);
    for o in &job.overrides {
        cmd.arg("--set").arg(o);
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        cmd.env("RAYON_NUM_THREADS", threads.to_string());
    }
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    cmd.spawn().context("cannot start a training run")
}

/// `train reproduce`: every run of every state kind asked for (a run shared by two kinds, an
/// FP32 or BF16 cell, once), then one report per kind.
pub fn run(a: &ReproduceArgs) -> Result<()> {
    let seeds = a.seeds.unwrap_or(a.scale.default_seeds()).max(1);
    let jobs_at_once = a.jobs.unwrap_or(a.scale.default_jobs()).max(1);
    let kinds = a.states.kinds();
    let plans = kinds
        .iter()
        .map(|&k| plan(a.table, a.scale, k, seeds, &a.configs, &a.runs, &a.set))
        .collect::<Result<Vec<_>>>()?;
    let mut jobs: Vec<Job> = Vec::new();
    for j in plans.iter().flatten() {
        if !jobs.iter().any(|k| k.run_dir == j.run_dir) {
            jobs.push(j.clone());
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cpus / jobs_at_once).max(1);
    let started = Instant::now();
    let mut failed: Vec<String> = Vec::new();
    let name_of = |j: &Job| format!("{}-s{}", cell_name(a.table, j.cell), j.seed);

    let (todo, done): (Vec<&Job>, Vec<&Job>) = jobs.iter().partition(|j| a.force || !reusable(j));
    if !done.is_empty() {
        eprintln!("reproduce: reusing {} finished run(s) with the same config", done.len());
    }
    if !a.report_only && !todo.is_empty() {
        eprintln!(
            "reproduce: {} run(s) of {} {} ({} seed(s)), {} at a time, logs in <run>/train.log",
            todo.len(),
            a.table.as_str(),
            a.scale.as_str(),
            seeds,
            jobs_at_once
        );
        let mut queue = todo.into_iter();
        let mut running: Vec<(&Job, Child, Instant)> = Vec::new();
        let (mut finished, total) = (0usize, jobs.len() - done.len());
        loop {
            while running.len() < jobs_at_once {
                let Some(j) = queue.next() else { break };
                match spawn(j, threads) {
                    Ok(c) => running.push((j, c, Instant::now())),
                    Err(e) => {
                        eprintln!("reproduce: {}: {e:#}", name_of(j));
                        failed.push(name_of(j));
                    }
                }
            }
            if running.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            let mut i = 0;
            while i < running.len() {
                if let Some(status) = running[i].1.try_wait()? {
                    let (j, _, t0) = running.remove(i);
                    finished += 1;
                    let res = read_result(&j.run_dir, j.max_steps);
                    let ok = status.success() && res.is_some();
                    if !ok {
                        failed.push(name_of(j));
                    }
                    eprintln!(
                        "reproduce: [{finished}/{total}] {} {} in {:.0}s (val loss {}), {:.0}s elapsed",
                        name_of(j),
                        if ok { "done" } else { "FAILED" },
                        t0.elapsed().as_secs_f64(),
                        res.and_then(|r| r.0.val_loss).map_or("-".into(), |v| format!("{v:.4}")),
                        started.elapsed().as_secs_f64()
                    );
                } else {
                    i += 1;
                }
            }
        }
    }

    // Collect, one report per state kind.
    let wall_s = (!a.report_only && done.len() < jobs.len()).then(|| started.elapsed().as_secs_f64());
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    for (kind, plan) in kinds.iter().zip(&plans) {
        let mut results: Results = BTreeMap::new();
        let mut info = RunInfo {
            command: std::iter::once("train".to_string()).chain(std::env::args().skip(1)).collect::<Vec<_>>().join(" "),
            seeds,
            jobs: jobs_at_once,
            runs_total: plan.len(),
            runs_dir: a.runs.display().to_string(),
            scale_text: scale_description(a.scale),
            states_text: kind.description(),
            wall_s,
            ..Default::default()
        };
        for j in plan {
            let slot = results.entry(j.cell).or_insert_with(|| vec![None; seeds]);
            match read_result(&j.run_dir, j.max_steps) {
                Some((r, v)) => {
                    slot[j.seed] = Some(r);
                    info.params = info.params.or(v.get("params").and_then(|x| x.as_u64()));
                    info.tokens_per_run = info.tokens_per_run.or(v.get("tokens").and_then(|x| x.as_u64()));
                    info.steps = info.steps.or(v.get("steps").and_then(|x| x.as_u64()));
                }
                None => {
                    if !failed.contains(&name_of(j)) {
                        failed.push(name_of(j));
                    }
                    info.runs_failed.push(name_of(j));
                }
            }
        }
        let md = render(a.table, a.scale, &results, &info);
        let out = a.out.join(kind.report_name(a.table, a.scale));
        std::fs::write(&out, &md).with_context(|| format!("cannot write {}", out.display()))?;
        println!("{md}");
        eprintln!("reproduce: wrote {} ({:.0}s)", out.display(), started.elapsed().as_secs_f64());
    }
    if !failed.is_empty() {
        bail!("{} of {} runs failed or are missing: {}", failed.len(), jobs.len(), failed.join(", "));
    }
    Ok(())
}
