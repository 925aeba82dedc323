//! Causal self-attention (reference: the scores, softmax and product of
//! [`crate::attention::Attention::forward`]). Head dim 64 or 128: the FlashAttention-2
//! kernels (`fused::flash`: tensor cores for BF16, CUDA cores for FP32; no `[T, T]`
//! score matrix in memory (the FP32 backward keeps dQ partials of about that size within
//! the pass), no head relayout). Otherwise (other head dims, unaligned buffers):
//! scores by cuBLAS, a fused causal softmax, and a backward that recomputes the scores
//! instead of keeping them (the `[T, T]` matrices exist only inside one pass of one layer).

use super::{alloc, args, cuda_device, flash, grid, launch, tensor_ptr, wrap, Columns, Gemm, BLOCK_THREADS, ROW_WARPS};
use candle_core::{CudaDevice, CudaStorage, DType, Result, Shape, Tensor};

/// Shape `[B, heads, T, d]` as (batch entries B·heads, T, d).
fn dims(shape: &Shape) -> Result<(usize, usize, usize)> {
    let (b, h, t, d) = shape.dims4()?;
    Ok((b * h, t, d))
}

/// `[B, T, heads, d]` → `[B, heads, T, d]` (`split_heads`) or back (`merge_heads`) into a new
/// buffer.
fn relayout(dev: &CudaDevice, name: &str, dtype: DType, src: u64, shape: &Shape) -> Result<(CudaStorage, u64)> {
    let (b, h, t, d) = shape.dims4()?;
    let out = alloc(dev, dtype, b * h * t * d)?;
    let n = b * h * t * d;
    launch(dev, name, dtype, grid(n.div_ceil(BLOCK_THREADS as usize), 0), &args![src, out.1, b as i32, t as i32, h as i32, d as i32])?;
    Ok(out)
}

/// `P = causal_softmax(scale · q kᵀ)` for every batch entry: returns P (`dtype`) and the
/// FP32 scores buffer (reused by the backward for dP).
fn probabilities(
    dev: &CudaDevice,
    dtype: DType,
    q: u64,
    k: u64,
    (bh, t, d): (usize, usize, usize),
    scale: f32,
) -> Result<((CudaStorage, u64), (CudaStorage, u64))> {
    let s = alloc(dev, DType::F32, bh * t * t)?;
    Gemm { m: t, n: t, k: d, a_t: false, b_t: true, batch: bh, stride_a: t * d, stride_b: t * d, stride_c: t * t }.run(
        dev,
        dtype,
        DType::F32,
        q,
        k,
        s.1,
        false,
    )?;
    let p = alloc(dev, dtype, bh * t * t)?;
    let (rows, ti, sp, pp) = ((bh * t) as i32, t as i32, s.1, p.1);
    launch(dev, "causal_softmax_fwd", dtype, grid((bh * t).div_ceil(ROW_WARPS), 0), &args![sp, pp, rows, ti, scale])?;
    Ok((p, s))
}

/// `softmax(q kᵀ · scale + causal mask) v` per batch entry and head, with the rows'
/// log-sum-exp of the scaled scores where the FlashAttention-2 kernels ran ([`backward`]'s
/// input).
///
/// `q`, `k`: contiguous `[B, heads, T, d]` (as [`super::rope::forward`] gives them); `v`:
/// contiguous `[B, T, heads · d]` (a projection's output); one dtype (BF16 or F32), as many
/// key/value heads as query heads → (`[B, T, heads · d]` (the output projection's input),
/// `[B · heads, T]` F32 or `None`). Scores are accumulated and normalised in FP32; the
/// probabilities are rounded to the input dtype before the product with `v` (as the composed
/// path). Head dim 64 or 128 runs FlashAttention-2 (Dao 2023): on tensor cores in BF16,
/// whose softmax normaliser sums the unrounded probabilities (the composed path normalises,
/// then rounds), on CUDA cores in FP32 (FP32 products, no TF32); the rest, cuBLAS products
/// with `[T, T]` FP32 scores.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<(Tensor, Option<Tensor>)> {
    let dims4 = q.dims4()?;
    let (b, h, t, d) = dims4;
    if q.dims() != k.dims() || v.dims() != [b, t, h * d] || k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        candle_core::bail!(
            "causal attention: q {:?}, k {:?} [B, heads, T, d] and v {:?} [B, T, heads * d] do not match",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let (dev, dtype, scale) = (cuda_device(q)?, q.dtype(), scale as f32);
    let (qp, kp, vp) = (tensor_ptr(q, "q")?, tensor_ptr(k, "k")?, tensor_ptr(v, "v")?);
    if flash::supports(dtype, dims4, &[qp, kp, vp]) {
        let (o, lse) = flash::forward(&dev, dtype, (qp, kp, vp), dims4, scale)?;
        return Ok((wrap(o, v.shape().clone()), Some(wrap(lse, (b * h, t)))));
    }
    let (bh, t, d) = dims(q.shape())?;
    let (_v, vp) = relayout(&dev, "split_heads", dtype, vp, q.shape())?;
    let ((_p, p), _s) = probabilities(&dev, dtype, qp, kp, (bh, t, d), scale)?;
    let (_o, o) = alloc(&dev, dtype, bh * t * d)?;
    Gemm { m: t, n: d, k: t, a_t: false, b_t: false, batch: bh, stride_a: t * t, stride_b: t * d, stride_c: t * d }
        .run(&dev, dtype, dtype, p, vp, o, false)?;
    let (out, _) = relayout(&dev, "merge_heads", dtype, o, q.shape())?;
    Ok((wrap(out, v.shape().clone()), None))
}

/// The gradients of q, k, v (shapes and layouts of the inputs) from the output `o` and the
/// log-sum-exp `lse` that [`forward`] gave, and the output's gradient `d_out`
/// (`[B, T, heads · d]`); without `lse` (the cuBLAS path) the scores are recomputed and `o`
/// is not read. v's gradient is returned, or (`dv_into`) written into columns of a wider
/// `[B, T, W]` buffer (`None` returned).
pub fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: Option<&Tensor>,
    d_out: &Tensor,
    scale: f64,
    dv_into: Option<Columns>,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let dev = cuda_device(q)?;
    let (dtype, scale) = (q.dtype(), scale as f32);
    if d_out.dims() != v.dims() || d_out.dtype() != dtype {
        candle_core::bail!(
            "causal attention backward: output gradient {:?} {:?} for v {:?} {dtype:?}",
            d_out.shape(),
            d_out.dtype(),
            v.shape()
        );
    }
    let target = dv_into.map(|cols| cols.target(v.dims(), dtype)).transpose()?;
    // v's gradient where the caller wants it: written there by the kernels, or copied
    let place = |dv: Tensor| -> Result<Option<Tensor>> {
        match dv_into {
            Some(cols) => cols.buf.slice_set(&dv, candle_core::D::Minus1, cols.first).map(|_| None),
            None => Ok(Some(dv)),
        }
    };
    let d_out = d_out.contiguous()?;
    if let Some(lse) = lse {
        // the kernels read dO 16 bytes at a time
        let d_out = if super::aligned16(&[tensor_ptr(&d_out, "dO")?]) { d_out } else { d_out.copy()? };
        let inputs = (tensor_ptr(q, "q")?, tensor_ptr(k, "k")?, tensor_ptr(v, "v")?);
        let saved = (tensor_ptr(o, "o")?, tensor_ptr(lse, "lse")?, tensor_ptr(&d_out, "dO")?);
        let (_, _, t, _) = q.dims4()?;
        // the kernels write 16 bytes at a time and take the row stride as an `i32` stride per batch entry
        let direct = target.filter(|&(p, ld)| p % 16 == 0 && (ld * dtype.size_in_bytes()) % 16 == 0 && t * ld <= i32::MAX as usize);
        let (dq, dk, dv) = flash::backward(&dev, dtype, inputs, saved, direct, q.dims4()?, scale)?;
        let dv = match dv {
            Some(s) => place(wrap(s, v.shape().clone()))?,
            None => None,
        };
        return Ok((wrap(dq, q.shape().clone()), wrap(dk, k.shape().clone()), dv));
    }
    let (bh, t, d) = dims(q.shape())?;
    let (qp, kp) = (tensor_ptr(q, "q")?, tensor_ptr(k, "k")?);
    let (_v, vp) = relayout(&dev, "split_heads", dtype, tensor_ptr(v, "v")?, q.shape())?;
    let (_g, gp) = relayout(&dev, "split_heads", dtype, tensor_ptr(&d_out, "dO")?, q.shape())?;
    let ((_p, p), (_dp, dp)) = probabilities(&dev, dtype, qp, kp, (bh, t, d), scale)?;
    let (tt, td) = (t * t, t * d);
    // dP = dO vᵀ (FP32, into the scores' buffer), dS = scale · P ∘ (dP − rowsum(P ∘ dP))
    Gemm { m: t, n: t, k: d, a_t: false, b_t: true, batch: bh, stride_a: td, stride_b: td, stride_c: tt }.run(
        &dev,
        dtype,
        DType::F32,
        gp,
        vp,
        dp,
        false,
    )?;
    let (_ds, ds) = alloc(&dev, dtype, bh * tt)?;
    let (rows, ti) = ((bh * t) as i32, t as i32);
    launch(&dev, "causal_softmax_bwd", dtype, grid((bh * t).div_ceil(ROW_WARPS), 0), &args![p, dp, ds, rows, ti, scale])?;
    let grad = |a: u64, a_t: bool, b: u64| -> Result<(CudaStorage, u64)> {
        let (s, c) = alloc(&dev, dtype, bh * td)?;
        Gemm { m: t, n: d, k: t, a_t, b_t: false, batch: bh, stride_a: tt, stride_b: td, stride_c: td }
            .run(&dev, dtype, dtype, a, b, c, false)?;
        Ok((s, c))
    };
    let (_dv, dv) = grad(p, true, gp)?; // Pᵀ dO
    let (dv, _) = relayout(&dev, "merge_heads", dtype, dv, q.shape())?;
    let (dq, _) = grad(ds, false, kp)?; // dS k
    let (dk, _) = grad(ds, true, qp)?; // dSᵀ q
    let shape = q.shape().clone();
    Ok((wrap(dq, shape.clone()), wrap(dk, shape), place(wrap(dv, v.shape().clone()))?))
}
