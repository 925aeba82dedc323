// Warp reductions shared by the optimizer's kernels (adamw.cu, soap.cu): one REDUX on sm_80+,
// shuffles before.
#pragma once

// Warp sum.
__device__ __forceinline__ unsigned warp_sum(unsigned x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
#else
    return __reduce_add_sync(0xffffffffu, x);
#endif
}

// Warp maximum of non-negative floats (they order like their bits).
__device__ __forceinline__ float warp_max(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
#else
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(x)));
#endif
}
