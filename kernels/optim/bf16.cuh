// bf16.rs: BF16 states and weights, the top 16 bits of an FP32 word (no scaling).
#pragma once
#include "common.cuh"

__device__ __forceinline__ float bf16_decode(uint16_t h) { return __uint_as_float((unsigned)h << 16); }

__device__ __forceinline__ uint16_t bf16_encode(float x, int rounding, uint64_t rand) {
    unsigned bits = __float_as_uint(x);
    if (isnan(x)) return 0x7FC0;  // canonical quiet NaN
    unsigned add = rounding == ROUND_NEAREST ? 0x7FFFu + ((bits >> 16) & 1u) : (unsigned)(rand >> 48);
    uint16_t h = (uint16_t)((bits + add) >> 16);
    return (h & 0x7FFF) == 0 ? 0 : h;
}

