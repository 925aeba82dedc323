// Launch arguments of the fused AdamW kernels (adamw.cu), passed by value: the host-side
// twin is cuda/adamw.rs (`StepArgs`, `TensorArgs`, `LaunchArgs`, same field order, `#[repr(C)]`);
// both sides assert the same sizes.
#pragma once

// Shared with the Rust launcher through crates/optim/src/cuda/abi.rs (its tests read these).
#define MAX_TENSORS 240  // per launch: the kernel parameters (30.1 KiB) stay under 32 KiB (CUDA 12.1+)
#define STEP_ARGS_BYTES 128
#define TENSOR_ARGS_BYTES 128

// Host-computed constants of one step, the same for every tensor (mirrors StepScalars).
struct StepArgs {
    unsigned long long segments;  // segments of all tensors of this launch
    float grad_scale, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
    float inv_bias_correction1, inv_bias_correction2;
    unsigned block;               // scale block length; 0 = per tensor (amax precomputed)
    int reset_m, reset_v;         // zero the state before the update
    int round_m, round_v, round_w;
    unsigned zero_m, zero_v;      // int8: index of 0 in the signed / unsigned map
    unsigned count;               // tensors in this launch
    unsigned frac_m, frac_v;      // e8mK states: K
    unsigned zero_free;           // 1: a block-scaled v never encodes to 0 in a non-zero block
    unsigned scale_m, scale_v;    // FP8/FP4 scale kinds (scale.cuh SCALE_POW2 / SCALE_AMAX)
    unsigned keep_idle_v;         // with reset_v: elements whose gradient is 0 keep their v
    unsigned skip_m, skip_v;      // simulated stalling: an element keeps its stored m (v) when the
                                  // low (high) 32 bits of its draw of key_skip are below this
    unsigned dither_m, dither_v;  // 1: the old m (v) read moves back by its block's draw of
                                  // key_m_read (key_v_read) (dither.cuh; adamw.rs `StepKeys::m_read`)
    unsigned momentum_only;       // Muon's momentum (MOMENTUM_*, muon/momentum.rs): m alone is
                                  // stepped (beta1 = its momentum), v is neither read nor written
                                  // (reset_v = 1, an FP32 v kernel), and p is an FP32 buffer that
                                  // receives the update u to orthogonalise instead of weights
    unsigned pad;
};

// StepArgs::momentum_only (cuda/abi.rs reads these)
#define MOMENTUM_NONE 0      // AdamW
#define MOMENTUM_NESTEROV 1  // u = (1 - b) g + b m
#define MOMENTUM_PLAIN 2     // u = m

// One tensor of the launch (mirrors StepKeys + the per-tensor decay).
struct TensorArgs {
    unsigned long long p, g, mc, ms, vc, vs;  // weights, gradient, m/v codes and scales
    unsigned long long n, key_m, key_v, key_w, key_skip;
    unsigned long long key_m_read, key_v_read;  // dither: the streams of the write being read
    unsigned long long first_segment;         // in the launch's numbering
    unsigned long long offset;                // whole-tensor index of element 0 (a ZeRO-1
                                              // shard's start, a multiple of 4; else 0): the
                                              // random bits are those of element offset + e
    float decay;                              // 1 - lr * wd
    unsigned index;                           // optimizer tensor index: counters, amax slots
};

struct LaunchArgs {
    StepArgs s;
    TensorArgs t[MAX_TENSORS];
};

// The step's clip decided on the device (grad_norm.cu `sum_partials`), or null: the host's
// `grad_scale` holds. gate = {factor, skip}; with skip != 0 every kernel of the step returns
// at once (weights, states, scales and counters unchanged: a skipped update).
__device__ __forceinline__ bool skipped(const float* gate) { return gate && gate[1] != 0.0f; }

// The launch's constants with the device's clip factor as grad_scale (gate non-null).
__device__ __forceinline__ StepArgs step_args(const LaunchArgs& L, const float* gate) {
    StepArgs a = L.s;
    if (gate) a.grad_scale = gate[0];
    return a;
}

// cuda/adamw.rs asserts the same sizes of its mirrors (cuda/abi.rs)
static_assert(sizeof(StepArgs) == STEP_ARGS_BYTES, "StepArgs layout (cuda/adamw.rs StepArgs)");
static_assert(sizeof(TensorArgs) == TENSOR_ARGS_BYTES, "TensorArgs layout (cuda/adamw.rs TensorArgs)");
static_assert(sizeof(LaunchArgs) == STEP_ARGS_BYTES + TENSOR_ARGS_BYTES * MAX_TENSORS, "LaunchArgs layout (cuda/adamw.rs LaunchArgs)");
