//! `train bench ...`: the benchmarks' options ([`BenchCmd`]) and their dispatch ([`run`]):
//! `data` everywhere, `optimizer`, `training` and `lm-head` in CUDA builds.

use crate::bench_data;
#[cfg(feature = "cuda")]
use crate::{bench, bench_training};
#[cfg(feature = "cuda")]
use anyhow::Context;
use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCmd {
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
        /// `model.dtype`: bf16 (weights and activations), f32, or bf16-mixed (FP32 weights and
        /// update, BF16 products and activations).
        #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32", "bf16-mixed"])]
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

/// Runs `train bench ...`: the benchmark `b` names, its table printed.
///
/// # Errors
/// The benchmark failing, or one that needs the GPU build in a CPU build.
pub fn run(b: BenchCmd) -> Result<()> {
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
            let rows = crate::bench_soap::soap(&preset, 2)?;
            lowbit_train::outln!("{}", crate::bench_soap::render(&preset, &rows));
        }
        #[cfg(feature = "cuda")]
        BenchCmd::Optimizer { preset, iters, formats, weights, .. } => {
            let (copy, rows) = bench::optimizer(&preset, iters, &formats, &weights)?;
            lowbit_train::outln!("{}", bench::render(&preset, copy, &rows));
        }
        #[cfg(feature = "cuda")]
        BenchCmd::LmHead { preset, tokens, dtype, iters } => {
            let row = crate::bench_lm_head::lm_head(&preset, tokens, &dtype, iters)?;
            lowbit_train::outln!("{}", crate::bench_lm_head::render(&row));
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
