// scale.rs: the scale of an FP8/FP4 block (or tensor) from its largest finite magnitude:
// `pow2` (the smallest power of two that fits) or `amax` (the paper's: the block maximum maps
// to the format maximum). Encoding multiplies by the block's `factor`, decoding by its `scale`.
#pragma once
#include "common.cuh"

enum { SCALE_POW2 = 0, SCALE_AMAX = 1 };  // scale.rs ScaleKind

// A block's scale and the factor its new values are multiplied by before encoding (scale.rs
// `BlockScale`).
struct BlockScale {
    float scale, factor;
};

#define AMAX_FLOOR 0x1p-100f  // scale.rs AMAX_FLOOR

__device__ __forceinline__ int floor_log2(float x) {
    unsigned b = __float_as_uint(x);
    int e = (int)(b >> 23);
    if (e == 0) return -149 + (31 - __clz((int)(b & 0x7FFFFFu)));
    return e - 127;
}

__device__ __forceinline__ int pow2_scale_exp(float amax, float max_finite) {
    if (amax == 0.0f) return 0;
    int k = floor_log2(amax) - floor_log2(max_finite);
    k = k < -126 ? -126 : (k > 127 ? 127 : k);
    if (k < 127 && amax > __fmul_rn(max_finite, pow2(k))) k += 1;
    return k;
}


// scale.rs `amax_scale`, the operation order both sides share: a = max(amax, 2^-100),
// scale = a / x_max, factor = x_max / a (IEEE divisions, once per block); 0 and 0 for an
// all-zero block.
__device__ __forceinline__ BlockScale amax_scale(float amax, float max_finite) {
    if (amax == 0.0f) return BlockScale{0.0f, 0.0f};
    const float a = fmaxf(amax, AMAX_FLOOR);
    return BlockScale{__fdiv_rn(a, max_finite), __fdiv_rn(max_finite, a)};
}

// scale.rs `block_scale` for a minifloat format of largest value `max_finite`.
__device__ __forceinline__ BlockScale minifloat_scale(int kind, float amax, float max_finite) {
    if (kind == SCALE_AMAX) return amax_scale(amax, max_finite);
    const int k = pow2_scale_exp(amax, max_finite);
    return BlockScale{pow2(k), pow2(-k)};
}
