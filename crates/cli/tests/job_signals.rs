//! The exit status of a data-parallel job is one a scheduler can trust. Every
//! test runs the real binary on the CPU (`--gpus 2` or an external launch of two ranks) for an
//! endless run and signals it the way a scheduler does; each interrupted job must exit 143 with
//! one complete checkpoint and `summary.json` saying "interrupted", and a failure must exit 1.

mod common;

use common::{checkpoints, cli_dir, launch_ranks, signal, spawn, wait_for_rows};
use serde_json::Value;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// An endless CPU run (on 2 ranks: one micro-batch each), checkpointed only when stopped.
fn endless(name: &str) -> Vec<String> {
    [
        "--config",
        "c.toml",
        "--device",
        "cpu",
        "--set",
        &format!("run.name=\"{name}\""),
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.checkpoint_every=0",
        "--set",
        "train.eval_every=0",
    ]
    .map(String::from)
    .to_vec()
}

/// The processes whose parent is `pid`, from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)) == Some(&pid.to_string())
        })
        .collect();
    kids.sort_unstable();
    kids
}

/// The two workers of the supervisor `pid`.
fn workers_of(pid: u32) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let kids = children_of(pid);
        if kids.len() == 2 {
            return kids;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "supervisor {pid} has workers {kids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A test's endless job: when the test fails before it has waited for the job's processes,
/// they and their children are killed, so that no endless run outlives the test. Once the
/// test has waited for them ([`Job::waited`]) it does nothing: their pids may be reused.
struct Job(Vec<u32>);

impl Job {
    /// The test has reaped the job's processes.
    fn waited(mut self) {
        self.0.clear();
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for &pid in &self.0 {
                for p in children_of(pid).into_iter().chain([pid]) {
                    // SAFETY: kill(2) on a child of this test not yet reaped (its pid cannot
                    // have been reused), or on a child of it read from /proc just now
                    unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
                }
            }
        }
    }
}

/// The run stopped on an interrupt: `summary.json` says so, and its one checkpoint is the step
/// it stopped at, complete (no `.tmp` left).
fn assert_interrupted_with_a_checkpoint(run: &Path) {
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "interrupted", "{summary}");
    let step = summary["steps"].as_u64().unwrap();
    assert_eq!(checkpoints(run), [format!("step_{step:07}")]);
    assert!(run.join(format!("checkpoints/step_{step:07}/manifest.json")).is_file());
}

fn wait(child: &mut Child) -> Option<i32> {
    child.wait().unwrap().code()
}

/// (1) SIGTERM to every process of the job at once (Slurm's time limit, `scancel`, systemd's
/// `KillMode=control-group`): each worker gets the scheduler's copy and the supervisor's
/// forward within milliseconds; that is one stop, not "signal again to abort".
/// (2) SIGTERM to the workers only: a worker's 143 is not a failure, the supervisor waits
/// for the checkpoint and exits 143.
#[test]
fn sigterm_to_the_whole_job_or_to_its_workers_stops_it_once_with_a_checkpoint() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    for (name, whole_job) in [("all", true), ("workers", false)] {
        let mut args = endless(name);
        args.extend(["--gpus", "2"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let log = d.join(format!("{name}.log"));
        let mut sup = spawn(d, &args, &log);
        let job = Job(vec![sup.id()]);
        let run = d.join("runs").join(name);
        wait_for_rows(&run, 1);
        let mut pids = workers_of(sup.id());
        if whole_job {
            pids.push(sup.id());
        }
        signal(&pids, "-TERM");
        let code = wait(&mut sup);
        job.waited();
        let log = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(143), "{name}: {log}");
        assert!(!log.contains("failed"), "{name}: {log}");
        assert_interrupted_with_a_checkpoint(&run);
    }
}

/// (3) A failure after the interrupt was forwarded (rank 0 cannot write its checkpoint: a file
/// where `checkpoints/` goes) exits 1, not 143, with the error and the rank named.
#[test]
fn a_failure_after_an_interrupt_exits_1_naming_the_rank() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let mut args = endless("x");
    args.extend(["--gpus", "2"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut sup = spawn(d, &args, &d.join("x.log"));
    let job = Job(vec![sup.id()]);
    let run = d.join("runs/x");
    wait_for_rows(&run, 1);
    std::fs::write(run.join("checkpoints"), "in the way").unwrap();
    signal(&[sup.id()], "-TERM");
    let code = wait(&mut sup);
    job.waited();
    let log = std::fs::read_to_string(d.join("x.log")).unwrap();
    assert_eq!(code, Some(1), "{log}");
    assert!(log.lines().any(|l| l.starts_with("error: ") && l.contains("checkpoints")), "rank 0's own error: {log}");
    assert!(log.lines().last().unwrap().starts_with("error: worker rank 0 failed (exit status: 1)"), "{log}");
}

/// (4) An external launch (RANK / WORLD_SIZE / MASTER_* as torchrun sets them), SIGTERM to
/// rank 1 only: both ranks stop at the same step with a checkpoint, and both exit 143 (rank 0
/// too, though its stop came from its peer).
#[test]
fn every_rank_of_an_interrupted_external_launch_exits_143() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let args = endless("x");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ranks = launch_ranks(d, &[&args, &args]);
    let job = Job(ranks.iter().map(Child::id).collect());
    let run = d.join("runs/x");
    wait_for_rows(&run, 1);
    signal(&[ranks[1].id()], "-TERM");
    let codes: Vec<Option<i32>> = ranks.iter_mut().map(wait).collect();
    job.waited();
    let log = std::fs::read_to_string(d.join("rank0.log")).unwrap();
    assert_eq!(codes, [Some(143), Some(143)], "{log}");
    assert_interrupted_with_a_checkpoint(&run);
}

/// SIGSTOP / SIGCONT of one worker of a `--gpus 2` job. A stop shorter than
/// `LOWBIT_DIST_TIMEOUT_S` is only a pause: the job goes on and stops cleanly (143) when
/// asked. A stop that outlasts it ends the job with exit 1, naming the rank that sent or took
/// nothing, instead of hanging (a send into a stopped peer's full socket buffers hung forever
/// before sends had a timeout); the stopped worker is killed with the rest.
#[test]
fn a_stopped_worker_is_waited_for_until_the_timeout_then_named() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    for (name, timeout_s, stop) in [("pause", "30", Some(Duration::from_secs(3))), ("hang", "8", None)] {
        let mut args = endless(name);
        args.extend(["--gpus", "2"].map(String::from));
        let log = d.join(format!("{name}.log"));
        let mut sup = std::process::Command::new(common::train_bin())
            .args(&args)
            .current_dir(d)
            .env("LOWBIT_DIST_TIMEOUT_S", timeout_s)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let job = Job(vec![sup.id()]);
        let run = d.join("runs").join(name);
        let rows = wait_for_rows(&run, 1);
        let workers = workers_of(sup.id());
        // the worker of rank 1 (its environment says so)
        let rank1 = *workers
            .iter()
            .find(|w| std::fs::read(format!("/proc/{w}/environ")).is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == b"RANK=1")))
            .expect("a worker of rank 1");
        signal(&[rank1], "-STOP");
        let t0 = Instant::now();
        let code = match stop {
            Some(pause) => {
                std::thread::sleep(pause);
                signal(&[rank1], "-CONT");
                wait_for_rows(&run, rows + 2);
                signal(&[sup.id()], "-TERM");
                wait(&mut sup)
            }
            None => {
                // the job must end by itself: a deadline, so that a hang fails instead of waiting
                while sup.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(90) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if sup.try_wait().unwrap().is_none() {
                    signal(&workers, "-KILL");
                    signal(&[sup.id()], "-KILL");
                }
                wait(&mut sup)
            }
        };
        job.waited();
        let log = std::fs::read_to_string(&log).unwrap();
        if stop.is_some() {
            assert_eq!(code, Some(143), "{name}: {log}");
            assert!(!log.contains("nothing for") && !log.contains("failed"), "{name}: {log}");
            assert_interrupted_with_a_checkpoint(&run);
        } else {
            assert_eq!(code, Some(1), "{name}: {log}");
            // rank 0 waits for the stopped rank's gradients ("sent nothing") or sends into its
            // full socket buffers ("took nothing"): either way the rank is named
            let named = ["rank 1 sent nothing for 8 s", "rank 1 took nothing for 8 s"].iter().any(|m| log.contains(m));
            assert!(named, "{name}: the silent rank is named: {log}");
            assert!(t0.elapsed() < Duration::from_secs(60), "{name}: no hang ({:?})", t0.elapsed());
            let gone = |pid: u32| {
                !Path::new(&format!("/proc/{pid}")).exists()
                    || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"))
            };
            assert!(workers.iter().all(|&w| gone(w)), "{name}: the stopped worker was killed with the rest");
        }
    }
}
