//! The run's TensorBoard scalars, read back from the event files (every record's CRCs checked,
//! `lowbit_train::logs::event_file::read_events`): the tags, values equal to `metrics.jsonl`
//! and `stalls.jsonl` as float32, a resumed run's restart marker, and `run.tensorboard =
//! false`. (TensorBoard's own reader: `scripts/check_tensorboard.py RUN_DIR`.)

use lowbit_train::config::RunConfig;
use lowbit_train::logs::event_file::{read_events, Event, SESSION_START};
use lowbit_train::progress::Logs;
use lowbit_train::run;
use lowbit_train::session::Launch;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

fn config(dir: &Path, sets: &[&str]) -> RunConfig {
    let p = dir.join("c.toml");
    std::fs::write(&p, common::base_toml(&dir.join("runs"), "tb")).unwrap();
    RunConfig::load(&p, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

/// The event files of a run, in name order (the order TensorBoard reads them).
fn event_files(run: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(run.join("tensorboard")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// tag -> (step, value) in the order written, over `events`.
fn scalars(events: &[Event]) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for e in events {
        for v in e.summary.iter().flat_map(|s| &s.value) {
            out.entry(v.tag.clone()).or_default().push((e.step, v.simple_value.unwrap()));
        }
    }
    out
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn every_curve_is_a_tensorboard_scalar_equal_to_the_jsonl_rows() {
    let tmp = tempfile::tempdir().unwrap();
    // BF16 weights, so the weights' stalled fractions are logged too
    let out = run::train(Launch::new(config(tmp.path(), &["model.dtype=\"bf16\""])), &mut Logs).unwrap();
    let files = event_files(&out.run_dir);
    assert_eq!(files.len(), 1);
    assert!(files[0].file_name().unwrap().to_str().unwrap().starts_with("events.out.tfevents."));
    let events = read_events(&files[0]).unwrap();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let s = scalars(&events);

    let groups = ["attn", "embed", "head", "mlp", "norm"];
    let mut want: Vec<String> =
        ["train/grad_norm", "train/loss", "train/lr", "train/tokens_per_s", "val/loss", "val/ppl"].map(String::from).to_vec();
    for tag in ["stall_m", "stall_v", "stall_w", "zero_v"] {
        want.push(format!("{tag}/all"));
        want.extend(groups.iter().map(|g| format!("{tag}/{g}")));
    }
    want.push("stall_v/theory".into());
    want.sort();
    assert_eq!(s.keys().cloned().collect::<Vec<_>>(), want);

    let metrics = jsonl(&out.run_dir.join("metrics.jsonl"));
    let train: Vec<(i64, f32)> = metrics
        .iter()
        .filter(|r| r["kind"] == "train")
        .map(|r| (r["step"].as_i64().unwrap(), r["loss"].as_f64().unwrap() as f32))
        .collect();
    assert_eq!(s["train/loss"], train);
    assert_eq!(train.len(), 8);
    let lr: Vec<f32> = metrics.iter().filter(|r| r["kind"] == "train").map(|r| r["lr"].as_f64().unwrap() as f32).collect();
    assert_eq!(s["train/lr"].iter().map(|p| p.1).collect::<Vec<_>>(), lr);
    let val: Vec<(i64, f32)> = metrics
        .iter()
        .filter(|r| r["kind"] == "eval")
        .map(|r| (r["step"].as_i64().unwrap(), r["val_loss"].as_f64().unwrap() as f32))
        .collect();
    assert_eq!(s["val/loss"], val);
    assert_eq!(val.iter().map(|v| v.0).collect::<Vec<_>>(), [0, 3, 6, 8]);

    let stalls = jsonl(&out.run_dir.join("stalls.jsonl"));
    let v_attn: Vec<(i64, f32)> =
        stalls.iter().filter_map(|r| r["groups"]["attn"]["v"].as_f64().map(|v| (r["step"].as_i64().unwrap(), v as f32))).collect();
    assert_eq!(s["stall_v/attn"], v_attn);
    assert_eq!(v_attn.len(), 8);
    let zero_v: Vec<(i64, f32)> = stalls.iter().map(|r| (r["step"].as_i64().unwrap(), r["zero_v"].as_u64().unwrap() as f32)).collect();
    assert_eq!(s["zero_v/all"], zero_v);
    let theory = stalls[0]["theory"]["v"].as_f64().unwrap() as f32;
    assert!(s["stall_v/theory"].iter().all(|p| p.1 == theory) && (0.9..1.0).contains(&theory), "{theory}");
}

#[test]
fn a_resumed_run_marks_its_restart_and_logs_each_later_step_once() {
    let tmp = tempfile::tempdir().unwrap();
    let first = run::train(Launch { stop_after: Some(4), ..Launch::new(config(tmp.path(), &[])) }, &mut Logs).unwrap();
    assert!(first.stopped_early);
    let ck = lowbit_train::checkpoint::latest(&first.run_dir).unwrap();
    run::train(Launch::resume(config(tmp.path(), &[]), ck), &mut Logs).unwrap();
    let files = event_files(&first.run_dir);
    assert_eq!(files.len(), 2, "{files:?}");
    let (before, after) = (read_events(&files[0]).unwrap(), read_events(&files[1]).unwrap());
    // the second file: its version, then the restart at the step after the checkpoint
    let start = after[1].session_log.as_ref().expect("a restart marker");
    assert_eq!((start.status, after[1].step), (SESSION_START, 5));
    let steps = |e: &[Event]| scalars(e)["train/loss"].iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(steps(&before), [1, 2, 3, 4]);
    assert_eq!(steps(&after), [5, 6, 7, 8]);
}

#[test]
fn tensorboard_off_writes_no_event_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &["run.tensorboard=false", "train.max_steps=1"]);
    // off shows in the resolved config; on (the default) is left out of it
    assert!(cfg.to_toml().contains("tensorboard = false"));
    assert!(!config(tmp.path(), &[]).to_toml().contains("tensorboard"));
    let out = run::train(Launch::new(cfg), &mut Logs).unwrap();
    assert!(out.run_dir.join("metrics.jsonl").is_file());
    assert!(!out.run_dir.join("tensorboard").exists());
}
