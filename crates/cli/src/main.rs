//! `train`: pre-train a LLaMA with low-precision AdamW states, and inspect the results.
//!
//! ```text
//! train --config FILE|NAME [--set section.key=value ...] [--device cpu|cuda] [--resume RUN_DIR|latest [--trust-checkpoint]] [--overwrite] [--print-config] [--gpus N]
//! train predict --format bf16 --beta2 0.999 [--rounding nearest|stochastic] [--reset-period] [--json]
//! train stalls runs/NAME [--follow] [--by group|tensor] [--state m|v|w] [--estimator updated|paper] [--window N] [--json]
//! train plot runs/A [runs/B ...] [--out DIR]
//! train reproduce --table bf16-model|fp32-model|reset-policies|stall-probe --scale smoke|h200|full [--states paper|blockwise|theory|all] [--cells LIST] [--seeds N | --seed-list LIST] [--jobs N] [--merge DIR]
//! train data fetch c4 [--train-shards N] [--val-shards M] [--config FILE] [--out DIR] [--dry-run]
//! train data fetch fineweb-edu [--train-shards N] [--val-shards M] [--config FILE] [--out DIR] [--dry-run]
//! train data tokenize --config FILE --out DIR [--level 19]
//! train bench optimizer | training | data   (optimizer and training: CUDA builds)
//! ```

use anyhow::Result;
use clap::{Parser, Subcommand};
use lowbit_cli::bench_cmd::{self, BenchCmd};
use lowbit_cli::train::{self, TrainArgs};
use lowbit_cli::{fetch, plot, predict, reset_period_plot, stall_probe_plot, stalls_table, tokenize};
use lowbit_optim::Rounding;
use std::io::IsTerminal;
use std::path::PathBuf;

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

#[derive(Subcommand)]
enum Cmd {
    /// Closed-form stalled fraction of v for a format and b2, and its reset period (paper theory).
    Predict {
        /// State format: bf16, fp8, fp8e5m2, fp4, fp32 ...
        #[arg(long)]
        format: String,
        /// Second-moment decay b2.
        #[arg(long, default_value_t = 0.999, allow_negative_numbers = true)]
        beta2: f64,
        /// Print only this rounding's prediction: nearest (rne), stochastic (sr) or dither
        /// (derived here, not the paper's: docs/stalls.md); without it, nearest / stochastic.
        #[arg(long)]
        rounding: Option<Rounding>,
        /// Also print the paper's reset period K* (Prop. 5.2, derived for nearest rounding of
        /// v) at s0 = 0.6, 0.5 and 0.7.
        #[arg(long)]
        reset_period: bool,
        /// One JSON object (every rounding's prediction) instead of text.
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
    /// Corpora: `train data fetch c4` / `fineweb-edu` (C4 `en` and the T5 tokenizer, or
    /// FineWeb-Edu's parquet files, from the Hugging Face hub), `train data tokenize` (a
    /// config's shards tokenized once into token shards).
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
    /// FineWeb-Edu's `sample-10BT` parquet files (`HuggingFaceFW/fineweb-edu`, 13 training
    /// files of ~2.15 GB, ~700M tokens each, and a last one of 0.54 GB held out for
    /// validation) into data/local/fineweb-edu/{train,validation}/, where
    /// configs/llama100m_fp8_sr_reset_fineweb.toml looks: as many training files as
    /// `--config`'s tokens need, otherwise as `c4`; `--dry-run` asks the hub nothing.
    #[command(name = "fineweb-edu")]
    FinewebEdu(fetch::FinewebEduArgs),
}

/// What `train bench` times.
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
        Some(Cmd::Data(DataCmd::Fetch(FetchCmd::FinewebEdu(args)))) => fetch::fetch_fineweb_edu(&args)?,
        Some(Cmd::Data(DataCmd::Tokenize(args))) => tokenize::tokenize(&args)?,
        Some(Cmd::Bench(b)) => bench_cmd::run(b)?,
        None => return train::command(cli.train),
    }
    Ok(0)
}
