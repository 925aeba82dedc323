//! A run folder belongs to one run. [`claim`] is called once everything else has been
//! validated (config, data, tokenizer, device, checkpoint), and is the first thing that
//! touches the folder:
//!
//! * a **new** run refuses a folder that already holds a run (any of the files `train`
//!   writes: `config.toml`, `metrics.jsonl`, `stalls.jsonl`, `summary.json`, `checkpoints/`,
//!   `tensorboard/`);
//!   other files (a `train.log` the caller redirected into it, notes) do not count and are
//!   left alone;
//! * **overwrite** moves such a folder aside to `<name>.old-<N>` (the first free N) and starts
//!   in a fresh one: nothing is deleted;
//! * **resume** writes into the folder it resumes.
//!
//! The live run holds an exclusive lock on `<run>/train.lock` (an OS file lock, `flock` on
//! Linux, through std's [`File::try_lock`]) holding its process id: a second run on the same
//! folder fails naming it. The OS drops the lock when the process dies, so the lock file of a
//! killed run (a stale lock) is simply taken over.

use crate::logs::RunLogs;
use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside a run folder.
pub const LOCK_FILE: &str = "train.lock";

/// Files and folders whose presence means a folder holds a run.
const RUN_FILES: [&str; 6] = ["config.toml", "metrics.jsonl", "stalls.jsonl", "summary.json", "checkpoints", crate::logs::tensorboard::DIR];

/// How a run uses its folder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FolderUse {
    /// A new run: the folder must not hold a run yet.
    #[default]
    New,
    /// A new run: a run already in the folder is moved aside first (`--overwrite`).
    Overwrite,
    /// Continue the run in the folder (`--resume`).
    Resume,
    /// No run folder: nothing is written (`train bench training`); [`claim`] is not called.
    None,
}

/// The exclusive lock of a live run on its folder; released (and the lock file removed) on drop.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Remove first, unlock second: another run that opens the path meanwhile locks a new file.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// Remove the run files of `dir` (a new run stopped before its first step wrote them; call
/// it while holding the folder's lock, so that no other run has claimed it meanwhile).
pub fn remove_run_files(dir: &Path) -> Result<()> {
    for f in run_files(dir) {
        let p = dir.join(f);
        let gone = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        gone.with_context(|| format!("cannot remove {}", p.display()))?;
    }
    Ok(())
}

/// The `train` files present in `dir` (empty when it holds no run or does not exist).
pub fn run_files(dir: &Path) -> Vec<&'static str> {
    RUN_FILES.into_iter().filter(|f| dir.join(f).exists()).collect()
}

/// Take `dir` for a run used as `how`: lock it, then check (new), move aside (overwrite) or
/// keep (resume) what is in it. Returns the lock, to be held until the run ends.
pub fn claim(dir: &Path, how: FolderUse) -> Result<RunLock> {
    anyhow::ensure!(how != FolderUse::None, "{}: a launch without a run folder claims none", dir.display());
    if how == FolderUse::Overwrite {
        if let Some(aside) = move_aside_unless_live(dir)? {
            tracing::warn!("--overwrite: moved the previous run in {} to {}", dir.display(), aside.display());
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the run folder {}", dir.display()))?;
    let lock = lock(dir)?;
    let present = run_files(dir);
    if how == FolderUse::New && !present.is_empty() {
        let resume = match finished_at(dir) {
            Some(steps) => format!("it finished at step {steps}: raise train.max_steps and pass --resume {} to continue it", dir.display()),
            None => format!("pass --resume {} to continue it", dir.display()),
        };
        bail!(
            "run folder {} already holds a run ({}): {resume}, --overwrite to move it aside and start \
             again, or choose another run.name",
            dir.display(),
            present.join(", ")
        );
    }
    Ok(lock)
}

/// Takes `dir` for a run used as `how` ([`claim`]) and starts its files: the resolved config
/// `config_toml` written to `config.toml`, an older `summary.json` (which marks an ended run:
/// `train stalls --follow` stops on it) removed, the logs opened ([`RunLogs::open`]: a resumed
/// run's `resumed_at`, with `run.tensorboard`'s event file when `tensorboard`). Returns the lock
/// and the logs; `None` for [`FolderUse::None`], which touches nothing.
///
/// # Errors
/// Those of [`claim`], or a file that cannot be written or opened.
pub fn start(
    dir: &Path,
    how: FolderUse,
    config_toml: &str,
    resumed_at: Option<u64>,
    tensorboard: bool,
) -> Result<Option<(RunLock, RunLogs)>> {
    if how == FolderUse::None {
        return Ok(None);
    }
    let lock = claim(dir, how)?;
    let _ = std::fs::remove_file(dir.join("summary.json"));
    crate::checkpoint::write_atomic(&dir.join("config.toml"), config_toml.as_bytes())?;
    Ok(Some((lock, RunLogs::open(dir, resumed_at, tensorboard)?)))
}

/// The step at which the run in `dir` finished (its `summary.json` says `finished`), or
/// `None` (no summary, another status, or one that cannot be read).
fn finished_at(dir: &Path) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Ended {
        #[serde(default)]
        status: crate::logs::summary::RunStatus,
        steps: u64,
    }
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    let ended: Ended = serde_json::from_str(&text).ok()?;
    (ended.status == crate::logs::summary::RunStatus::Finished).then_some(ended.steps)
}

/// Move a folder that holds a run aside ([`move_aside`]) so a new run can start in its place;
/// `None` when it holds none. Fails, touching nothing, while a live run holds its lock (so a
/// runner that restarts runs, `train reproduce`, never moves a running one).
pub fn move_aside_unless_live(dir: &Path) -> Result<Option<PathBuf>> {
    if run_files(dir).is_empty() {
        return Ok(None);
    }
    let mut held = lock(dir)?;
    let aside = move_aside(dir)?;
    held.path = aside.join(LOCK_FILE); // the lock file moved with the folder: removed on drop
    drop(held);
    Ok(Some(aside))
}

/// The process id in `dir/train.lock` when that process is alive: a training run is writing
/// the folder now. `None` when no lock file is there (no run has claimed it, or its run ended),
/// or it names a process that no longer exists (a killed run's stale lock). Reads the file
/// only (taking the lock, even briefly, could refuse a run starting at that moment).
/// Liveness is `/proc/<pid>` on Linux; elsewhere a lock file's process counts as alive.
pub fn live_holder(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join(LOCK_FILE)).ok()?.trim().parse().ok()?;
    let alive = !cfg!(target_os = "linux") || Path::new(&format!("/proc/{pid}")).exists();
    alive.then_some(pid)
}

/// Whether `dir` is a run that `--overwrite` moved aside (`<name>.old-<N>`, [`claim`]).
pub fn is_moved_aside(dir: &Path) -> bool {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.rsplit_once(".old-").is_some_and(|(stem, n)| !stem.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Rename `dir` to the first free `<dir>.old-<N>` and return that path.
pub fn move_aside(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().context("run folder has no name")?.to_string_lossy().into_owned();
    let aside = (1..).map(|n| dir.with_file_name(format!("{name}.old-{n}"))).find(|p| !p.exists()).expect("a free name");
    std::fs::rename(dir, &aside).with_context(|| format!("cannot move {} aside to {}", dir.display(), aside.display()))?;
    Ok(aside)
}

/// Lock `dir/train.lock` for this process, or fail naming the process that holds it.
fn lock(dir: &Path) -> Result<RunLock> {
    let busy = |pid: &str, path: &Path| {
        format!(
            "run folder {} is in use by another training run (process {pid}, lock file {}): wait for it to \
             end, stop it, or choose another run.name",
            dir.display(),
            path.display()
        )
    };
    lock_file(&dir.join(LOCK_FILE), busy)
}

/// Lock the file `path` (created if missing) for this process and write its id into it, or
/// fail with `busy(holder's process id, path)`. A lock file left by a dead process is taken
/// over. Released, and the file removed, when the returned lock is dropped.
pub fn lock_file(path: &Path, busy: impl Fn(&str, &Path) -> String) -> Result<RunLock> {
    let path = path.to_path_buf();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            bail!(busy(pid.trim(), &path));
        }
        Err(TryLockError::Error(e)) => bail!("cannot lock {}: {e}", path.display()),
    }
    let mut old = String::new();
    let _ = file.read_to_string(&mut old);
    if !old.trim().is_empty() {
        tracing::info!("{}: stale lock of process {} (no longer running) taken over", path.display(), old.trim());
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id()).with_context(|| format!("cannot write {}", path.display()))?;
    file.flush()?;
    Ok(RunLock { file, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_aside_names_are_recognised() {
        for (name, aside) in
            [("x.old-1", true), ("run.old-12", true), ("x", false), ("x.old-", false), (".old-1", false), ("x.old-1a", false)]
        {
            assert_eq!(is_moved_aside(Path::new("runs").join(name).as_path()), aside, "{name}");
        }
    }

    #[test]
    fn new_refuses_a_used_folder_overwrite_moves_it_aside_resume_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("x");
        std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "old\n").unwrap();
        let e = format!("{:#}", claim(&dir, FolderUse::New).unwrap_err());
        assert!(e.contains("already holds a run (metrics.jsonl, checkpoints): pass --resume") && e.contains("--overwrite"), "{e}");
        assert_eq!(std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(), "old\n", "untouched");
        // a finished run: resuming it needs a higher train.max_steps
        std::fs::write(dir.join("summary.json"), r#"{"status": "finished", "steps": 160, "tokens": 1}"#).unwrap();
        let e = format!("{:#}", claim(&dir, FolderUse::New).unwrap_err());
        assert!(e.contains("it finished at step 160: raise train.max_steps and pass --resume"), "{e}");
        std::fs::write(dir.join("summary.json"), r#"{"status": "interrupted", "steps": 80}"#).unwrap();
        let e = format!("{:#}", claim(&dir, FolderUse::New).unwrap_err());
        assert!(e.contains("summary.json, checkpoints): pass --resume"), "{e}");
        std::fs::remove_file(dir.join("summary.json")).unwrap();
        drop(claim(&dir, FolderUse::Resume).unwrap());
        assert!(dir.join("metrics.jsonl").exists());
        let held = claim(&dir, FolderUse::Overwrite).unwrap();
        assert_eq!(std::fs::read_to_string(tmp.path().join("x.old-1/metrics.jsonl")).unwrap(), "old\n");
        assert!(!tmp.path().join("x.old-1").join(LOCK_FILE).exists(), "the moved run is as it was");
        assert!(run_files(&dir).is_empty());
        assert_eq!(std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(), std::process::id().to_string());
        drop(held);
        assert!(!dir.join(LOCK_FILE).exists(), "lock file removed at the end");
        // other files do not make a folder "used"
        std::fs::write(dir.join("train.log"), "log").unwrap();
        drop(claim(&dir, FolderUse::New).unwrap());
    }

    /// A folder whose run is live is never moved aside, by `--overwrite` or by a runner.
    #[test]
    fn a_live_run_is_not_moved_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("x");
        let live = claim(&dir, FolderUse::New).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "live\n").unwrap();
        let e = format!("{:#}", move_aside_unless_live(&dir).unwrap_err());
        assert!(e.contains("in use by another training run"), "{e}");
        let e = format!("{:#}", claim(&dir, FolderUse::Overwrite).unwrap_err());
        assert!(e.contains("in use by another training run"), "{e}");
        assert_eq!(std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(), "live\n");
        assert!(!tmp.path().join("x.old-1").exists());
        drop(live);
        assert_eq!(move_aside_unless_live(&dir).unwrap(), Some(tmp.path().join("x.old-1")));
        assert_eq!(move_aside_unless_live(&dir).unwrap(), None);
    }

    #[test]
    fn stale_lock_file_of_a_dead_process_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(LOCK_FILE), "999999999").unwrap();
        let lock = claim(tmp.path(), FolderUse::Resume).unwrap();
        assert_eq!(std::fs::read_to_string(&lock.path).unwrap(), std::process::id().to_string());
    }
}
