// One state element's write-back as adamw.rs `write_back` / `encode_block` does it: the
// block's new scale from its amax (per format and scale kind), decode and encode with it,
// random bits for stochastic rounding, and the stall test.
#pragma once
#include "bf16.cuh"
#include "codes.cuh"
#include "fp4.cuh"
#include "fp8.cuh"
#include "int8.cuh"
#include "precision.cuh"
#include "rng.cuh"
#include "scale.cuh"

// The rounding of a write-back as the kernel compiles it: nearest in kernels without SR code
// (the host launches those only when nothing rounds stochastically); stochastic when ALL_SR
// (the launch rounds m and v stochastically, the common case: no per-element test); else
// the launch's value.
template <bool SR, bool ALL_SR> __device__ __forceinline__ int rounding_of(int r) {
    return !SR ? ROUND_NEAREST : ALL_SR ? ROUND_STOCHASTIC : r;
}

// Random bits of the quad e..e+3 of stream `key` for format F (rng.cuh `quad_bits`), only for
// stochastic rounding (zeros for nearest, which ignores them). SR is a template flag: the
// kernels of launches without any stochastic rounding carry no hashing code at all.
template <int F> __host__ __device__ constexpr int rand_width() { return F == FMT_BF16 ? 16 : 32; }  // e8m: 32
template <bool SR, int F>
__device__ __forceinline__ void quad_rand(int rounding, unsigned long long key, unsigned long long e, uint64_t r[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) r[j] = 0;
    // (the counter outside the test: streams of one width share its multiplication)
    const unsigned long long ctr = draw_counter<rand_width<F>()>(e);
    if (SR && F != FMT_F32 && rounding == ROUND_STOCHASTIC) quad_bits<rand_width<F>()>(key, ctr, r);
}

// Decoded value of a code with its block scale (state.rs `decode_code`).
template <int F> __device__ __forceinline__ float decode(unsigned c, float scale, Int8Map map) {
    if constexpr (F == FMT_F32) return __uint_as_float(c);
    else if constexpr (F == FMT_BF16 || F == FMT_E8M) return bf16_decode((uint16_t)c);
    else if constexpr (F == FMT_INT8) return __fmul_rn(map.t[c], scale);
    else if constexpr (F == FMT_E4M3 || F == FMT_E5M2) return __fmul_rn(fp8_decode_hw<F>(c), scale);
    else return __fmul_rn(mf_decode<F>(c), scale);
}

// Decoded values of a quad's codes (`raw` packed, `c` unpacked) with their block scale: FP8
// two codes per hardware conversion, the others one by one (decode).
template <int F> __device__ __forceinline__ void decode_quad(typename Codes<F>::Raw raw, const unsigned c[4], float scale,
                                                           Int8Map map, float out[4]) {
    if constexpr (F == FMT_E4M3 || F == FMT_E5M2) {
        fp8_decode2_hw<F>(raw, out);
        fp8_decode2_hw<F>(raw >> 16, out + 2);
#pragma unroll
        for (int j = 0; j < 4; j++) out[j] = __fmul_rn(out[j], scale);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) out[j] = decode<F>(c[j], scale, map);
    }
}

// The new scale of a block of format F from its amax (adamw.rs `encode_block`): for FP8/FP4
// the scale kind's (scale.cuh), for int8 absmax with factor 1 / (absmax * int8_pre(absmax))
// (int8.rs `normalizer`; the same rounded quotient for every element of a block), and 1 for
// the unscaled states.
template <int F> __device__ __forceinline__ BlockScale block_scale_of(float amax, unsigned kind) {
    if constexpr (!Codes<F>::SCALED) return BlockScale{1.0f, 1.0f};
    else if constexpr (F == FMT_INT8) {
        const float s = amax > 0.0f ? amax : 1.0f;
        return BlockScale{s, __frcp_rn(__fmul_rn(s, int8_pre(s)))};
    } else return minifloat_scale(kind, amax, MiniFloat<F>::MAX_FINITE);
}

// Encode x with the block's new scale `s` (adamw.rs `encode_block` / `write_back`):
// FP8/FP4 encode x * factor, int8 n = (x * int8_pre(scale)) * factor. `aux`: for int8 the
// map's index of 0, for e8m the fraction bits K.
template <int F> __device__ __forceinline__ unsigned encode(float x, BlockScale s, int rounding, uint64_t rand, Int8Map map,
                                                          unsigned aux) {
    if constexpr (F == FMT_F32) return __float_as_uint(x);
    else if constexpr (F == FMT_BF16) return bf16_encode(x, rounding, rand);
    else if constexpr (F == FMT_E8M) return e8m_encode(x, aux, rounding, rand);
    else if constexpr (F == FMT_INT8) return int8_encode(map, __fmul_rn(__fmul_rn(x, int8_pre(s.scale)), s.factor), rounding, rand, aux);
    else if constexpr (F == FMT_E4M3 || F == FMT_E5M2) {
        // nearest: the hardware converter (bit-identical to mf_encode's nearest)
        if (rounding == ROUND_NEAREST) return fp8_encode_rn_hw<F>(__fmul_rn(x, s.factor));
        return mf_encode<F>(__fmul_rn(x, s.factor), rounding, rand);
    } else return mf_encode<F>(__fmul_rn(x, s.factor), rounding, rand);
}

// Unchanged? (stalls.rs): the stored representation is the same after the write-back: the
// code for every format but FP32, whose states are written back exactly and compare their
// bits (a NaN never counts as unchanged).
template <int F> __device__ __forceinline__ bool same_stored(unsigned new_code, unsigned old_code, float x) {
    if constexpr (F == FMT_F32) return new_code == old_code && !isnan(x);
    else return new_code == old_code;
}
