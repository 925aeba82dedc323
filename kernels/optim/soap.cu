// SOAP's write-backs and update direction on the GPU: the twins of crates/optim/src/rules/soap/store.rs
// (`ema_write`, `weights_write`) and soap/step.rs (`direction`), bit for bit given the same
// inputs; the products around them are candle operations (crates/optim/src/rules/soap/step.rs), the
// refresh's QR cuSOLVER's (crates/optim/src/cuda/refresh.rs). Launched by crates/optim/src/cuda/soap.rs.
//
// soap_ema_*: state x (m, v, L or R) of format F, new = a * decode(x) + b * u per element
// (no FMA: this folder compiles with -fmad=false), the new FP32 values written to `out` (the
// update uses them), encoded with the block's new scale (adamw.rs `encode_block`), stalls
// counted (stalls.rs: updated, stalled, unchanged into counts[0..3]).
//   _blocks_<F>: scale blocks of `block` elements, one warp per block (two passes: amax, then
//                encode), the block's scale written last;
//   _amax_<F>:   one scale per tensor, pass 1: `out` and the tensor's amax (aux[0], ordered FP32
//                bits) and its old scale (aux[1]);
//   _flat_<F>:   unscaled formats (new values computed here), or pass 2 of one scale per
//                tensor (new values from `out`, the scale from aux).
// Each thread takes pairs of elements (2i, 2i + 1): the two FP4 codes of a byte are written by
// one thread.
// soap_weights_<P>: p = p * decay - lr * n, BF16 weights rounded and counted (counts[0..3]).
// soap_direction: the update in the rotated basis (step.rs `direction`, candle's operations
// there: affine, sqrt, affine, div), out = (m * ibc1 + 0) / (sqrt(v * ibc2 + 0) * 1 + eps); the
// zero entries of g counted into counts[0], the elements with v = 0 and m != 0 into counts[1].
#include "codec.cuh"
#include "warp.cuh"

#define SOAP_THREADS 256
#define SOAP_EMA_ARGS_BYTES 88
#define SOAP_WEIGHTS_ARGS_BYTES 56
#define SOAP_DIRECTION_ARGS_BYTES 64

// cuda/soap.rs `EmaArgs` (same order, #[repr(C)]).
struct EmaArgs {
    unsigned long long codes, scales, u, out, n, key, counts, aux;
    float a, b;
    unsigned block;  // elements per scale block (scaled formats; 0 = one scale per tensor)
    int rounding;
    unsigned scale_kind;
    unsigned zero_free;  // a block-scaled v: no code below 1 in a non-zero block
};
static_assert(sizeof(EmaArgs) == SOAP_EMA_ARGS_BYTES, "EmaArgs layout (cuda/soap.rs)");

// cuda/soap.rs `WeightsArgs`.
struct WeightsArgs {
    unsigned long long p, n, len, key, counts;
    float lr, decay;
    int rounding;
    unsigned pad;
};
static_assert(sizeof(WeightsArgs) == SOAP_WEIGHTS_ARGS_BYTES, "WeightsArgs layout (cuda/soap.rs)");

// cuda/soap.rs `DirectionArgs`: g, m (rotated), v, out: n FP32 values each.
struct DirectionArgs {
    unsigned long long g, m, v, out, n, counts;
    float ibc1, ibc2, eps;
    unsigned pad;
};
static_assert(sizeof(DirectionArgs) == SOAP_DIRECTION_ARGS_BYTES, "DirectionArgs layout (cuda/soap.rs)");

struct Count {
    unsigned updated = 0, stalled = 0, unchanged = 0;
    __device__ void add(bool changed, bool same) {
        updated += changed;
        stalled += changed && same;
        unchanged += same;
    }
    // warp sums into counts[0..3] (every lane of the warp calls it)
    __device__ void flush(unsigned long long* counts) {
        const unsigned x[3] = {warp_sum(updated), warp_sum(stalled), warp_sum(unchanged)};
        if (threadIdx.x % 32 == 0)
            for (int i = 0; i < 3; i++)
                if (x[i]) atomicAdd(counts + i, (unsigned long long)x[i]);
    }
};

__device__ __forceinline__ unsigned long long thread_index() { return blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; }
__device__ __forceinline__ unsigned long long thread_count() { return (unsigned long long)gridDim.x * blockDim.x; }

// new = a * decode(code i) + b * u[i]
template <int F> __device__ __forceinline__ float ema_value(const EmaArgs& a, unsigned long long i, float old_scale) {
    const float old = decode<F>(Codes<F>::load((const void*)a.codes, i), old_scale, Int8Map{});
    return a.a * old + a.b * ((const float*)a.u)[i];
}

// Encode the pair (i, i + 1 if < end, the end of i's scale block) of new values x with scale
// s, count against the old codes (decoded with old_scale), store: the FP4 pair as one byte.
template <int F>
__device__ __forceinline__ void encode_pair(const EmaArgs& a, unsigned long long i, unsigned long long end, const float x[2],
                                            BlockScale s, float old_scale, unsigned floor, Count& c) {
    const int k = i + 1 < end ? 2 : 1;
    unsigned code[2];
    for (int j = 0; j < k; j++) {
        const unsigned old = Codes<F>::load((const void*)a.codes, i + j);
        const uint64_t rand = a.rounding == ROUND_STOCHASTIC ? element_bits<rand_width<F>()>(a.key, i + j) : 0;
        unsigned nc = encode<F>(x[j], s, a.rounding, rand, Int8Map{}, 0);
        if constexpr (Codes<F>::SCALED) nc = max(nc, floor);
        c.add(x[j] != decode<F>(old, old_scale, Int8Map{}), same_stored<F>(nc, old, x[j]));
        code[j] = nc;
    }
    if constexpr (F == FMT_E2M1 || F == FMT_UE2M2) {
        uint8_t* b = (uint8_t*)a.codes + i / 2;
        *b = (uint8_t)(k == 2 ? code[0] | (code[1] << 4) : (*b & 0xF0u) | code[0]);
    } else {
        for (int j = 0; j < k; j++) Codes<F>::store((void*)a.codes, i + j, code[j]);
    }
}

template <int F> __device__ void ema_blocks(const EmaArgs& a) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned long long warps = thread_count() / 32, blocks = (a.n + a.block - 1) / a.block;
    float* out = (float*)a.out;
    float* scales = (float*)a.scales;
    Count c;
    for (unsigned long long blk = thread_index() / 32; blk < blocks; blk += warps) {
        const unsigned long long start = blk * a.block, end = min(start + a.block, a.n);
        const float old_scale = scales[blk];
        float amax = 0.0f;
        for (unsigned long long i = start + 2 * lane; i < end; i += 64)
            for (unsigned long long j = i; j < min(i + 2, end); j++) {
                const float x = ema_value<F>(a, j, old_scale);
                out[j] = x;
                amax = fmaxf(amax, isfinite(x) ? fabsf(x) : 0.0f);
            }
        amax = warp_max(amax);
        const BlockScale s = block_scale_of<F>(amax, a.scale_kind);
        const unsigned floor = a.zero_free && amax > 0.0f ? 1u : 0u;
        for (unsigned long long i = start + 2 * lane; i < end; i += 64) {
            const float x[2] = {out[i], i + 1 < end ? out[i + 1] : 0.0f};
            encode_pair<F>(a, i, end, x, s, old_scale, floor, c);
        }
        __syncwarp();
        if (lane == 0) scales[blk] = s.scale;
    }
    c.flush((unsigned long long*)a.counts);
}

template <int F> __device__ void ema_amax(const EmaArgs& a) {
    const float old_scale = ((const float*)a.scales)[0];
    float amax = 0.0f;
    for (unsigned long long i = thread_index(); i < a.n; i += thread_count()) {
        const float x = ema_value<F>(a, i, old_scale);
        ((float*)a.out)[i] = x;
        amax = fmaxf(amax, isfinite(x) ? fabsf(x) : 0.0f);
    }
    amax = warp_max(amax);
    unsigned* aux = (unsigned*)a.aux;
    if (threadIdx.x % 32 == 0) atomicMax(aux, __float_as_uint(amax));
    if (thread_index() == 0) aux[1] = __float_as_uint(old_scale);
}

template <int F> __device__ void ema_flat(const EmaArgs& a) {
    const unsigned* aux = (const unsigned*)a.aux;
    float* out = (float*)a.out;
    float old_scale = 1.0f, amax = 0.0f;
    if constexpr (Codes<F>::SCALED) old_scale = __uint_as_float(aux[1]), amax = __uint_as_float(aux[0]);
    const BlockScale s = block_scale_of<F>(amax, a.scale_kind);
    const unsigned floor = a.zero_free && amax > 0.0f ? 1u : 0u;
    Count c;
    for (unsigned long long i = 2 * thread_index(); i < a.n; i += 2 * thread_count()) {
        float x[2] = {0.0f, 0.0f};
        for (int j = 0; j < 2 && i + j < a.n; j++) {
            if constexpr (Codes<F>::SCALED) x[j] = out[i + j];
            else out[i + j] = x[j] = ema_value<F>(a, i + j, 1.0f);
        }
        encode_pair<F>(a, i, a.n, x, s, old_scale, floor, c);
    }
    c.flush((unsigned long long*)a.counts);
    if (Codes<F>::SCALED && thread_index() == 0) ((float*)a.scales)[0] = s.scale;
}

template <int WF> __device__ void weights(const WeightsArgs& w) {
    Count c;
    const float* n = (const float*)w.n;
    for (unsigned long long i = thread_index(); i < w.len; i += thread_count()) {
        if constexpr (WF == FMT_F32) {
            float* p = (float*)w.p;
            p[i] = p[i] * w.decay - w.lr * n[i];
        } else {
            uint16_t* p = (uint16_t*)w.p;
            const float old = bf16_decode(p[i]);
            const float nv = old * w.decay - w.lr * n[i];
            const uint64_t rand = w.rounding == ROUND_STOCHASTIC ? element_bits<16>(w.key, i) : 0;
            const unsigned code = bf16_encode(nv, w.rounding, rand);
            c.add(nv != old, code == p[i]);
            p[i] = (uint16_t)code;
        }
    }
    c.flush((unsigned long long*)w.counts);
}

#define SOAP_EMA(NAME, F)                                                                                    \
    extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_ema_blocks_##NAME(const EmaArgs a) { ema_blocks<F>(a); } \
    extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_ema_amax_##NAME(const EmaArgs a) { ema_amax<F>(a); }     \
    extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_ema_flat_##NAME(const EmaArgs a) { ema_flat<F>(a); }
SOAP_EMA(fp32, FMT_F32)
SOAP_EMA(bf16, FMT_BF16)
SOAP_EMA(fp8e4m3, FMT_E4M3)
SOAP_EMA(fp8e5m2, FMT_E5M2)
SOAP_EMA(fp4e2m1, FMT_E2M1)
SOAP_EMA(fp4ue2m2, FMT_UE2M2)
extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_weights_f32(const WeightsArgs w) { weights<FMT_F32>(w); }
extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_weights_bf16(const WeightsArgs w) { weights<FMT_BF16>(w); }

extern "C" __global__ void __launch_bounds__(SOAP_THREADS) soap_direction(const DirectionArgs d) {
    const float *g = (const float*)d.g, *m = (const float*)d.m, *v = (const float*)d.v;
    float* out = (float*)d.out;
    unsigned zero_grad = 0, zero_v = 0;
    for (unsigned long long i = thread_index(); i < d.n; i += thread_count()) {
        const float mi = m[i], vi = v[i];
        out[i] = (mi * d.ibc1 + 0.0f) / (sqrtf(vi * d.ibc2 + 0.0f) * 1.0f + d.eps);
        zero_grad += g[i] == 0.0f;
        zero_v += vi == 0.0f && mi != 0.0f;
    }
    const unsigned x[2] = {warp_sum(zero_grad), warp_sum(zero_v)};
    if (threadIdx.x % 32 == 0)
        for (int i = 0; i < 2; i++)
            if (x[i]) atomicAdd((unsigned long long*)d.counts + i, (unsigned long long)x[i]);
}
