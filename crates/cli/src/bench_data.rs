//! `train bench data`: speed of the data pipeline alone (shard reader, tokenizer, packing
//! into sequences), as training reads it; CPU work, so it runs in every build.

use lowbit_train::config::RunConfig;
use anyhow::{Context, Result};
use lowbit_data::{load_tokenizer, DataPosition, TrainStream};
use std::path::Path;
use std::time::Instant;

/// Tokens per second of the `[data]` of the run config `config` (with `sets` overrides and
/// sequences of `seq` tokens): `batches` batches of `batch` sequences read as the training
/// step reads them, timed from opening the stream (its reader threads start and work ahead:
/// a short run measures mostly their start-up; the default, 200 batches of 128 x 256, reads
/// 6.6M tokens).
///
/// # Errors
/// A zero `batch`, `seq` or `batches` (naming the flag); a config that does not load; data or
/// tokenizer errors, with the file they come from.
pub fn data(config: &Path, sets: &[String], batch: usize, seq: usize, batches: usize) -> Result<f64> {
    for (flag, v) in [("--batch", batch), ("--seq", seq), ("--batches", batches)] {
        anyhow::ensure!(v > 0, "train bench data {flag} must be at least 1, got 0");
    }
    let mut all = vec![format!("data.seq_len={seq}")];
    all.extend(sets.iter().cloned());
    let cfg = RunConfig::load(config, &all).with_context(|| format!("bench config {}", config.display()))?;
    let tok = load_tokenizer(&cfg.data.tokenizer, cfg.data.allow_download).map_err(|e| anyhow::anyhow!("{e}"))?;
    let t = Instant::now();
    let mut stream = TrainStream::new(&cfg.data, &tok, DataPosition::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut tokens = 0usize;
    for _ in 0..batches {
        let b = stream.next_batch(batch).map_err(|e| anyhow::anyhow!("{e}"))?;
        tokens += b.rows * b.seq_len;
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64())
}
