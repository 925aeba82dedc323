//! The validation loss: a batch as device tensors ([`batch_tensors`], also the step's input),
//! the token-weighted mean loss over the fixed validation batches ([`evaluate_until`]) and the
//! export check a checkpoint carries ([`ExportCheck`], [`export_check`]).

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use lowbit_data::Batch;
use lowbit_model::Llama;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;

/// File name of the [`ExportCheck`] in a checkpoint folder.
pub const EXPORT_CHECK: &str = "export_check.json";

/// One token micro-batch and the loss this model gives on it (`export_check.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportCheck {
    /// `[rows][seq_len]` input token ids.
    pub input_ids: Vec<Vec<u32>>,
    /// `[rows][seq_len]` next-token targets.
    pub targets: Vec<Vec<u32>>,
    /// `[rows][seq_len]` 1.0 where the target counts in the loss.
    pub mask: Vec<Vec<f32>>,
    /// Mean masked cross-entropy (nats/token) of the saved weights on this batch.
    pub loss: f64,
    /// Weight dtype of the model that computed `loss` ("float32" or "bfloat16").
    pub dtype: String,
}

/// Token ids, targets and loss mask of a batch as `[rows, seq_len]` tensors on `dev`: the
/// ids and the targets in one copy (views of one `[2, rows, seq_len]` u32 tensor), the mask
/// (F32) in another.
pub fn batch_tensors(b: &Batch, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    let shape = (b.rows, b.seq_len);
    let ids = Tensor::from_vec([&b.input[..], &b.target[..]].concat(), (2, b.rows, b.seq_len), dev)?;
    Ok((ids.get(0)?, ids.get(1)?, Tensor::from_slice(&b.mask, shape, dev)?))
}

/// Mean validation loss (nats per target token) over the fixed validation batches, checking
/// `stop` before each batch: `None` once it is set (an interrupt during a long validation acts
/// within one batch); `batch_done(done, total)` after each batch.
pub fn evaluate_until(
    model: &Llama,
    batches: &[Batch],
    dev: &Device,
    stop: &AtomicBool,
    batch_done: &mut dyn FnMut(usize, usize),
) -> Result<Option<f64>> {
    let (mut nll, mut count) = (0f64, 0f64);
    for (i, b) in batches.iter().enumerate() {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(None);
        }
        let (x, y, m) = batch_tensors(b, dev)?;
        let n = b.target_tokens() as f64;
        let loss = model.loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
        nll += loss * n;
        count += n;
        batch_done(i + 1, batches.len());
    }
    if count == 0.0 {
        bail!("validation set is empty: check data.validation and data.val_tokens");
    }
    Ok(Some(nll / count))
}

/// The loss of the model on the first validation micro-batch, with the batch itself, for
/// checking an exported checkpoint in `transformers` (`scripts/check_hf_export.py`).
/// `dtype`: the dtype of the exported weights, which the loss is computed in: a mixed-precision
/// model (FP32 weights, BF16 compute) is checked in FP32, as transformers loads its weights.
pub fn export_check(model: &Llama, val: &[Batch], dev: &Device, dtype: DType) -> Result<ExportCheck> {
    let b = val.first().context("validation set is empty: no batch for export_check.json")?;
    let (x, y, m) = batch_tensors(b, dev)?;
    let exported;
    let model = if model.compute_dtype() == dtype {
        model
    } else {
        exported = model.clone().with_compute_dtype(dtype)?;
        &exported
    };
    let loss = model.loss(&x, &y, &m)?.to_scalar::<f32>()? as f64;
    let rows = |v: &[u32]| v.chunks(b.seq_len).map(|r| r.to_vec()).collect::<Vec<_>>();
    Ok(ExportCheck {
        input_ids: rows(&b.input),
        targets: rows(&b.target),
        mask: b.mask.chunks(b.seq_len).map(|r| r.to_vec()).collect(),
        loss,
        dtype: if dtype == DType::BF16 { "bfloat16" } else { "float32" }.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lowbit_data::DataPosition;

    /// The ids and the targets share one copy: each view holds its own batch field, in shape.
    #[test]
    fn batch_tensors_hold_the_batch() -> Result<()> {
        let (rows, seq_len) = (3, 5);
        let b = Batch {
            rows,
            seq_len,
            input: (0..15).collect(),
            target: (100..115).collect(),
            mask: (0..15).map(|i| if i % 4 == 0 { 0.0 } else { 1.0 }).collect(),
            position: DataPosition::default(),
        };
        let (x, y, m) = batch_tensors(&b, &Device::Cpu)?;
        for t in [&x, &y, &m] {
            assert_eq!(t.dims(), [rows, seq_len]);
        }
        assert_eq!(x.flatten_all()?.to_vec1::<u32>()?, b.input);
        assert_eq!(y.flatten_all()?.to_vec1::<u32>()?, b.target);
        assert_eq!(m.flatten_all()?.to_vec1::<f32>()?, b.mask);
        Ok(())
    }
}
