// State formats on the GPU: the CUDA twin of crates/optim/src/format/ (bf16.rs,
// minifloat.rs, fp8.rs, fp4.rs, int8.rs, scale.rs, rounding.rs). Every encode/decode gives
// the Rust reference's results bit for bit; some get there differently (32-bit integer
// minifloat encoding, FP8 through the hardware converters on sm_89+), each noted below.
#pragma once
#include <stdint.h>

#define F32_NAN __uint_as_float(0x7FC00000u)
#define F32_INF __uint_as_float(0x7F800000u)

// Format ids (same order as StateFormat::ALL in Rust; FMT_E8M is every e8mK, K a launch
// argument).
enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_E4M3 = 2, FMT_E5M2 = 3, FMT_E2M1 = 4, FMT_UE2M2 = 5, FMT_INT8 = 6, FMT_E8M = 7 };
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

// ---- precision.rs: e8mK, K = 1..6 fraction bits in BF16's container (decode: bf16_decode) ----
// The BF16 trick on the D = 23 - K dropped bits: nearest adds 2^(D-1) - 1 + the kept LSB,
// stochastic the top D of the 32 random bits (element_bits<32>); then the low D bits go.
__device__ __forceinline__ uint16_t e8m_encode(float x, unsigned k, int rounding, uint64_t rand) {
    if (isnan(x)) return 0x7FC0;  // canonical quiet NaN
    const unsigned bits = __float_as_uint(x), d = 23u - k;
    const unsigned add = rounding == ROUND_NEAREST ? (1u << (d - 1)) - 1u + ((bits >> d) & 1u) : (unsigned)(rand >> 32) >> (32u - d);
    const uint16_t h = (uint16_t)((((bits + add) >> d) << d) >> 16);
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

// ---- FP8 through the hardware converters (sm_89+) ----
// Decode: cvt.rn.f16x2.e4m3x2 / e5m2x2 (exact) then f16 -> f32 (exact). NaN payloads may
// differ from mf_decode's, which nothing observes: every use multiplies by the scale first
// (the GPU's fmul returns its canonical NaN) or re-encodes (one canonical NaN code).
// Before sm_89 (no FP8 converters) both fall back to mf_decode / mf_encode.
// fp8_decode2_hw: the two codes in the low 16 bits of `pair` (low byte first), one converter.
template <int F> __device__ __forceinline__ void fp8_decode2_hw(unsigned pair, float out[2]) {
    static_assert(F == FMT_E4M3 || F == FMT_E5M2, "FP8 only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    out[0] = mf_decode<F>(pair & 0xFF), out[1] = mf_decode<F>((pair >> 8) & 0xFF);
#else
    unsigned h2;
    const unsigned short c = (unsigned short)pair;
    if constexpr (F == FMT_E4M3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
    else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(c));
    asm("cvt.f32.f16 %0, %1;" : "=f"(out[0]) : "h"((unsigned short)(h2 & 0xFFFF)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(out[1]) : "h"((unsigned short)(h2 >> 16)));
#endif
}

template <int F> __device__ __forceinline__ float fp8_decode_hw(unsigned code) {
    float out[2];
    fp8_decode2_hw<F>(code & 0xFF, out);
    return out[0];
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
    if (isnan(x)) code = mf_nan_code<F>();
    if (T::SPECIALS == SPECIALS_IEEE && isinf(x)) code = mf_inf_code<F>() | (x < 0.0f ? 0x80u : 0u);
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
