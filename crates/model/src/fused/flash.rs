//! Host side of the fused causal attention: FlashAttention-2 (Dao 2023) on tensor cores for
//! BF16 (`kernels/model/flash_attention.cu`) and on CUDA cores for FP32
//! (`kernels/model/flash_attention_f32.cu`, FP32 products, no TF32): which inputs they take,
//! their launch geometry and shared memory, and their forward and backward passes over
//! device addresses.
//!
//! Layouts: q, k (and dq, dk) `[B, heads, T, d]` as RoPE writes them; v, o, dO (and dv)
//! `[B, T, heads · d]` as the projections write and read them, dv also into the columns of
//! a wider `[B, T, W]` buffer: the kernels index all through strides, so no head relayout
//! runs.

use super::{alloc, args, launch_in, Module};
use crate::fused_sizes::{flash_dq_partials, flash_strides, flash_supports, FlashKernels, FlashPass, FLASH_TILE};
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CudaDevice, CudaStorage, DType, Result};

/// Whether the kernels take a `dtype` attention of `dims` = (B, heads, T, d) whose buffers
/// start at `ptrs` ([`flash_supports`]: BF16 or F32, d 64 or 128, 16-byte aligned, within
/// the grid's and the stride arguments' ranges).
pub(crate) fn supports(dtype: DType, dims: (usize, usize, usize, usize), ptrs: &[u64]) -> bool {
    flash_supports(FlashKernels::of(dtype), dims, super::aligned16(ptrs))
}

/// The kernels of `dtype` and their compiled file.
fn kernels(dtype: DType) -> Result<(FlashKernels, Module)> {
    match FlashKernels::of(dtype) {
        Some(k @ FlashKernels::TensorCoreBf16) => Ok((k, Module::Flash)),
        Some(k @ FlashKernels::CudaCoreF32) => Ok((k, Module::FlashF32)),
        None => candle_core::bail!("fused attention: no kernels for {dtype:?}"),
    }
}

/// One block per (tile of [`FLASH_TILE`] rows, batch entry × head), with `pass`'s shared
/// memory.
fn config(kernels: FlashKernels, pass: FlashPass, (b, h, t, d): (usize, usize, usize, usize)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(FLASH_TILE) as u32, (b * h) as u32, 1),
        block_dim: (kernels.threads() as u32, 1, 1),
        shared_mem_bytes: kernels.smem(pass, d) as u32,
    }
}

/// `blocks` blocks of the kernels' width without shared memory.
fn flat(kernels: FlashKernels, blocks: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (kernels.threads() as u32, 1, 1), shared_mem_bytes: 0 }
}

/// The causal attention of q, k `[B, heads, T, d]` and v `[B, T, heads · d]` (`dtype` device
/// addresses, BF16 or F32, `dims` = (B, heads, T, d), scores times `scale`): O
/// `[B, T, heads · d]` (`dtype`) and the rows' log-sum-exp of the scaled scores
/// `[B · heads, T]` (F32), which the backward needs.
pub(crate) fn forward(
    dev: &CudaDevice,
    dtype: DType,
    (q, k, v): (u64, u64, u64),
    dims: (usize, usize, usize, usize),
    scale: f32,
) -> Result<(CudaStorage, CudaStorage)> {
    let (b, h, t, d) = dims;
    let (kern, module) = kernels(dtype)?;
    let (o_s, o) = alloc(dev, dtype, b * t * h * d)?;
    let (lse_s, lse) = alloc(dev, DType::F32, b * h * t)?;
    let [qb, qh, qt, vb, vh, vt] = flash_strides(dims);
    let a = args![q, k, v, o, lse, h as i32, t as i32, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, module, &format!("flash_fwd_d{d}"), dtype, config(kern, FlashPass::Forward, dims), &a)?;
    Ok((o_s, lse_s))
}

/// The gradients (dq, dk `[B, heads, T, d]`, dv `[B, T, heads · d]`, `dtype`) of the causal
/// attention from its inputs, its output `o`, the forward's log-sum-exp `lse` and the
/// output's gradient `d_o` (`[B, T, heads · d]`): FlashAttention-2's backward without
/// atomics (the same bits run to run). dK and dV come from a pass over key tiles; dQ from a
/// pass over query tiles (BF16) or from the sum of FP32 partials that the key-tile pass
/// writes, one `[64, d]` per pair of tiles ([`flash_dq_partials`] elements, freed on return).
/// dv goes to a new buffer (returned), or (`dv_into`: address, row stride in elements) into
/// the columns of a wider `[B, T, W]` buffer.
pub(crate) fn backward(
    dev: &CudaDevice,
    dtype: DType,
    (q, k, v): (u64, u64, u64),
    (o, lse, d_o): (u64, u64, u64),
    dv_into: Option<(u64, usize)>,
    dims: (usize, usize, usize, usize),
    scale: f32,
) -> Result<(CudaStorage, CudaStorage, Option<CudaStorage>)> {
    let (b, h, t, d) = dims;
    let (kern, module) = kernels(dtype)?;
    let n = b * h * t * d;
    let [qb, qh, qt, vb, vh, vt] = flash_strides(dims);
    let (_delta_s, delta) = alloc(dev, DType::F32, b * h * t)?;
    let rows = b * h * t;
    let a = args![o, d_o, delta, h as i32, t as i32, rows as i32, vb, vh, vt];
    launch_in(dev, module, &format!("flash_bwd_delta_d{d}"), dtype, flat(kern, rows.div_ceil(kern.delta_rows_per_block(d))), &a)?;
    let ((dq_s, dq), (dk_s, dk)) = (alloc(dev, dtype, n)?, alloc(dev, dtype, n)?);
    let (dv_s, dv, dv_ld) = match dv_into {
        Some((p, ld)) => (None, p, ld),
        None => alloc(dev, dtype, n).map(|(s, p)| (Some(s), p, h * d))?,
    };
    let [db, dh, dt] = [t * dv_ld, d, dv_ld].map(|x| x as i32);
    let (hi, ti) = (h as i32, t as i32);
    match kern {
        FlashKernels::TensorCoreBf16 => {
            let a = args![q, k, v, d_o, lse, delta, dk, dv, hi, ti, qb, qh, qt, vb, vh, vt, db, dh, dt, scale];
            launch_in(dev, module, &format!("flash_bwd_kv_d{d}"), dtype, config(kern, FlashPass::KeyValueGrads, dims), &a)?;
            let a = args![q, k, v, d_o, lse, delta, dq, hi, ti, qb, qh, qt, vb, vh, vt, scale];
            launch_in(dev, module, &format!("flash_bwd_q_d{d}"), dtype, config(kern, FlashPass::QueryGrads, dims), &a)?;
        }
        FlashKernels::CudaCoreF32 => {
            let (_part_s, part) = alloc(dev, DType::F32, flash_dq_partials(dims))?;
            let a = args![q, k, v, d_o, lse, delta, dk, dv, part, hi, ti, qb, qh, qt, vb, vh, vt, db, dh, dt, scale];
            launch_in(dev, module, &format!("flash_bwd_kv_d{d}"), dtype, config(kern, FlashPass::KeyValueGrads, dims), &a)?;
            let tiles = t.div_ceil(FLASH_TILE) as i32;
            let a = args![part, dq, hi, ti, tiles, rows as i32, qb, qh, qt];
            launch_in(dev, module, &format!("flash_dq_sum_d{d}"), dtype, flat(kern, (rows * d / 4).div_ceil(kern.threads())), &a)?;
        }
    }
    Ok((dq_s, dk_s, dv_s))
}
