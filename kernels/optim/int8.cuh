// int8.rs: 8-bit Adam's block-wise dynamic quantization (absmax scales).
#pragma once
#include "common.cuh"

// Bucket table of the search (int8.rs OCTAVES, SUB_BITS, BUCKETS): |n| in [2^-26, 1) in
// 64 buckets per octave by its FP32 bits, for each sign; a bucket holds a map index at or
// below every n of the bucket, from which the search steps up.
#define INT8_OCTAVES 26
#define INT8_SUB_BITS 6
#define INT8_BUCKETS (INT8_OCTAVES << INT8_SUB_BITS)

// A map's 256 sorted values t (decoding), its search windows w[i] = (t[i], t[i + 1],
// t[i + 2], t[i + 3]) (t past 255 reads +Inf; the search reads the window of a bucket start,
// at most 254, in one 128-bit access) and its 2 x INT8_BUCKETS bucket starts (n >= 0, then
// n < 0).
struct Int8Map {
    const float* t;
    const float4* w;
    const uint8_t* starts;
};

// int8.rs `normalizer`: a block's pre-scale (n = (x * pre) * inv, inv = 1 / (absmax * pre)):
// 2^64 below absmax 2^-100, where 1 / absmax could overflow, else 1.
__device__ __forceinline__ float int8_pre(float absmax) { return absmax < 0x1p-100f ? 0x1p64f : 1.0f; }

// int8.rs `bucket` for |n| < 1; NaN and |n| >= 1 land in the last bucket of their sign
// (the clamp), which int8_encode's selects then override.
__device__ __forceinline__ unsigned int8_bucket(float n) {
    constexpr unsigned LOWEST = (127u - INT8_OCTAVES) << 23;
    const unsigned a = __float_as_uint(n) & 0x7FFFFFFFu;
    const unsigned i = min((a > LOWEST ? a - LOWEST : 0u) >> (23 - INT8_SUB_BITS), (unsigned)INT8_BUCKETS - 1u);
    return i + (n < 0.0f ? INT8_BUCKETS : 0u);
}

// int8.rs `DynamicMap::encode` of n = x * (1 / absmax), without branches: the bucket start
// lo0 and its two upward steps (int8.rs MAX_STEPS = 2) give lo with t[lo] <= n < t[lo + 1]
// and the neighbours a = t[lo], b = t[lo + 1] from the window w[lo0] (one 128-bit
// shared-memory read instead of four 32-bit ones). Out-of-range n need no test below the
// map (n <= t[0]: lo = 0 and neither rounding moves up, -Inf included); n >= 1 (= t[255] of
// both maps, +Inf included) gives 255 and NaN the index of zero, by selects.
__device__ __forceinline__ unsigned int8_encode(Int8Map map, float n, int rounding, uint64_t rand,
                                                unsigned zero_index) {
    const unsigned lo0 = map.starts[int8_bucket(n)];
    const float4 w = map.w[lo0];
    const float t0 = w.x, t1 = w.y, t2 = w.z, t3 = w.w;
    const bool s1 = t1 <= n, s2 = t2 <= n;  // s2 implies s1 (the map is sorted)
    const float a = s2 ? t2 : (s1 ? t1 : t0), b = s2 ? t3 : (s1 ? t2 : t1);
    const unsigned lo = lo0 + s1 + s2;
    bool up;
    if (rounding == ROUND_NEAREST) {
        const float dl = __fsub_rn(n, a), du = __fsub_rn(b, n);
        up = du < dl || (du == dl && lo % 2 == 1);  // ties to the even index lo + 1
    } else {
        up = __fmul_rn(__fmul_rn((float)(rand >> 40), 1.0f / 16777216.0f), __fsub_rn(b, a)) < __fsub_rn(n, a);
    }
    const unsigned code = n >= 1.0f ? 255u : lo + up;
    return isnan(n) ? zero_index : code;
}
