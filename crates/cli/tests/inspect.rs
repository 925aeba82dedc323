//! Stall inspection and prediction: `train stalls` tables on hand-made stalls.jsonl files
//! (group aggregation, theory column, a truncated last line), `train predict`'s numbers,
//! and determinism of the logs (same seed and config: identical stalls.jsonl and losses).

use lowbit_cli::predict::{predict, reset_periods};
use lowbit_cli::stalls_table::Estimator;
use lowbit_cli::stalls_table::{render, table, By, State};
use lowbit_train::config::RunConfig;
use lowbit_train::logs::metrics::{read_rows, MetricsRow};
use lowbit_train::logs::stalls::StallRow;
use lowbit_train::progress::Logs;
use lowbit_train::run;
use lowbit_train::session::Launch;
use std::path::{Path, PathBuf};

mod common;
use common::base_toml;

fn row(step: u64, m: (u64, u64), v: (u64, u64), groups: &str, tensors: Option<&str>) -> String {
    let frac = |(u, s): (u64, u64)| if u == 0 { "null".to_string() } else { format!("{}", s as f64 / u as f64) };
    let t = tensors.map_or(String::new(), |t| format!(r#","tensors":{t}"#));
    format!(
        r#"{{"step":{step},"m":{{"updated":{},"stalled":{}}},"v":{{"updated":{},"stalled":{}}},"w":{{"updated":0,"stalled":0}},"frac":{{"m":{},"v":{}}},"groups":{groups},"theory":{{"v":0.946}}{t}}}"#,
        m.0,
        m.1,
        v.0,
        v.1,
        frac(m),
        frac(v)
    )
}

fn write_stalls(dir: &Path, truncated_tail: bool) -> PathBuf {
    let p = dir.join("stalls.jsonl");
    let mut text = String::new();
    text += &row(1, (100, 10), (100, 50), r#"{"attn":{"m":0.2,"v":0.4},"mlp":{"m":0.0,"v":0.6}}"#, None);
    text.push('\n');
    text += &row(2, (100, 30), (100, 90), r#"{"attn":{"m":0.4,"v":0.8},"mlp":{"m":0.2,"v":1.0}}"#, Some(r#"{"w1":{"m":0.5,"v":0.9}}"#));
    text.push('\n');
    if truncated_tail {
        text += r#"{"step":3,"m":{"updated":100,"sta"#; // a trainer mid-write
    }
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn stalls_table_aggregates_groups_and_shows_theory() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<StallRow> = read_rows(&write_stalls(dir.path(), true)).unwrap();
    assert_eq!(rows.len(), 2, "the partly written last line is skipped");
    let t = table(&rows, By::Group, 100);
    assert_eq!(t.step, 2);
    assert_eq!(t.theory_v, Some(0.946));
    let names: Vec<&str> = t.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["attn", "mlp", "all"], "groups sorted, the total last");
    let attn = &t.lines[0];
    assert_eq!(attn.latest.v, Some(0.8));
    assert!((attn.mean.v.unwrap() - 0.6).abs() < 1e-12, "running mean of 0.4 and 0.8");
    let all = &t.lines[2];
    assert_eq!(all.latest.m, Some(0.3));
    assert!((all.mean.v.unwrap() - 0.7).abs() < 1e-12);
    // the window keeps only the last step
    assert_eq!(table(&rows, By::Group, 1).lines[0].mean.v, Some(0.8));
    let text = render(&t, None, Estimator::Updated, "");
    let all_line = text.lines().find(|l| l.starts_with("all")).unwrap();
    assert!(all_line.contains("0.946") && all_line.contains("-0.246"), "theory and diff (0.700 - 0.946): {all_line}");
    let only_v = render(&t, Some(State::V), Estimator::Updated, "");
    assert!(!only_v.contains("m latest") && only_v.contains("v latest"));
    // rows written before the paper's estimator was counted: its columns are empty
    let paper = render(&t, Some(State::V), Estimator::Paper, "");
    assert!(paper.contains("unchanged / all entries"), "{paper}");
    assert!(paper.lines().find(|l| l.starts_with("all")).unwrap().contains("       -       -"), "{paper}");
}

/// The paper's estimator (unchanged / all entries) beside lowbit's (stalled / updated): a row
/// where half the entries had a zero gradient and stayed.
#[test]
fn stalls_table_shows_the_papers_estimator() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("stalls.jsonl");
    std::fs::write(
        &p,
        r#"{"step":5,"m":{"updated":50,"stalled":10,"unchanged":60,"elements":100},"v":{"updated":50,"stalled":40,"unchanged":90,"elements":100},"w":{"updated":0,"stalled":0},"zero_grad":50,"frac":{"m":0.2,"v":0.8,"m_unchanged":0.6,"v_unchanged":0.9},"groups":{},"theory":{"v":1.0}}"#,
    )
    .unwrap();
    let rows: Vec<StallRow> = read_rows(&p).unwrap();
    assert_eq!((rows[0].zero_grad, rows[0].v.unchanged, rows[0].v.elements), (50, 90, 100));
    let t = table(&rows, By::Group, 100);
    let line = |e| render(&t, Some(State::V), e, "").lines().find(|l| l.starts_with("all")).unwrap().to_string();
    assert!(line(Estimator::Updated).contains("0.800") && line(Estimator::Updated).contains("-0.200"));
    assert!(line(Estimator::Paper).contains("0.900") && line(Estimator::Paper).contains("-0.100"));
}

#[test]
fn stalls_table_by_tensor_uses_detail_rows() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<StallRow> = read_rows(&write_stalls(dir.path(), false)).unwrap();
    let t = table(&rows, By::Tensor, 100);
    assert_eq!(t.lines.len(), 1);
    assert_eq!(t.lines[0].name, "w1");
    assert_eq!(t.lines[0].latest.m, Some(0.5));
}

#[test]
fn predict_prints_the_papers_theory_numbers() {
    let r3 = |x: f64| format!("{x:.3}");
    for (format, nearest, sr) in [("bf16", "0.946", "0.825"), ("fp8", "1.000", "0.989"), ("fp4", "1.000", "0.994")] {
        let (_, _, pn, ps) = predict(format, 0.999).unwrap();
        assert_eq!((r3(pn).as_str(), r3(ps).as_str()), (nearest, sr), "{format}");
    }
    assert!(predict("int8", 0.999).unwrap_err().to_string().contains("uniform relative grid"));
    assert!(predict("fp5", 0.999).is_err());
}

/// `train predict --reset-period`: the paper's K* (Prop. 5.2) at b2 = 0.999 for bf16 / fp8 /
/// fp4 (v's E2M2) at s0 = 0.6, 0.5, 0.7, all nine numbers, from the CLI's own function.
#[test]
fn predict_prints_the_papers_reset_periods() {
    for (format, want) in [("bf16", [1116, 1004, 1262]), ("fp8", [320, 295, 351]), ("fp4", [224, 206, 246])] {
        let (_, bits, _, _) = predict(format, 0.999).unwrap();
        let got = reset_periods(bits, 0.999);
        assert_eq!(got.map(|(_, k)| k.unwrap()), want, "{format}");
        assert_eq!(got.map(|(s0, _)| s0), [0.6, 0.5, 0.7]);
    }
}

/// A complete small run (common::base_toml: fp4 m / fp8 v with stochastic rounding, resets,
/// grad_accum 2, 8 steps) in `dir/runs/<name>`.
fn tiny_run(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, base_toml(&dir.join("runs"), name)).unwrap();
    let config = RunConfig::load(&path, &[]).unwrap();
    run::train(Launch::new(config), &mut Logs).unwrap().run_dir
}

#[test]
fn same_seed_same_config_gives_identical_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (tiny_run(dir.path(), "a"), tiny_run(dir.path(), "b"));
    let stalls = |d: &Path| std::fs::read_to_string(d.join("stalls.jsonl")).unwrap();
    assert_eq!(stalls(&a), stalls(&b));
    assert_eq!(stalls(&a).lines().count(), 8);
    let losses = |d: &Path| -> Vec<(u64, f64)> {
        read_rows::<MetricsRow>(&d.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .map(|r| match r {
                MetricsRow::Train { step, loss, .. } => (step, loss),
                MetricsRow::Eval { step, val_loss, .. } => (step + 1_000_000, val_loss),
            })
            .collect()
    };
    assert_eq!(losses(&a), losses(&b));
    // and the run learned something on real text
    let l = losses(&a);
    assert!(l.last().unwrap().1 < l[0].1, "validation loss fell: {l:?}");
}

#[test]
fn stalls_headers_say_what_the_mean_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<StallRow> = read_rows(&write_stalls(dir.path(), false)).unwrap();
    let head = |by, window| render(&table(&rows, by, window), None, Estimator::Updated, "").lines().next().unwrap().to_string();
    // --window 0: the whole run (it was "the last 0 steps" over one row)
    assert_eq!(head(By::Group, 0), "step 2 (2 rows; mean over all 2 steps; stalled / updated elements)");
    assert!((table(&rows, By::Group, 0).lines[0].mean.v.unwrap() - 0.6).abs() < 1e-12);
    assert_eq!(head(By::Group, 1), "step 2 (2 rows; mean over the last 1 steps; stalled / updated elements)");
    // --by tensor: only the per-tensor rows are averaged
    assert_eq!(head(By::Tensor, 100), "step 2 (2 rows; mean over the 1 per-tensor rows of all 2 steps; stalled / updated elements)");
}

/// `--follow --interval inf` (or 1e20) exited 101 on a panic converting the seconds;
/// now a usage error (exit 2) that says the range, before the run folder is read.
#[test]
fn follow_intervals_that_cannot_be_slept_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_stalls(dir.path(), false);
    for bad in ["inf", "1e20", "nan", "0"] {
        let out = std::process::Command::new(common::train_bin())
            .args(["stalls", dir.path().to_str().unwrap(), "--follow", "--interval", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--interval {bad}: {err}");
        assert!(err.contains("expected seconds between 0.1 and 3600"), "{err}");
    }
}

/// A SOAP run (the small config with `optim.kind = "soap"`, 8 steps): every stall row counts
/// the preconditioners L and R of each matrix side no longer than 10,000 (the embedding's and
/// the head's 32 x 32 R, each attention matrix's two 32 x 32, each MLP matrix's 64 x 64 and
/// 32 x 32: 25,600 entries), the summary gives their second-half mean, and `train stalls`
/// names SOAP and shows their column, which an AdamW table does not have.
#[test]
fn a_soap_runs_stalls_show_the_preconditioners() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("soap.toml");
    std::fs::write(&path, base_toml(&dir.path().join("runs"), "soap")).unwrap();
    let config = RunConfig::load(&path, &["optim.kind=\"soap\"".to_string()]).unwrap();
    let run_dir = run::train(Launch::new(config), &mut Logs).unwrap().run_dir;
    let rows: Vec<StallRow> = read_rows(&run_dir.join("stalls.jsonl")).unwrap();
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert_eq!(r.precond.elements, 1024 + 4 * 2048 + 3 * (4096 + 1024) + 1024, "step {}", r.step);
        assert_eq!(r.frac.precond_unchanged, Some(r.precond.unchanged as f64 / 25_600.0));
        assert!(r.groups["norm"].precond.is_none() && r.groups["mlp"].precond_unchanged.is_some(), "step {}", r.step);
    }
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap()).unwrap();
    let half: Vec<f64> = rows[4..].iter().map(|r| r.frac.precond.unwrap()).collect();
    let mean = summary["mean_stall_precond"].as_f64().unwrap();
    assert!((mean - half.iter().sum::<f64>() / 4.0).abs() < 1e-12, "{mean} vs {half:?}");
    let out = common::train(dir.path(), &["stalls", run_dir.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let first = out.stdout.lines().next().unwrap();
    assert!(first.contains(": SOAP (L and R in m's format, refresh every 10 updates), m fp4 (stochastic)"), "{first}");
    assert!(out.stdout.lines().nth(2).unwrap().ends_with("w latest  w mean  precond latest  precond mean"), "{}", out.stdout);
    // latest, and the mean over every row (the default window of 100 steps holds all 8)
    let every = rows.iter().map(|r| r.frac.precond.unwrap()).sum::<f64>() / 8.0;
    let all = out.stdout.lines().find(|l| l.starts_with("all")).unwrap();
    assert!(all.ends_with(&format!("{:>14}  {:>12.3}", format!("{:.3}", rows[7].frac.precond.unwrap()), every)), "{all}");
    let only = common::train(dir.path(), &["stalls", run_dir.to_str().unwrap(), "--state", "precond"]);
    assert!(only.stdout.contains("name   precond latest  precond mean\n"), "{}", only.stdout);
    // with optim.soap.precond_format the header names L and R's own format
    let own = dir.path().join("soap_own_lr");
    std::fs::create_dir(&own).unwrap();
    for f in ["stalls.jsonl", "config.toml"] {
        std::fs::copy(run_dir.join(f), own.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(own.join("config.toml")).unwrap();
    std::fs::write(own.join("config.toml"), text + "\n[optim.soap]\nprecond_format = \"bf16\"\n").unwrap();
    let out = common::train(dir.path(), &["stalls", own.to_str().unwrap()]);
    assert!(out.stdout.lines().next().unwrap().contains(": SOAP (L and R in bf16, refresh every 10 updates)"), "{}", out.stdout);
    // an AdamW run of the same config: no precond key in its rows, no column
    let adamw = tiny_run(dir.path(), "adamw");
    assert!(!std::fs::read_to_string(adamw.join("stalls.jsonl")).unwrap().contains("precond"));
    let out = common::train(dir.path(), &["stalls", adamw.to_str().unwrap()]);
    assert!(!out.stdout.contains("precond") && !out.stdout.contains("SOAP"), "{}", out.stdout);
    // asking an AdamW run for the preconditioners is an error, not an empty table
    let out = common::train(dir.path(), &["stalls", adamw.to_str().unwrap(), "--state", "precond"]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(out.stderr.contains("--state precond: this run has no preconditioner counts (an AdamW run"), "{}", out.stderr);
}
