// State formats on the GPU: the CUDA twin of crates/optim/src/format/ (bf16.rs,
// minifloat.rs, fp8.rs, fp4.rs, int8.rs, scale.rs, rounding.rs). Every function mirrors its
// Rust namesake operation for operation, so encode/decode are bit-identical.
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

// ---- rounding.rs: round the kept integer up? ----
__device__ __forceinline__ bool round_up(uint64_t kept, uint64_t rem, unsigned dropped, int rounding,
                                         uint64_t rand) {
    if (dropped == 0 || rem == 0) return false;
    if (dropped >= 64) return false;
    if (rounding == ROUND_NEAREST) {
        uint64_t half = 1ull << (dropped - 1);
        return rem > half || (rem == half && (kept & 1));
    }
    return rem + (rand >> (64 - dropped)) >= (1ull << dropped);
}

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

template <int F> __device__ __forceinline__ float mf_decode(unsigned code) {
    using T = MiniFloat<F>;
    constexpr unsigned SIGN = 1u << (T::E + T::M);
    constexpr int ALL_ONES = (1 << T::E) - 1;
    constexpr int EMIN = 1 - T::BIAS;
    bool neg = T::SIGNED && (code & SIGN);
    unsigned mag = code & (SIGN - 1);
    int e = (int)(mag >> T::M);
    unsigned f = mag & ((1u << T::M) - 1);
    float v;
    if (T::SPECIALS == SPECIALS_NAN_ONLY && mag == T::NAN_CODE) v = F32_NAN;
    else if (T::SPECIALS == SPECIALS_IEEE && e == ALL_ONES) v = f == 0 ? F32_INF : F32_NAN;
    else if (e == 0) v = __fmul_rn((float)f, pow2(EMIN - T::M));
    else v = __fmul_rn((float)((1u << T::M) + f), pow2(e - T::BIAS - T::M));
    return neg ? -v : v;
}

template <int F> __device__ __forceinline__ unsigned mf_encode(float x, int rounding, uint64_t rand) {
    using T = MiniFloat<F>;
    constexpr unsigned SIGN = 1u << (T::E + T::M);
    constexpr unsigned ALL_ONES = (1u << T::E) - 1;
    constexpr int EMIN = 1 - T::BIAS;
    unsigned sign = (T::SIGNED && (__float_as_uint(x) >> 31)) ? SIGN : 0u;
    if (isnan(x)) {
        if (T::SPECIALS == SPECIALS_NONE) return 0;
        if (T::SPECIALS == SPECIALS_NAN_ONLY) return T::NAN_CODE;  // canonical: NaN signs differ CPU/GPU
        return (ALL_ONES << T::M) | (1u << (T::M - 1));
    }
    if (!T::SIGNED && x < 0.0f) return 0;
    if (isinf(x)) return (T::SPECIALS == SPECIALS_IEEE ? (ALL_ONES << T::M) : T::MAX_CODE) | sign;
    unsigned bits = __float_as_uint(x) & 0x7FFFFFFFu;
    if (bits == 0) return 0;
    int exp;
    uint64_t mant;
    if ((bits >> 23) == 0) { exp = -126; mant = bits & 0x7FFFFFu; }
    else { exp = (int)(bits >> 23) - 127; mant = (bits & 0x7FFFFFu) | 0x800000u; }
    int te = exp > EMIN ? exp : EMIN;
    unsigned dropped = (unsigned)(23 - T::M + te - exp);
    uint64_t kept, rem;
    if (dropped >= 64) { kept = 0; rem = mant; }
    else { kept = mant >> dropped; rem = mant & ((1ull << dropped) - 1); }
    uint64_t q = kept + (round_up(kept, rem, dropped, rounding, rand) ? 1 : 0);
    if (q == 0) return 0;
    const uint64_t one = 1ull << T::M;
    if (q >= 2 * one) { te += 1; q >>= 1; }
    unsigned mag;
    if (q >= one) {
        int e = te + T::BIAS;
        int limit = (int)(T::MAX_CODE >> T::M);
        uint64_t code = ((uint64_t)(unsigned)e << T::M) | (q - one);
        mag = (e > limit || code > T::MAX_CODE) ? T::MAX_CODE : (unsigned)code;
    } else {
        mag = (unsigned)q;
    }
    return mag | sign;
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
