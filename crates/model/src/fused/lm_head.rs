//! The LM head and the cross-entropy as one op, in chunks of rows: the logits exist only for
//! [`CHUNK_ROWS`] rows at a time, in the model's dtype, with the vocabulary padded to a
//! multiple of 8 with zero rows of the head (see [`super::aligned`]). For training, the
//! gradients are computed in the forward pass from each chunk's logits while they exist
//! (as Liger-Kernel's fused linear cross-entropy and llm.c do), so the backward only scales
//! them: three matrix products per chunk in all instead of four (the backward of an op
//! without them recomputes the logits).

use super::cross_entropy::launch_rows;
use super::{aligned, alloc, args, cpu_unsupported, cuda_device, launch, storage_ptr, tensor_ptr, wrap, zero_padded, Gemm};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use std::sync::Mutex;

/// Rows of logits materialised at once: 4096 x 32100 BF16 logits are 263 MB.
const CHUNK_ROWS: usize = 4096;

/// Weighted negative log-likelihood of `hidden · wᵀ`, summed over rows:
/// `Σ_r weight_r · (logsumexp(l_r) − l_r[target_r])` with `l_r = hidden_r · wᵀ` (rows with
/// `weight_r = 0` add 0), as `crate::loss::masked_cross_entropy` of `linear(hidden, w)` with
/// `weight = mask / Σ mask`, but without the logits of the whole batch.
///
/// `hidden`: `[N, H]` BF16 or F32; `w`: `[V, H]` (nn.Linear layout), same dtype; `target`:
/// u32 `[N]` (`< V`, not checked on the device); `weight`: F32 `[N]` → F32 scalar.
/// Logits are rounded to the model's dtype (as the unfused head's output), the softmax is
/// FP32. Differentiable in `hidden` and `w`. `train`: compute the gradients in this pass
/// (FP32 `[N, H]` and `[V, H]` held until the backward, which multiplies them by the
/// output's gradient and rounds them to the model's dtype); without it the backward, if
/// any, recomputes the logits.
pub fn lm_head_cross_entropy(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor, train: bool) -> Result<Tensor> {
    let (n, h) = hidden.dims2()?;
    let (_, wh) = w.dims2()?;
    if wh != h || target.dims1()? != n || weight.dims1()? != n || target.dtype() != DType::U32 || weight.dtype() != DType::F32 {
        candle_core::bail!(
            "lm_head_cross_entropy: hidden {:?}, w {:?}, target {:?} {:?}, weight {:?} {:?}",
            hidden.shape(),
            w.shape(),
            target.shape(),
            target.dtype(),
            weight.shape(),
            weight.dtype()
        );
    }
    let op = LmHeadLoss { target: target.contiguous()?, weight: weight.contiguous()?, train, grads: Mutex::new(None) };
    hidden.contiguous()?.apply_op2(&w.contiguous()?, op)
}

struct LmHeadLoss {
    target: Tensor,
    weight: Tensor,
    train: bool,
    /// FP32 gradients of the output with respect to `hidden` `[N, H]` and the padded head
    /// `[aligned(V), H]`, from a `train` forward, taken by the backward.
    grads: Mutex<Option<(Tensor, Tensor)>>,
}

/// The padded head and the chunk loop of both passes.
struct Chunks {
    dev: CudaDevice,
    dtype: DType,
    /// The zero-padded head's buffer (kept alive while the chunks run).
    _w_buf: CudaStorage,
    /// `hidden`, the zero-padded head `[av, h]`, targets, per-row coefficients (device addresses).
    hidden: u64,
    w_pad: u64,
    target: u64,
    coef: u64,
    n: usize,
    h: usize,
    v: usize,
    av: usize,
}

impl Chunks {
    /// The chunks of `hidden` `[n, h]` against the head `w` `[v, h]` (device addresses,
    /// `dtype`), zero-padded here to `aligned(v)` rows, with the rows' targets and loss
    /// coefficients (F32) at `target` and `coef`.
    #[allow(clippy::too_many_arguments)]
    fn new(dev: &CudaDevice, dtype: DType, hidden: u64, w: u64, target: u64, coef: u64, (n, h, v): (usize, usize, usize)) -> Result<Chunks> {
        let av = aligned(v);
        let (_w_buf, w_pad) = zero_padded(dev, dtype, w, (v, h), (av, h))?;
        Ok(Chunks { dev: dev.clone(), dtype, _w_buf, hidden, w_pad, target, coef, n, h, v, av })
    }

    /// For each chunk of rows: the logits, then either `nll` (per-row weighted NLL, F32 `[N]`)
    /// alone, or the logits' gradient (`coef_r · (softmax − onehot)`, in place, with `nll`
    /// when given) and from it `dh[rows] = dlogits · w_pad` and `dw += dlogitsᵀ · hidden[rows]`
    /// (`dh` in `dh_dtype`, `dw` F32 `[av, h]`).
    fn run(&self, nll: Option<u64>, grads: Option<(u64, DType, u64)>) -> Result<()> {
        let (dev, dtype, (n, h, av)) = (&self.dev, self.dtype, (self.n, self.h, self.av));
        let (_buf, logits) = alloc(dev, dtype, CHUNK_ROWS.min(n) * av)?;
        let (vi, ld, elt) = (self.v as i32, av as i32, dtype.size_in_bytes());
        for r0 in (0..n).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(n - r0);
            let hid = self.hidden + (r0 * h * elt) as u64;
            Gemm { m: rows, n: av, k: h, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }.run(dev, dtype, dtype, hid, self.w_pad, logits, false)?;
            let (off, nll_r) = ((r0 * 4) as u64, nll.map_or(0, |p| p + (r0 * 4) as u64));
            let Some((dh, dh_dtype, dw)) = grads else {
                launch_rows(dev, "cross_entropy_fwd", dtype, (rows, av), &[logits], &args![logits, self.target + off, self.coef + off, nll_r, vi, ld])?;
                continue;
            };
            // the padding columns of dlogits become 0
            launch_rows(dev, "cross_entropy_bwd", dtype, (rows, av), &[logits], &args![logits, self.target + off, self.coef + off, logits, nll_r, vi, ld])?;
            Gemm { m: rows, n: h, k: av, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
                .run(dev, dtype, dh_dtype, logits, self.w_pad, dh + (r0 * h * dh_dtype.size_in_bytes()) as u64, false)?;
            Gemm { m: av, n: h, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
                .run(dev, dtype, DType::F32, logits, hid, dw, r0 > 0)?;
        }
        Ok(())
    }
}

impl CustomOp2 for LmHeadLoss {
    fn name(&self) -> &'static str {
        "lowbit-fused-lm-head-cross-entropy"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, hs: &CudaStorage, hl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = hs.device().clone();
        let dtype = hs.dtype();
        let ((n, h), (v, _)) = (hl.shape().dims2()?, wl.shape().dims2()?);
        let (target, coef) = (tensor_ptr(&self.target, "target")?, tensor_ptr(&self.weight, "weight")?);
        let (hidden, w) = (storage_ptr(hs, hl, "hidden")?, storage_ptr(ws, wl, "lm_head")?);
        let chunks = Chunks::new(&dev, dtype, hidden, w, target, coef, (n, h, v))?;
        let av = chunks.av;
        let (_nll, nll) = alloc(&dev, DType::F32, n)?;
        if self.train {
            let ((dh_s, dh), (dw_s, dw)) = (alloc(&dev, DType::F32, n * h)?, alloc(&dev, DType::F32, av * h)?);
            chunks.run(Some(nll), Some((dh, DType::F32, dw)))?;
            *self.grads.lock().expect("lm head gradients") = Some((wrap(dh_s, (n, h)), wrap(dw_s, (av, h))));
        } else {
            chunks.run(Some(nll), None)?;
        }
        Ok((ordered_sum(&dev, nll, n)?, Shape::from(())))
    }

    fn bwd(&self, hidden: &Tensor, w: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dtype = hidden.dtype();
        let v = w.dim(0)?;
        let g = g.to_dtype(DType::F32)?;
        // the first V rows of dw: the padding rows' gradients are 0 and dropped
        if let Some((dh, dw)) = self.grads.lock().expect("lm head gradients").take() {
            let dh = dh.broadcast_mul(&g)?.to_dtype(dtype)?;
            let dw = dw.narrow(0, 0, v)?.broadcast_mul(&g)?.to_dtype(dtype)?;
            return Ok((Some(dh), Some(dw)));
        }
        // no gradients from the forward: recompute the logits, with coef_r = weight_r · g
        let coef = self.weight.broadcast_mul(&g)?;
        let (dh, dw) = input_and_head_grads(hidden, w, &self.target, &coef, None)?;
        Ok((Some(dh), Some(dw)))
    }
}

/// The sum of `n` F32 values at `x` in a fixed order (one block), as a new F32 scalar buffer.
fn ordered_sum(dev: &CudaDevice, x: u64, n: usize) -> Result<CudaStorage> {
    let (out, sum) = alloc(dev, DType::F32, 1)?;
    launch(dev, "ordered_sum", DType::F32, super::grid(1, 0), &args![x, sum, n as i32])?;
    Ok(out)
}

/// [`lm_head_cross_entropy`] in training mode and its backward at once, for an explicit
/// backward ([`super::train`]): `scale` times the loss (F32 scalar), and the gradients of
/// that with respect to `hidden` and `w`, in their dtype. `scale` enters the rows' loss
/// coefficients, so the gradients come out of the chunks' products scaled (`hidden`'s in
/// its dtype; `w`'s summed over the chunks in F32, then rounded once).
pub(crate) fn loss_and_grads(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor, scale: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let (dev, n) = (cuda_device(hidden)?, hidden.dim(0)?);
    let coef = weight.affine(scale, 0.0)?.contiguous()?;
    let (_nll, nll) = alloc(&dev, DType::F32, n)?;
    let (dh, dw) = input_and_head_grads(hidden, w, target, &coef, Some(nll))?;
    Ok((wrap(ordered_sum(&dev, nll, n)?, ()), dh, dw))
}

/// The gradients of `Σ_r coef_r · nll_r` with respect to `hidden` `[n, h]` and the head `w`
/// `[v, h]`, in their dtype (the head's summed over the chunks in F32, then rounded once);
/// with `nll`, also each row's `coef_r · nll_r` (F32 `[n]`) there.
fn input_and_head_grads(hidden: &Tensor, w: &Tensor, target: &Tensor, coef: &Tensor, nll: Option<u64>) -> Result<(Tensor, Tensor)> {
    let (dev, dtype) = (cuda_device(hidden)?, hidden.dtype());
    let ((n, h), (v, _)) = (hidden.dims2()?, w.dims2()?);
    let (hp, wp) = (tensor_ptr(hidden, "hidden")?, tensor_ptr(w, "lm_head")?);
    let chunks = Chunks::new(&dev, dtype, hp, wp, tensor_ptr(target, "target")?, tensor_ptr(coef, "coef")?, (n, h, v))?;
    let ((dh_s, dh), (dw_s, dw)) = (alloc(&dev, dtype, n * h)?, alloc(&dev, DType::F32, chunks.av * h)?);
    chunks.run(nll, Some((dh, dtype, dw)))?;
    Ok((wrap(dh_s, (n, h)), wrap(dw_s, (chunks.av, h)).narrow(0, 0, v)?.to_dtype(dtype)?))
}
