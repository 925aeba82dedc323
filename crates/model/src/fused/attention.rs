//! Causal self-attention. BF16 with head dim 64 or 128: the tensor-core FlashAttention-2
//! kernels ([`super::flash`]: no `[T, T]` matrix in memory, no head relayout). Otherwise
//! (FP32, other head dims): scores by cuBLAS, a fused causal softmax, and a backward that
//! recomputes the scores instead of keeping them (the `[T, T]` matrices exist only inside
//! one pass of one layer).

use super::{args, alloc, flash, cpu_unsupported, cuda_device, grid, launch, storage_ptr, tensor_ptr, wrap, Gemm, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// `softmax(q kᵀ · scale + causal mask) v` per batch entry and head.
///
/// `q`, `k`: `[B, heads, T, d]` (as [`super::rope`] gives them); `v`: `[B, T, heads · d]`
/// (a projection's output); one dtype (BF16 or F32), as many key/value heads as query
/// heads (repeat them first for GQA) → `[B, T, heads · d]` (the output projection's input:
/// the head layouts change inside the op, so autograd sees no transposes). Scores are
/// accumulated and normalised in FP32; the probabilities are rounded to the input dtype
/// before the product with `v` (as the composed path). Differentiable in `q`, `k`, `v`; the
/// backward recomputes the scores (flash-attention's trade). BF16 with head dim 64 or 128
/// runs FlashAttention-2 (Dao 2023) on tensor cores, whose softmax normaliser sums the
/// unrounded probabilities (the composed path normalises, then rounds); the rest, cuBLAS
/// products with `[T, T]` FP32 scores per pass.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    if q.dims() != k.dims() || v.dims() != [b, t, h * d] {
        candle_core::bail!("causal_attention: q {:?}, k {:?} [B, heads, T, d] and v {:?} [B, T, heads * d] do not match", q.shape(), k.shape(), v.shape());
    }
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, Attention { scale: scale as f32 })
}

pub(crate) struct Attention {
    pub(crate) scale: f32,
}

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
    launch(dev, name, dtype, grid(n.div_ceil(THREADS as usize), 0), &args![src, out.1, b as i32, t as i32, h as i32, d as i32])?;
    Ok(out)
}

/// `P = causal_softmax(scale · q kᵀ)` for every batch entry: returns P (`dtype`) and the
/// FP32 scores buffer (reused by the backward for dP).
fn probabilities(dev: &CudaDevice, dtype: DType, q: u64, k: u64, (bh, t, d): (usize, usize, usize), scale: f32) -> Result<((CudaStorage, u64), (CudaStorage, u64))> {
    let s = alloc(dev, DType::F32, bh * t * t)?;
    Gemm { m: t, n: t, k: d, a_t: false, b_t: true, batch: bh, stride_a: t * d, stride_b: t * d, stride_c: t * t }
        .run(dev, dtype, DType::F32, q, k, s.1, false)?;
    let p = alloc(dev, dtype, bh * t * t)?;
    let (rows, ti, sp, pp) = ((bh * t) as i32, t as i32, s.1, p.1);
    launch(dev, "causal_softmax_fwd", dtype, grid((bh * t).div_ceil(8), 0), &args![sp, pp, rows, ti, scale])?;
    Ok((p, s))
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "lowbit-fused-causal-attention"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, qs: &CudaStorage, ql: &Layout, ks: &CudaStorage, kl: &Layout, vs: &CudaStorage, vl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = qs.device().clone();
        let dtype = qs.dtype();
        if ks.dtype() != dtype || vs.dtype() != dtype {
            candle_core::bail!("causal_attention: q, k, v must have one dtype");
        }
        let (bh, t, d) = dims(ql.shape())?;
        let (q, k) = (storage_ptr(qs, ql, "q")?, storage_ptr(ks, kl, "k")?);
        let v = storage_ptr(vs, vl, "v")?;
        let dims4 = ql.shape().dims4()?;
        if flash::supports(dtype, dims4, &[q, k, v]) {
            let (o, _lse) = flash::forward(&dev, (q, k, v), dims4, self.scale)?;
            return Ok((o, vl.shape().clone()));
        }
        let (_v, v) = relayout(&dev, "split_heads", dtype, v, ql.shape())?;
        let ((_p, p), _s) = probabilities(&dev, dtype, q, k, (bh, t, d), self.scale)?;
        let (_o, o) = alloc(&dev, dtype, bh * t * d)?;
        Gemm { m: t, n: d, k: t, a_t: false, b_t: false, batch: bh, stride_a: t * t, stride_b: t * d, stride_c: t * d }
            .run(&dev, dtype, dtype, p, v, o, false)?;
        let (out, _) = relayout(&dev, "merge_heads", dtype, o, ql.shape())?;
        Ok((out, vl.shape().clone()))
    }

    /// The gradients; the output argument is not read (the explicit backward passes the
    /// output's gradient in its place): the tensor-core path recomputes the output and its
    /// log-sum-exp ([`Attention::forward`] and [`Attention::backward`] keep them instead).
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, _res: &Tensor, d_out: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = match self.flash_forward(q, k, v)? {
            Some((o, lse)) => self.backward(q, k, v, &o, Some(&lse), d_out)?,
            None => self.backward(q, k, v, d_out, None, d_out)?,
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

impl Attention {
    /// The output `[B, T, heads · d]` of contiguous q, k `[B, heads, T, d]` and v
    /// `[B, T, heads · d]`, with the log-sum-exp `[B · heads, T]` (F32) where the
    /// tensor-core path ran (the backward's input).
    pub(crate) fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        Ok(match self.flash_forward(q, k, v)? {
            Some((o, lse)) => (o, Some(lse)),
            None => (q.apply_op3_no_bwd(k, v, self)?, None),
        })
    }

    /// The tensor-core forward (output and log-sum-exp) where [`flash::supports`] the inputs.
    fn flash_forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let (dev, dims4) = (cuda_device(q)?, q.dims4()?);
        let ptrs = [tensor_ptr(q, "q")?, tensor_ptr(k, "k")?, tensor_ptr(v, "v")?];
        if !flash::supports(q.dtype(), dims4, &ptrs) {
            return Ok(None);
        }
        let (o, lse) = flash::forward(&dev, (ptrs[0], ptrs[1], ptrs[2]), dims4, self.scale)?;
        Ok(Some((wrap(o, v.shape().clone()), wrap(lse, (dims4.0 * dims4.1, dims4.2)))))
    }

    /// The gradients of q, k, v (shapes and layouts of the inputs) from the output `o`, the
    /// log-sum-exp `lse` that [`Attention::forward`] gave and the output's gradient `d_out`
    /// (`o` is read only with `lse`: the tensor-core path).
    pub(crate) fn backward(&self, q: &Tensor, k: &Tensor, v: &Tensor, o: &Tensor, lse: Option<&Tensor>, d_out: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let dev = cuda_device(q)?;
        let dtype = q.dtype();
        let d_out = d_out.contiguous()?;
        if let Some(lse) = lse {
            // the kernels read dO 16 bytes at a time
            let d_out = if super::aligned16(&[tensor_ptr(&d_out, "dO")?]) { d_out } else { d_out.copy()? };
            let inputs = (tensor_ptr(q, "q")?, tensor_ptr(k, "k")?, tensor_ptr(v, "v")?);
            let saved = (tensor_ptr(o, "o")?, tensor_ptr(lse, "lse")?, tensor_ptr(&d_out, "dO")?);
            let (dq, dk, dv) = flash::backward(&dev, inputs, saved, q.dims4()?, self.scale)?;
            return Ok((wrap(dq, q.shape().clone()), wrap(dk, k.shape().clone()), wrap(dv, v.shape().clone())));
        }
        let (bh, t, d) = dims(q.shape())?;
        let (qp, kp) = (tensor_ptr(q, "q")?, tensor_ptr(k, "k")?);
        let (_v, vp) = relayout(&dev, "split_heads", dtype, tensor_ptr(v, "v")?, q.shape())?;
        let (_g, gp) = relayout(&dev, "split_heads", dtype, tensor_ptr(&d_out, "dO")?, q.shape())?;
        let ((_p, p), (_dp, dp)) = probabilities(&dev, dtype, qp, kp, (bh, t, d), self.scale)?;
        let (tt, td) = (t * t, t * d);
        // dP = dO vᵀ (FP32, into the scores' buffer), dS = scale · P ∘ (dP − rowsum(P ∘ dP))
        Gemm { m: t, n: t, k: d, a_t: false, b_t: true, batch: bh, stride_a: td, stride_b: td, stride_c: tt }
            .run(&dev, dtype, DType::F32, gp, vp, dp, false)?;
        let (_ds, ds) = alloc(&dev, dtype, bh * tt)?;
        let (rows, ti, scale) = ((bh * t) as i32, t as i32, self.scale);
        launch(&dev, "causal_softmax_bwd", dtype, grid((bh * t).div_ceil(8), 0), &args![p, dp, ds, rows, ti, scale])?;
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
        Ok((wrap(dq, shape.clone()), wrap(dk, shape), wrap(dv, v.shape().clone())))
    }
}
