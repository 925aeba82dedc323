// Causal self-attention in FP32 on CUDA cores (FFMA, no TF32), for FP32 models whose matrix
// products stay FP32: the FlashAttention-2 algorithm of flash_attention.cu (Dao 2023,
// Algorithms 1 and 2) with the score tiles' products on FP32 fused multiply-adds. No score
// matrix in memory in either pass; the backward recomputes the probabilities from the
// forward's log-sum-exp. Head dim D in {64, 128}. The backward's dQ partials (below) take
// ceil(T / 64)^2 * 64 * D floats per (batch entry, head), about T^2 * D / 64: as much as
// one FP32 [T, T] matrix at D = 64 (335 MB per layer at LLaMA-100M's batch of 128 x 256),
// freed when the backward returns; only the lower triangle of tile pairs is written.
//
// Layouts: as flash_attention.cu: any [B, heads, T, D] view with D contiguous, given as element
// strides per batch entry, head and position (q, k and dq, dk share one set; v, o and do
// another; dv its own), so no head relayout is needed.
//
// Rounding: FP32 throughout (the composed FP32 path's products and softmax in another order);
// exponentials are base 2 of scores times scale * log2(e) (`ex2.approx`, relative error about
// 2^-22); the log-sum-exp is stored in natural units.
//
// Determinism: no atomics. dK and dV are summed by the block that owns a key tile over the
// query tiles in order. That block also writes its dQ contributions, one FP32 [64, D] partial
// per (key tile, query tile) (FA2 adds them with atomics); a last pass sums each query tile's
// partials over the key tiles in order.
//
// Work: a block of 128 threads owns a tile of 64 rows (queries in the forward, keys in the
// backward) of one (batch entry, head). Warp w owns rows r0 = 16w .. r0 + 15 of the [64, 64]
// score tile; its lane (ty, tx) = (lane / 16, lane % 16) holds score entries
// (r0 + ty + 2i, tx + 16j), i < 8, j < 4, and output entries (r0 + ty + 2i, 4tx + 64c + e),
// e < 4, c < D / 64 (rows r0 + 8ty + i of a product with the score tile transposed). Tiles sit
// in shared memory row-major with row stride D + 4 floats (the score tile: 64 + 16); every
// shared read of a product is 16 bytes. A warp's 16-byte shared read costs two wavefronts
// when each quarter-warp reads one address (the operand of the thread's 8 rows) and four
// when a quarter-warp's 8 lanes read 8 different 16-byte units (the operand of its 4 columns
// or 4 output columns; the row stride puts 8 consecutive rows in 8 different bank groups):
// 32 wavefronts per 128 FMAs of each thread in each product (a thread owning 4 x 4 entries
// needed 24 per 64). The score stores of a warp (2 rows, 16 columns) fall in 32 different
// banks. A row's 16 lanes sit in one half-warp, so row maxima and sums are warp shuffles.

#include <stdint.h>

#include "flash_delta.cuh"

#define BR 64        // rows per tile (fused_sizes.rs FLASH_TILE, whose test reads these)
#define NT 128       // threads per block (fused_sizes.rs FLASH_THREADS)
#define RI 8         // score rows per thread
#define CJ 4         // score columns per thread
#define LP_PAD 16    // (fused_sizes.rs FLASH_F32_SCORE_PAD, tested)
#define LP (BR + LP_PAD) // row stride of a [BR, BR] score tile
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Row stride of a [BR, D] tile in shared memory, in floats.
#define LD_PAD 4  // row padding of the FP32 tiles (fused_sizes.rs FLASH_F32_PAD, tested)
template <int D> __host__ __device__ constexpr int ld() { return D + LD_PAD; }

// The calling thread's place in the tiles (see "Work" above).
struct Lane {
    int ty, tx, r0;
    __device__ __forceinline__ int row(int i) const { return r0 + ty + 2 * i; }   // score and output rows
    __device__ __forceinline__ int col(int j) const { return tx + 16 * j; }       // score columns
    __device__ __forceinline__ int out(int c) const { return 4 * tx + 64 * c; }   // first output column
    __device__ __forceinline__ int trow(int i) const { return r0 + 8 * ty + i; }  // rows of a transposed product
};
__device__ __forceinline__ Lane lane() {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    return Lane{l >> 4, l & 15, 16 * w};
}

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float at(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// The sum and the maximum over the 16 lanes of a row (one half-warp: same ty).
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int w = 1; w < 16; w <<= 1) x += __shfl_xor_sync(0xffffffffu, x, w);
    return x;
}
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
    for (int w = 1; w < 16; w <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, w));
    return x;
}

// Copies rows [r0, r0 + BR) of one head (base: its row 0) into a [BR, D] shared tile with
// 16-byte loads (unrolled: several loads in flight); rows at or past t are zero.
template <int D>
__device__ __forceinline__ void load_tile(float* dst, const float* base, int stride_t, int r0, int t) {
    constexpr int CHUNKS = D / 4;
#pragma unroll
    for (int i = threadIdx.x; i < BR * CHUNKS; i += NT) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 4;
        float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + r < t) val = *reinterpret_cast<const float4*>(base + (size_t)(r0 + r) * stride_t + c);
        *reinterpret_cast<float4*>(dst + r * ld<D>() + c) = val;
    }
}

// s[i][j] = a[row(i)] · b[col(j)] (rows of two [BR, D] tiles).
template <int D> __device__ __forceinline__ void scores(float (&s)[RI][CJ], const float* a, const float* b, Lane ln) {
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int j = 0; j < CJ; j++) s[i][j] = 0.f;
#pragma unroll 2
    for (int d = 0; d < D; d += 4) {
        float4 x[RI], y[CJ];
#pragma unroll
        for (int i = 0; i < RI; i++) x[i] = *reinterpret_cast<const float4*>(a + ln.row(i) * ld<D>() + d);
#pragma unroll
        for (int j = 0; j < CJ; j++) y[j] = *reinterpret_cast<const float4*>(b + ln.col(j) * ld<D>() + d);
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < CJ; j++) {
                s[i][j] = fmaf(x[i].x, y[j].x, s[i][j]);
                s[i][j] = fmaf(x[i].y, y[j].y, s[i][j]);
                s[i][j] = fmaf(x[i].z, y[j].z, s[i][j]);
                s[i][j] = fmaf(x[i].w, y[j].w, s[i][j]);
            }
    }
}

// acc[4c + e] += x · y[c].e: one output row's share of a rank-1 update.
template <int D> __device__ __forceinline__ void add_scaled(float (&acc)[D / 16], float x, const float4 (&y)[D / 64]) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) {
        acc[4 * c] = fmaf(x, y[c].x, acc[4 * c]);
        acc[4 * c + 1] = fmaf(x, y[c].y, acc[4 * c + 1]);
        acc[4 * c + 2] = fmaf(x, y[c].z, acc[4 * c + 2]);
        acc[4 * c + 3] = fmaf(x, y[c].w, acc[4 * c + 3]);
    }
}

// acc[i][4c + e] += sum over k of p[row(i)][k] · v[k][out(c) + e]: p a [BR, BR] score tile
// (row stride LP), v a [BR, D] tile.
template <int D>
__device__ __forceinline__ void times_tile(float (&acc)[RI][D / 16], const float* p, const float* v, Lane ln) {
#pragma unroll 1
    for (int k = 0; k < BR; k += 4) {
        float4 x[RI];
#pragma unroll
        for (int i = 0; i < RI; i++) x[i] = *reinterpret_cast<const float4*>(p + ln.row(i) * LP + k);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            float4 y[D / 64];
#pragma unroll
            for (int c = 0; c < D / 64; c++) y[c] = *reinterpret_cast<const float4*>(v + (k + kk) * ld<D>() + ln.out(c));
#pragma unroll
            for (int i = 0; i < RI; i++) add_scaled<D>(acc[i], at(x[i], kk), y);
        }
    }
}

// acc[i][4c + e] = sum over k of p[k][trow(i)] · v[k][out(c) + e]: the product with the
// score tile transposed.
template <int D>
__device__ __forceinline__ void transposed_times_tile(float (&acc)[RI][D / 16], const float* p, const float* v, Lane ln) {
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int e = 0; e < D / 16; e++) acc[i][e] = 0.f;
#pragma unroll 2
    for (int k = 0; k < BR; k++) {
        float4 x[RI / 4], y[D / 64];
#pragma unroll
        for (int h = 0; h < RI / 4; h++) x[h] = *reinterpret_cast<const float4*>(p + k * LP + ln.trow(4 * h));
#pragma unroll
        for (int c = 0; c < D / 64; c++) y[c] = *reinterpret_cast<const float4*>(v + k * ld<D>() + ln.out(c));
#pragma unroll
        for (int i = 0; i < RI; i++) add_scaled<D>(acc[i], at(x[i / 4], i % 4), y);
    }
}

// Writes row `row` of an output (base: the head's row 0) from acc times `factor`, if
// row < t: the thread's columns out(c) .. + 3, 16 bytes each.
template <int D>
__device__ __forceinline__ void store_row(float* base, int stride_t, int row, int t, const float (&acc)[D / 16], float factor,
                                          Lane ln) {
    if (row >= t) return;
#pragma unroll
    for (int c = 0; c < D / 64; c++)
        *reinterpret_cast<float4*>(base + (size_t)row * stride_t + ln.out(c)) =
            make_float4(acc[4 * c] * factor, acc[4 * c + 1] * factor, acc[4 * c + 2] * factor, acc[4 * c + 3] * factor);
}

// ---------------------------------------------------------------------------------------
// Forward: per query tile, over key tiles 0..tile (causal), the online softmax
// m' = max(m, rowmax(S)), l' = l e^(m - m') + rowsum(e^(S - m')), O' = O e^(m - m') + P V,
// and at the end O / l and lse = m + log(l) (S already times scale). Each thread sums l over
// its own columns; the row's 16 lanes add theirs at the end.
// Shared memory: q, k, v tiles and the probabilities P.

template <int D> __host__ __device__ constexpr int fwd_smem() { return (3 * BR * ld<D>() + BR * LP) * 4; }

template <int D>
__device__ void flash_fwd(const float* q, const float* k, const float* v, float* o, float* lse, int heads, int t,
                          View qk, View vo, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* sq = reinterpret_cast<float*>(smem);
    float *sk = sq + BR * ld<D>(), *sv = sk + BR * ld<D>(), *sp = sv + BR * ld<D>();
    Lane ln = lane();
    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    const float* qb = q + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const float* kb = k + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const float* vb = v + (size_t)bi * vo.b + (size_t)hi * vo.h;
    int q0 = tile * BR;
    float sl2 = scale * LOG2E;

    load_tile<D>(sq, qb, qk.t, q0, t);
    float acc[RI][D / 16], m[RI], l[RI];
#pragma unroll
    for (int i = 0; i < RI; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < D / 16; e++) acc[i][e] = 0.f;
    }
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * BR;
        __syncthreads();  // the previous key tile and probabilities are no longer read
        load_tile<D>(sk, kb, qk.t, k0, t);
        load_tile<D>(sv, vb, vo.t, k0, t);
        __syncthreads();
        float s[RI][CJ];
        scores<D>(s, sq, sk, ln);
        bool edge = kt == tile || k0 + BR > t;
#pragma unroll
        for (int i = 0; i < RI; i++) {
            int row = q0 + ln.row(i);
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < CJ; j++) {
                int key = k0 + ln.col(j);
                float x = s[i][j] * sl2;
                if (edge && (key > row || key >= t)) x = -INFINITY;
                s[i][j] = x;
                mx = fmaxf(mx, x);
            }
            float m_new = fmaxf(m[i], row_max(mx));  // finite: key 0 <= row is valid in the first tile
            float alpha = exp2_approx(m[i] - m_new);
            m[i] = m_new;
            l[i] *= alpha;
#pragma unroll
            for (int e = 0; e < D / 16; e++) acc[i][e] *= alpha;
#pragma unroll
            for (int j = 0; j < CJ; j++) {
                float p = exp2_approx(s[i][j] - m_new);
                l[i] += p;
                sp[ln.row(i) * LP + ln.col(j)] = p;
            }
        }
        __syncthreads();
        times_tile<D>(acc, sp, sv, ln);
    }
    float* ob = o + (size_t)bi * vo.b + (size_t)hi * vo.h;
#pragma unroll
    for (int i = 0; i < RI; i++) {
        float li = row_sum(l[i]);
        int row = q0 + ln.row(i);
        if (ln.tx == 0 && row < t) lse[(size_t)bh * t + row] = (m[i] + __log2f(li)) * LN2;
        store_row<D>(ob, vo.t, row, t, acc[i], 1.0f / li, ln);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, step 2: per key tile, over query tiles tile..last (causal), with the keys as
// rows: Sᵀ = K Qᵀ, Pᵀ, dV += Pᵀ dO, dPᵀ = V dOᵀ, dSᵀ = scale · Pᵀ ∘ (dPᵀ − delta),
// dK += dSᵀ Q, and the partial dQ = dS K of this (key tile, query tile) pair into
// `dq_part` [B * heads, key tiles, key tiles * BR, D] (tile kt's partials for query rows
// q at [bh][kt][q]).
// Shared memory: k, v, q, dO tiles; Pᵀ, then dSᵀ; lse (times log2 e; +inf past t, so P = 0
// there) and delta of the query tile.

template <int D> __host__ __device__ constexpr int bwd_kv_smem() { return (4 * BR * ld<D>() + BR * LP + 2 * BR) * 4; }

template <int D>
__device__ void flash_bwd_kv(const float* q, const float* k, const float* v, const float* d_o, const float* lse,
                             const float* delta, float* dk, float* dv, float* dq_part, int heads, int t, View qk,
                             View vo, View dvv, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* sk = reinterpret_cast<float*>(smem);
    float *sv = sk + BR * ld<D>(), *sq = sv + BR * ld<D>(), *sdo = sq + BR * ld<D>(), *sp = sdo + BR * ld<D>();
    float *slse = sp + BR * LP, *sdelta = slse + BR;
    Lane ln = lane();
    int ntiles = gridDim.x, tile = blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    size_t qk_off = (size_t)bi * qk.b + (size_t)hi * qk.h, vo_off = (size_t)bi * vo.b + (size_t)hi * vo.h;
    int k0 = tile * BR;
    float sl2 = scale * LOG2E;
    load_tile<D>(sk, k + qk_off, qk.t, k0, t);
    load_tile<D>(sv, v + vo_off, vo.t, k0, t);
    float dk_acc[RI][D / 16], dv_acc[RI][D / 16];
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
        for (int e = 0; e < D / 16; e++) dk_acc[i][e] = dv_acc[i][e] = 0.f;
    for (int qt = tile; qt < ntiles; qt++) {
        int q0 = qt * BR;
        __syncthreads();  // the previous query tile and dSᵀ are no longer read
        load_tile<D>(sq, q + qk_off, qk.t, q0, t);
        load_tile<D>(sdo, d_o + vo_off, vo.t, q0, t);
        for (int i = threadIdx.x; i < BR; i += NT) {
            bool in = q0 + i < t;
            slse[i] = in ? lse[(size_t)bh * t + q0 + i] * LOG2E : INFINITY;
            sdelta[i] = in ? delta[(size_t)bh * t + q0 + i] : 0.f;
        }
        __syncthreads();
        float ds[RI][CJ];
        {
            float p[RI][CJ];
            scores<D>(p, sk, sq, ln);  // Sᵀ
            bool diagonal = qt == tile;
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < CJ; j++) {
                    int key = k0 + ln.row(i), col = ln.col(j);
                    float x = exp2_approx(p[i][j] * sl2 - slse[col]);
                    sp[ln.row(i) * LP + col] = (diagonal && q0 + col < key) || key >= t ? 0.f : x;
                }
        }
        scores<D>(ds, sv, sdo, ln);  // dPᵀ
        __syncthreads();
        times_tile<D>(dv_acc, sp, sdo, ln);  // dV += Pᵀ dO
#pragma unroll
        for (int i = 0; i < RI; i++)  // Pᵀ read back: fewer live registers during dPᵀ's product
#pragma unroll
            for (int j = 0; j < CJ; j++)
                ds[i][j] = scale * sp[ln.row(i) * LP + ln.col(j)] * (ds[i][j] - sdelta[ln.col(j)]);
        __syncthreads();  // Pᵀ is no longer read
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < CJ; j++) sp[ln.row(i) * LP + ln.col(j)] = ds[i][j];
        __syncthreads();
        times_tile<D>(dk_acc, sp, sq, ln);  // dK += dSᵀ Q
        float dq[RI][D / 16];
        transposed_times_tile<D>(dq, sp, sk, ln);  // dQ (this pair) = dS K
        float* part = dq_part + (((size_t)bh * ntiles + tile) * ntiles * BR) * D;
#pragma unroll
        for (int i = 0; i < RI; i++) store_row<D>(part, D, q0 + ln.trow(i), t, dq[i], 1.f, ln);
    }
#pragma unroll
    for (int i = 0; i < RI; i++) {
        store_row<D>(dk + qk_off, qk.t, k0 + ln.row(i), t, dk_acc[i], 1.f, ln);
        store_row<D>(dv + (size_t)bi * dvv.b + (size_t)hi * dvv.h, dvv.t, k0 + ln.row(i), t, dv_acc[i], 1.f, ln);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, step 3: dQ[row] = the sum of row's partials over key tiles 0..row / BR, in that
// order; one thread per 4 elements.

template <int D>
__device__ void flash_dq_sum(const float* dq_part, float* dq, int heads, int t, int ntiles, int rows, View qk) {
    constexpr int CHUNKS = D / 4;
    size_t i = (size_t)blockIdx.x * NT + threadIdx.x;
    if (i >= (size_t)rows * CHUNKS) return;
    int c = (int)(i % CHUNKS) * 4, r = (int)(i / CHUNKS), bh = r / t, row = r % t;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int kt = 0; kt <= row / BR; kt++) {
        float4 x = *reinterpret_cast<const float4*>(dq_part + (((size_t)bh * ntiles + kt) * ntiles * BR + row) * D + c);
        s.x += x.x;
        s.y += x.y;
        s.z += x.z;
        s.w += x.w;
    }
    int bi = bh / heads, hi = bh % heads;
    *reinterpret_cast<float4*>(dq + (size_t)bi * qk.b + (size_t)hi * qk.h + (size_t)row * qk.t + c) = s;
}

// ---------------------------------------------------------------------------------------
// Entry points: flash_<pass>_d<D>_f32. Shared memory sizes (bytes), the delta pass's rows per
// block and the dQ partials' layout must match the host's (crates/model/src/fused_sizes.rs).
// At D = 64 the forward's 168 registers and 71 KiB let three blocks share an SM; the dK/dV
// pass's 196 registers and 88.5 KiB, two.

#define FLASH_F32_ENTRY(D)                                                                                        \
    extern "C" __global__ void __launch_bounds__(NT)                                                              \
        flash_fwd_d##D##_f32(const float* q, const float* k, const float* v, float* o, float* lse, int heads,     \
                             int t, int qk_b, int qk_h, int qk_t, int vo_b, int vo_h, int vo_t, float scale) {    \
        flash_fwd<D>(q, k, v, o, lse, heads, t, View{qk_b, qk_h, qk_t}, View{vo_b, vo_h, vo_t}, scale);           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NT)                                                              \
        flash_bwd_delta_d##D##_f32(const float* o, const float* d_o, float* delta, int heads, int t, int rows,    \
                                   int vo_b, int vo_h, int vo_t) {                                                \
        flash_bwd_delta<float, D, NT>(o, d_o, delta, heads, t, rows, View{vo_b, vo_h, vo_t});                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NT)                                                              \
        flash_bwd_kv_d##D##_f32(const float* q, const float* k, const float* v, const float* d_o,                 \
                                const float* lse, const float* delta, float* dk, float* dv, float* dq_part,       \
                                int heads, int t, int qk_b, int qk_h, int qk_t, int vo_b, int vo_h, int vo_t,     \
                                int dv_b, int dv_h, int dv_t, float scale) {                                      \
        flash_bwd_kv<D>(q, k, v, d_o, lse, delta, dk, dv, dq_part, heads, t, View{qk_b, qk_h, qk_t},              \
                        View{vo_b, vo_h, vo_t}, View{dv_b, dv_h, dv_t}, scale);                                   \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NT)                                                              \
        flash_dq_sum_d##D##_f32(const float* dq_part, float* dq, int heads, int t, int ntiles, int rows,          \
                                int qk_b, int qk_h, int qk_t) {                                                   \
        flash_dq_sum<D>(dq_part, dq, heads, t, ntiles, rows, View{qk_b, qk_h, qk_t});                             \
    }

FLASH_F32_ENTRY(64)
FLASH_F32_ENTRY(128)
