//! `train bench data`: speed of the data pipeline alone (shard reader, tokenizer, packing
//! into sequences, the row order), as training reads it, in each of the three row orders;
//! CPU work, so it runs in every build.

use anyhow::{Context, Result};
use lowbit_data::{tokenizer_of, DataConfig, DataPosition, TrainStream};
use lowbit_train::config::RunConfig;
use std::path::Path;
use std::time::Instant;

/// One row order's timing.
#[derive(Debug, Clone)]
pub struct DataBench {
    /// The row order ([`lowbit_data::RowOrder::describe`]).
    pub order: String,
    /// Seconds from opening the stream to its first batch: the reader threads' start, the
    /// in-memory mode's reading and tokenizing of the whole text, the shuffle buffer's fill.
    pub first_batch_s: f64,
    /// Target tokens per second over the batches after the first.
    pub tokens_per_s: f64,
}

/// The `[data]` of the run config `config` (with `sets` overrides and sequences of `seq`
/// tokens) read as the training step reads it, `batches` batches of `batch` sequences, in
/// file order, shuffled as the config says (in memory when the text fits
/// `data.in_memory_max_tokens`) and streaming (the config's seed and buffer).
///
/// # Errors
/// A `batch`, `seq` or `batches` that is 0 (or `batches` 1: nothing after the first to time),
/// naming the flag; a config that does not load; data or tokenizer errors, with the file they
/// come from.
pub fn data(config: &Path, sets: &[String], batch: usize, seq: usize, batches: usize) -> Result<Vec<DataBench>> {
    for (flag, v, min) in [("--batch", batch, 1), ("--seq", seq, 1), ("--batches", batches, 2)] {
        anyhow::ensure!(v >= min, "train bench data {flag} must be at least {min}, got {v}");
    }
    let mut all = vec![format!("data.seq_len={seq}")];
    all.extend(sets.iter().cloned());
    let config = crate::config_path::resolve(config, Path::new(crate::config_path::CONFIG_DIR))?;
    let cfg = RunConfig::load(&config, &all).with_context(|| format!("bench config {}", config.display()))?;
    let tok = tokenizer_of(&cfg.data).map_err(|e| anyhow::anyhow!("{e}"))?;
    let data = cfg.data_config();
    // the shuffled order the config gives (in memory, or streaming for a larger text), then
    // streaming forced
    let orders = [
        DataConfig { shuffle: false, ..data.clone() },
        DataConfig { shuffle: true, ..data.clone() },
        DataConfig { shuffle: true, in_memory_max_tokens: 0, ..data },
    ];
    let mut out: Vec<DataBench> = Vec::new();
    for d in &orders {
        let t = Instant::now();
        let mut stream = TrainStream::new(d, &tok, DataPosition::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
        stream.next_batch(batch).map_err(|e| anyhow::anyhow!("{e}"))?;
        let first_batch_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut tokens = 0usize;
        for _ in 1..batches {
            tokens += stream.next_batch(batch).map_err(|e| anyhow::anyhow!("{e}"))?.target_tokens();
        }
        let tokens_per_s = tokens as f64 / t.elapsed().as_secs_f64();
        let order = stream.order().describe();
        if out.iter().all(|r| r.order != order) {
            out.push(DataBench { order, first_batch_s, tokens_per_s });
        }
    }
    Ok(out)
}
