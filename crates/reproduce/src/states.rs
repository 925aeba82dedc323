//! `--states`: what the FP8 and FP4 cells store their optimizer states in.
//!
//! * `paper`: the config files as written, the paper's own formats (arXiv:2603.16731v1, 6.1,
//!   A.4, A.9): FP8 E4M3 m and v with one `amax` scale per tensor and zero kept, FP4 E2M1 m /
//!   unsigned E2M2 v in 128-element `amax` blocks with zero excluded from v, AdamW eps 1e-6.
//! * `blockwise`: lowbit's 128-element block storage formats with each format's default scale
//!   kind (FP8 pow2, FP4 amax) and a zero-free v (the memory-saving formats a user would pick):
//!   its FP4 is then the paper's FP4 (the two kinds still run it apart).
//! * `theory`: the stall theory's precision-only grids (FP8 = `e8m3`, FP4 = `e8m2`: FP32's
//!   exponent, no range limit, 2 bytes per element) with AdamW eps 1e-8: the stand-in that
//!   reproduced the paper's tables before its formats were known, as its committed results
//!   were made.
//!
//! FP32 and BF16 cells run the same under `paper` and `blockwise` ("shared": they run once and
//! appear in both reports); under `theory` their eps differs, so they are the kind's own runs.

use super::paper::{Fmt, Table};
use super::scale::Scale;
use std::path::{Path, PathBuf};

/// `--states`: which kinds of state formats the cells run on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatesArg {
    /// The paper's formats, as the config files hold them.
    Paper,
    /// lowbit's 128-element block storage formats, default scale kinds.
    Blockwise,
    /// The precision-only grids of the stall theory, eps 1e-8 (the committed stand-in).
    Theory,
    /// All three, one report each.
    All,
}

impl StatesArg {
    /// The kinds to run, in report order.
    pub fn kinds(self) -> Vec<States> {
        match self {
            StatesArg::Paper => vec![States::Paper],
            StatesArg::Blockwise => vec![States::Blockwise],
            StatesArg::Theory => vec![States::Theory],
            StatesArg::All => vec![States::Paper, States::Blockwise, States::Theory],
        }
    }
}

/// What the cells store their states in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum States {
    /// The paper's formats (the config files).
    Paper,
    /// 128-element block storage formats with the product's default scale kinds.
    Blockwise,
    /// Precision-only grids, eps 1e-8.
    Theory,
}

/// The first moment of the theory kind's FP4 cells: 2 fraction bits, as its v. Measured
/// (`bench/history/long_run_h200.md`, LLaMA-20M, FP32 model, 3000 steps, nearest): e8m2 m ends 0.082
/// nats above FP32 states, 0.020 from FP8 (e8m3); e8m1 m ends 0.98 above, its m stalled 86% of
/// the time: with 1 fraction bit and no scale that follows the block, every grid point is where
/// 0.9 m rounds back to under round-to-nearest, so m barely decays.
pub const THEORY_FP4_M: &str = "e8m2";

/// AdamW eps of the theory kind's runs: the committed stand-in's (the paper's is 1e-6).
pub const THEORY_EPS: &str = "1e-8";

/// The kind label of `paper` and `blockwise` runs of FP32 and BF16 cells, which both share.
pub const SHARED: &str = "shared";

impl States {
    /// The `--states` value of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            States::Paper => "paper",
            States::Blockwise => "blockwise",
            States::Theory => "theory",
        }
    }
    /// Whether this kind's run of a cell of format `fmt` is its own (else [`SHARED`]).
    fn own(self, fmt: Fmt) -> bool {
        self == States::Theory || matches!(fmt, Fmt::Fp8 | Fmt::Fp4)
    }
    /// The kind label of a cell's runs, in run folders and the results file: this kind's name,
    /// or [`SHARED`] for the FP32 and BF16 cells of `paper` and `blockwise`.
    pub fn tag(self, fmt: Fmt) -> &'static str {
        if self.own(fmt) {
            self.as_str()
        } else {
            SHARED
        }
    }
    /// Overrides of a cell's config for this kind (the config files hold the paper's).
    /// `theory` also puts the scaled formats' block size, scale kind and zero-point setting
    /// back to their defaults: its grids have none of them, and its runs then resolve to the
    /// configs its committed results were made with.
    pub fn overrides(self, fmt: Fmt) -> Vec<String> {
        let s = |k: &str, v: &str| format!("optim.states.{k}={v}");
        let defaults = || [s("block_size", "128"), s("scale", "\"default\""), s("v_zero", "\"exclude\"")];
        match (self, fmt) {
            (States::Paper, _) | (States::Blockwise, Fmt::Fp32 | Fmt::Bf16) => vec![],
            (States::Blockwise, _) => defaults().to_vec(),
            (States::Theory, _) => {
                let mut o = vec![format!("optim.eps={THEORY_EPS}")];
                let grid = match fmt {
                    Fmt::Fp8 => Some(("e8m3", "e8m3")),
                    Fmt::Fp4 => Some((THEORY_FP4_M, "e8m2")),
                    _ => None,
                };
                if let Some((m, v)) = grid {
                    o.extend([s("m_format", &format!("\"{m}\"")), s("v_format", &format!("\"{v}\""))]);
                    o.extend(defaults());
                }
                o
            }
        }
    }
    /// Folder of a cell's runs under `--runs`: `<table>-<scale>` for shared cells,
    /// `<table>-<scale>-<kind>` for the others.
    pub fn runs_dir(self, root: &Path, table: Table, scale: Scale, fmt: Fmt) -> PathBuf {
        let base = format!("{}-{}", table.as_str(), scale.as_str());
        if self.own(fmt) {
            root.join(format!("{base}-{}", self.as_str()))
        } else {
            root.join(base)
        }
    }
    /// The report's file name under `--out`: the paper's formats keep the plain name.
    pub fn report_name(self, table: Table, scale: Scale) -> String {
        match self {
            States::Paper => format!("{}-{}.md", table.as_str(), scale.as_str()),
            k => format!("{}-{}-{}.md", table.as_str(), scale.as_str(), k.as_str()),
        }
    }
    /// What the report says about the cells' formats.
    pub fn description(self) -> String {
        match self {
            States::Paper => "States of the FP8 and FP4 cells: **the paper's formats** (arXiv:2603.16731v1, 6.1 and A.4): \
                 FP8 E4M3 for m and v with one amax scale per tensor (`block_size = 0`, `scale = \"amax\"`, zero kept), \
                 FP4 E2M1 for m and unsigned E2M2 for v in 128-element blocks with amax scales and zero excluded from \
                 v; AdamW eps 1e-6 (A.9). The block storage formats' table is `*-blockwise.md`, the theory grids' \
                 `*-theory.md`."
                .into(),
            States::Blockwise => "States of the FP8 and FP4 cells: **lowbit's block storage formats** (the memory-saving \
                 formats a user would pick, not the paper's setting): FP8 E4M3 for m and v, FP4 E2M1 for m and unsigned \
                 E2M2 for v, one scale per 128 elements of each format's default kind (FP8 pow2, FP4 amax: \
                 `StateFormat::default_scale`), zero-free v (`optim.states.v_zero = \"exclude\"`); AdamW eps 1e-6."
                .into(),
            States::Theory => format!(
                "States of the FP8 and FP4 cells: **the stall theory's precision-only grids**: FP32's sign and exponent, \
                 the fraction rounded to 3 bits (FP8 = `e8m3` for m and v) or 2 bits (FP4: `e8m2` for v, \
                 `{THEORY_FP4_M}` for m), stored in 2 bytes, no range limit, no memory saving; **AdamW eps {THEORY_EPS}** \
                 in every cell (FP32 and BF16 states included). This is the stand-in that reproduced the paper's \
                 tables before its formats were known; the paper's own formats are the `paper` kind."
            ),
        }
    }
}
