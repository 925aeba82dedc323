// Format ids and FP32 bit helpers shared by the optimizer's codecs (bf16.cuh, precision.cuh,
// minifloat.cuh, fp8.cuh, fp4.cuh, int8.cuh, scale.cuh): the CUDA twins of
// crates/optim/src/states/format/*.rs. Every encode/decode gives the Rust reference's results bit
// for bit; some get there differently (32-bit integer minifloat encoding, FP8 through the
// hardware converters on sm_89+), each noted where it happens.
#pragma once
#include <stdint.h>

#define F32_NAN __uint_as_float(0x7FC00000u)
#define F32_INF __uint_as_float(0x7F800000u)

// Format ids (same order as StateFormat::ALL in Rust; FMT_E8M is every e8mK, K a launch
// argument).
enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_E4M3 = 2, FMT_E5M2 = 3, FMT_E2M1 = 4, FMT_UE2M2 = 5, FMT_INT8 = 6, FMT_E8M = 7 };
enum { ROUND_NEAREST = 0, ROUND_STOCHASTIC = 1, ROUND_DITHER = 2 };

// 2^k for k in [-126, 127], built on the bits (exact).
__device__ __forceinline__ float pow2(int k) { return __uint_as_float((unsigned)(k + 127) << 23); }
