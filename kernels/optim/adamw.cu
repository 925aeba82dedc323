// Fused AdamW step with low-precision moment states: the CUDA twin of
// crates/optim/src/rules/adamw/step.rs (the CPU reference it must match bit for bit).
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
//   g = grad * grad_scale      (grad_scale: the host's, or gate[0] of the device's clip,
//                               args.cuh `step_args`; gate[1] != 0: the step does nothing)
//   m = b1 * m_old + (1 - b1) * g ;  v = b2 * v_old + (1 - b2) * g^2
//   p = p * (1 - lr * wd) - lr * (m * (1/bc1)) / (sqrt(v * (1/bc2)) + eps)
// Muon's momentum (a.momentum_only, FP32 "weights" and v kernels, v never read: reset_v):
//   m = b * m_old + (1 - b) * g ;  p <- u = (1 - b) * g + b * m  (Nesterov) or m
// Simulated stalling (a.skip_m, a.skip_v non-zero) keeps an element's old code instead of the
// encoded one, decided by its draw of t.key_skip (adamw.rs `Skip`).
// p is read and written once; m, v (codes + scales) are read once and written once; the
// dequantized states never reach global memory. Blocks of at most 128 elements keep the new
// moments in registers between the block amax (a warp reduction) and the encode; longer
// blocks compute the moments and amax (pass 1, which also writes p), then recompute the
// identical moments from the same inputs (L1/L2-resident) and encode them (pass 2). Every
// FP32 operation is an explicit IEEE intrinsic (__fmul_rn, ...), so no FMA contraction can
// make the GPU differ from the CPU.
//
// Step counters (counters.cuh: m, v, weights updated / stalled / unchanged, and the zero
// gradients) are summed per warp and added with one atomicAdd per counter each time the warp
// leaves a tensor, into a device buffer that the host reads later (no synchronisation in the
// step).
//
// The files of this folder, one idea each: args.cuh (launch arguments), codes.cuh (code
// storage), adamw_math.cuh (the per-element AdamW update), codec.cuh (the write-back: block
// scale, encode, decode, stall test) over the format codecs (bf16, precision, minifloat, fp8,
// fp4, int8, scale .cuh: crates/optim/src/states/format/*.rs), rng.cuh (counter RNG), counters.cuh;
// this file is the pipeline (segments, warps, kernels). Measurements behind its choices:
// bench/optimizer_h200.md.
#include "adamw_math.cuh"
#include "args.cuh"
#include "codec.cuh"
#include "counters.cuh"
#include "dither.cuh"

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
    const bool fresh_v = a.reset_v && !a.keep_idle_v;  // (keep_idle_v: v is read, moments() zeroes it)
    in.sm = (Codes<MF>::SCALED && !a.reset_m) ? ((const float*)t.ms)[si] : 1.0f;
    in.sv = (Codes<VF>::SCALED && !fresh_v) ? ((const float*)t.vs)[si] : 1.0f;
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
    in.v = load_codes<VF>((const void*)t.vc, e, fresh_v ? 0 : k, VF == FMT_INT8 ? a.zero_v : 0u);
}

// The quad's old codes, their decoded values and the new moments (FP32 registers; every
// array index is a compile-time constant after unrolling).
struct Quad {
    float m_old[4], v_old[4], m[4], v[4];
    unsigned mo[4], vo[4];
};

// The draw of dither (dither.cuh) that element e of tensor t falls in: its block's, or the
// tensor's one with one scale per tensor (quant.rs `dither_block`).
__device__ __forceinline__ unsigned long long dither_block(const StepArgs& a, const TensorArgs& t, unsigned long long e) {
    return a.block ? (t.offset + e) / a.block : 0ull;
}

// The old values read with dither (a.dither_m / dither_v): the quad's codes moved back by
// their block's draw of the write being read (adamw.rs `step_tensor`, quant.rs `Reader`).
template <int F>
__device__ __forceinline__ void undither_quad(unsigned long long key, unsigned long long block, const unsigned c[4], float scale,
                                              Int8Map map, bool signed_state, unsigned frac, float out[4]) {
    const float d = dither_read_offset<F>(dither_block_bits(key, block));
#pragma unroll
    for (int j = 0; j < 4; j++) out[j] = read_dithered<F>(c[j], scale, d, map, signed_state, frac);
}

template <typename P, int MF, int VF>
__device__ __forceinline__ void moments(const StepArgs& a, const TensorArgs& t, unsigned long long e, const Inputs<P, MF, VF>& in,
                                        Int8Map map_m, Int8Map map_v, Quad& q) {
    const float g[4] = {in.g.x, in.g.y, in.g.z, in.g.w};
    Codes<MF>::unpack(in.m, q.mo);
    Codes<VF>::unpack(in.v, q.vo);
    typename Codes<VF>::Raw v_raw = in.v;
    if (a.reset_v && a.keep_idle_v) {  // a reset of v that spares the zero gradients (state.rs zero_where)
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (!zero_gradient(g[j], a)) q.vo[j] = VF == FMT_INT8 ? a.zero_v : 0u;
        v_raw = Codes<VF>::pack(q.vo);
    }
    if (a.dither_m) undither_quad<MF>(t.key_m_read, dither_block(a, t, e), q.mo, in.sm, map_m, true, a.frac_m, q.m_old);
    else decode_quad<MF>(in.m, q.mo, in.sm, map_m, q.m_old);
    if (a.dither_v) undither_quad<VF>(t.key_v_read, dither_block(a, t, e), q.vo, in.sv, map_v, false, a.frac_v, q.v_old);
    else decode_quad<VF>(v_raw, q.vo, in.sv, map_v, q.v_old);
#pragma unroll
    for (int j = 0; j < 4; j++) adamw_moments(g[j], q.m_old[j], q.v_old[j], a, q.m[j], q.v[j]);
}

// Weights: FP32 (written exactly) or BF16 bit patterns (rounded, stalls counted); the zero
// gradients and the updates with v = 0, m != 0 counted (once per element: here).
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void update_weights(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                               const Inputs<P, MF, VF>& in, const Quad& q, StepCounters& cnt) {
    const float g[4] = {in.g.x, in.g.y, in.g.z, in.g.w};
    constexpr int WF = WeightCodes<P>::F;
    unsigned c[4];
    Codes<WF>::unpack(in.w, c);
    if constexpr (WF == FMT_F32) {
        if (a.momentum_only != MOMENTUM_NONE) {  // Muon: p receives u (muon/momentum.rs)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (j < k) {
                    count_zero_grad(cnt, zero_gradient(g[j], a));
                    const float gs = __fmul_rn(g[j], a.grad_scale);
                    const float u = a.momentum_only == MOMENTUM_NESTEROV
                                        ? __fadd_rn(__fmul_rn(a.one_minus_beta1, gs), __fmul_rn(a.beta1, q.m[j]))
                                        : q.m[j];
                    c[j] = __float_as_uint(u);
                }
            }
            store_codes<WF>((void*)t.p, e, k, c);
            return;
        }
    }
    const int rounding = rounding_of<SR, false>(WF == FMT_BF16 ? a.round_w : ROUND_NEAREST);
    uint64_t rw[4];
    quad_rand<SR, FMT_BF16>(rounding, t.key_w, t.offset + e, rw);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (j < k) {
            count_zero_grad(cnt, zero_gradient(g[j], a));
            count_zero_v(cnt, q.m[j], q.v[j]);
            if constexpr (WF == FMT_F32) {
                c[j] = __float_as_uint(param_update(__uint_as_float(c[j]), q.m[j], q.v[j], t.decay, a));
            } else {
                const float old = bf16_decode((uint16_t)c[j]);
                const float nv = param_update(old, q.m[j], q.v[j], t.decay, a);
                const unsigned code = bf16_encode(nv, rounding, rw[j]);
                count_w(cnt, nv != old, code == c[j]);
                c[j] = code;
            }
        }
    }
    store_codes<WF>((void*)t.p, e, k, c);
}

// The block's amax of format F's state from the lanes' (a warp reduction, only for scaled
// formats).
template <int F> __device__ __forceinline__ float block_amax(float lane_amax) {
    return Codes<F>::SCALED ? warp_max(lane_amax) : 0.0f;
}

// The smallest code v may take in a block whose (finite) amax is `amax_v`: 1 (the grid's
// smallest positive value) for a zero-free v in a non-zero block, else 0 (adamw.rs
// `encode_block`, `zero_free`).
__device__ __forceinline__ unsigned zero_free_floor(const StepArgs& a, float amax_v) {
    return a.zero_free && amax_v > 0.0f ? 1u : 0u;
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
// them (stalls.rs: updated, stalled, unchanged). ALL_SR: m and v both round stochastically
// (rounding_of).
template <bool SR, bool ALL_SR, int MF, int VF>
__device__ __forceinline__ void encode_count(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                             const Quad& q, BlockScale sm, BlockScale sv, unsigned floor_v,
                                             Int8Map map_m, Int8Map map_v, unsigned mn[4], unsigned vn[4],
                                             StepCounters& cnt) {
    const int round_m = rounding_of<SR, ALL_SR>(a.round_m), round_v = rounding_of<SR, ALL_SR>(a.round_v);
    uint64_t rm[4], rv[4];
    quad_rand<SR, MF>(round_m, t.key_m, t.offset + e, rm);
    quad_rand<SR, VF>(round_v, t.key_v, t.offset + e, rv);
    // dither (a warp-uniform branch): the block's draw, per element as its sign says
    if (SR && !ALL_SR && (round_m == ROUND_DITHER || round_v == ROUND_DITHER)) {
        const unsigned long long block = dither_block(a, t, e);
        const uint64_t bm = round_m == ROUND_DITHER ? dither_block_bits(t.key_m, block) : 0ull;
        const uint64_t bv = round_v == ROUND_DITHER ? dither_block_bits(t.key_v, block) : 0ull;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (round_m == ROUND_DITHER) rm[j] = dither_signed_bits<MF>(bm, q.m[j]);
            if (round_v == ROUND_DITHER) rv[j] = dither_signed_bits<VF>(bv, q.v[j]);
        }
    }
    // The layout of the quad's encodes, the fastest measured per format (bench/optimizer_h200.md,
    // "Kernel choices"): FP4 states encode all four elements first, then count; int8 states
    // encode all four inside the loop, without testing j < k; the others only the k in range,
    // inside the loop. Elements past k hold the moments of zero inputs and are never stored.
    constexpr bool FP4 = MF == FMT_E2M1 || VF == FMT_UE2M2, INT8 = MF == FMT_INT8 || VF == FMT_INT8;
    const unsigned aux_m = MF == FMT_E8M ? a.frac_m : a.zero_m, aux_v = VF == FMT_E8M ? a.frac_v : a.zero_v;
    const auto encode_pair = [&](int j) {
        mn[j] = encode<MF>(q.m[j], sm, round_m, rm[j], map_m, aux_m);
        vn[j] = encode<VF>(q.v[j], sv, round_v, rv[j], map_v, aux_v);
        if constexpr (Codes<VF>::SCALED) vn[j] = max(vn[j], floor_v);
    };
    if constexpr (FP4) {
#pragma unroll
        for (int j = 0; j < 4; j++) encode_pair(j);
    }
    // Simulated stalling (adamw.rs `Skip`): a skipped element keeps its old code (v under the
    // same floor); element i's draw i of key_skip decides m by its low half, v by its high.
    const bool skipping = (a.skip_m | a.skip_v) != 0u;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (!FP4 && (INT8 || j < k)) encode_pair(j);
        if (skipping && j < k) {
            const unsigned long long r = random_bits(t.key_skip, t.offset + e + j);
            if ((unsigned)r < a.skip_m) mn[j] = q.mo[j];
            if ((unsigned)(r >> 32) < a.skip_v) vn[j] = Codes<VF>::SCALED ? max(q.vo[j], floor_v) : q.vo[j];
        }
        if (j < k) {
            count_mv(cnt, q.m[j] != q.m_old[j], same_stored<MF>(mn[j], q.mo[j], q.m[j]), q.v[j] != q.v_old[j],
                     same_stored<VF>(vn[j], q.vo[j], q.v[j]));
        }
    }
}

// Encode, count, store the codes (ALL_SR: a warp-uniform branch).
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void encode_store(const StepArgs& a, const TensorArgs& t, unsigned long long e, int k,
                                             const Quad& q, BlockScale sm, BlockScale sv, unsigned floor_v,
                                             Int8Map map_m, Int8Map map_v, StepCounters& cnt) {
    unsigned mn[4] = {0, 0, 0, 0}, vn[4] = {0, 0, 0, 0};
    if (SR && a.round_m == ROUND_STOCHASTIC && a.round_v == ROUND_STOCHASTIC)
        encode_count<SR, true, MF, VF>(a, t, e, k, q, sm, sv, floor_v, map_m, map_v, mn, vn, cnt);
    else
        encode_count<SR, false, MF, VF>(a, t, e, k, q, sm, sv, floor_v, map_m, map_v, mn, vn, cnt);
    store_codes<MF>((void*)t.mc, e, k, mn);
    if (a.momentum_only == MOMENTUM_NONE) store_codes<VF>((void*)t.vc, e, k, vn);
}

// One lane's quad of one scale block or 128-element round (inputs already loaded): moments,
// weight update, [block amax -> new scales], encode. `si`: the block's scale index.
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void quad_step(const StepArgs& a, const TensorArgs& t, bool blockwise, unsigned long long si,
                                          unsigned long long e, int k, const Inputs<P, MF, VF>& in,
                                          const float* amax_pre, Int8Map map_m, Int8Map map_v,
                                          StepCounters& cnt) {
    constexpr bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    Quad q;
    float am = 0.0f, av = 0.0f;
    if (k > 0) {
        moments<P, MF, VF>(a, t, e, in, map_m, map_v, q);
        quad_amax(q, k, am, av);
        update_weights<SR, P, MF, VF>(a, t, e, k, in, q, cnt);
    }
    float amax_m = 0.0f, amax_v = 0.0f;
    if (scaled && blockwise) {
        amax_m = block_amax<MF>(am);
        amax_v = block_amax<VF>(av);
    } else if (scaled) {
        amax_m = amax_pre[0];
        amax_v = amax_pre[1];
    }
    const BlockScale sm = block_scale_of<MF>(amax_m, a.scale_m), sv = block_scale_of<VF>(amax_v, a.scale_v);
    // the new scales first (frees their registers for the encode): every lane of the warp read
    // the old ones before the block amax reduction above
    if (scaled && blockwise && threadIdx.x % 32 == 0 && k > 0) {  // lane 0 holds the block's start
        if (Codes<MF>::SCALED) ((float*)t.ms)[si] = sm.scale;
        if (Codes<VF>::SCALED) ((float*)t.vs)[si] = sv.scale;
    }
    if (k > 0) encode_store<SR, P, MF, VF>(a, t, e, k, q, sm, sv, zero_free_floor(a, amax_v), map_m, map_v, cnt);
}

// ROUND_ELEMENTS-element rounds (a quad per lane) per segment: 2 for unscaled states (both
// rounds' loads in flight together), 1 for scaled ones (their moments are register-hungry).
// Shared with the host's segment length through crates/optim/src/cuda/abi.rs
// (`segment_len`, its tests read these), as are the threads per block.
#define STEP_THREADS 256
#define ROUND_ELEMENTS 128
#define SEGMENT_ROUNDS_UNSCALED 2
#define SEGMENT_ROUNDS_SCALED 1
static_assert(ROUND_ELEMENTS == 32 * 4, "a round is one quad per lane");
template <int MF, int VF> __host__ __device__ constexpr int rounds() {
    return (Codes<MF>::SCALED || Codes<VF>::SCALED) ? SEGMENT_ROUNDS_SCALED : SEGMENT_ROUNDS_UNSCALED;
}

// A segment of ROUNDS x 128 elements (unscaled states, per-tensor scales, or 128-element
// blocks: round r is block ROUNDS * seg + r). Lane l takes elements 4l..4l+3 of every round;
// all rounds' loads are issued before the first round is computed. FULL: every quad is in
// range (all but the last segment of a tensor), so no element needs a bounds test.
template <bool SR, bool FULL, typename P, int MF, int VF>
__device__ __forceinline__ void round_segment(const StepArgs& a, const TensorArgs& t, unsigned long long seg,
                                              bool blockwise, const float* amax_pre, Int8Map map_m,
                                              Int8Map map_v, StepCounters& cnt) {
    constexpr int ROUNDS = rounds<MF, VF>();
    const unsigned long long start = seg * (ROUNDS * ROUND_ELEMENTS) + 4 * (threadIdx.x % 32);
    Inputs<P, MF, VF> in[ROUNDS];
    int k[ROUNDS];
#pragma unroll
    for (int r = 0; r < ROUNDS; r++) {
        const unsigned long long e = start + ROUND_ELEMENTS * r;
        k[r] = FULL ? 4 : (e < t.n ? (int)min(4ull, t.n - e) : 0);
        load_inputs<P, MF, VF>(a, t, blockwise ? ROUNDS * seg + r : 0, e, k[r], in[r]);
    }
#pragma unroll
    for (int r = 0; r < ROUNDS; r++)
        quad_step<SR, P, MF, VF>(a, t, blockwise, ROUNDS * seg + r, start + ROUND_ELEMENTS * r, k[r], in[r], amax_pre, map_m,
                                 map_v, cnt);
}

// Scale blocks of B != 128 elements (segment = one block). B < 128: one quad per lane (lanes
// past the block idle). B > 128 (lane l takes elements start + 4l .. + 3, then + 128, ...):
// pass 1: decode -> m -> v -> update (weights written), block amax; pass 2: the same moments
// again from the same inputs, encode with the new scales, count stalls.
template <bool SR, typename P, int MF, int VF>
__device__ __forceinline__ void block_segment(const StepArgs& a, const TensorArgs& t, unsigned long long seg,
                                              Int8Map map_m, Int8Map map_v, StepCounters& cnt) {
    const unsigned len = a.block;
    const unsigned long long start = seg * len, end = min(start + len, t.n);
    Inputs<P, MF, VF> in;
    if (len < ROUND_ELEMENTS) {
        const unsigned long long e = start + 4 * (threadIdx.x % 32);
        const int k = (4 * (threadIdx.x % 32) < len && e < end) ? (int)min(4ull, end - e) : 0;
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        quad_step<SR, P, MF, VF>(a, t, true, seg, e, k, in, nullptr, map_m, map_v, cnt);
        return;
    }
    Quad q;
    float am = 0.0f, av = 0.0f;
    for (unsigned long long e = start + 4 * (threadIdx.x % 32); e < end; e += ROUND_ELEMENTS) {
        const int k = (int)min(4ull, end - e);
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        moments<P, MF, VF>(a, t, e, in, map_m, map_v, q);
        quad_amax(q, k, am, av);
        update_weights<SR, P, MF, VF>(a, t, e, k, in, q, cnt);
    }
    const float amax_v = block_amax<VF>(av);
    const BlockScale sm = block_scale_of<MF>(block_amax<MF>(am), a.scale_m), sv = block_scale_of<VF>(amax_v, a.scale_v);
    for (unsigned long long e = start + 4 * (threadIdx.x % 32); e < end; e += ROUND_ELEMENTS) {
        const int k = (int)min(4ull, end - e);
        load_inputs<P, MF, VF>(a, t, seg, e, k, in);
        moments<P, MF, VF>(a, t, e, in, map_m, map_v, q);
        encode_store<SR, P, MF, VF>(a, t, e, k, q, sm, sv, zero_free_floor(a, amax_v), map_m, map_v, cnt);
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
        if (Codes<MF>::SCALED) ((float*)t.ms)[seg] = sm.scale;
        if (Codes<VF>::SCALED) ((float*)t.vs)[seg] = sv.scale;
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
// the tensor up for each. The step kernels with FP32 weights take PER_TENSOR, those with BF16
// weights the one loop: each the faster (bench/optimizer_h200.md, "Kernel choices").
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

// BLOCKS: the launch's scale blocks are not 128 elements (block_segment); a separate kernel,
// so that its register-hungry two-pass path does not lower the main kernels' occupancy.
template <bool SR, bool BLOCKS, typename P, int MF, int VF>
__device__ __forceinline__ void adamw_step(const LaunchArgs& L, const float* gate, const float* amax_pre,
                                           unsigned long long* counters, const float* maps, const uint8_t* buckets) {
    if (skipped(gate)) return;
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
    const StepArgs a = step_args(L, gate);
    unsigned long long s, last;
    if (!warp_run(a, s, last)) return;
    constexpr bool scaled = Codes<MF>::SCALED || Codes<VF>::SCALED;
    const bool blockwise = a.block > 0;
    StepCounters cnt{};
    const auto segment = [&](const TensorArgs& t, unsigned long long i) {
        const unsigned long long seg = i - t.first_segment;
        if constexpr (BLOCKS) {
            if constexpr (scaled) block_segment<SR, P, MF, VF>(a, t, seg, map_m, map_v, cnt);
        } else if ((seg + 1) * (rounds<MF, VF>() * ROUND_ELEMENTS) <= t.n)
            round_segment<SR, true, P, MF, VF>(a, t, seg, blockwise, amax_pre + 2 * t.index, map_m, map_v, cnt);
        else
            round_segment<SR, false, P, MF, VF>(a, t, seg, blockwise, amax_pre + 2 * t.index, map_m, map_v, cnt);
    };
    const auto done = [&](const TensorArgs& t) { flush_counters(cnt, counters + (unsigned long long)COUNTERS * t.index); };
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
__device__ __forceinline__ void adamw_amax(const LaunchArgs& L, const float* gate, unsigned* amax, const float* maps) {
    if (skipped(gate)) return;
    const StepArgs a = step_args(L, gate);
    unsigned long long s, last;
    if (!warp_run(a, s, last)) return;
    Inputs<P, MF, VF> in;
    Quad q;
    float am = 0.0f, av = 0.0f;
    const auto segment = [&](const TensorArgs& t, unsigned long long i) {
#pragma unroll
        for (int r = 0; r < rounds<MF, VF>(); r++) {
            const unsigned long long e = (i - t.first_segment) * (rounds<MF, VF>() * ROUND_ELEMENTS) + ROUND_ELEMENTS * r + 4 * (threadIdx.x % 32);
            const int k = e < t.n ? (int)min(4ull, t.n - e) : 0;
            if (k > 0) {
                load_inputs<P, MF, VF, false>(a, t, 0, e, k, in);
                moments<P, MF, VF>(a, t, e, in, Int8Map{maps, nullptr, nullptr}, Int8Map{maps + 256, nullptr, nullptr}, q);
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
template <int MF, int VF>
__device__ __forceinline__ void adamw_set_scales(const LaunchArgs& L, const float* gate, const unsigned* amax) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L.s.count || skipped(gate)) return;
    const TensorArgs& t = L.t[i];
    if (Codes<MF>::SCALED) ((float*)t.ms)[0] = block_scale_of<MF>(__uint_as_float(amax[2 * t.index]), L.s.scale_m).scale;
    if (Codes<VF>::SCALED) ((float*)t.vs)[0] = block_scale_of<VF>(__uint_as_float(amax[2 * t.index + 1]), L.s.scale_v).scale;
}

// ---- one extern "C" kernel per (weight dtype, m format, v format) ----
// adamw_<weights>_<m>_<v>[_sr][_blocks] (weights: f32, bf16, bf16g = BF16 weights with BF16
// gradients): _sr with stochastic rounding code (any write-back stochastic), _blocks for
// scale blocks other than 128 elements; adamw_amax[_bf16g]_<m>_<v> per gradient dtype.
// Thread blocks of 256 per SM at once (`__launch_bounds__`): 4 (at most 64 registers per
// thread) for int8 states and for BF16 m and v with BF16 weights, 3 (80 registers) for the
// others; e8m states count as BF16 (the same containers). Each the fastest measured
// (bench/optimizer_h200.md, "Kernel choices").
template <int F> constexpr bool is16() { return F == FMT_BF16 || F == FMT_E8M; }
template <typename P, int MF, int VF> constexpr int min_blocks() {
    return MF == FMT_INT8 || VF == FMT_INT8 || (is16<MF>() && is16<VF>() && WeightCodes<P>::F == FMT_BF16) ? 4 : 3;
}
#define ADAMW_KERNEL(NAME, SR, BLOCKS, P, MF, VF)                                                            \
    extern "C" __global__ void __launch_bounds__(STEP_THREADS, min_blocks<P, MF, VF>())                              \
        NAME(const __grid_constant__ LaunchArgs L, const float* gate, const float* amax_pre,                 \
             unsigned long long* counters, const float* maps, const uint8_t* buckets) {                      \
        adamw_step<SR, BLOCKS, P, MF, VF>(L, gate, amax_pre, counters, maps, buckets);                       \
    }
#define ADAMW_KERNELS(PN, P, MN, MF, VN, VF)                                  \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN, false, false, P, MF, VF)           \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_sr, true, false, P, MF, VF)       \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_blocks, false, true, P, MF, VF)   \
    ADAMW_KERNEL(adamw_##PN##_##MN##_##VN##_sr_blocks, true, true, P, MF, VF)
#define ADAMW_AMAX(NAME, P, MF, VF)                                                                          \
    extern "C" __global__ void __launch_bounds__(STEP_THREADS) NAME(const __grid_constant__ LaunchArgs L, const float* gate, \
                                                           unsigned* amax, const float* maps) {              \
        adamw_amax<P, MF, VF>(L, gate, amax, maps);                                                          \
    }
#define ADAMW_AUX(MN, MF, VN, VF)                                                                            \
    ADAMW_AMAX(adamw_amax_##MN##_##VN, float, MF, VF)                                                        \
    ADAMW_AMAX(adamw_amax_bf16g_##MN##_##VN, Bf16Grads, MF, VF)                                              \
    extern "C" __global__ void adamw_set_scales_##MN##_##VN(const __grid_constant__ LaunchArgs L,           \
                                                            const float* gate, const unsigned* amax) {       \
        adamw_set_scales<MF, VF>(L, gate, amax);                                                             \
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
// precision-only states (e8m, any K) pair with fp32, bf16 and e8m states only (cuda/adamw.rs
// `kernel_pair` says so before loading)
ADAMW_V(fp32, FMT_F32, e8m, FMT_E8M)
ADAMW_V(bf16, FMT_BF16, e8m, FMT_E8M)
ADAMW_V(e8m, FMT_E8M, fp32, FMT_F32)
ADAMW_V(e8m, FMT_E8M, bf16, FMT_BF16)
ADAMW_V(e8m, FMT_E8M, e8m, FMT_E8M)
