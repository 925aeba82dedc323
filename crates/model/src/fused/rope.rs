//! Rotary position embedding fused with the head transpose, forward and backward.

use super::{args, alloc, cpu_unsupported, cuda_device, grid, launch, storage_ptr, tensor_ptr, wrap, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// Rotates a projection's output into `heads` heads: `x` `[B, T, heads · d]` (BF16 or F32,
/// positions `0..T`) → `[B, heads, T, d]`, `y = x cos + rotate_half(x) sin` (HF
/// "rotate_half", as [`crate::rope::Rope::apply`] after splitting the heads). `cos`, `sin`:
/// F32 tables `[>= T, d]` ([`crate::rope::Rope::cos`]). Differentiable in `x`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: usize) -> Result<Tensor> {
    let (_, t, h) = x.dims3()?;
    let (tmax, d) = cos.dims2()?;
    if h != heads * d || tmax < t || cos.dtype() != DType::F32 || sin.dims() != cos.dims() || sin.dtype() != DType::F32 {
        candle_core::bail!("rope: tables {:?}/{:?} do not fit input {:?} with {heads} heads", cos.shape(), sin.shape(), x.shape());
    }
    x.contiguous()?.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { heads })
}

pub(crate) struct Rope {
    pub(crate) heads: usize,
}

/// Launches `rope_fwd` or `rope_bwd` (same signature): one thread per 8 elements of a row's
/// first half and their partners (16-byte accesses) where half a head is a multiple of 8
/// elements and every buffer is 16-byte aligned, else one per element pair.
#[allow(clippy::too_many_arguments)]
fn run(dev: &candle_core::CudaDevice, name: &str, dtype: DType, src: u64, cos: u64, sin: u64, dst: u64, dims: (usize, usize, usize, usize)) -> Result<()> {
    let (b, t, n, d) = dims;
    let vector = (d / 2) % 8 == 0 && super::aligned16(&[src, cos, sin, dst]);
    let per_thread = if vector { 8 } else { 1 };
    let threads = b * t * n * (d / 2) / per_thread;
    let (bi, ti, ni, di) = (b as i32, t as i32, n as i32, d as i32);
    let a = args![src, cos, sin, dst, bi, ti, ni, di];
    launch(dev, &format!("{name}{per_thread}"), dtype, grid(threads.div_ceil(THREADS as usize), 0), &a)
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "lowbit-fused-rope"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, cs: &CudaStorage, cl: &Layout, ss: &CudaStorage, sl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = xs.device().clone();
        let (b, t, h) = xl.shape().dims3()?;
        let (n, d) = (self.heads, h / self.heads);
        let (out, y) = alloc(&dev, xs.dtype(), b * t * h)?;
        let (x, c, s) = (storage_ptr(xs, xl, "rope x")?, storage_ptr(cs, cl, "rope cos")?, storage_ptr(ss, sl, "rope sin")?);
        run(&dev, "rope_fwd", xs.dtype(), x, c, s, y, (b, t, n, d))?;
        Ok((out, Shape::from((b, n, t, d))))
    }

    fn bwd(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dev = cuda_device(x)?;
        let dy = dy.contiguous()?;
        let (b, t, h) = x.dims3()?;
        let (n, d) = (self.heads, h / self.heads);
        let (dx_s, dx) = alloc(&dev, x.dtype(), b * t * h)?;
        let (g, c, s) = (tensor_ptr(&dy, "rope dy")?, tensor_ptr(cos, "rope cos")?, tensor_ptr(sin, "rope sin")?);
        run(&dev, "rope_bwd", x.dtype(), g, c, s, dx, (b, t, n, d))?;
        Ok((Some(wrap(dx_s, x.shape().clone())), None, None))
    }
}
