//! Bias-free linear layer as one custom op: cuBLAS products each way with the weight in its
//! stored `[out, in]` layout. Under candle's autograd the composed `x.matmul(&w.t())`
//! costs three more graph edges (reshape, transpose), each a zero-fill and an add in the
//! backward, one of them strided; this op hands back both gradients contiguous.

use super::{aligned, alloc, cpu_unsupported, cuda_device, storage_ptr, tensor_ptr, unpadded, wrap, zero_padded, Gemm};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// `x · wᵀ` (nn.Linear without bias): `x` `[..., in]` or `[..., aligned(in)]` (the padded
/// output of [`super::gate_up_swiglu`]: the padding columns of `x` must be 0; the weight is
/// padded with zero columns to match), `w` `[out, in]`, one dtype (BF16 or F32) →
/// `[..., out]`. FP32 accumulation (TF32 inputs for F32 when candle's reduced-precision
/// switch is on). Differentiable in both (`w`'s gradient `[out, in]`).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, inp) = w.dims2()?;
    let xin = x.dim(candle_core::D::Minus1)?;
    if (xin != inp && xin != aligned(inp)) || x.dtype() != w.dtype() {
        candle_core::bail!("linear: input {:?} {:?}, weight {:?} {:?}", x.shape(), x.dtype(), w.shape(), w.dtype());
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, Linear)
}

pub(crate) struct Linear;

/// The weight as the product needs it: itself, or zero-padded to `xin` columns (kept alive
/// by the returned storage).
fn weight(dev: &CudaDevice, dtype: DType, w: u64, (out, inp): (usize, usize), xin: usize) -> Result<(Option<CudaStorage>, u64)> {
    if xin == inp {
        return Ok((None, w));
    }
    let (s, p) = zero_padded(dev, dtype, w, (out, inp), (out, xin))?;
    Ok((Some(s), p))
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "lowbit-fused-linear"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = xs.device().clone();
        let dtype = xs.dtype();
        let (out, inp) = wl.shape().dims2()?;
        let xin = *xl.dims().last().expect("rank >= 1");
        let rows = xl.shape().elem_count() / xin;
        let x = storage_ptr(xs, xl, "linear x")?;
        let (_w, w) = weight(&dev, dtype, storage_ptr(ws, wl, "linear w")?, (out, inp), xin)?;
        let (ys, y) = alloc(&dev, dtype, rows * out)?;
        Gemm { m: rows, n: out, k: xin, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
            .run(&dev, dtype, dtype, x, w, y, false)?;
        let mut dims = xl.shape().dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = out;
        Ok((ys, Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, mut dw) = Linear::backward_shared_input(x, &[w], &[dy])?;
        Ok((Some(dx), dw.pop()))
    }
}

impl Linear {
    /// The backward of one or several linear layers that read one input `x` `[..., in]` or
    /// `[..., aligned(in)]` (as [`linear`]; several: the q, k and v projections):
    /// `dx = Σ dy_i · w_i`, each product added into one output by cuBLAS (C += A·B, FP32
    /// accumulation, one rounding per product as separate adds would give), and each
    /// `dw_i = dy_iᵀ · x` `[out_i, in]`. `ws[i]` `[out_i, in]`, `dys[i]` `[..., out_i]`, one
    /// dtype.
    pub(crate) fn backward_shared_input(x: &Tensor, ws: &[&Tensor], dys: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
        let dev = cuda_device(x)?;
        let dtype = x.dtype();
        let xin = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / xin;
        let xp = tensor_ptr(x, "linear x")?;
        let (dxs, dx) = alloc(&dev, dtype, rows * xin)?;
        let mut dws = Vec::with_capacity(ws.len());
        for (i, (w, dy)) in ws.iter().zip(dys).enumerate() {
            let (out, inp) = w.dims2()?;
            if (xin != inp && xin != aligned(inp)) || dy.elem_count() != rows * out {
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
}
