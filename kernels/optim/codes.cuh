// Per-format access to a state's codes in global memory (state.rs `Codes`): FP32 words, BF16
// halves (and e8mK containers), one byte per FP8/int8 code, two FP4 codes per byte; and the
// weight types of the kernels.
#pragma once
#include <stdint.h>
#include "common.cuh"

// Raw: the bits of four consecutive codes e..e+3 (e % 4 == 0) as one vector register
// (codes are 256-byte aligned cudaMalloc allocations; weights and gradients are candle
// buffers starting at a multiple of 4 elements, checked by cuda/adamw.rs `address`, so 16-byte
// aligned for FP32 and 8-byte for BF16); load_raw/store_raw move them
// with one vector access, pack/unpack convert to and from one code per unsigned.
// load/store: one element (tails). Vector stores go through __stwb (st.global.wb.v4/v2, the
// default caching): the compiler split a plain uint4 or uint2 store into 32-bit stores
// (bench/optimizer_h200.md, "Kernel choices").
template <int F> struct Codes;
template <> struct Codes<FMT_F32> {
    static constexpr bool SCALED = false;
    using Raw = uint4;
    __device__ static unsigned load(const void* c, unsigned long long e) { return ((const unsigned*)c)[e]; }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((unsigned*)c)[e] = v; }
    __device__ static Raw load_raw(const void* c, unsigned long long e) { return *(const uint4*)((const unsigned*)c + e); }
    __device__ static void store_raw(void* c, unsigned long long e, Raw r) { __stwb((uint4*)((unsigned*)c + e), r); }
    __device__ static Raw pack(const unsigned o[4]) { return make_uint4(o[0], o[1], o[2], o[3]); }
    __device__ static void unpack(Raw r, unsigned o[4]) { o[0] = r.x; o[1] = r.y; o[2] = r.z; o[3] = r.w; }
};
template <> struct Codes<FMT_BF16> {
    static constexpr bool SCALED = false;
    using Raw = uint2;
    __device__ static unsigned load(const void* c, unsigned long long e) { return ((const uint16_t*)c)[e]; }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((uint16_t*)c)[e] = (uint16_t)v; }
    __device__ static Raw load_raw(const void* c, unsigned long long e) { return *(const uint2*)((const uint16_t*)c + e); }
    __device__ static void store_raw(void* c, unsigned long long e, Raw r) { __stwb((uint2*)((uint16_t*)c + e), r); }
    __device__ static Raw pack(const unsigned o[4]) { return make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16)); }
    __device__ static void unpack(Raw r, unsigned o[4]) { o[0] = r.x & 0xFFFF; o[1] = r.x >> 16; o[2] = r.y & 0xFFFF; o[3] = r.y >> 16; }
};
struct ByteCodes {
    static constexpr bool SCALED = true;
    using Raw = unsigned;
    __device__ static unsigned load(const void* c, unsigned long long e) { return ((const uint8_t*)c)[e]; }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((uint8_t*)c)[e] = (uint8_t)v; }
    __device__ static Raw load_raw(const void* c, unsigned long long e) { return *(const unsigned*)((const uint8_t*)c + e); }
    __device__ static void store_raw(void* c, unsigned long long e, Raw r) { *(unsigned*)((uint8_t*)c + e) = r; }
    __device__ static Raw pack(const unsigned o[4]) { return o[0] | (o[1] << 8) | (o[2] << 16) | (o[3] << 24); }
    __device__ static void unpack(Raw r, unsigned o[4]) {
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = (r >> (8 * k)) & 0xFF;
    }
};
// two FP4 codes per byte, element 2i in the low nibble of byte i
struct NibbleCodes {
    static constexpr bool SCALED = true;
    using Raw = unsigned;
    __device__ static unsigned load(const void* c, unsigned long long e) {
        return (((const uint8_t*)c)[e / 2] >> (4 * (e % 2))) & 0xF;
    }
    // read-modify-write of the shared byte (tails only, one thread per byte)
    __device__ static void store(void* c, unsigned long long e, unsigned v) {
        uint8_t* b = (uint8_t*)c + e / 2;
        unsigned sh = 4 * (e % 2);
        *b = (uint8_t)((*b & ~(0xFu << sh)) | (v << sh));
    }
    __device__ static Raw load_raw(const void* c, unsigned long long e) { return *(const uint16_t*)((const uint8_t*)c + e / 2); }
    __device__ static void store_raw(void* c, unsigned long long e, Raw r) { *(uint16_t*)((uint8_t*)c + e / 2) = (uint16_t)r; }
    __device__ static Raw pack(const unsigned o[4]) { return o[0] | (o[1] << 4) | (o[2] << 8) | (o[3] << 12); }
    __device__ static void unpack(Raw r, unsigned o[4]) {
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = (r >> (4 * k)) & 0xF;
    }
};
template <> struct Codes<FMT_E8M> : Codes<FMT_BF16> {};
template <> struct Codes<FMT_E4M3> : ByteCodes {};
template <> struct Codes<FMT_E5M2> : ByteCodes {};
template <> struct Codes<FMT_INT8> : ByteCodes {};
template <> struct Codes<FMT_E2M1> : NibbleCodes {};
template <> struct Codes<FMT_UE2M2> : NibbleCodes {};

// Codes e..e+k-1 as a Raw (k < 4: one element at a time, missing codes `fill`).
template <int F> __device__ __forceinline__ typename Codes<F>::Raw load_codes(const void* c, unsigned long long e, int k,
                                                                           unsigned fill) {
    if (k == 4) return Codes<F>::load_raw(c, e);
    unsigned o[4] = {fill, fill, fill, fill};
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (j < k) o[j] = Codes<F>::load(c, e + j);
    return Codes<F>::pack(o);
}

// Store codes e..e+k-1.
template <int F> __device__ __forceinline__ void store_codes(void* c, unsigned long long e, int k, const unsigned o[4]) {
    if (k == 4) {
        Codes<F>::store_raw(c, e, Codes<F>::pack(o));
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (j < k) Codes<F>::store(c, e + j, o[j]);
}

// The weight type P of a kernel: FP32 weights (float) or BF16 weights (uint16_t) with FP32
// gradients, or BF16 weights with BF16 gradients (Bf16Grads, as a BF16 model's backward
// gives them: widened exactly to FP32 on load). F: the weights as codes (FP32 words or BF16
// bit patterns); G16: the gradients are BF16.
struct Bf16Grads {};
template <typename P> struct WeightCodes;
template <> struct WeightCodes<float> { static constexpr int F = FMT_F32; static constexpr bool G16 = false; };
template <> struct WeightCodes<uint16_t> { static constexpr int F = FMT_BF16; static constexpr bool G16 = false; };
template <> struct WeightCodes<Bf16Grads> { static constexpr int F = FMT_BF16; static constexpr bool G16 = true; };
