// Causal softmax of attention scores, forward and backward.
// Rust twin: crates/model/src/fused/attention.rs (probabilities, backward); CPU reference:
// the composed masked softmax of crates/model/src/attention.rs.

#pragma once
#include "common.cuh"

// Causal softmax of attention scores: s [rows = B*heads*T, T] FP32 (q.k, unscaled),
// p = softmax(scale * s) over columns j <= i (i = row % T), 0 above the diagonal.
// Backward: ds = scale * p * (dp - sum_j p_j dp_j), dp FP32.

template <typename T>
__device__ void causal_softmax_fwd(const float* s, T* p, int rows, int t, float scale) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31, last = row % t;
    const float* sr = s + (size_t)row * t;
    T* pr = p + (size_t)row * t;
    float m = -INFINITY;
    for (int j = lane; j <= last; j += 32) m = fmaxf(m, sr[j] * scale);
    m = warp_max(m);
    float sum = 0.f;
    for (int j = lane; j <= last; j += 32) sum += expf(sr[j] * scale - m);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < t; j += 32) pr[j] = from_f<T>(j <= last ? expf(sr[j] * scale - m) * inv : 0.f);
}

template <typename T>
__device__ void causal_softmax_bwd(const T* p, const float* dp, T* ds, int rows, int t, float scale) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31, last = row % t;
    size_t o = (size_t)row * t;
    float dot = 0.f;
    for (int j = lane; j <= last; j += 32) dot += to_f(p[o + j]) * dp[o + j];
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32) ds[o + j] = from_f<T>(j <= last ? scale * to_f(p[o + j]) * (dp[o + j] - dot) : 0.f);
}

// extern "C" entry points: causal_softmax_fwd_<dtype>, causal_softmax_bwd_<dtype>.
#define SOFTMAX_ENTRIES(T, S)                                                                                    \
    extern "C" __global__ void causal_softmax_fwd_##S(const float* s, T* p, int rows, int t, float scale) {     \
        causal_softmax_fwd<T>(s, p, rows, t, scale);                                                             \
    }                                                                                                            \
    extern "C" __global__ void causal_softmax_bwd_##S(const T* p, const float* dp, T* ds, int rows, int t,      \
                                                      float scale) {                                             \
        causal_softmax_bwd<T>(p, dp, ds, rows, t, scale);                                                        \
    }
SOFTMAX_ENTRIES(bf16, bf16)
SOFTMAX_ENTRIES(float, f32)
