//! The runs of a command as child processes: planning each (cell, seed) run of a states kind
//! (its overrides, folder and config fingerprint), finding the machine's GPUs, and running
//! the children `--jobs` at a time, each on the least-loaded GPU (`CUDA_VISIBLE_DEVICES`
//! set per child), reporting every finished run as it ends.

use super::paper::{cell_config, cell_name, Cell, Table};
use super::results::{fingerprint, run_key, Planned, Record};
use super::scale::{scale_overrides, Scale};
use super::states::States;
use anyhow::{Context, Result};
use lowbit_train::config::RunConfig;
use lowbit_train::logs::summary::Summary;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One child run to make.
#[derive(Debug, Clone)]
pub struct Job {
    /// The run's key and config fingerprint in the results file.
    pub planned: Planned,
    /// The cell's config file and the run's `--set` overrides ([`run_overrides`]).
    pub config: PathBuf,
    pub overrides: Vec<String>,
    /// The run folder, and the steps a finished run reports.
    pub run_dir: PathBuf,
    pub max_steps: u64,
    /// Its peak learning rate (`optim.lr`), for the record.
    pub lr: f64,
    /// The run trains on a CUDA device (gets a GPU of its own).
    pub cuda: bool,
    /// Its resolved config (the setting a report describes, the cell it is compared with).
    pub cfg: RunConfig,
}

impl Job {
    /// The run's name in logs: `<cell config>-s<seed>`.
    pub fn name(&self, table: Table) -> String {
        format!("{}-s{}", cell_name(table, self.planned.cell), self.planned.key.seed)
    }
}

/// The overrides of one (cell, seed) run of `spec`'s table and scale: scale, state formats,
/// the cell's own (SOAP, a simulated-stalling p: [`Table::overrides`]), then folder and seed,
/// then the user's (`spec.extra`).
pub fn run_overrides(spec: PlanSpec, states: States, cell: Cell, runs_dir: &Path, name: &str, seed: usize) -> Vec<String> {
    let mut o = scale_overrides(spec.scale, cell);
    o.extend(states.overrides(cell.0));
    o.extend(spec.table.overrides(cell));
    o.push(format!("run.dir={}", toml_str(&runs_dir.to_string_lossy())));
    o.push(format!("run.name={}", toml_str(name)));
    o.push(format!("train.seed={seed}"));
    o.extend(spec.extra.iter().cloned());
    o
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Where and how a command's runs are planned.
#[derive(Debug, Clone, Copy)]
pub struct PlanSpec<'a> {
    /// The table and scale of the runs.
    pub table: Table,
    pub scale: Scale,
    /// Folder holding the cell configs.
    pub configs: &'a Path,
    /// Parent of the run folders.
    pub runs_root: &'a Path,
    /// The user's `--set` overrides, applied last.
    pub extra: &'a [String],
}

/// Plan the runs of one states kind over `cells` and `seeds` (seed-major, so partial results
/// stay paired), loading each config.
///
/// # Errors
/// A cell's config that does not load with the overrides (naming the cell and seed).
pub fn plan(spec: PlanSpec, states: States, cells: &[Cell], seeds: &[usize]) -> Result<Vec<Job>> {
    seeds.iter().flat_map(|&seed| cells.iter().map(move |&cell| plan_one(spec, states, cell, seed))).collect()
}

/// [`plan`] for the cells a command shows or borrows but does not run: a cell whose config the
/// `--set` overrides make invalid (a SOAP key on the AdamW reference cell) cannot have runs of
/// that config, so it is left out (shown as missing) instead of failing the command.
pub fn plan_loadable(spec: PlanSpec, states: States, cells: &[Cell], seeds: &[usize]) -> Vec<Job> {
    seeds.iter().flat_map(|&seed| cells.iter().filter_map(move |&cell| plan_one(spec, states, cell, seed).ok())).collect()
}

/// One run of [`plan`].
///
/// # Errors
/// The cell's config does not load with the overrides.
pub fn plan_one(spec: PlanSpec, states: States, cell: Cell, seed: usize) -> Result<Job> {
    let config = cell_config(spec.configs, spec.table, cell);
    let name = format!("{}-s{seed}", cell_name(spec.table, cell));
    let runs_dir = states.runs_dir(spec.runs_root, spec.table, spec.scale, cell.0);
    let overrides = run_overrides(spec, states, cell, &runs_dir, &name, seed);
    let cfg = RunConfig::load(&config, &overrides).with_context(|| format!("cell {} (seed {seed})", cell_name(spec.table, cell)))?;
    Ok(Job {
        planned: Planned { key: run_key(states.tag(cell.0), spec.table, cell, seed), cell, fingerprint: fingerprint(&cfg) },
        config,
        run_dir: cfg.run_dir(),
        max_steps: cfg.train.max_steps,
        lr: cfg.optim.lr,
        cuda: cfg.train.device.starts_with("cuda"),
        overrides,
        cfg,
    })
}

/// The record of a finished run folder, or `None` when its summary is missing or it did not
/// finish `max_steps`.
pub fn read_record(job: &Job) -> Option<Record> {
    let text = std::fs::read_to_string(job.run_dir.join("summary.json")).ok()?;
    let s: Summary = serde_json::from_str(&text).ok()?;
    (s.steps >= job.max_steps).then(|| Record::from_summary(job.planned.key.clone(), job.planned.fingerprint.clone(), job.lr, &s))
}

// ───────────────────────────── GPUs ─────────────────────────────

/// The GPUs to spread runs over, as `CUDA_VISIBLE_DEVICES` entries: the entries of
/// `visible` (the parent's `CUDA_VISIBLE_DEVICES`) when set, else one per `GPU <n>:` line of
/// `nvidia-smi -L` output (`smi`), else none.
pub fn gpus_from(visible: Option<&str>, smi: Option<&str>) -> Vec<String> {
    if let Some(v) = visible {
        return v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    }
    let n = smi.map_or(0, |s| s.lines().filter(|l| l.trim_start().starts_with("GPU ")).count());
    (0..n).map(|i| i.to_string()).collect()
}

/// This machine's GPUs ([`gpus_from`] on the environment and `nvidia-smi -L`).
pub fn detect_gpus() -> Vec<String> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let smi = match visible {
        Some(_) => None,
        None => Command::new("nvidia-smi")
            .arg("-L")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
    };
    gpus_from(visible.as_deref(), smi.as_deref())
}

/// The GPU for the next run: the one with the fewest runs on it, the first of those on a tie
/// (so runs start round-robin and a GPU freed by a finished run is refilled first).
pub fn pick_gpu(load: &[usize]) -> Option<usize> {
    (0..load.len()).min_by_key(|&i| (load[i], i))
}

// ───────────────────────────── running ─────────────────────────────

/// How a command runs its children.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    /// Runs at once.
    pub jobs: usize,
    /// GPUs to spread CUDA runs over ([`detect_gpus`]); empty: none set.
    pub gpus: Vec<String>,
    /// CPU threads per child (`RAYON_NUM_THREADS`, unless the parent sets it).
    pub threads: usize,
    /// Start no run that would end after this instant ([`fits`]).
    pub deadline: Option<Instant>,
    /// A run's length until one of the pool's runs finishes (from the results file's earlier
    /// commands: [`crate::ResultsFile::expected_run_seconds`]).
    pub expected: Option<Duration>,
}

/// Whether a run of length `run` started at `now` ends by `deadline`: a device command's time
/// limit cuts a run that does not, and its work is lost. With no length known, or no
/// deadline, every run fits.
pub fn fits(now: Instant, run: Option<Duration>, deadline: Option<Instant>) -> bool {
    match (run, deadline) {
        (Some(r), Some(d)) => now.checked_add(r).is_some_and(|end| end <= d),
        _ => true,
    }
}

fn spawn(job: &Job, gpu: Option<&str>, threads: usize) -> Result<Child> {
    // a run folder left by an unfinished or other run is moved aside, never mixed into; one
    // that a live run (another runner's) holds is refused
    lowbit_train::run_folder::move_aside_unless_live(&job.run_dir)?;
    std::fs::create_dir_all(&job.run_dir).with_context(|| format!("cannot create {}", job.run_dir.display()))?;
    let log = std::fs::File::create(job.run_dir.join("train.log"))?;
    let exe = std::env::current_exe().context("cannot find the current executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--config").arg(&job.config);
    for o in &job.overrides {
        cmd.arg("--set").arg(o);
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        cmd.env("RAYON_NUM_THREADS", threads.to_string());
    }
    if let Some(g) = gpu {
        cmd.env("CUDA_VISIBLE_DEVICES", g);
    }
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    die_with_parent(&mut cmd);
    cmd.spawn().context("cannot start a training run")
}

/// On Linux, the child gets SIGTERM when this runner dies, however it dies (SIGINT, SIGTERM,
/// SIGKILL, a panic): it then stops as a stopped run does (a checkpoint, exit 143) instead of
/// training on as an orphan. A runner that died before the child set this up (its parent is
/// then another process) stops the child at once.
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: prctl, getppid and raise are async-signal-safe; the closure allocates nothing
        // and nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::raise(libc::SIGTERM);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Seconds between two progress lines of the runs in flight.
const STATUS_EVERY: Duration = Duration::from_secs(30);

/// The step a run has reached: its newest `metrics.jsonl` train row (0 before the first).
fn step_reached(job: &Job) -> u64 {
    lowbit_train::logs::metrics::read_rows::<lowbit_train::logs::metrics::MetricsRow>(&job.run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .iter()
        .rev()
        .find_map(|r| match r {
            lowbit_train::logs::metrics::MetricsRow::Train { step, .. } => Some(*step),
            _ => None,
        })
        .unwrap_or(0)
}

/// Run `todo` as child processes, `spec.jobs` at a time, each CUDA run on the least-loaded
/// GPU, saying when each starts and, every 30 s, the step each running one has reached.
/// `done` gets every run as it ends, with its record (`None`: it failed or did not finish),
/// the GPU it ran on and its seconds; an error from `done` stops the pool. Returns the runs
/// not started because they would end after `spec.deadline` ([`fits`], a run's length: the
/// longest of the pool's finished runs, before one finishes `spec.expected`), in `todo`'s
/// order.
pub fn run_all<'a>(
    todo: &[&'a Job],
    spec: &PoolSpec,
    mut done: impl FnMut(&Job, Option<Record>, Option<&str>, f64) -> Result<()>,
) -> Result<Vec<&'a Job>> {
    let mut queue = todo.iter().peekable();
    let mut load = vec![0usize; spec.gpus.len()];
    let mut running: Vec<(&Job, Child, Instant, Option<usize>)> = Vec::new();
    let (mut longest, mut left) = (None::<Duration>, Vec::new());
    let mut said = Instant::now();
    let _catch = super::stop::CatchStopSignals::new()?;
    loop {
        while running.len() < spec.jobs.max(1) {
            let run = longest.or(spec.expected);
            if queue.peek().is_some() && !fits(Instant::now(), run, spec.deadline) {
                left = queue.by_ref().copied().collect();
                let to_go = spec.deadline.map(|d| d.saturating_duration_since(Instant::now()));
                lowbit_train::errln!(
                    "reproduce: {} run(s) not started: a run takes ~{:.0}s ({}), {:.0}s are left before --deadline",
                    left.len(),
                    run.unwrap_or_default().as_secs_f64(),
                    if longest.is_some() { "the longest finished here" } else { "the results file's last command at this --jobs" },
                    to_go.unwrap_or_default().as_secs_f64()
                );
            }
            let Some(&j) = queue.next() else { break };
            let gpu = if j.cuda { pick_gpu(&load) } else { None };
            match spawn(j, gpu.map(|g| spec.gpus[g].as_str()), spec.threads) {
                Ok(c) => {
                    if let Some(g) = gpu {
                        load[g] += 1;
                    }
                    lowbit_train::errln!("reproduce: started {} (log {})", j.run_dir.display(), j.run_dir.join("train.log").display());
                    running.push((j, c, Instant::now(), gpu));
                }
                Err(e) => {
                    lowbit_train::errln!("reproduce: cannot start {}: {e:#}", j.run_dir.display());
                    done(j, None, None, 0.0)?;
                }
            }
        }
        if running.is_empty() {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(200));
        super::stop::stop_runs_if_signalled(running.iter_mut().map(|r| &mut r.1));
        if said.elapsed() >= STATUS_EVERY {
            said = Instant::now();
            let steps: Vec<String> = running
                .iter()
                .map(|(j, _, t0, _)| {
                    format!(
                        "{} step {}/{} ({:.0}s)",
                        j.run_dir.file_name().unwrap_or_default().to_string_lossy(),
                        step_reached(j),
                        j.max_steps,
                        t0.elapsed().as_secs_f64()
                    )
                })
                .collect();
            lowbit_train::errln!("reproduce: running {}", steps.join(", "));
        }
        let mut i = 0;
        while i < running.len() {
            if let Some(status) = running[i].1.try_wait()? {
                let (j, _, t0, gpu) = running.remove(i);
                if let Some(g) = gpu {
                    load[g] -= 1;
                }
                let rec = if status.success() { read_record(j) } else { None };
                if rec.is_some() {
                    longest = longest.max(Some(t0.elapsed()));
                }
                done(j, rec, gpu.map(|g| spec.gpus[g].as_str()), t0.elapsed().as_secs_f64())?;
            } else {
                i += 1;
            }
        }
    }
}
