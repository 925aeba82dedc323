//! `train bench lm-head` (CUDA builds): the training pass's LM head and loss
//! (`lowbit_model::fused::lm_head::loss_and_grads_staging`: per chunk of 4096 rows the logits
//! product, the loss gradient, and the products for dh and dW) at a preset's shape, once with
//! the loss gradient keeping each row of logits in shared memory (read once) and once reading
//! every row twice, alternating in the same process: milliseconds per call, the median of
//! `REPEATS` (7) windows of `iters` calls each. The two give the same bits (`fused_parity`), so
//! the difference is the time of the second read.

use crate::bench::{median, REPEATS};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use lowbit_model::fused::lm_head;
use lowbit_model::LlamaConfig;
use std::time::Instant;

/// The two variants at one shape.
#[derive(Debug, Clone)]
pub struct LmHeadRow {
    pub preset: String,
    pub dtype: String,
    /// Rows (tokens per step), hidden size, vocabulary.
    pub rows: usize,
    pub hidden: usize,
    pub vocab: usize,
    /// Bytes of the logits one call writes (rows x vocabulary padded to 8, in `dtype`).
    pub logits_bytes: u64,
    /// Shared memory per block of the staged loss gradient (one row).
    pub staged_bytes: usize,
    /// Milliseconds per call with rows kept in shared memory, and with every row read twice.
    pub staged_ms: f64,
    pub twice_ms: f64,
}

/// Times both variants for `preset` (T5 vocabulary) at `rows` tokens in `dtype` (`bf16` or
/// `f32`), `iters` calls per window.
///
/// # Errors
/// Zero rows or calls, an unknown preset or dtype, no CUDA device, or rows of logits too long
/// to stay in shared memory (T5's vocabulary in FP32): both variants would be the same kernel.
pub fn lm_head(preset: &str, rows: usize, dtype: &str, iters: usize) -> Result<LmHeadRow> {
    anyhow::ensure!(rows > 0 && iters > 0, "train bench lm-head: --tokens and --iters must be > 0");
    let cfg = LlamaConfig::preset(preset, 32100).with_context(|| format!("unknown preset {preset}"))?;
    let dt = match dtype {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        d => anyhow::bail!("train bench lm-head: dtype {d:?}: bf16 or f32"),
    };
    let cuda = lowbit_train::device::open_cuda(0).context("bench needs a CUDA device")?;
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let staged_bytes = lm_head::staged_row_bytes(&cuda, v, dt)?.with_context(|| {
        format!("train bench lm-head: rows of {v} {dtype} logits do not fit in shared memory, so both variants read them twice")
    })?;
    let dev = Device::Cuda(cuda);
    let hidden = Tensor::randn(0f32, 1.0, (rows, h), &dev)?.to_dtype(dt)?;
    let w = Tensor::randn(0f32, 0.02, (v, h), &dev)?.to_dtype(dt)?;
    let target = Tensor::from_vec((0..rows).map(|i| ((i * 7919) % v) as u32).collect::<Vec<_>>(), rows, &dev)?;
    let weight = Tensor::full(1.0 / rows as f32, rows, &dev)?;
    let call = |stage: bool| lm_head::loss_and_grads_staging(&hidden, &w, &target, &weight, 1.0, stage).map(drop);
    for stage in [true, false, true, false] {
        call(stage)?; // warm-up: modules loaded, memory pool grown
    }
    dev.synchronize()?;
    let (mut staged, mut twice) = (Vec::with_capacity(REPEATS), Vec::with_capacity(REPEATS));
    for repeat in 0..REPEATS {
        // which variant goes first alternates from window pair to window pair
        let order = if repeat % 2 == 0 { [true, false] } else { [false, true] };
        for stage in order {
            let t = Instant::now();
            for _ in 0..iters {
                call(stage)?;
            }
            dev.synchronize()?;
            let ms = 1e3 * t.elapsed().as_secs_f64() / iters as f64;
            if stage {
                staged.push(ms)
            } else {
                twice.push(ms)
            }
        }
    }
    Ok(LmHeadRow {
        preset: preset.into(),
        dtype: dtype.into(),
        rows,
        hidden: h,
        vocab: v,
        logits_bytes: (rows * v.div_ceil(8) * 8 * dt.size_in_bytes()) as u64,
        staged_bytes,
        staged_ms: median(staged),
        twice_ms: median(twice),
    })
}

/// One line for a row.
pub fn render(r: &LmHeadRow) -> String {
    format!(
        "LM head + loss, {} ({} rows x {} hidden, vocabulary {}, {}; {:.2} GB of logits per call): rows kept in shared \
         memory ({} B per block) {:.3} ms, rows read twice {:.3} ms ({:+.3} ms, {:.3}x)",
        r.preset,
        r.rows,
        r.hidden,
        r.vocab,
        r.dtype,
        r.logits_bytes as f64 / 1e9,
        r.staged_bytes,
        r.staged_ms,
        r.twice_ms,
        r.staged_ms - r.twice_ms,
        r.twice_ms / r.staged_ms
    )
}
