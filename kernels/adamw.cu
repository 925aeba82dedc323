// Fused AdamW step with low-precision moment states: the CUDA twin of
// crates/optim/src/adamw.rs (the CPU reference it must match bit for bit).
//
// One launch updates one parameter tensor. Each warp owns one *segment*: a scale block of
// B elements (B > 0, a multiple of 4), or 128 elements when the states are unscaled or the
// per-tensor amax was computed by `adamw_amax_*` first (B = 0); each lane takes 4
// consecutive elements at a time (16-byte loads of weights and gradients). Per element, in FP32 registers, in the
// reference's order:
//   decode -> m -> v -> bias correction -> decay -> update -> encode
//   g = grad * grad_scale
//   m = b1 * m_old + (1 - b1) * g ;  v = b2 * v_old + (1 - b2) * g^2
//   p = p * (1 - lr * wd) - lr * (m * (1/bc1)) / (sqrt(v * (1/bc2)) + eps)
// p is read and written once; m, v (codes + scales) are read once and written once; the
// dequantized states never reach global memory. With block scales the warp first computes
// the new moments and the block's amax (pass 1, which also writes p), then recomputes the
// identical moments from the same inputs (L1-resident) and encodes them with the new scale
// (pass 2). Every FP32 operation is an explicit IEEE intrinsic (__fmul_rn, ...), so no FMA
// contraction can make the GPU differ from the CPU.
//
// Stall counters (m, v, weights: updated / stalled) are reduced per warp, then per block
// in shared memory, then added with one atomicAdd per counter per block into a device
// buffer that the host reads later (no synchronisation in the step).
#include "formats.cuh"
#include "rng.cuh"

// Host-computed constants of one step on one tensor (mirrors StepScalars + StepKeys).
struct StepArgs {
    float grad_scale, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay;
    float inv_bias_correction1, inv_bias_correction2;
    unsigned long long key_m, key_v, key_w;
    unsigned long long n;
    unsigned int block;     // scale block length; 0 = per tensor (amax precomputed)
    int reset_m, reset_v;   // zero the state before the update
    int round_m, round_v, round_w;
    unsigned int zero_m, zero_v;  // int8: index of 0 in the signed / unsigned map
};

#define SEGMENT_UNSCALED 128
#define WARPS_PER_BLOCK 8

// ---- per-format access to a state's codes ----
// load/store: one element. load4/store4: elements e..e+3 (e % 4 == 0, all in range) with
// one vector access (the buffers are 256-byte aligned cudaMalloc allocations).
template <int F> struct Codes;
template <> struct Codes<FMT_F32> {
    static constexpr bool SCALED = false;
    __device__ static unsigned load(const void* c, unsigned long long e) { return __float_as_uint(((const float*)c)[e]); }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((float*)c)[e] = __uint_as_float(v); }
    __device__ static void load4(const void* c, unsigned long long e, unsigned o[4]) {
        float4 v = *(const float4*)((const float*)c + e);
        o[0] = __float_as_uint(v.x); o[1] = __float_as_uint(v.y); o[2] = __float_as_uint(v.z); o[3] = __float_as_uint(v.w);
    }
    __device__ static void store4(void* c, unsigned long long e, const unsigned o[4]) {
        *(float4*)((float*)c + e) = make_float4(__uint_as_float(o[0]), __uint_as_float(o[1]), __uint_as_float(o[2]), __uint_as_float(o[3]));
    }
};
template <> struct Codes<FMT_BF16> {
    static constexpr bool SCALED = false;
    __device__ static unsigned load(const void* c, unsigned long long e) { return ((const uint16_t*)c)[e]; }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((uint16_t*)c)[e] = (uint16_t)v; }
    __device__ static void load4(const void* c, unsigned long long e, unsigned o[4]) {
        uint2 v = *(const uint2*)((const uint16_t*)c + e);
        o[0] = v.x & 0xFFFF; o[1] = v.x >> 16; o[2] = v.y & 0xFFFF; o[3] = v.y >> 16;
    }
    __device__ static void store4(void* c, unsigned long long e, const unsigned o[4]) {
        *(uint2*)((uint16_t*)c + e) = make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16));
    }
};
struct ByteCodes {
    static constexpr bool SCALED = true;
    __device__ static unsigned load(const void* c, unsigned long long e) { return ((const uint8_t*)c)[e]; }
    __device__ static void store(void* c, unsigned long long e, unsigned v) { ((uint8_t*)c)[e] = (uint8_t)v; }
    __device__ static void load4(const void* c, unsigned long long e, unsigned o[4]) {
        unsigned w = *(const unsigned*)((const uint8_t*)c + e);
        for (int k = 0; k < 4; k++) o[k] = (w >> (8 * k)) & 0xFF;
    }
    __device__ static void store4(void* c, unsigned long long e, const unsigned o[4]) {
        *(unsigned*)((uint8_t*)c + e) = o[0] | (o[1] << 8) | (o[2] << 16) | (o[3] << 24);
    }
};
// two FP4 codes per byte, element 2i in the low nibble of byte i
struct NibbleCodes {
    static constexpr bool SCALED = true;
    __device__ static unsigned load(const void* c, unsigned long long e) {
        return (((const uint8_t*)c)[e / 2] >> (4 * (e % 2))) & 0xF;
    }
    // read-modify-write of the shared byte (tails only, one thread per byte)
    __device__ static void store(void* c, unsigned long long e, unsigned v) {
        uint8_t* b = (uint8_t*)c + e / 2;
        unsigned sh = 4 * (e % 2);
        *b = (uint8_t)((*b & ~(0xFu << sh)) | (v << sh));
    }
    __device__ static void load4(const void* c, unsigned long long e, unsigned o[4]) {
        unsigned w = *(const uint16_t*)((const uint8_t*)c + e / 2);
        for (int k = 0; k < 4; k++) o[k] = (w >> (4 * k)) & 0xF;
    }
    __device__ static void store4(void* c, unsigned long long e, const unsigned o[4]) {
        *(uint16_t*)((uint8_t*)c + e / 2) = (uint16_t)(o[0] | (o[1] << 4) | (o[2] << 8) | (o[3] << 12));
    }
};
template <> struct Codes<FMT_E4M3> : ByteCodes {};
template <> struct Codes<FMT_E5M2> : ByteCodes {};
template <> struct Codes<FMT_INT8> : ByteCodes {};
template <> struct Codes<FMT_E2M1> : NibbleCodes {};
template <> struct Codes<FMT_UE2M2> : NibbleCodes {};

// Random bits only for stochastic rounding (nearest ignores them).
__device__ __forceinline__ uint64_t rand_for(int rounding, unsigned long long key, unsigned long long i) {
    return rounding == ROUND_STOCHASTIC ? random_bits(key, i) : 0ull;
}

// Decoded value of a code with its block scale (state.rs `decode_code`).
template <int F> __device__ __forceinline__ float decode(unsigned c, float scale, const float* map) {
    if constexpr (F == FMT_F32) return __uint_as_float(c);
    else if constexpr (F == FMT_BF16) return bf16_decode((uint16_t)c);
    else if constexpr (F == FMT_INT8) return __fmul_rn(map[c], scale);
    else return __fmul_rn(mf_decode<F>(c), scale);
}

template <int F> __device__ __forceinline__ float max_finite() {
    if constexpr (F == FMT_E4M3 || F == FMT_E5M2 || F == FMT_E2M1 || F == FMT_UE2M2) return MiniFloat<F>::MAX_FINITE;
    else return 1.0f;
}

// New scale from the block amax: 2^k for FP8/FP4, absmax for int8 (scale.rs).
template <int F> __device__ __forceinline__ float scale_from_amax(float amax) {
    if constexpr (F == FMT_INT8) return amax > 0.0f ? amax : 1.0f;
    else return pow2(pow2_scale_exp(amax, max_finite<F>()));
}

// Encode x with the block's new scale (adamw.rs `encode_block` / `write_back`).
template <int F> __device__ __forceinline__ unsigned encode(float x, float scale, int rounding, uint64_t rand,
                                                          const float* map, unsigned zero) {
    if constexpr (F == FMT_F32) return __float_as_uint(x);
    else if constexpr (F == FMT_BF16) return bf16_encode(x, rounding, rand);
    else if constexpr (F == FMT_INT8) return int8_encode(map, __fdiv_rn(x, scale), rounding, rand, zero);
    // scale = 2^k: multiplying by 2^-k is exact
    else return mf_encode<F>(__fmul_rn(x, pow2(-floor_log2(scale))), rounding, rand);
}

// Stalled? F32 states are written back exactly (never stall); BF16 compares codes;
// scaled formats compare the decoded values' bits (a scale change moves the grid).
template <int F> __device__ __forceinline__ bool same_stored(unsigned new_code, unsigned old_code, float new_val,
                                                             float old_val) {
    if constexpr (F == FMT_F32) return false;
    else if constexpr (F == FMT_BF16) return new_code == old_code;
    else return __float_as_uint(new_val) == __float_as_uint(old_val);
}

__device__ __forceinline__ void moments(float grad, float m_old, float v_old, const StepArgs& a, float& m, float& v) {
    float g = __fmul_rn(grad, a.grad_scale);
    m = __fadd_rn(__fmul_rn(a.beta1, m_old), __fmul_rn(a.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(a.beta2, v_old), __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
}

__device__ __forceinline__ float param_update(float p, float m, float v, const StepArgs& a) {
    float m_hat = __fmul_rn(m, a.inv_bias_correction1);
    float v_hat = __fmul_rn(v, a.inv_bias_correction2);
    float denom = __fadd_rn(__fsqrt_rn(v_hat), a.eps);
    return __fsub_rn(__fmul_rn(p, a.decay), __fmul_rn(a.lr, __fdiv_rn(m_hat, denom)));
}

// Weights: FP32 (written exactly) or BF16 bit patterns (rounded, stalls counted).
// update(p, e, k, ...) updates elements e..e+k-1 (one vector access when k == 4).
template <typename P> struct Weights;
template <> struct Weights<float> {
    __device__ static void update(float* p, unsigned long long e, int k, const float m[4], const float v[4],
                                  const StepArgs& a, unsigned& upd, unsigned& st) {
        if (k == 4) {
            float4 q = *(const float4*)(p + e);
            q.x = param_update(q.x, m[0], v[0], a);
            q.y = param_update(q.y, m[1], v[1], a);
            q.z = param_update(q.z, m[2], v[2], a);
            q.w = param_update(q.w, m[3], v[3], a);
            *(float4*)(p + e) = q;
        } else {
            for (int j = 0; j < k; j++) p[e + j] = param_update(p[e + j], m[j], v[j], a);
        }
    }
};
template <> struct Weights<uint16_t> {
    __device__ static void update(uint16_t* p, unsigned long long e, int k, const float m[4], const float v[4],
                                  const StepArgs& a, unsigned& upd, unsigned& st) {
        unsigned c[4];
        if (k == 4) Codes<FMT_BF16>::load4(p, e, c);
        else for (int j = 0; j < k; j++) c[j] = p[e + j];
        for (int j = 0; j < k; j++) {
            float old = bf16_decode((uint16_t)c[j]);
            float nv = param_update(old, m[j], v[j], a);
            unsigned code = bf16_encode(nv, a.round_w, rand_for(a.round_w, a.key_w, e + j));
            bool changed = nv != old;
            upd += changed;
            st += changed && code == c[j];
            c[j] = code;
        }
        if (k == 4) Codes<FMT_BF16>::store4(p, e, c);
        else for (int j = 0; j < k; j++) p[e + j] = (uint16_t)c[j];
    }
};

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

// Gradients and old codes of elements e..e+k-1 (vector loads when k == 4).
template <int MF, int VF>
__device__ __forceinline__ void load_quad(const StepArgs& a, const float* g, const void* mc, const void* vc,
                                          unsigned long long e, int k, float gq[4], unsigned mo[4], unsigned vo[4]) {
    if (k == 4) {
        float4 q = *(const float4*)(g + e);
        gq[0] = q.x; gq[1] = q.y; gq[2] = q.z; gq[3] = q.w;
        if (!a.reset_m) Codes<MF>::load4(mc, e, mo);
        if (!a.reset_v) Codes<VF>::load4(vc, e, vo);
    } else {
        for (int j = 0; j < k; j++) {
            gq[j] = g[e + j];
            if (!a.reset_m) mo[j] = Codes<MF>::load(mc, e + j);
            if (!a.reset_v) vo[j] = Codes<VF>::load(vc, e + j);
        }
    }
    // a reset state reads as its zero code (scale 1), exactly like the CPU's set_zero
    if (a.reset_m) for (int j = 0; j < 4; j++) mo[j] = MF == FMT_INT8 ? a.zero_m : 0u;
    if (a.reset_v) for (int j = 0; j < 4; j++) vo[j] = VF == FMT_INT8 ? a.zero_v : 0u;
}

// Encode the new moments of a quad with the new scales, count stalls, store the codes.
template <int MF, int VF>
__device__ __forceinline__ void encode_quad(const StepArgs& a, void* mc, void* vc, unsigned long long e, int k,
                                            const float m[4], const float v[4], const unsigned mo[4],
                                            const unsigned vo[4], float old_sm, float old_sv, float new_sm,
                                            float new_sv, const float* map_m, const float* map_v, unsigned cnt[6]) {
    unsigned mn[4], vn[4];
    for (int j = 0; j < k; j++) {
        const unsigned long long i = e + j;
        float m_old = decode<MF>(mo[j], old_sm, map_m);
        float v_old = decode<VF>(vo[j], old_sv, map_v);
        mn[j] = encode<MF>(m[j], new_sm, a.round_m, rand_for(a.round_m, a.key_m, i), map_m, a.zero_m);
        vn[j] = encode<VF>(v[j], new_sv, a.round_v, rand_for(a.round_v, a.key_v, i), map_v, a.zero_v);
        bool mch = m[j] != m_old, vch = v[j] != v_old;
        cnt[0] += mch;
        cnt[1] += mch && same_stored<MF>(mn[j], mo[j], decode<MF>(mn[j], new_sm, map_m), m_old);
        cnt[2] += vch;
        cnt[3] += vch && same_stored<VF>(vn[j], vo[j], decode<VF>(vn[j], new_sv, map_v), v_old);
    }
    if (k == 4) {
        Codes<MF>::store4(mc, e, mn);
        Codes<VF>::store4(vc, e, vn);
    } else {
        for (int j = 0; j < k; j++) {
            Codes<MF>::store(mc, e + j, mn[j]);
            Codes<VF>::store(vc, e + j, vn[j]);
        }
    }
}

// decode -> m -> v for a quad loaded by load_quad.
template <int MF, int VF>
__device__ __forceinline__ void quad_moments(const StepArgs& a, int k, const float gq[4], const unsigned mo[4],
                                             const unsigned vo[4], float old_sm, float old_sv, const float* map_m,
                                             const float* map_v, float m[4], float v[4]) {
    for (int j = 0; j < 4; j++) m[j] = v[j] = 0.0f;
    for (int j = 0; j < k; j++)
        moments(gq[j], decode<MF>(mo[j], old_sm, map_m), decode<VF>(vo[j], old_sv, map_v), a, m[j], v[j]);
}

// The warp's work on one segment [start, start + len): lane l takes elements
// start + 4l .. start + 4l + 3, then + 128, ... (16-byte loads of p and g).
// Scaled blocks of at most 128 elements (one quad per lane) keep the new moments in
// registers between the amax and the encode; longer blocks recompute them (pass 2).
template <typename P, int MF, int VF>
__device__ void segment(const StepArgs& a, P* p, const float* g, void* mc, float* ms, void* vc, float* vs,
                        const float* amax_pre, unsigned long long s, unsigned long long start, unsigned len,
                        const float* map_m, const float* map_v, unsigned cnt[6]) {
    const int lane = threadIdx.x % 32;
    const bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    const bool two_pass = scaled && a.block > 0;
    const unsigned long long si = a.block > 0 ? s : 0;  // scale index
    const float old_sm = (Codes<MF>::SCALED && !a.reset_m) ? ms[si] : 1.0f;
    const float old_sv = (Codes<VF>::SCALED && !a.reset_v) ? vs[si] : 1.0f;
    const unsigned long long end = min(start + len, a.n);
    float gq[4], m[4], v[4];
    unsigned mo[4], vo[4];

    if (two_pass && a.block <= 128) {
        // One quad per lane: moments, weight update, amax, scales, encode.
        const unsigned long long e = start + 4 * lane;
        const int k = e < end ? (int)min(4ull, end - e) : 0;
        float am = 0.0f, av = 0.0f;
        if (k > 0) {
            load_quad<MF, VF>(a, g, mc, vc, e, k, gq, mo, vo);
            quad_moments<MF, VF>(a, k, gq, mo, vo, old_sm, old_sv, map_m, map_v, m, v);
            for (int j = 0; j < k; j++) {
                am = fmaxf(am, finite_abs(m[j]));
                av = fmaxf(av, finite_abs(v[j]));
            }
            Weights<P>::update(p, e, k, m, v, a, cnt[4], cnt[5]);
        }
        const float new_sm = scale_from_amax<MF>(warp_max(am));
        const float new_sv = scale_from_amax<VF>(warp_max(av));
        if (k > 0) encode_quad<MF, VF>(a, mc, vc, e, k, m, v, mo, vo, old_sm, old_sv, new_sm, new_sv, map_m, map_v, cnt);
        __syncwarp();
        if (lane == 0) {
            if (Codes<MF>::SCALED) ms[si] = new_sm;
            if (Codes<VF>::SCALED) vs[si] = new_sv;
        }
        return;
    }

    float new_sm = 1.0f, new_sv = 1.0f;
    if (two_pass) {
        // Pass 1: decode -> m -> v -> update (weights written), block amax.
        float am = 0.0f, av = 0.0f;
        for (unsigned long long e = start + 4 * lane; e < end; e += 128) {
            const int k = (int)min(4ull, end - e);
            load_quad<MF, VF>(a, g, mc, vc, e, k, gq, mo, vo);
            quad_moments<MF, VF>(a, k, gq, mo, vo, old_sm, old_sv, map_m, map_v, m, v);
            for (int j = 0; j < k; j++) {
                am = fmaxf(am, finite_abs(m[j]));
                av = fmaxf(av, finite_abs(v[j]));
            }
            Weights<P>::update(p, e, k, m, v, a, cnt[4], cnt[5]);
        }
        new_sm = scale_from_amax<MF>(warp_max(am));
        new_sv = scale_from_amax<VF>(warp_max(av));
    } else if (scaled) {
        new_sm = scale_from_amax<MF>(amax_pre[0]);
        new_sv = scale_from_amax<VF>(amax_pre[1]);
    }
    // Pass 2 (or the only pass): the same moments again, encode with rounding, count stalls.
    for (unsigned long long e = start + 4 * lane; e < end; e += 128) {
        const int k = (int)min(4ull, end - e);
        load_quad<MF, VF>(a, g, mc, vc, e, k, gq, mo, vo);
        quad_moments<MF, VF>(a, k, gq, mo, vo, old_sm, old_sv, map_m, map_v, m, v);
        if (!two_pass) Weights<P>::update(p, e, k, m, v, a, cnt[4], cnt[5]);
        encode_quad<MF, VF>(a, mc, vc, e, k, m, v, mo, vo, old_sm, old_sv, new_sm, new_sv, map_m, map_v, cnt);
    }
    if (two_pass) {
        __syncwarp();
        if (lane == 0) {
            if (Codes<MF>::SCALED) ms[si] = new_sm;
            if (Codes<VF>::SCALED) vs[si] = new_sv;
        }
    }
}

// Block-level reduction of the six stall counters and one atomicAdd each.
__device__ void flush_counters(unsigned cnt[6], unsigned long long* counters) {
    __shared__ unsigned red[WARPS_PER_BLOCK][6];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int c = 0; c < 6; c++) {
        unsigned x = __reduce_add_sync(0xffffffffu, cnt[c]);
        if (lane == 0) red[warp][c] = x;
    }
    __syncthreads();
    if (threadIdx.x < 6) {
        unsigned long long t = 0;
        for (int w = 0; w < WARPS_PER_BLOCK; w++) t += red[w][threadIdx.x];
        if (t) atomicAdd(counters + threadIdx.x, t);
    }
}

template <typename P, int MF, int VF>
__device__ void adamw_step(StepArgs a, P* p, const float* g, void* mc, float* ms, void* vc, float* vs,
                           const float* amax_pre, unsigned long long* counters, const float* maps) {
    __shared__ float map_m[256], map_v[256];
    if (MF == FMT_INT8 || VF == FMT_INT8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            map_m[i] = maps[i];
            map_v[i] = maps[256 + i];
        }
        __syncthreads();
    }
    unsigned cnt[6] = {0, 0, 0, 0, 0, 0};
    const bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    const unsigned seg = (scaled && a.block > 0) ? a.block : SEGMENT_UNSCALED;
    const unsigned long long nseg = (a.n + seg - 1) / seg;
    const unsigned long long warps = (unsigned long long)gridDim.x * WARPS_PER_BLOCK;
    for (unsigned long long s = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; s < nseg; s += warps)
        segment<P, MF, VF>(a, p, g, mc, ms, vc, vs, amax_pre, s, s * seg, seg, map_m, map_v, cnt);
    flush_counters(cnt, counters);
}

// Per-tensor scaling (B = 0): the amax of the new moments over the whole tensor, into
// amax[0] (m) and amax[1] (v) as ordered bits (non-negative floats order like integers).
template <int MF, int VF>
__device__ void adamw_amax(StepArgs a, const float* g, const void* mc, const float* ms, const void* vc,
                           const float* vs, unsigned* amax, const float* maps) {
    const float old_sm = (Codes<MF>::SCALED && !a.reset_m) ? ms[0] : 1.0f;
    const float old_sv = (Codes<VF>::SCALED && !a.reset_v) ? vs[0] : 1.0f;
    float am = 0.0f, av = 0.0f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < a.n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float m_old = a.reset_m ? 0.0f : decode<MF>(Codes<MF>::load(mc, i), old_sm, maps);
        float v_old = a.reset_v ? 0.0f : decode<VF>(Codes<VF>::load(vc, i), old_sv, maps + 256);
        float m, v;
        moments(g[i], m_old, v_old, a, m, v);
        am = fmaxf(am, finite_abs(m));
        av = fmaxf(av, finite_abs(v));
    }
    am = warp_max(am);
    av = warp_max(av);
    if (threadIdx.x % 32 == 0) {
        atomicMax(amax, __float_as_uint(am));
        atomicMax(amax + 1, __float_as_uint(av));
    }
}

// Per-tensor scaling, after the step: the new scales from the amax.
template <int MF, int VF> __device__ void adamw_set_scales(const unsigned* amax, float* ms, float* vs) {
    if (Codes<MF>::SCALED) ms[0] = scale_from_amax<MF>(__uint_as_float(amax[0]));
    if (Codes<VF>::SCALED) vs[0] = scale_from_amax<VF>(__uint_as_float(amax[1]));
}

// ---- one extern "C" kernel per (weight dtype, m format, v format) ----
#define ADAMW_KERNELS(PN, P, MN, MF, VN, VF)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) adamw_##PN##_##MN##_##VN(                              \
        StepArgs a, P* p, const float* g, void* mc, float* ms, void* vc, float* vs, const float* amax_pre,   \
        unsigned long long* counters, const float* maps) {                                                   \
        adamw_step<P, MF, VF>(a, p, g, mc, ms, vc, vs, amax_pre, counters, maps);                            \
    }
#define ADAMW_AUX(MN, MF, VN, VF)                                                                            \
    extern "C" __global__ void adamw_amax_##MN##_##VN(StepArgs a, const float* g, const void* mc,            \
                                                      const float* ms, const void* vc, const float* vs,      \
                                                      unsigned* amax, const float* maps) {                   \
        adamw_amax<MF, VF>(a, g, mc, ms, vc, vs, amax, maps);                                                \
    }                                                                                                        \
    extern "C" __global__ void adamw_set_scales_##MN##_##VN(const unsigned* amax, float* ms, float* vs) {    \
        adamw_set_scales<MF, VF>(amax, ms, vs);                                                              \
    }
#define ADAMW_V(MN, MF, VN, VF)                          \
    ADAMW_KERNELS(f32, float, MN, MF, VN, VF)            \
    ADAMW_KERNELS(bf16, uint16_t, MN, MF, VN, VF)        \
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
