// What every model kernel shares (kernels/model/*.cuh, gathered by ops.cu): the dtype
// conversions (arithmetic in FP32, each output rounded once to the tensor's dtype), V-element
// vector loads and stores, warp reductions, the threads per block and the row kernels' warp
// count (BLOCK_THREADS, WARPS: shared with the Rust launcher through
// crates/model/src/fused_sizes.rs, whose tests read them).

#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
// x rounded to T's precision, as FP32.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f(from_f<T>(x)); }

// V consecutive elements as FP32 (16-byte loads where V elements fill whole 16-byte words:
// the address must then be 16-byte aligned), and back, each rounded once to T.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
    constexpr int PER = 16 / sizeof(T);
    if constexpr (V % PER == 0) {
#pragma unroll
        for (int k = 0; k < V / PER; k++) {
            uint4 u = reinterpret_cast<const uint4*>(p)[k];
            const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
            for (int j = 0; j < PER; j++) out[k * PER + j] = to_f(e[j]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) out[j] = to_f(p[j]);
    }
}
template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
    constexpr int PER = 16 / sizeof(T);
    if constexpr (V % PER == 0) {
#pragma unroll
        for (int k = 0; k < V / PER; k++) {
            uint4 u;
            T* e = reinterpret_cast<T*>(&u);
#pragma unroll
            for (int j = 0; j < PER; j++) e[j] = from_f<T>(in[k * PER + j]);
            reinterpret_cast<uint4*>(p)[k] = u;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) p[j] = from_f<T>(in[j]);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define BLOCK_THREADS 256  // threads per block of every kernel of ops.cu
#define WARPS 8            // warps per block of the row kernels (one row per warp)
static_assert(WARPS * 32 == BLOCK_THREADS, "the row kernels' warps fill the block");
