//! The golden-loss test: a short run of the shipped CPU config (`configs/tiny_cpu.toml`, 12
//! steps, FP8 states with stochastic rounding) must give exactly the losses, gradient norms
//! and stall counts of `tests/golden/tiny_cpu.txt`, one line per step, as torchtitan's
//! integration tests pin their loss curves. Every other determinism and resume test compares
//! the code with itself; this one fails on any change of the numerics (initialisation, data
//! order, kernels, rounding). Checked: `INIT_STD` times (1 + 2^-23), which moves the FP32
//! initial weights by about one ULP, fails it; one f64 ULP of `INIT_STD` changes no FP32
//! weight (the samples are drawn in f64 and rounded) and passes, as it should.
//!
//! The curve does not depend on the number of threads (checked: `RAYON_NUM_THREADS=1` and 2
//! give the same file). It is exact on x86-64 (the platform it was written on; another CPU architecture may
//! differ in the last bits of a sum, and the test then compares within 1e-5 relative and says
//! so). A change that is meant to change the numerics regenerates it, with the reason in the
//! commit message:
//!
//!     LOWBIT_REGENERATE_GOLDEN=1 cargo test --release -p lowbit-train --test golden_loss

use lowbit_optim::Counter;
use lowbit_train::config::RunConfig;
use lowbit_train::logs::metrics::{read_rows, MetricsRow};
use lowbit_train::logs::stalls::StallRow;
use lowbit_train::progress::Logs;
use lowbit_train::run::run;
use lowbit_train::session::Launch;
use std::path::{Path, PathBuf};

mod common;

const GOLDEN: &str = "tests/golden/tiny_cpu.txt";

/// `configs/tiny_cpu.toml` shortened to 12 steps, its data found from the repository root,
/// validation on 2048 tokens, no checkpoints, its run folder under `runs`.
fn config(runs: &Path) -> RunConfig {
    let r = common::root();
    let sets = [
        format!("data.train=[\"{}/data/c4-sample/en-train.*.json.gz\"]", r.display()),
        format!("data.validation=[\"{}/data/c4-sample/en-validation.*.json.gz\"]", r.display()),
        format!("data.tokenizer=\"{}/data/tokenizers/t5-tokenizer.json\"", r.display()),
        "data.val_tokens=2048".into(),
        "train.max_steps=12".into(),
        "optim.warmup_steps=3".into(),
        "train.eval_every=0".into(),
        "train.checkpoint_every=0".into(),
        "run.plots=false".into(),
        "run.stall_detail_every=0".into(),
        format!("run.dir=\"{}\"", runs.join("tiny_cpu").display()),
    ];
    RunConfig::load(&r.join("configs/tiny_cpu.toml"), &sets).unwrap()
}

fn counts(c: &Counter) -> String {
    format!("{}/{}", c.stalled, c.updated)
}

/// One line per step: `step loss grad_norm m-stalled/updated v-stalled/updated` (f64 in
/// their shortest round-trip form), then the final validation loss.
fn curve(run_dir: &Path) -> String {
    let metrics: Vec<MetricsRow> = read_rows(&run_dir.join("metrics.jsonl")).unwrap();
    let stalls: Vec<StallRow> = read_rows(&run_dir.join("stalls.jsonl")).unwrap();
    let mut out = String::from("# step loss grad_norm m_stalled/updated v_stalled/updated\n");
    for row in &metrics {
        match row {
            MetricsRow::Train { step, loss, grad_norm, .. } => {
                let s = stalls.iter().find(|s| s.step == *step).unwrap_or_else(|| panic!("no stall row for step {step}"));
                out += &format!("{step} {loss:?} {grad_norm:?} {} {}\n", counts(&s.m), counts(&s.v));
            }
            MetricsRow::Eval { step, val_loss, .. } => out += &format!("eval {step} {val_loss:?}\n"),
        }
    }
    out
}

/// Whether two curves agree within `rel` relative on every number (the same shape).
fn close(a: &str, b: &str, rel: f64) -> bool {
    let words = |s: &str| s.lines().flat_map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>()).collect::<Vec<_>>();
    let (a, b) = (words(a), words(b));
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) => (x - y).abs() <= rel * x.abs().max(y.abs()),
            _ => x == y,
        })
}

#[test]
fn tiny_cpu_matches_its_golden_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(Launch::new(config(tmp.path())), &mut Logs).unwrap();
    let got = curve(&out.run_dir);
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    if std::env::var_os("LOWBIT_REGENERATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        eprintln!("golden_loss: wrote {}: say why in the commit message", path.display());
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(got.lines().count(), 15, "a header, 12 steps, the initial and the final validation: {got}");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(
            got, want,
            "the numerics changed: if that is meant, regenerate {GOLDEN} (LOWBIT_REGENERATE_GOLDEN=1) and say why in the commit"
        );
    } else {
        eprintln!("golden_loss: not x86-64, comparing within 1e-5 relative");
        assert!(close(&got, &want, 1e-5), "got:\n{got}\nwant:\n{want}");
    }
}
