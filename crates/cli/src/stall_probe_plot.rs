//! The paper's simulated-stalling probe (arXiv:2603.16731v1, §3.3) as a figure: the final
//! validation loss of FP32 states whose m or v write-backs are skipped with probability p
//! (`train reproduce --table stall-probe`, [`Table::StallProbe`]) against p, with the stall
//! theory's stalled fraction of each format's v marked on the axis, so a reader sees where
//! BF16, FP8 and FP4 states sit. Reads `<results>/records/stall-probe-<scale>-results.json` (its p = 0
//! runs are the main table's FP32 cell, copied in by `train reproduce`); writes
//! `stall-probe-<scale>.{svg,png}` (the mean over seeds).

use crate::plot::{render, Panel, Series};
use anyhow::{Context, Result};
use lowbit_optim::{theory, Rounding};
use lowbit_reproduce::{cell_short, cells, report::PROBE_FORMATS, results_path, ResultsFile, Scale, Table, SHARED};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Per skipped state (`"m"`, `"v"`), per p in thousandths, the final losses of its seeds.
type Probe = BTreeMap<&'static str, BTreeMap<u16, Vec<f64>>>;

/// The probe's runs in a results file (an absent file has none). The p = 0 cell belongs to
/// both states' curves.
fn collect(path: &Path, scale: Scale) -> Result<Probe> {
    let file = ResultsFile::load(path, Table::StallProbe, scale)?;
    let probe_cells = cells(Table::StallProbe);
    let mut out = Probe::new();
    for r in file.runs.iter().filter(|r| r.states == SHARED) {
        let (Some(&cell), Some(loss)) = (probe_cells.iter().find(|c| cell_short(Table::StallProbe, c) == r.cell), r.final_val_loss) else {
            continue;
        };
        match cell.1.skip() {
            Some((state, p)) => out.entry(state).or_default().entry((p * 1000.0).round() as u16).or_default().push(loss),
            None => {
                for state in ["m", "v"] {
                    out.entry(state).or_default().entry(0).or_default().push(loss);
                }
            }
        }
    }
    Ok(out)
}

fn mean(l: &[f64]) -> f64 {
    l.iter().sum::<f64>() / l.len() as f64
}

/// The panel: per state the seed mean against p, each format's theory fraction dashed.
fn panel(probe: &Probe, scale: Scale) -> Panel {
    let all = probe.values().flat_map(|by_p| by_p.values().map(|l| mean(l)));
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let mut series: Vec<Series> = probe
        .iter()
        .map(|(state, by_p)| Series {
            name: format!("{state} write-backs skipped"),
            points: by_p.iter().map(|(&p, l)| (f64::from(p) / 1000.0, mean(l))).collect(),
            dashed: false,
        })
        .collect();
    for (name, bits) in PROBE_FORMATS {
        let p = theory::p_stall(bits, 0.999, Rounding::Nearest);
        series.push(Series { name: format!("{name} v stalls (theory {p:.3})"), points: vec![(p, lo), (p, hi)], dashed: true });
    }
    Panel {
        title: format!("simulated stalling, FP32 states ({}; mean over seeds)", scale.as_str()),
        x_label: "p (share of write-backs skipped after the warmup)".into(),
        y_label: "final validation loss".into(),
        series,
    }
}

/// `train plot --stall-probe SCALE` (and the end of `train reproduce --table stall-probe`):
/// the figure from the runs under `results`, written into `out`; returns the files written.
///
/// # Errors
/// No probe runs of the scale under `results`, a results file that does not parse, or an
/// output file that cannot be written.
pub fn plot_stall_probe(results: &Path, scale: Scale, out: &Path) -> Result<Vec<PathBuf>> {
    let path = results_path(results, Table::StallProbe, scale, None);
    let probe = collect(&path, scale)?;
    if probe.values().all(|by_p| by_p.keys().all(|&p| p == 0)) {
        anyhow::bail!("no simulated-stalling runs of scale {} in {} (train reproduce --table stall-probe)", scale.as_str(), path.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    render(&out.join(format!("stall-probe-{}", scale.as_str())), &[panel(&probe, scale)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe's runs land on their state's curve at their p, the p = 0 run on both, runs of
    /// another kind or unknown cells are left out; without skip runs it is an error.
    #[test]
    fn runs_land_on_their_curve_and_the_figure_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let scale = Scale::H200Shuffled;
        let path = results_path(dir.path(), Table::StallProbe, scale, None);
        let write = |runs: &[(&str, &str, usize, f64)]| {
            let runs: Vec<serde_json::Value> = runs
                .iter()
                .map(|&(kind, cell, seed, loss)| {
                    serde_json::json!({"states": kind, "cell": cell, "seed": seed, "fingerprint": "0", "initial_val_loss": 10.4,
                        "final_val_loss": loss, "mean_stall_m": null, "mean_stall_v": null, "mean_stall_w": null,
                        "theory_stall_v": null, "diverged": false, "steps": 2400, "tokens": 1, "params": 1})
                })
                .collect();
            let file = serde_json::json!({"table": "stall-probe", "scale": "h200-shuffled", "commands": [], "runs": runs});
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
        };
        write(&[("shared", "fp32_plain", 0, 3.60)]);
        let e = plot_stall_probe(dir.path(), scale, dir.path()).unwrap_err().to_string();
        assert!(e.contains("no simulated-stalling runs"), "{e}");
        write(&[
            ("shared", "fp32_plain", 0, 3.60),
            ("shared", "fp32_skip_v_0.5", 0, 3.70),
            ("shared", "fp32_skip_v_0.5", 1, 3.72),
            ("shared", "fp32_skip_m_0.99", 0, 4.10),
            ("theory", "fp32_skip_m_0.25", 0, 9.0),
            ("shared", "fp32_skip_m_0.3", 0, 9.0),
        ]);
        let probe = collect(&path, scale).unwrap();
        assert_eq!(probe["v"][&0], vec![3.60]);
        assert_eq!(probe["m"][&0], vec![3.60]);
        assert_eq!(probe["v"][&500], vec![3.70, 3.72]);
        assert_eq!(probe["m"][&990], vec![4.10]);
        assert_eq!(probe["m"].len(), 2, "{:?}", probe["m"]);
        let files = plot_stall_probe(dir.path(), scale, dir.path()).unwrap();
        assert_eq!(files.len(), 2);
        let svg = std::fs::read_to_string(dir.path().join("stall-probe-h200-shuffled.svg")).unwrap();
        assert!(svg.contains("v write-backs skipped") && svg.contains("fp8 (e4m3) v stalls (theory"), "legend missing");
    }
}
