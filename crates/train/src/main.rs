//! `train`: pre-train a LLaMA with low-precision AdamW states, and inspect the results.
//!
//! ```text
//! train --config configs/tiny_cpu.toml [--set optim.lr=6e-4] [--device cuda] [--resume runs/NAME|latest]
//! train predict --format bf16 --beta2 0.999 [--rounding nearest|stochastic] [--json]
//! train stalls runs/NAME [--follow] [--by group|tensor] [--state m|v|w] [--json]
//! train plot runs/A [runs/B ...] [--out DIR]
//! train reproduce --table bf16-model|fp32-model --scale smoke|h200|full [--jobs N]
//! train bench optimizer            (CUDA builds)
//! ```

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use lowbit_optim::Rounding;
use lowbit_train::{config::RunConfig, trainer, checkpoint};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "train", version, about = "Pre-train LLaMA with low-precision AdamW states and measure stalling")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Args)]
struct TrainArgs {
    /// Run config (TOML).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a config value: section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Device: cpu or cuda (overrides train.device).
    #[arg(long)]
    device: Option<String>,
    /// Resume a run folder from its newest checkpoint (`latest` = most recent run in runs/).
    #[arg(long, value_name = "RUN_DIR|latest")]
    resume: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Closed-form stalled fraction of v for a format and b2 (paper theory).
    Predict {
        /// State format: bf16, fp8, fp8e5m2, fp4, fp32 ...
        #[arg(long)]
        format: String,
        #[arg(long, default_value_t = 0.999)]
        beta2: f64,
        /// Print only this rounding's prediction.
        #[arg(long)]
        rounding: Option<Rounding>,
        #[arg(long)]
        json: bool,
    },
    /// Table of latest and running-mean stalled fractions next to the theory.
    Stalls(lowbit_train::stalls_table::StallsArgs),
    /// Plots of loss and stalling (SVG and PNG) for one or more runs.
    Plot {
        /// Run folders; more than one gives a comparison plot.
        runs: Vec<PathBuf>,
        /// Output folder (default: the run folder, or plots/ for a comparison).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run every cell of one of the paper's loss tables; write reproduce/<table>-<scale>.md.
    Reproduce(lowbit_train::reproduce::ReproduceArgs),
    /// Speed benchmarks (CUDA builds): `train bench optimizer`, `train bench training`.
    #[cfg(feature = "cuda")]
    #[command(subcommand)]
    Bench(BenchCmd),
}

/// What `train bench` times.
#[cfg(feature = "cuda")]
#[derive(Subcommand)]
enum BenchCmd {
    /// The fused optimizer step on a preset's parameter shapes, every state format.
    Optimizer {
        /// Model preset whose parameter shapes are stepped.
        #[arg(long, default_value = "llama100m")]
        preset: String,
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
    /// The whole training step (data, forward, backward, optimizer): tokens/s, MFU, peak
    /// memory and the per-phase split.
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
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Predict { format, beta2, rounding, json }) => {
            lowbit_train::predict::print(&format, beta2, rounding, json)
        }
        Some(Cmd::Stalls(args)) => lowbit_train::stalls_table::run(&args),
        Some(Cmd::Plot { runs, out }) => lowbit_train::plot::plot_command(&runs, out.as_deref()),
        Some(Cmd::Reproduce(args)) => lowbit_train::reproduce::run(&args),
        #[cfg(feature = "cuda")]
        Some(Cmd::Bench(b)) => bench(b),
        None => train(cli.train),
    }
}

#[cfg(feature = "cuda")]
fn bench(b: BenchCmd) -> Result<()> {
    use lowbit_train::{bench, bench_training};
    match b {
        BenchCmd::Optimizer { preset, iters, formats, weights } => {
            let (copy, rows) = bench::optimizer(&preset, iters, &formats, &weights)?;
            println!("{}", bench::render(&preset, copy, &rows));
        }
        BenchCmd::Training { config, preset, batch, micro_batch, seq, dtype, warmup, steps, mut sets, json } => {
            sets.insert(0, format!("model.preset={preset}"));
            let cfg = bench_training::bench_config(&config, &sets, batch, micro_batch.unwrap_or(batch), seq, &dtype)?;
            let row = bench_training::training(&cfg, warmup, steps)?;
            println!("{}\n{}", bench_training::render_header(), bench_training::render_row(&row));
            if let Some(path) = json {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                writeln!(f, "{}", serde_json::to_string(&row)?)?;
            }
        }
    }
    Ok(())
}

fn train(a: TrainArgs) -> Result<()> {
    let resume_dir = match a.resume.as_deref() {
        None => None,
        Some("latest") => Some(latest_run(Path::new("runs"))?),
        Some(d) => Some(PathBuf::from(d)),
    };
    let config_path = match (&a.config, &resume_dir) {
        (Some(c), _) => c.clone(),
        (None, Some(d)) => d.join("config.toml"),
        (None, None) => anyhow::bail!("no config: pass --config FILE (e.g. configs/tiny_cpu.toml) or --resume RUN_DIR"),
    };
    let mut set = a.set.clone();
    if let Some(d) = &a.device {
        set.push(format!("train.device=\"{d}\""));
    }
    let config = RunConfig::load(&config_path, &set)?;
    let resume_from = match &resume_dir {
        Some(d) => Some(checkpoint::latest(d)?),
        None => None,
    };
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step, writing a checkpoint (Ctrl-C again to abort)");
    })
    .context("cannot install the Ctrl-C handler")?;
    trainer::run(trainer::Launch { config, resume_from, interrupt, stop_after: None })?;
    Ok(())
}

/// The most recently modified run folder that has a checkpoint.
fn latest_run(runs: &Path) -> Result<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(runs).with_context(|| format!("cannot list {}", runs.display()))? {
        let p = e?.path();
        if let Ok(m) = std::fs::metadata(p.join("checkpoints")).and_then(|m| m.modified()) {
            if best.as_ref().is_none_or(|(t, _)| m > *t) {
                best = Some((m, p));
            }
        }
    }
    best.map(|b| b.1).with_context(|| format!("--resume latest: no run with a checkpoint in {}", runs.display()))
}
