//! SwiGLU's input half, `silu(x · w_gateᵀ) * (x · w_upᵀ)` (reference: [`crate::mlp::Mlp`]),
//! as one op: both projections in one matrix product against the packed, zero-padded
//! `[w_gate; w_up]`, then the gate, with the intermediate width padded to a multiple of 8
//! (see [`super::aligned`]). The packed product's output is the backward's input (as the
//! composed ops keep `g` and `u`).

use super::{aligned, alloc, args, copy_rows, cuda_device, grid, launch, tensor_ptr, unpadded, wrap, Gemm, THREADS};
use candle_core::{CudaDevice, CudaStorage, DType, Result, Tensor};

/// `[w_gate; w_up]` packed into `[2 · aligned(I), H]`, zero rows after each.
fn packed_weights(dev: &CudaDevice, dtype: DType, wg: u64, wu: u64, (i, h): (usize, usize)) -> Result<(CudaStorage, u64)> {
    let ip = aligned(i);
    let out = super::alloc_zeroed(dev, dtype, 2 * ip * h)?;
    copy_rows(dev, dtype, wg, out.1, i, h, h, h)?;
    copy_rows(dev, dtype, wu, out.1 + (ip * h * dtype.size_in_bytes()) as u64, i, h, h, h)?;
    Ok(out)
}

/// Launches the gate's forward or backward `name` over `n` elements of h: 8 per thread
/// (16-byte accesses) where every buffer in `ptrs` is 16-byte aligned (the width is a
/// multiple of 8, [`aligned`]), else one.
fn gate(dev: &CudaDevice, name: &str, dtype: DType, ptrs: &[u64], a: &[super::Arg], n: usize) -> Result<()> {
    let per_thread = if super::aligned16(ptrs) { 8 } else { 1 };
    launch(dev, &format!("{name}{per_thread}"), dtype, grid((n / per_thread).div_ceil(THREADS as usize), 0), a)
}

/// `silu(x · w_gateᵀ) * (x · w_upᵀ)`, its last dimension padded with zeros to
/// `aligned(I)`, and the packed product `x · [w_gate; w_up]ᵀ` `[rows, 2 · aligned(I)]`
/// ([`backward`]'s input): `x` `[..., H]`, `w_gate` and `w_up` `[I, H]`, contiguous, one
/// dtype (BF16 or F32) → `[..., aligned(I)]` (columns `I..` are exactly 0; feed it to
/// [`super::linear::forward`] with the down projection). FP32 arithmetic, one rounding per
/// product and per gate.
pub fn forward(x: &Tensor, w_gate: &Tensor, w_up: &Tensor) -> Result<(Tensor, Tensor)> {
    let (i, h) = w_gate.dims2()?;
    if w_up.dims() != [i, h] || x.dim(candle_core::D::Minus1)? != h || x.dtype() != w_gate.dtype() || w_up.dtype() != x.dtype() {
        candle_core::bail!("gate_up_swiglu: x {:?}, w_gate {:?}, w_up {:?}", x.shape(), w_gate.shape(), w_up.shape());
    }
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let (ip, rows) = (aligned(i), x.elem_count() / h);
    let xp = tensor_ptr(x, "x")?;
    let (_w, w) = packed_weights(&dev, dtype, tensor_ptr(w_gate, "w_gate")?, tensor_ptr(w_up, "w_up")?, (i, h))?;
    let (gu_s, gu) = alloc(&dev, dtype, rows * 2 * ip)?;
    Gemm { m: rows, n: 2 * ip, k: h, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, xp, w, gu, false)?;
    let (out, hp) = alloc(&dev, dtype, rows * ip)?;
    gate(&dev, "swiglu_packed_fwd", dtype, &[gu, hp], &args![gu, hp, rows as u64, ip as i32], rows * ip)?;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1") = ip;
    Ok((wrap(out, dims), wrap(gu_s, (rows, 2 * ip))))
}

/// The gradients of `x`, `w_gate` and `w_up` (their shapes) from [`forward`]'s packed
/// product `gu` and the gradient `dh` of its output (`[..., aligned(I)]`).
pub fn backward(x: &Tensor, w_gate: &Tensor, w_up: &Tensor, gu: &Tensor, dh: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let dh = dh.contiguous()?;
    let (i, h) = w_gate.dims2()?;
    let (ip, rows) = (aligned(i), x.elem_count() / h);
    if gu.dims() != [rows, 2 * ip] || dh.elem_count() != rows * ip || dh.dtype() != dtype {
        candle_core::bail!("gate_up_swiglu backward: product {:?}, gradient {:?} for x {:?}, w_gate {:?}", gu.shape(), dh.shape(), x.shape(), w_gate.shape());
    }
    let (gup, dhp, xp) = (tensor_ptr(gu, "gu")?, tensor_ptr(&dh, "dh")?, tensor_ptr(x, "x")?);
    let (_dgu, dgu) = alloc(&dev, dtype, rows * 2 * ip)?;
    gate(&dev, "swiglu_packed_bwd", dtype, &[gup, dhp, dgu], &args![gup, dhp, dgu, rows as u64, ip as i32], rows * ip)?;
    let (_w, w) = packed_weights(&dev, dtype, tensor_ptr(w_gate, "w_gate")?, tensor_ptr(w_up, "w_up")?, (i, h))?;
    // dx = dgu · [w_gate; w_up]
    let (dxs, dx) = alloc(&dev, dtype, rows * h)?;
    Gemm { m: rows, n: h, k: 2 * ip, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, dgu, w, dx, false)?;
    // [dw_gate; dw_up] = dguᵀ · x
    let (_dw, dw) = alloc(&dev, dtype, 2 * ip * h)?;
    Gemm { m: 2 * ip, n: h, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, dgu, xp, dw, false)?;
    let dw_gate = unpadded(&dev, dtype, dw, h, (i, h))?;
    let dw_up = unpadded(&dev, dtype, dw + (ip * h * dtype.size_in_bytes()) as u64, h, (i, h))?;
    Ok((wrap(dxs, x.shape().clone()), dw_gate, dw_up))
}
