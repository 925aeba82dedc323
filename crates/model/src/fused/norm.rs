//! RMSNorm (HF `LlamaRMSNorm` semantics) as one kernel forward and two backward (both
//! gradients in one pass, the gain's as per-block partial sums; then a column sum of the
//! partials: no atomics).

use super::{args, alloc, cpu_unsupported, cuda_device, grid, launch, storage_ptr, tensor_ptr, wrap};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Rows each block of the backward kernel takes (one partial row of the gain gradient per
/// block).
const ROWS_PER_BLOCK: usize = 64;

/// `name` with its elements per access: `{name}8` (16-byte accesses) where the width is a
/// multiple of 8 and every buffer 16-byte aligned, else `{name}1`.
fn variant(name: &str, h: usize, ptrs: &[u64]) -> String {
    let v = if h % 8 == 0 && super::aligned16(ptrs) { 8 } else { 1 };
    format!("{name}{v}")
}

/// `y = w * round(x / sqrt(mean(x², last dim) + eps))`, normalisation in FP32 and rounded to
/// x's dtype before the gain, as HF `LlamaRMSNorm` and [`crate::norm::RmsNorm`].
///
/// `x`: `[..., H]` BF16 or F32 CUDA tensor; `w`: `[H]`, same dtype → `[..., H]`, x's dtype.
/// Differentiable in both (the rounding before the gain counts as the identity in the
/// backward). Shared memory of the gain-gradient kernel limits `H` to 1536.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 })
}

pub(crate) struct RmsNorm {
    pub(crate) eps: f32,
}

fn rows_and_width(shape: &Shape) -> Result<(usize, usize)> {
    let h = *shape.dims().last().ok_or_else(|| candle_core::Error::Msg("rms_norm of a scalar".into()))?;
    Ok((shape.elem_count() / h.max(1), h))
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "lowbit-fused-rms-norm"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = xs.device().clone();
        let dtype = xs.dtype();
        let (rows, h) = rows_and_width(xl.shape())?;
        if ws.dtype() != dtype || wl.shape().elem_count() != h {
            candle_core::bail!("rms_norm: gain {:?} {:?} for input {:?} {:?}", wl.shape(), ws.dtype(), xl.shape(), dtype);
        }
        let (x, w) = (storage_ptr(xs, xl, "rms_norm x")?, storage_ptr(ws, wl, "rms_norm w")?);
        let (out, y) = alloc(&dev, dtype, rows * h)?;
        let (r, hh) = (rows as i32, h as i32);
        let name = variant("rmsnorm_fwd", h, &[x, w, y]);
        launch(&dev, &name, dtype, grid(rows.div_ceil(8), 0), &args![x, 0u64, w, 0u64, y, r, hh, self.eps])?;
        Ok((out, xl.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = self.backward(x, w, dy, None)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl RmsNorm {
    /// The residual stream's add and the norm after it in one kernel: `s = x + delta` (one
    /// rounding to the dtype, as the separate add) and `rms_norm(s, w)`; returns (s, normed).
    /// `x`, `delta`: contiguous `[..., H]`, one dtype.
    pub(crate) fn add_forward(&self, x: &Tensor, delta: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        let dev = cuda_device(x)?;
        let dtype = x.dtype();
        let (rows, h) = rows_and_width(x.shape())?;
        if delta.dims() != x.dims() || delta.dtype() != dtype || w.elem_count() != h || w.dtype() != dtype {
            candle_core::bail!("add_rms_norm: x {:?}, delta {:?}, gain {:?}", x.shape(), delta.shape(), w.shape());
        }
        let (xp, dp, wp) = (tensor_ptr(x, "x")?, tensor_ptr(delta, "delta")?, tensor_ptr(w, "w")?);
        let ((sum_s, sum), (y_s, y)) = (alloc(&dev, dtype, rows * h)?, alloc(&dev, dtype, rows * h)?);
        let (r, hh) = (rows as i32, h as i32);
        let name = variant("rmsnorm_fwd", h, &[xp, dp, wp, sum, y]);
        launch(&dev, &name, dtype, grid(rows.div_ceil(8), 0), &args![xp, dp, wp, sum, y, r, hh, self.eps])?;
        Ok((wrap(sum_s, x.shape().clone()), wrap(y_s, x.shape().clone())))
    }

    /// The gradients of x and of the gain from the output's gradient `dy`; with
    /// `d_residual` (the gradient the residual stream carries past the norm, x's shape) the
    /// input gradient is the sum of both (one more rounding, as the separate add).
    pub(crate) fn backward(&self, x: &Tensor, w: &Tensor, dy: &Tensor, d_residual: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let dev = cuda_device(x)?;
        let dtype = x.dtype();
        let dy = dy.contiguous()?;
        let (rows, h) = rows_and_width(x.shape())?;
        if h > crate::kernels::FUSED_MAX_HIDDEN {
            candle_core::bail!("fused rms_norm backward: hidden size {h} > {} does not fit shared memory", crate::kernels::FUSED_MAX_HIDDEN);
        }
        let (xp, wp, dyp) = (tensor_ptr(x, "x")?, tensor_ptr(w, "w")?, tensor_ptr(&dy, "dy")?);
        let residual = match d_residual {
            Some(r) if r.dims() == x.dims() && r.dtype() == dtype => tensor_ptr(r, "d_residual")?,
            Some(r) => candle_core::bail!("rms_norm backward: residual gradient {:?} {:?} for input {:?}", r.shape(), r.dtype(), x.shape()),
            None => 0,
        };
        let (r, hh) = (rows as i32, h as i32);
        let (dx_s, dx) = alloc(&dev, dtype, rows * h)?;
        let blocks = rows.div_ceil(ROWS_PER_BLOCK).max(1);
        let (partial_s, partial) = alloc(&dev, DType::F32, blocks * h)?;
        let rpb = ROWS_PER_BLOCK as i32;
        let name = variant("rmsnorm_bwd", h, &[xp, wp, dyp, residual, dx]);
        let a = args![xp, wp, dyp, residual, dx, partial, r, hh, self.eps, rpb];
        launch(&dev, &name, dtype, grid(blocks, 8 * h * 4), &a)?;
        let (dw_s, dw) = alloc(&dev, dtype, h)?;
        let nb = blocks as i32;
        launch(&dev, "colsum", dtype, grid(h.div_ceil(32), 0), &args![partial, dw, nb, hh])?;  // 32 columns per block
        drop(partial_s);
        Ok((wrap(dx_s, x.shape().clone()), wrap(dw_s, w.shape().clone())))
    }
}
