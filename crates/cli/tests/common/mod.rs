//! The integration tests' helpers: lowbit-train's (`shared`), and running the `train` binary.
#![allow(dead_code)]

#[path = "../../../train/tests/common/mod.rs"]
mod shared;
pub use shared::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `train` binary of this build.
pub fn train_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_train"))
}

/// What a `train` invocation did.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run `train ARGS` in `cwd` and wait for it.
pub fn train(cwd: &Path, args: &[&str]) -> Ran {
    run(Command::new(train_bin()).args(args).current_dir(cwd), &format!("train {}", args.join(" ")))
}

/// `train ARGS` in `cwd` with files limited to `kib` KiB (RLIMIT_FSIZE through bash's
/// `ulimit -f`, in KiB, SIGXFSZ ignored): a write past it fails with EFBIG, as one to a full
/// disk fails with ENOSPC.
pub fn train_with_file_limit(cwd: &Path, kib: u64, args: &[&str]) -> Ran {
    let script = format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\"");
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script).arg(train_bin()).args(args).current_dir(cwd);
    run(&mut cmd, &format!("(ulimit -f {kib}) train {}", args.join(" ")))
}

/// Makes `train` commands that run as a user file permissions bind: this one, or `nobody`
/// through `setpriv` when the tests run as root (whom permissions do not bind); `None` when
/// `nobody` cannot run the binary (a checkout under a 0700 home), which the caller says.
pub fn unprivileged_train() -> Option<impl Fn() -> Command> {
    // SAFETY: geteuid has no preconditions
    let root = unsafe { libc::geteuid() } == 0;
    let train = move || {
        let mut c = Command::new(if root { "setpriv".into() } else { train_bin() });
        if root {
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(train_bin());
        }
        c
    };
    let runs = !root || train().arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    runs.then_some(train)
}

/// Runs `cmd` to its end, printing what it did under `label`.
pub fn run(cmd: &mut Command, label: &str) -> Ran {
    let out = cmd.output().unwrap();
    let r = Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("$ {label}\n-> {:?}\n{}{}", r.code, r.stdout, r.stderr);
    r
}

/// A folder holding `c.toml`: [`base_toml`] with run folders `runs/<name>` relative to it.
pub fn cli_dir(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("c.toml"), base_toml(Path::new("runs"), name)).unwrap();
    tmp
}

/// Spawn `train ARGS` in `cwd` with stderr to `log`.
pub fn spawn(cwd: &Path, args: &[&str], log: &Path) -> Child {
    Command::new(train_bin()).args(args).current_dir(cwd).stdout(Stdio::null()).stderr(std::fs::File::create(log).unwrap()).spawn().unwrap()
}

/// Wait until `metrics.jsonl` of `run` has more than `rows` train rows; returns the count.
pub fn wait_for_rows(run: &Path, rows: usize) -> usize {
    let t0 = Instant::now();
    loop {
        let n = std::fs::read_to_string(run.join("metrics.jsonl"))
            .map(|t| t.lines().filter(|l| l.contains("\"kind\":\"train\"")).count())
            .unwrap_or(0);
        if n > rows {
            return n;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no progress in {}", run.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kill SIG PID...` (e.g. `-TERM`), asserting that it succeeded.
pub fn signal(pids: &[u32], sig: &str) {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    assert!(Command::new("kill").arg(sig).args(&pids).status().unwrap().success());
}

/// An external launch as torchrun makes one: rank r runs `train ranks[r]` in `cwd` with
/// `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and a free `MASTER_PORT` on 127.0.0.1, its stderr in
/// `cwd/rank<r>.log`.
pub fn launch_ranks(cwd: &Path, ranks: &[&[&str]]) -> Vec<Child> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    (0..ranks.len())
        .map(|rank| {
            Command::new(train_bin())
                .args(ranks[rank])
                .current_dir(cwd)
                .envs([("RANK", rank.to_string()), ("LOCAL_RANK", rank.to_string()), ("WORLD_SIZE", ranks.len().to_string())])
                .envs([("MASTER_ADDR", "127.0.0.1".to_string()), ("MASTER_PORT", port.to_string())])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(cwd.join(format!("rank{rank}.log"))).unwrap())
                .spawn()
                .unwrap()
        })
        .collect()
}
