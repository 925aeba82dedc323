//! The paper's Fig. 4, reset-period sensitivity (arXiv:2603.16731v1, §6.2): the final
//! validation loss of SR + resets (m and v every K updates) against K, per state format, from
//! the runs `train reproduce` keeps:
//! * `<results>/records/ablations/<fmt>_period_<K>/bf16-model-<scale>-results.json`: the
//!   ablations `fp8_period_K`, `fp4_period_K` (`train reproduce --ablation`), cell
//!   `<fmt>_sr_reset` with both periods set to K;
//! * `<results>/records/bf16-model-<scale>-results.json`: the main table's `<fmt>_sr_reset` at the
//!   scale's period ([`reset_period`], the paper's K* scaled) and `<fmt>_sr` (no resets); an
//!   ablation at K* adds only the seeds the table lacks.
//!
//! Writes `fig4-reset-period-<scale>.{svg,png}` (the mean over seeds vs K; SR alone
//! dashed; K* marked by a dashed vertical line) and `.md` (every seed's loss).

use crate::plot::{render, Panel, Series};
use anyhow::{Context, Result};
use lowbit_reproduce::{ablations, reset_period, results_path, Fmt, ResultsFile, Scale, States, Table};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Final validation loss and the card that made it (`H100`, `?` where not recorded), by
/// seed, of one setting.
type Losses = BTreeMap<usize, (f64, String)>;

/// One format's measurements: by reset period K, and SR without resets.
#[derive(Default)]
struct FormatRuns {
    by_period: BTreeMap<u64, Losses>,
    no_reset: Losses,
}

/// The losses of `cell` (a cell of format `fmt`) in a results file, the paper's state
/// formats only (a results file may also hold the `blockwise` and `theory` kinds' runs of the
/// same cell); an absent file has none.
fn cell_losses(path: &Path, scale: Scale, fmt: Fmt, cell: &str) -> Result<Losses> {
    let file = ResultsFile::load(path, Table::Bf16Model, scale)?;
    let kind = States::Paper.tag(fmt);
    let card = |c: Option<&str>| c.map_or("?".to_string(), lowbit_reproduce::provenance::short_card);
    Ok(file
        .runs
        .iter()
        .filter(|r| r.cell == cell && r.states == kind)
        .filter_map(|r| Some((r.seed, (r.final_val_loss?, card(r.card.as_deref())))))
        .collect())
}

/// Every format's runs under `results` at `scale`.
fn collect(results: &Path, scale: Scale) -> Result<BTreeMap<Fmt, FormatRuns>> {
    let mut out = BTreeMap::new();
    for fmt in [Fmt::Fp8, Fmt::Fp4] {
        let name = fmt.as_str();
        let mut runs = FormatRuns::default();
        let main = results_path(results, Table::Bf16Model, scale, None);
        runs.by_period.insert(reset_period(scale, fmt), cell_losses(&main, scale, fmt, &format!("{name}_sr_reset"))?);
        runs.no_reset = cell_losses(&main, scale, fmt, &format!("{name}_sr"))?;
        let prefix = format!("{name}_period_");
        for a in ablations().into_iter().filter(|a| a.scale == scale) {
            let Some(k) = a.name.strip_prefix(&prefix).and_then(|k| k.parse::<u64>().ok()) else { continue };
            let path = results_path(results, Table::Bf16Model, scale, Some(&a.name));
            let losses = cell_losses(&path, scale, fmt, &format!("{name}_sr_reset"))?;
            // the main table's record of a seed stays: an ablation at K* only adds seeds the
            // table lacks (the figure pairs K* and SR alone from the same runs)
            let period = runs.by_period.entry(k).or_default();
            for (seed, loss) in losses {
                period.entry(seed).or_insert(loss);
            }
        }
        runs.by_period.retain(|_, l| !l.is_empty());
        if !runs.by_period.is_empty() {
            out.insert(fmt, runs);
        }
    }
    Ok(out)
}

impl FormatRuns {
    /// The seeds every row of the format has (every K and SR alone): the means compare rows
    /// over the same seeds.
    fn common_seeds(&self) -> Vec<usize> {
        let rows = || self.by_period.values().chain([&self.no_reset]).filter(|l| !l.is_empty());
        let first: Vec<usize> = rows().next().map_or(vec![], |l| l.keys().copied().collect());
        first.into_iter().filter(|s| rows().all(|l| l.contains_key(s))).collect()
    }
}

/// The mean loss of a row over `seeds` (NaN where the row has none of them).
fn mean(l: &Losses, seeds: &[usize]) -> f64 {
    let xs: Vec<f64> = seeds.iter().filter_map(|s| l.get(s).map(|x| x.0)).collect();
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// The distinct cards of a row's runs, joined by `/`.
fn cards(l: &Losses) -> String {
    let mut v: Vec<&str> = l.values().map(|x| x.1.as_str()).collect();
    v.sort_unstable();
    v.dedup();
    v.join("/")
}

/// The figure's panel: per format the mean over seeds vs K, SR alone and K* dashed.
fn panel(runs: &BTreeMap<Fmt, FormatRuns>, scale: Scale) -> Panel {
    let all = runs.values().flat_map(|r| {
        let seeds = r.common_seeds();
        r.by_period.values().chain([&r.no_reset]).filter(|l| !l.is_empty()).map(move |l| mean(l, &seeds)).collect::<Vec<_>>()
    });
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let mut series = vec![];
    for (&fmt, r) in runs {
        let (name, x, seeds) = (fmt.as_str(), |k: u64| k as f64, r.common_seeds());
        series.push(Series {
            name: format!("{name} SR + resets"),
            points: r.by_period.iter().map(|(&k, l)| (x(k), mean(l, &seeds))).collect(),
            dashed: false,
        });
        let (k0, k1) = (*r.by_period.keys().next().unwrap(), *r.by_period.keys().last().unwrap());
        if !r.no_reset.is_empty() {
            let m = mean(&r.no_reset, &seeds);
            series.push(Series { name: format!("{name} SR alone"), points: vec![(x(k0), m), (x(k1), m)], dashed: true });
        }
        let star = x(reset_period(scale, fmt));
        series.push(Series {
            name: format!("{name} K* = {}", reset_period(scale, fmt)),
            points: vec![(star, lo), (star, hi)],
            dashed: true,
        });
    }
    Panel {
        title: format!("reset-period sensitivity ({}; mean over the seeds every K has)", scale.as_str()),
        x_label: "K (m and v reset every K updates)".into(),
        y_label: "final validation loss".into(),
        series,
    }
}

/// The markdown table: one row per (format, K), every seed's loss and the mean.
fn table(runs: &BTreeMap<Fmt, FormatRuns>, scale: Scale) -> String {
    let seeds: Vec<usize> = {
        let mut s: Vec<usize> =
            runs.values().flat_map(|r| r.by_period.values().chain([&r.no_reset]).flat_map(|l| l.keys().copied())).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let mut out = format!(
        "# Reset-period sensitivity (the paper's Fig. 4), `{}`\n\nFinal validation loss of SR + resets of m and v every K \
         updates (BF16 model), per seed, from `train plot --reset-periods {}`. K* is the scale's period for the format \
         (the paper's, scaled to the run's length); \"none\" is SR without resets (the main table's SR cell). The mean is \
         over the seeds every row of the format has (the figure draws it); the cards column gives the cards of the \
         row's runs: rows on different cards differ by up to ~0.015 for the card alone.\n\n\
         | format | K | {} | mean | over seeds | cards |\n|---|---:|{}---:|---|---|\n",
        scale.as_str(),
        scale.as_str(),
        seeds.iter().map(|s| format!("seed {s}")).collect::<Vec<_>>().join(" | "),
        "---:|".repeat(seeds.len())
    );
    let row = |name: &str, k: String, l: &Losses, common: &[usize]| {
        let cells: Vec<String> = seeds.iter().map(|s| l.get(s).map_or("".into(), |v| format!("{:.4}", v.0))).collect();
        let over: Vec<String> = common.iter().map(|s| s.to_string()).collect();
        format!("| {name} | {k} | {} | {:.4} | {} | {} |\n", cells.join(" | "), mean(l, common), over.join(", "), cards(l))
    };
    for (&fmt, r) in runs {
        let (name, common) = (fmt.as_str(), r.common_seeds());
        for (&k, l) in &r.by_period {
            let star = if k == reset_period(scale, fmt) { " (K*)" } else { "" };
            out += &row(name, format!("{k}{star}"), l, &common);
        }
        if !r.no_reset.is_empty() {
            out += &row(name, "none".into(), &r.no_reset, &common);
        }
    }
    out
}

/// `train plot --reset-periods SCALE`: the figure and its table from the runs under
/// `results` (`reproduce/`), written into `out`; returns the files written.
///
/// # Errors
/// No reset-period runs of the scale under `results`, a results file that does not parse,
/// or an output file that cannot be written.
pub fn plot_reset_periods(results: &Path, scale: Scale, out: &Path) -> Result<Vec<PathBuf>> {
    let runs = collect(results, scale)?;
    if runs.is_empty() {
        anyhow::bail!(
            "no SR + resets runs of scale {} under {} (the main table's bf16-model records and the <fmt>_period_<K> ablations' under records/)",
            scale.as_str(),
            results.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let base = out.join(format!("fig4-reset-period-{}", scale.as_str()));
    let mut files = render(&base, &[panel(&runs, scale)])?;
    let md = base.with_extension("md");
    std::fs::write(&md, table(&runs, scale)).with_context(|| format!("cannot write {}", md.display()))?;
    files.push(md);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results file of the main table at `h200-shuffled` holding `(cell, seed, loss)` runs.
    fn write_results(path: &Path, runs: &[(&str, usize, f64)]) {
        let runs: Vec<serde_json::Value> = runs
            .iter()
            .map(|&(cell, seed, loss)| {
                // "cell@kind": a run of another states kind than the paper's
                let (cell, kind) = cell.split_once('@').unwrap_or((cell, "paper"));
                serde_json::json!({"states": kind, "cell": cell, "seed": seed, "fingerprint": "0", "initial_val_loss": 10.4,
                    "final_val_loss": loss, "mean_stall_m": null, "mean_stall_v": null, "mean_stall_w": null,
                    "theory_stall_v": null, "diverged": false, "steps": 2400, "tokens": 1, "params": 1})
            })
            .collect();
        let file = serde_json::json!({"table": "bf16-model", "scale": "h200-shuffled", "commands": [], "runs": runs});
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, serde_json::to_string(&file).unwrap()).unwrap();
    }

    /// The main table's K* cell (an ablation rerun of K* adding only the seeds the table
    /// lacks), an ablation's K and SR alone land in their rows with their seeds' mean; runs of
    /// the other state kinds (theory) are not mixed in; a format without runs is left out; no
    /// runs at all is an error.
    #[test]
    fn the_table_holds_every_period_and_seed() {
        let dir = tempfile::tempdir().unwrap();
        let scale = Scale::H200Shuffled;
        let at = |ablation: Option<&str>| results_path(dir.path(), Table::Bf16Model, scale, ablation);
        write_results(
            &at(None),
            &[
                ("fp4_sr_reset", 0, 3.70),
                ("fp4_sr_reset", 1, 3.72),
                ("fp4_sr", 0, 3.66),
                ("fp32_plain", 0, 3.6),
                ("fp4_sr_reset@theory", 0, 9.9),
                ("fp4_sr_reset@theory", 2, 9.9),
            ],
        );
        write_results(&at(Some("fp4_period_1000")), &[("fp4_sr_reset", 0, 3.65), ("fp4_sr_reset", 1, 3.67)]);
        // a rerun of K* (another card): the table's seeds 0 and 1 stay, its seed 2 is added
        write_results(&at(Some("fp4_period_200")), &[("fp4_sr_reset", 0, 3.10), ("fp4_sr_reset", 1, 3.10), ("fp4_sr_reset", 2, 3.74)]);
        // an ablation that is no period sweep is not read
        write_results(&at(Some("v_zero_exclude")), &[("fp8_sr_reset", 0, 9.0)]);
        let runs = collect(dir.path(), scale).unwrap();
        assert_eq!(runs.keys().copied().collect::<Vec<_>>(), [Fmt::Fp4], "fp8 has no runs");
        let md = table(&runs, scale);
        // the means are over seed 0, the one every fp4 row has (SR alone ran seed 0 only)
        assert!(md.contains("| fp4 | 200 (K*) | 3.7000 | 3.7200 | 3.7400 | 3.7000 | 0 | ? |"), "{md}");
        assert!(md.contains("| fp4 | 1000 | 3.6500 | 3.6700 |  | 3.6500 | 0 | ? |"), "{md}");
        assert!(md.contains("| fp4 | none | 3.6600 |  |  | 3.6600 | 0 | ? |"), "{md}");
        let files = plot_reset_periods(dir.path(), scale, &dir.path().join("fig")).unwrap();
        assert_eq!(files.len(), 3);
        assert!(files.iter().all(|f| f.is_file()));
        let e = plot_reset_periods(&dir.path().join("none"), scale, dir.path()).unwrap_err().to_string();
        assert!(e.contains("no SR + resets runs of scale h200-shuffled"), "{e}");
    }
}
