// Subtractive dither of a state's write-back: the CUDA twin of
// crates/optim/src/states/format/dither.rs (and quant.rs `read_code` / `read_code16`), same
// operations in the same order, so reads and writes match the CPU reference bit for bit.
// Write: every element of block b rounds as stochastic rounding does with the block's draw
// (the top 24 bits of random_bits(key, b)), complemented for a negative value of a
// sign-magnitude format. Read: the stored grid point moved by d = 1/2 - u grid steps
// (int8's sorted map: u - 1/2) towards its neighbour on that side.
#pragma once
#include "codec.cuh"

// dither.rs `block_bits`: the top 24 bits of draw `block` of stream `key`, the low 40 zero.
__device__ __forceinline__ uint64_t dither_block_bits(unsigned long long key, unsigned long long block) {
    return (random_bits(key, block) >> 40) << 40;
}

// dither.rs `signed_bits`: the bits element x rounds with (complemented on their 24 bits for a
// negative x of every format but int8).
template <int F> __device__ __forceinline__ uint64_t dither_signed_bits(uint64_t bits, float x) {
    return (F != FMT_INT8 && x < 0.0f) ? ((~bits) >> 40) << 40 : bits;
}

// dither.rs `read_offset`: d in grid steps, exact in FP32.
template <int F> __device__ __forceinline__ float dither_read_offset(uint64_t bits) {
    const float u = __fmul_rn((float)(unsigned)(bits >> 40), 1.0f / 16777216.0f);
    return F == FMT_INT8 ? __fsub_rn(u, 0.5f) : __fsub_rn(0.5f, u);
}

// dither.rs `undither`: q moved by d steps towards `up` (d > 0) or `down` (d < 0).
__device__ __forceinline__ float undither(float q, float down, float up, float d) {
    const float step = d > 0.0f ? __fsub_rn(up, q) : __fsub_rn(q, down);
    return __fadd_rn(q, __fmul_rn(d, step));
}

// dither.rs `undither_sign_magnitude` over the magnitudes `mag(j)` of a sign-magnitude grid.
template <typename Mag>
__device__ __forceinline__ float undither_sm(Mag mag, unsigned k, unsigned top, unsigned unit, bool negative, float d) {
    const float e = negative ? -d : d;
    const float a = mag(k);
    const float up = k >= top ? __fadd_rn(a, __fsub_rn(a, mag(k - unit))) : mag(k + unit);
    const float down = k == 0 ? -mag(unit) : mag(k - unit);
    const float r = undither(a, down, up, e);
    return negative ? -r : r;
}

// quant.rs `read_code16` / `read_code` (+ `get_dithered` for FP32): code c of format F read
// with its block scale and dither offset d; `signed_state`: m (true) or v (false); `frac`: an
// e8m state's fraction bits K.
template <int F>
__device__ __forceinline__ float read_dithered(unsigned c, float scale, float d, Int8Map map, bool signed_state, unsigned frac) {
    if constexpr (F == FMT_F32) return __uint_as_float(c);
    else if constexpr (F == FMT_BF16 || F == FMT_E8M) {
        const unsigned unit = F == FMT_E8M ? 1u << (7 - frac) : 1u;
        const unsigned k = c & 0x7FFFu;
        if (k >= 0x7F80u || (k == 0 && !signed_state)) return bf16_decode((uint16_t)c);
        return undither_sm([](unsigned j) { return bf16_decode((uint16_t)j); }, k, 0x7F80u - unit, unit, (c & 0x8000u) != 0, d);
    } else if constexpr (F == FMT_INT8) {
        const float* t = map.t;
        if (!signed_state && t[c] == 0.0f) return 0.0f;
        const float q = t[c];
        const float down = c == 0 ? __fsub_rn(q, __fsub_rn(t[1], q)) : t[c - 1];
        const float up = c == 255 ? __fadd_rn(q, __fsub_rn(q, t[254])) : t[c + 1];
        return __fmul_rn(undither(q, down, up, d), scale);
    } else {
        using T = MiniFloat<F>;
        constexpr unsigned SIGN = 1u << (T::E + T::M);
        const unsigned k = c & (SIGN - 1);
        const bool negative = T::SIGNED && (c & SIGN);
        const float v = mf_decode<F>(c);
        if (!isfinite(v) || (k == 0 && !signed_state)) return __fmul_rn(v, scale);
        return __fmul_rn(undither_sm([](unsigned j) { return mf_decode<F>(j); }, k, T::MAX_CODE, 1u, negative, d), scale);
    }
}
