//! `train reproduce`: run the cells of one of the paper's loss tables and write the result
//! as a markdown table beside the paper's numbers.
//!
//! ```text
//! train reproduce --table bf16-model|fp32-model|reset-policies|stall-probe|soap --scale smoke|h200|h200-shuffled|full
//!                 [--cells LIST] [--seeds N | --seed-list LIST] [--states paper|blockwise|theory|all]
//!                 [--jobs N] [--set section.key=value ...] [--configs DIR] [--out DIR]
//!                 [--merge DIR] [--runs DIR] [--force] [--report-only]
//! ```
//!
//! A cell is one config file (`configs/llama100m_<states>_<fix>.toml` for the BF16-model main
//! table, `configs/fp32_model/llama100m_f32model_<states>_<fix>.toml` for the FP32-model
//! Table 2, `configs/reset_policies/` for Table 6's policies that the main table lacks, the
//! FP32 cell's file with a skip probability for the simulated-stalling probe, the main table's
//! files with `optim.kind = "soap"` for Table 7: [`paper`]), run at a *scale* ([`scale`]:
//! `full` runs the file as written, `smoke` and `h200` add `--set`-style overrides that shrink
//! the run and set its reset periods) on a states kind ([`states`]: the paper's own formats as
//! the config files hold them, lowbit's block storage formats, or the stall theory's
//! precision-only grids). Each (cell, seed) is a child process
//! `train --config CELL --set ...` of the current executable in its own run folder under
//! `--runs`, at most `--jobs` at once, spread over the machine's GPUs ([`pool`]).
//!
//! Every finished run goes at once into the results file `<out>/<table>-<scale>-results.json`
//! ([`results`]); a run the file holds with the same config fingerprint is not run again
//! (unless `--force`), so a table fills in over several commands (`--cells`, `--seeds`,
//! `--seed-list`: [`subset`]). The reports (`<out>/<table>-<scale>.md` for the paper's formats,
//! `-blockwise.md`, `-theory.md`) are rendered from the file by pure functions ([`stats`],
//! [`report`]).

pub mod paper;
pub mod pool;
pub mod report;
pub mod results;
pub mod scale;
pub mod states;
pub mod stats;
pub mod subset;

pub use paper::{
    cell_config, cell_name, cell_short, cells, claims, paper_loss, paper_verdict, states_label, Cell, Claim, Fix, Fmt, Relation, Table,
    SKIP_PROBS,
};
pub use pool::{detect_gpus, fits, gpus_from, pick_gpu, plan, plan_loadable, read_record, run_overrides, Job, PlanSpec};
pub use report::{render, RunInfo};
pub use results::{fingerprint, results_name, CommandLog, Planned, Record, ResultsFile, RunKey};
pub use scale::{reset_period, scale_description, scale_overrides, Scale};
pub use states::{States, StatesArg, SHARED, THEORY_EPS, THEORY_FP4_M};
pub use stats::{any_diverged, delta, evaluate_claim, loss_stat, paired_diffs, Outcome, Results, RunResult, Stat, Verdict};
pub use subset::{parse_seed_list, seeds_to_run, select_cells};

use anyhow::{bail, Context, Result};
use lowbit_train::run_folder::{lock_file, RunLock};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RESULTS_HELP: &str = "\
Results file: <out>/<table>-<scale>-results.json keeps one record per finished run (states kind, \
cell, seed: final and initial validation loss, stalled fractions, theory, diverged, steps, tokens, \
config fingerprint). Each finished run is merged into it at once; a run it holds with the same \
config fingerprint is not run again unless --force; the reports are rendered from it, so a table \
fills in over several commands (--cells, --seeds / --seed-list). Run folders (--runs) are scratch.

On a device machine only the command's output folder comes back, and each command starts on a \
fresh machine: run with --out $OUT --merge reproduce (the committed results are read, the merged \
file and reports are written to $OUT), then copy $OUT/* into reproduce/ and commit them before \
the next command. reproduce/README.md has the plan for the h200 tables.";

/// Command-line arguments of `train reproduce`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = RESULTS_HELP)]
pub struct ReproduceArgs {
    /// Which table: the main table (BF16 model), Table 2 (FP32 model), Table 6 (FP8 reset
    /// policies, BF16 model), the simulated-stalling probe of section 3.3 (FP32 states with
    /// m's or v's write-backs skipped with probability p) or Table 7 (SOAP with BF16 and FP8
    /// states, with and without resets, beside AdamW with FP32 states); the last three read
    /// their cells shared with the main table from the main table's results file, so run that
    /// one first.
    #[arg(long, value_enum)]
    pub table: Table,
    /// smoke (tiny model, bundled CPU sample, minutes), h200 (LLaMA-20M on the shared corpus
    /// in file order, 16.4M tokens per run, 10 runs per GPU per 10-minute command),
    /// h200-shuffled (issue 50's setting: LLaMA-20M on both offline corpora shuffled, 128 x 256
    /// tokens per step, 2400 steps), full (the paper's LLaMA-100M setting, as configured).
    #[arg(long, value_enum)]
    pub scale: Scale,
    /// Runs at once, in all (default: the scale's runs per GPU, smoke 2 on the CPU, h200 10,
    /// h200-shuffled 1, full 1, times the GPUs found: CUDA_VISIBLE_DEVICES, else
    /// `nvidia-smi -L`).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Start no run that would end more than SECONDS after the command's start: for a time
    /// limit that would cut a run and lose its work. A run's length: the longest this command
    /// has finished, before that the results file's newest command with as many runs at once
    /// (its seconds over its waves of --jobs runs), else unknown (the run starts). The runs
    /// left are named and the command exits 75 (EX_TEMPFAIL): the same command again goes on
    /// with them; a failed run makes it exit 1 all the same.
    #[arg(long, value_name = "SECONDS")]
    pub deadline: Option<u64>,
    /// Seed COUNT: seeds 0..N, paired across cells (default: smoke 1, h200 2, h200-shuffled 3,
    /// full 1). For other seeds use --seed-list.
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
    /// Explicit seeds instead of a count: seeds and inclusive ranges, comma-separated
    /// (`1`, `2,3`, `0-2`). `--seeds 2` means seeds 0 and 1; `--seed-list 2` means seed 2.
    #[arg(long, value_name = "LIST")]
    pub seed_list: Option<String>,
    /// Only these cells, comma-separated: short names `<format>_<fix>` (`fp8_sr`,
    /// `fp4_sr_reset`, `fp32_plain`) or formats (`fp4`: all its cells). Default: every cell.
    /// The reports always show the whole table.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub cells: Vec<String>,
    /// State formats: the paper's own (the config files: FP8 E4M3 per-tensor amax, FP4
    /// E2M1/E2M2 in amax 128-blocks, eps 1e-6), lowbit's block storage formats (`blockwise`),
    /// the stall theory's precision-only grids with eps 1e-8 (`theory`, the committed stand-in),
    /// or all three (one report each).
    #[arg(long, value_enum, default_value = "paper")]
    pub states: StatesArg,
    /// Extra override for every run, applied after the scale's (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Folder holding the cell configs.
    #[arg(long, default_value = "configs")]
    pub configs: PathBuf,
    /// Folder of the reports and the results file.
    #[arg(long, default_value = "reproduce")]
    pub out: PathBuf,
    /// Also read the results file of this table and scale from DIR (the committed
    /// `reproduce/` when --out is a device command's output folder); --out gets the merge.
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

/// The results file of `--out`, merged over the one in `--merge` (the `--out` records win),
/// and the lock this command holds on it until it ends (`<file>.lock`): a second `train
/// reproduce` on the same table, scale and `--out` is refused up front instead of splitting
/// the cells with this one and overwriting its records.
fn load_results(a: &ReproduceArgs) -> Result<(PathBuf, ResultsFile, RunLock)> {
    let name = results_name(a.table, a.scale);
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create --out {}", a.out.display()))?;
    let path = a.out.join(&name);
    let busy = |pid: &str, lock: &Path| {
        format!(
            "{} is being written by another train reproduce (process {pid}, lock file {}): wait for it to \
             end, or give this one another --out",
            path.display(),
            lock.display()
        )
    };
    let lock = lock_file(&path.with_extension("json.lock"), busy)?;
    let file = read_merged(a, a.table)?;
    Ok((path, file, lock))
}

/// For a table that shares cells with another ([`Table::borrows_from`]): every run of this
/// table (each states kind, the seeds of either file and of the command) that the file does
/// not hold with today's config but the other table's file does is copied in, under this
/// table's cell name (Table 7's `adamw_fp32` is the main table's `fp32_plain`). Only exact
/// matches (key and fingerprint) are taken, so a stale record of either file never replaces
/// a current one, and a cell of the same states but another config (a SOAP cell) is never
/// borrowed.
fn borrow_shared_runs(a: &ReproduceArgs, spec: PlanSpec, kinds: &[States], seeds: &[usize], file: &mut ResultsFile) -> Result<()> {
    let Some(source_table) = a.table.borrows_from() else { return Ok(()) };
    let source = read_merged(a, source_table)?;
    let mut all: Vec<usize> = seeds.iter().copied().chain(file.seeds()).chain(source.seeds()).collect();
    all.sort_unstable();
    all.dedup();
    for &k in kinds {
        for j in plan_loadable(spec, k, &cells(a.table), &all) {
            if file.find(&j.planned).is_some() {
                continue;
            }
            let theirs = Planned { key: RunKey { cell: cell_short(source_table, &j.planned.cell), ..j.planned.key.clone() }, ..j.planned };
            if let Some(r) = source.find(&theirs) {
                file.upsert(Record { cell: cell_short(a.table, &j.planned.cell), ..r.clone() });
            }
        }
    }
    Ok(())
}

/// The results file of `table` at `--scale` in `--out`, merged over the one in `--merge`
/// (the `--out` records win); an empty file where neither exists.
fn read_merged(a: &ReproduceArgs, table: Table) -> Result<ResultsFile> {
    let name = results_name(table, a.scale);
    let file = ResultsFile::load(&a.out.join(&name), table, a.scale)?;
    let Some(dir) = &a.merge else { return Ok(file) };
    if !dir.is_dir() {
        bail!("--merge {}: no such folder", dir.display());
    }
    let mut merged = ResultsFile::load(&dir.join(&name), table, a.scale)?;
    merged.merge(file);
    Ok(merged)
}

/// The exit status of a `train reproduce` whose `--deadline` left runs unstarted
/// (`EX_TEMPFAIL` of sysexits.h: nothing failed, and the same command again goes on).
pub const EXIT_RUNS_LEFT: i32 = 75;

/// `train reproduce`: the selected runs of every state kind asked for (a run shared by two
/// kinds, an FP32 or BF16 cell, once) that the results file does not hold yet, then one
/// report per kind from the file. Returns the count of runs `--deadline` left unstarted.
pub fn run(a: &ReproduceArgs) -> Result<usize> {
    let command_start = Instant::now();
    let seeds = seeds_to_run(a.seeds, a.seed_list.as_deref(), a.scale.default_seeds())?;
    let selected = select_cells(a.table, &a.cells)?;
    let spec = PlanSpec { table: a.table, scale: a.scale, configs: &a.configs, runs_root: &a.runs, extra: &a.set };
    let (path, mut file, _lock) = load_results(a)?;
    let kinds = a.states.kinds();
    borrow_shared_runs(a, spec, &kinds, &seeds, &mut file)?;
    let mut jobs: Vec<Job> = Vec::new();
    for &k in &kinds {
        for j in plan(spec, k, &selected, &seeds)? {
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
    let (mut failed, mut left): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    if !a.report_only && !todo.is_empty() {
        let gpus = if todo.iter().any(|j| j.cuda) { detect_gpus() } else { vec![] };
        let at_once = a.jobs.unwrap_or(a.scale.default_jobs(gpus.len())).max(1);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        lowbit_train::errln!(
            "reproduce: {} run(s) of {} {} ({}), {at_once} at a time on {}, logs in <run>/train.log",
            todo.len(),
            a.table.as_str(),
            a.scale.as_str(),
            seeds.iter().map(|s| format!("s{s}")).collect::<Vec<_>>().join(","),
            if gpus.is_empty() { "the CPU".to_string() } else { format!("GPU(s) {}", gpus.join(",")) }
        );
        let started = Instant::now();
        let (mut finished, mut ran) = (0usize, 0usize);
        let mut made: Vec<String> = Vec::new();
        let deadline = a.deadline.map(|s| command_start + Duration::from_secs(s));
        let expected = file.expected_run_seconds(at_once).map(Duration::from_secs_f64);
        let pool = pool::PoolSpec { jobs: at_once, gpus: gpus.clone(), threads: (cpus / at_once).max(1), deadline, expected };
        let not_started = pool::run_all(&todo, &pool, |j, rec, gpu, secs| {
            finished += 1;
            let loss = lowbit_train::output::fixed(rec.as_ref().and_then(|r| r.final_val_loss), 4);
            lowbit_train::errln!(
                "reproduce: [{finished}/{}] {} {} in {secs:.0}s{} (val loss {loss}), {:.0}s elapsed",
                todo.len(),
                j.name(a.table),
                if rec.is_some() { "done" } else { "FAILED" },
                gpu.map_or(String::new(), |g| format!(" on GPU {g}")),
                started.elapsed().as_secs_f64()
            );
            match rec {
                Some(r) => {
                    ran += 1;
                    if !made.contains(&r.states) {
                        made.push(r.states.clone());
                    }
                    file.upsert(r);
                    file.save(&path)
                }
                None => {
                    failed.push(j.name(a.table));
                    Ok(())
                }
            }
        })?;
        left = not_started.iter().map(|j| j.name(a.table)).collect();
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
    }
    if !file.runs.is_empty() {
        file.save(&path)?; // with --merge, the merged file goes beside the reports
    }
    for kind in kinds {
        let (md, info) = report_for(a, spec, kind, &seeds, &file)?;
        let out = a.out.join(kind.report_name(a.table, a.scale));
        std::fs::write(&out, &md).with_context(|| format!("cannot write {}", out.display()))?;
        lowbit_train::outln!("{md}");
        lowbit_train::errln!(
            "reproduce: wrote {} ({} of {} runs)",
            out.display(),
            info.runs_total - info.runs_missing.len(),
            info.runs_total
        );
    }
    if !left.is_empty() {
        lowbit_train::errln!(
            "reproduce: {} run(s) left by --deadline for the next command (the same command goes on with them): {}",
            left.len(),
            left.join(", ")
        );
    }
    if !failed.is_empty() {
        bail!("{} of {} runs failed or did not finish: {}", failed.len(), todo.len(), failed.join(", "));
    }
    Ok(left.len())
}

/// The report of one states kind: every cell of the table over the command's seeds and the
/// seeds the results file holds runs of (with today's configs).
fn report_for(a: &ReproduceArgs, spec: PlanSpec, kind: States, seeds: &[usize], file: &ResultsFile) -> Result<(String, RunInfo)> {
    let mut candidates: Vec<usize> = seeds.iter().copied().chain(file.seeds()).collect();
    candidates.sort_unstable();
    candidates.dedup();
    let all = plan_loadable(spec, kind, &cells(a.table), &candidates);
    let found = |j: &&Job| file.find(&j.planned).is_some();
    let shown: Vec<usize> =
        candidates.into_iter().filter(|s| seeds.contains(s) || all.iter().filter(found).any(|j| j.planned.key.seed == *s)).collect();
    let jobs: Vec<&Job> = all.iter().filter(|j| shown.contains(&j.planned.key.seed)).collect();
    let planned: Vec<Planned> = jobs.iter().map(|j| j.planned.clone()).collect();
    let kinds = if kind == States::Paper {
        let mut v = Vec::new();
        for k in [States::Paper, States::Blockwise, States::Theory] {
            let p: Vec<Planned> = plan_loadable(spec, k, &cells(a.table), &shown).into_iter().map(|j| j.planned).collect();
            v.push((k.as_str(), file.results(&p)));
        }
        v
    } else {
        vec![]
    };
    let first = jobs.iter().find_map(|j| file.find(&j.planned));
    let stale = file
        .runs
        .iter()
        .filter(|r| r.states == kind.as_str() || (kind != States::Theory && r.states == SHARED))
        .filter(|r| !all.iter().any(|j| j.planned.key == r.key() && j.planned.fingerprint == r.fingerprint))
        .count();
    let info = RunInfo {
        results_file: results_name(a.table, a.scale),
        commands: file.commands.iter().filter(|c| c.made_runs_of(kind)).cloned().collect(),
        seeds: shown,
        runs_total: jobs.len(),
        runs_missing: jobs.iter().filter(|j| !found(j)).map(|j| j.name(a.table)).collect(),
        stale,
        params: first.map(|r| r.params),
        steps: first.map(|r| r.steps),
        tokens_per_run: first.map(|r| r.tokens),
        scale_text: scale_description(a.scale),
        states_text: kind.description(),
        kinds,
    };
    Ok((render(a.table, a.scale, &file.results(&planned), &info), info))
}
