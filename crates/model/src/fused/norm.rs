//! RMSNorm (HF `LlamaRMSNorm` semantics; reference: [`crate::norm::RmsNorm`]) as one kernel
//! forward, optionally with the residual stream's add before it, and one backward kernel
//! (both gradients in one pass, the gain's as per-block partial sums), then a column sum of
//! the partials (no atomics).

use super::{alloc, args, cuda_device, grid, launch, tensor_ptr, wrap, ROW_WARPS};
use crate::fused_sizes::NORM_CHUNK;
use candle_core::{DType, Result, Tensor};

/// Rows each block of the backward kernel takes (one partial row of the gain gradient per
/// block; a lane sums its columns over its warp's rows in registers): 64 was the fastest of
/// 16 to 128 on the H200 at 16,384 x 1,024 and 32,768 x 640 (256 and 512 blocks); the
/// partial rows cost 1/64 of the input's size in FP32.
const ROWS_PER_BLOCK: usize = 64;

/// `name` with its elements per access: `{name}8` (16-byte accesses) where the width is a
/// multiple of 8 and every buffer 16-byte aligned, else `{name}1`.
fn variant(name: &str, h: usize, ptrs: &[u64]) -> String {
    let v = if h.is_multiple_of(8) && super::aligned16(ptrs) { 8 } else { 1 };
    format!("{name}{v}")
}

/// (rows, H) of a `[..., H]` tensor.
fn rows_and_width(x: &Tensor) -> Result<(usize, usize)> {
    let h = x.dim(candle_core::D::Minus1)?;
    Ok((x.elem_count() / h.max(1), h))
}

/// `y = w * round(x / sqrt(mean(x², last dim) + eps))`, normalisation in FP32 and rounded to
/// x's dtype before the gain, as HF `LlamaRMSNorm` and [`crate::norm::RmsNorm`]; with
/// `delta`, the residual stream's add first, in the same kernel: `s = x + delta` (one
/// rounding to the dtype, as a separate add) and `y = rms_norm(s)`.
///
/// `x`, `delta`: contiguous `[..., H]` BF16 or F32 CUDA tensors, one dtype; `w`: `[H]`, same
/// dtype → (`s`, `y`), both x's shape and dtype (`s` is `x` itself without `delta`).
pub fn forward(x: &Tensor, delta: Option<&Tensor>, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(x)?;
    let dtype = x.dtype();
    let (rows, h) = rows_and_width(x)?;
    if delta.is_some_and(|d| d.dims() != x.dims() || d.dtype() != dtype) || w.elem_count() != h || w.dtype() != dtype {
        candle_core::bail!(
            "rms_norm: x {:?} {dtype:?}, delta {:?}, gain {:?} {:?}",
            x.shape(),
            delta.map(|d| d.shape()),
            w.shape(),
            w.dtype()
        );
    }
    let (xp, wp) = (tensor_ptr(x, "rms_norm x")?, tensor_ptr(w, "rms_norm w")?);
    let (y_s, y) = alloc(&dev, dtype, rows * h)?;
    let (sum, (dp, sp)) = match delta {
        Some(d) => {
            let (s, p) = alloc(&dev, dtype, rows * h)?;
            (wrap(s, x.shape().clone()), (tensor_ptr(d, "rms_norm delta")?, p))
        }
        None => (x.clone(), (0, 0)),
    };
    let (r, hh) = (rows as i32, h as i32);
    let name = variant("rmsnorm_fwd", h, &[xp, dp, wp, sp, y]);
    launch(&dev, &name, dtype, grid(rows.div_ceil(ROW_WARPS), 0), &args![xp, dp, wp, sp, y, r, hh, eps as f32])?;
    Ok((sum, wrap(y_s, x.shape().clone())))
}

/// The gradients of the norm's input `x` and gain `w` (shapes and dtype of those) from the
/// output's gradient `dy`; with `d_residual` (the gradient the residual stream carries past
/// the norm, x's shape) the input gradient is the sum of both (one more rounding, as a
/// separate add). `x` is the norm's input (`s` of [`forward`]). `H` up to
/// [`crate::FUSED_MAX_HIDDEN`] (the gain partials of 8 warps in shared memory).
pub fn backward(x: &Tensor, w: &Tensor, dy: &Tensor, d_residual: Option<&Tensor>, eps: f64) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(x)?;
    let dtype = x.dtype();
    let dy = dy.contiguous()?;
    let (rows, h) = rows_and_width(x)?;
    if h == 0 || h > crate::kernels::FUSED_MAX_HIDDEN {
        candle_core::bail!(
            "fused rms_norm backward: hidden size {h} (1 to {}: the gain partials fill shared memory)",
            crate::kernels::FUSED_MAX_HIDDEN
        );
    }
    if dy.dims() != x.dims() || dy.dtype() != dtype {
        candle_core::bail!("rms_norm backward: gradient {:?} {:?} for input {:?} {dtype:?}", dy.shape(), dy.dtype(), x.shape());
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
    // the kernel for rows of h.div_ceil(NORM_CHUNK) chunks per lane, with 16-byte accesses
    // where the width and every buffer allow them
    let vec = (h % 8 == 0 && super::aligned16(&[xp, wp, dyp, residual, dx])) as i32;
    let name = format!("rmsnorm_bwd_c{}", h.div_ceil(NORM_CHUNK));
    let a = args![xp, wp, dyp, residual, dx, partial, r, hh, eps as f32, rpb, vec];
    launch(&dev, &name, dtype, grid(blocks, ROW_WARPS * h * 4), &a)?; // the warps' gain partials
    let (dw_s, dw) = alloc(&dev, dtype, h)?;
    let nb = blocks as i32;
    launch(&dev, "colsum", dtype, grid(h.div_ceil(32), 0), &args![partial, dw, nb, hh])?; // 32 columns per block
    drop(partial_s);
    Ok((wrap(dx_s, x.shape().clone()), wrap(dw_s, w.shape().clone())))
}
