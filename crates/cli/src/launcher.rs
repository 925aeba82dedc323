//! `train --gpus N`: spawns N workers (this binary, same arguments without `--gpus`) on this
//! host with the data-parallel environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`), and supervises them: when one fails, the
//! others are killed and the command fails naming the rank and its exit status, and every
//! other rank that failed by then (an error that every rank hits: each prints it, ranks
//! other than 0 after `rank N: `).
//!
//! Signals: the workers run in their own process group, so a Ctrl-C at the terminal reaches
//! only the supervisor, which forwards SIGINT or SIGTERM once to every worker (they agree
//! on the step to stop at, write a checkpoint and exit 130 / 143). A scheduler that signals
//! the workers themselves gets the same stop (a worker's 130 / 143 is not a failure), and
//! one that signals every process gets one stop ([`crate::signals`]). On Linux a worker gets
//! SIGTERM if the supervisor dies.
//!
//! Exit status of the job: 0 when every worker finished, 130 / 143 when they stopped on an
//! interrupt with a checkpoint, 1 when any worker failed (also after an interrupt).

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `args` without `--gpus N` / `--gpus=N` (what each worker is given).
pub fn worker_args(args: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        match a.to_str() {
            Some("--gpus") => skip = true,
            Some(s) if s.starts_with("--gpus=") => {}
            _ => out.push(a.clone()),
        }
    }
    out
}

/// A TCP port free on 127.0.0.1 now (bound, read, released).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("no free TCP port on 127.0.0.1 for the rendezvous")?.local_addr()?.port())
}

/// Starts `n` workers: `program args` with the environment of ranks `0 .. n` on this host,
/// rendezvous at `127.0.0.1:port`. Workers other than rank 0 log warnings only unless
/// `RUST_LOG` is set.
///
/// # Errors
/// A worker that cannot be started (the ones already started are killed).
pub fn spawn(program: &std::path::Path, args: &[OsString], n: usize, port: u16) -> Result<Vec<Child>> {
    let mut children: Vec<Child> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        if rank > 0 && std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        detach(&mut cmd);
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                return Err(e).with_context(|| format!("cannot start worker rank {rank}: {}", program.display()));
            }
        }
    }
    Ok(children)
}

/// Own process group (the supervisor forwards signals itself), and on Linux SIGTERM when the
/// supervisor dies.
fn detach(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

/// How a worker ended, as the exit-status contract reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    /// Exit 0: the run finished (or had nothing to do).
    Finished,
    /// Exit 130 / 143: interrupted, its part of the checkpoint written.
    Interrupted(i32),
    /// Anything else, a death by a signal included (no checkpoint promised).
    Failed,
}

fn ended(status: ExitStatus) -> Ended {
    match status.code() {
        Some(0) => Ended::Finished,
        Some(c @ (130 | 143)) => Ended::Interrupted(c),
        _ => Ended::Failed,
    }
}

/// Waits for every worker and returns the job's exit status: 0 when every worker finished,
/// 130 / 143 when they stopped on an interrupt (each wrote its part of the checkpoint; the
/// status of the first interrupted worker). When `interrupt` is set, forwards the signal that
/// set it (`signal`: SIGINT or SIGTERM) once to every worker still running. A worker that
/// exits 130 / 143 by itself (a scheduler signalled the workers, not this process) is not a
/// failure: its peers stop at the same step, and they are waited for.
///
/// # Errors
/// The first worker that fails (any other status, also after an interrupt: the worst status
/// wins): the others are killed, and the error names its rank and exit status, then those of
/// any other rank that had failed too.
pub fn supervise(mut children: Vec<Child>, interrupt: &AtomicBool, signal: impl Fn() -> i32) -> Result<i32> {
    let mut done: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let mut forwarded = false;
    let mut interrupted: Option<i32> = None;
    while done.iter().any(Option::is_none) {
        if interrupt.load(Ordering::SeqCst) && !forwarded {
            forwarded = true;
            for (c, d) in children.iter().zip(&done) {
                if d.is_none() {
                    // SAFETY: kill(2) on our own child's pid.
                    unsafe { libc::kill(c.id() as libc::pid_t, signal()) };
                }
            }
        }
        for (rank, c) in children.iter_mut().enumerate() {
            if done[rank].is_some() {
                continue;
            }
            if let Some(status) = c.try_wait()? {
                done[rank] = Some(status);
                match ended(status) {
                    Ended::Finished => {}
                    Ended::Interrupted(code) => interrupted = interrupted.or(Some(code)),
                    Ended::Failed => bail!("{}", fail(&mut children, &done, rank, status)),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(interrupted.unwrap_or(0))
}

/// After worker `first` failed with `status`: reaps the workers that have exited by now, kills
/// the others, and says which ranks failed (`first`, then any other that failed by itself, as
/// every rank does on an error they all hit) and whether others were stopped.
fn fail(children: &mut [Child], done: &[Option<ExitStatus>], first: usize, status: ExitStatus) -> String {
    let mut failed = vec![format!("worker rank {first} failed ({status})")];
    let mut stopped = false;
    for (rank, c) in children.iter_mut().enumerate().filter(|(r, _)| *r != first) {
        match done[rank].or_else(|| c.try_wait().ok().flatten()) {
            Some(s) if ended(s) == Ended::Failed => failed.push(format!("rank {rank} failed ({s})")),
            Some(_) => {}
            None => {
                kill_group(c);
                let _ = c.wait();
                stopped = true;
            }
        }
    }
    if stopped {
        failed.push("the other workers were stopped".into());
    }
    failed.join("; ")
}

/// Kills and reaps every worker still running.
fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            kill_group(c);
        }
        let _ = c.wait();
    }
}

/// SIGKILL to the worker's process group (each worker leads its own: [`detach`]), so that
/// whatever the worker started goes with it.
fn kill_group(c: &Child) {
    // SAFETY: kill(2) on the process group of our own child, which is still unreaped (its
    // pid, hence the group id, cannot have been reused).
    unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn gpus_flag_is_removed_from_the_workers_arguments() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            worker_args(&a(&["--config", "c.toml", "--gpus", "2", "--device", "cpu"])),
            a(&["--config", "c.toml", "--device", "cpu"])
        );
        assert_eq!(worker_args(&a(&["--gpus=4", "--config", "x"])), a(&["--config", "x"]));
    }

    #[test]
    fn workers_get_the_rank_environment() {
        let dir = tempfile::tempdir().unwrap();
        let script = "echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT > \"$0\".$RANK";
        let base = dir.path().join("env");
        let args = [OsString::from("-c"), script.into(), base.clone().into()];
        let children = spawn(std::path::Path::new("sh"), &args, 2, 29_511).unwrap();
        assert_eq!(supervise(children, &AtomicBool::new(false), || libc::SIGTERM).unwrap(), 0);
        for r in 0..2 {
            let got = std::fs::read_to_string(format!("{}.{r}", base.display())).unwrap();
            assert_eq!(got.trim(), format!("{r} 2 {r} 127.0.0.1 29511"));
        }
    }

    #[test]
    fn a_failing_worker_stops_the_others_and_is_named() {
        // rank 1 exits 3 after a moment; ranks 0 and 2 would sleep for a minute (61 s: no
        // other test, running beside this one in the same process, sleeps that long, so the
        // count below sees only this test's workers)
        let script = "if [ $RANK = 1 ]; then sleep 0.3; exit 3; else sleep 61; fi";
        let args = [OsString::from("-c"), script.into()];
        let started = Instant::now();
        let children = spawn(std::path::Path::new("sh"), &args, 3, 29_512).unwrap();
        let e = supervise(children, &AtomicBool::new(false), || libc::SIGTERM).unwrap_err().to_string();
        assert!(e.contains("worker rank 1 failed (exit status: 3)"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10), "the sleepers were killed");
        // a SIGKILL is delivered asynchronously: the killed sleepers may still be listed for a
        // moment on a loaded machine (seen in CI), so they get 5 s to go
        let deadline = Instant::now() + Duration::from_secs(5);
        while processes_running("sleep 61") > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(processes_running("sleep 61"), 0, "no `sleep 61` left behind: the workers' process groups were killed");
    }

    /// Processes whose command line is `pattern` and whose parent is this test process or
    /// init (the orphans a killed worker shell would leave), from /proc.
    fn processes_running(pattern: &str) -> usize {
        let me = std::process::id().to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
        dir.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
            .filter(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).unwrap_or("").to_string();
                cmd.trim() == pattern && (ppid == me || ppid == "1")
            })
            .count()
    }

    #[test]
    fn every_rank_that_failed_is_named_and_the_rest_stopped() {
        // ranks 0 and 1 fail (as on an error they all hit), rank 2 would sleep for a minute
        let script = "case $RANK in 0) exit 1;; 1) exit 2;; *) sleep 60;; esac";
        let args = [OsString::from("-c"), script.into()];
        let mut children = spawn(std::path::Path::new("sh"), &args, 3, 29_514).unwrap();
        let status = children[0].wait().unwrap();
        children[1].wait().unwrap();
        let msg = fail(&mut children, &[Some(status), None, None], 0, status);
        assert_eq!(msg, "worker rank 0 failed (exit status: 1); rank 1 failed (exit status: 2); the other workers were stopped");
        assert!(children[2].try_wait().unwrap().is_some(), "rank 2 was reaped");
    }

    #[test]
    fn an_interrupt_is_forwarded_once_to_every_worker() {
        // each worker records the signal it got, then exits 143 as the trainer does
        let dir = tempfile::tempdir().unwrap();
        let script = "trap 'echo term > \"$0\".$RANK; kill $!; exit 143' TERM; sleep 30 & wait";
        let base = dir.path().join("sig");
        let args = [OsString::from("-c"), script.into(), base.clone().into()];
        let children = spawn(std::path::Path::new("sh"), &args, 2, 29_513).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(supervise(children, &AtomicBool::new(true), || libc::SIGTERM).unwrap(), 143);
        for r in 0..2 {
            assert_eq!(std::fs::read_to_string(format!("{}.{r}", base.display())).unwrap().trim(), "term");
        }
    }

    /// A scheduler's SIGTERM to the workers only: rank 1 stops first and exits
    /// 143; rank 0 still writes its checkpoint and is not killed; the job exits 143.
    #[test]
    fn a_worker_interrupted_by_the_scheduler_is_waited_for_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        let script = "if [ $RANK = 1 ]; then exit 143; fi; sleep 0.5; echo written > \"$0\"; exit 143";
        let done = dir.path().join("checkpoint");
        let args = [OsString::from("-c"), script.into(), done.clone().into()];
        let children = spawn(std::path::Path::new("sh"), &args, 2, 29_515).unwrap();
        assert_eq!(supervise(children, &AtomicBool::new(false), || libc::SIGTERM).unwrap(), 143);
        assert_eq!(std::fs::read_to_string(&done).unwrap().trim(), "written", "rank 0 ran to its end");
    }

    /// A worker that fails after the interrupt was forwarded fails the job (the
    /// worst status wins), naming its rank; a worker killed by a signal is a failure too.
    #[test]
    fn a_failure_after_an_interrupt_fails_the_job() {
        let script = "trap 'kill $!; if [ $RANK = 0 ]; then exit 1; else exit 143; fi' TERM; sleep 30 & wait";
        let args = [OsString::from("-c"), script.into()];
        let children = spawn(std::path::Path::new("sh"), &args, 2, 29_516).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let e = supervise(children, &AtomicBool::new(true), || libc::SIGTERM).unwrap_err().to_string();
        assert!(e.starts_with("worker rank 0 failed (exit status: 1)"), "{e}");
        let args = [OsString::from("-c"), "kill -9 $$".into()];
        let children = spawn(std::path::Path::new("sh"), &args, 1, 29_517).unwrap();
        let e = supervise(children, &AtomicBool::new(false), || libc::SIGTERM).unwrap_err().to_string();
        assert!(e.contains("worker rank 0 failed (signal: 9 (SIGKILL))"), "{e}");
    }
}
