//! Bias-free linear layer (reference: [`crate::mlp::linear`]): cuBLAS products each way with
//! the weight in its stored `[out, in]` layout; the backward of several layers that read
//! one input sums their input gradients inside cuBLAS (C += A·B).

use super::{aligned, alloc, cuda_device, tensor_ptr, unpadded, wrap, zero_padded, Gemm};
use candle_core::{CudaDevice, CudaStorage, DType, Result, Tensor};

/// `x · wᵀ` (nn.Linear without bias): `x` `[..., in]` or `[..., aligned(in)]` (the padded
/// output of [`super::mlp::forward`]: the padding columns of `x` must be 0; the weight is
/// padded with zero columns to match), `w` `[out, in]`, both contiguous, one dtype (BF16 or
/// F32) → `[..., out]`. FP32 accumulation (TF32 inputs for F32 when candle's
/// reduced-precision switch is on).
pub fn forward(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    let xin = x.dim(candle_core::D::Minus1)?;
    if (xin != inp && xin != aligned(inp)) || x.dtype() != w.dtype() {
        candle_core::bail!("linear: input {:?} {:?}, weight {:?} {:?}", x.shape(), x.dtype(), w.shape(), w.dtype());
    }
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let rows = x.elem_count() / xin;
    let xp = tensor_ptr(x, "linear x")?;
    let (_w, wp) = weight(&dev, dtype, tensor_ptr(w, "linear w")?, (out, inp), xin)?;
    let (ys, y) = alloc(&dev, dtype, rows * out)?;
    Gemm { m: rows, n: out, k: xin, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, xp, wp, y, false)?;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1") = out;
    Ok(wrap(ys, dims))
}

/// The weight as the product needs it: itself, or zero-padded to `xin` columns (kept alive
/// by the returned storage).
fn weight(dev: &CudaDevice, dtype: DType, w: u64, (out, inp): (usize, usize), xin: usize) -> Result<(Option<CudaStorage>, u64)> {
    if xin == inp {
        return Ok((None, w));
    }
    let (s, p) = zero_padded(dev, dtype, w, (out, inp), (out, xin))?;
    Ok((Some(s), p))
}

/// The backward of one or several linear layers that read one input `x` `[..., in]` or
/// `[..., aligned(in)]` (as [`forward`]; several: the q, k and v projections):
/// `dx = Σ dy_i · w_i`, each product added into one output by cuBLAS (C += A·B, FP32
/// accumulation, one rounding per product as separate adds would give), and each
/// `dw_i = dy_iᵀ · x` `[out_i, in]`. `ws[i]` `[out_i, in]`, `dys[i]` `[..., out_i]`, one
/// dtype.
pub fn backward(x: &Tensor, ws: &[&Tensor], dys: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    let dev = cuda_device(x)?;
    let dtype = x.dtype();
    let xin = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / xin;
    let xp = tensor_ptr(x, "linear x")?;
    let (dxs, dx) = alloc(&dev, dtype, rows * xin)?;
    let mut dws = Vec::with_capacity(ws.len());
    for (i, (w, dy)) in ws.iter().zip(dys).enumerate() {
        let (out, inp) = w.dims2()?;
        if (xin != inp && xin != aligned(inp)) || dy.elem_count() != rows * out || dy.dtype() != dtype {
            candle_core::bail!("linear backward: weight {:?} and gradient {:?} for input {:?}", w.shape(), dy.shape(), x.shape());
        }
        let dy = dy.contiguous()?;
        let dyp = tensor_ptr(&dy, "linear dy")?;
        let (_w, wp) = weight(&dev, dtype, tensor_ptr(w, "linear w")?, (out, inp), xin)?;
        // dx (+)= dy · w
        Gemm { m: rows, n: xin, k: out, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
            .run(&dev, dtype, dtype, dyp, wp, dx, i > 0)?;
        // dw = dyᵀ · x
        let (dws_s, dw) = alloc(&dev, dtype, out * xin)?;
        Gemm { m: out, n: xin, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
            .run(&dev, dtype, dtype, dyp, xp, dw, false)?;
        dws.push(if xin == inp { wrap(dws_s, (out, inp)) } else { unpadded(&dev, dtype, dw, xin, (out, inp))? });
    }
    Ok((wrap(dxs, x.shape().clone()), dws))
}
