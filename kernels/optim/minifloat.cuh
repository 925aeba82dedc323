// minifloat.rs: small binary floating-point formats (FP8, FP4) with subnormals, described by
// a MiniFloat<F> specialisation (fp8.cuh, fp4.cuh): decode and encode on the bits, nearest or
// stochastic rounding, saturating.
#pragma once
#include "common.cuh"

enum { SPECIALS_NONE = 0, SPECIALS_NAN_ONLY = 1, SPECIALS_IEEE = 2 };

// Exponent bits E, fraction bits M, bias, signedness, special codes and largest finite value
// of format F (fp8.rs, fp4.rs).
template <int F> struct MiniFloat;

// The codes the encoders store for NaN (one canonical code: NaN signs differ between CPU
// and GPU; 0 for formats without NaN) and for +Inf (E5M2's Inf, else the largest finite
// code: saturation), as minifloat.rs `encode`.
template <int F> __host__ __device__ constexpr unsigned mf_nan_code() {
    using T = MiniFloat<F>;
    return T::SPECIALS == SPECIALS_NAN_ONLY ? T::NAN_CODE
         : T::SPECIALS == SPECIALS_IEEE    ? (((1u << T::E) - 1) << T::M) | (1u << (T::M - 1))
                                           : 0u;
}
template <int F> __host__ __device__ constexpr unsigned mf_inf_code() {
    using T = MiniFloat<F>;
    return T::SPECIALS == SPECIALS_IEEE ? ((1u << T::E) - 1) << T::M : T::MAX_CODE;
}

// Decode on the bits: a normal code's magnitude shifted into an FP32 exponent/fraction
// (rebias by 127 - BIAS) is its exact value; a subnormal code f is decoded as the normal
// code (1, f) minus 2^EMIN (exact: Sterbenz). Same values as minifloat.rs `decode`.
template <int F> __device__ __forceinline__ float mf_decode(unsigned code) {
    using T = MiniFloat<F>;
    constexpr unsigned SIGN = 1u << (T::E + T::M);
    constexpr unsigned ALL_ONES = (1u << T::E) - 1;
    constexpr int EMIN = 1 - T::BIAS;
    const bool neg = T::SIGNED && (code & SIGN);
    const unsigned mag = code & (SIGN - 1);
    const unsigned e = mag >> T::M;
    const unsigned one = e == 0 ? (1u << T::M) : 0u;
    float v = __uint_as_float(((mag | one) << (23 - T::M)) + ((unsigned)(127 - T::BIAS) << 23));
    if (e == 0) v = __fsub_rn(v, pow2(EMIN));
    if (T::SPECIALS == SPECIALS_NAN_ONLY && mag == T::NAN_CODE) v = F32_NAN;
    if (T::SPECIALS == SPECIALS_IEEE && e == ALL_ONES) v = (mag & ((1u << T::M) - 1)) == 0 ? F32_INF : F32_NAN;
    return neg ? -v : v;
}

// The magnitude code q of a subnormal result (|x| nonzero, below 2^EMIN; `a` its FP32 bits
// without the sign) in FP32 and 64-bit integer arithmetic: y = |x| / 2^(EMIN - M) (the
// value in grid steps) is exact and below 2^M. Nearest: rint(y) (ties to even). Stochastic:
// floor(y + hi * 2^-32), exactly (floor(y * 2^32) + hi) >> 32 (y * 2^32 < 2^(M + 32) is an
// exact FP32 value; one multiplication by 2^(32 + M - EMIN)). This is the CPU's q: it rounds
// up when the dropped remainder plus the top D random bits carries (or, past 32 dropped
// bits, the 64-bit form), and with random bits whose low 32 are zero (element_bits<32>, the
// only kind any caller passes) both say "frac(y) + hi * 2^-32 >= 1". q <= 2^M: at most the
// smallest normal code.
template <int F> __device__ __forceinline__ unsigned mf_subnormal(unsigned a, int rounding, unsigned hi) {
    using T = MiniFloat<F>;
    constexpr int EMIN = 1 - T::BIAS;
    if (rounding == ROUND_NEAREST) return __float2uint_rn(__fmul_rn(__uint_as_float(a), pow2(T::M - EMIN)));
    return (unsigned)((__float2ull_rz(__fmul_rn(__uint_as_float(a), pow2(32 + T::M - EMIN))) + hi) >> 32);
}

// Encode with 32-bit integer arithmetic (minifloat.rs `encode`, same results for random bits
// from element_bits<32>): for a normal result (the FP32 exponent is at least EMIN) add the
// rounding increment to the FP32 bits (nearest: half - 1 + the kept LSB, ties to even;
// stochastic: the top D random bits) and shift the D = 23 - M dropped bits away (a carry
// moves into the exponent), then rebias; beyond the largest finite code, saturate.
// Subnormal results: mf_subnormal. Special values by selects.
template <int F> __device__ __forceinline__ unsigned mf_encode(float x, int rounding, uint64_t rand) {
    using T = MiniFloat<F>;
    constexpr unsigned SIGN = 1u << (T::E + T::M);
    constexpr int EMIN = 1 - T::BIAS;
    constexpr unsigned DROP = 23 - T::M;
    const unsigned bits = __float_as_uint(x);
    const unsigned sign = (T::SIGNED && (bits >> 31)) ? SIGN : 0u;
    const unsigned a = bits & 0x7FFFFFFFu;
    const bool normal = (int)(a >> 23) >= EMIN + 127;
    const unsigned hi = (unsigned)(rand >> 32);
    const unsigned add = rounding == ROUND_NEAREST ? (1u << (DROP - 1)) - 1u + ((a >> DROP) & 1u) : hi >> (32 - DROP);
    const int c = (int)((a + add) >> DROP) - ((127 - T::BIAS) << T::M);
    unsigned code = (c > (int)T::MAX_CODE ? T::MAX_CODE : (unsigned)c) | sign;
    // subnormal results and zeros (q = 0: +0): FP8 branches (most results are normal), FP4
    // computes both forms and selects (many are subnormal)
    if (T::E > 2 ? !normal : true) {
        const unsigned q = mf_subnormal<F>(a, rounding, hi);
        if (!normal) code = q == 0 ? 0u : q | sign;
    }
    // special values, as the reference: NaN -> the canonical NaN code (or 0), negative -> 0
    // when unsigned, Inf -> E5M2's Inf (the other formats saturated above, as they should)
    if (T::SPECIALS == SPECIALS_IEEE && a == 0x7F800000u) code = mf_inf_code<F>() | sign;
    if (!T::SIGNED && (bits >> 31)) code = 0;
    if (a > 0x7F800000u) code = mf_nan_code<F>();
    return code;
}

