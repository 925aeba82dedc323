// Causal self-attention as FlashAttention-2 computes it (Dao 2023, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", Algorithms 1 and 2): no [T, T]
// matrix in memory in either pass, the backward recomputes the probabilities from the
// forward's log-sum-exp. BF16 q, k, v, head dim D in {64, 128}; the products on tensor cores
// (PTX `mma.sync.m16n8k16`, BF16 inputs, FP32 accumulation) with the score tiles, their
// softmax and their gradients held in registers, as FA2 does; softmax statistics in FP32.
//
// Layouts: any [B, heads, T, D] view with D contiguous, given as element strides per batch
// entry, head and position (q, k and dq, dk share one set; v, o and do another; dv its own):
// q and k as RoPE writes them ([B, heads, T, D]) and v and o as the projections read and
// write them ([B, T, heads * D]), so no head relayout is needed.
//
// Rounding, as the composed path (crates/model/src/attention.rs): scores and their softmax
// in FP32, the probabilities rounded to BF16 before the product with v; dP in FP32,
// dS = scale * P * (dP - rowsum(dO * O)) rounded to BF16 before its products. The
// normaliser l sums the unrounded probabilities (the composed path normalises before
// rounding: the two differ by BF16 rounding only). Exponentials are base 2 of scores times
// scale * log2(e) (`ex2.approx`, as FA2); the log-sum-exp is stored in natural units.
//
// Determinism: no atomics. dK and dV are summed by the block that owns a key tile over the
// query tiles in order; dQ by the block that owns a query tile over the key tiles in order
// (a second kernel: FA2's atomic dQ accumulation traded for two more products per tile).
//
// Work: a block of 4 warps owns a tile of 64 rows (queries in the forward and in dQ, keys in
// dK/dV) of one (batch entry, head); warp w owns rows [16w, 16w + 16) of it, and the other
// operand comes in tiles of 64 rows through shared memory.

#include <cuda_bf16.h>
#include <stdint.h>

#include "flash_delta.cuh"

typedef __nv_bfloat16 bf16;

#define BR 64  // rows per tile (fused_sizes.rs FLASH_TILE, whose test reads these)
#define NW 4   // warps per block (fused_sizes.rs FLASH_THREADS = NW * 32)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Successive regions of the block's dynamic shared memory, in the order the kernels' *_smem
// formulas count them (every region a multiple of 16 bytes: the 16-byte accesses).
struct Carver {
    unsigned char* at;
    template <typename T> __device__ T* take(int n) {
        T* r = reinterpret_cast<T*>(at);
        at += n * sizeof(T);
        return r;
    }
};

// Row stride of a BF16 [BR, D] tile in shared memory: 16 bytes of padding put the 8 rows
// an `ldmatrix` reads in different banks.
#define LDH_PAD 8  // row padding of the BF16 tiles (fused_sizes.rs FLASH_BF16_PAD, tested)
template <int D> __host__ __device__ constexpr int ldh() { return D + LDH_PAD; }

// ---------------------------------------------------------------------------------------
// Warp-level products. Fragments of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), with g = lane / 4 and c = 2 * (lane % 4):
//   A [16, 16] (4 registers of 2 BF16): (g, c..c+1), (g+8, c..c+1), (g, c+8..), (g+8, c+8..)
//   B [16, 8]  (2 registers):           rows c..c+1 and c+8..c+9 of column g
//   C [16, 8]  (4 FP32):                (g, c), (g, c+1), (g+8, c), (g+8, c+1)
// so the C tiles of columns [16j, 16j + 16), rounded to BF16 pairs, are the A fragment of
// k-slice j: a score tile becomes the left operand of the next product without leaving the
// registers.

template <int N> using Acc = float[N / 8][4];          // C tiles of a [16, N] FP32 block
template <int K> using FragA = uint32_t[K / 16][4];   // A fragments of a [16, K] BF16 block

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const bf16* p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm4_trans(uint32_t (&r)[4], const bf16* p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int N> __device__ __forceinline__ void zero(Acc<N>& acc) {
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
}

// The A fragments of rows [0, 16) of a row-major BF16 tile (row stride ld).
template <int K> __device__ __forceinline__ void load_a(FragA<K>& a, const bf16* tile, int ld) {
    int lane = threadIdx.x & 31;
    const bf16* p = tile + (lane & 15) * ld + (lane >> 4) * 8;
#pragma unroll
    for (int j = 0; j < K / 16; j++) ldsm4(a[j], p + j * 16);
}

// acc[16, N] += A[16, K] · op(B), B a row-major BF16 tile (row stride ld): with B_T, B is
// stored [N, K] and op(B) = Bᵀ (S = Q Kᵀ: `ldmatrix` gives B's fragments as they are);
// without, B is stored [K, N] and op(B) = B (O = P V: `ldmatrix.trans`).
template <int K, int N, bool B_T>
__device__ __forceinline__ void mma_tile(Acc<N>& acc, const FragA<K>& a, const bf16* b, int ld) {
    int lane = threadIdx.x & 31;
    const bf16* p = B_T ? b + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8
                        : b + (lane & 15) * ld + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++)
#pragma unroll
        for (int n = 0; n < N / 16; n++) {
            uint32_t r[4];
            if constexpr (B_T)
                ldsm4(r, p + n * 16 * ld + kk * 16);
            else
                ldsm4_trans(r, p + kk * 16 * ld + n * 16);
            mma(acc[2 * n], a[kk], r[0], r[1]);
            mma(acc[2 * n + 1], a[kk], r[2], r[3]);
        }
}

// The C tiles of a [16, N] block rounded to BF16 as the A fragments of the next product.
template <int N> __device__ __forceinline__ void to_a(FragA<N>& a, const Acc<N>& c) {
#pragma unroll
    for (int j = 0; j < N / 16; j++) {
        a[j][0] = pack(c[2 * j][0], c[2 * j][1]);
        a[j][1] = pack(c[2 * j][2], c[2 * j][3]);
        a[j][2] = pack(c[2 * j + 1][0], c[2 * j + 1][1]);
        a[j][3] = pack(c[2 * j + 1][2], c[2 * j + 1][3]);
    }
}

// ---------------------------------------------------------------------------------------
// Moving tiles.

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

// Writes one warp's [16, D] accumulator, row g times row_scale[0] and row g + 8 times
// row_scale[1], as BF16 rows row0 .. row0 + 15 (those below t) of one head: staged in the
// warp's own rows `stage` of a shared tile, then stored with 16-byte writes.
template <int D>
__device__ __forceinline__ void store_rows(bf16* base, int stride_t, int row0, int t, const Acc<D>& acc,
                                           const float (&row_scale)[2], bf16* stage) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        *reinterpret_cast<uint32_t*>(stage + g * ldh<D>() + 8 * j + c) = pack(acc[j][0] * row_scale[0], acc[j][1] * row_scale[0]);
        *reinterpret_cast<uint32_t*>(stage + (g + 8) * ldh<D>() + 8 * j + c) =
            pack(acc[j][2] * row_scale[1], acc[j][3] * row_scale[1]);
    }
    __syncwarp();
    constexpr int CHUNKS = D / 8;
    for (int i = lane; i < 16 * CHUNKS; i += 32) {
        int r = i / CHUNKS, col = (i % CHUNKS) * 8;
        if (row0 + r < t)
            *reinterpret_cast<uint4*>(base + (size_t)(row0 + r) * stride_t + col) =
                *reinterpret_cast<const uint4*>(stage + r * ldh<D>() + col);
    }
}

// ---------------------------------------------------------------------------------------
// Forward: per query tile, over key tiles 0..tile (causal), the online softmax
// m' = max(m, rowmax(S)), l' = l e^(m - m') + rowsum(e^(S - m')), O' = O e^(m - m') + P V,
// and at the end O / l and lse = m + log(l) (S already times scale). Each lane holds rows
// g and g + 8 of its warp's 16; l is summed per lane and across the lane's quad at the end.
// Shared memory: q, k, v tiles; the q tile (read into registers first) stages the output.

template <int D> __host__ __device__ constexpr int fwd_smem() { return 3 * BR * ldh<D>() * 2; }

template <int D>
__device__ void flash_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int heads, int t,
                          View qk, View vo, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
    Carver cv{smem};
    bf16 *sq = cv.take<bf16>(BR * ldh<D>()), *sk = cv.take<bf16>(BR * ldh<D>()), *sv = cv.take<bf16>(BR * ldh<D>());

    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    const bf16* qb = q + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const bf16* kb = k + (size_t)bi * qk.b + (size_t)hi * qk.h;
    const bf16* vb = v + (size_t)bi * vo.b + (size_t)hi * vo.h;
    int q0 = tile * BR, row0 = q0 + warp * 16;  // the warp's first query
    float sl2 = scale * LOG2E;

    load_tile<D>(sq, qb, qk.t, q0, t);
    __syncthreads();
    FragA<D> qf;
    load_a<D>(qf, sq + warp * 16 * ldh<D>(), ldh<D>());
    Acc<D> acc;
    zero<D>(acc);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * BR;
        __syncthreads();  // the previous key tile is no longer read
        load_tile<D>(sk, kb, qk.t, k0, t);
        load_tile<D>(sv, vb, vo.t, k0, t);
        __syncthreads();
        Acc<BR> s;
        zero<BR>(s);
        mma_tile<D, BR, true>(s, qf, sk, ldh<D>());
        bool edge = kt == tile || k0 + BR > t;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + 8 * j + c + (e & 1), row = row0 + g + 8 * (e >> 1);
                float x = s[j][e] * sl2;
                if (edge && (key > row || key >= t)) x = -INFINITY;
                s[j][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float m_new[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            m_new[i] = fmaxf(m[i], mx[i]);  // finite: key 0 <= row is valid in the first tile
            float alpha = exp2_approx(m[i] - m_new[i]);
            l[i] *= alpha;
            m[i] = m_new[i];
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                acc[j][2 * i] *= alpha;
                acc[j][2 * i + 1] *= alpha;
            }
        }
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2_approx(s[j][e] - m_new[e >> 1]);
                l[e >> 1] += p;
                s[j][e] = p;
            }
        FragA<BR> pf;
        to_a<BR>(pf, s);
        mma_tile<BR, D, false>(acc, pf, sv, ldh<D>());
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        inv[i] = 1.0f / l[i];
        int row = row0 + g + 8 * i;
        if ((lane & 3) == 0 && row < t) lse[(size_t)bh * t + row] = (m[i] + __log2f(l[i])) * LN2;
    }
    bf16* ob = o + (size_t)bi * vo.b + (size_t)hi * vo.h;
    store_rows<D>(ob, vo.t, row0, t, acc, inv, sq + warp * 16 * ldh<D>());
}

// ---------------------------------------------------------------------------------------
// Backward, step 2: per key tile, over query tiles tile..last (causal), with the warp's 16
// keys as rows: Sᵀ = K Qᵀ, Pᵀ, dV += Pᵀ dO, dPᵀ = V dOᵀ, dSᵀ, dK += dSᵀ Q.
// Shared memory: k, v, q, dO tiles; lse (times log2 e; +inf past t, so P = 0 there) and
// delta of the query tile. The q and dO tiles stage dK and dV.

template <int D> __host__ __device__ constexpr int bwd_kv_smem() { return 4 * BR * ldh<D>() * 2 + 2 * BR * 4; }

template <int D>
__device__ void flash_bwd_kv(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,
                             const float* delta, bf16* dk, bf16* dv, int heads, int t, View qk, View vo, View dvv,
                             float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
    Carver cv{smem};
    bf16 *sk = cv.take<bf16>(BR * ldh<D>()), *sv = cv.take<bf16>(BR * ldh<D>());
    bf16 *sq = cv.take<bf16>(BR * ldh<D>()), *sdo = cv.take<bf16>(BR * ldh<D>());
    float *slse = cv.take<float>(BR), *sdelta = cv.take<float>(BR);

    int ntiles = gridDim.x, tile = blockIdx.x;
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    size_t qk_off = (size_t)bi * qk.b + (size_t)hi * qk.h, vo_off = (size_t)bi * vo.b + (size_t)hi * vo.h;
    int k0 = tile * BR, key0 = k0 + warp * 16;  // the warp's first key
    float sl2 = scale * LOG2E;
    load_tile<D>(sk, k + qk_off, qk.t, k0, t);
    load_tile<D>(sv, v + vo_off, vo.t, k0, t);
    Acc<D> dk_acc, dv_acc;
    zero<D>(dk_acc);
    zero<D>(dv_acc);
    for (int qt = tile; qt < ntiles; qt++) {
        int q0 = qt * BR;
        __syncthreads();  // the previous query tile is no longer read
        load_tile<D>(sq, q + qk_off, qk.t, q0, t);
        load_tile<D>(sdo, d_o + vo_off, vo.t, q0, t);
        for (int i = threadIdx.x; i < BR; i += NW * 32) {
            bool in = q0 + i < t;
            slse[i] = in ? lse[(size_t)bh * t + q0 + i] * LOG2E : INFINITY;
            sdelta[i] = in ? delta[(size_t)bh * t + q0 + i] : 0.f;
        }
        __syncthreads();
        FragA<D> af;
        load_a<D>(af, sk + warp * 16 * ldh<D>(), ldh<D>());
        Acc<BR> s;
        zero<BR>(s);
        mma_tile<D, BR, true>(s, af, sq, ldh<D>());  // Sᵀ
        bool diagonal = qt == tile;
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = 8 * j + c + (e & 1), key = key0 + g + 8 * (e >> 1);
                float p = exp2_approx(s[j][e] * sl2 - slse[col]);
                s[j][e] = (diagonal && q0 + col < key) ? 0.f : round_bf16(p);
            }
        FragA<BR> pf;
        to_a<BR>(pf, s);
        mma_tile<BR, D, false>(dv_acc, pf, sdo, ldh<D>());  // dV += Pᵀ dO
        load_a<D>(af, sv + warp * 16 * ldh<D>(), ldh<D>());
        Acc<BR> dp;
        zero<BR>(dp);
        mma_tile<D, BR, true>(dp, af, sdo, ldh<D>());  // dPᵀ = V dOᵀ
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[j][e] = scale * s[j][e] * (dp[j][e] - sdelta[8 * j + c + (e & 1)]);
        to_a<BR>(pf, dp);
        mma_tile<BR, D, false>(dk_acc, pf, sq, ldh<D>());  // dK += dSᵀ Q
    }
    __syncthreads();  // the q and dO tiles become the output staging
    const float one[2] = {1.f, 1.f};
    store_rows<D>(dk + qk_off, qk.t, key0, t, dk_acc, one, sq + warp * 16 * ldh<D>());
    store_rows<D>(dv + (size_t)bi * dvv.b + (size_t)hi * dvv.h, dvv.t, key0, t, dv_acc, one, sdo + warp * 16 * ldh<D>());
}

// ---------------------------------------------------------------------------------------
// Backward, step 3: per query tile, over key tiles 0..tile: S = Q Kᵀ, P, dP = dO Vᵀ, dS,
// dQ += dS K. Shared memory: q, dO, k, v tiles; the q tile (read into registers first)
// stages dQ.

template <int D> __host__ __device__ constexpr int bwd_q_smem() { return 4 * BR * ldh<D>() * 2; }

template <int D>
__device__ void flash_bwd_q(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,
                            const float* delta, bf16* dq, int heads, int t, View qk, View vo, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
    Carver cv{smem};
    bf16 *sq = cv.take<bf16>(BR * ldh<D>()), *sdo = cv.take<bf16>(BR * ldh<D>());
    bf16 *sk = cv.take<bf16>(BR * ldh<D>()), *sv = cv.take<bf16>(BR * ldh<D>());

    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int bh = blockIdx.y, bi = bh / heads, hi = bh % heads;
    size_t qk_off = (size_t)bi * qk.b + (size_t)hi * qk.h, vo_off = (size_t)bi * vo.b + (size_t)hi * vo.h;
    int q0 = tile * BR, row0 = q0 + warp * 16;  // the warp's first query
    float sl2 = scale * LOG2E, lse_row[2], delta_row[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = row0 + g + 8 * i;
        lse_row[i] = row < t ? lse[(size_t)bh * t + row] * LOG2E : INFINITY;
        delta_row[i] = row < t ? delta[(size_t)bh * t + row] : 0.f;
    }
    load_tile<D>(sq, q + qk_off, qk.t, q0, t);
    load_tile<D>(sdo, d_o + vo_off, vo.t, q0, t);
    __syncthreads();
    FragA<D> qf, df;
    load_a<D>(qf, sq + warp * 16 * ldh<D>(), ldh<D>());
    load_a<D>(df, sdo + warp * 16 * ldh<D>(), ldh<D>());
    Acc<D> dq_acc;
    zero<D>(dq_acc);
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * BR;
        __syncthreads();  // the previous key tile is no longer read
        load_tile<D>(sk, k + qk_off, qk.t, k0, t);
        load_tile<D>(sv, v + vo_off, vo.t, k0, t);
        __syncthreads();
        Acc<BR> s, dp;
        zero<BR>(s);
        zero<BR>(dp);
        mma_tile<D, BR, true>(s, qf, sk, ldh<D>());   // S
        mma_tile<D, BR, true>(dp, df, sv, ldh<D>());  // dP = dO Vᵀ
        bool edge = kt == tile || k0 + BR > t;
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + 8 * j + c + (e & 1), row = row0 + g + 8 * (e >> 1);
                float p = round_bf16(exp2_approx(s[j][e] * sl2 - lse_row[e >> 1]));
                if (edge && (key > row || key >= t)) p = 0.f;
                dp[j][e] = scale * p * (dp[j][e] - delta_row[e >> 1]);
            }
        FragA<BR> dsf;
        to_a<BR>(dsf, dp);
        mma_tile<BR, D, false>(dq_acc, dsf, sk, ldh<D>());  // dQ += dS K
    }
    const float one[2] = {1.f, 1.f};
    store_rows<D>(dq + qk_off, qk.t, row0, t, dq_acc, one, sq + warp * 16 * ldh<D>());
}

// ---------------------------------------------------------------------------------------
// Entry points: flash_<pass>_d<D>_bf16. Shared memory sizes (bytes) and the delta pass's
// rows per block must match the host's (crates/model/src/fused_sizes.rs).

#define FLASH_ENTRY(D)                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_fwd_d##D##_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int heads, int t, \
                              int qk_b, int qk_h, int qk_t, int vo_b, int vo_h, int vo_t, float scale) {          \
        flash_fwd<D>(q, k, v, o, lse, heads, t, View{qk_b, qk_h, qk_t}, View{vo_b, vo_h, vo_t}, scale);           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_bwd_delta_d##D##_bf16(const bf16* o, const bf16* d_o, float* delta, int heads, int t, int rows,    \
                                    int vo_b, int vo_h, int vo_t) {                                                \
        flash_bwd_delta<bf16, D, NW * 32>(o, d_o, delta, heads, t, rows, View{vo_b, vo_h, vo_t});                 \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                         \
        flash_bwd_kv_d##D##_bf16(const bf16* q, const bf16* k, const bf16* v, const bf16* d_o, const float* lse,  \
                                 const float* delta, bf16* dk, bf16* dv, int heads, int t, int qk_b, int qk_h,    \
                                 int qk_t, int vo_b, int vo_h, int vo_t, int dv_b, int dv_h, int dv_t,            \
                                 float scale) {                                                                    \
        flash_bwd_kv<D>(q, k, v, d_o, lse, delta, dk, dv, heads, t, View{qk_b, qk_h, qk_t},                       \
                        View{vo_b, vo_h, vo_t}, View{dv_b, dv_h, dv_t}, scale);                                   \
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
