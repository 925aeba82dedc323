//! Muon's weight update from the orthogonalised update O, over candle tensors (the CPU
//! reference and the CUDA path run the same operations): decoupled weight decay, then the step
//! scaled as [`crate::rules::muon::MuonConfig::lr_factor`] says,
//! ```text
//! W = W * (1 - lr wd) - (lr * update_rms * sqrt(max(rows, cols))) * O      (in FP32)
//! ```
//! BF16 weights are rounded to nearest (candle's conversion) and their stalls counted as
//! AdamW's are ([`crate::states::stalls`]: updated when the FP32 value changed, unchanged when
//! the stored BF16 value did not).

use candle_core::{DType, Result, Tensor, Var};

/// Update `var` (F32 or BF16, any shape of `o`'s element count) from the orthogonalised update
/// `o` (F32): `W = W * decay - step * O`, `decay = 1 - lr wd` and `step` the scaled learning
/// rate. Returns, for BF16 weights, their counts as a U32 tensor `[updated, stalled, unchanged]`
/// on `var`'s device (read when wanted: on a GPU, reading waits for the device); `None` for F32
/// weights (written exactly). `keep` (U8, one element, on `var`'s device: the device clip's
/// decision, `rules::clip::GradScale::Device`): 0 leaves the weights as they are and counts
/// nothing (a skipped update); `None`: the update is applied.
///
/// # Errors
/// A weight dtype other than F32 or BF16, or a tensor operation failing.
pub fn apply_update(var: &Var, o: &Tensor, decay: f32, step: f32, keep: Option<&Tensor>) -> Result<Option<Tensor>> {
    let w = var.as_tensor();
    let old = w.to_dtype(DType::F32)?;
    let mut new = (old.affine(f64::from(decay), 0.0)? - o.reshape(w.shape())?.affine(f64::from(step), 0.0)?)?;
    if let Some(keep) = keep {
        new = keep.broadcast_as(w.shape())?.where_cond(&new, &old)?;
    }
    match w.dtype() {
        DType::F32 => {
            var.set(&new)?;
            Ok(None)
        }
        DType::BF16 => {
            let code = new.to_dtype(DType::BF16)?;
            let changed = new.ne(&old)?;
            let same = code.eq(w)?;
            let stalled = (&changed * &same)?;
            let sum = |t: &Tensor| t.to_dtype(DType::U32)?.sum_all();
            let mut counts = Tensor::stack(&[sum(&changed)?, sum(&stalled)?, sum(&same)?], 0)?;
            if let Some(keep) = keep {
                counts = counts.broadcast_mul(&keep.to_dtype(DType::U32)?)?; // (a skipped update counts nothing)
            }
            var.set(&code)?;
            Ok(Some(counts))
        }
        d => candle_core::bail!("Muon: weights of dtype {d:?} (F32 or BF16)"),
    }
}
