//! The paper's loss tables: their cells (state format x fix), the config file of each cell,
//! the published final validation losses, and the orderings the paper claims.
//!
//! Numbers from Topollai & Choromanska (2026), as docs/numerics.md ("The run") quotes them:
//! the main table (BF16 model) publishes plain and SR + resets per format; Table 2 (FP32
//! model) publishes every cell; Table 6 (FP8 reset policies, BF16 model) the three policies;
//! Table 7 (SOAP, LLaMA-100M) SOAP with BF16 and FP8 states, with and without resets.

use lowbit_optim::{theory, StateFormat};
use std::path::{Path, PathBuf};

/// One of the paper's loss tables.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Table {
    /// Main table: BF16 weights and activations, plain AdamW -> SR + resets.
    #[value(name = "bf16-model")]
    Bf16Model,
    /// Table 2: FP32 model, states x {nearest, SR, resets, SR + resets}.
    #[value(name = "fp32-model")]
    Fp32Model,
    /// Table 6: FP8 reset policies with SR, BF16 model (symmetric, v only, adaptive), beside
    /// FP8 plain and SR alone and FP32 states. Its cells shared with the main table are the
    /// main table's runs (its results file's records).
    #[value(name = "reset-policies")]
    ResetPolicies,
    /// The paper's section 3.3, simulated stalling: FP32 states (BF16 model) whose m or v
    /// write-backs are skipped with probability p after the warmup
    /// (`optim.states.m_skip_prob` / `v_skip_prob`), p in 0.25, 0.5, 0.75, 0.9, 0.99. Its
    /// p = 0 cell is the main table's FP32 cell (its results file's records).
    #[value(name = "stall-probe")]
    StallProbe,
    /// Table 7: SOAP (`optim.kind = "soap"`, `[optim.soap]` at its defaults) with BF16 and FP8
    /// states, round-to-nearest, with and without resets (the main table's `*_plain` /
    /// `*_reset` state settings), beside AdamW with FP32 states, the main table's FP32 cell
    /// (its results file's records).
    #[value(name = "soap")]
    Soap,
}

/// The skip probabilities of [`Table::StallProbe`], in thousandths (the sweep: 0.25,
/// 0.5, 0.75, 0.9, 0.99; p = 0 is the FP32 cell).
pub const SKIP_PROBS: [u16; 5] = [250, 500, 750, 900, 990];

impl Table {
    /// The `--table` value, also the stem of the table's files (`reproduce/<table>-<scale>.md`).
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Bf16Model => "bf16-model",
            Table::Fp32Model => "fp32-model",
            Table::ResetPolicies => "reset-policies",
            Table::StallProbe => "stall-probe",
            Table::Soap => "soap",
        }
    }
    /// The table's name in the paper, for report titles.
    pub fn title(self) -> &'static str {
        match self {
            Table::Bf16Model => "main table (BF16 model)",
            Table::Fp32Model => "Table 2 (FP32 model)",
            Table::ResetPolicies => "Table 6 (FP8 reset policies, BF16 model)",
            Table::StallProbe => "simulated stalling (section 3.3; FP32 states, BF16 model)",
            Table::Soap => "Table 7 (SOAP with low-precision states, BF16 model)",
        }
    }
    /// Whether the table's runs train a BF16 model (weights and activations).
    pub fn bf16_model(self) -> bool {
        self != Table::Fp32Model
    }
    /// The table whose runs this one shares: a cell of both, with the same config, is run
    /// once and its record read from that table's results file.
    pub fn borrows_from(self) -> Option<Table> {
        matches!(self, Table::ResetPolicies | Table::StallProbe | Table::Soap).then_some(Table::Bf16Model)
    }
    /// Whether a cell of this table trains with SOAP: every cell of [`Table::Soap`] but its
    /// AdamW reference, the FP32 one.
    pub fn soap(self, (f, _): Cell) -> bool {
        self == Table::Soap && f != Fmt::Fp32
    }
    /// A cell's own `--set` overrides beyond its config file: `optim.kind = "soap"` for a SOAP
    /// cell ([`Table::soap`]; `[optim.soap]` stays at its defaults, the paper's A.9), then the
    /// fix's ([`Fix::overrides`]: a simulated-stalling p).
    pub fn overrides(self, cell: Cell) -> Vec<String> {
        let soap = self.soap(cell).then(|| "optim.kind=\"soap\"".to_string());
        soap.into_iter().chain(cell.1.overrides()).collect()
    }
    /// The fixes of the table's cells, in report order (the grid's rows).
    pub fn fixes(self) -> Vec<Fix> {
        match self {
            Table::ResetPolicies => vec![Fix::Plain, Fix::Sr, Fix::SrReset, Fix::SrResetV, Fix::SrAdaptive],
            Table::StallProbe => {
                let skips = |f: fn(u16) -> Fix| SKIP_PROBS.map(f);
                std::iter::once(Fix::Plain).chain(skips(Fix::SkipV)).chain(skips(Fix::SkipM)).collect()
            }
            Table::Soap => vec![Fix::Plain, Fix::Reset],
            _ => Fix::ALL.to_vec(),
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
    /// The paper's reset period for this format ([`theory::paper_run_period`] of its v grid:
    /// bf16 1000, fp8 300, fp4 200 (v's E2M2; m takes v's period), fp32 1000).
    pub fn paper_reset_period(self) -> u64 {
        let v = match self {
            Fmt::Fp32 => StateFormat::Fp32,
            Fmt::Bf16 => StateFormat::Bf16,
            Fmt::Fp8 => StateFormat::Fp8E4M3,
            Fmt::Fp4 => StateFormat::Fp4UE2M2,
        };
        theory::paper_run_period(v.fraction_bits().expect("a grid with fraction bits"))
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
    /// Stochastic rounding and resets (Table 6's symmetric policy: m and v every period).
    SrReset,
    /// Stochastic rounding, v reset every period, m never (Table 6's asymmetric policy).
    SrResetV,
    /// Stochastic rounding, m and v reset by the adaptive rule (paper Alg. 2,
    /// `optim.states.reset = "adaptive"`).
    SrAdaptive,
    /// Simulated stalling of m (the paper's section 3.3): its write-back skipped with
    /// probability p (in thousandths) after the warmup (`optim.states.m_skip_prob`).
    SkipM(u16),
    /// The same for v (`optim.states.v_skip_prob`).
    SkipV(u16),
}

impl Fix {
    /// The fixes of the main table and Table 2, in report order.
    pub const ALL: [Fix; 4] = [Fix::Plain, Fix::Sr, Fix::Reset, Fix::SrReset];
    /// Lower-case name (`sr_reset`), as in config file names and `--cells`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fix::Plain => "plain",
            Fix::Sr => "sr",
            Fix::Reset => "reset",
            Fix::SrReset => "sr_reset",
            Fix::SrResetV => "sr_reset_v",
            Fix::SrAdaptive => "sr_adaptive",
            Fix::SkipM(_) => "skip_m",
            Fix::SkipV(_) => "skip_v",
        }
    }
    /// The row label in reports.
    pub fn label(self) -> String {
        match self {
            Fix::Plain => "plain (nearest)".into(),
            Fix::Sr => "SR".into(),
            Fix::Reset => "resets".into(),
            Fix::SrReset => "SR + resets".into(),
            Fix::SrResetV => "SR + v resets only".into(),
            Fix::SrAdaptive => "SR + adaptive resets".into(),
            Fix::SkipM(_) | Fix::SkipV(_) => {
                let (state, p) = self.skip().expect("a skip cell");
                format!("{state} skipped, p = {p}")
            }
        }
    }
    /// A simulated-stalling cell's state (`"m"` or `"v"`) and skip probability.
    pub fn skip(self) -> Option<(&'static str, f64)> {
        match self {
            Fix::SkipM(p) => Some(("m", f64::from(p) / 1000.0)),
            Fix::SkipV(p) => Some(("v", f64::from(p) / 1000.0)),
            _ => None,
        }
    }
    /// The cell's own `--set` overrides beyond its config file: the skip probability of a
    /// simulated-stalling cell, none for the others.
    pub fn overrides(self) -> Vec<String> {
        self.skip().map_or(vec![], |(state, p)| vec![format!("optim.states.{state}_skip_prob={p}")])
    }
    /// Whether the cell writes back with stochastic rounding.
    pub fn stochastic(self) -> bool {
        matches!(self, Fix::Sr | Fix::SrReset | Fix::SrResetV | Fix::SrAdaptive)
    }
    /// Periods `(m, v)` of the cell's periodic resets, given the format's period `k` (0: never).
    pub fn reset_periods(self, k: u64) -> (u64, u64) {
        match self {
            Fix::Reset | Fix::SrReset => (k, k),
            Fix::SrResetV => (0, k),
            Fix::Plain | Fix::Sr | Fix::SrAdaptive | Fix::SkipM(_) | Fix::SkipV(_) => (0, 0),
        }
    }
}

/// One cell of a table.
pub type Cell = (Fmt, Fix);

/// The cells of a table, in report order. The BF16-model table has the paper's 3 formats x 4
/// fixes plus FP32 states (plain) as the reference; Table 2 has FP32 states with nearest and
/// resets only, as the paper; Table 6 has FP32 states and FP8 with every fix of
/// [`Table::fixes`] but resets without SR; Table 7 (SOAP) has AdamW with FP32 states and SOAP
/// with BF16 and FP8 states, plain and with resets.
pub fn cells(table: Table) -> Vec<Cell> {
    if table == Table::Soap {
        let soap = [Fmt::Bf16, Fmt::Fp8].into_iter().flat_map(|f| table.fixes().into_iter().map(move |x| (f, x)));
        return std::iter::once((Fmt::Fp32, Fix::Plain)).chain(soap).collect();
    }
    if table == Table::StallProbe {
        return table.fixes().into_iter().map(|x| (Fmt::Fp32, x)).collect();
    }
    let mut v = vec![(Fmt::Fp32, Fix::Plain)];
    if table == Table::ResetPolicies {
        v.extend(table.fixes().into_iter().map(|x| (Fmt::Fp8, x)));
        return v;
    }
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

/// The cell's short name in `table`, `<format>_<fix>` (`fp8_sr_reset`; a simulated-stalling
/// cell with its p: `fp32_skip_v_0.9`; in [`Table::Soap`] `soap_<format>_<fix>` and the AdamW
/// reference `adamw_fp32`): what `--cells` takes, and the cell of the run's key in the results
/// file.
pub fn cell_short(table: Table, &(f, x): &Cell) -> String {
    match x.skip() {
        Some((_, p)) => format!("{}_{}_{p}", f.as_str(), x.as_str()),
        None if table.soap((f, x)) => format!("soap_{}_{}", f.as_str(), x.as_str()),
        None if table == Table::Soap => format!("adamw_{}", f.as_str()),
        None => format!("{}_{}", f.as_str(), x.as_str()),
    }
}

/// A cell's states in reports: its format, and in [`Table::Soap`] the optimizer before it
/// (`SOAP, bf16`, `AdamW, fp32`).
pub fn states_label(table: Table, cell: Cell) -> String {
    match (table, table.soap(cell)) {
        (Table::Soap, true) => format!("SOAP, {}", cell.0.as_str()),
        (Table::Soap, false) => format!("AdamW, {}", cell.0.as_str()),
        _ => cell.0.as_str().into(),
    }
}

/// The cell's name (its runs' `run.name` stem; = its config file stem, but for the cells that
/// set more than their file: a simulated-stalling p, SOAP). Table 7's AdamW reference is the
/// main table's FP32 cell under its name, so that its runs have that cell's fingerprint and are
/// borrowed.
pub fn cell_name(table: Table, cell: Cell) -> String {
    match table {
        Table::Soap if !table.soap(cell) => cell_name(Table::Bf16Model, cell),
        Table::Bf16Model | Table::ResetPolicies | Table::StallProbe | Table::Soap => format!("llama100m_{}", cell_short(table, &cell)),
        Table::Fp32Model => format!("llama100m_f32model_{}", cell_short(table, &cell)),
    }
}

/// The cell's config file under the configs folder (a simulated-stalling cell: the FP32
/// states' file, its p an override, [`Fix::overrides`]; a SOAP cell: the main table's file of
/// the same states, `optim.kind` an override, [`Table::overrides`]).
pub fn cell_config(configs: &Path, table: Table, cell: Cell) -> PathBuf {
    let file = format!("{}.toml", cell_name(table, cell));
    match (table, cell.1) {
        (Table::StallProbe, _) => configs.join(format!("{}.toml", cell_name(Table::Bf16Model, (Fmt::Fp32, Fix::Plain)))),
        (Table::Soap, _) => configs.join(format!("{}.toml", cell_name(Table::Bf16Model, cell))),
        (_, Fix::SrResetV | Fix::SrAdaptive) => configs.join("reset_policies").join(file),
        (Table::Bf16Model | Table::ResetPolicies, _) => configs.join(file),
        (Table::Fp32Model, _) => configs.join("fp32_model").join(file),
    }
}

/// The model sizes the paper publishes losses for (its LLaMA presets; lowbit's `model.preset`
/// of the same name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PaperModel {
    /// LLaMA-60M (Table 4 only: the main table's plain and SR + resets cells).
    Llama60m,
    /// LLaMA-100M: every table.
    Llama100m,
    /// LLaMA-350M (Table 4 only).
    Llama350m,
}

impl PaperModel {
    /// The paper model a `model.preset` names (`llama60m`, `llama100m`, `llama350m`); `None`
    /// for a size the paper has no table of (`llama20m`, `tiny`) or explicit dimensions.
    pub fn from_preset(preset: Option<&str>) -> Option<PaperModel> {
        match preset? {
            "llama60m" => Some(PaperModel::Llama60m),
            "llama100m" => Some(PaperModel::Llama100m),
            "llama350m" => Some(PaperModel::Llama350m),
            _ => None,
        }
    }
    /// `LLaMA-100M`, as reports name it.
    pub fn label(self) -> &'static str {
        match self {
            PaperModel::Llama60m => "LLaMA-60M",
            PaperModel::Llama100m => "LLaMA-100M",
            PaperModel::Llama350m => "LLaMA-350M",
        }
    }
    /// Where the paper gives this size's numbers of `table`: `Table 4` for 60M and 350M (main
    /// table only), the table's own name for 100M; `None` where it gives none.
    pub fn source(self, table: Table) -> Option<&'static str> {
        match (self, table) {
            (PaperModel::Llama100m, _) => Some(table.title()),
            (_, Table::Bf16Model) => Some("Table 4 (model scale)"),
            _ => None,
        }
    }
}

/// The paper's final validation loss of a cell of `table` at model size `model`
/// (docs/numerics.md: the main table and Tables 2, 6, 7 at LLaMA-100M; Table 4 gives the main
/// table's plain and SR + resets cells at 60M and 350M too), where published.
pub fn paper_loss(table: Table, model: PaperModel, (f, x): Cell) -> Option<f64> {
    use Fix::*;
    use Fmt::*;
    if model != PaperModel::Llama100m {
        let [bf16, fp8, fp4] = match (table, model) {
            (Table::Bf16Model, PaperModel::Llama60m) => [(3.52, 3.45), (3.53, 3.44), (3.52, 3.48)],
            (Table::Bf16Model, PaperModel::Llama350m) => [(2.99, 2.92), (3.02, 2.92), (3.03, 2.97)],
            _ => return None,
        };
        let (plain, fixed) = match f {
            Bf16 => bf16,
            Fp8 => fp8,
            Fp4 => fp4,
            Fp32 => return None,
        };
        return match x {
            Plain => Some(plain),
            SrReset => Some(fixed),
            _ => None,
        };
    }
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
        Table::ResetPolicies => match (f, x) {
            (Fp8, SrReset) => Some(3.223),
            (Fp8, SrResetV) => Some(3.212),
            (Fp8, SrAdaptive) => Some(3.225),
            _ => None,
        },
        // Table 7 (LLaMA-100M): no AdamW number
        Table::Soap => match (f, x) {
            (Bf16, Plain) => Some(3.22),
            (Bf16, Reset) => Some(3.19),
            (Fp8, Plain) => Some(4.15),
            (Fp8, Reset) => Some(3.23),
            _ => None,
        },
        Table::StallProbe => None,
    }
}

/// How a claim relates `lhs` to `rhs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// `lhs` has a lower loss than `rhs`.
    Below,
    /// `lhs` does not have a lower loss than `rhs`.
    NotBelow,
    /// `lhs` does not have a higher loss than `rhs` (a tie holds, as [`Relation::NotBelow`]'s).
    NotAbove,
}

impl Relation {
    /// Whether a difference `lhs - rhs` satisfies the relation.
    pub fn holds(self, d: f64) -> bool {
        match self {
            Relation::Below => d < 0.0,
            Relation::NotBelow => d >= 0.0,
            Relation::NotAbove => d <= 0.0,
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
    if table == Table::StallProbe {
        // section 3.3: the loss rises with the stalled (skipped) fraction, step by step in p
        for (state, skip) in [("v", Fix::SkipV as fn(u16) -> Fix), ("m", Fix::SkipM)] {
            let mut prev = (Fmt::Fp32, Fix::Plain);
            for p in SKIP_PROBS {
                let lhs = (Fmt::Fp32, skip(p));
                let text =
                    format!("{state} skipped with p = {} not below p = {}", f64::from(p) / 1000.0, prev.1.skip().map_or(0.0, |s| s.1));
                v.push(Claim { text, lhs, rhs: prev, relation: Relation::NotBelow });
                prev = lhs;
            }
        }
        return v;
    }
    if table == Table::Soap {
        // Table 7: resets rescue SOAP's FP8 states and do not hurt its BF16 ones
        v.push(below("SOAP + resets below SOAP, fp8 states".into(), (Fmt::Fp8, Fix::Reset), (Fmt::Fp8, Fix::Plain)));
        v.push(Claim {
            text: "SOAP + resets not above SOAP, bf16 states".into(),
            lhs: (Fmt::Bf16, Fix::Reset),
            rhs: (Fmt::Bf16, Fix::Plain),
            relation: Relation::NotAbove,
        });
        return v;
    }
    if table == Table::ResetPolicies {
        let fp8 = |x: Fix| (Fmt::Fp8, x);
        v.push(below("v resets only below symmetric resets".into(), fp8(Fix::SrResetV), fp8(Fix::SrReset)));
        v.push(below("v resets only below adaptive resets".into(), fp8(Fix::SrResetV), fp8(Fix::SrAdaptive)));
        for x in [Fix::SrReset, Fix::SrResetV, Fix::SrAdaptive] {
            v.push(below(format!("{} below SR alone", x.label()), fp8(x), fp8(Fix::Sr)));
        }
        v.push(below("SR + resets below plain, fp8 states".into(), fp8(Fix::SrReset), fp8(Fix::Plain)));
        return v;
    }
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

/// The paper's verdict on a claim at model size `model`, where both cells have a published
/// number: `lhs - rhs` and whether the relation holds.
pub fn paper_verdict(table: Table, model: PaperModel, c: &Claim) -> Option<(f64, bool)> {
    let d = paper_loss(table, model, c.lhs)? - paper_loss(table, model, c.rhs)?;
    Some((d, c.relation.holds(d)))
}
