//! `train` itself: the config resolved from `--config`, `--set`, `--device` and `--resume`
//! ([`resolve`]), `--gpus N`'s workers ([`spawn_workers`]), the run
//! ([`lowbit_train::run::train`]) and what is said at its end (`report`), with the way on
//! from a fault a run can resume after ([`with_way_on`]).

use crate::{config_path, launcher, plot, progress, signals};
use anyhow::{Context, Result};
use clap::Args;
use lowbit_train::config::{RunConfig, RunSection};
use lowbit_train::distributed::{self, world::World};
use lowbit_train::run::RunReport;
use lowbit_train::run_folder::FolderUse;
use lowbit_train::session::Launch;
use lowbit_train::{checkpoint, run};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The options of `train` itself (no subcommand).
#[derive(Args)]
pub struct TrainArgs {
    /// Run config (TOML): a path, or a bare name looked up under configs/ (`tiny_cpu`).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Override a config value: section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Device: cpu or cuda (overrides train.device).
    #[arg(long)]
    pub device: Option<String>,
    /// Resume a run folder from its newest checkpoint, writing into that folder (`latest` =
    /// the most recent run with a checkpoint in run.dir).
    #[arg(long, value_name = "RUN_DIR|latest", conflicts_with = "overwrite")]
    pub resume: Option<String>,
    /// With --resume: accept a checkpoint that has no manifest.json (written before
    /// checkpoints had checksums, or its manifest lost); its files are loaded unverified.
    #[arg(long, requires = "resume")]
    pub trust_checkpoint: bool,
    /// Start a new run even if the run folder holds one: the old folder is moved aside to
    /// `<name>.old-<N>` (nothing is deleted).
    #[arg(long)]
    pub overwrite: bool,
    /// Print the resolved config (defaults < file < --set) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Data-parallel training with N worker processes on this host (one per GPU), supervised
    /// by this one; the global batch stays micro_batch x grad_accum sequences, each worker
    /// accumulating grad_accum / N micro-batches (N must divide train.grad_accum).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus: Option<u32>,
}

/// Train (or resume) and return the exit status: 0 when the run finished (or had nothing to
/// do), 128 + the signal (130 SIGINT, 143 SIGTERM) when it stopped early on an interrupt with a
/// checkpoint written: this process's signal, or 143 when a peer rank's signal stopped it (every
/// rank of an interrupted job exits 130 / 143). `--gpus N`: the workers' status
/// ([`launcher::supervise`]).
pub fn command(a: TrainArgs) -> Result<i32> {
    let (config, resume_dir) = resolve(&a)?;
    if a.print_config {
        lowbit_train::out!("{}", config.to_toml());
        return Ok(0);
    }
    let resume_from = match &resume_dir {
        Some(d) => Some(checkpoint::latest(d)?),
        None => None,
    };
    let interrupt = Arc::new(AtomicBool::new(false));
    signals::install(interrupt.clone())?;
    if let Some(n) = a.gpus.filter(|&n| n > 1) {
        return spawn_workers(n as usize, &config, &interrupt);
    }
    let world = World::from_env()?;
    let comm = distributed::connect(&world)?;
    let folder = match (&resume_from, a.overwrite) {
        (Some(_), _) => FolderUse::Resume,
        (None, true) => FolderUse::Overwrite,
        (None, false) => FolderUse::New,
    };
    let (plots, max_steps, run_dir) = (config.run.plots, config.train.max_steps, config.run_dir());
    let launch = Launch {
        config,
        resume_from,
        trust_unverified: a.trust_checkpoint,
        folder,
        interrupt,
        stop_after: None,
        comm,
        local_rank: world.local_rank,
    };
    let out = run::train(launch, &mut progress::Bar::new()).map_err(|e| with_way_on(e, &run_dir))?;
    Ok(report(&out, world.rank == 0, max_steps, plots))
}

/// The run config of `a` (defaults < file < `--set`, `--device`; with `--resume` the run
/// folder's saved config unless `--config` names one, its changes from the saved one warned
/// of) and the run folder resumed, if any.
///
/// # Errors
/// No config, a config that does not load, or a `--resume` that names no run folder.
pub fn resolve(a: &TrainArgs) -> Result<(RunConfig, Option<PathBuf>)> {
    let mut set = a.set.clone();
    if let Some(d) = &a.device {
        set.push(format!("train.device=\"{d}\""));
    }
    let config_file = a.config.as_deref().map(|c| config_path::resolve(c, Path::new(config_path::CONFIG_DIR))).transpose()?;
    let resume_dir = match a.resume.as_deref() {
        None => None,
        Some("latest") => {
            let runs = match &config_file {
                Some(c) => PathBuf::from(RunConfig::load(c, &set)?.run.dir),
                None => PathBuf::from(RunConfig::run_dir_override(&set)?.unwrap_or_else(|| RunSection::default().dir)),
            };
            Some(latest_run(&runs)?)
        }
        Some(d) => Some(run_folder(Path::new(d))?),
    };
    let config_path = match (config_file, &resume_dir) {
        (Some(c), _) => c,
        (None, Some(d)) => d.join("config.toml"),
        (None, None) => anyhow::bail!("no config: pass --config FILE (e.g. configs/tiny_cpu.toml) or --resume RUN_DIR"),
    };
    let mut config = RunConfig::load(&config_path, &set)?;
    if let Some(d) = &resume_dir {
        // the folder resumed is the folder written, whatever the saved config calls it
        config.set_run_dir(d)?;
        let mut saved = RunConfig::load(&d.join("config.toml"), &[])?;
        saved.set_run_dir(d)?;
        let changed = config.changes_from(&saved);
        if !changed.is_empty() {
            tracing::warn!(
                "--resume {}: continuing with settings changed from the run's saved config.toml: {}",
                d.display(),
                changed.join("; ")
            );
        }
    }
    Ok((config, resume_dir))
}

/// `--gpus n`: what every worker would refuse, said once before any starts, then `n` workers
/// of this binary supervised until they end ([`launcher::supervise`]: their exit status).
///
/// # Errors
/// A launch inside a data-parallel launch, a config the workers would refuse, or the workers
/// failing to start.
pub fn spawn_workers(n: usize, config: &RunConfig, interrupt: &Arc<AtomicBool>) -> Result<i32> {
    if std::env::var_os("WORLD_SIZE").is_some() {
        anyhow::bail!("--gpus {n} inside a data-parallel launch (WORLD_SIZE is set): use one or the other");
    }
    // what every worker would refuse, said once before any starts
    config.train.accum_per_rank(n).with_context(|| format!("--gpus {n}"))?;
    if config.train.device != "cpu" {
        if let Some(why) = distributed::gpu_ranks_refused(n) {
            anyhow::bail!("--gpus {n} with train.device = {:?}: {why}", config.train.device);
        }
    }
    let exe = std::env::current_exe().context("cannot find this binary to start the workers")?;
    let args = launcher::worker_args(&std::env::args_os().skip(1).collect::<Vec<_>>());
    let workers = launcher::spawn(&exe, &args, n, launcher::free_port()?)?;
    launcher::supervise(workers, interrupt, || signals::received().unwrap_or(libc::SIGTERM))
}

/// What a run says at its end (rank 0, `leader`): nothing to do for a run already finished,
/// the summary and the plots of one that completed. Returns the exit status: 0, or 128 + the
/// signal for a run stopped early by an interrupt.
fn report(out: &RunReport, leader: bool, max_steps: u64, plots: bool) -> i32 {
    if let Some(done) = out.already_finished.filter(|_| leader) {
        lowbit_train::outln!(
            "{}: already finished at step {done} (train.max_steps = {max_steps}); nothing to do (raise \
             train.max_steps, e.g. --set train.max_steps={}, to continue it)",
            out.run_dir.display(),
            done * 2
        );
    }
    if let Some(summary) = out.summary.as_ref().filter(|_| !out.stopped_early) {
        lowbit_train::outln!("{}", summary.render());
        if plots {
            if let Err(e) = plot::plot_run(&out.run_dir) {
                tracing::warn!("plots not written: {e:#}");
            }
        }
    }
    if out.stopped_early {
        128 + signals::received().unwrap_or(libc::SIGTERM)
    } else {
        0
    }
}

/// A run that stopped on a fault it can go on from says how: its folder could not take a
/// write (the disk full, a file size limit, a read-only or unwritable folder: free space or make
/// it writable), or the GPU ran out of memory (another process took it, or the config needs
/// more than the up-front check counts: lower the micro-batch); then resume from the newest
/// checkpoint, which such a stop never damages (a checkpoint is written into `step_N.tmp/` and
/// renamed when complete). Other errors pass unchanged.
pub fn with_way_on(e: anyhow::Error, run_dir: &Path) -> anyhow::Error {
    use std::io::ErrorKind::{FileTooLarge, PermissionDenied, ReadOnlyFilesystem, StorageFull};
    let full = e
        .chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| matches!(io.kind(), StorageFull | FileTooLarge | ReadOnlyFilesystem | PermissionDenied));
    let oom = format!("{e:#}").contains("OUT_OF_MEMORY");
    let what = match (full, oom) {
        (true, _) => format!(
            "The run folder {} cannot take this write (the disk full, a file size limit, or a read-only folder): free space \
             or make it writable",
            run_dir.display()
        ),
        (false, true) => "The GPU ran out of memory (another process took it, or this config needs more than the start's \
             check counts): free the GPU, or lower train.micro_batch (raising train.grad_accum keeps the batch)"
            .into(),
        (false, false) => return e,
    };
    let then = match checkpoint::latest(run_dir) {
        Ok(ck) => format!("`train --resume {}` then continues from its newest checkpoint ({})", run_dir.display(), ck.display()),
        // a folder that was never made holds nothing to overwrite: the same command again
        Err(_) if !run_dir.is_dir() => "then run the same command again".into(),
        Err(_) => "the run cannot be continued (it has no checkpoint yet): run its command again with --overwrite".into(),
    };
    anyhow::anyhow!("{e:#}. {what}; {then}")
}

/// `--resume DIR`: DIR must be a run folder (written by `train`).
fn run_folder(dir: &Path) -> Result<PathBuf> {
    if !dir.is_dir() {
        anyhow::bail!("--resume {}: no such run folder (give a folder written by train, e.g. runs/NAME, or `latest`)", dir.display());
    }
    if !dir.join("config.toml").is_file() {
        anyhow::bail!(
            "--resume {}: not a run folder (it has no config.toml; a run folder is written by train, e.g. runs/NAME)",
            dir.display()
        );
    }
    Ok(dir.to_path_buf())
}

/// The most recently modified run folder that has a checkpoint; a run that `--overwrite`
/// moved aside (`<name>.old-<N>`) is never one.
fn latest_run(runs: &Path) -> Result<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    let entries =
        std::fs::read_dir(runs).with_context(|| format!("--resume latest: cannot list the run folders in {} (run.dir)", runs.display()))?;
    for e in entries {
        let p = e?.path();
        if lowbit_train::run_folder::is_moved_aside(&p) {
            continue;
        }
        if let Ok(m) = std::fs::metadata(p.join("checkpoints")).and_then(|m| m.modified()) {
            if best.as_ref().is_none_or(|(t, _)| m > *t) {
                best = Some((m, p));
            }
        }
    }
    best.map(|b| b.1).with_context(|| format!("--resume latest: no run with a checkpoint in {} (run.dir)", runs.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write refused in a run folder that was never made (it could not be created) advises
    /// the same command again, not `--overwrite` (nothing to overwrite); a folder without a
    /// checkpoint yet advises `--overwrite`.
    #[test]
    fn the_way_on_names_what_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let refused = || anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        let never_made = format!("{:#}", with_way_on(refused(), &tmp.path().join("runs/x")));
        assert!(never_made.contains("then run the same command again") && !never_made.contains("--overwrite"), "{never_made}");
        let started = format!("{:#}", with_way_on(refused(), tmp.path()));
        assert!(started.contains("run its command again with --overwrite"), "{started}");
    }
}
