// RoPE forward and backward, fused with the head transpose.
// Rust twin: crates/model/src/fused/rope.rs (forward, backward); CPU reference: the composed
// rotary embedding of crates/model/src/rope.rs.

#pragma once
#include "common.cuh"

// RoPE, HF rotate_half convention, fused with the head transpose:
// x [B, T, n, d] (a projection's output) -> y [B, n, T, d],
// y_i = x_i cos_i + r_i sin_i with r_i = -x_{i+d/2} (i < d/2), x_{i-d/2} (i >= d/2);
// cos/sin: FP32 tables [>= T, d] (row t = position t).
// Backward: dy [B, n, T, d] -> dx [B, T, n, d],
// dx_j = dy_j cos_j + (j < d/2 ? dy_{j+d/2} sin_{j+d/2} : -dy_{j-d/2} sin_{j-d/2}).
// The [B, T, n, d] side (x, dx) has row stride ld >= n * d elements per position (a slot of
// a wider buffer: the q, k, v projections' outputs or gradients side by side).
// One thread per V elements of the first half of a row and their partners in the second
// half (V = 8: 16-byte loads and stores; the host takes V = 1 where d/2 is not a multiple
// of 8 or a buffer is not 16-byte aligned).

template <typename T, int V, bool BWD>
__device__ void rope(const T* src, const float* cos, const float* sin, T* dst, int b, int t, int n, int d, int ld) {
    int half = d / 2, chunks = half / V;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * chunks) return;
    int c = (int)(idx % chunks) * V;
    size_t r = idx / chunks;  // src's row: (bi * t + p) * n + head forward, (bi * n + head) * t + p backward
    int p = BWD ? r % t : (r / n) % t;
    int head = BWD ? (r / t) % n : r % n;
    size_t bi = r / ((size_t)t * n);
    T* out = dst + (BWD ? (bi * t + p) * ld + head * d : ((bi * n + head) * t + p) * d);
    const T* in = src + (BWD ? r * d : (bi * t + p) * ld + head * d);
    const float *cr = cos + (size_t)p * d, *sr = sin + (size_t)p * d;
    float a1[V], a2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    load_vec<T, V>(in + c, a1);
    load_vec<T, V>(in + half + c, a2);
    load_vec<float, V>(cr + c, c1);
    load_vec<float, V>(cr + half + c, c2);
    load_vec<float, V>(sr + c, s1);
    load_vec<float, V>(sr + half + c, s2);
#pragma unroll
    for (int j = 0; j < V; j++) {
        o1[j] = BWD ? a1[j] * c1[j] + a2[j] * s2[j] : a1[j] * c1[j] - a2[j] * s1[j];
        o2[j] = BWD ? a2[j] * c2[j] - a1[j] * s1[j] : a2[j] * c2[j] + a1[j] * s2[j];
    }
    store_vec<T, V>(out + c, o1);
    store_vec<T, V>(out + half + c, o2);
}

// extern "C" entry points: rope_fwd<V>_<dtype>, rope_bwd<V>_<dtype> (V elements per thread).
#define ROPE_ENTRIES(T, S, V)                                                                                    \
    extern "C" __global__ void rope_fwd##V##_##S(const T* x, const float* cos, const float* sin, T* y, int b,   \
                                                 int t, int n, int d, int ld) {                                  \
        rope<T, V, false>(x, cos, sin, y, b, t, n, d, ld);                                                       \
    }                                                                                                            \
    extern "C" __global__ void rope_bwd##V##_##S(const T* dy, const float* cos, const float* sin, T* dx, int b, \
                                                 int t, int n, int d, int ld) {                                  \
        rope<T, V, true>(dy, cos, sin, dx, b, t, n, d, ld);                                                      \
    }
ROPE_ENTRIES(bf16, bf16, 1)
ROPE_ENTRIES(bf16, bf16, 8)
ROPE_ENTRIES(float, f32, 1)
ROPE_ENTRIES(float, f32, 8)
