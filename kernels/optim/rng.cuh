// Counter-based random bits for stochastic rounding: the CUDA twin of
// crates/optim/src/states/rng.rs (same constants, same order). The host derives the 64-bit stream
// key of (seed, step, tensor id, state kind); draw c of a stream is
// mix64(key + (c + 1) * GOLDEN) (SplitMix64, Steele et al. 2014), and element i of a format
// consuming W bits (16 for BF16, 32 otherwise) takes the W-bit slice i % (64 / W) of draw
// i / (64 / W), left-aligned: the bits depend only on the element index, never on the launch
// shape.
#pragma once
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ull

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long random_bits(unsigned long long key,
                                                          unsigned long long index) {
    return mix64(key + (index + 1ull) * GOLDEN);
}

// rng.rs `element_bits`: element i's W random bits (W = 16 or 32) in the top of a u64.
template <int W> __device__ __forceinline__ unsigned long long element_bits(unsigned long long key,
                                                                           unsigned long long i) {
    constexpr unsigned PER = 64 / W;
    return (random_bits(key, i / PER) >> (W * (unsigned)(i % PER))) << (64 - W);
}

// Counter term (c + 1) * GOLDEN of the draw that element i of a W-bit format slices
// (c = i / (64 / W)); computed once per quad and shared by the streams of the same width.
template <int W> __device__ __forceinline__ unsigned long long draw_counter(unsigned long long i) {
    return (i / (64 / W) + 1ull) * GOLDEN;
}

// element_bits of the quad i..i+3 (i % 4 == 0) from ctr = draw_counter<W>(i): one draw for
// W = 16, two for W = 32.
template <int W> __device__ __forceinline__ void quad_bits(unsigned long long key, unsigned long long ctr,
                                                           uint64_t r[4]) {
    if constexpr (W == 16) {
        const unsigned long long h = mix64(key + ctr);
#pragma unroll
        for (int j = 0; j < 4; j++) r[j] = (h >> (16 * j)) << 48;
    } else {
        const unsigned long long h0 = mix64(key + ctr), h1 = mix64(key + ctr + GOLDEN);
        r[0] = h0 << 32, r[1] = (h0 >> 32) << 32, r[2] = h1 << 32, r[3] = (h1 >> 32) << 32;
    }
}
