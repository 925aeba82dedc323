//! Host side of the tensor-core causal attention (`kernels/model/flash_attention.cu`:
//! FlashAttention-2, Dao 2023): which inputs it takes, its launch geometry and shared
//! memory, and its forward and backward passes over device addresses.
//!
//! Layouts: q, k (and dq, dk) `[B, heads, T, d]` as RoPE writes them; v, o, dO (and dv)
//! `[B, T, heads · d]` as the projections write and read them: the kernels index both
//! through strides, so no head relayout runs.

use super::{alloc, args, launch_in, Module};
use crate::fused_sizes::{flash_delta_rows_per_block, flash_smem, flash_strides, flash_supports, FlashPass, FLASH_TILE, FLASH_WARPS};
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CudaDevice, CudaStorage, DType, Result};

/// Whether the tensor-core kernels take a `dtype` attention of `dims` = (B, heads, T, d)
/// whose buffers start at `ptrs` ([`flash_supports`]: BF16, d 64 or 128, 16-byte aligned,
/// within the grid's and the stride arguments' ranges).
pub(crate) fn supports(dtype: DType, dims: (usize, usize, usize, usize), ptrs: &[u64]) -> bool {
    flash_supports(dtype == DType::BF16, dims, super::aligned16(ptrs))
}

/// One block of [`FLASH_WARPS`] warps per (tile of [`FLASH_TILE`] rows, batch entry × head),
/// with `pass`'s shared memory ([`flash_smem`]).
fn config(pass: FlashPass, (b, h, t, d): (usize, usize, usize, usize)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(FLASH_TILE) as u32, (b * h) as u32, 1),
        block_dim: ((FLASH_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: flash_smem(pass, d) as u32,
    }
}

/// The causal attention of q, k `[B, heads, T, d]` and v `[B, T, heads · d]` (BF16 device
/// addresses, `dims` = (B, heads, T, d), scores times `scale`): O `[B, T, heads · d]` (BF16)
/// and the rows' log-sum-exp of the scaled scores `[B · heads, T]` (F32), which the backward
/// needs.
pub(crate) fn forward(dev: &CudaDevice, (q, k, v): (u64, u64, u64), dims: (usize, usize, usize, usize), scale: f32) -> Result<(CudaStorage, CudaStorage)> {
    let (b, h, t, d) = dims;
    let (o_s, o) = alloc(dev, DType::BF16, b * t * h * d)?;
    let (lse_s, lse) = alloc(dev, DType::F32, b * h * t)?;
    let [qb, qh, qt, vb, vh, vt] = flash_strides(dims);
    let a = args![q, k, v, o, lse, h as i32, t as i32, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_fwd_d{d}"), DType::BF16, config(FlashPass::Forward, dims), &a)?;
    Ok((o_s, lse_s))
}

/// The gradients (dq, dk `[B, heads, T, d]`, dv `[B, T, heads · d]`, BF16) of the causal
/// attention from its inputs, its output `o`, the forward's log-sum-exp `lse` and the
/// output's gradient `d_o` (`[B, T, heads · d]`): FlashAttention-2's backward, with dK/dV
/// and dQ in two kernels so that no sum needs atomics (the same bits run to run).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dev: &CudaDevice,
    (q, k, v): (u64, u64, u64),
    (o, lse, d_o): (u64, u64, u64),
    dims: (usize, usize, usize, usize),
    scale: f32,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let (b, h, t, d) = dims;
    let n = b * h * t * d;
    let [qb, qh, qt, vb, vh, vt] = flash_strides(dims);
    let (_delta_s, delta) = alloc(dev, DType::F32, b * h * t)?;
    let rows = b * h * t;
    let rows_per_block = flash_delta_rows_per_block(d);
    let delta_cfg = LaunchConfig { grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1), block_dim: ((FLASH_WARPS * 32) as u32, 1, 1), shared_mem_bytes: 0 };
    let a = args![o, d_o, delta, h as i32, t as i32, rows as i32, vb, vh, vt];
    launch_in(dev, Module::Flash, &format!("flash_bwd_delta_d{d}"), DType::BF16, delta_cfg, &a)?;
    let ((dq_s, dq), (dk_s, dk), (dv_s, dv)) = (alloc(dev, DType::BF16, n)?, alloc(dev, DType::BF16, n)?, alloc(dev, DType::BF16, n)?);
    let (hi, ti) = (h as i32, t as i32);
    let a = args![q, k, v, d_o, lse, delta, dk, dv, hi, ti, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_bwd_kv_d{d}"), DType::BF16, config(FlashPass::KeyValueGrads, dims), &a)?;
    let a = args![q, k, v, d_o, lse, delta, dq, hi, ti, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_bwd_q_d{d}"), DType::BF16, config(FlashPass::QueryGrads, dims), &a)?;
    Ok((dq_s, dk_s, dv_s))
}
