// The sum of n FP32 values in a fixed order (the loss's mean over rows, run to run the same).
// Rust twin: crates/model/src/fused/lm_head.rs (ordered_sum); CPU reference: the composed
// loss's sum in crates/model/src/loss.rs.

#pragma once
#include "common.cuh"

// The sum of n FP32 values in a fixed order, by one block of 256 threads: thread i adds
// x[i], x[i + 256], ... in order, then a fixed tree over the threads.
extern "C" __global__ void ordered_sum_f32(const float* x, float* out, int n) {
    __shared__ float s[BLOCK_THREADS];
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}
