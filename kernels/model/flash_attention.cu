// Causal self-attention as FlashAttention-2 computes it (Dao 2023, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", Algorithms 1 and 2): no [T, T]
// matrix in global memory in either pass, the backward recomputes the probabilities from
// the forward's log-sum-exp. BF16 q, k, v, head dim D in {64, 128}; the products on tensor
// cores (WMMA 16x16x16, BF16 inputs, FP32 accumulation), softmax statistics in FP32.
//
// Layouts: any [B, heads, T, D] view with D contiguous, given as element strides per batch
// entry, head and position (q, k and dq, dk share one set; v, o, do and dv another): q and
// k as RoPE writes them ([B, heads, T, D]) and v and o as the projections read and write them
// ([B, T, heads * D]), so no head relayout is needed.
//
// Rounding, as the composed path (crates/model/src/attention.rs): scores and their softmax
// in FP32, the probabilities rounded to BF16 before the product with v; dP in FP32,
// dS = scale * P * (dP - rowsum(dO * O)) rounded to BF16 before its products. The
// normaliser l sums the unrounded probabilities (the composed path normalises before
// rounding: the two differ by BF16 rounding only).
//
// Determinism: no atomics. dK and dV are summed by the block that owns a key tile over the
// query tiles in order; dQ by the block that owns a query tile over the key tiles in order
// (a second kernel: FA2's atomic dQ accumulation traded for one more product per tile).
//
// Work: a block of 4 warps owns a tile of 64 rows (queries in the forward and in dQ, keys in
// dK/dV) of one (batch entry, head); warp w owns rows [16w, 16w + 16) of it. Two lanes
// share one row for the elementwise work (lane / 2 = row, lane % 2 = which half of the
// columns).

#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define BR 64        // rows per tile
#define NW 4         // warps per block
#define LDS (BR + 4)  // row stride of the FP32 [16, BR] score tiles (padded against bank conflicts)
#define LDP (BR + 8)  // row stride of the BF16 [16, BR] probability tiles

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// Element strides of a [B, heads, T, D] view (D contiguous).
struct View {
    int b, h, t;
};

// Successive regions of the block's dynamic shared memory, in the order the kernels' *_smem
// formulas count them (every region a multiple of 32 bytes: WMMA's alignment).
struct Carver {
    unsigned char* at;
    template <typename T> __device__ T* take(int n) {
        T* r = reinterpret_cast<T*>(at);
        at += n * sizeof(T);
        return r;
    }
};

// Row stride of a BF16 [BR, D] tile in shared memory (padded against bank conflicts).
template <int D> __host__ __device__ constexpr int ldh() { return D + 8; }
// Row stride of an FP32 [16, D] accumulator tile.
template <int D> __host__ __device__ constexpr int ldo() { return D + 4; }

// Copies rows [r0, r0 + BR) of one head (base: its row 0) into a [BR, D] shared tile with
// 16-byte loads; rows at or past t are zero.
template <int D>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* base, int stride_t, int r0, int t) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < BR * CHUNKS; i += NW * 32) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < t) val = *reinterpret_cast<const uint4*>(base + (size_t)(r0 + r) * stride_t + c);
        *reinterpret_cast<uint4*>(dst + r * ldh<D>() + c) = val;
    }
}

// C[16, BR] (FP32, row stride LDS) = A[16, D] · B[BR, D]ᵀ: A one warp's 16 rows of a tile,
// B a whole tile (both BF16, row stride ldh).
template <int D>
__device__ __forceinline__ void rows_times_tile_t(const bf16* a, const bf16* b, float* c) {
#pragma unroll
    for (int n = 0; n < BR / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int k = 0; k < D / 16; k++) {
            FragA fa;
            FragBt fb;
            wmma::load_matrix_sync(fa, a + k * 16, ldh<D>());
            wmma::load_matrix_sync(fb, b + n * 16 * ldh<D>() + k * 16, ldh<D>());
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n * 16, acc, LDS, wmma::mem_row_major);
    }
}

// acc[n] += P[16, BR] · B[BR, D] columns [16n, 16n + 16): P BF16 (row stride LDP), B a tile.
template <int D>
__device__ __forceinline__ void accumulate_p_times_tile(FragC* acc, const bf16* p, const bf16* b) {
#pragma unroll
    for (int k = 0; k < BR / 16; k++) {
        FragA fa;
        wmma::load_matrix_sync(fa, p + k * 16, LDP);
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            FragB fb;
            wmma::load_matrix_sync(fb, b + k * 16 * ldh<D>() + n * 16, ldh<D>());
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// Writes one warp's [16, D] FP32 accumulator tile (row stride ldo), each row times
// row_scale[row] (the lane's own row), as BF16 rows r0 + 16w + row < t of one head.
template <int D>
__device__ __forceinline__ void store_rows(bf16* base, int stride_t, int row0, int t, const float* acc, float row_scale) {
    int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * (D / 2);
    if (row0 + r >= t) return;
    bf16* dst = base + (size_t)(row0 + r) * stride_t + c0;
    const float* src = acc + r * ldo<D>() + c0;
#pragma unroll
    for (int c = 0; c < D / 2; c += 8) {
        __align__(16) bf16 out[8];
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = __float2bfloat16_rn(src[c + i] * row_scale);
        *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(out);
    }
}

// Stores accumulator fragments acc[0 .. D/16) as one warp's [16, D] FP32 tile.
template <int D>
__device__ __forceinline__ void store_acc(float* dst, const FragC* acc) {
#pragma unroll
    for (int n = 0; n < D / 16; n++) wmma::store_matrix_sync(dst + n * 16, acc[n], ldo<D>(), wmma::mem_row_major);
}

// ---------------------------------------------------------------------------------------
// Forward: per query tile, over key tiles 0..tile (causal), the online softmax
// m' = max(m, rowmax(S)), l' = l e^(m - m') + rowsum(e^(S - m')), O' = O e^(m - m') + P V,
// and at the end O / l and lse = m + log(l) (S already times scale).
// Shared memory: q, k, v tiles, per warp S [16, LDS] FP32, P [16, LDP] BF16, O [16, ldo] FP32.

template <int D>
__host__ __device__ constexpr int fwd_smem() {
    return 3 * BR * ldh<D>() * 2 + NW * 16 * (LDS * 4 + LDP * 2 + ldo<D>() * 4);
}

template <int D>
__device__ void flash_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int heads, int t,
                          View qk, View vo, float scale) {
    extern __shared__ __align__(32) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    Carver c{smem};
    bf16 *sq = c.take<bf16>(BR * ldh<D>()), *sk = c.take<bf16>(BR * ldh<D>()), *sv = c.take<bf16>(BR * ldh<D>());
    float* ss = c.take<float>(NW * 16 * LDS) + warp * 16 * LDS;
    bf16* sp = c.take<bf16>(NW * 16 * LDP) + warp * 16 * LDP;
    float* so = c.take<float>(NW * 16 * ldo<D>()) + warp * 16 * ldo<D>();

    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    const bf16* qb = q + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const bf16* kb = k + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const bf16* vb = v + (size_t)bi * vo.b + (size_t)hi * vo.h;
    int q0 = tile * BR, row = q0 + warp * 16 + r;  // this lane's query

    load_tile<D>(sq, qb, qk.t, q0, t);
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) so[r * ldo<D>() + c] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * BR;
        __syncthreads();  // the previous key tile is no longer read
        load_tile<D>(sk, kb, qk.t, k0, t);
        load_tile<D>(sv, vb, vo.t, k0, t);
        __syncthreads();
        rows_times_tile_t<D>(sq + warp * 16 * ldh<D>(), sk, ss);
        __syncwarp();
        float s[BR / 2], mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < BR / 2; i++) {
            int col = half * (BR / 2) + i, key = k0 + col;
            s[i] = (key <= row && key < t) ? ss[r * LDS + col] * scale : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float m_new = fmaxf(m, mx);  // finite: key k0 <= row is always in the tile
        float alpha = __expf(m - m_new), sum = 0.f;
#pragma unroll
        for (int i = 0; i < BR / 2; i++) {
            float p = __expf(s[i] - m_new);
            sum += p;
            sp[r * LDP + half * (BR / 2) + i] = __float2bfloat16_rn(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) so[r * ldo<D>() + c] *= alpha;
        __syncwarp();
        FragC acc[D / 16];
#pragma unroll
        for (int n = 0; n < D / 16; n++) wmma::load_matrix_sync(acc[n], so + n * 16, ldo<D>(), wmma::mem_row_major);
        accumulate_p_times_tile<D>(acc, sp, sv);
        store_acc<D>(so, acc);
        __syncwarp();
    }
    bf16* ob = o + (size_t)bi * vo.b + (size_t)hi * vo.h;
    store_rows<D>(ob, vo.t, q0 + warp * 16, t, so, 1.0f / l);
    if (half == 0 && row < t) lse[(size_t)bh * t + row] = m + __logf(l);
}

// ---------------------------------------------------------------------------------------
// Backward, step 1: delta[row] = rowsum(dO * O) (= rowsum(P * dP)), FP32 [B * heads, T];
// one warp per row.

template <int D>
__device__ void flash_bwd_delta(const bf16* o, const bf16* d_o, float* delta, int heads, int t, int rows, View vo) {
    int row = blockIdx.x * NW + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int bh = row / t, p = row % t, bi = bh / heads, hi = bh % heads;
    size_t off = (size_t)bi * vo.b + (size_t)hi * vo.h + (size_t)p * vo.t;
    float s = 0.f;
    for (int c = lane; c < D; c += 32) s += __bfloat162float(o[off + c]) * __bfloat162float(d_o[off + c]);
    for (int x = 16; x > 0; x >>= 1) s += __shfl_xor_sync(0xffffffffu, s, x);
    if (lane == 0) delta[row] = s;
}

// The probabilities of one warp's 16 rows against a tile, from S in ss (FP32, unscaled):
// P = exp(scale * S - lse), 0 where masked; rounded to BF16 into sp. `transposed`: rows are
// keys and columns queries (the dK/dV kernel) instead of the reverse.
__device__ __forceinline__ void probabilities(const float* ss, bf16* sp, int row, int col0, int t, float scale,
                                              const float* lse_cols, float lse_row, bool transposed) {
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
#pragma unroll 8
    for (int i = 0; i < BR / 2; i++) {
        int col = half * (BR / 2) + i, other = col0 + col;
        int qi = transposed ? other : row, kj = transposed ? row : other;
        bool valid = kj <= qi && qi < t && kj < t;
        float lse = transposed ? lse_cols[col] : lse_row;
        float p = valid ? __expf(ss[r * LDS + col] * scale - lse) : 0.f;
        sp[r * LDP + col] = __float2bfloat16_rn(p);
    }
}

// dS = scale * P * (dP - delta), rounded to BF16 into sds (P as rounded in sp, dP in sdp).
__device__ __forceinline__ void score_grads(const bf16* sp, const float* sdp, bf16* sds, float scale,
                                            const float* delta_cols, float delta_row, bool transposed) {
    int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
#pragma unroll 8
    for (int i = 0; i < BR / 2; i++) {
        int col = half * (BR / 2) + i;
        float dlt = transposed ? delta_cols[col] : delta_row;
        float ds = scale * __bfloat162float(sp[r * LDP + col]) * (sdp[r * LDS + col] - dlt);
        sds[r * LDP + col] = __float2bfloat16_rn(ds);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, step 2: per key tile, over query tiles tile..last (causal), with the warp's 16
// keys as rows: Sᵀ = K Qᵀ, Pᵀ, dV += Pᵀ dO, dPᵀ = V dOᵀ, dSᵀ, dK += dSᵀ Q.
// Shared memory: k, v, q, dO tiles; per warp Sᵀ/dPᵀ [16, LDS] FP32, Pᵀ and dSᵀ [16, LDP]
// BF16; lse and delta of the query tile. The output staging reuses the q and dO tiles.

template <int D>
__host__ __device__ constexpr int bwd_kv_smem() {
    return 4 * BR * ldh<D>() * 2 + NW * 16 * (LDS * 4 + 2 * LDP * 2) + 2 * BR * 4;
}

template <int D>
__device__ void flash_bwd_kv(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,
                             const float* delta, bf16* dk, bf16* dv, int heads, int t, View qk, View vo, float scale) {
    extern __shared__ __align__(32) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1;
    Carver c{smem};
    bf16 *sk = c.take<bf16>(BR * ldh<D>()), *sv = c.take<bf16>(BR * ldh<D>());
    bf16 *sq = c.take<bf16>(BR * ldh<D>()), *sdo = c.take<bf16>(BR * ldh<D>());
    float* ss = c.take<float>(NW * 16 * LDS) + warp * 16 * LDS;
    bf16* sp = c.take<bf16>(NW * 16 * LDP) + warp * 16 * LDP;
    bf16* sds = c.take<bf16>(NW * 16 * LDP) + warp * 16 * LDP;
    float *slse = c.take<float>(BR), *sdelta = c.take<float>(BR);

    int ntiles = gridDim.x, tile = blockIdx.x;
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    size_t qk_off = (size_t)bi * qk.b + (size_t)hi * qk.h, vo_off = (size_t)bi * vo.b + (size_t)hi * vo.h;
    int k0 = tile * BR, key = k0 + warp * 16 + r;  // this lane's key
    load_tile<D>(sk, k + qk_off, qk.t, k0, t);
    load_tile<D>(sv, v + vo_off, vo.t, k0, t);
    FragC dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        wmma::fill_fragment(dk_acc[n], 0.f);
        wmma::fill_fragment(dv_acc[n], 0.f);
    }
    for (int qt = tile; qt < ntiles; qt++) {
        int q0 = qt * BR;
        __syncthreads();  // the previous query tile is no longer read
        load_tile<D>(sq, q + qk_off, qk.t, q0, t);
        load_tile<D>(sdo, d_o + vo_off, vo.t, q0, t);
        for (int i = threadIdx.x; i < BR; i += NW * 32) {
            bool in = q0 + i < t;
            slse[i] = in ? lse[(size_t)bh * t + q0 + i] : 0.f;
            sdelta[i] = in ? delta[(size_t)bh * t + q0 + i] : 0.f;
        }
        __syncthreads();
        rows_times_tile_t<D>(sk + warp * 16 * ldh<D>(), sq, ss);  // Sᵀ
        __syncwarp();
        probabilities(ss, sp, key, q0, t, scale, slse, 0.f, true);
        __syncwarp();
        accumulate_p_times_tile<D>(dv_acc, sp, sdo);               // dV += Pᵀ dO
        rows_times_tile_t<D>(sv + warp * 16 * ldh<D>(), sdo, ss);  // dPᵀ = V dOᵀ
        __syncwarp();
        score_grads(sp, ss, sds, scale, sdelta, 0.f, true);
        __syncwarp();
        accumulate_p_times_tile<D>(dk_acc, sds, sq);                // dK += dSᵀ Q
    }
    __syncthreads();  // the q and dO tiles become the output staging
    float* stage = reinterpret_cast<float*>(sq) + warp * 16 * ldo<D>();
    store_acc<D>(stage, dk_acc);
    __syncwarp();
    store_rows<D>(dk + qk_off, qk.t, k0 + warp * 16, t, stage, 1.0f);
    __syncwarp();
    store_acc<D>(stage, dv_acc);
    __syncwarp();
    store_rows<D>(dv + vo_off, vo.t, k0 + warp * 16, t, stage, 1.0f);
}

// ---------------------------------------------------------------------------------------
// Backward, step 3: per query tile, over key tiles 0..tile: S = Q Kᵀ, P, dP = dO Vᵀ, dS,
// dQ += dS K. Shared memory: q, dO, k, v tiles; per warp S and dP [16, LDS] FP32, P and dS
// [16, LDP] BF16. The output staging reuses the k and v tiles.

template <int D>
__host__ __device__ constexpr int bwd_q_smem() {
    return 4 * BR * ldh<D>() * 2 + NW * 16 * (2 * LDS * 4 + 2 * LDP * 2);
}

template <int D>
__device__ void flash_bwd_q(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,
                            const float* delta, bf16* dq, int heads, int t, View qk, View vo, float scale) {
    extern __shared__ __align__(32) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1;
    Carver c{smem};
    bf16 *sq = c.take<bf16>(BR * ldh<D>()), *sdo = c.take<bf16>(BR * ldh<D>());
    bf16 *sk = c.take<bf16>(BR * ldh<D>()), *sv = c.take<bf16>(BR * ldh<D>());
    float* ss = c.take<float>(NW * 16 * LDS) + warp * 16 * LDS;
    float* sdp = c.take<float>(NW * 16 * LDS) + warp * 16 * LDS;
    bf16* sp = c.take<bf16>(NW * 16 * LDP) + warp * 16 * LDP;
    bf16* sds = c.take<bf16>(NW * 16 * LDP) + warp * 16 * LDP;

    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    size_t qk_off = (size_t)bi * qk.b + (size_t)hi * qk.h, vo_off = (size_t)bi * vo.b + (size_t)hi * vo.h;
    int q0 = tile * BR, row = q0 + warp * 16 + r;  // this lane's query
    load_tile<D>(sq, q + qk_off, qk.t, q0, t);
    load_tile<D>(sdo, d_o + vo_off, vo.t, q0, t);
    float lse_row = row < t ? lse[(size_t)bh * t + row] : 0.f;
    float delta_row = row < t ? delta[(size_t)bh * t + row] : 0.f;
    FragC dq_acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dq_acc[n], 0.f);
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * BR;
        __syncthreads();  // the previous key tile is no longer read
        load_tile<D>(sk, k + qk_off, qk.t, k0, t);
        load_tile<D>(sv, v + vo_off, vo.t, k0, t);
        __syncthreads();
        rows_times_tile_t<D>(sq + warp * 16 * ldh<D>(), sk, ss);   // S
        rows_times_tile_t<D>(sdo + warp * 16 * ldh<D>(), sv, sdp); // dP = dO Vᵀ
        __syncwarp();
        probabilities(ss, sp, row, k0, t, scale, nullptr, lse_row, false);
        __syncwarp();
        score_grads(sp, sdp, sds, scale, nullptr, delta_row, false);
        __syncwarp();
        accumulate_p_times_tile<D>(dq_acc, sds, sk);                // dQ += dS K
    }
    __syncthreads();  // the k and v tiles become the output staging
    float* stage = reinterpret_cast<float*>(sk) + warp * 16 * ldo<D>();
    store_acc<D>(stage, dq_acc);
    __syncwarp();
    store_rows<D>(dq + qk_off, qk.t, q0 + warp * 16, t, stage, 1.0f);
}

// ---------------------------------------------------------------------------------------
// Entry points: flash_<pass>_d<D>_bf16. Shared memory sizes (bytes) must match the host's
// (crates/model/src/fused/flash.rs).

#define FLASH_ENTRY(D)                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_fwd_d##D##_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int heads, int t, \
                              int qk_b, int qk_h, int qk_t, int vo_b, int vo_h, int vo_t, float scale) {          \
        flash_fwd<D>(q, k, v, o, lse, heads, t, View{qk_b, qk_h, qk_t}, View{vo_b, vo_h, vo_t}, scale);           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_bwd_delta_d##D##_bf16(const bf16* o, const bf16* d_o, float* delta, int heads, int t, int rows,    \
                                    int vo_b, int vo_h, int vo_t) {                                                \
        flash_bwd_delta<D>(o, d_o, delta, heads, t, rows, View{vo_b, vo_h, vo_t});                                \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_bwd_kv_d##D##_bf16(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,  \
                                 const float* delta, bf16* dk, bf16* dv, int heads, int t, int qk_b, int qk_h,    \
                                 int qk_t, int vo_b, int vo_h, int vo_t, float scale) {                           \
        flash_bwd_kv<D>(q, k, v, d_o, lse, delta, dk, dv, heads, t, View{qk_b, qk_h, qk_t},                       \
                        View{vo_b, vo_h, vo_t}, scale);                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_bwd_q_d##D##_bf16(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,   \
                                const float* delta, bf16* dq, int heads, int t, int qk_b, int qk_h, int qk_t,     \
                                int vo_b, int vo_h, int vo_t, float scale) {                                      \
        flash_bwd_q<D>(q, k, v, d_o, lse, delta, dq, heads, t, View{qk_b, qk_h, qk_t}, View{vo_b, vo_h, vo_t},    \
                       scale);                                                                                     \
    }

FLASH_ENTRY(64)
FLASH_ENTRY(128)
