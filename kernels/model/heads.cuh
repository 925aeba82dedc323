// Attention head layouts: split [B, T, n, d] -> [B, n, T, d] and merge, its inverse.
// Rust twin: crates/model/src/fused/attention.rs (relayout); CPU reference: the composed
// reshape + transpose of crates/model/src/attention.rs.

#pragma once
#include "common.cuh"

// Head layouts: split [B, T, n, d] -> [B, n, T, d]; merge is the inverse. One thread per
// output element.
template <typename T>
__device__ void split_heads(const T* x, T* y, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int i = idx % d;
    size_t r = idx / d;
    int p = r % t;
    r /= t;
    int head = r % n;
    size_t bi = r / n;
    y[idx] = x[((bi * t + p) * n + head) * d + i];
}

template <typename T>
__device__ void merge_heads(const T* x, T* y, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int i = idx % d;
    size_t r = idx / d;
    int head = r % n;
    r /= n;
    int p = r % t;
    size_t bi = r / t;
    y[idx] = x[((bi * n + head) * t + p) * d + i];
}

// extern "C" entry points: split_heads_<dtype>, merge_heads_<dtype>.
#define HEADS_ENTRIES(T, S)                                                                                      \
    extern "C" __global__ void split_heads_##S(const T* x, T* y, int b, int t, int n, int d) {                 \
        split_heads<T>(x, y, b, t, n, d);                                                                        \
    }                                                                                                            \
    extern "C" __global__ void merge_heads_##S(const T* x, T* y, int b, int t, int n, int d) {                 \
        merge_heads<T>(x, y, b, t, n, d);                                                                        \
    }
HEADS_ENTRIES(bf16, bf16)
HEADS_ENTRIES(float, f32)
