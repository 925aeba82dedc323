// fp4.rs: FP4 E2M1 (signed, m) and unsigned E2M2 (v), two codes per byte.
#pragma once
#include "minifloat.cuh"

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
