//! SwiGLU's input half, `silu(x · w_gateᵀ) * (x · w_upᵀ)` (reference: [`crate::mlp::Mlp`]),
//! as one op: both projections in one matrix product against the packed, zero-padded
//! `[w_gate; w_up]`, then the gate, with the intermediate width padded to a multiple of 8
//! (see `fused::aligned`). The packed product's output is the backward's input (as the
//! composed ops keep `g` and `u`).

use super::{
    aligned, alloc, args, copy_padded, cuda_device, grid, launch, same_storage, sum_buffer, tensor_ptr, wrap, Gemm, WeightGrad,
    BLOCK_THREADS,
};
use candle_core::{CudaDevice, DType, Result, Tensor};

/// `[w_gate; w_up]` packed into `[2 · aligned(I), H]`, zero rows after each: the weight of
/// [`forward`] and [`backward`] (one pack serves a training pass's both). `w_gate`, `w_up`:
/// `[I, H]` contiguous, one dtype (BF16 or F32).
pub fn pack(w_gate: &Tensor, w_up: &Tensor) -> Result<Tensor> {
    let (i, h) = w_gate.dims2()?;
    if w_up.dims() != [i, h] || w_up.dtype() != w_gate.dtype() {
        candle_core::bail!(
            "fused mlp: w_gate {:?} {:?} and w_up {:?} {:?} differ",
            w_gate.shape(),
            w_gate.dtype(),
            w_up.shape(),
            w_up.dtype()
        );
    }
    let (dev, dtype, ip) = (cuda_device(w_gate)?, w_gate.dtype(), aligned(i));
    let (out, p) = alloc(&dev, dtype, 2 * ip * h)?;
    copy_padded(&dev, dtype, tensor_ptr(w_gate, "w_gate")?, p, (i, h, h), (ip, h))?;
    copy_padded(&dev, dtype, tensor_ptr(w_up, "w_up")?, p + (ip * h * dtype.size_in_bytes()) as u64, (i, h, h), (ip, h))?;
    Ok(wrap(out, (2 * ip, h)))
}

/// `(I, aligned(I), H)` of a packed weight of intermediate width `i`, checked against `x`.
fn dims(x: &Tensor, packed: &Tensor, i: usize) -> Result<(usize, usize, usize)> {
    let (two_ip, h) = packed.dims2()?;
    if two_ip != 2 * aligned(i) || x.dim(candle_core::D::Minus1)? != h || x.dtype() != packed.dtype() {
        candle_core::bail!(
            "fused mlp: x {:?} {:?}, packed weight {:?} {:?} of width {i}",
            x.shape(),
            x.dtype(),
            packed.shape(),
            packed.dtype()
        );
    }
    Ok((i, aligned(i), h))
}

/// Launches the gate's forward or backward `name` over `n` elements of h: 8 per thread
/// (16-byte accesses) where every buffer in `ptrs` is 16-byte aligned (the width is a
/// multiple of 8, [`aligned`]), else one.
fn gate(dev: &CudaDevice, name: &str, dtype: DType, ptrs: &[u64], a: &[super::Arg], n: usize) -> Result<()> {
    let per_thread = if super::aligned16(ptrs) { 8 } else { 1 };
    launch(dev, &format!("{name}{per_thread}"), dtype, grid((n / per_thread).div_ceil(BLOCK_THREADS as usize), 0), a)
}

/// `silu(x · w_gateᵀ) * (x · w_upᵀ)`, its last dimension padded with zeros to
/// `aligned(I)`, and the packed product `x · [w_gate; w_up]ᵀ` `[rows, 2 · aligned(I)]`
/// ([`backward`]'s input): `x` `[..., H]` contiguous, `packed` the two weights ([`pack`]),
/// `i` their width I, one dtype (BF16 or F32) → `[..., aligned(I)]` (columns `I..` are
/// exactly 0; feed it to [`super::linear::forward`] with the down projection). FP32
/// arithmetic, one rounding per product and per gate.
pub fn forward(x: &Tensor, packed: &Tensor, i: usize) -> Result<(Tensor, Tensor)> {
    let (_, ip, h) = dims(x, packed, i)?;
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let rows = x.elem_count() / h;
    let (xp, w) = (tensor_ptr(x, "x")?, tensor_ptr(packed, "packed weight")?);
    let (gu_s, gu) = alloc(&dev, dtype, rows * 2 * ip)?;
    Gemm { m: rows, n: 2 * ip, k: h, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, xp, w, gu, false)?;
    let (out, hp) = alloc(&dev, dtype, rows * ip)?;
    gate(&dev, "swiglu_packed_fwd", dtype, &[gu, hp], &args![gu, hp, rows as u64, ip as i32], rows * ip)?;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1") = ip;
    Ok((wrap(out, dims), wrap(gu_s, (rows, 2 * ip))))
}

/// The gradients of `x` and of the two weights (`[I, H]` each) from [`forward`]'s packed
/// weight and product `gu` and the gradient `dh` of its output (`[..., aligned(I)]`); the
/// weights' gradients come from one product into a packed `[2 · aligned(I), H]` buffer
/// (each a view of it, no copy) and are written as `into` says (both the same kind): new
/// tensors in the weights' dtype, or added to FP32 sums, in place where the sums are the
/// views an earlier pass returned.
pub fn backward(
    x: &Tensor,
    packed: &Tensor,
    i: usize,
    gu: &Tensor,
    dh: &Tensor,
    into: [WeightGrad; 2],
) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, ip, h) = dims(x, packed, i)?;
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let dh = dh.contiguous()?;
    let rows = x.elem_count() / h;
    if gu.dims() != [rows, 2 * ip] || dh.elem_count() != rows * ip || dh.dtype() != dtype {
        candle_core::bail!("fused mlp backward: product {:?}, gradient {:?} for x {:?}, width {i}", gu.shape(), dh.shape(), x.shape());
    }
    let (gup, dhp, xp) = (tensor_ptr(gu, "gu")?, tensor_ptr(&dh, "dh")?, tensor_ptr(x, "x")?);
    let (_dgu, dgu) = alloc(&dev, dtype, rows * 2 * ip)?;
    gate(&dev, "swiglu_packed_bwd", dtype, &[gup, dhp, dgu], &args![gup, dhp, dgu, rows as u64, ip as i32], rows * ip)?;
    let w = tensor_ptr(packed, "packed weight")?;
    // dx = dgu · [w_gate; w_up]
    let (dxs, dx) = alloc(&dev, dtype, rows * h)?;
    Gemm { m: rows, n: h, k: 2 * ip, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, dgu, w, dx, false)?;
    let dx = wrap(dxs, x.shape().clone());
    // [dw_gate; dw_up] (+)= dguᵀ · x
    let dw_gemm = Gemm { m: 2 * ip, n: h, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 };
    if let [WeightGrad::Sum(Some(g)), WeightGrad::Sum(Some(u))] = into {
        if let Some(p) = sum_buffer(g, &[i, h], 2 * ip * h)? {
            if u.dims() == [i, h] && same_storage(g, u) && tensor_ptr(u, "dw_up sum")? == p + (ip * h * 4) as u64 {
                dw_gemm.run(&dev, dtype, DType::F32, dgu, xp, p, true)?;
                return Ok((dx, g.clone(), u.clone()));
            }
        }
    }
    let dw_dtype = into[0].dtype(dtype);
    let (dw_s, dw) = alloc(&dev, dw_dtype, 2 * ip * h)?;
    dw_gemm.run(&dev, dtype, dw_dtype, dgu, xp, dw, false)?;
    let packed = wrap(dw_s, (2 * ip, h));
    Ok((dx, into[0].finish(packed.narrow(0, 0, i)?)?, into[1].finish(packed.narrow(0, ip, i)?)?))
}
