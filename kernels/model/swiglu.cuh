// SwiGLU on the packed gate|up projection, forward and backward.
// Rust twin: crates/model/src/fused/mlp.rs (forward, backward); CPU reference: the composed
// silu(g) * u of crates/model/src/mlp.rs.

#pragma once
#include "common.cuh"

// SwiGLU: h = silu(g) * u. Backward: dg = dh * u * sig(g) * (1 + g * (1 - sig(g))),
// du = dh * silu(g).
//
// Packed gate/up: gu [rows, 2 * w] holds g in columns [0, w) and u in [w, 2w) (one matrix
// product for both projections). h [rows, w] = silu(g) * u; the backward writes dg and du
// into dgu [rows, 2 * w] in the same layout. One thread per V consecutive columns of h
// (V = 8: 16-byte accesses; w a multiple of V, buffers 16-byte aligned).
template <typename T, int V>
__device__ void swiglu_packed_fwd(const T* gu, T* h, size_t rows, int w) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    float g[V], u[V], out[V];
    load_vec<T, V>(gu + r * 2 * w + c, g);
    load_vec<T, V>(gu + r * 2 * w + w + c, u);
#pragma unroll
    for (int j = 0; j < V; j++) out[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    store_vec<T, V>(h + i, out);
}

template <typename T, int V>
__device__ void swiglu_packed_bwd(const T* gu, const T* dh, T* dgu, size_t rows, int w) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    size_t gi = r * 2 * w + c;
    float x[V], u[V], d[V], dg[V], du[V];
    load_vec<T, V>(gu + gi, x);
    load_vec<T, V>(gu + gi + w, u);
    load_vec<T, V>(dh + i, d);
#pragma unroll
    for (int j = 0; j < V; j++) {
        float sg = 1.0f / (1.0f + expf(-x[j]));
        dg[j] = d[j] * u[j] * sg * (1.0f + x[j] * (1.0f - sg));
        du[j] = d[j] * x[j] * sg;
    }
    store_vec<T, V>(dgu + gi, dg);
    store_vec<T, V>(dgu + gi + w, du);
}

// extern "C" entry points: swiglu_packed_fwd<V>_<dtype>, swiglu_packed_bwd<V>_<dtype>.
#define SWIGLU_ENTRIES(T, S, V)                                                                                  \
    extern "C" __global__ void swiglu_packed_fwd##V##_##S(const T* gu, T* h, size_t rows, int w) {              \
        swiglu_packed_fwd<T, V>(gu, h, rows, w);                                                                 \
    }                                                                                                            \
    extern "C" __global__ void swiglu_packed_bwd##V##_##S(const T* gu, const T* dh, T* dgu, size_t rows, int w) { \
        swiglu_packed_bwd<T, V>(gu, dh, dgu, rows, w);                                                           \
    }
SWIGLU_ENTRIES(bf16, bf16, 1)
SWIGLU_ENTRIES(bf16, bf16, 8)
SWIGLU_ENTRIES(float, f32, 1)
SWIGLU_ENTRIES(float, f32, 8)
