//! Data-parallel training on the CPU through `train --gpus 2` (two worker processes of the
//! real binary, TCP rendezvous and collective): the same global batch on 1 and 2 ranks gives
//! the same tokens per step and the same losses (within the tolerance of a different
//! summation order); ZeRO-1 gives bit for bit the run without it; a run checkpointed on 2
//! ranks resumes on 1 with the same data order and losses.

mod common;

use common::{cli_dir, launch_ranks, train};
use serde_json::Value;
use std::path::Path;

/// Training rows of `metrics.jsonl`: (step, tokens, loss).
fn train_rows(run: &Path) -> Vec<(u64, u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v["tokens"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// Largest relative loss difference between two runs' rows, asserting the same steps and
/// tokens (the same data order).
fn max_loss_diff(a: &[(u64, u64, f64)], b: &[(u64, u64, f64)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!((x.0, x.1), (y.0, y.1), "same step, same tokens seen");
            ((x.2 - y.2) / x.2).abs()
        })
        .fold(0.0, f64::max)
}

/// Relative tolerance of a loss computed with another summation order (gradients summed over
/// ranks instead of micro-batches), after 8 steps of a tiny model.
const TOLERANCE: f64 = 1e-4;

#[test]
fn two_ranks_match_one_rank_and_zero1_matches_zero0_bit_for_bit() {
    let dir = cli_dir("dp");
    let d = dir.path();
    let cpu = ["--config", "c.toml", "--device", "cpu"];
    let run = |name: &str, extra: &[&str]| {
        let name_set = format!("run.name=\"{name}\"");
        let mut args: Vec<&str> = cpu.to_vec();
        args.extend(["--set", &name_set]);
        args.extend(extra);
        let r = train(d, &args);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        r
    };
    // the config's global batch of 4 sequences (micro_batch 2 x grad_accum 2): 1 rank x 2
    // micro-batches x 2, 2 ranks x 1 x 2 (--gpus keeps the batch)
    let one = run("one", &[]);
    let two = run("two", &["--gpus", "2"]);
    run("two_zero1", &["--gpus", "2", "--set", "train.zero=1"]);
    assert!(one.stdout.contains("batch 4 x 32 tokens |"), "{}", one.stdout);
    assert!(two.stdout.contains("batch 4 x 32 tokens (2 ranks x micro-batch 2 x 1 accumulated)"), "the split is logged: {}", two.stdout);

    let one = train_rows(&d.join("runs/one"));
    let two = train_rows(&d.join("runs/two"));
    assert_eq!(one.len(), 8);
    let diff = max_loss_diff(&one, &two);
    eprintln!("1 rank vs 2 ranks: largest relative loss difference {diff:e}");
    assert!(diff < TOLERANCE, "losses differ by {diff} (relative)");

    // ZeRO-1 steps each shard with the whole-tensor RNG keys: the same run, bit for bit
    let zero1 = train_rows(&d.join("runs/two_zero1"));
    assert_eq!(two, zero1);
    let read = |run: &str, f: &str| std::fs::read(d.join("runs").join(run).join(f)).unwrap();
    assert_eq!(read("two", "stalls.jsonl"), read("two_zero1", "stalls.jsonl"), "stall counts summed exactly");
    let opt = "checkpoints/step_0000008/optimizer.safetensors";
    assert_eq!(read("two", opt), read("two_zero1", opt), "gathered states are the unsharded states");
    // rank 0 alone writes: one metrics row per step
    assert_eq!(zero1.len(), 8);
    // the summary records what one rank holds: all of it, or rank 0's shard with ZeRO-1
    let summary = |run: &str| -> serde_json::Value { serde_json::from_slice(&read(run, "summary.json")).unwrap() };
    let (whole, two_rank, zero1_rank) = (
        summary("two")["state_bytes"].as_u64().unwrap(),
        summary("two")["state_bytes_per_rank"].as_u64().unwrap(),
        summary("two_zero1")["state_bytes_per_rank"].as_u64().unwrap(),
    );
    assert_eq!(two_rank, whole);
    let half = zero1_rank as f64 / whole as f64;
    assert!((0.45..=0.55).contains(&half), "rank 0 holds {zero1_rank} of {whole} state bytes with ZeRO-1");
}

#[test]
fn a_run_checkpointed_on_two_ranks_resumes_on_one() {
    let dir = cli_dir("resume");
    let d = dir.path();
    let ok = |args: &[&str]| {
        let r = train(d, args);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        r.stderr
    };
    // a constant learning rate after the warmup, so that a run of 4 steps continued to 8 has
    // the schedule of a run of 8
    let flat = "optim.min_lr_ratio=1.0";
    ok(&["--config", "c.toml", "--set", "run.name=\"whole\"", "--set", flat]);
    // 4 steps on 2 ranks (1 micro-batch each), then steps 5..8 on 1 rank (2): the same batch
    ok(&["--config", "c.toml", "--set", "run.name=\"moved\"", "--set", "train.max_steps=4", "--set", flat, "--gpus", "2"]);
    let kept = ok(&["--resume", "runs/moved", "--set", "train.max_steps=8"]);
    assert!(!kept.contains("global batch changes"), "the batch was kept: {kept}");
    let whole = train_rows(&d.join("runs/whole"));
    let moved = train_rows(&d.join("runs/moved"));
    let diff = max_loss_diff(&whole, &moved);
    eprintln!("resume 2 -> 1 ranks: largest relative loss difference {diff:e}");
    assert!(diff < TOLERANCE, "losses differ by {diff} (relative)");
    // resumed with half the accumulation: the global batch halves, and it says so
    ok(&["--config", "c.toml", "--set", "run.name=\"halved\"", "--set", "train.max_steps=1", "--gpus", "2"]);
    let halved = ok(&["--resume", "runs/halved", "--set", "train.max_steps=2", "--set", "train.grad_accum=1"]);
    assert!(
        halved.contains("the global batch changes from 4 sequences per step to 2 (train.micro_batch 2 x train.grad_accum 1)"),
        "{halved}"
    );
}

#[test]
fn a_failing_worker_fails_the_command_naming_its_rank() {
    // a run folder that holds a run: rank 0 (the one that writes it) refuses to start; the
    // supervisor names rank 0 and stops rank 1
    let dir = cli_dir("fail");
    let d = dir.path();
    let r = train(d, &["--config", "c.toml", "--set", "train.max_steps=1"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = train(d, &["--config", "c.toml", "--gpus", "2"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("already holds a run") || r.stderr.contains("--resume"), "rank 0's own error: {}", r.stderr);
    // rank 1 is stopped, or (on a slow machine) has already failed itself on losing rank 0
    let last = r.stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("worker rank 0 failed (exit status: 1); the other workers were stopped")
            || last.contains("worker rank 0 failed (exit status: 1); rank 1 failed"),
        "{}",
        r.stderr
    );
    // what every worker would refuse is said once, before any starts
    let r = train(d, &["--config", "c.toml", "--gpus", "2", "--device", "cuda"]);
    assert_eq!(r.code, Some(1));
    assert_eq!(r.stderr.matches("2 ranks on GPUs need NCCL: this build has none").count(), 1, "{}", r.stderr);
    assert!(!r.stderr.contains("worker rank"), "no worker started: {}", r.stderr);
}

#[test]
fn an_error_every_worker_hits_is_attributed_to_its_rank() {
    // a missing tokenizer: the supervisor does not open it, every worker fails on it
    let dir = cli_dir("all_fail");
    let d = dir.path();
    let r = train(d, &["--config", "c.toml", "--gpus", "2", "--set", "data.tokenizer=\"missing.json\""]);
    assert_eq!(r.code, Some(1));
    let errors: Vec<&str> = r.stderr.lines().filter(|l| l.contains("tokenizer 'missing.json'")).collect();
    assert!(!errors.is_empty(), "{}", r.stderr);
    // rank 0's error as a single process prints it; a copy from rank 1 says it is rank 1's
    assert!(errors.iter().all(|l| l.starts_with("error: ") || l.starts_with("rank 1: error: ")), "{}", r.stderr);
    assert!(errors.iter().filter(|l| l.starts_with("error: ")).count() <= 1, "{}", r.stderr);
    // the supervisor's last word names the ranks whose errors are above
    let last = r.stderr.lines().last().unwrap();
    assert!(last.starts_with("error: worker rank ") && last.contains(" failed (exit status: 1)"), "{}", r.stderr);
    for (rank, prefix) in [(0, "error: "), (1, "rank 1: error: ")] {
        if last.contains(&format!("rank {rank} failed")) {
            assert!(errors.iter().any(|l| l.starts_with(prefix)), "rank {rank} named without its error: {}", r.stderr);
        }
    }
    assert!(!d.join("runs/all_fail").exists(), "a failed start touched the run folder");
}

/// The adaptive reset rule (Alg. 2) on ZeRO-1 shards: every rank feeds it the stall counts
/// summed over all ranks, so the shards reset at the same updates as the unsharded run, bit
/// for bit, and the rule's state gathered into the checkpoint is the same. (b2 = 0.9 and s0 =
/// 0.05 make it reset within 24 updates, as in checkpoint_faults.)
#[test]
fn adaptive_resets_on_zero1_shards_match_the_unsharded_run() {
    let dir = cli_dir("dpa");
    let d = dir.path();
    let sets = [
        "--set",
        "optim.states.reset=\"adaptive\"",
        "--set",
        "optim.states.m_reset_every=0",
        "--set",
        "optim.states.v_reset_every=0",
        "--set",
        "optim.states.reset_s0=0.05",
        "--set",
        "optim.beta2=0.9",
        "--set",
        "train.max_steps=24",
        "--gpus",
        "2",
    ];
    for (name, zero) in [("plain", "train.zero=0"), ("zero1", "train.zero=1")] {
        let name_set = format!("run.name=\"{name}\"");
        let mut args = vec!["--config", "c.toml", "--device", "cpu", "--set", &name_set, "--set", zero];
        args.extend(sets);
        let r = train(d, &args);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
    }
    let read = |run: &str, f: &str| std::fs::read(d.join("runs").join(run).join(f)).unwrap();
    assert_eq!(train_rows(&d.join("runs/plain")), train_rows(&d.join("runs/zero1")));
    assert_eq!(read("plain", "stalls.jsonl"), read("zero1", "stalls.jsonl"));
    // the rule's state, saved by the optimizer in its file
    let rule = |run: &str| -> Vec<(String, Vec<f64>)> {
        let f = d.join("runs").join(run).join("checkpoints/step_0000024/optimizer.safetensors");
        let opt = candle_core::safetensors::load(f, &candle_core::Device::Cpu).unwrap();
        let mut r: Vec<(String, Vec<f64>)> = opt
            .iter()
            .filter(|(k, _)| k.starts_with("adaptive_reset."))
            .map(|(k, t)| (k.clone(), t.to_dtype(candle_core::DType::F64).unwrap().to_vec1().unwrap()))
            .collect();
        r.sort_by(|a, b| a.0.cmp(&b.0));
        r
    };
    let (zero1, plain) = (rule("zero1"), rule("plain"));
    assert_eq!(zero1, plain);
    assert_eq!(zero1.len(), 4, "{zero1:?}");
    assert!(zero1.iter().any(|(k, v)| k == "adaptive_reset.counters" && v[0] > 1.0), "the rule reset within the run: {zero1:?}");
}

/// `--gpus N` splits the config's global batch; a rank count that does not
/// divide `train.grad_accum` is refused once, before any worker starts or anything is written,
/// with both numbers and a setting that keeps the batch.
#[test]
fn a_rank_count_that_does_not_divide_the_accumulation_is_refused_before_any_worker() {
    let dir = cli_dir("split");
    let d = dir.path();
    let r = train(d, &["--config", "c.toml", "--device", "cpu", "--gpus", "3"]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains(
            "error: --gpus 3: train.grad_accum = 2 cannot be split over 3 ranks (the global batch is train.micro_batch 2 x \
         train.grad_accum 2 = 4 sequences per step, and each rank accumulates grad_accum / ranks micro-batches): use a \
         rank count that divides 2, or the global batch of 4 is not a multiple of 3: change it or the rank count"
        ),
        "{}",
        r.stderr
    );
    let r =
        train(d, &["--config", "c.toml", "--device", "cpu", "--gpus", "4", "--set", "train.micro_batch=4", "--set", "train.grad_accum=2"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("or e.g. --set train.micro_batch=2 --set train.grad_accum=4 (the same global batch)"), "{}", r.stderr);
    assert!(!d.join("runs").exists(), "a refused start wrote nothing");
}

/// An external launch whose ranks resolve different configs fails on every
/// rank with the same message, rank 0's naming rank 1's differing line (rank 0 used to say
/// only that it lost rank 1).
#[test]
fn ranks_with_different_configs_all_name_the_difference() {
    let dir = cli_dir("differ");
    let d = dir.path();
    let zero = ["--config", "c.toml", "--device", "cpu", "--set", "train.max_steps=4"];
    let one = ["--config", "c.toml", "--device", "cpu", "--set", "train.max_steps=5"];
    let mut ranks = launch_ranks(d, &[&zero, &one]);
    for (r, child) in ranks.iter_mut().enumerate() {
        assert_eq!(child.wait().unwrap().code(), Some(1), "rank {r}");
        let log = std::fs::read_to_string(d.join(format!("rank{r}.log"))).unwrap();
        assert!(
            log.contains("the ranks resolved different configs (every rank needs the same --config and --set): rank 1 has \"max_steps = 5\" where rank 0 has \"max_steps = 4\""),
            "rank {r}: {log}"
        );
    }
    assert!(!d.join("runs/differ").exists(), "a refused start created the run folder");
}
