// Per-tensor step counters (stalls.rs `Counter` of m, v and BF16 weights, the zero
// gradients and the updates with v = 0, m != 0), summed per lane in registers, per warp with one reduction each, and added to
// the tensor's slot of the device ring with one atomicAdd each when the warp leaves the
// tensor. The slot layout (COUNTERS u64 in this order) is cuda/adamw.rs `DeviceCounters`.
#pragma once
#include "warp.cuh"

#define COUNTERS 11  // (cuda/abi.rs) u64 per tensor slot: m, v, w (updated, stalled, unchanged), zero_grad, zero_v

// A lane's counts, two 16-bit counts per register (the lower half first) to spare the
// registers of the step kernels: m and v of each kind; w updated and stalled; w unchanged and
// the zero gradients. A lane counts at most 4 elements per segment and flushes at every
// tensor boundary: below 2^16 for any tensor under ~6e9 elements (the warp runs of a launch
// split its elements evenly over all warps, thousands on a GPU).
struct StepCounters {
    unsigned updated, stalled, unchanged;  // m | v << 16
    unsigned w_updated_stalled;            // w updated | w stalled << 16
    unsigned w_unchanged_zero_grad;        // w unchanged | zero gradients << 16
    unsigned zero_v;                       // updates with v = 0 and m != 0 (stalls.rs `zero_v`)
};

// Count one element of m and v: `changed` = the FP32 update is non-zero, `same` = the stored
// representation is unchanged (stalls.rs `Counter::add`).
__device__ __forceinline__ void count_mv(StepCounters& c, bool m_changed, bool m_same, bool v_changed, bool v_same) {
    c.updated += (unsigned)m_changed | ((unsigned)v_changed << 16);
    c.stalled += (unsigned)(m_changed && m_same) | ((unsigned)(v_changed && v_same) << 16);
    c.unchanged += (unsigned)m_same | ((unsigned)v_same << 16);
}

// Count one BF16 weight.
__device__ __forceinline__ void count_w(StepCounters& c, bool changed, bool same) {
    c.w_updated_stalled += (unsigned)changed | ((unsigned)(changed && same) << 16);
    c.w_unchanged_zero_grad += (unsigned)same;
}

// Count one zero gradient.
__device__ __forceinline__ void count_zero_grad(StepCounters& c, bool zero) { c.w_unchanged_zero_grad += (unsigned)zero << 16; }

// Count one update that used v = 0 with m != 0 (it moved by lr * m / eps).
__device__ __forceinline__ void count_zero_v(StepCounters& c, float m, float v) { c.zero_v += (unsigned)(v == 0.0f && m != 0.0f); }

// Warp sums of the lane counts into `slot` (COUNTERS u64 in DeviceCounters' order, one
// atomicAdd each), then zero them. Halves are summed apart (a warp's sum of lower halves
// may pass 2^16).
__device__ __forceinline__ void flush_counters(StepCounters& c, unsigned long long* slot) {
    const unsigned lo = 0xFFFFu;
    const unsigned x[COUNTERS] = {c.updated & lo, c.stalled & lo, c.unchanged & lo,
                                  c.updated >> 16, c.stalled >> 16, c.unchanged >> 16,
                                  c.w_updated_stalled & lo, c.w_updated_stalled >> 16, c.w_unchanged_zero_grad & lo,
                                  c.w_unchanged_zero_grad >> 16, c.zero_v};
#pragma unroll
    for (int i = 0; i < COUNTERS; i++) {
        const unsigned s = warp_sum(x[i]);
        if (threadIdx.x % 32 == 0 && s) atomicAdd(slot + i, (unsigned long long)s);
    }
    c = StepCounters{};
}
