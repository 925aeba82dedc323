//! The LM head and the cross-entropy as one op, in chunks of rows: the logits exist only for
//! [`CHUNK_ROWS`] rows at a time, in the model's dtype, in both passes (the backward
//! recomputes them: one more matrix product instead of keeping `[B·T, V]` logits), with
//! the vocabulary padded to a multiple of 8 with zero rows of the head (see
//! [`super::aligned`]).

use super::{aligned, alloc, args, cpu_unsupported, cuda_device, launch, storage_ptr, tensor_ptr, wrap, zero_padded, Gemm, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Rows of logits materialised at once: 4096 x 32100 BF16 logits are 263 MB.
const CHUNK_ROWS: usize = 4096;

/// Per-row weighted negative log-likelihood of `hidden · wᵀ`:
/// `weight_r · (logsumexp(l_r) − l_r[target_r])` with `l_r = hidden_r · wᵀ` (0 where
/// `weight_r = 0`), as `crate::loss::masked_cross_entropy` of `linear(hidden, w)` but
/// without the logits of the whole batch.
///
/// `hidden`: `[N, H]` BF16 or F32; `w`: `[V, H]` (nn.Linear layout), same dtype; `target`:
/// u32 `[N]` (`< V`, not checked on the device); `weight`: F32 `[N]` → F32 `[N]`.
/// Logits are rounded to the model's dtype (as the unfused head's output), the softmax is
/// FP32. Differentiable in `hidden` and `w` (the gain of `w` accumulates over chunks in FP32).
pub fn lm_head_cross_entropy(hidden: &Tensor, w: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Tensor> {
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
    let op = LmHeadLoss { target: target.contiguous()?, weight: weight.contiguous()? };
    hidden.contiguous()?.apply_op2(&w.contiguous()?, op)
}

struct LmHeadLoss {
    target: Tensor,
    weight: Tensor,
}

fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// `logits[..rows] = hidden[r0 .. r0 + rows] · w_padᵀ` into the chunk buffer, `w_pad`
/// `[av, h]` (the head with zero rows up to `av = aligned(V)`).
#[allow(clippy::too_many_arguments)]
fn chunk_logits(dev: &CudaDevice, dtype: DType, hidden: u64, w_pad: u64, logits: u64, r0: usize, rows: usize, (av, h): (usize, usize)) -> Result<()> {
    let a = hidden + (r0 * h * dtype.size_in_bytes()) as u64;
    Gemm { m: rows, n: av, k: h, a_t: false, b_t: true, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }.run(dev, dtype, dtype, a, w_pad, logits, false)
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
        let av = aligned(v);
        let hp = storage_ptr(hs, hl, "hidden")?;
        let (_w, wp) = zero_padded(&dev, dtype, storage_ptr(ws, wl, "lm_head")?, (v, h), (av, h))?;
        let (t, wt) = (tensor_ptr(&self.target, "target")?, tensor_ptr(&self.weight, "weight")?);
        let (out, nll) = alloc(&dev, DType::F32, n)?;
        let (_buf, logits) = alloc(&dev, dtype, CHUNK_ROWS.min(n) * av)?;
        let (vi, ld) = (v as i32, av as i32);
        for r0 in (0..n).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(n - r0);
            chunk_logits(&dev, dtype, hp, wp, logits, r0, rows, (av, h))?;
            let off = (r0 * 4) as u64;
            launch(&dev, "cross_entropy_fwd", dtype, per_row(rows), &args![logits, t + off, wt + off, nll + off, vi, ld])?;
        }
        Ok((out, Shape::from(n)))
    }

    fn bwd(&self, hidden: &Tensor, w: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dev = cuda_device(hidden)?;
        let dtype = hidden.dtype();
        let ((n, h), (v, _)) = (hidden.dims2()?, w.dims2()?);
        let coef = (&self.weight * g.to_dtype(DType::F32)?)?.contiguous()?;
        let av = aligned(v);
        let (hp, t, c) = (tensor_ptr(hidden, "hidden")?, tensor_ptr(&self.target, "target")?, tensor_ptr(&coef, "coef")?);
        let (_w, wp) = zero_padded(&dev, dtype, tensor_ptr(w, "lm_head")?, (v, h), (av, h))?;
        let (dh_s, dh) = alloc(&dev, dtype, n * h)?;
        let (dw_acc_s, dw_acc) = alloc(&dev, DType::F32, av * h)?;
        let (_buf, logits) = alloc(&dev, dtype, CHUNK_ROWS.min(n) * av)?;
        let (vi, ld, elt) = (v as i32, av as i32, dtype.size_in_bytes());
        for r0 in (0..n).step_by(CHUNK_ROWS) {
            let rows = CHUNK_ROWS.min(n - r0);
            chunk_logits(&dev, dtype, hp, wp, logits, r0, rows, (av, h))?;
            // dlogits in place of the logits (each element is read before it is written; the
            // padding columns become 0)
            let off = (r0 * 4) as u64;
            launch(&dev, "cross_entropy_bwd", dtype, per_row(rows), &args![logits, t + off, c + off, logits, vi, ld])?;
            // dhidden = dlogits · w; dw (+)= dlogitsᵀ · hidden
            let hid = hp + (r0 * h * elt) as u64;
            Gemm { m: rows, n: h, k: av, a_t: false, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
                .run(&dev, dtype, dtype, logits, wp, dh + (r0 * h * elt) as u64, false)?;
            Gemm { m: av, n: h, k: rows, a_t: true, b_t: false, batch: 1, stride_a: 0, stride_b: 0, stride_c: 0 }
                .run(&dev, dtype, DType::F32, logits, hid, dw_acc, r0 > 0)?;
        }
        // the first V rows: the padding rows' gradients are 0 and dropped
        let dw = wrap(dw_acc_s, (v, h)).to_dtype(dtype)?;
        Ok((Some(wrap(dh_s, (n, h))), Some(dw)))
    }
}
