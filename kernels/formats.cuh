// State formats on the GPU: the CUDA twin of crates/optim/src/format/ (bf16.rs,
// minifloat.rs, fp8.rs, fp4.rs, int8.rs, scale.rs, rounding.rs). Every encode/decode gives
// the Rust reference's results bit for bit; some get there differently (32-bit integer
// minifloat encoding, FP8 through the hardware converters on sm_89+), each noted below.
#pragma once
#include <stdint.h>

#define F32_NAN __uint_as_float(0x7FC00000u)
#define F32_INF __uint_as_float(0x7F800000u)

// Format ids (same order as StateFormat::ALL in Rust).
enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_E4M3 = 2, FMT_E5M2 = 3, FMT_E2M1 = 4, FMT_UE2M2 = 5, FMT_INT8 = 6 };
enum { ROUND_NEAREST = 0, ROUND_STOCHASTIC = 1 };
enum { SPECIALS_NONE = 0, SPECIALS_NAN_ONLY = 1, SPECIALS_IEEE = 2 };

// 2^k for k in [-126, 127], built on the bits (exact).
__device__ __forceinline__ float pow2(int k) { return __uint_as_float((unsigned)(k + 127) << 23); }

// ---- bf16.rs ----
__device__ __forceinline__ float bf16_decode(uint16_t h) { return __uint_as_float((unsigned)h << 16); }

__device__ __forceinline__ uint16_t bf16_encode(float x, int rounding, uint64_t rand) {
    unsigned bits = __float_as_uint(x);
    if (isnan(x)) return 0x7FC0;  // canonical quiet NaN
    unsigned add = rounding == ROUND_NEAREST ? 0x7FFFu + ((bits >> 16) & 1u) : (unsigned)(rand >> 48);
    uint16_t h = (uint16_t)((bits + add) >> 16);
    return (h & 0x7FFF) == 0 ? 0 : h;
}

// ---- minifloat.rs / fp8.rs / fp4.rs ----
template <int F> struct MiniFloat;
// OCP FP8 E4M3: bias 7, max 448, NaN S.1111.111, no Inf.
template <> struct MiniFloat<FMT_E4M3> {
    static constexpr int E = 4, M = 3, BIAS = 7, SPECIALS = SPECIALS_NAN_ONLY;
    static constexpr bool SIGNED = true;
    static constexpr unsigned NAN_CODE = 0x7F, MAX_CODE = 0x7E;
    static constexpr float MAX_FINITE = 448.0f;
};
// OCP FP8 E5M2: bias 15, max 57344, IEEE-style Inf/NaN.
template <> struct MiniFloat<FMT_E5M2> {
    static constexpr int E = 5, M = 2, BIAS = 15, SPECIALS = SPECIALS_IEEE;
    static constexpr bool SIGNED = true;
    static constexpr unsigned NAN_CODE = 0, MAX_CODE = 0x7B;
    static constexpr float MAX_FINITE = 57344.0f;
};
// OCP MX FP4 E2M1: bias 1, max 6, no Inf/NaN.
template <> struct MiniFloat<FMT_E2M1> {
    static constexpr int E = 2, M = 1, BIAS = 1, SPECIALS = SPECIALS_NONE;
    static constexpr bool SIGNED = true;
    static constexpr unsigned NAN_CODE = 0, MAX_CODE = 0x7;
    static constexpr float MAX_FINITE = 6.0f;
};
// Unsigned FP4 E2M2 (for v): bias 1, max 7, no Inf/NaN.
template <> struct MiniFloat<FMT_UE2M2> {
    static constexpr int E = 2, M = 2, BIAS = 1, SPECIALS = SPECIALS_NONE;
    static constexpr bool SIGNED = false;
    static constexpr unsigned NAN_CODE = 0, MAX_CODE = 0xF;
    static constexpr float MAX_FINITE = 7.0f;
};

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

// A subnormal result of mf_encode (|x| nonzero, below 2^EMIN; `a` its FP32 bits without the
// sign): the 24-bit significand with `dropped` = 23 - M + (EMIN - exp) bits rounded away;
// past 31 dropped bits only stochastic rounding can give the smallest subnormal (64-bit
// test, as on the CPU).
template <int F>
__device__ __forceinline__ unsigned mf_encode_subnormal(unsigned a, int rounding, uint64_t rand, unsigned sign) {
    using T = MiniFloat<F>;
    constexpr int EMIN = 1 - T::BIAS;
    const unsigned ef = a >> 23;
    const unsigned mant = ef ? (a & 0x7FFFFFu) | 0x800000u : a;
    const int exp = ef ? (int)ef - 127 : -126;
    const unsigned dropped = 23 - T::M + (unsigned)(EMIN - exp);
    unsigned q;
    if (dropped < 32) {
        const unsigned kept = mant >> dropped, rem = mant & ((1u << dropped) - 1u);
        bool up;
        if (rounding == ROUND_NEAREST) {
            const unsigned half = 1u << (dropped - 1);
            up = rem > half || (rem == half && (kept & 1u));
        } else {
            up = rem + ((unsigned)(rand >> 32) >> (32 - dropped)) >= (1u << dropped);
        }
        q = kept + (up ? 1u : 0u);
    } else {
        q = (rounding == ROUND_STOCHASTIC && dropped < 64 &&
             (uint64_t)mant + (rand >> (64 - dropped)) >= (1ull << dropped)) ? 1u : 0u;
    }
    return q == 0 ? 0u : q | sign;  // q <= 2^M: at most the smallest normal code
}

// Encode with 32-bit integer arithmetic (minifloat.rs `encode`, same results): add the
// rounding increment (nearest: half - 1 + the kept LSB, ties to even; stochastic: the top D
// random bits) and shift the D dropped bits away: for a normal result (the FP32 exponent is
// at least EMIN) on the FP32 bits, D = 23 - M (a carry moves into the exponent), then
// rebias; beyond the largest finite code, saturate. Subnormal results: the significand, as
// mf_encode_subnormal.
template <int F> __device__ __forceinline__ unsigned mf_encode(float x, int rounding, uint64_t rand) {
    using T = MiniFloat<F>;
    constexpr unsigned SIGN = 1u << (T::E + T::M);
    constexpr unsigned ALL_ONES = (1u << T::E) - 1;
    constexpr int EMIN = 1 - T::BIAS;
    constexpr unsigned DROP = 23 - T::M;
    const unsigned bits = __float_as_uint(x);
    const unsigned sign = (T::SIGNED && (bits >> 31)) ? SIGN : 0u;
    const unsigned a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {  // NaN
        if (T::SPECIALS == SPECIALS_NONE) return 0;
        if (T::SPECIALS == SPECIALS_NAN_ONLY) return T::NAN_CODE;  // canonical: NaN signs differ CPU/GPU
        return (ALL_ONES << T::M) | (1u << (T::M - 1));
    }
    if (!T::SIGNED && (bits >> 31)) return 0;
    if (a == 0x7F800000u) return (T::SPECIALS == SPECIALS_IEEE ? (ALL_ONES << T::M) : T::MAX_CODE) | sign;
    if (a == 0) return 0;
    const unsigned ef = a >> 23;
    const bool normal = (int)ef >= EMIN + 127;
    const unsigned hi = (unsigned)(rand >> 32);
    if constexpr (T::E > 2) {
        // FP8: most results are normal, so the normal path is short and a subnormal result
        // takes a branch (measured faster than the branch-free form below for FP8 SR).
        if (!normal) return mf_encode_subnormal<F>(a, rounding, rand, sign);
        const unsigned add = rounding == ROUND_NEAREST ? (1u << (DROP - 1)) - 1u + ((a >> DROP) & 1u) : hi >> (32 - DROP);
        const int code = (int)((a + add) >> DROP) - ((127 - T::BIAS) << T::M);
        return (code > (int)T::MAX_CODE ? T::MAX_CODE : (unsigned)code) | sign;
    }
    // FP4: many results are subnormal; one branch-free form for both ranges (X + add) >> D,
    // X the FP32 bits and D = DROP for a normal result (then rebias, saturate), X the 24-bit
    // significand and D = DROP + (EMIN - exp) for a subnormal one.
    const unsigned X = normal ? a : (ef ? (a & 0x7FFFFFu) | 0x800000u : a);
    const unsigned D = normal ? DROP : DROP + (unsigned)(EMIN + 126 - (int)(ef ? ef - 1 : 0));
    const unsigned d = D < 31 ? D : 31;  // D >= 31: X < 2^24 rounds to 0 or (SR) 1, below
    const unsigned add = rounding == ROUND_NEAREST ? (1u << (d - 1)) - 1u + ((X >> d) & 1u) : hi >> (32 - d);
    unsigned q = (X + add) >> d;
    if (D >= 31)  // 64-bit test, as the CPU's: only stochastic rounding rounds up
        q = (rounding == ROUND_STOCHASTIC && D < 64 && (uint64_t)X + (rand >> (64 - D)) >= (1ull << D)) ? 1u : 0u;
    if (!normal) return q == 0 ? 0u : q | sign;  // q <= 2^M: at most the smallest normal code
    const int code = (int)q - ((127 - T::BIAS) << T::M);
    const unsigned mag = code > (int)T::MAX_CODE ? T::MAX_CODE : (unsigned)code;
    return mag | sign;
}

// ---- FP8 through the hardware converters (sm_89+) ----
// Decode: cvt.rn.f16x2.e4m3x2 / e5m2x2 (exact) then f16 -> f32 (exact). NaN payloads may
// differ from mf_decode's, which nothing observes: every use multiplies by the scale first
// (the GPU's fmul returns its canonical NaN) or re-encodes (one canonical NaN code).
// Before sm_89 (no FP8 converters) both fall back to mf_decode / mf_encode.
template <int F> __device__ __forceinline__ float fp8_decode_hw(unsigned code) {
    static_assert(F == FMT_E4M3 || F == FMT_E5M2, "FP8 only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    return mf_decode<F>(code);
#else
    unsigned h2;
    const unsigned short c = (unsigned short)code;
    if constexpr (F == FMT_E4M3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
    else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(c));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xFFFF)));
    return f;
#endif
}

// Round to nearest even with cvt.rn.satfinite.e4m3x2.f32 / e5m2x2 (saturating, subnormals
// kept), then the reference's conventions (mf_encode): a zero result is +0, NaN is the one
// canonical NaN code, and E5M2 keeps Inf (satfinite would give the largest finite value).
template <int F> __device__ __forceinline__ unsigned fp8_encode_rn_hw(float x) {
    static_assert(F == FMT_E4M3 || F == FMT_E5M2, "FP8 only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    return mf_encode<F>(x, ROUND_NEAREST, 0);
#else
    using T = MiniFloat<F>;
    unsigned short d;
    if constexpr (F == FMT_E4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(x));
    else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(x));
    unsigned code = d & 0xFFu;
    if ((code & 0x7Fu) == 0) code = 0;
    if (isnan(x)) code = T::SPECIALS == SPECIALS_NAN_ONLY ? T::NAN_CODE : (((1u << T::E) - 1) << T::M) | (1u << (T::M - 1));
    if (T::SPECIALS == SPECIALS_IEEE && isinf(x)) code = (((1u << T::E) - 1) << T::M) | (x < 0.0f ? 0x80u : 0u);
    return code;
#endif
}

// ---- scale.rs: power-of-two block scale exponent ----
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

// ---- int8.rs: index into the sorted 256-entry dynamic map ----
__device__ __forceinline__ unsigned int8_encode(const float* t, float n, int rounding, uint64_t rand,
                                                unsigned zero_index) {
    if (isnan(n)) return zero_index;
    if (n <= t[0]) return 0;
    if (n >= t[255]) return 255;
    unsigned lo = 0, hi = 255;
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (t[mid] <= n) lo = mid; else hi = mid;
    }
    float a = t[lo], b = t[hi];
    if (n == a) return lo;
    bool up;
    if (rounding == ROUND_NEAREST) {
        float dl = __fsub_rn(n, a), du = __fsub_rn(b, n);
        up = du < dl || (du == dl && hi % 2 == 0);
    } else {
        float frac = __fdiv_rn(__fsub_rn(n, a), __fsub_rn(b, a));
        up = __fmul_rn((float)(rand >> 40), 1.0f / 16777216.0f) < frac;
    }
    return up ? hi : lo;
}
