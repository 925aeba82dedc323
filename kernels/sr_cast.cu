// Standalone rounding cast FP32 -> BF16 / FP8 (E4M3, E5M2) / FP4 (E2M1, packed two per
// byte, low nibble first), nearest or stochastic, unscaled. The CUDA twin of
// crates/optim/src/cast.rs; element i draws element_bits<W>(key, i) (W = 16 for BF16, 32
// otherwise), so the result does not depend on the launch shape.
#include "formats.cuh"
#include "rng.cuh"

extern "C" __global__ void sr_cast_bf16(const float* x, uint16_t* out, unsigned long long n, unsigned long long key,
                                        int rounding) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = bf16_encode(x[i], rounding, element_bits<16>(key, i));
}

#define CAST_BYTE(NAME, F)                                                                                    \
    extern "C" __global__ void sr_cast_##NAME(const float* x, uint8_t* out, unsigned long long n,             \
                                              unsigned long long key, int rounding) {                         \
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;         \
             i += (unsigned long long)gridDim.x * blockDim.x)                                                 \
            out[i] = (uint8_t)mf_encode<F>(x[i], rounding, element_bits<32>(key, i));                       \
    }
CAST_BYTE(fp8e4m3, FMT_E4M3)
CAST_BYTE(fp8e5m2, FMT_E5M2)

extern "C" __global__ void sr_cast_fp4e2m1(const float* x, uint8_t* out, unsigned long long n,
                                           unsigned long long key, int rounding) {
    unsigned long long pairs = (n + 1) / 2;
    for (unsigned long long b = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; b < pairs;
         b += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long i = 2 * b;
        unsigned lo = mf_encode<FMT_E2M1>(x[i], rounding, element_bits<32>(key, i));
        unsigned hi = i + 1 < n ? mf_encode<FMT_E2M1>(x[i + 1], rounding, element_bits<32>(key, i + 1)) : 0u;
        out[b] = (uint8_t)(lo | (hi << 4));
    }
}
