//! Masked next-token cross-entropy over a batch's logits (the composed model's loss and the
//! reference of the fused LM head, `crate::fused::lm_head`).
//!
//! On CPU the per-row loss and its gradient are custom ops (one rayon-parallel pass over the
//! logits each way, rows with mask 0 skipped); on other devices the same math is composed
//! from candle tensor ops. Both are differentiable w.r.t. the logits and agree to f32
//! rounding.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Mean negative log-likelihood over the positions where `mask` is nonzero:
/// `sum(mask · nll) / sum(mask)` with `nll = logsumexp(logits) − logits[target]`.
///
/// * `logits`: `[B, T, V]`, any float dtype (cast to f32 first; all math in f32).
/// * `target`: `[B, T]` u32 token ids `< V` (entries under a zero mask are not read on CPU).
/// * `mask`: `[B, T]` f32, 1 = position counts, 0 = ignored (fractional weights also work).
///
/// Returns an f32 scalar; 0 when the mask is all zeros. Differentiable w.r.t. `logits`.
/// Errors: a target `>= V` under a nonzero mask (CPU).
pub fn masked_cross_entropy(logits: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, t, v) = logits.dims3()?;
    let n = b * t;
    let (target, mask, denom) = flat_targets(target, mask, n)?;
    let logits = logits.to_dtype(DType::F32)?;
    let weighted_nll = if logits.device().is_cpu() {
        // No reshape of the logits here: every node on the [B, T, V] path costs candle's
        // backward a zeros + add over the whole tensor.
        logits.contiguous()?.apply_op3(&target.contiguous()?, &mask.contiguous()?, WeightedNll)?
    } else {
        (nll_composed(&logits.reshape((n, v))?, &target)? * &mask)?
    };
    weighted_nll.sum_all()? / denom
}

/// `target` as u32 `[n]` and the per-row weights of the mean loss, `mask / Σ mask` (F32 `[n]`,
/// no gradient).
#[cfg(feature = "cuda")]
pub(crate) fn flat_weights(target: &Tensor, mask: &Tensor, n: usize) -> Result<(Tensor, Tensor)> {
    let (target, mask, denom) = flat_targets(target, mask, n)?;
    Ok((target, mask.broadcast_div(&denom)?))
}

/// `target` as u32 `[n]`, `mask` as F32 `[n]` (detached) and the loss's denominator
/// `max(sum(mask), f32::MIN_POSITIVE)` (a scalar tensor).
fn flat_targets(target: &Tensor, mask: &Tensor, n: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let target = target.to_dtype(DType::U32)?.reshape(n)?;
    let mask = mask.to_dtype(DType::F32)?.reshape(n)?.detach();
    let denom = mask.sum_all()?.maximum(f32::MIN_POSITIVE)?;
    Ok((target, mask, denom))
}

/// Per-row `logsumexp(logits) − logits[target]`, `[N, V]`, `[N]` → `[N]`, composed ops.
fn nll_composed(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let n = target.elem_count();
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let picked = shifted.gather(&target.reshape((n, 1))?, D::Minus1)?;
    (lse - picked)?.reshape(n)
}

fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("cross-entropy: {what} must be contiguous f32"),
    }
}

fn u32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::U32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("cross-entropy: target must be contiguous u32"),
    }
}

/// The cross-entropy's inputs as slices: `(logits, target, weight, V)`.
type CeInputs<'a> = (&'a [f32], &'a [u32], &'a [f32], usize);

/// Checks shapes and targets; returns `(logits, target, weight, V)`.
fn ce_inputs<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
    s3: &'a CpuStorage,
    l3: &Layout,
) -> Result<CeInputs<'a>> {
    let v = l1.shape().dims().last().copied().unwrap_or(0);
    let n = l1.shape().elem_count() / v.max(1);
    let x = f32_slice(s1, l1, "logits")?;
    let tgt = u32_slice(s2, l2)?;
    let w = f32_slice(s3, l3, "mask")?;
    if tgt.len() != n || w.len() != n {
        candle_core::bail!("cross-entropy: {n} rows but {} targets and {} mask entries", tgt.len(), w.len());
    }
    if let Some((i, &bad)) = tgt.iter().zip(w).enumerate().find(|(_, (&t, &m))| m != 0.0 && t as usize >= v).map(|(i, (t, _))| (i, t)) {
        candle_core::bail!("cross-entropy: target {bad} at row {i} is out of range for vocab {v}");
    }
    Ok((x, tgt, w, v))
}

/// `log Σ exp(row)`, max-shifted for stability.
fn logsumexp(row: &[f32]) -> f32 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f32 = row.iter().map(|&x| (x - m).exp()).sum();
    m + s.ln()
}

/// Row-wise `mask_i · (logsumexp(x_i) − x_i[t_i])` on CPU; backward via [`WeightedNllGrad`].
struct WeightedNll;

impl CustomOp3 for WeightedNll {
    fn name(&self) -> &'static str {
        "lowbit-weighted-nll"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, tgt, w, v) = ce_inputs(s1, l1, s2, l2, s3, l3)?;
        let out: Vec<f32> = x
            .par_chunks(v)
            .zip(tgt.par_iter().zip(w.par_iter()))
            .map(|(row, (&t, &m))| if m == 0.0 { 0.0 } else { m * (logsumexp(row) - row[t as usize]) })
            .collect();
        let n = out.len();
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        target: &Tensor,
        mask: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let weight = (mask * grad_res)?.contiguous()?;
        let g = logits.apply_op3_no_bwd(target, &weight, &WeightedNllGrad)?;
        Ok((Some(g), None, None))
    }
}

/// `∂/∂x_i = w_i · (softmax(x_i) − onehot(t_i))` on CPU, `[N, V]`.
struct WeightedNllGrad;

impl CustomOp3 for WeightedNllGrad {
    fn name(&self) -> &'static str {
        "lowbit-weighted-nll-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, tgt, w, v) = ce_inputs(s1, l1, s2, l2, s3, l3)?;
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(v).zip(x.par_chunks(v)).zip(tgt.par_iter().zip(w.par_iter())).for_each(|((o, row), (&t, &m))| {
            if m == 0.0 {
                return;
            }
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0f32;
            for (oi, &xi) in o.iter_mut().zip(row) {
                let e = (xi - mx).exp();
                *oi = e;
                s += e;
            }
            let scale = m / s;
            for oi in o.iter_mut() {
                *oi *= scale;
            }
            o[t as usize] -= m;
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The fused CPU path and the composed path agree in value and gradient.
    #[test]
    fn fused_matches_composed() -> Result<()> {
        let dev = Device::Cpu;
        let (n, v) = (6, 11);
        let data: Vec<f32> = (0..n * v).map(|i| ((i * 7919 % 103) as f32 / 13.0) - 3.0).collect();
        let x = Var::from_vec(data, (n, v), &dev)?;
        let target = Tensor::new(&[3u32, 0, 10, 5, 5, 1], &dev)?;
        let mask = Tensor::new(&[1f32, 0.0, 1.0, 0.5, 1.0, 0.0], &dev)?;
        let fused = x.as_tensor().apply_op3(&target, &mask, WeightedNll)?.sum_all()?;
        let composed = (nll_composed(x.as_tensor(), &target)? * &mask)?.sum_all()?;
        let (a, b) = (fused.to_scalar::<f32>()?, composed.to_scalar::<f32>()?);
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        let ga = fused.backward()?.get(x.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
        let gb = composed.backward()?.get(x.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
        for (p, q) in ga.iter().zip(&gb) {
            assert!((p - q).abs() < 1e-6, "{p} vs {q}");
        }
        Ok(())
    }

    #[test]
    fn out_of_range_target_is_an_error() {
        let dev = Device::Cpu;
        let logits = Tensor::zeros((1, 2, 4), DType::F32, &dev).unwrap();
        let target = Tensor::new(&[[1u32, 4]], &dev).unwrap();
        let mask = Tensor::ones((1, 2), DType::F32, &dev).unwrap();
        assert!(masked_cross_entropy(&logits, &target, &mask).is_err());
    }
}
