//! `--states`: what the FP8 and FP4 cells store their optimizer states in. `paper` runs them
//! on the precision-only formats (the paper's setting as DESIGN.md reads it), `storage` on the
//! block-scaled formats of the config files (the product's real memory saving). FP32 and BF16
//! cells are the same runs under both kinds ("shared"): they run once and appear in both
//! reports.

use super::paper::{Fmt, Table};
use super::scale::Scale;
use std::path::{Path, PathBuf};

/// `--states`: which state formats the FP8/FP4 cells run on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatesArg {
    /// The precision-only formats (the paper's cells).
    Paper,
    /// The block-scaled storage formats of the config files.
    Storage,
    /// Both, one report each.
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

/// The kind label of runs that do not depend on `--states` (FP32 and BF16 cells).
pub const SHARED: &str = "shared";

impl States {
    /// The `--states` value of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            States::Paper => "paper",
            States::Storage => "storage",
        }
    }
    /// Whether the kind changes a cell of this format: only FP8 and FP4 cells differ.
    pub fn changes(fmt: Fmt) -> bool {
        matches!(fmt, Fmt::Fp8 | Fmt::Fp4)
    }
    /// The kind label of a cell's runs, in run folders and the results file: this kind's name
    /// for FP8 and FP4 cells, [`SHARED`] for the others.
    pub fn tag(self, fmt: Fmt) -> &'static str {
        if Self::changes(fmt) {
            self.as_str()
        } else {
            SHARED
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
    /// Folder of a cell's runs under `--runs`: `<table>-<scale>` for shared cells (FP32, BF16
    /// states), `<table>-<scale>-<kind>` for FP8 and FP4 cells.
    pub fn runs_dir(self, root: &Path, table: Table, scale: Scale, fmt: Fmt) -> PathBuf {
        let base = format!("{}-{}", table.as_str(), scale.as_str());
        if Self::changes(fmt) {
            root.join(format!("{base}-{}", self.as_str()))
        } else {
            root.join(base)
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
