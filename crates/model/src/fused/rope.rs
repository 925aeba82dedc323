//! Rotary position embedding fused with the head transpose, forward and backward
//! (reference: [`crate::rope::Rope::apply`] after splitting the heads).

use super::{alloc, args, cuda_device, grid, launch, tensor_ptr, wrap, Columns, BLOCK_THREADS};
use candle_core::{DType, Result, Tensor};

/// Launches `rope_fwd` or `rope_bwd` (same signature) on `dims` = (B, T, heads, d) whose
/// projection-layout side (`[B, T, heads · d]`) has row stride `ld`: one thread per 8
/// elements of a row's first half and their partners (16-byte accesses) where half a head
/// and `ld` are multiples of 8 elements and every buffer is 16-byte aligned, else one per
/// element pair.
fn run(
    dev: &candle_core::CudaDevice,
    name: &str,
    dtype: DType,
    src: u64,
    cos: u64,
    sin: u64,
    dst: u64,
    dims: (usize, usize, usize, usize),
    ld: usize,
) -> Result<()> {
    let (b, t, n, d) = dims;
    let vector = (d / 2).is_multiple_of(8) && ld.is_multiple_of(8) && super::aligned16(&[src, cos, sin, dst]);
    let per_thread = if vector { 8 } else { 1 };
    let threads = b * t * n * (d / 2) / per_thread;
    let (bi, ti, ni, di) = (b as i32, t as i32, n as i32, d as i32);
    let a = args![src, cos, sin, dst, bi, ti, ni, di, ld as i32];
    launch(dev, &format!("{name}{per_thread}"), dtype, grid(threads.div_ceil(BLOCK_THREADS as usize), 0), &a)
}

/// Checks the tables against `heads` heads of width d over `t` positions.
fn check_tables(cos: &Tensor, sin: &Tensor, t: usize, hd: usize, heads: usize) -> Result<usize> {
    let (tmax, d) = cos.dims2()?;
    if hd != heads * d || tmax < t || cos.dtype() != DType::F32 || sin.dims() != cos.dims() || sin.dtype() != DType::F32 {
        candle_core::bail!("rope: tables {:?}/{:?} do not fit {t} positions of {heads} heads, width {hd}", cos.shape(), sin.shape());
    }
    Ok(d)
}

/// Rotates a projection's output into `heads` heads: `x` `[B, T, heads · d]` (contiguous
/// BF16 or F32, positions `0..T`) → `[B, heads, T, d]`, `y = x cos + rotate_half(x) sin`
/// (HF "rotate_half"). `cos`, `sin`: F32 tables `[>= T, d]` ([`crate::rope::Rope::cos`]).
pub fn forward(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: usize) -> Result<Tensor> {
    let dev = cuda_device(x)?;
    let (b, t, h) = x.dims3()?;
    let d = check_tables(cos, sin, t, h, heads)?;
    let (out, y) = alloc(&dev, x.dtype(), b * t * h)?;
    let (xp, c, s) = (tensor_ptr(x, "rope x")?, tensor_ptr(cos, "rope cos")?, tensor_ptr(sin, "rope sin")?);
    run(&dev, "rope_fwd", x.dtype(), xp, c, s, y, (b, t, heads, d), h)?;
    Ok(wrap(out, (b, heads, t, d)))
}

/// The gradient of [`forward`]'s input `[B, T, heads · d]` from its output's gradient `dy`
/// `[B, heads, T, d]` (the rotation transposed: `dx = dy cos − rotate_half(dy sin)`, back in
/// the projection's layout): a new tensor, or (`into`) written into columns of a wider
/// `[B, T, W]` buffer (`None` returned).
pub fn backward(dy: &Tensor, cos: &Tensor, sin: &Tensor, into: Option<Columns>) -> Result<Option<Tensor>> {
    let dev = cuda_device(dy)?;
    let dy = dy.contiguous()?;
    let (b, n, t, d) = dy.dims4()?;
    check_tables(cos, sin, t, n * d, n)?;
    let (out, (dx, ld)) = match into {
        Some(cols) => (None, cols.target(&[b, t, n * d], dy.dtype())?),
        None => {
            let (dx_s, dx) = alloc(&dev, dy.dtype(), b * t * n * d)?;
            (Some(wrap(dx_s, (b, t, n * d))), (dx, n * d))
        }
    };
    let (g, c, s) = (tensor_ptr(&dy, "rope dy")?, tensor_ptr(cos, "rope cos")?, tensor_ptr(sin, "rope sin")?);
    run(&dev, "rope_bwd", dy.dtype(), g, c, s, dx, (b, t, n, d), ld)?;
    Ok(out)
}
