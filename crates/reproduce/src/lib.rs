//! `train reproduce`: run the cells of one of the paper's loss tables, or of a named ablation
//! of one, and render the result as a markdown report from the runs' records.
//!
//! ```text
//! train reproduce (--table bf16-model|fp32-model|reset-policies|stall-probe|soap --scale SCALE | --ablation NAME | --list-ablations)
//!                 [--cells LIST] [--seeds N | --seed-list LIST] [--states paper|blockwise|theory|all]
//!                 [--jobs N] [--deadline S] [--set section.key=value ...] [--configs DIR] [--out DIR]
//!                 [--merge DIR] [--runs DIR] [--force] [--report-only]
//! ```
//!
//! The map, in the order a command uses it:
//! * what to run: [`paper`] (the tables' cells, config files, published losses and orderings),
//!   [`mod@ablation`] (named departures: cells and overrides), [`scale`] (the `--set` overrides that
//!   shrink a cell to a scale), [`states`] (the paper's formats, lowbit's block formats or the
//!   theory grids), [`subset`] (`--cells`, seeds);
//! * running: [`pool`] (each (cell, seed) a child `train --config CELL --set ...` of this
//!   executable, `--jobs` at once over the machine's GPUs), [`stop`] (SIGINT / SIGTERM stop the
//!   runs and wait for them), [`provenance`] (each run's card, binary and date);
//! * keeping: [`results`] (the records, `<out>/records/<table>-<scale>-results.json`, an
//!   ablation's under `records/ablations/<name>/`: a run they hold with the same config
//!   fingerprint is not run again, so a table fills in over several commands);
//! * reporting, pure functions of the records: [`stats`] (seed means, paired deltas,
//!   verdicts), [`setting`] (the runs' setting from their resolved config), [`report`] (the
//!   markdown, the paper's number only beside the paper's own cell).

pub mod ablation;
pub mod paper;
pub mod pool;
pub mod provenance;
pub mod report;
pub mod results;
pub mod scale;
pub mod setting;
pub mod states;
pub mod stats;
pub mod stop;
pub mod subset;

pub use ablation::{ablation, ablations, Ablation};
pub use paper::{
    cell_config, cell_name, cell_short, cells, claims, paper_loss, paper_verdict, states_label, Cell, Claim, Fix, Fmt, PaperModel,
    Relation, Table, SKIP_PROBS,
};
pub use pool::{detect_gpus, fits, gpus_from, pick_gpu, plan, plan_loadable, read_record, run_overrides, Job, PlanSpec};
pub use report::{render, Compared, PaperBasis, RunInfo};
pub use results::{fingerprint, results_name, results_path, CommandLog, Planned, Record, ResultsFile, RunKey, MAX_WALL_S, RECORDS};
pub use scale::{reset_period, scale_overrides, Scale};
pub use states::{States, StatesArg, SHARED, THEORY_EPS, THEORY_FP4_M};
pub use stats::{any_diverged, delta, evaluate_claim, loss_stat, paired_diffs, Outcome, Results, RunResult, Stat, Verdict};
pub use subset::{parse_seed_list, seeds_to_run, select_cells};

use anyhow::{bail, Context, Result};
use lowbit_train::run_folder::{lock_file, RunLock};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

const RESULTS_HELP: &str = "\
Records: <out>/records/<table>-<scale>-results.json (an ablation's: \
<out>/records/ablations/<name>/<table>-<scale>-results.json) keeps one record per finished run \
(states kind, cell, seed: final and initial validation loss, stalled fractions, theory, diverged, \
steps, tokens, config fingerprint, and where it was made: card, binary commit, date). Each finished \
run is merged into it at once; a run it holds with the same config fingerprint is not run again \
unless --force; the reports (<out>/<table>-<scale>.md, an ablation's <out>/ablations/<name>.md) are \
rendered from it, so a table fills in over several commands (--cells, --seeds / --seed-list). Run \
folders (--runs) are scratch.

On a device machine only the command's output folder comes back, and each command starts on a \
fresh machine: run with --out $OUT --merge reproduce (the committed records are read, the merged \
records and reports are written to $OUT), then copy $OUT/* over reproduce/ and commit them before \
the next command. docs/reproduce.md has the plan and the scales.";

/// The largest `--deadline`, seconds (a year): a larger value is refused by the command line.
pub const MAX_DEADLINE_S: u64 = 365 * 24 * 3600;

/// `--deadline`'s value: whole seconds in 0..=[`MAX_DEADLINE_S`] (a negative or fractional
/// number is named as such rather than taken for another flag).
fn deadline_seconds(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(n) if (0..=i128::from(MAX_DEADLINE_S)).contains(&n) => Ok(n as u64),
        _ => Err(format!("{s}: give whole seconds from 0 to {MAX_DEADLINE_S} (a year)")),
    }
}

/// Command-line arguments of `train reproduce`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = RESULTS_HELP)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["table", "ablation", "list_ablations"])))]
pub struct ReproduceArgs {
    /// Which table: the main table (BF16 model), Table 2 (FP32 model), Table 6 (FP8 reset
    /// policies, BF16 model), the simulated-stalling probe of section 3.3 (FP32 states with
    /// m's or v's write-backs skipped with probability p) or Table 7 (SOAP with BF16 and FP8
    /// states, with and without resets, beside AdamW with FP32 states); the last three read
    /// their cells shared with the main table from the main table's results file, so run that
    /// one first.
    #[arg(long, value_enum, requires = "scale")]
    pub table: Option<Table>,
    /// Instead of a table: a named ablation, some of a table's cells with overrides of their
    /// state settings or setting, at its scale and seeds (`--list-ablations` lists them, with
    /// what each asks). Its records and report are its own
    /// (`records/ablations/<name>/`, `ablations/<name>.md`).
    #[arg(long, value_name = "NAME", conflicts_with = "cells", long_help = ablation_help())]
    pub ablation: Option<String>,
    /// Print every ablation (name, table, scale, cells, seeds, purpose) and exit.
    #[arg(long)]
    pub list_ablations: bool,
    /// smoke (tiny model, bundled CPU sample, minutes), h200 (LLaMA-20M on the shared corpus
    /// in file order, 16.4M tokens per run), h200-shuffled (LLaMA-20M on both offline corpora
    /// shuffled, 128 x 256 tokens per step, 2400 steps), paper-updates (LLaMA-20M, the paper's
    /// 20,000 updates at 32 x 256 tokens per step), full (the paper's LLaMA-100M setting, as
    /// configured). An ablation's own scale when left out (docs/reproduce.md, "Scales").
    #[arg(long, value_enum)]
    pub scale: Option<Scale>,
    /// Runs at once, in all (default: the scale's runs per GPU, smoke 2 on the CPU, h200 10,
    /// h200-shuffled 1, paper-updates 5, full 1, times the GPUs found: CUDA_VISIBLE_DEVICES,
    /// else `nvidia-smi -L`).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Start no run that would end more than SECONDS after the command's start: for a time
    /// limit that would cut a run and lose its work. A run's length: the longest this command
    /// has finished, before that the results file's newest command with as many runs at once
    /// (its seconds over its waves of --jobs runs), else unknown (the run starts). The runs
    /// left are named and the command exits 75 (EX_TEMPFAIL): the same command again goes on
    /// with them; a failed run makes it exit 1 all the same. At most a year (31536000).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, value_parser = deadline_seconds)]
    pub deadline: Option<u64>,
    /// Seed COUNT: seeds 0..N, paired across cells (default: smoke 1, h200 2, h200-shuffled 3,
    /// paper-updates 3, full 1; an ablation's own). For other seeds use --seed-list.
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
    /// Explicit seeds instead of a count: seeds and inclusive ranges, comma-separated
    /// (`1`, `2,3`, `0-2`). `--seeds 2` means seeds 0 and 1; `--seed-list 2` means seed 2.
    #[arg(long, value_name = "LIST")]
    pub seed_list: Option<String>,
    /// Only these cells of the table, comma-separated: short names `<format>_<fix>` (`fp8_sr`,
    /// `fp4_sr_reset`, `fp32_plain`) or formats (`fp4`: all its cells). Default: every cell.
    /// A table's reports always show the whole table.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub cells: Vec<String>,
    /// State formats: the paper's own (the config files: FP8 E4M3 per-tensor amax, FP4
    /// E2M1/E2M2 in amax 128-blocks, eps 1e-6), lowbit's block storage formats (`blockwise`),
    /// the stall theory's precision-only grids with eps 1e-8 (`theory`, the committed stand-in),
    /// or all three (one report each).
    #[arg(long, value_enum, default_value = "paper")]
    pub states: StatesArg,
    /// Extra override for every run, applied after the scale's and an ablation's (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Folder holding the cell configs.
    #[arg(long, default_value = "configs")]
    pub configs: PathBuf,
    /// The reproduce folder written: reports at its top, records under `records/`.
    #[arg(long, default_value = "reproduce")]
    pub out: PathBuf,
    /// Also read the records of this table and scale (or ablation) from the reproduce folder
    /// DIR (the committed `reproduce/` when --out is a device command's output folder); --out
    /// gets the merge.
    #[arg(long, value_name = "DIR")]
    pub merge: Option<PathBuf>,
    /// Parent of the run folders (scratch: the results file keeps what counts).
    #[arg(long, default_value = "runs/reproduce")]
    pub runs: PathBuf,
    /// Rerun the selected runs even when the results file holds them with the same config.
    #[arg(long)]
    pub force: bool,
    /// Only (re)write the reports from the results file; start no run.
    #[arg(long)]
    pub report_only: bool,
}

/// `--ablation`'s long help: what it is, and every name.
fn ablation_help() -> String {
    let names: Vec<String> = ablations().into_iter().map(|a| a.name).collect();
    format!(
        "Instead of a table: a named ablation, some of a table's cells with overrides of their state settings or \
         setting, at its scale and seeds (`--list-ablations` says what each asks). Its records and report are its \
         own (`records/ablations/<name>/`, `ablations/<name>.md`).\n\nAblations: {}",
        names.join(", ")
    )
}

/// What one command reproduces: a table (its report shows every cell) or an ablation of one
/// (its report shows the ablation's cells).
#[derive(Debug, Clone)]
pub struct Target {
    pub table: Table,
    pub scale: Scale,
    /// The ablation, if the command runs one.
    pub ablation: Option<Ablation>,
    /// The cells this command runs (`--cells`, or the ablation's) and the cells its report shows.
    pub run_cells: Vec<Cell>,
    pub shown_cells: Vec<Cell>,
    /// Overrides of every run beyond its cell and scale: the ablation's, then `--set`.
    pub extra: Vec<String>,
    /// The seeds this command runs, and those its report plans (empty: only the seeds the
    /// records hold, as a `--report-only` without seeds renders).
    pub seeds: Vec<usize>,
    pub planned_seeds: Vec<usize>,
}

impl Target {
    /// The target of `train reproduce`'s arguments.
    ///
    /// # Errors
    /// An unknown ablation, a `--scale` other than the ablation's, `--seeds` with
    /// `--seed-list`, or a `--cells` item that is no cell of the table.
    pub fn of(a: &ReproduceArgs) -> Result<Target> {
        let given = a.seeds.is_some() || a.seed_list.is_some();
        let Some(name) = &a.ablation else {
            let (Some(table), Some(scale)) = (a.table, a.scale) else { bail!("train reproduce: give --table and --scale, or --ablation") };
            let seeds = seeds_to_run(a.seeds, a.seed_list.as_deref(), scale.default_seeds())?;
            let planned_seeds = if a.report_only && !given { vec![] } else { seeds.clone() };
            let run_cells = select_cells(table, &a.cells)?;
            return Ok(Target {
                table,
                scale,
                ablation: None,
                run_cells,
                shown_cells: cells(table),
                extra: a.set.clone(),
                seeds,
                planned_seeds,
            });
        };
        let ab = ablation(name)?;
        if let Some(s) = a.scale.filter(|s| *s != ab.scale) {
            bail!("--ablation {name} runs at scale {}, not --scale {}: leave --scale out", ab.scale.as_str(), s.as_str());
        }
        let seeds = if given { seeds_to_run(a.seeds, a.seed_list.as_deref(), 1)? } else { parse_seed_list(ab.seeds)? };
        let run_cells = select_cells(ab.table, &ab.cells).with_context(|| format!("ablation {name}"))?;
        let extra = ab.overrides.iter().chain(&a.set).cloned().collect();
        Ok(Target {
            table: ab.table,
            scale: ab.scale,
            shown_cells: run_cells.clone(),
            run_cells,
            extra,
            planned_seeds: seeds.clone(),
            seeds,
            ablation: Some(ab),
        })
    }
    fn name(&self) -> Option<&str> {
        self.ablation.as_ref().map(|a| a.name.as_str())
    }
    /// The results file under the reproduce folder `root` ([`results_path`]).
    pub fn results_path(&self, root: &Path) -> PathBuf {
        results_path(root, self.table, self.scale, self.name())
    }
    /// The report of states kind `kind` under the reproduce folder `root`: `<table>-<scale>.md`
    /// ([`States::report_name`]), an ablation's `ablations/<name>.md` (`<name>-<kind>.md` for
    /// the blockwise and theory kinds).
    pub fn report_path(&self, root: &Path, kind: States) -> PathBuf {
        match self.name() {
            None => root.join(kind.report_name(self.table, self.scale)),
            Some(n) if kind == States::Paper => root.join("ablations").join(format!("{n}.md")),
            Some(n) => root.join("ablations").join(format!("{n}-{}.md", kind.as_str())),
        }
    }
}

/// The results file of `--out`, merged over the one in `--merge` (the `--out` records win),
/// and the lock this command holds on it until it ends (`<file>.lock`): a second `train
/// reproduce` on the same table, scale and `--out` is refused up front instead of splitting
/// the cells with this one and overwriting its records.
fn load_results(a: &ReproduceArgs, t: &Target) -> Result<(PathBuf, ResultsFile, RunLock)> {
    let path = t.results_path(&a.out);
    let dir = path.parent().expect("a results file has a folder");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let busy = |pid: &str, lock: &Path| {
        format!(
            "{} is being written by another train reproduce (process {pid}, lock file {}): wait for it to \
             end, or give this one another --out",
            path.display(),
            lock.display()
        )
    };
    let lock = lock_file(&path.with_extension("json.lock"), busy)?;
    let file = read_merged(a, t, t.table)?;
    Ok((path, file, lock))
}

/// For a table that shares cells with another ([`Table::borrows_from`]): every run of this
/// table (each states kind, the seeds of either file and of the command) that the file does
/// not hold with today's config but the other table's file does is copied in, under this
/// table's cell name (Table 7's `adamw_fp32` is the main table's `fp32_plain`). Only exact
/// matches (key and fingerprint) are taken, so a stale record of either file never replaces
/// a current one, and a cell of the same states but another config (a SOAP cell) is never
/// borrowed. An ablation borrows nothing: its runs are its own.
fn borrow_shared_runs(a: &ReproduceArgs, t: &Target, spec: PlanSpec, kinds: &[States], file: &mut ResultsFile) -> Result<()> {
    let Some(source_table) = t.table.borrows_from().filter(|_| t.ablation.is_none()) else { return Ok(()) };
    let source = read_merged(a, t, source_table)?;
    let mut all: Vec<usize> = t.seeds.iter().copied().chain(file.seeds()).chain(source.seeds()).collect();
    all.sort_unstable();
    all.dedup();
    for &k in kinds {
        for j in plan_loadable(spec, k, &cells(t.table), &all) {
            if file.find(&j.planned).is_some() {
                continue;
            }
            let theirs = Planned { key: RunKey { cell: cell_short(source_table, &j.planned.cell), ..j.planned.key.clone() }, ..j.planned };
            if let Some(r) = source.find(&theirs) {
                file.upsert(Record { cell: cell_short(t.table, &j.planned.cell), ..r.clone() });
            }
        }
    }
    Ok(())
}

/// The results file of `table` (the target's, or the table it borrows from) in `--out`,
/// merged over the one in `--merge` (the `--out` records win); an empty file where neither
/// exists.
fn read_merged(a: &ReproduceArgs, t: &Target, table: Table) -> Result<ResultsFile> {
    let path = |root: &Path| if table == t.table { t.results_path(root) } else { results_path(root, table, t.scale, None) };
    let file = ResultsFile::load(&path(&a.out), table, t.scale)?;
    let Some(dir) = &a.merge else { return Ok(file) };
    if dir.exists() && !dir.is_dir() {
        bail!("--merge {}: not a folder (give the reproduce folder that holds records/, e.g. reproduce)", dir.display());
    }
    if !dir.is_dir() {
        bail!("--merge {}: no such folder", dir.display());
    }
    let mut merged = ResultsFile::load(&path(dir), table, t.scale)?;
    merged.merge(file);
    Ok(merged)
}

/// The exit status of a `train reproduce` whose `--deadline` left runs unstarted
/// (`EX_TEMPFAIL` of sysexits.h: nothing failed, and the same command again goes on).
pub const EXIT_RUNS_LEFT: i32 = 75;

/// `train reproduce`: the selected runs of every state kind asked for (a run shared by two
/// kinds, an FP32 or BF16 cell, once) that the results file does not hold yet, then one
/// report per kind from the file. `binary` is what the records keep as the binary that made
/// their runs (`train --version`'s commit). Returns the count of runs `--deadline` left
/// unstarted.
pub fn run(a: &ReproduceArgs, binary: &str) -> Result<usize> {
    let command_start = Instant::now();
    if a.list_ablations {
        lowbit_train::outln!("{}", ablation::list().trim_end());
        return Ok(0);
    }
    let t = Target::of(a)?;
    let spec = PlanSpec { table: t.table, scale: t.scale, configs: &a.configs, runs_root: &a.runs, extra: &t.extra };
    let (path, mut file, _lock) = load_results(a, &t)?;
    let kinds = a.states.kinds();
    borrow_shared_runs(a, &t, spec, &kinds, &mut file)?;
    let mut jobs: Vec<Job> = Vec::new();
    for &k in &kinds {
        for j in plan(spec, k, &t.run_cells, &t.seeds)? {
            if !jobs.iter().any(|x| x.planned.key == j.planned.key) {
                jobs.push(j);
            }
        }
    }
    let (todo, held): (Vec<&Job>, Vec<&Job>) = jobs.iter().partition(|j| a.force || file.find(&j.planned).is_none());
    if !held.is_empty() {
        lowbit_train::errln!(
            "reproduce: {} of the {} selected run(s) are already in {} with the same config and are not run again{} \
             (to run them afresh: --out DIR, a folder for a new results file and reports, or --force to rerun and \
             replace them here)",
            held.len(),
            jobs.len(),
            path.display(),
            if todo.is_empty() { ": nothing to run, the reports are rendered from the file" } else { "" }
        );
    }
    let mut outcome = RunOutcome::default();
    if !a.report_only && !todo.is_empty() {
        let deadline = a
            .deadline
            .map(|s| command_start.checked_add(Duration::from_secs(s)).unwrap_or(command_start + Duration::from_secs(u32::MAX.into())));
        outcome = run_jobs(a, &t, &todo, deadline, binary, &path, &mut file)?;
    }
    if !file.runs.is_empty() {
        file.save(&path)?; // with --merge, the merged file goes beside the reports
    }
    for kind in kinds {
        write_report(a, &t, spec, kind, &file)?;
    }
    if !outcome.left.is_empty() {
        lowbit_train::errln!(
            "reproduce: {} run(s) left by --deadline for the next command (the same command goes on with them): {}",
            outcome.left.len(),
            outcome.left.join(", ")
        );
    }
    if !outcome.failed.is_empty() {
        bail!("{} of {} runs failed or did not finish: {}", outcome.failed.len(), todo.len(), outcome.failed.join(", "));
    }
    Ok(outcome.left.len())
}

/// The runs of a command that failed, and those `--deadline` left unstarted (by name).
#[derive(Debug, Default)]
struct RunOutcome {
    failed: Vec<String>,
    left: Vec<String>,
}

/// Run `todo` on this machine's GPUs (or CPU), saving each finished run's record (with its
/// card, `binary` and date) into `file` at `path` as it ends, and the command into the file's
/// log.
fn run_jobs(
    a: &ReproduceArgs,
    t: &Target,
    todo: &[&Job],
    deadline: Option<Instant>,
    binary: &str,
    path: &Path,
    file: &mut ResultsFile,
) -> Result<RunOutcome> {
    let gpus = if todo.iter().any(|j| j.cuda) { detect_gpus() } else { vec![] };
    let at_once = a.jobs.unwrap_or(t.scale.default_jobs(gpus.len())).max(1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    lowbit_train::errln!(
        "reproduce: {} run(s) of {} {} ({}), {at_once} at a time on {}, logs in <run>/train.log",
        todo.len(),
        t.name().unwrap_or(t.table.as_str()),
        t.scale.as_str(),
        t.seeds.iter().map(|s| format!("s{s}")).collect::<Vec<_>>().join(","),
        if gpus.is_empty() { "the CPU".to_string() } else { format!("GPU(s) {}", gpus.join(",")) }
    );
    let started = Instant::now();
    let (mut finished, mut ran, mut out) = (0usize, 0usize, RunOutcome::default());
    let mut made: Vec<String> = Vec::new();
    let mut cards: BTreeMap<Option<String>, Option<String>> = BTreeMap::new();
    let expected = file.expected_run_seconds(at_once).and_then(|s| Duration::try_from_secs_f64(s).ok());
    let pool = pool::PoolSpec { jobs: at_once, gpus: gpus.clone(), threads: (cpus / at_once).max(1), deadline, expected };
    let not_started = pool::run_all(todo, &pool, |j, rec, gpu, secs| {
        finished += 1;
        let loss = lowbit_train::output::fixed(rec.as_ref().and_then(|r| r.final_val_loss), 4);
        lowbit_train::errln!(
            "reproduce: [{finished}/{}] {} {} in {secs:.0}s{} (val loss {loss}), {:.0}s elapsed",
            todo.len(),
            j.name(t.table),
            if rec.is_some() { "done" } else { "FAILED" },
            gpu.map_or(String::new(), |g| format!(" on GPU {g}")),
            started.elapsed().as_secs_f64()
        );
        let Some(r) = rec else {
            out.failed.push(j.name(t.table));
            return Ok(());
        };
        ran += 1;
        if !made.contains(&r.states) {
            made.push(r.states.clone());
        }
        let card = cards.entry(gpu.map(String::from)).or_insert_with(|| provenance::card(gpu)).clone();
        file.upsert(Record { card, binary: Some(binary.to_string()), date: Some(provenance::utc_date(SystemTime::now())), ..r });
        file.save(path)
    })?;
    out.left = not_started.iter().map(|j| j.name(t.table)).collect();
    if ran > 0 {
        let command = std::iter::once("train".to_string()).chain(std::env::args().skip(1)).collect::<Vec<_>>();
        file.commands.push(CommandLog {
            command: command.join(" "),
            runs: ran,
            wall_s: started.elapsed().as_secs_f64(),
            jobs: at_once,
            gpus: gpus.len(),
            states: made,
        });
    }
    Ok(out)
}

/// Render and write the report of states kind `kind`, and print it.
fn write_report(a: &ReproduceArgs, t: &Target, spec: PlanSpec, kind: States, file: &ResultsFile) -> Result<()> {
    let (md, info) = report_for(a, t, spec, kind, file)?;
    let out = t.report_path(&a.out, kind);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&out, &md).with_context(|| format!("cannot write {}", out.display()))?;
    lowbit_train::outln!("{md}");
    lowbit_train::errln!("reproduce: wrote {} ({} of {} runs)", out.display(), info.runs_total - info.runs_missing.len(), info.runs_total);
    Ok(())
}

/// The report of one states kind: the target's shown cells over the seeds it plans and the
/// seeds the results file holds runs of (with today's configs).
fn report_for(a: &ReproduceArgs, t: &Target, spec: PlanSpec, kind: States, file: &ResultsFile) -> Result<(String, RunInfo)> {
    // every seed planned, recorded or run: one plan serves the shown runs and the stale count
    let mut seeds: Vec<usize> = t.planned_seeds.iter().chain(&t.seeds).copied().chain(file.seeds()).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let all = plan_loadable(spec, kind, &t.shown_cells, &seeds);
    let found = |j: &&Job| file.find(&j.planned).is_some();
    let recorded = |s: usize| all.iter().filter(found).any(|j| j.planned.key.seed == s);
    let mut shown: Vec<usize> = seeds.iter().copied().filter(|&s| t.planned_seeds.contains(&s) || recorded(s)).collect();
    if shown.is_empty() {
        shown = t.seeds.clone(); // nothing recorded yet: the seeds a run would make
    }
    let jobs: Vec<&Job> = all.iter().filter(|j| shown.contains(&j.planned.key.seed)).collect();
    let planned: Vec<Planned> = jobs.iter().map(|j| j.planned.clone()).collect();
    let kinds = if kind == States::Paper {
        [States::Paper, States::Blockwise, States::Theory]
            .into_iter()
            .map(|k| {
                let p: Vec<Planned> = plan_loadable(spec, k, &t.shown_cells, &shown).into_iter().map(|j| j.planned).collect();
                (k.as_str(), file.results(&p))
            })
            .collect()
    } else {
        vec![]
    };
    let records: Vec<(&Job, &Record)> = jobs.iter().filter_map(|j| Some((*j, file.find(&j.planned)?))).collect();
    let first = records.first().map(|r| r.1);
    let stale = file
        .runs
        .iter()
        .filter(|r| r.states == kind.as_str() || (kind != States::Theory && r.states == SHARED))
        .filter(|r| t.shown_cells.iter().any(|c| cell_short(t.table, c) == r.cell))
        .filter(|r| !all.iter().any(|j| j.planned.key == r.key() && j.planned.fingerprint == r.fingerprint))
        .count();
    let report_dir = t.report_path(&a.out, kind).parent().map(Path::to_path_buf).unwrap_or_default();
    let info = RunInfo {
        title: t.ablation.as_ref().map_or(String::new(), |ab| {
            format!("Ablation `{}`: {} ({} cells, scale `{}`)", ab.name, ab.purpose, t.table.title(), t.scale.as_str())
        }),
        results_file: relative(&t.results_path(&a.out), &report_dir),
        commands: file.commands.iter().filter(|c| c.made_runs_of(kind)).cloned().collect(),
        seeds: shown,
        cells: t.shown_cells.clone(),
        runs_total: jobs.len(),
        runs_missing: jobs.iter().filter(|j| !found(j)).map(|j| format!("{}-s{}", j.planned.key.cell, j.planned.key.seed)).collect(),
        stale,
        params: first.map(|r| r.params),
        steps: first.map(|r| r.steps),
        tokens_per_run: first.map(|r| r.tokens),
        setting: jobs
            .first()
            .map_or(String::new(), |j| setting::describe(t.scale, &j.cfg, first.map(|r| r.params), first.and_then(|r| r.passes))),
        overrides: t.extra.clone(),
        states_text: kind.description(),
        paper: paper_basis(spec, kind, &jobs),
        cards: records
            .iter()
            .filter_map(|(j, r)| Some(((j.planned.cell, j.planned.key.seed), provenance::short_card(r.card.as_deref()?))))
            .collect(),
        kinds,
        compare: compared_scale(a, t, spec, kind)?,
    };
    Ok((render(t.table, t.scale, &file.results(&planned), &info), info))
}

/// The results a report sets its orderings beside: a `paper-updates` table's at
/// `h200-shuffled` (the same table and cells, the seeds its records hold, `--out` merged over
/// `--merge`), so each claim's verdict shows at both run lengths; `None` for other scales and
/// for ablations.
fn compared_scale(a: &ReproduceArgs, t: &Target, spec: PlanSpec, kind: States) -> Result<Option<Compared>> {
    if t.scale != Scale::PaperUpdates || t.ablation.is_some() {
        return Ok(None);
    }
    let other = Target { scale: Scale::H200Shuffled, seeds: vec![], planned_seeds: vec![], ..t.clone() };
    let file = read_merged(a, &other, t.table)?;
    let planned: Vec<Planned> = plan_loadable(PlanSpec { scale: other.scale, ..spec }, kind, &t.shown_cells, &file.seeds())
        .into_iter()
        .map(|j| j.planned)
        .collect();
    let mut cards: Vec<String> = planned.iter().filter_map(|p| file.find(p)?.card.as_deref().map(provenance::short_card)).collect();
    cards.sort_unstable();
    cards.dedup();
    Ok(Some(Compared { scale: other.scale.as_str(), results: file.results(&planned), cards }))
}

/// `path` relative to the folder `dir` (a report names its results file so), or as given.
fn relative(path: &Path, dir: &Path) -> String {
    let (p, d): (Vec<_>, Vec<_>) = (path.components().collect(), dir.components().collect());
    let common = p.iter().zip(&d).take_while(|(a, b)| a == b).count();
    let up = std::iter::repeat_n("..".to_string(), d.len() - common);
    let down = p[common..].iter().map(|c| c.as_os_str().to_string_lossy().into_owned());
    up.chain(down).collect::<Vec<_>>().join("/")
}

/// The settings that make a run's cell the paper's cell: its state settings, optimizer and
/// its hyper-parameters but the schedule's, and the model's weight type. The rest (model
/// size, data, steps, batch, lr) is the scale's.
const CELL_KEYS: [&str; 7] = ["optim.states.", "optim.kind", "optim.soap.", "optim.beta1", "optim.beta2", "optim.eps", "model.dtype"];

/// Which of the paper's numbers the report of `jobs` may show ([`PaperBasis`]): the paper
/// model of their preset, and the cells whose runs' [`CELL_KEYS`] settings are those of the
/// cell's config file at the scale (the paper's formats, no `--set` or ablation override of
/// them).
fn paper_basis(spec: PlanSpec, kind: States, jobs: &[&Job]) -> PaperBasis {
    let as_paper = PlanSpec { extra: &[], ..spec };
    // one comparison per cell (a cell's seeds differ only in train.seed, no cell key); the theory
    // kind's grids and eps are never the paper's
    let mut seen: Vec<Cell> = Vec::new();
    let mut cells: Vec<Cell> = Vec::new();
    for j in jobs.iter().filter(|_| kind != States::Theory) {
        if seen.contains(&j.planned.cell) {
            continue;
        }
        seen.push(j.planned.cell);
        let Ok(reference) = pool::plan_one(as_paper, States::Paper, j.planned.cell, j.planned.key.seed) else { continue };
        if j.cfg.changes_from(&reference.cfg).iter().all(|c| !CELL_KEYS.iter().any(|k| c.starts_with(k))) {
            cells.push(j.planned.cell);
        }
    }
    let model = jobs.first().and_then(|j| {
        let m = &j.cfg.model;
        let explicit = m.hidden_size.is_some() || m.num_layers.is_some() || m.intermediate_size.is_some() || m.num_heads.is_some();
        PaperModel::from_preset(m.preset.as_deref()).filter(|_| !explicit)
    });
    PaperBasis { model, cells }
}
