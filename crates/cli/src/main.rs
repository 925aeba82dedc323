//! `train`: pre-train a LLaMA with low-precision AdamW states, and inspect the results.
//!
//! ```text
//! train --config FILE|NAME [--set section.key=value ...] [--device cpu|cuda] [--resume RUN_DIR|latest [--trust-checkpoint]] [--overwrite] [--print-config] [--gpus N]
//! train predict --format bf16 --beta2 0.999 [--rounding nearest|stochastic] [--reset-period] [--json]
//! train stalls runs/NAME [--follow] [--by group|tensor] [--state m|v|w] [--estimator updated|paper] [--window N] [--json]
//! train plot runs/A [runs/B ...] [--out DIR]
//! train reproduce --table bf16-model|fp32-model|reset-policies|stall-probe --scale smoke|h200|full [--states paper|blockwise|theory|all] [--cells LIST] [--seeds N | --seed-list LIST] [--jobs N] [--merge DIR]
//! train data fetch c4 [--train-shards N] [--val-shards M] [--config FILE] [--out DIR] [--dry-run]
//! train data tokenize --config FILE --out DIR [--level 19]
//! train bench optimizer | training | data   (optimizer and training: CUDA builds)
//! ```

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use lowbit_optim::Rounding;
use lowbit_train::config::{RunConfig, RunSection};
use lowbit_train::distributed::{self, world::World};
use lowbit_train::run_folder::FolderUse;
use lowbit_train::session::Launch;
use lowbit_train::{checkpoint, run};

#[cfg(feature = "cuda")]
use lowbit_cli::{bench, bench_training};
use lowbit_cli::{
    bench_data, config_path, fetch, launcher, plot, predict, progress, reset_period_plot, signals, stall_probe_plot, stalls_table, tokenize,
};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

// The device support compiled in, for `train --version`.
#[cfg(feature = "nccl")]
macro_rules! devices {
    () => {
        "CUDA + NCCL"
    };
}
#[cfg(all(feature = "cuda", not(feature = "nccl")))]
macro_rules! devices {
    () => {
        "CUDA"
    };
}
#[cfg(not(feature = "cuda"))]
macro_rules! devices {
    () => {
        "CPU only"
    };
}

/// `train --version`: the crate version, the git commit it was built from (build.rs) and the
/// device support compiled in, e.g. `train 0.1.0 (commit 1fdf9f9c0a1b, CPU only)`.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("LOWBIT_GIT_COMMIT"), ", ", devices!(), ")");

#[derive(Parser)]
#[command(name = "train", version = VERSION, about = "Pre-train LLaMA with low-precision AdamW states and measure stalling")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Args)]
struct TrainArgs {
    /// Run config (TOML): a path, or a bare name looked up under configs/ (`tiny_cpu`).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a config value: section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu or cuda (overrides train.device).
    #[arg(long)]
    device: Option<String>,
    /// Resume a run folder from its newest checkpoint, writing into that folder (`latest` =
    /// the most recent run with a checkpoint in run.dir).
    #[arg(long, value_name = "RUN_DIR|latest", conflicts_with = "overwrite")]
    resume: Option<String>,
    /// With --resume: accept a checkpoint that has no manifest.json (written before
    /// checkpoints had checksums, or its manifest lost); its files are loaded unverified.
    #[arg(long, requires = "resume")]
    trust_checkpoint: bool,
    /// Start a new run even if the run folder holds one: the old folder is moved aside to
    /// `<name>.old-<N>` (nothing is deleted).
    #[arg(long)]
    overwrite: bool,
    /// Print the resolved config (defaults < file < --set) and exit.
    #[arg(long)]
    print_config: bool,
    /// Data-parallel training with N worker processes on this host (one per GPU), supervised
    /// by this one; the global batch stays micro_batch x grad_accum sequences, each worker
    /// accumulating grad_accum / N micro-batches (N must divide train.grad_accum).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    gpus: Option<u32>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Closed-form stalled fraction of v for a format and b2, and its reset period (paper theory).
    Predict {
        /// State format: bf16, fp8, fp8e5m2, fp4, fp32 ...
        #[arg(long)]
        format: String,
        #[arg(long, default_value_t = 0.999, allow_negative_numbers = true)]
        beta2: f64,
        /// Print only this rounding's prediction.
        #[arg(long)]
        rounding: Option<Rounding>,
        /// Also print the paper's reset period K* (Prop. 5.2) at s0 = 0.6, 0.5 and 0.7.
        #[arg(long)]
        reset_period: bool,
        #[arg(long)]
        json: bool,
    },
    /// Table of latest and running-mean stalled fractions next to the theory.
    Stalls(stalls_table::StallsArgs),
    /// Plots of loss and stalling (SVG and PNG) for one or more runs, or from `train
    /// reproduce`'s results the paper's Fig. 4 (`--reset-periods`) or its simulated-stalling
    /// probe (`--stall-probe`).
    #[command(group(clap::ArgGroup::new("from_results").args(["reset_periods", "stall_probe"])))]
    Plot {
        /// Run folders; more than one gives a comparison plot.
        runs: Vec<PathBuf>,
        /// Output folder (default: the run folder, or plots/ for a comparison; the results
        /// folder for `--reset-periods`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Instead of runs: the paper's Fig. 4 (final validation loss of SR + resets against
        /// the reset period K, per format) of this reproduce scale, from the main table's
        /// records and the `<fmt>_period_<K>` ablations' under `--results`.
        #[arg(long, value_name = "SCALE", conflicts_with = "runs")]
        reset_periods: Option<lowbit_reproduce::Scale>,
        /// Instead of runs: the paper's section 3.3 (final validation loss of FP32 states whose
        /// m or v write-backs are skipped with probability p, against p, each format's theory
        /// stalled fraction marked) of this reproduce scale, from the stall-probe results under
        /// `--results` (`train reproduce --table stall-probe` draws it too).
        #[arg(long, value_name = "SCALE", conflicts_with = "runs")]
        stall_probe: Option<lowbit_reproduce::Scale>,
        /// The folder of `train reproduce`'s results, for `--reset-periods` and `--stall-probe`.
        #[arg(long, default_value = "reproduce", requires = "from_results")]
        results: PathBuf,
    },
    /// Run the cells of one of the paper's loss tables (or a subset); merge the finished runs into
    /// `reproduce/<table>-<scale>-results.json` and render `reproduce/<table>-<scale>.md` from it.
    Reproduce(lowbit_reproduce::ReproduceArgs),
    /// Corpora: `train data fetch c4` (C4 `en` and the T5 tokenizer from the Hugging Face hub),
    /// `train data tokenize` (a config's shards tokenized once into token shards).
    #[command(subcommand)]
    Data(DataCmd),
    /// Speed benchmarks: `train bench data`; with a CUDA build also `train bench optimizer`,
    /// `train bench training`, `train bench lm-head`.
    #[command(subcommand)]
    Bench(BenchCmd),
}

/// What `train data` does.
#[derive(Subcommand)]
enum DataCmd {
    /// Download a corpus from the Hugging Face hub into data/local/.
    #[command(subcommand)]
    Fetch(FetchCmd),
    /// Tokenize a config's train and validation shards into token shards (`NAME.tokens.zst`,
    /// zstd-compressed ids with a header naming the tokenizer), which `data.train` and
    /// `data.validation` can point at instead: no tokenizing at start, ~1.5x smaller.
    Tokenize(tokenize::TokenizeArgs),
}

/// What `train data fetch` downloads.
#[derive(Subcommand)]
enum FetchCmd {
    /// C4 `en` shards (`allenai/c4`) and the T5 tokenizer into data/local/c4/, where the paper
    /// configs look: as many train shards as `--config`'s tokens need (printed), files already
    /// there skipped, sizes printed first, interrupted downloads resumed by the same command.
    /// Honours HF_ENDPOINT, HF_TOKEN / HF_HOME's token and HF_HUB_OFFLINE.
    C4(fetch::C4Args),
}

/// What `train bench` times.
#[derive(Subcommand)]
enum BenchCmd {
    /// The fused optimizer step on a preset's parameter shapes, every state format; with
    /// `--optimizer soap` SOAP's step beside AdamW's (memory, refresh cost).
    #[cfg(feature = "cuda")]
    Optimizer {
        /// Model preset whose parameter shapes are stepped.
        #[arg(long, default_value = "llama100m")]
        preset: String,
        /// `adamw` (every state format, scale kind and rounding) or `soap` (SOAP beside AdamW,
        /// FP32 / BF16 / FP8 / FP4 states, BF16 weights, two refresh intervals).
        #[arg(long, default_value = "adamw", value_parser = ["adamw", "soap"])]
        optimizer: String,
        /// Timed steps per configuration.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Only these m formats (comma-separated, e.g. `fp8e4m3,bf16`); default: all.
        #[arg(long, value_delimiter = ',')]
        formats: Vec<String>,
        /// Only these weight dtypes (`f32`, `bf16`); default: both.
        #[arg(long, value_delimiter = ',')]
        weights: Vec<String>,
    },
    /// The data pipeline alone, as training reads it (shard reader, tokenizer, packing into
    /// sequences), in file order, in memory and streaming: the seconds to the first batch,
    /// then tokens/s over the other `--batches - 1` batches.
    Data {
        /// Run config (its `[data]` section; `--set` overrides it). The default reads the
        /// bundled sample with the T5 tokenizer, as the paper's configs read C4.
        #[arg(long, default_value = "configs/tiny_cpu.toml")]
        config: PathBuf,
        /// Sequences per batch.
        #[arg(long, default_value_t = 128)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 256)]
        seq: usize,
        /// Timed batches.
        #[arg(long, default_value_t = 200)]
        batches: usize,
        /// Config overrides, `section.key=value` (e.g. `data.train=[...]`).
        #[arg(long = "set")]
        sets: Vec<String>,
    },
    /// The whole training step (data, forward, backward, optimizer): tokens/s, MFU, peak
    /// memory and the per-phase split.
    #[cfg(feature = "cuda")]
    Training {
        /// Run config (its states, data and model; the flags below override it).
        #[arg(long, default_value = "configs/llama100m_fp8_sr_reset.toml")]
        config: PathBuf,
        /// Model preset.
        #[arg(long, default_value = "llama100m")]
        preset: String,
        /// Sequences per optimizer step.
        #[arg(long, default_value_t = 128)]
        batch: usize,
        /// Sequences per forward/backward (default: --batch).
        #[arg(long)]
        micro_batch: Option<usize>,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 256)]
        seq: usize,
        /// Weight and activation dtype: bf16 or f32.
        #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32"])]
        dtype: String,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        /// Steps per timed window (two windows: throughput, then the phase split).
        #[arg(long, default_value_t = 10)]
        steps: u64,
        /// Config overrides, `section.key=value` (e.g. `model.kernels=composed`).
        #[arg(long = "set")]
        sets: Vec<String>,
        /// Also append the result as one JSON line to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The training pass's LM head and loss at a preset's shape, the loss gradient with rows
    /// of logits kept in shared memory against rows read twice (the same bits): ms per call.
    #[cfg(feature = "cuda")]
    LmHead {
        /// Model preset (its hidden size; T5's vocabulary of 32,100).
        #[arg(long, default_value = "llama20m")]
        preset: String,
        /// Rows: tokens per step (128 x 256 by default).
        #[arg(long, default_value_t = 32768)]
        tokens: usize,
        /// Weight and activation dtype: bf16 or f32.
        #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32"])]
        dtype: String,
        /// Calls per timed window (7 windows per variant, alternating).
        #[arg(long, default_value_t = 5)]
        iters: usize,
    },
    /// `optimizer`, `training`, `lm-head`: need a CUDA build.
    #[cfg(not(feature = "cuda"))]
    #[command(external_subcommand)]
    Gpu(Vec<String>),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // a closed stderr (`train ... 2>&1 | head`) must not stop the run: tracing's own
        // report of the failed write would go to the same stderr with eprintln! and panic
        .log_internal_errors(false)
        .init();
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            lowbit_train::errln!("{}error: {e:#}", rank_prefix());
            std::process::exit(1);
        }
    }
}

/// A run that stopped on a fault it can go on from says how: its folder could not take a
/// write (the disk full, a file size limit, a read-only or unwritable folder: free space or make
/// it writable), or the GPU ran out of memory (another process took it, or the config needs
/// more than the up-front check counts: lower the micro-batch); then resume from the newest
/// checkpoint, which such a stop never damages (a checkpoint is written into `step_N.tmp/` and
/// renamed when complete). Other errors pass unchanged.
fn with_way_on(e: anyhow::Error, run_dir: &Path) -> anyhow::Error {
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
        Err(_) => "the run cannot be continued (it has no checkpoint yet): run its command again with --overwrite".into(),
    };
    anyhow::anyhow!("{e:#}. {what}; {then}")
}

/// `rank N: ` in a data-parallel worker other than rank 0, so that an error every rank hits
/// reads as rank 0's with the others' copies attributed; empty otherwise.
fn rank_prefix() -> String {
    match std::env::var("RANK") {
        Ok(r) if r.trim() != "0" => format!("rank {}: ", r.trim()),
        _ => String::new(),
    }
}

/// The command's exit status: 0 done, 130 / 143 a training run stopped by an interrupt with a
/// checkpoint (see [`train`]), 75 runs that `reproduce --deadline` left unstarted
/// ([`lowbit_reproduce::EXIT_RUNS_LEFT`]); an error exits 1.
fn real_main() -> Result<i32> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Predict { format, beta2, rounding, reset_period, json }) => predict::print(&format, beta2, rounding, reset_period, json)?,
        Some(Cmd::Stalls(args)) => stalls_table::run(&args)?,
        Some(Cmd::Plot { out, reset_periods: Some(scale), results, .. }) => {
            for f in reset_period_plot::plot_reset_periods(&results, scale, out.as_deref().unwrap_or(&results))? {
                println!("{}", f.display());
            }
        }
        Some(Cmd::Plot { out, stall_probe: Some(scale), results, .. }) => {
            for f in stall_probe_plot::plot_stall_probe(&results, scale, out.as_deref().unwrap_or(&results))? {
                println!("{}", f.display());
            }
        }
        Some(Cmd::Plot { runs, out, .. }) => plot::plot_command(&runs, out.as_deref())?,
        Some(Cmd::Reproduce(args)) => {
            let ran = lowbit_reproduce::run(&args, env!("LOWBIT_GIT_COMMIT").trim_start_matches("commit "));
            if let (Some(lowbit_reproduce::Table::StallProbe), Some(scale)) = (args.table, args.scale) {
                // the figure from whatever the results file holds, also after a failed run
                match stall_probe_plot::plot_stall_probe(&args.out, scale, &args.out) {
                    Ok(files) => files.iter().for_each(|f| lowbit_train::errln!("reproduce: wrote {}", f.display())),
                    Err(e) => lowbit_train::errln!("reproduce: no stall-probe figure: {e:#}"),
                }
            }
            if ran? > 0 {
                return Ok(lowbit_reproduce::EXIT_RUNS_LEFT);
            }
        }
        Some(Cmd::Data(DataCmd::Fetch(FetchCmd::C4(args)))) => fetch::fetch_c4(&args)?,
        Some(Cmd::Data(DataCmd::Tokenize(args))) => tokenize::tokenize(&args)?,
        Some(Cmd::Bench(b)) => bench(b)?,
        None => return train(cli.train),
    }
    Ok(0)
}

fn bench(b: BenchCmd) -> Result<()> {
    match b {
        #[cfg(not(feature = "cuda"))]
        BenchCmd::Gpu(args) => anyhow::bail!(
            "train bench {} needs the GPU build: cargo build --release -p lowbit-cli --features cuda, with \
             CUDA set up as docs/gpu.md says (this binary was built without the `cuda` feature; \
             `train bench data` runs here)",
            args.first().map_or("", String::as_str)
        ),
        #[cfg(feature = "cuda")]
        BenchCmd::Optimizer { preset, optimizer, .. } if optimizer == "soap" => {
            let rows = lowbit_cli::bench_soap::soap(&preset, 2)?;
            lowbit_train::outln!("{}", lowbit_cli::bench_soap::render(&preset, &rows));
        }
        #[cfg(feature = "cuda")]
        BenchCmd::Optimizer { preset, iters, formats, weights, .. } => {
            let (copy, rows) = bench::optimizer(&preset, iters, &formats, &weights)?;
            lowbit_train::outln!("{}", bench::render(&preset, copy, &rows));
        }
        #[cfg(feature = "cuda")]
        BenchCmd::LmHead { preset, tokens, dtype, iters } => {
            let row = lowbit_cli::bench_lm_head::lm_head(&preset, tokens, &dtype, iters)?;
            lowbit_train::outln!("{}", lowbit_cli::bench_lm_head::render(&row));
        }
        BenchCmd::Data { config, batch, seq, batches, sets } => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            lowbit_train::outln!("data pipeline, {batches} batches of {batch} x {seq}, {threads} CPU threads:");
            for r in bench_data::data(&config, &sets, batch, seq, batches)? {
                lowbit_train::outln!("  {:>12.0} tokens/s after a first batch in {:6.2} s: {}", r.tokens_per_s, r.first_batch_s, r.order);
            }
        }
        #[cfg(feature = "cuda")]
        BenchCmd::Training { config, preset, batch, micro_batch, seq, dtype, warmup, steps, mut sets, json } => {
            sets.insert(0, format!("model.preset={preset}"));
            let cfg = bench_training::bench_config(&config, &sets, batch, micro_batch.unwrap_or(batch), seq, &dtype)?;
            let row = bench_training::training(&cfg, warmup, steps)?;
            lowbit_train::outln!("{}\n{}", bench_training::render_header(), bench_training::render_row(&row));
            if let Some(path) = json {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                writeln!(f, "{}", serde_json::to_string(&row)?)?;
            }
        }
    }
    Ok(())
}

/// Train (or resume) and return the exit status: 0 when the run finished (or had nothing to
/// do), 128 + the signal (130 SIGINT, 143 SIGTERM) when it stopped early on an interrupt with a
/// checkpoint written: this process's signal, or 143 when a peer rank's signal stopped it (every
/// rank of an interrupted job exits 130 / 143). `--gpus N`: the workers' status
/// ([`launcher::supervise`]).
fn train(a: TrainArgs) -> Result<i32> {
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
    if a.print_config {
        lowbit_train::out!("{}", config.to_toml());
        return Ok(0);
    }
    let resume_from = match &resume_dir {
        Some(d) => Some(checkpoint::latest(d)?),
        None => None,
    };
    let interrupt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signals::install(interrupt.clone())?;
    if let Some(n) = a.gpus.filter(|&n| n > 1) {
        if std::env::var_os("WORLD_SIZE").is_some() {
            anyhow::bail!("--gpus {n} inside a data-parallel launch (WORLD_SIZE is set): use one or the other");
        }
        // what every worker would refuse, said once before any starts
        config.train.accum_per_rank(n as usize).with_context(|| format!("--gpus {n}"))?;
        if config.train.device != "cpu" {
            if let Some(why) = distributed::gpu_ranks_refused(n as usize) {
                anyhow::bail!("--gpus {n} with train.device = {:?}: {why}", config.train.device);
            }
        }
        let exe = std::env::current_exe().context("cannot find this binary to start the workers")?;
        let args = launcher::worker_args(&std::env::args_os().skip(1).collect::<Vec<_>>());
        let workers = launcher::spawn(&exe, &args, n as usize, launcher::free_port()?)?;
        return launcher::supervise(workers, &interrupt, || signals::received().unwrap_or(libc::SIGTERM));
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
    let out = run::run(launch, &mut progress::Bar::new()).map_err(|e| with_way_on(e, &run_dir))?;
    if let Some(done) = out.already_finished.filter(|_| world.rank == 0) {
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
    Ok(if out.stopped_early { 128 + signals::received().unwrap_or(libc::SIGTERM) } else { 0 })
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
