// Counter-based random bits for stochastic rounding: the CUDA twin of
// crates/optim/src/rng.rs (same constants, same order). The host derives the 64-bit stream
// key of (seed, step, tensor id, state kind); element i of a stream is
// mix64(key + (i + 1) * GOLDEN) (SplitMix64, Steele et al. 2014), so the bits depend only on
// the element index, never on the launch shape.
#pragma once

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
