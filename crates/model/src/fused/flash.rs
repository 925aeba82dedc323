//! Host side of the tensor-core causal attention (`kernels/model/flash_attention.cu`:
//! FlashAttention-2, Dao 2023): which inputs it takes, its launch geometry and shared
//! memory, and its forward and backward passes over device addresses.
//!
//! Layouts: q, k (and dq, dk) `[B, heads, T, d]` as RoPE writes them; v, o, dO (and dv)
//! `[B, T, heads · d]` as the projections write and read them: the kernels index both
//! through strides, so no head relayout runs.

use super::{alloc, args, launch_in, Module};
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CudaDevice, CudaStorage, DType, Result};

/// Rows per tile (`BR` in the kernel file) and warps per block (`NW`).
const TILE: usize = 64;
const WARPS: usize = 4;

/// Whether the tensor-core kernels take a `dtype` attention of `dims` = (B, heads, T, d)
/// whose buffers start at `ptrs`: BF16, `d` 64 or 128, 16-byte aligned starts (the kernels
/// move 8 elements per load), B · heads within a grid's y extent (65535) and the largest
/// stride, heads · T · d elements per batch entry, within `i32` (the kernels' stride
/// arguments; offsets are computed in 64 bits). Everything else runs the cuBLAS composition.
pub(crate) fn supports(dtype: DType, (b, h, t, d): (usize, usize, usize, usize), ptrs: &[u64]) -> bool {
    dtype == DType::BF16
        && (d == 64 || d == 128)
        && super::aligned16(ptrs)
        && b * h <= 65535
        && h * t * d <= i32::MAX as usize
}

/// The kernels' passes, for their shared-memory sizes.
#[derive(Clone, Copy)]
enum Pass {
    Forward,
    KeyValueGrads,
    QueryGrads,
}

/// Dynamic shared memory of `pass` at head dim `d`, in bytes: the formulas `fwd_smem`,
/// `bwd_kv_smem`, `bwd_q_smem` of the kernel file (BF16 tiles of `TILE` rows with row stride
/// `d + 8`: three in the forward, four in each backward pass, which for dK/dV also keeps
/// the query tile's FP32 log-sum-exp and delta). The score tiles live in registers.
fn smem(pass: Pass, d: usize) -> usize {
    let tile = TILE * (d + 8) * 2;
    match pass {
        Pass::Forward => 3 * tile,
        Pass::KeyValueGrads => 4 * tile + 2 * TILE * 4,
        Pass::QueryGrads => 4 * tile,
    }
}

/// One block of `WARPS` warps per (tile of `TILE` rows, batch entry × head).
fn config(pass: Pass, (b, h, t, d): (usize, usize, usize, usize)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (t.div_ceil(TILE) as u32, (b * h) as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: smem(pass, d) as u32,
    }
}

/// Element strides (batch entry, head, position) of q/k `[B, heads, T, d]` and of
/// v/o `[B, T, heads · d]`, as kernel arguments.
fn strides((_, h, t, d): (usize, usize, usize, usize)) -> [i32; 6] {
    [(h * t * d) as i32, (t * d) as i32, d as i32, (t * h * d) as i32, d as i32, (h * d) as i32]
}

/// The causal attention of q, k `[B, heads, T, d]` and v `[B, T, heads · d]` (BF16 device
/// addresses, `dims` = (B, heads, T, d), scores times `scale`): O `[B, T, heads · d]` (BF16)
/// and the rows' log-sum-exp of the scaled scores `[B · heads, T]` (F32), which the backward
/// needs.
pub(crate) fn forward(dev: &CudaDevice, (q, k, v): (u64, u64, u64), dims: (usize, usize, usize, usize), scale: f32) -> Result<(CudaStorage, CudaStorage)> {
    let (b, h, t, d) = dims;
    let (o_s, o) = alloc(dev, DType::BF16, b * t * h * d)?;
    let (lse_s, lse) = alloc(dev, DType::F32, b * h * t)?;
    let [qb, qh, qt, vb, vh, vt] = strides(dims);
    let a = args![q, k, v, o, lse, h as i32, t as i32, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_fwd_d{d}"), DType::BF16, config(Pass::Forward, dims), &a)?;
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
    let [qb, qh, qt, vb, vh, vt] = strides(dims);
    let (_delta_s, delta) = alloc(dev, DType::F32, b * h * t)?;
    let rows = b * h * t;
    // `delta_rows_per_block` in the kernel file: d / 8 lanes per row.
    let rows_per_block = WARPS * 32 / (d / 8);
    let delta_cfg = LaunchConfig { grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1), block_dim: ((WARPS * 32) as u32, 1, 1), shared_mem_bytes: 0 };
    let a = args![o, d_o, delta, h as i32, t as i32, rows as i32, vb, vh, vt];
    launch_in(dev, Module::Flash, &format!("flash_bwd_delta_d{d}"), DType::BF16, delta_cfg, &a)?;
    let ((dq_s, dq), (dk_s, dk), (dv_s, dv)) = (alloc(dev, DType::BF16, n)?, alloc(dev, DType::BF16, n)?, alloc(dev, DType::BF16, n)?);
    let (hi, ti) = (h as i32, t as i32);
    let a = args![q, k, v, d_o, lse, delta, dk, dv, hi, ti, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_bwd_kv_d{d}"), DType::BF16, config(Pass::KeyValueGrads, dims), &a)?;
    let a = args![q, k, v, d_o, lse, delta, dq, hi, ti, qb, qh, qt, vb, vh, vt, scale];
    launch_in(dev, Module::Flash, &format!("flash_bwd_q_d{d}"), DType::BF16, config(Pass::QueryGrads, dims), &a)?;
    Ok((dq_s, dk_s, dv_s))
}
