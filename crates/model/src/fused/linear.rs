//! Bias-free linear layer (reference: [`crate::mlp::linear`]): cuBLAS products each way with
//! the weight in its stored `[out, in]` layout; the backward of several layers that read
//! one input sums their input gradients inside cuBLAS (C += A·B).

use super::{aligned, alloc, cuda_device, sum_buffer, tensor_ptr, unpadded, wrap, zero_padded, Gemm, WeightGrad};
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
/// `dw_i = dy_iᵀ · x` `[out_i, in]`, written as `into[i]` says (a new tensor in the
/// weight's dtype, or added to an FP32 sum: in place, by the product, where the weight needs
/// no padding). `ws[i]` `[out_i, in]`, `dys[i]` `[..., out_i]`, one dtype. Returns `dx` and
/// each weight's gradient (or its updated sum).
pub fn backward(x: &Tensor, ws: &[&Tensor], dys: &[&Tensor], into: &[WeightGrad]) -> Result<(Tensor, Vec<Tensor>)> {
    let dev = cuda_device(x)?;
    let dtype = x.dtype();
    let xin = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / xin;
    if ws.len() != dys.len() || ws.len() != into.len() {
        candle_core::bail!("linear backward: {} weights, {} gradients, {} destinations", ws.len(), dys.len(), into.len());
    }
    let xp = tensor_ptr(x, "linear x")?;
    let (dxs, dx) = alloc(&dev, dtype, rows * xin)?;
    let mut dws = Vec::with_capacity(ws.len());
    for (i, ((w, dy), to)) in ws.iter().zip(dys).zip(into).enumerate() {
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
        // dw (+)= dyᵀ · x
        let dw_gemm = Gemm { m: out, n: xin, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 };
        if let (WeightGrad::Sum(Some(sum)), true) = (to, xin == inp) {
            if let Some(p) = sum_buffer(sum, &[out, inp], out * inp)? {
                dw_gemm.run(&dev, dtype, DType::F32, dyp, xp, p, true)?;
                dws.push((*sum).clone());
                continue;
            }
        }
        let dw_dtype = to.dtype(dtype);
        let (dws_s, dw) = alloc(&dev, dw_dtype, out * xin)?;
        dw_gemm.run(&dev, dtype, dw_dtype, dyp, xp, dw, false)?;
        let dw = if xin == inp { wrap(dws_s, (out, inp)) } else { unpadded(&dev, dw_dtype, dw, xin, (out, inp))? };
        dws.push(to.finish(dw)?);
    }
    Ok((wrap(dxs, x.shape().clone()), dws))
}
