//! Per-row weighted cross-entropy on the logits' own dtype (no FP32 copy of the logits),
//! one block per row each way.

use super::{args, alloc, cpu_unsupported, cuda_device, launch, storage_ptr, tensor_ptr, wrap, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// `w_r · (logsumexp(x_r) − x_r[target_r])` per row, 0 where `w_r = 0` (the target is then
/// not read).
///
/// `logits`: `[..., V]` BF16 or F32, contiguous (read in place: `[B, T, V]` needs no
/// reshape); `target`: u32, one per row (`< V`, not checked on the device: the caller
/// checks); `weight`: F32, one per row → F32 `[rows]`. Arithmetic in FP32. Differentiable
/// in `logits`: `dx_r = g_r w_r (softmax(x_r) − onehot(target_r))`.
pub fn cross_entropy_rows(logits: &Tensor, target: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let v = logits.dim(candle_core::D::Minus1)?;
    let rows = logits.elem_count() / v.max(1);
    if target.elem_count() != rows || weight.elem_count() != rows || target.dtype() != DType::U32 || weight.dtype() != DType::F32 {
        candle_core::bail!("cross_entropy_rows: {rows} rows but target {:?} {:?}, weight {:?} {:?}", target.shape(), target.dtype(), weight.shape(), weight.dtype());
    }
    logits.contiguous()?.apply_op3(&target.contiguous()?, &weight.contiguous()?, CrossEntropy)
}

struct CrossEntropy;

/// Launches `cross_entropy_fwd` or `cross_entropy_bwd` (`name`), one block per row of `rows`
/// rows of row stride `ld` elements: 8 elements per access where the rows and the buffers
/// `ptrs` are 16-byte aligned, else one.
pub(crate) fn launch_rows(dev: &CudaDevice, name: &str, dtype: DType, (rows, ld): (usize, usize), ptrs: &[u64], a: &[super::Arg]) -> Result<()> {
    let per_access = if (ld * dtype.size_in_bytes()) % 16 == 0 && super::aligned16(ptrs) { 8 } else { 1 };
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    launch(dev, &format!("{name}{per_access}"), dtype, cfg, a)
}

impl CustomOp3 for CrossEntropy {
    fn name(&self) -> &'static str {
        "lowbit-fused-cross-entropy"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ts: &CudaStorage, tl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = xs.device().clone();
        let v = *xl.dims().last().unwrap_or(&1);
        let rows = xl.shape().elem_count() / v.max(1);
        let (x, t, w) = (storage_ptr(xs, xl, "logits")?, storage_ptr(ts, tl, "target")?, storage_ptr(ws, wl, "weight")?);
        let (out, nll) = alloc(&dev, DType::F32, rows)?;
        let vi = v as i32;
        launch_rows(&dev, "cross_entropy_fwd", xs.dtype(), (rows, v), &[x], &args![x, t, w, nll, vi, vi])?;
        Ok((out, Shape::from(rows)))
    }

    fn bwd(&self, logits: &Tensor, target: &Tensor, weight: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dev = cuda_device(logits)?;
        let coef = (weight * g.to_dtype(DType::F32)?)?.contiguous()?;
        let v = logits.dim(candle_core::D::Minus1)?;
        let rows = logits.elem_count() / v;
        let (x, t, c) = (tensor_ptr(logits, "logits")?, tensor_ptr(target, "target")?, tensor_ptr(&coef, "coef")?);
        let (dx_s, dx) = alloc(&dev, logits.dtype(), logits.elem_count())?;
        let vi = v as i32;
        launch_rows(&dev, "cross_entropy_bwd", logits.dtype(), (rows, v), &[x, dx], &args![x, t, c, dx, 0u64, vi, vi])?;
        Ok((Some(wrap(dx_s, logits.shape().clone())), None, None))
    }
}
