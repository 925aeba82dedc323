//! The markdown report of a table for one states kind, rendered from the results file: a
//! header saying how it was made, the per-cell table (seed mean and spread, paired deltas,
//! stalled fractions beside the theory), the grid in the paper's layout, and the paper's
//! orderings seed by seed. [`render`] is a pure function of the results.

use super::paper::{cell_name, cells, claims, paper_loss, paper_verdict, states_label, Cell, Fix, Fmt, Table};
use super::results::CommandLog;
use super::scale::Scale;
use super::stats::{any_diverged, delta, evaluate_claim, loss_stat, run_stat, Outcome, Results, Stat, Verdict};
use lowbit_optim::{theory, Rounding};
use lowbit_train::output::fixed_or;
use std::fmt::Write as _;

/// What the report says about how it was made.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// The name of the results file the report is rendered from (beside the report).
    pub results_file: String,
    /// The commands that filled it.
    pub commands: Vec<CommandLog>,
    /// Seeds the report covers.
    pub seeds: Vec<usize>,
    /// Runs the report expects (cells x seeds) and the names of those missing.
    pub runs_total: usize,
    pub runs_missing: Vec<String>,
    /// Records of this kind in the results file whose config differs from today's (other
    /// overrides, an older scale): left out.
    pub stale: usize,
    /// Parameters, steps and training tokens per run (from a record).
    pub params: Option<usize>,
    pub steps: Option<u64>,
    pub tokens_per_run: Option<u64>,
    /// Scale text (normally [`super::scale_description`]).
    pub scale_text: String,
    /// What the FP8/FP4 cells store their states in ([`super::States::description`]).
    pub states_text: String,
    /// The results of every states kind (label, results over the same seeds), for the section
    /// that compares them cell by cell; empty: no such section.
    pub kinds: Vec<(&'static str, Results)>,
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
    let _ = writeln!(w, "# Reproduction of the paper's {}, scale `{}`\n", table.title(), scale.as_str());
    let found = info.runs_total - info.runs_missing.len();
    let mut facts = vec![format!("{found} of {} runs ({} cells x {})", info.runs_total, cells(table).len(), seeds_text(&info.seeds))];
    if let Some(p) = info.params {
        facts.push(format!("{:.1}M parameters", p as f64 / 1e6));
    }
    if let (Some(st), Some(tk)) = (info.steps, info.tokens_per_run) {
        facts.push(format!("{st} steps, {tk} training tokens per run"));
    }
    let _ = writeln!(w, "Rendered from `{}` (beside this report): {}.", info.results_file, facts.join("; "));
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
    let _ = writeln!(w, "{}\n", info.scale_text);
    if info.commands.iter().any(|c| c.command.contains(" --set ")) {
        let _ = writeln!(
            w,
            "The `--set` overrides of the command(s) above replace this description's settings where they differ \
             (the parameter count above is the model that ran).\n"
        );
    }
    if !info.states_text.is_empty() {
        let _ = writeln!(w, "{}\n", info.states_text);
    }
    if table == Table::Soap {
        let _ = writeln!(w, "{SOAP_SETTING}\n");
    }
    let _ = writeln!(
        w,
        "Paper: LLaMA-100M on C4, {} (docs/numerics.md). Losses are final validation losses (nats/token); \
         ours are seed means{}; deltas are paired by seed (same initialisation and data order). \
         Stalled fractions (m, v and, for BF16 weights, w) are means over the second half of each run, \
         under lowbit's estimator (stored code unchanged / elements with a non-zero update) and the \
         paper's (Alg. 2: unchanged / all entries, zero-gradient entries included); the theory is the \
         paper's for v (`lowbit_optim::theory`, b2 = 0.999, the run's v format and rounding). Ours and \
         the paper's are different models and data: compare deltas and orderings, not absolute losses.\n",
        if table.bf16_model() { "BF16 weights and activations" } else { "FP32 weights and activations" },
        if info.seeds.len() > 1 { " ± sample standard deviation over seeds" } else { "" }
    );
}

/// What Table 7's report says about its runs' optimizer.
const SOAP_SETTING: &str = "SOAP cells: `optim.kind = \"soap\"` (`crates/optim/src/soap`) at `[optim.soap]`'s \
     defaults, the paper's A.9: eigenbasis refresh every 10 updates, preconditioner EMA (`shampoo_beta`) 0.999, a \
     side longer than 10,000 (the embedding's and the head's vocabulary side) not preconditioned. m, v and the \
     preconditioners L and R are stored in the cell's states (L and R in m's format, scale and rounding; \
     `optim.soap.precond_format` gives them a format of their own, as the `soap_fp8_precond_fp32` ablation \
     does), written back with round-to-nearest; `resets` zero m, and v with L and R, at the main table's `*_reset` period for \
     the format (the eigenbases stay). The `AdamW, fp32` cell is the main table's FP32-states run (`fp32_plain`, \
     borrowed from its results file when its config is the same). Paper: Table 7, LLaMA-100M, which gives no \
     AdamW number. Stalled `L,R` is the preconditioners' stalled fraction.";

fn cell_rows(w: &mut String, table: Table, r: &Results) {
    let _ = writeln!(w, "## Final validation loss per cell\n");
    let (stalled, reference) = match table {
        Table::Soap => ("m / v / w / L,R", "AdamW fp32"),
        t if t.bf16_model() => ("m / v / w", "fp32 states"),
        _ => ("m / v", "fp32 states"),
    };
    let _ = writeln!(
        w,
        "| states | fix | paper | ours | seeds | Δ vs plain (paper) | Δ vs plain (ours) | Δ vs {reference} (paper) | Δ vs {reference} (ours) | stalled {stalled} (ours) | paper's estimator m / v | theory v |",
    );
    let _ = writeln!(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
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
        let n = stalled.split(" / ").count();
        let stall = fractions(
            &[
                run_stat(r, c, |x| x.stall_m),
                run_stat(r, c, |x| x.stall_v),
                run_stat(r, c, |x| x.stall_w),
                run_stat(r, c, |x| x.stall_precond),
            ][..n],
        );
        let unchanged = fractions(&[run_stat(r, c, |x| x.unchanged_m), run_stat(r, c, |x| x.unchanged_v)]);
        let loss = loss_stat(r, c);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            states_label(table, c),
            x.label(),
            fixed_or(paper_loss(table, c), 3, "—"),
            opt_stat(loss, false) + if any_diverged(r, c) { " (diverged)" } else { "" },
            loss.map_or(0, |s| s.n),
            if x == Fix::Plain { "—".into() } else { pd(c, plain) },
            vs_plain,
            if c == base32 { "—".into() } else { pd(c, base32) },
            vs_32,
            stall,
            unchanged,
            fixed_or(run_stat(r, c, |x| x.theory_v).map(|s| s.mean), 3, "—"),
        );
    }
}

/// Seed means of stalled fractions, `m / v / w`; `—` when none was recorded.
fn fractions(stats: &[Option<Stat>]) -> String {
    if stats.iter().all(Option::is_none) {
        return "—".into();
    }
    stats.iter().map(|s| fixed_or(s.map(|s| s.mean), 3, "—")).collect::<Vec<_>>().join(" / ")
}

fn grid(w: &mut String, table: Table, r: &Results) {
    match table {
        Table::StallProbe => return probe_theory(w),
        Table::Soap => return soap_grid(w, r),
        _ => {}
    }
    let _ = writeln!(w, "\n## Grid: ours (paper)\n");
    let _ = writeln!(w, "| states | fp32 | bf16 | fp8 | fp4 |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|");
    let all = cells(table);
    for x in table.fixes() {
        let mut row = format!("| {} |", x.label());
        for f in Fmt::ALL {
            let c = (f, x);
            if !all.contains(&c) {
                row.push_str(" — |");
                continue;
            }
            let _ = write!(row, " {} |", grid_cell(table, r, c));
        }
        let _ = writeln!(w, "{row}");
    }
}

/// The loss of a cell as the grids give it: `3.2100`, `diverged` after it, the paper's in
/// brackets where published.
fn grid_cell(table: Table, r: &Results, c: Cell) -> String {
    let ours = loss_stat(r, c).map_or("—".into(), |s| format!("{:.4}", s.mean)) + if any_diverged(r, c) { " diverged" } else { "" };
    ours + &paper_loss(table, c).map_or(String::new(), |p| format!(" ({p:.3})"))
}

/// Table 7 in the paper's layout: SOAP with and without resets x BF16 and FP8 states, and the
/// AdamW reference below it.
fn soap_grid(w: &mut String, r: &Results) {
    let _ = writeln!(w, "\n## Grid: ours (paper), the paper's Table 7 layout\n");
    let _ = writeln!(w, "| optimizer | bf16 | fp8 |\n|---|---:|---:|");
    for (label, x) in [("SOAP", Fix::Plain), ("SOAP + resets", Fix::Reset)] {
        let [b, f] = [Fmt::Bf16, Fmt::Fp8].map(|f| grid_cell(Table::Soap, r, (f, x)));
        let _ = writeln!(w, "| {label} | {b} | {f} |");
    }
    let _ =
        writeln!(w, "\nAdamW with FP32 states (the reference, not in Table 7): {}.", grid_cell(Table::Soap, r, (Fmt::Fp32, Fix::Plain)));
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

fn orderings(w: &mut String, table: Table, r: &Results, seeds: usize) {
    let _ = writeln!(w, "\n## The paper's orderings\n");
    let _ = writeln!(w, "| claim | paper Δ | ours Δ per seed (lhs − rhs) | ours Δ mean | seeds where it holds | ours |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---|");
    let verdicts: Vec<_> = claims(table).into_iter().map(|c| (evaluate_claim(r, &c), c)).collect();
    let full = verdicts.iter().filter(|(v, _)| judged(v)).map(|(v, _)| v.per_seed.len()).max().unwrap_or(0);
    for (v, c) in &verdicts {
        let paper = match paper_verdict(table, c) {
            Some((d, h)) => format!("{d:+.3}{}", if h { "" } else { " (!)" }),
            None if table == Table::Bf16Model => "— (Table 2)".into(),
            None => "— (not published)".into(),
        };
        let per_seed: Vec<String> = v.per_seed.iter().map(|(s, d)| format!("s{s} {d:+.4}")).collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {}/{} | **{}** |",
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
    let diverged: Vec<String> = cells(table).into_iter().filter(|&c| any_diverged(r, c)).map(|c| cell_name(table, c)).collect();
    if !diverged.is_empty() {
        let _ = writeln!(
            w,
            "Diverged (final validation loss above the initial one): {}; orderings involving them are not judged.",
            diverged.join(", ")
        );
    }
    if seeds < 2 {
        let _ = writeln!(w, "With one seed, an ordering is not established (docs/numerics.md: run at least two seeds).");
    }
}

fn kinds_compared(w: &mut String, table: Table, kinds: &[(&'static str, Results)]) {
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
    for c in cells(table) {
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
    cell_rows(&mut s, table, r);
    grid(&mut s, table, r);
    orderings(&mut s, table, r, info.seeds.len());
    let kinds: Vec<(&'static str, Results)> = info.kinds.iter().filter(|(_, r)| !r.is_empty()).cloned().collect();
    if kinds.len() > 1 {
        kinds_compared(&mut s, table, &kinds);
    }
    s
}
