// fp8.rs: OCP FP8 E4M3 and E5M2, and their hardware converters.
#pragma once
#include "minifloat.cuh"

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
// ---- through the hardware converters (sm_89+) ----
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
