//! The paper's two loss tables: their cells (state format x fix), the config file of each
//! cell, the published final validation losses, and the orderings the paper claims.
//!
//! Numbers from Topollai & Choromanska (2026), as DESIGN.md ("The run") quotes them:
//! the main table (BF16 model) publishes plain and SR + resets per format; Table 2 (FP32
//! model) publishes every cell.

use std::path::{Path, PathBuf};

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
    /// The `--table` value, also the stem of the table's files (`reproduce/<table>-<scale>.md`).
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Bf16Model => "bf16-model",
            Table::Fp32Model => "fp32-model",
        }
    }
    /// The table's name in the paper, for report titles.
    pub fn title(self) -> &'static str {
        match self {
            Table::Bf16Model => "main table (BF16 model)",
            Table::Fp32Model => "Table 2 (FP32 model)",
        }
    }
}

/// Optimizer-state format of a cell (m and v alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fmt {
    /// FP32 states (the reference).
    Fp32,
    /// BF16 states.
    Bf16,
    /// 8-bit states: E4M3 per tensor (paper), in 128-blocks (blockwise), or e8m3 (theory).
    Fp8,
    /// 4-bit states: E2M1 / unsigned E2M2 in 128-blocks (paper, blockwise), or e8m2 (theory).
    Fp4,
}

impl Fmt {
    /// Every format, in report order.
    pub const ALL: [Fmt; 4] = [Fmt::Fp32, Fmt::Bf16, Fmt::Fp8, Fmt::Fp4];
    /// The low-precision formats, whose stalling the paper studies.
    pub const LOW: [Fmt; 3] = [Fmt::Bf16, Fmt::Fp8, Fmt::Fp4];
    /// Lower-case name (`fp8`), as in config file names and `--cells`.
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
    /// Every fix, in report order.
    pub const ALL: [Fix; 4] = [Fix::Plain, Fix::Sr, Fix::Reset, Fix::SrReset];
    /// Lower-case name (`sr_reset`), as in config file names and `--cells`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fix::Plain => "plain",
            Fix::Sr => "sr",
            Fix::Reset => "reset",
            Fix::SrReset => "sr_reset",
        }
    }
    /// The row label in reports.
    pub fn label(self) -> &'static str {
        match self {
            Fix::Plain => "plain (nearest)",
            Fix::Sr => "SR",
            Fix::Reset => "resets",
            Fix::SrReset => "SR + resets",
        }
    }
    /// Whether the cell resets m and v periodically.
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

/// The cell's short name, `<format>_<fix>` (`fp8_sr_reset`): what `--cells` takes.
pub fn cell_short(&(f, x): &Cell) -> String {
    format!("{}_{}", f.as_str(), x.as_str())
}

/// The cell's name (= its config file stem).
pub fn cell_name(table: Table, cell: Cell) -> String {
    match table {
        Table::Bf16Model => format!("llama100m_{}", cell_short(&cell)),
        Table::Fp32Model => format!("llama100m_f32model_{}", cell_short(&cell)),
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

/// How a claim relates `lhs` to `rhs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `lhs` has a lower loss than `rhs`.
    Below,
    /// `lhs` does not have a lower loss than `rhs`.
    NotBelow,
}

impl Relation {
    /// Whether a difference `lhs - rhs` satisfies the relation.
    pub fn holds(self, d: f64) -> bool {
        match self {
            Relation::Below => d < 0.0,
            Relation::NotBelow => d >= 0.0,
        }
    }
}

/// One of the paper's orderings: `lhs` (relation) `rhs` in final validation loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The claim in words, as the report lists it.
    pub text: String,
    /// The cells compared: `lhs` (relation) `rhs`.
    pub lhs: Cell,
    pub rhs: Cell,
    pub relation: Relation,
}

/// The paper's orderings that a table can check.
pub fn claims(table: Table) -> Vec<Claim> {
    let below = |text: String, lhs: Cell, rhs: Cell| Claim { text, lhs, rhs, relation: Relation::Below };
    let mut v = Vec::new();
    for f in Fmt::LOW {
        let text = format!("SR + resets below plain, {} states", f.as_str());
        v.push(below(text, (f, Fix::SrReset), (f, Fix::Plain)));
    }
    for f in Fmt::LOW {
        let text = format!("resets help {} states (resets below plain)", f.as_str());
        v.push(below(text, (f, Fix::Reset), (f, Fix::Plain)));
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
        let text = format!("SR helps {} states (SR below plain)", f.as_str());
        v.push(below(text, (f, Fix::Sr), (f, Fix::Plain)));
    }
    if table == Table::Fp32Model {
        for f in Fmt::LOW {
            let text = format!("plain {} states cost loss (above fp32 states)", f.as_str());
            v.push(below(text, (Fmt::Fp32, Fix::Plain), (f, Fix::Plain)));
        }
    }
    v
}

/// The paper's verdict on a claim, where both cells have a published number: `lhs - rhs`
/// and whether the relation holds.
pub fn paper_verdict(table: Table, c: &Claim) -> Option<(f64, bool)> {
    let d = paper_loss(table, c.lhs)? - paper_loss(table, c.rhs)?;
    Some((d, c.relation.holds(d)))
}
