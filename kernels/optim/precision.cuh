// precision.rs: the precision-only formats e8mK, K = 1..6 fraction bits in BF16's container
// (decode: bf16_decode).
#pragma once
#include "bf16.cuh"

// The BF16 trick on the D = 23 - K dropped bits: nearest adds 2^(D-1) - 1 + the kept LSB,
// stochastic the top D of the 32 random bits (element_bits<32>); then the low D bits go.
__device__ __forceinline__ uint16_t e8m_encode(float x, unsigned k, int rounding, uint64_t rand) {
    if (isnan(x)) return 0x7FC0;  // canonical quiet NaN
    const unsigned bits = __float_as_uint(x), d = 23u - k;
    const unsigned add = rounding == ROUND_NEAREST ? (1u << (d - 1)) - 1u + ((bits >> d) & 1u) : (unsigned)(rand >> 32) >> (32u - d);
    const uint16_t h = (uint16_t)((((bits + add) >> d) << d) >> 16);
    return (h & 0x7FFF) == 0 ? 0 : h;
}

