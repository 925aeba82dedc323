//! The markdown report of a table for one states kind, rendered from the results file: a
//! header saying how it was made, the per-cell table (seed mean and spread, paired deltas,
//! stalled fractions beside the theory), the grid in the paper's layout, and the paper's
//! orderings seed by seed. [`render`] is a pure function of the results.

use super::paper::{cell_name, cells, claims, paper_loss, paper_verdict, states_label, Cell, Claim, Fix, Fmt, PaperModel, Table};
use super::results::CommandLog;
use super::scale::Scale;
use super::stats::{any_diverged, delta, evaluate_claim, loss_stat, run_stat, Outcome, Results, Stat, Verdict};
use lowbit_optim::{theory, Rounding};
use lowbit_train::output::fixed_or;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Which of the paper's numbers a report may show beside its runs: a paper number appears
/// only beside a cell whose runs are the paper's cell (its state settings as the cell's config
/// file at the scale: formats, scales, rounding, resets, optimizer) at a model size the paper
/// publishes that table for (docs/numerics.md); an ablation that changes a cell's states, and
/// a model size the paper has no table of, show their own numbers alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaperBasis {
    /// The paper's model of the report's runs (their `model.preset`); `None`: a size the paper
    /// has no table of (`llama20m`, `tiny`).
    pub model: Option<PaperModel>,
    /// The cells whose runs have the paper cell's state settings.
    pub cells: Vec<Cell>,
}

impl PaperBasis {
    /// The basis of runs that are the paper's cells at LLaMA-100M (the configs as written).
    pub fn paper_cells(table: Table) -> PaperBasis {
        PaperBasis { model: Some(PaperModel::Llama100m), cells: cells(table) }
    }
    /// The paper's model size whose table this report's cells can be set beside.
    fn published(&self, table: Table) -> Option<PaperModel> {
        self.model.filter(|m| m.source(table).is_some())
    }
    /// The paper's loss of `cell`, where its runs are the paper's cell at a published size.
    pub fn loss(&self, table: Table, cell: Cell) -> Option<f64> {
        let m = self.published(table)?;
        self.cells.contains(&cell).then(|| paper_loss(table, m, cell)).flatten()
    }
    /// The size whose deltas the orderings quote: the runs' own where the paper publishes it,
    /// else LLaMA-100M (the orderings are the paper's claims; the column names the size).
    fn claim_model(&self, table: Table) -> PaperModel {
        self.published(table).unwrap_or(PaperModel::Llama100m)
    }
    /// The paper's delta and verdict of an ordering, where both of its cells are the paper's
    /// cells (not an ablation's).
    fn claim(&self, table: Table, c: &Claim) -> Option<(f64, bool)> {
        (self.cells.contains(&c.lhs) && self.cells.contains(&c.rhs)).then(|| paper_verdict(table, self.claim_model(table), c)).flatten()
    }
}

/// What the report says about how it was made.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// The report's title; empty: the table's ("Reproduction of the paper's ...").
    pub title: String,
    /// The results file the report is rendered from, as the report names it (a path relative
    /// to the report).
    pub results_file: String,
    /// The commands that filled it.
    pub commands: Vec<CommandLog>,
    /// Seeds the report covers.
    pub seeds: Vec<usize>,
    /// The cells the report shows, in the table's order; empty: every cell of the table.
    pub cells: Vec<Cell>,
    /// Runs the report expects (its cells x seeds) and the names of those missing.
    pub runs_total: usize,
    pub runs_missing: Vec<String>,
    /// Records of this kind in the results file whose config differs from today's (other
    /// overrides, an older scale): left out.
    pub stale: usize,
    /// Parameters, steps and training tokens per run (from a record).
    pub params: Option<usize>,
    pub steps: Option<u64>,
    pub tokens_per_run: Option<u64>,
    /// The runs' setting, from their resolved config ([`crate::setting::describe`]).
    pub setting: String,
    /// The `--set` overrides every run of the report got beyond its cell and scale (an
    /// ablation's, the command's).
    pub overrides: Vec<String>,
    /// What the FP8/FP4 cells store their states in ([`super::States::description`]).
    pub states_text: String,
    /// Which of the paper's numbers may appear ([`PaperBasis`]).
    pub paper: PaperBasis,
    /// The card of each shown run, by (cell, seed) (`H100`, `H200`, `cpu`; absent: not
    /// recorded).
    pub cards: BTreeMap<(Cell, usize), String>,
    /// The results of every states kind (label, results over the same seeds), for the section
    /// that compares them cell by cell; empty: no such section.
    pub kinds: Vec<(&'static str, Results)>,
    /// Another scale's results of the same table, whose verdict of each ordering the report
    /// shows beside its own; `None`: no such column.
    pub compare: Option<Compared>,
}

/// Another scale's runs of a report's table ([`RunInfo::compare`]).
#[derive(Debug, Clone, Default)]
pub struct Compared {
    /// The scale's name (`h200-shuffled`).
    pub scale: &'static str,
    /// Its results, over the seeds its records hold.
    pub results: Results,
    /// The cards of those runs (`H100`, `H200`), each once.
    pub cards: Vec<String>,
}

impl RunInfo {
    /// The cells the report shows ([`RunInfo::cells`], else the whole table).
    fn rows(&self, table: Table) -> Vec<Cell> {
        if self.cells.is_empty() {
            cells(table)
        } else {
            self.cells.clone()
        }
    }
    /// The distinct cards of a cell's shown runs, joined by `/` (`—` when none is recorded).
    fn cell_cards(&self, c: Cell) -> String {
        let mut v: Vec<&str> = self.cards.iter().filter(|((cell, _), _)| *cell == c).map(|(_, k)| k.as_str()).collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            "—".into()
        } else {
            v.join("/")
        }
    }
    /// Whether the runs of `a` and `b` in `seed` ran on different cards (both recorded).
    fn cross_card(&self, a: Cell, b: Cell, seed: usize) -> bool {
        matches!((self.cards.get(&(a, seed)), self.cards.get(&(b, seed))), (Some(x), Some(y)) if x != y)
    }
}

fn opt_stat(s: Option<Stat>, sign: bool) -> String {
    s.map_or("—".into(), |s| s.fmt(sign))
}

/// `2m05s` from seconds (`45s` under a minute).
pub fn fmt_time(s: f64) -> String {
    if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0).floor() as u64, (s % 60.0).round() as u64)
    } else {
        format!("{s:.0}s")
    }
}

fn seeds_text(seeds: &[usize]) -> String {
    let list: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
    format!("seed{} {}", if seeds.len() == 1 { "" } else { "s" }, list.join(", "))
}

fn header(w: &mut String, table: Table, scale: Scale, info: &RunInfo) {
    if info.title.is_empty() {
        let _ = writeln!(w, "# Reproduction of the paper's {}, scale `{}`\n", table.title(), scale.as_str());
    } else {
        let _ = writeln!(w, "# {}\n", info.title);
    }
    let found = info.runs_total - info.runs_missing.len();
    let mut facts = vec![format!("{found} of {} runs ({} cells x {})", info.runs_total, info.rows(table).len(), seeds_text(&info.seeds))];
    if let Some(p) = info.params {
        facts.push(format!("{:.1}M parameters", p as f64 / 1e6));
    }
    if let (Some(st), Some(tk)) = (info.steps, info.tokens_per_run) {
        facts.push(format!("{st} steps, {tk} training tokens per run"));
    }
    let _ = writeln!(w, "Rendered from `{}`: {}.", info.results_file, facts.join("; "));
    let mut cards: Vec<&str> = info.cards.values().map(String::as_str).collect();
    cards.sort_unstable();
    cards.dedup();
    let unknown = found.saturating_sub(info.cards.len());
    let _ = writeln!(
        w,
        "Cards: {}{}.",
        if cards.is_empty() { "not recorded".to_string() } else { cards.join(", ") },
        if unknown > 0 && !cards.is_empty() { format!(" ({unknown} run(s) without a recorded card)") } else { String::new() }
    );
    if !info.commands.is_empty() {
        let _ = writeln!(w, "Made by {} command(s):\n", info.commands.len());
        for c in &info.commands {
            let gpus = if c.gpus == 0 { "CPU".to_string() } else { format!("{} GPU(s)", c.gpus) };
            let _ = writeln!(w, "- `{}`: {} run(s) in {}, up to {} at once on {gpus}", c.command, c.runs, fmt_time(c.wall_s), c.jobs);
        }
    }
    let _ = writeln!(w);
    if !info.runs_missing.is_empty() {
        let _ = writeln!(
            w,
            "**{} run(s) missing** (not run yet, failed, or did not finish): {}.\n",
            info.runs_missing.len(),
            info.runs_missing.join(", ")
        );
    }
    if info.stale > 0 {
        let _ = writeln!(w, "{} record(s) of the results file with another config (fingerprint) are left out.\n", info.stale);
    }
    let _ = writeln!(w, "{}\n", info.setting);
    if !info.overrides.is_empty() {
        let sets: Vec<String> = info.overrides.iter().map(|o| format!("`{o}`")).collect();
        let _ = writeln!(w, "Overrides of every run beyond its cell and the scale: {}.\n", sets.join(", "));
    }
    if !info.states_text.is_empty() {
        let _ = writeln!(w, "{}\n", info.states_text);
    }
    if table == Table::Soap {
        let _ = writeln!(w, "{SOAP_SETTING}\n");
    }
    let _ = writeln!(w, "{}\n", paper_text(table, info));
    let _ = writeln!(
        w,
        "Losses are final validation losses (nats/token); ours are seed means{}; deltas are paired by seed (same \
         initialisation and data order; a pair whose runs ran on different cards is marked ×). \
         Stalled fractions (m, v and, for BF16 weights, w) are means over the second half of each run, \
         under lowbit's estimator (stored code unchanged / elements with a non-zero update) and the \
         paper's (Alg. 2: unchanged / all entries, zero-gradient entries included); the theory is the \
         paper's for v (`lowbit_optim::theory`, b2 = 0.999, the run's v format and rounding).\n",
        if info.seeds.len() > 1 { " ± sample standard deviation over seeds" } else { "" }
    );
}

/// The sentence saying which of the paper's numbers the report shows, and why.
fn paper_text(table: Table, info: &RunInfo) -> String {
    let weights = if table.bf16_model() { "BF16" } else { "FP32" };
    let basis = &info.paper;
    match basis.published(table) {
        Some(m) if !basis.cells.is_empty() => format!(
            "Paper: {}, {}, on C4, {weights} weights and activations (docs/numerics.md), beside the cells whose runs \
             have the paper cell's state settings ({} of {}). Ours are other data and far fewer tokens: compare \
             deltas and orderings, not absolute losses.",
            m.label(),
            m.source(table).unwrap_or_default(),
            info.rows(table).iter().filter(|c| basis.cells.contains(c)).count(),
            info.rows(table).len()
        ),
        _ if basis.cells.is_empty() => "No paper number is shown: these runs' state settings are not the paper's cells \
             (an ablation); their paired deltas stand alone."
            .into(),
        _ => format!(
            "No paper loss is shown beside these runs: the paper publishes its {} at {}, not at this model size. The \
             orderings below quote the paper's deltas at {} as the claims being tested.",
            table.title(),
            if table == Table::Bf16Model {
                "LLaMA-100M (and its plain and SR + resets cells at 60M and 350M, Table 4)"
            } else {
                "LLaMA-100M"
            },
            basis.claim_model(table).label()
        ),
    }
}

/// What Table 7's report says about its runs' optimizer.
const SOAP_SETTING: &str = "SOAP cells: `optim.kind = \"soap\"` (`crates/optim/src/rules/soap`) at `[optim.soap]`'s \
     defaults, the paper's A.9: eigenbasis refresh every 10 updates, preconditioner EMA (`shampoo_beta`) 0.999, a \
     side longer than 10,000 (the embedding's and the head's vocabulary side) not preconditioned. m, v and the \
     preconditioners L and R are stored in the cell's states (L and R in m's format, scale and rounding; \
     `optim.soap.precond_format` gives them a format of their own, as the `soap_fp8_precond_fp32` ablation \
     does), written back with round-to-nearest; `resets` zero m, and v with L and R, at the main table's `*_reset` period for \
     the format (the eigenbases stay). The `AdamW, fp32` cell is the main table's FP32-states run (`fp32_plain`, \
     borrowed from its results file when its config is the same). Paper: Table 7, LLaMA-100M, which gives no \
     AdamW number. Stalled `L,R` is the preconditioners' stalled fraction.";

fn cell_rows(w: &mut String, table: Table, r: &Results, info: &RunInfo) {
    let _ = writeln!(w, "## Final validation loss per cell\n");
    let (stalled, reference) = match table {
        Table::Soap => ("m / v / w / L,R", "AdamW fp32"),
        t if t.bf16_model() => ("m / v / w", "fp32 states"),
        _ => ("m / v", "fp32 states"),
    };
    let rows = info.rows(table);
    let paper = rows.iter().any(|&c| info.paper.loss(table, c).is_some());
    let mut head = vec!["states", "fix"];
    head.extend(if paper { &["paper", "ours"][..] } else { &["ours"][..] });
    head.extend(["seeds", "card"]);
    if paper {
        head.extend(["Δ vs plain (paper)", "Δ vs plain (ours)"]);
    } else {
        head.push("Δ vs plain");
    }
    let vs_ref = format!("Δ vs {reference}");
    let (vs_ref_paper, vs_ref_ours) = (format!("{vs_ref} (paper)"), format!("{vs_ref} (ours)"));
    if paper {
        head.extend([vs_ref_paper.as_str(), vs_ref_ours.as_str()]);
    } else {
        head.push(vs_ref.as_str());
    }
    let stalled_head = format!("stalled {stalled} (ours)");
    head.extend([stalled_head.as_str(), "paper's estimator m / v", "theory v"]);
    let _ = writeln!(w, "| {} |", head.join(" | "));
    let _ = writeln!(w, "|---|---|{}", "---:|".repeat(head.len() - 2));
    let base32 = (Fmt::Fp32, Fix::Plain);
    for c in rows {
        let (f, x) = c;
        let plain = (f, Fix::Plain);
        let pd = |a: Cell, b: Cell| match (info.paper.loss(table, a), info.paper.loss(table, b)) {
            (Some(p), Some(q)) if a != b => format!("{:+.3}", p - q),
            _ => "—".into(),
        };
        let n = stalled.split(" / ").count();
        let stall = fractions(
            &[
                run_stat(r, c, |x| x.stall_m),
                run_stat(r, c, |x| x.stall_v),
                run_stat(r, c, |x| x.stall_w),
                run_stat(r, c, |x| x.stall_precond),
            ][..n],
        );
        let loss = loss_stat(r, c);
        let mut cols = vec![states_label(table, c), x.label()];
        if paper {
            cols.push(fixed_or(info.paper.loss(table, c), 3, "—"));
        }
        cols.push(opt_stat(loss, false) + if any_diverged(r, c) { " (diverged)" } else { "" });
        cols.push(loss.map_or(0, |s| s.n).to_string());
        cols.push(info.cell_cards(c));
        if paper {
            cols.push(if x == Fix::Plain { "—".into() } else { pd(c, plain) });
        }
        cols.push(if x == Fix::Plain { "—".into() } else { opt_stat(delta(r, c, plain), true) });
        if paper {
            cols.push(if c == base32 { "—".into() } else { pd(c, base32) });
        }
        cols.push(if c == base32 { "—".into() } else { opt_stat(delta(r, c, base32), true) });
        cols.push(stall);
        cols.push(fractions(&[run_stat(r, c, |x| x.unchanged_m), run_stat(r, c, |x| x.unchanged_v)]));
        cols.push(fixed_or(run_stat(r, c, |x| x.theory_v).map(|s| s.mean), 3, "—"));
        let _ = writeln!(w, "| {} |", cols.join(" | "));
    }
}

/// Seed means of stalled fractions, `m / v / w`; `—` when none was recorded.
fn fractions(stats: &[Option<Stat>]) -> String {
    if stats.iter().all(Option::is_none) {
        return "—".into();
    }
    stats.iter().map(|s| fixed_or(s.map(|s| s.mean), 3, "—")).collect::<Vec<_>>().join(" / ")
}

fn grid(w: &mut String, table: Table, r: &Results, info: &RunInfo) {
    match table {
        Table::StallProbe => return probe_theory(w),
        Table::Soap => return soap_grid(w, r, info),
        _ => {}
    }
    let rows = info.rows(table);
    if rows.len() < 2 {
        return; // one cell: the table above says it all
    }
    let paper = rows.iter().any(|&c| info.paper.loss(table, c).is_some());
    let _ = writeln!(w, "\n## Grid: {}\n", if paper { "ours (paper)" } else { "ours" });
    let _ = writeln!(w, "| states | fp32 | bf16 | fp8 | fp4 |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    for x in table.fixes() {
        if !rows.iter().any(|c| c.1 == x) {
            continue;
        }
        let mut row = format!("| {} |", x.label());
        for f in Fmt::ALL {
            let c = (f, x);
            if !rows.contains(&c) {
                row.push_str(" — |");
                continue;
            }
            let _ = write!(row, " {} |", grid_cell(table, r, info, c));
        }
        let _ = writeln!(w, "{row}");
    }
}

/// The loss of a cell as the grids give it: `3.2100`, `diverged` after it, the paper's in
/// brackets where the report may show it ([`PaperBasis::loss`]).
fn grid_cell(table: Table, r: &Results, info: &RunInfo, c: Cell) -> String {
    let ours = loss_stat(r, c).map_or("—".into(), |s| format!("{:.4}", s.mean)) + if any_diverged(r, c) { " diverged" } else { "" };
    ours + &info.paper.loss(table, c).map_or(String::new(), |p| format!(" ({p:.3})"))
}

/// Table 7 in the paper's layout: SOAP with and without resets x BF16 and FP8 states, and the
/// AdamW reference below it.
fn soap_grid(w: &mut String, r: &Results, info: &RunInfo) {
    let t = Table::Soap;
    let paper = info.rows(t).iter().any(|&c| info.paper.loss(t, c).is_some());
    let _ = writeln!(w, "\n## Grid: {}, the paper's Table 7 layout\n", if paper { "ours (paper)" } else { "ours" });
    let _ = writeln!(w, "| optimizer | bf16 | fp8 |\n|---|---:|---:|");
    for (label, x) in [("SOAP", Fix::Plain), ("SOAP + resets", Fix::Reset)] {
        let [b, f] = [Fmt::Bf16, Fmt::Fp8].map(|f| grid_cell(t, r, info, (f, x)));
        let _ = writeln!(w, "| {label} | {b} | {f} |");
    }
    let _ = writeln!(w, "\nAdamW with FP32 states (the reference, not in Table 7): {}.", grid_cell(t, r, info, (Fmt::Fp32, Fix::Plain)));
}

/// For the stall probe, in place of the grid: where each format's v sits on the probe's axis,
/// the stall theory's stalled fraction under round-to-nearest (`lowbit_optim::theory`, b2 =
/// 0.999).
fn probe_theory(w: &mut String) {
    let _ = writeln!(w, "\n## Where the formats sit\n");
    let _ = writeln!(
        w,
        "A skipped write-back is what a stall does to the stored state (the update itself uses the new moment), so a \
         format whose v stalls a fraction p of its updates sits at p on this table's axis. The stall theory's fraction \
         for v under round-to-nearest at b2 = 0.999 (`lowbit_optim::theory::p_stall`; the measured fractions of the \
         formats' runs are in the main table's report):\n"
    );
    let _ = writeln!(w, "| v format | fraction bits | theory stalled fraction |\n|---|---:|---:|");
    for (name, bits) in PROBE_FORMATS {
        let _ = writeln!(w, "| {name} | {bits} | {:.3} |", theory::p_stall(bits, 0.999, Rounding::Nearest));
    }
}

/// The v formats marked on the stall probe's axis: name and fraction bits (BF16, FP8 E4M3, FP4
/// unsigned E2M2).
pub const PROBE_FORMATS: [(&str, u32); 3] = [("bf16", 7), ("fp8 (e4m3)", 3), ("fp4 (ue2m2)", 2)];

/// Whether an outcome is a verdict (holds, mixed, does not hold) rather than "not judged".
fn judged(v: &Verdict) -> bool {
    matches!(v.outcome, Outcome::HoldsInAll | Outcome::Mixed | Outcome::DoesNotHold)
}

/// Whether a judged ordering is paired in fewer seeds than `full`, the most any judged ordering
/// of the table is paired in (a table filling in seed by seed): it holds, is mixed or does not
/// hold only so far. A seed in which no ordering has both cells does not count, so a cell
/// borrowed from another table with more seeds (the main table's FP32 states in the stall probe
/// and SOAP) does not make the table's own orderings partial; an ordering between two borrowed
/// cells (Table 6's SR + resets against plain and against SR) does count the other table's seeds.
fn judged_so_far(v: &Verdict, full: usize) -> bool {
    judged(v) && v.per_seed.len() < full
}

/// The report's word for a verdict: [`Outcome::word`], or, paired in fewer seeds than `full`
/// ([`judged_so_far`]), the outcome in the seeds run so far ("holds in the 1 seed run so far
/// (of 2)", "mixed in the 2 seeds run so far (of 3)").
fn outcome_text(v: &Verdict, full: usize) -> String {
    if !judged_so_far(v, full) {
        return v.outcome.word().into();
    }
    let k = v.per_seed.len();
    let run = format!("in the {k} seed{} run so far (of {full})", if k == 1 { "" } else { "s" });
    match v.outcome {
        Outcome::HoldsInAll => format!("holds {run}"),
        Outcome::DoesNotHold => format!("does not hold {run}"),
        Outcome::Mixed => format!("mixed {run}"),
        Outcome::Diverged | Outcome::Missing => unreachable!("not judged: no verdict so far"),
    }
}

fn orderings(w: &mut String, table: Table, r: &Results, info: &RunInfo) {
    let rows = info.rows(table);
    let claims: Vec<Claim> = claims(table).into_iter().filter(|c| rows.contains(&c.lhs) && rows.contains(&c.rhs)).collect();
    if claims.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n## The paper's orderings\n");
    let beside = info.compare.as_ref().map_or(String::new(), |c| format!(" at `{}`: Δ mean, verdict |", c.scale));
    let _ = writeln!(
        w,
        "| claim | paper Δ ({}) | ours Δ per seed (lhs − rhs) | ours Δ mean | seeds where it holds | ours |{beside}",
        info.paper.claim_model(table).label()
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---|{}", if beside.is_empty() { "" } else { "---|" });
    let verdicts: Vec<_> = claims.into_iter().map(|c| (evaluate_claim(r, &c), c)).collect();
    let full = verdicts.iter().filter(|(v, _)| judged(v)).map(|(v, _)| v.per_seed.len()).max().unwrap_or(0);
    for (v, c) in &verdicts {
        let both = info.paper.cells.contains(&c.lhs) && info.paper.cells.contains(&c.rhs);
        let paper = match info.paper.claim(table, c) {
            Some((d, h)) => format!("{d:+.3}{}", if h { "" } else { " (!)" }),
            None if !both => "— (not the paper's cells)".into(),
            None if table == Table::Bf16Model => "— (Table 2)".into(),
            None => "— (not published)".into(),
        };
        let per_seed: Vec<String> =
            v.per_seed.iter().map(|(s, d)| format!("s{s} {d:+.4}{}", if info.cross_card(c.lhs, c.rhs, *s) { " ×" } else { "" })).collect();
        let other = info.compare.as_ref().map_or(String::new(), |there| {
            let v2 = evaluate_claim(&there.results, c);
            format!(
                " {} {} ({} seed{}) |",
                opt_stat(v2.delta, true),
                v2.outcome.word(),
                v2.per_seed.len(),
                if v2.per_seed.len() == 1 { "" } else { "s" }
            )
        });
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {}/{} | **{}** |{other}",
            c.text,
            paper,
            if per_seed.is_empty() { "—".into() } else { per_seed.join(", ") },
            opt_stat(v.delta, true),
            v.seeds_holding,
            v.per_seed.len(),
            outcome_text(v, full)
        );
    }
    let partial = verdicts.iter().filter(|(v, _)| judged_so_far(v, full)).count();
    let counts = [Outcome::HoldsInAll, Outcome::Mixed, Outcome::DoesNotHold]
        .map(|o| verdicts.iter().filter(|(v, _)| v.outcome == o && !judged_so_far(v, full)).count());
    let so_far = if partial == 0 {
        String::new()
    } else {
        format!(", {partial} paired in fewer seeds than the others' {full} so far (not established until their runs are in)")
    };
    let _ = writeln!(
        w,
        "\nOf {} orderings: {} hold in all seeds, {} mixed, {} do not hold{so_far}, {} not judged.",
        verdicts.len(),
        counts[0],
        counts[1],
        counts[2],
        verdicts.len() - partial - counts.iter().sum::<usize>()
    );
    let diverged: Vec<String> = rows.iter().filter(|&&c| any_diverged(r, c)).map(|&c| cell_name(table, c)).collect();
    if !diverged.is_empty() {
        let _ = writeln!(
            w,
            "Diverged (final validation loss above the initial one): {}; orderings involving them are not judged.",
            diverged.join(", ")
        );
    }
    if info.seeds.len() < 2 {
        let _ = writeln!(w, "With one seed, an ordering is not established (docs/numerics.md: run at least two seeds).");
    }
    if let Some(c) = &info.compare {
        let cards = if c.cards.is_empty() { "cards not recorded".to_string() } else { format!("cards: {}", c.cards.join(", ")) };
        let _ = writeln!(
            w,
            "The last column is the same ordering in the same table at scale `{}` (its own records, {cards}: other \
             steps, batch and lr, docs/reproduce.md \"Scales\"), paired over its seeds.",
            c.scale
        );
    }
}

fn kinds_compared(w: &mut String, table: Table, rows: &[Cell], kinds: &[(&'static str, Results)]) {
    let _ = writeln!(w, "\n## The states kinds, cell by cell\n");
    let _ = writeln!(
        w,
        "Final validation loss (seed mean ± spread) and, in brackets, the paired delta against FP32 \
         states of the same kind. FP32 and BF16 cells are the same runs under `paper` and `blockwise`; \
         `theory`'s are its own (eps 1e-8 in every cell).\n"
    );
    let labels: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
    let _ = writeln!(w, "| states | fix | {} |", labels.join(" | "));
    let _ = writeln!(w, "|---|---|{}", "---:|".repeat(kinds.len()));
    let base32 = (Fmt::Fp32, Fix::Plain);
    for &c in rows {
        let mut row = format!("| {} | {} |", states_label(table, c), c.1.label());
        for (_, r) in kinds {
            let loss = opt_stat(loss_stat(r, c), false);
            let vs = if c == base32 { String::new() } else { delta(r, c, base32).map_or(String::new(), |d| format!(" ({})", d.fmt(true))) };
            let _ = write!(row, " {loss}{vs}{} |", if any_diverged(r, c) { " diverged" } else { "" });
        }
        let _ = writeln!(w, "{row}");
    }
}

/// The markdown report of a table: header, per-cell table, grid, orderings, and the states
/// kinds side by side when `info.kinds` holds results of more than one.
pub fn render(table: Table, scale: Scale, r: &Results, info: &RunInfo) -> String {
    let mut s = String::new();
    header(&mut s, table, scale, info);
    cell_rows(&mut s, table, r, info);
    grid(&mut s, table, r, info);
    orderings(&mut s, table, r, info);
    let kinds: Vec<(&'static str, Results)> = info.kinds.iter().filter(|(_, r)| !r.is_empty()).cloned().collect();
    if kinds.len() > 1 {
        kinds_compared(&mut s, table, &info.rows(table), &kinds);
    }
    s
}
