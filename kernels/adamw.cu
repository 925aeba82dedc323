// Fused AdamW step with low-precision moment states: the CUDA twin of
// crates/optim/src/adamw.rs (the CPU reference it must match bit for bit).
//
// One launch updates up to MAX_TENSORS parameter tensors (multi-tensor apply, as PyTorch's
// fused AdamW): the kernel parameters carry every tensor's pointers, length, random keys and
// decay. The tensors' *segments* are numbered consecutively; each warp takes one contiguous
// run of segments (so it meets few tensor boundaries). A segment is rounds() x 128 elements
// (unscaled states, 128-element scale blocks, or per-tensor scales whose amax
// `adamw_amax_*` computed first), else one scale block of B elements (B a multiple of 4).
// Each lane takes 4 consecutive elements of a round (one vector load each of gradients,
// weights and codes); a segment of rounds issues all its loads before computing. Per
// element, in FP32 registers, in the reference's order:
//   decode -> m -> v -> bias correction -> decay -> update -> encode
//   g = grad * grad_scale
//   m = b1 * m_old + (1 - b1) * g ;  v = b2 * v_old + (1 - b2) * g^2
//   p = p * (1 - lr * wd) - lr * (m * (1/bc1)) / (sqrt(v * (1/bc2)) + eps)
// p is read and written once; m, v (codes + scales) are read once and written once; the
// dequantized states never reach global memory. Blocks of at most 128 elements keep the new
// moments in registers between the block amax (a warp reduction) and the encode; longer
// blocks compute the moments and amax (pass 1, which also writes p), then recompute the
// identical moments from the same inputs (L1/L2-resident) and encode them (pass 2). Every
// FP32 operation is an explicit IEEE intrinsic (__fmul_rn, ...), so no FMA contraction can
// make the GPU differ from the CPU.
//
// Stall counters (m, v, weights: updated / stalled) are summed per warp and added with one
// atomicAdd per counter each time the warp leaves a tensor, into a device buffer that the
// host reads later (no synchronisation in the step).
#include "formats.cuh"
#include "rng.cuh"

#define MAX_TENSORS 256  // per launch: the kernel parameters (26.1 KiB) stay under 32 KiB (CUDA 12.1+)

// Host-computed constants of one step, the same for every tensor (mirrors StepScalars).
struct StepArgs {
    unsigned long long segments;  // segments of all tensors of this launch
    float grad_scale, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
    float inv_bias_correction1, inv_bias_correction2;
    unsigned block;               // scale block length; 0 = per tensor (amax precomputed)
    int reset_m, reset_v;         // zero the state before the update
    int round_m, round_v, round_w;
    unsigned zero_m, zero_v;      // int8: index of 0 in the signed / unsigned map
    unsigned count;               // tensors in this launch
    unsigned frac_m, frac_v;      // e8mK states: K
    unsigned v_floor;             // 1: a block-scaled v never encodes to 0 in a non-zero block
};

// One tensor of the launch (mirrors StepKeys + the per-tensor decay).
struct TensorArgs {
    unsigned long long p, g, mc, ms, vc, vs;  // weights, gradient, m/v codes and scales
    unsigned long long n, key_m, key_v, key_w;
    unsigned long long first_segment;         // in the launch's numbering
    unsigned long long offset;                // whole-tensor index of element 0 (a ZeRO-1
                                              // shard's start, a multiple of 4; else 0): the
                                              // random bits are those of element offset + e
    float decay;                              // 1 - lr * wd
    unsigned index;                           // optimizer tensor index: counters, amax slots
};

struct LaunchArgs {
    StepArgs s;
    TensorArgs t[MAX_TENSORS];
};

// ---- per-format access to a state's codes ----
// Raw: the bits of four consecutive codes e..e+3 (e % 4 == 0) as one vector register
// (codes are 256-byte aligned cudaMalloc allocations; weights and gradients are candle
// buffers starting at a multiple of 4 elements, checked by cuda.rs `address`, so 16-byte
// aligned for FP32 and 8-byte for BF16); load_raw/store_raw move them
// with one vector access, pack/unpack convert to and from one code per unsigned.
// load/store: one element (tails). Vector stores go through __stwb (st.global.wb.v4/v2, the
// default caching): the compiler split a plain uint4 or uint2 store into 32-bit stores, four
// per lane and state, which left FP32 states 5% slower (0.757 -> 0.717 ms, H200).
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

// New scale from the block amax: 2^k for FP8/FP4, absmax for int8 (scale.rs); 1 for the
// unscaled FP32/BF16 states.
template <int F> __device__ __forceinline__ float scale_from_amax(float amax) {
    if constexpr (!Codes<F>::SCALED) return 1.0f;
    else if constexpr (F == FMT_INT8) return amax > 0.0f ? amax : 1.0f;
    else return pow2(pow2_scale_exp(amax, MiniFloat<F>::MAX_FINITE));
}

// Encode x with the block's new scale (adamw.rs `encode_block` / `write_back`): `inv` is
// inverse_scale of the block's new scale (int8: n = (x * int8_pre(scale)) * inv). `aux`: for
// int8 the map's index of 0, for e8m the fraction bits K.
template <int F> __device__ __forceinline__ unsigned encode(float x, float scale, float inv, int rounding, uint64_t rand,
                                                          Int8Map map, unsigned aux) {
    if constexpr (F == FMT_F32) return __float_as_uint(x);
    else if constexpr (F == FMT_BF16) return bf16_encode(x, rounding, rand);
    else if constexpr (F == FMT_E8M) return e8m_encode(x, aux, rounding, rand);
    else if constexpr (F == FMT_INT8) return int8_encode(map, __fmul_rn(__fmul_rn(x, int8_pre(scale)), inv), rounding, rand, aux);
    else if constexpr (F == FMT_E4M3 || F == FMT_E5M2) {
        // nearest: the hardware converter (bit-identical to mf_encode's nearest)
        if (rounding == ROUND_NEAREST) return fp8_encode_rn_hw<F>(__fmul_rn(x, inv));
        return mf_encode<F>(__fmul_rn(x, inv), rounding, rand);
    } else return mf_encode<F>(__fmul_rn(x, inv), rounding, rand);
}

// 1 / scale: 2^-k for FP8/FP4 (scale = 2^k, so multiplying by it is exact), for int8
// 1 / (absmax * int8_pre(absmax)) (int8.rs `normalizer`; the same rounded quotient for every
// element of a block).
template <int F> __device__ __forceinline__ float inverse_scale(float scale) {
    if constexpr (F == FMT_INT8) return __frcp_rn(__fmul_rn(scale, int8_pre(scale)));
    else if constexpr (Codes<F>::SCALED) return pow2(-floor_log2(scale));
    else return 1.0f;
}

// Stalled? The stored value is bit-identical: F32 states are written back exactly (never
// stall); BF16 compares codes. Scaled formats compare the decoded values' bits (a scale
// change moves the grid), or, BY_CODE, the codes: equivalent when the block keeps its scale
// and the scale is within [2^-100, 2^100] (decoding is then injective on the codes the
// encoders write: every product code x scale is exact or, for int8, a distinct normal float).
template <int F, bool BY_CODE>
__device__ __forceinline__ bool same_stored(unsigned new_code, unsigned old_code, float new_scale, float old_val,
                                            Int8Map map) {
    if constexpr (F == FMT_F32) return false;
    else if constexpr (F == FMT_BF16 || F == FMT_E8M || BY_CODE) return new_code == old_code;
    else return __float_as_uint(decode<F>(new_code, new_scale, map)) == __float_as_uint(old_val);
}

// Whether stalls of a block may be decided BY_CODE (see same_stored); unscaled formats
// keep the scale 1.
__device__ __forceinline__ bool scale_kept(float new_scale, float old_scale) {
    return new_scale == old_scale && new_scale >= 0x1p-100f && new_scale <= 0x1p100f;
}


__device__ __forceinline__ float param_update(float p, float m, float v, float decay, const StepArgs& a) {
    float m_hat = __fmul_rn(m, a.inv_bias_correction1);
    float v_hat = __fmul_rn(v, a.inv_bias_correction2);
    float denom = __fadd_rn(__fsqrt_rn(v_hat), a.eps);
    return __fsub_rn(__fmul_rn(p, decay), __fmul_rn(a.lr, __fdiv_rn(m_hat, denom)));
}

// Everything one lane reads for its quad e..e+k-1 (k <= 4) of one block or round; a
// segment issues the loads of all its rounds before computing the first.
template <typename P, int MF, int VF> struct Inputs {
    float4 g;
    typename Codes<WeightCodes<P>::F>::Raw w;
    typename Codes<MF>::Raw m;
    typename Codes<VF>::Raw v;
    float sm, sv;  // old scales (1 when unscaled or reset)
};

// A reset state reads as its zero code (scale 1), exactly like the CPU's set_zero.
// WEIGHTS = false: the weights are not loaded (the per-tensor amax pass).
template <typename P, int MF, int VF, bool WEIGHTS = true>
__device__ __forceinline__ void load_inputs(const StepArgs& a, const TensorArgs& t, unsigned long long si,
                                            unsigned long long e, int k, Inputs<P, MF, VF>& in) {
    if (k <= 0) return;  // (a block past the tensor's end has no scale to read)
    in.sm = (Codes<MF>::SCALED && !a.reset_m) ? ((const float*)t.ms)[si] : 1.0f;
    in.sv = (Codes<VF>::SCALED && !a.reset_v) ? ((const float*)t.vs)[si] : 1.0f;
    if constexpr (WeightCodes<P>::G16) {  // BF16 gradients, widened exactly
        unsigned c[4];
        Codes<FMT_BF16>::unpack(load_codes<FMT_BF16>((const void*)t.g, e, k, 0u), c);
        in.g = make_float4(bf16_decode((uint16_t)c[0]), bf16_decode((uint16_t)c[1]), bf16_decode((uint16_t)c[2]),
                           bf16_decode((uint16_t)c[3]));
    } else if (k == 4) {
        in.g = *(const float4*)((const float*)t.g + e);
    } else {
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < k) x[j] = ((const float*)t.g)[e + j];
        in.g = make_float4(x[0], x[1], x[2], x[3]);
    }
    if (WEIGHTS) in.w = load_codes<WeightCodes<P>::F>((const void*)t.p, e, k, 0u);
    in.m = load_codes<MF>((const void*)t.mc, e, a.reset_m ? 0 : k, MF == FMT_INT8 ? a.zero_m : 0u);
    in.v = load_codes<VF>((const void*)t.vc, e, a.reset_v ? 0 : k, VF == FMT_INT8 ? a.zero_v : 0u);
}

// The quad's old codes, their decoded values and the new moments (FP32 registers; every
// array index is a compile-time constant after unrolling).
struct Quad {
    float m_old[4], v_old[4], m[4], v[4];
    unsigned mo[4], vo[4];
};

template <typename P, int MF, int VF>
__device__ __forceinline__ void moments(const StepArgs& a, const Inputs<P, MF, VF>& in, Int8Map map_m,
                                        Int8Map map_v, Quad& q) {
    const float g[4] = {in.g.x, in.g.y, in.g.z, in.g.w};
    Codes<MF>::unpack(in.m, q.mo);
    Codes<VF>::unpack(in.v, q.vo);
    decode_quad<MF>(in.m, q.mo, in.sm, map_m, q.m_old);
    decode_quad<VF>(in.v, q.vo, in.sv, map_v, q.v_old);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float gs = __fmul_rn(g[j], a.grad_scale);
        q.m[j] = __fadd_rn(__fmul_rn(a.beta1, q.m_old[j]), __fmul_rn(a.one_minus_beta1, gs));
        q.v[j] = __fadd_rn(__fmul_rn(a.beta2, q.v_old[j]), __fmul_rn(a.one_minus_beta2, __fmul_rn(gs, gs)));
    }
}

// Weights: FP32 (written exactly) or BF16 bit patterns (rounded, stalls counted).
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void update_weights(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                               const Inputs<P, MF, VF>& in, const Quad& q, unsigned cnt[6]) {
    constexpr int WF = WeightCodes<P>::F;
    unsigned c[4];
    Codes<WF>::unpack(in.w, c);
    const int rounding = rounding_of<SR, false>(WF == FMT_BF16 ? a.round_w : ROUND_NEAREST);
    uint64_t rw[4];
    quad_rand<SR, FMT_BF16>(rounding, t.key_w, t.offset + e, rw);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (j < k) {
            if constexpr (WF == FMT_F32) {
                c[j] = __float_as_uint(param_update(__uint_as_float(c[j]), q.m[j], q.v[j], t.decay, a));
            } else {
                const float old = bf16_decode((uint16_t)c[j]);
                const float nv = param_update(old, q.m[j], q.v[j], t.decay, a);
                const unsigned code = bf16_encode(nv, rounding, rw[j]);
                const bool changed = nv != old;
                cnt[4] += changed;
                cnt[5] += changed && code == c[j];
                c[j] = code;
            }
        }
    }
    store_codes<WF>((void*)t.p, e, k, c);
}

// Warp sum: one REDUX on sm_80+, shuffles before.
__device__ __forceinline__ unsigned warp_sum(unsigned x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
#else
    return __reduce_add_sync(0xffffffffu, x);
#endif
}

// Warp maximum of non-negative floats (they order like their bits): one REDUX on sm_80+.
__device__ __forceinline__ float warp_max(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
#else
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(x)));
#endif
}

// The block's amax of format F's state from the lanes' (a warp reduction, only for scaled
// formats), and the block's new scale from it.
template <int F> __device__ __forceinline__ float block_amax(float lane_amax) {
    return Codes<F>::SCALED ? warp_max(lane_amax) : 0.0f;
}
template <int F> __device__ __forceinline__ float block_scale(float lane_amax) {
    return scale_from_amax<F>(block_amax<F>(lane_amax));
}

// The smallest code v may take in a block whose (finite) amax is `amax_v`: 1 (the grid's
// smallest positive value) with `v_floor` in a non-zero block, else 0 (adamw.rs
// `encode_block`, `zero_free`).
__device__ __forceinline__ unsigned v_floor_code(const StepArgs& a, float amax_v) {
    return a.v_floor && amax_v > 0.0f ? 1u : 0u;
}

__device__ __forceinline__ float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

// Largest finite |m| and |v| of the quad.
__device__ __forceinline__ void quad_amax(const Quad& q, int k, float& am, float& av) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (j < k) {
            am = fmaxf(am, finite_abs(q.m[j]));
            av = fmaxf(av, finite_abs(q.v[j]));
        }
    }
}

// Encode the new moments with the new scales (v no lower than code `floor_v`) and count
// stalls. ALL_SR: m and v both round stochastically (rounding_of).
template <bool SR, bool BY_CODE, bool ALL_SR, int MF, int VF>
__device__ __forceinline__ void encode_count(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                             const Quad& q, float new_sm, float new_sv, unsigned floor_v,
                                             Int8Map map_m, Int8Map map_v, unsigned mn[4], unsigned vn[4],
                                             unsigned cnt[6]) {
    const float inv_m = inverse_scale<MF>(new_sm), inv_v = inverse_scale<VF>(new_sv);
    const int round_m = rounding_of<SR, ALL_SR>(a.round_m), round_v = rounding_of<SR, ALL_SR>(a.round_v);
    uint64_t rm[4], rv[4];
    quad_rand<SR, MF>(round_m, t.key_m, t.offset + e, rm);
    quad_rand<SR, VF>(round_v, t.key_v, t.offset + e, rv);
    // The layout of the quad's encodes, each the fastest measured on the H200: FP4 states
    // encode all four elements first, as straight-line code, then count (10% faster than
    // inside the counting loop); int8 states encode all four inside the loop, without testing
    // j < k; the others only the k in range, inside the loop (encoding first made FP32 and
    // FP8 states 2-4% slower). Elements past k hold the moments of zero inputs and are never
    // stored.
    constexpr bool FP4 = MF == FMT_E2M1 || VF == FMT_UE2M2, INT8 = MF == FMT_INT8 || VF == FMT_INT8;
    const unsigned aux_m = MF == FMT_E8M ? a.frac_m : a.zero_m, aux_v = VF == FMT_E8M ? a.frac_v : a.zero_v;
    const auto encode_pair = [&](int j) {
        mn[j] = encode<MF>(q.m[j], new_sm, inv_m, round_m, rm[j], map_m, aux_m);
        vn[j] = encode<VF>(q.v[j], new_sv, inv_v, round_v, rv[j], map_v, aux_v);
        if constexpr (Codes<VF>::SCALED) vn[j] = max(vn[j], floor_v);
    };
    if constexpr (FP4) {
#pragma unroll
        for (int j = 0; j < 4; j++) encode_pair(j);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (!FP4 && (INT8 || j < k)) encode_pair(j);
        if (j < k) {
            const bool mch = q.m[j] != q.m_old[j], vch = q.v[j] != q.v_old[j];
            cnt[0] += mch;
            cnt[1] += mch && same_stored<MF, BY_CODE>(mn[j], q.mo[j], new_sm, q.m_old[j], map_m);
            cnt[2] += vch;
            cnt[3] += vch && same_stored<VF, BY_CODE>(vn[j], q.vo[j], new_sv, q.v_old[j], map_v);
        }
    }
}

// Encode, count stalls (by code when both blocks keep their scales), store the codes. Both
// tests are warp-uniform branches.
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void encode_store(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                             const Inputs<P, MF, VF>& in, const Quad& q, float new_sm, float new_sv,
                                             unsigned floor_v, Int8Map map_m, Int8Map map_v, unsigned cnt[6]) {
    unsigned mn[4] = {0, 0, 0, 0}, vn[4] = {0, 0, 0, 0};
    const bool by_code = scale_kept(new_sm, in.sm) && scale_kept(new_sv, in.sv);
    if (SR && a.round_m == ROUND_STOCHASTIC && a.round_v == ROUND_STOCHASTIC) {
        if (by_code) encode_count<SR, true, true, MF, VF>(a, t, e, k, q, new_sm, new_sv, floor_v, map_m, map_v, mn, vn, cnt);
        else encode_count<SR, false, true, MF, VF>(a, t, e, k, q, new_sm, new_sv, floor_v, map_m, map_v, mn, vn, cnt);
    } else {
        if (by_code) encode_count<SR, true, false, MF, VF>(a, t, e, k, q, new_sm, new_sv, floor_v, map_m, map_v, mn, vn, cnt);
        else encode_count<SR, false, false, MF, VF>(a, t, e, k, q, new_sm, new_sv, floor_v, map_m, map_v, mn, vn, cnt);
    }
    store_codes<MF>((void*)t.mc, e, k, mn);
    store_codes<VF>((void*)t.vc, e, k, vn);
}

// One lane's quad of one scale block or 128-element round (inputs already loaded): moments,
// weight update, [block amax -> new scales], encode. `si`: the block's scale index.
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void quad_step(const StepArgs& a, const TensorArgs& t, bool blockwise, unsigned long long si,
                                          unsigned long long e, int k, const Inputs<P, MF, VF>& in,
                                          const float* amax_pre, Int8Map map_m, Int8Map map_v,
                                          unsigned cnt[6]) {
    constexpr bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    Quad q;
    float am = 0.0f, av = 0.0f;
    if (k > 0) {
        moments<P, MF, VF>(a, in, map_m, map_v, q);
        quad_amax(q, k, am, av);
        update_weights<SR, P, MF, VF>(a, t, e, k, in, q, cnt);
    }
    float new_sm = 1.0f, new_sv = 1.0f, amax_v = 0.0f;
    if (scaled && blockwise) {
        new_sm = block_scale<MF>(am);
        amax_v = block_amax<VF>(av);
    } else if (scaled) {
        new_sm = scale_from_amax<MF>(amax_pre[0]);
        amax_v = amax_pre[1];
    }
    if (scaled) new_sv = scale_from_amax<VF>(amax_v);
    if (k > 0) encode_store<SR, P, MF, VF>(a, t, e, k, in, q, new_sm, new_sv, v_floor_code(a, amax_v), map_m, map_v, cnt);
    if (scaled && blockwise && threadIdx.x % 32 == 0 && k > 0) {  // lane 0 holds the block's start
        if (Codes<MF>::SCALED) ((float*)t.ms)[si] = new_sm;
        if (Codes<VF>::SCALED) ((float*)t.vs)[si] = new_sv;
    }
}

// 128-element rounds per segment: 2 for unscaled states (both rounds' loads in flight
// together), 1 for scaled ones (their moments are register-hungry). The host's
// segment length in `CudaAdamW::step` (cuda.rs) must agree.
template <int MF, int VF> __host__ __device__ constexpr int rounds() { return (Codes<MF>::SCALED || Codes<VF>::SCALED) ? 1 : 2; }

// A segment of ROUNDS x 128 elements (unscaled states, per-tensor scales, or 128-element
// blocks: round r is block ROUNDS * seg + r). Lane l takes elements 4l..4l+3 of every round;
// all rounds' loads are issued before the first round is computed. FULL: every quad is in
// range (all but the last segment of a tensor), so no element needs a bounds test.
template <bool SR, bool FULL, typename P, int MF, int VF>
__device__ __forceinline__ void round_segment(const StepArgs& a, const TensorArgs& t, unsigned long long seg,
                                              bool blockwise, const float* amax_pre, Int8Map map_m,
                                              Int8Map map_v, unsigned cnt[6]) {
    constexpr int ROUNDS = rounds<MF, VF>();
    const unsigned long long start = seg * (ROUNDS * 128) + 4 * (threadIdx.x % 32);
    Inputs<P, MF, VF> in[ROUNDS];
    int k[ROUNDS];
#pragma unroll
    for (int r = 0; r < ROUNDS; r++) {
        const unsigned long long e = start + 128 * r;
        k[r] = FULL ? 4 : (e < t.n ? (int)min(4ull, t.n - e) : 0);
        load_inputs<P, MF, VF>(a, t, blockwise ? ROUNDS * seg + r : 0, e, k[r], in[r]);
    }
#pragma unroll
    for (int r = 0; r < ROUNDS; r++)
        quad_step<SR, P, MF, VF>(a, t, blockwise, ROUNDS * seg + r, start + 128 * r, k[r], in[r], amax_pre, map_m,
                                 map_v, cnt);
}

// Scale blocks of B != 128 elements (segment = one block). B < 128: one quad per lane (lanes
// past the block idle). B > 128 (lane l takes elements start + 4l .. + 3, then + 128, ...):
// pass 1: decode -> m -> v -> update (weights written), block amax; pass 2: the same moments
// again from the same inputs, encode with the new scales, count stalls.
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void block_segment(const StepArgs& a, const TensorArgs& t, unsigned long long seg,
                                              Int8Map map_m, Int8Map map_v, unsigned cnt[6]) {
    const unsigned len = a.block;
    const unsigned long long start = seg * len, end = min(start + len, t.n);
    Inputs<P, MF, VF> in;
    if (len < 128) {
        const unsigned long long e = start + 4 * (threadIdx.x % 32);
        const int k = (4 * (threadIdx.x % 32) < len && e < end) ? (int)min(4ull, end - e) : 0;
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        quad_step<SR, P, MF, VF>(a, t, true, seg, e, k, in, nullptr, map_m, map_v, cnt);
        return;
    }
    Quad q;
    float am = 0.0f, av = 0.0f;
    for (unsigned long long e = start + 4 * (threadIdx.x % 32); e < end; e += 128) {
        const int k = (int)min(4ull, end - e);
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        moments<P, MF, VF>(a, in, map_m, map_v, q);
        quad_amax(q, k, am, av);
        update_weights<SR, P, MF, VF>(a, t, e, k, in, q, cnt);
    }
    const float new_sm = block_scale<MF>(am);
    const float amax_v = block_amax<VF>(av), new_sv = scale_from_amax<VF>(amax_v);
    for (unsigned long long e = start + 4 * (threadIdx.x % 32); e < end; e += 128) {
        const int k = (int)min(4ull, end - e);
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        moments<P, MF, VF>(a, in, map_m, map_v, q);
        encode_store<SR, P, MF, VF>(a, t, e, k, in, q, new_sm, new_sv, v_floor_code(a, amax_v), map_m, map_v, cnt);
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
        if (Codes<MF>::SCALED) ((float*)t.ms)[seg] = new_sm;
        if (Codes<VF>::SCALED) ((float*)t.vs)[seg] = new_sv;
    }
}

// The warp's contiguous run of segments [first, last) of the launch. Returns false for
// warps without work.
__device__ __forceinline__ bool warp_run(const StepArgs& a, unsigned long long& first, unsigned long long& last) {
    const unsigned long long warps = (unsigned long long)gridDim.x * (blockDim.x / 32);
    const unsigned long long w = (unsigned long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const unsigned long long per = (a.segments + warps - 1) / warps;
    first = w * per;
    last = min(first + per, a.segments);
    return first < last;
}

// Index of the tensor holding segment s (the last with first_segment <= s, so past empty
// tensors): searching forward from tensor ti, or by bisection.
__device__ __forceinline__ unsigned tensor_of(const LaunchArgs& L, unsigned ti, unsigned long long s) {
    while (ti + 1 < L.s.count && L.t[ti + 1].first_segment <= s) ti++;
    return ti;
}
__device__ __forceinline__ unsigned tensor_at(const LaunchArgs& L, unsigned long long s) {
    unsigned lo = 0, hi = L.s.count;  // L.t[0].first_segment = 0 <= s
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (L.t[mid].first_segment <= s) lo = mid; else hi = mid;
    }
    return lo;
}

// The warp's segments [s, last) in order: segment(t, s) for each, done(t) after a tensor's
// last one. PER_TENSOR: a loop over the run's tensors around a loop over each tensor's
// segments (a tensor's arguments loop-invariant), else one loop over the segments that looks
// the tensor up for each. The step kernels with FP32 weights take PER_TENSOR: in the one
// loop the compiler re-read the pointers from the kernel parameters between a segment's
// global loads, and in the int8 kernel one such read shared a scoreboard with a global load,
// delaying the gradient and weight loads by a memory latency (SASS). With BF16 weights
// PER_TENSOR was 17-27% slower for fp32, bf16 and int8 states, cause not found. Numbers:
// bench/optimizer_h200.md.
template <bool PER_TENSOR, typename Segment, typename Done>
__device__ __forceinline__ void for_each_segment(const LaunchArgs& L, unsigned long long s, unsigned long long last,
                                                 Segment segment, Done done) {
    unsigned ti = tensor_at(L, s);
    if constexpr (PER_TENSOR) {
        for (;; ti = tensor_of(L, ti, s)) {
            const TensorArgs& t = L.t[ti];
            const unsigned long long end = ti + 1 < L.s.count ? min(last, L.t[ti + 1].first_segment) : last;
            for (; s < end; s++) segment(t, s);
            done(t);
            if (s == last) return;
        }
    } else {
        for (; s < last; s++) {
            const unsigned tn = tensor_of(L, ti, s);
            if (tn != ti) done(L.t[ti]);
            ti = tn;
            segment(L.t[ti], s);
        }
        done(L.t[ti]);
    }
}

// Warp sum of the six stall counters into the tensor's slot (one atomicAdd each), then zero.
__device__ __forceinline__ void flush_counters(unsigned cnt[6], unsigned long long* slot) {
#pragma unroll
    for (int c = 0; c < 6; c++) {
        const unsigned x = warp_sum(cnt[c]);
        if (threadIdx.x % 32 == 0 && x) atomicAdd(slot + c, (unsigned long long)x);
        cnt[c] = 0;
    }
}

// BLOCKS: the launch's scale blocks are not 128 elements (block_segment); a separate kernel,
// so that its register-hungry two-pass path does not lower the main kernels' occupancy.
template <bool SR, bool BLOCKS, typename P, int MF, int VF>
__device__ __forceinline__ void adamw_step(const LaunchArgs& L, const float* amax_pre, unsigned long long* counters,
                                           const float* maps, const uint8_t* buckets) {
    // int8: both maps, their search windows and bucket tables in shared memory
    __shared__ float values[2][256];
    __shared__ float4 windows[2][256];
    __shared__ unsigned starts[2][INT8_BUCKETS / 2];  // 2 x INT8_BUCKETS bytes each
    if (MF == FMT_INT8 || VF == FMT_INT8) {
        for (int i = threadIdx.x; i < 2 * 256; i += blockDim.x) {
            const float* t = maps + i / 256 * 256;
            const int j = i % 256;
            const auto at = [&](int k) { return k < 256 ? t[k] : F32_INF; };
            values[i / 256][j] = t[j];
            windows[i / 256][j] = make_float4(t[j], at(j + 1), at(j + 2), at(j + 3));
        }
        for (int i = threadIdx.x; i < INT8_BUCKETS; i += blockDim.x)
            starts[i / (INT8_BUCKETS / 2)][i % (INT8_BUCKETS / 2)] = ((const unsigned*)buckets)[i];
        __syncthreads();
    }
    const Int8Map map_m{values[0], windows[0], (const uint8_t*)starts[0]};
    const Int8Map map_v{values[1], windows[1], (const uint8_t*)starts[1]};
    const StepArgs& a = L.s;
    unsigned long long s, last;
    if (!warp_run(a, s, last)) return;
    constexpr bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    const bool blockwise = a.block > 0;
    unsigned cnt[6] = {0, 0, 0, 0, 0, 0};
    const auto segment = [&](const TensorArgs& t, unsigned long long i) {
        const unsigned long long seg = i - t.first_segment;
        if constexpr (BLOCKS) {
            if constexpr (scaled) block_segment<SR, P, MF, VF>(a, t, seg, map_m, map_v, cnt);
        } else if ((seg + 1) * (rounds<MF, VF>() * 128) <= t.n)
            round_segment<SR, true, P, MF, VF>(a, t, seg, blockwise, amax_pre + 2 * t.index, map_m, map_v, cnt);
        else
            round_segment<SR, false, P, MF, VF>(a, t, seg, blockwise, amax_pre + 2 * t.index, map_m, map_v, cnt);
    };
    const auto done = [&](const TensorArgs& t) { flush_counters(cnt, counters + 6ull * t.index); };
    for_each_segment<WeightCodes<P>::F == FMT_F32>(L, s, last, segment, done);
}

// The warp's amax of tensor `index` into its two slots (lane 0, one atomicMax each).
__device__ __forceinline__ void flush_amax(float am, float av, unsigned* amax, unsigned index) {
    am = warp_max(am), av = warp_max(av);
    if (threadIdx.x % 32 == 0) {
        atomicMax(amax + 2 * index, __float_as_uint(am));
        atomicMax(amax + 2 * index + 1, __float_as_uint(av));
    }
}

// Per-tensor scaling (B = 0): the amax of the new moments over each whole tensor, into
// amax[2 * index] (m) and amax[2 * index + 1] (v) as ordered bits (non-negative floats
// order like integers). P: the gradients' type (float: FP32; Bf16Grads: BF16); the weights
// are not loaded.
template <typename P, int MF, int VF>
__device__ __forceinline__ void adamw_amax(const LaunchArgs& L, unsigned* amax, const float* maps) {
    const StepArgs& a = L.s;
    unsigned long long s, last;
    if (!warp_run(a, s, last)) return;
    Inputs<P, MF, VF> in;
    Quad q;
    float am = 0.0f, av = 0.0f;
    const auto segment = [&](const TensorArgs& t, unsigned long long i) {
#pragma unroll
        for (int r = 0; r < rounds<MF, VF>(); r++) {
            const unsigned long long e = (i - t.first_segment) * (rounds<MF, VF>() * 128) + 128 * r + 4 * (threadIdx.x % 32);
            const int k = e < t.n ? (int)min(4ull, t.n - e) : 0;
            if (k > 0) {
                load_inputs<P, MF, VF, false>(a, t, 0, e, k, in);
                moments<P, MF, VF>(a, in, Int8Map{maps, nullptr, nullptr}, Int8Map{maps + 256, nullptr, nullptr}, q);
                quad_amax(q, k, am, av);
            }
        }
    };
    const auto done = [&](const TensorArgs& t) {
        flush_amax(am, av, amax, t.index);
        am = av = 0.0f;
    };
    for_each_segment<false>(L, s, last, segment, done);  // (the per-tensor form is not measured for this pass)
}

// Per-tensor scaling, after the step: the new scales from the amax (one thread per tensor).
template <int MF, int VF> __device__ __forceinline__ void adamw_set_scales(const LaunchArgs& L, const unsigned* amax) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.s.count) return;
    const TensorArgs& t = L.t[i];
    if (Codes<MF>::SCALED) ((float*)t.ms)[0] = scale_from_amax<MF>(__uint_as_float(amax[2 * t.index]));
    if (Codes<VF>::SCALED) ((float*)t.vs)[0] = scale_from_amax<VF>(__uint_as_float(amax[2 * t.index + 1]));
}

// ---- one extern "C" kernel per (weight dtype, m format, v format) ----
// adamw_<weights>_<m>_<v>[_sr][_blocks] (weights: f32, bf16, bf16g = BF16 weights with BF16
// gradients): _sr with stochastic rounding code (any write-back stochastic), _blocks for
// scale blocks other than 128 elements; adamw_amax[_bf16g]_<m>_<v> per gradient dtype.
// Thread blocks of 256 per SM at once (`__launch_bounds__`; measured on the H200): 4 (at most
// 64 registers per thread) for int8 states (which spill; with 3 blocks int8 ran no faster
// with 128-blocks and 12% slower with 2048-blocks, with 5 and 6 blocks 15% and 65% slower)
// and for BF16 m and v with BF16 weights (3 blocks: 4% slower); 3 for the others (80
// registers; 2 blocks without spills ran 15% slower), BF16 m and v with FP32 weights
// included: with 4 blocks their SR kernel spilled and ran 4% slower than nearest, with 3 it
// is within 1% (0.527-0.532 ms SR, nearest unchanged).
// e8m states count as BF16 (the same containers; not measured separately).
template <int F> constexpr bool is16() { return F == FMT_BF16 || F == FMT_E8M; }
template <typename P, int MF, int VF> constexpr int min_blocks() {
    return MF == FMT_INT8 || VF == FMT_INT8 || (is16<MF>() && is16<VF>() && WeightCodes<P>::F == FMT_BF16) ? 4 : 3;
}
#define ADAMW_KERNEL(NAME, SR, BLOCKS, P, MF, VF)                                                            \
    extern "C" __global__ void __launch_bounds__(256, min_blocks<P, MF, VF>())                              \
        NAME(const __grid_constant__ LaunchArgs L, const float* amax_pre, unsigned long long* counters,      \
             const float* maps, const uint8_t* buckets) {                                                    \
        adamw_step<SR, BLOCKS, P, MF, VF>(L, amax_pre, counters, maps, buckets);                             \
    }
#define ADAMW_KERNELS(PN, P, MN, MF, VN, VF)                                  \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN, false, false, P, MF, VF)           \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_sr, true, false, P, MF, VF)       \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_blocks, false, true, P, MF, VF)   \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_sr_blocks, true, true, P, MF, VF)
#define ADAMW_AMAX(NAME, P, MF, VF)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) NAME(const __grid_constant__ LaunchArgs L, unsigned* amax, \
                                                           const float* maps) {                              \
        adamw_amax<P, MF, VF>(L, amax, maps);                                                                \
    }
#define ADAMW_AUX(MN, MF, VN, VF)                                                                            \
    ADAMW_AMAX(adamw_amax_##MN##_##VN, float, MF, VF)                                                        \
    ADAMW_AMAX(adamw_amax_bf16g_##MN##_##VN, Bf16Grads, MF, VF)                                              \
    extern "C" __global__ void adamw_set_scales_##MN##_##VN(const __grid_constant__ LaunchArgs L,           \
                                                            const unsigned* amax) {                          \
        adamw_set_scales<MF, VF>(L, amax);                                                                   \
    }
#define ADAMW_V(MN, MF, VN, VF)                          \
    ADAMW_KERNELS(f32, float, MN, MF, VN, VF)            \
    ADAMW_KERNELS(bf16, uint16_t, MN, MF, VN, VF)        \
    ADAMW_KERNELS(bf16g, Bf16Grads, MN, MF, VN, VF)      \
    ADAMW_AUX(MN, MF, VN, VF)
#define ADAMW_M(MN, MF)                       \
    ADAMW_V(MN, MF, fp32, FMT_F32)            \
    ADAMW_V(MN, MF, bf16, FMT_BF16)           \
    ADAMW_V(MN, MF, fp8e4m3, FMT_E4M3)        \
    ADAMW_V(MN, MF, fp8e5m2, FMT_E5M2)        \
    ADAMW_V(MN, MF, fp4ue2m2, FMT_UE2M2)      \
    ADAMW_V(MN, MF, int8, FMT_INT8)

ADAMW_M(fp32, FMT_F32)
ADAMW_M(bf16, FMT_BF16)
ADAMW_M(fp8e4m3, FMT_E4M3)
ADAMW_M(fp8e5m2, FMT_E5M2)
ADAMW_M(fp4e2m1, FMT_E2M1)
ADAMW_M(int8, FMT_INT8)
// precision-only states (e8m, any K) pair with fp32, bf16 and e8m states only (cuda.rs
// `kernel_pair` says so before loading)
ADAMW_V(fp32, FMT_F32, e8m, FMT_E8M)
ADAMW_V(bf16, FMT_BF16, e8m, FMT_E8M)
ADAMW_V(e8m, FMT_E8M, fp32, FMT_F32)
ADAMW_V(e8m, FMT_E8M, bf16, FMT_BF16)
ADAMW_V(e8m, FMT_E8M, e8m, FMT_E8M)
