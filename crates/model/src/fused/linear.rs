//! Bias-free linear layer (reference: [`crate::mlp::linear`]): cuBLAS products each way with
//! the weight in its stored `[out, in]` layout; the backward of several layers that read
//! one input and whose output gradients lie side by side in one buffer (q, k, v) runs as one
//! layer of the weights stacked, and one layer's backward is that of a stack of one.

use super::{
    aligned, alloc, copy_padded, cuda_device, same_storage, sum_buffer, tensor_ptr, unpadded, wrap, zero_padded, Gemm, WeightGrad,
};
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

/// The backward of a linear layer whose input is `x` `[..., in]` or `[..., aligned(in)]` (as
/// [`forward`]): `dx = dy · w` and `dw = dyᵀ · x` `[out, in]`, written as `into` says (a new
/// tensor in the weight's dtype, or added to an FP32 sum: in place, by the product, where
/// the weight needs no padding). `w` `[out, in]`, `dy` `[..., out]`, one dtype. Returns `dx`
/// and the weight's gradient (or its updated sum): [`backward_stacked`] of the one weight.
pub fn backward(x: &Tensor, w: &Tensor, dy: &Tensor, into: WeightGrad) -> Result<(Tensor, Tensor)> {
    let (dx, mut dws) = backward_stacked(x, &[w], dy, &[into])?;
    Ok((dx, dws.pop().expect("one weight, one gradient")))
}

/// The backward of one or several linear layers that read one input `x` `[..., in]` or
/// `[..., aligned(in)]` (as [`forward`]) and whose output gradients lie side by side in one
/// buffer `dy` `[..., Σ out_i]` (weight i's in columns `Σ_{j<i} out_j ..`): as one layer of
/// the stacked weight `[w_0; w_1; …]` (the fused QKV projection's backward): `dx = dy · [w_0;
/// w_1; …]`, one product against the weights packed into one buffer (a lone weight that
/// needs no padding is used as it is), and `[dw_0; dw_1; …] = dyᵀ · x`, one product into one
/// `[Σ out_i, in]` buffer whose row blocks are the weights' gradients (views, no copy;
/// three `[d, d]` products would each fill a third of the GPU). Written as `into[i]` says:
/// new tensors in the weights' dtype, or added to FP32 sums, in place where the sums are
/// the views an earlier call returned (and `x` is not padded). `ws[i]` `[out_i, in]`, one
/// dtype (BF16 or F32).
pub fn backward_stacked(x: &Tensor, ws: &[&Tensor], dy: &Tensor, into: &[WeightGrad]) -> Result<(Tensor, Vec<Tensor>)> {
    let (dev, dtype) = (cuda_device(x)?, x.dtype());
    let xin = x.dim(candle_core::D::Minus1)?;
    let rows = x.elem_count() / xin;
    let inp = ws.first().map_or(Ok(0), |w| w.dim(1))?;
    let outs = ws.iter().map(|w| Ok(w.dims2()?.0)).collect::<Result<Vec<usize>>>()?;
    let total: usize = outs.iter().sum();
    let fits = (xin == inp || xin == aligned(inp)) && ws.iter().all(|w| w.dim(1).ok() == Some(inp) && w.dtype() == dtype);
    if ws.is_empty()
        || ws.len() != into.len()
        || !fits
        || dy.dim(candle_core::D::Minus1)? != total
        || dy.elem_count() != rows * total
        || dy.dtype() != dtype
    {
        candle_core::bail!(
            "linear backward: weights {:?}, {} destinations and the stacked gradient {:?} {:?} for input {:?} {dtype:?}",
            ws.iter().map(|w| w.dims().to_vec()).collect::<Vec<_>>(),
            into.len(),
            dy.shape(),
            dy.dtype(),
            x.shape()
        );
    }
    let dy = dy.contiguous()?;
    let (xp, dyp, size) = (tensor_ptr(x, "linear x")?, tensor_ptr(&dy, "linear dy")?, dtype.size_in_bytes());
    let starts: Vec<usize> = outs.iter().scan(0, |at, o| Some(std::mem::replace(at, *at + o))).collect();
    // dx = dy · [w_0; w_1; …] (packed, with zero columns up to xin)
    let (_packed, wp) = match ws {
        [w] if xin == inp => (None, tensor_ptr(w, "linear w")?),
        _ => {
            let (s, p) = alloc(&dev, dtype, total * xin)?;
            for ((w, &out), &start) in ws.iter().zip(&outs).zip(&starts) {
                copy_padded(&dev, dtype, tensor_ptr(w, "linear w")?, p + (start * xin * size) as u64, (out, inp, inp), (out, xin))?;
            }
            (Some(s), p)
        }
    };
    let (dxs, dx) = alloc(&dev, dtype, rows * xin)?;
    Gemm { m: rows, n: xin, k: total, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
        .run(&dev, dtype, dtype, dyp, wp, dx, false)?;
    let dx = wrap(dxs, x.shape().clone());
    // [dw_0; dw_1; …] (+)= dyᵀ · x
    let dw_gemm = Gemm { m: total, n: xin, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 };
    if xin == inp {
        if let Some((p, sums)) = stacked_sums(into, &outs, inp)? {
            dw_gemm.run(&dev, dtype, DType::F32, dyp, xp, p, true)?;
            return Ok((dx, sums));
        }
    }
    let dw_dtype = into[0].dtype(dtype);
    if into.iter().any(|to| to.dtype(dtype) != dw_dtype) {
        candle_core::bail!("linear backward: the stacked weights' gradients go to different dtypes");
    }
    let (dw_s, dw) = alloc(&dev, dw_dtype, total * xin)?;
    dw_gemm.run(&dev, dtype, dw_dtype, dyp, xp, dw, false)?;
    let packed = wrap(dw_s, (total, xin));
    let dw_size = dw_dtype.size_in_bytes();
    let dws = into.iter().zip(outs.iter().zip(&starts)).map(|(to, (&out, &start))| {
        to.finish(match xin == inp {
            true => packed.narrow(0, start, out)?,
            false => unpadded(&dev, dw_dtype, dw + (start * xin * dw_size) as u64, xin, (out, inp))?,
        })
    });
    Ok((dx, dws.collect::<Result<_>>()?))
}

/// The address of the first of `into`'s sums and the sums, where all are FP32 sums of the
/// weights' shapes `[outs[i], inp]` lying one after another in one buffer (as
/// [`backward_stacked`] returned them), so that one product accumulates into all in place.
fn stacked_sums(into: &[WeightGrad], outs: &[usize], inp: usize) -> Result<Option<(u64, Vec<Tensor>)>> {
    let Some(sums) =
        into.iter().map(|to| if let WeightGrad::Sum(Some(s)) = to { Some((*s).clone()) } else { None }).collect::<Option<Vec<Tensor>>>()
    else {
        return Ok(None);
    };
    let total: usize = outs.iter().sum();
    let Some(p) = sum_buffer(&sums[0], &[outs[0], inp], total * inp)? else { return Ok(None) };
    let mut at = p;
    for (s, &out) in sums.iter().zip(outs) {
        if s.dims() != [out, inp] || !same_storage(s, &sums[0]) || tensor_ptr(s, "gradient sum")? != at {
            return Ok(None);
        }
        at += (out * inp * 4) as u64;
    }
    Ok(Some((p, sums)))
}
