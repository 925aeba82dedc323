// What both attention kernel files (flash_attention.cu: BF16, flash_attention_f32.cu: FP32)
// share: the strides of a head view and the backward's first step, delta.
#pragma once
#include <cuda_bf16.h>

// Element strides of a [B, heads, T, D] view (D contiguous).
struct View {
    int b, h, t;
};

// x · y over the 16 bytes at x and y, in FP32 (FP32: 4 elements; BF16: 8, widened in pairs).
__device__ __forceinline__ float dot16(const float* x, const float* y) {
    float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(y);
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ float dot16(const __nv_bfloat16* x, const __nv_bfloat16* y) {
    uint4 a = *reinterpret_cast<const uint4*>(x), b = *reinterpret_cast<const uint4*>(y);
    const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162*>(&a), *q = reinterpret_cast<const __nv_bfloat162*>(&b);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 fx = __bfloat1622float2(p[i]), fy = __bfloat1622float2(q[i]);
        s += fx.x * fy.x + fx.y * fy.y;
    }
    return s;
}

// Rows per block of the delta pass: THREADS threads, one 16-byte access per lane, D / (16 /
// sizeof(T)) lanes per row (the host's FlashKernels::delta_rows_per_block).
template <typename T, int D, int THREADS> __host__ __device__ constexpr int delta_rows_per_block() {
    return THREADS / (D / (16 / (int)sizeof(T)));
}

// Backward, step 1: delta[row] = rowsum(dO * O) (= rowsum(P * dP)), FP32 [B * heads, T], for
// o and d_o [B, heads, T, D] views with strides vo; each row's lanes add their dot16 by
// shuffles.
template <typename T, int D, int THREADS>
__device__ void flash_bwd_delta(const T* o, const T* d_o, float* delta, int heads, int t, int rows, View vo) {
    constexpr int PER = 16 / (int)sizeof(T), LANES = D / PER;
    int row = blockIdx.x * delta_rows_per_block<T, D, THREADS>() + threadIdx.x / LANES, part = threadIdx.x % LANES;
    float s = 0.f;
    if (row < rows) {
        int bh = row / t, p = row % t, bi = bh / heads, hi = bh % heads;
        size_t off = (size_t)bi * vo.b + (size_t)hi * vo.h + (size_t)p * vo.t + part * PER;
        s = dot16(o + off, d_o + off);
    }
#pragma unroll
    for (int w = LANES / 2; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    if (row < rows && part == 0) delta[row] = s;
}
