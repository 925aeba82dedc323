// RMSNorm forward and backward, and the gain gradient's column sum.
// Rust twin: crates/model/src/fused/norm.rs (forward, backward); CPU reference: the composed
// RMSNorm of crates/model/src/norm.rs.

#pragma once
#include "common.cuh"

// RMSNorm (HF LlamaRMSNorm): n = round_T(x * inv), inv = 1 / sqrt(mean(x^2) + eps),
// y = round_T(n * w). Backward treats the rounding of n as the identity: with dn = dy * w,
// dx = inv * (dn - n * sum(dn * n) / H) = inv * dn - n * inv^2 * sum(dn * x) / H,
// dw = sum over rows of dy * n.
// One warp per row. Forward: lane l takes the row's chunks of V elements starting at
// V (l + 32 i) (V = 8: 16-byte accesses, H a multiple of 8 and every buffer 16-byte aligned;
// else V = 1), reading the row once for its sums and once more (from cache) for its outputs.

// The residual stream's add fused in front of the norm: with `delta`, s = round_T(x + delta)
// (what the separate add gives) is written to `sum` and normalised; without, x is.
template <typename T, int V>
__device__ void rmsnorm_fwd(const T* x, const T* delta, const T* w, T* sum, T* y, int rows, int h, float eps) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    size_t o = (size_t)row * h;
    float ss = 0.f;
    for (int c = lane * V; c < h; c += 32 * V) {
        float a[V];
        load_vec<T, V>(x + o + c, a);
        if (delta) {
            float d[V];
            load_vec<T, V>(delta + o + c, d);
#pragma unroll
            for (int j = 0; j < V; j++) a[j] = round_to<T>(a[j] + d[j]);
            store_vec<T, V>(sum + o + c, a);
        }
#pragma unroll
        for (int j = 0; j < V; j++) ss += a[j] * a[j];
    }
    const T* src = delta ? sum + o : x + o;  // the sums: this lane's own writes
    float inv = 1.0f / sqrtf(warp_sum(ss) / (float)h + eps);
    for (int c = lane * V; c < h; c += 32 * V) {
        float a[V], g[V];
        load_vec<T, V>(src + c, a);
        load_vec<T, V>(w + c, g);
#pragma unroll
        for (int j = 0; j < V; j++) a[j] = round_to<T>(a[j] * inv) * g[j];
        store_vec<T, V>(y + o + c, a);
    }
}

// Elements c..c+7 of a row into WORDS 16-byte registers (1 for BF16, 2 for FP32): with `vec`,
// 16-byte loads (h a multiple of 8, 16-byte aligned; a chunk past the row's end loads the
// row's first chunk, which the caller masks), else element by element with zeros past h.
template <typename T, int WORDS>
__device__ __forceinline__ void load_chunk(const T* row, int c, int h, bool vec, uint4 (&out)[WORDS]) {
    if (vec) {
        const uint4* p = reinterpret_cast<const uint4*>(row + (c < h ? c : 0));
#pragma unroll
        for (int q = 0; q < WORDS; q++) out[q] = p[q];
    } else {
        T* e = reinterpret_cast<T*>(out);
#pragma unroll
        for (int j = 0; j < 8; j++) e[j] = c + j < h ? row[c + j] : from_f<T>(0.f);
    }
}

// Chunk c..c+7 of the gain as FP32: from the lane's registers `wr` (IN_REGISTERS) or memory.
template <typename T, int WORDS, bool IN_REGISTERS>
__device__ __forceinline__ void load_gain(const T* w, const uint4 (&wr)[WORDS], int c, int h, bool vec, float* out) {
    if (IN_REGISTERS) {
        load_vec<T, 8>(reinterpret_cast<const T*>(wr), out);
    } else {
        uint4 r[WORDS];
        load_chunk<T, WORDS>(w, c, h, vec, r);
        load_vec<T, 8>(reinterpret_cast<const T*>(r), out);
    }
}

// Both gradients in one pass over x and dy. dx rounded to T; with `d_residual` (the gradient
// the residual stream brings past the norm) also added and rounded again, as the separate
// add does. The gain gradient as partial sums: block b takes rows [b * rows_per_block, ...),
// warp w of it every WARPS-th row; each lane sums dy * n of its columns over its warp's rows
// in registers, in row order; partial[b, :] = the warps' sums added in warp order (through
// shared memory, WARPS * h floats), and `colsum` adds the partials.
// Lane l takes the row's chunks of 8 elements from column 8 (l + 32 k), k < CH = ceil(h /
// 256) (1 to 6 for h up to FUSED_MAX_HIDDEN = 1536): a lane issues the loads of its whole
// share of the row (x, dy, the residual gradient) at once and keeps them in registers as T,
// so each input is read from memory once and the second pass waits for nothing; the gain too
// where that share is small (CH * sizeof(T) <= 6; else it is read per row, from L1). `vec`:
// see `load_chunk`. Elements past h count as zeros. (Its speed against reading twice:
// bench/training_h200.md, "Measurements behind choices in the code".)
// (dx is a buffer of its own: no input aliases it, which lets a lane's loads run ahead of
// its stores)
// The widest row the backward's chunk kernels cover (CH = 6 chunks of 8 per lane; the Rust
// side's kernels.rs FUSED_MAX_HIDDEN, whose test reads this).
#define FUSED_MAX_HIDDEN 1536
#define NORM_LANE_ELEMENTS 8  // elements per lane per chunk (fused_sizes.rs NORM_CHUNK = 32 x this)
static_assert(FUSED_MAX_HIDDEN == 6 * NORM_LANE_ELEMENTS * 32, "NORM_BWD below instantiates CH = 1..6");
template <typename T, int CH>
__device__ void rmsnorm_bwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ dy,
                            const T* __restrict__ d_residual, T* __restrict__ dx, float* partial, int rows, int h,
                            float eps, int rows_per_block, bool vec) {
    constexpr int V = NORM_LANE_ELEMENTS, WORDS = V * sizeof(T) / 16;
    constexpr bool W_IN_REGISTERS = CH * sizeof(T) <= 6;
    extern __shared__ float acc[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float dw[CH][V];
    uint4 wr[CH][WORDS];
#pragma unroll
    for (int k = 0; k < CH; k++) {
        if (W_IN_REGISTERS) load_chunk<T, WORDS>(w, (k * 32 + lane) * V, h, vec, wr[k]);
#pragma unroll
        for (int j = 0; j < V; j++) dw[k][j] = 0.f;
    }
    int r0 = blockIdx.x * rows_per_block, r1 = min(rows, r0 + rows_per_block);
    for (int row = r0 + warp; row < r1; row += WARPS) {
        size_t o = (size_t)row * h;
        uint4 xr[CH][WORDS], gr[CH][WORDS], rr[CH][WORDS];
#pragma unroll
        for (int k = 0; k < CH; k++) {
            const int c = (k * 32 + lane) * V;
            load_chunk<T, WORDS>(x + o, c, h, vec, xr[k]);
            load_chunk<T, WORDS>(dy + o, c, h, vec, gr[k]);
            if (d_residual) load_chunk<T, WORDS>(d_residual + o, c, h, vec, rr[k]);
        }
        float ss = 0.f, dot = 0.f;
#pragma unroll
        for (int k = 0; k < CH; k++) {
            const int c = (k * 32 + lane) * V;
            float a[V], g[V], wv[V];
            load_vec<T, V>(reinterpret_cast<const T*>(xr[k]), a);
            load_vec<T, V>(reinterpret_cast<const T*>(gr[k]), g);
            load_gain<T, WORDS, W_IN_REGISTERS>(w, wr[k], c, h, vec, wv);
#pragma unroll
            for (int j = 0; j < V; j++) {
                const float xa = c + j < h ? a[j] : 0.f, ga = c + j < h ? g[j] * wv[j] : 0.f;
                ss += xa * xa;
                dot += ga * xa;
            }
        }
        float inv = 1.0f / sqrtf(warp_sum(ss) / (float)h + eps);
        dot = warp_sum(dot) * inv / (float)h;  // sum(dn * n) / H
#pragma unroll
        for (int k = 0; k < CH; k++) {
            const int c = (k * 32 + lane) * V;
            if (c >= h) continue;
            float a[V], g[V], wv[V], r[V], out[V];
            load_vec<T, V>(reinterpret_cast<const T*>(xr[k]), a);
            load_vec<T, V>(reinterpret_cast<const T*>(gr[k]), g);
            load_gain<T, WORDS, W_IN_REGISTERS>(w, wr[k], c, h, vec, wv);
            if (d_residual) load_vec<T, V>(reinterpret_cast<const T*>(rr[k]), r);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float n = a[j] * inv;
                out[j] = round_to<T>(inv * (g[j] * wv[j] - n * dot));
                if (d_residual) out[j] += r[j];
                dw[k][j] += g[j] * round_to<T>(n);
            }
            if (vec) {
                store_vec<T, V>(dx + o + c, out);
            } else {
#pragma unroll
                for (int j = 0; j < V; j++)
                    if (c + j < h) dx[o + c + j] = from_f<T>(out[j]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < CH; k++) {
        const int c = (k * 32 + lane) * V;
#pragma unroll
        for (int j = 0; j < V; j++)
            if (c + j < h) acc[warp * h + c + j] = dw[k][j];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < WARPS; k++) s += acc[k * h + c];
        partial[(size_t)blockIdx.x * h + c] = s;
    }
}

// out[c] = sum_r partial[r, c] over r in 0..rows, in a fixed order: a block takes 32
// columns (lane = column, coalesced rows); warp w sums the rows r = w (mod WARPS) in order,
// then the warps' sums are added in warp order.
template <typename T>
__device__ void colsum(const float* partial, T* out, int rows, int h) {
    __shared__ float part[WARPS][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = blockIdx.x * 32 + lane;
    float s = 0.f;
    if (c < h)
        for (int r = warp; r < rows; r += WARPS) s += partial[(size_t)r * h + c];
    part[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c < h) {
        float total = part[0][lane];
        for (int w = 1; w < WARPS; w++) total += part[w][lane];
        out[c] = from_f<T>(total);
    }
}

// extern "C" entry points: rmsnorm_fwd<V>_<dtype> (V elements per thread), colsum_<dtype>,
// rmsnorm_bwd_c<CH>_<dtype>: the backward for rows of CH chunks of 8 per lane (h up to 256 CH);
// two blocks per SM (at most 128 registers a thread) where CH * sizeof(T) <= 8 (BF16 rows up
// to 1024 wide, FP32 up to 512): faster there (bench/training_h200.md, "Measurements behind choices in the code");
// wider rows need more registers.
#define NORM_BWD(T, S, CH)                                                                                         \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, CH * sizeof(T) <= 8 ? 2 : 1)                                 \
        rmsnorm_bwd_c##CH##_##S(const T* x, const T* w, const T* dy, const T* d_residual, T* dx, float* partial,   \
                                int rows, int h, float eps, int rows_per_block, int vec) {                         \
        rmsnorm_bwd<T, CH>(x, w, dy, d_residual, dx, partial, rows, h, eps, rows_per_block, vec != 0);             \
    }
#define NORM_FWD(T, S, V)                                                                                        \
    extern "C" __global__ void rmsnorm_fwd##V##_##S(const T* x, const T* delta, const T* w, T* sum, T* y,       \
                                                    int rows, int h, float eps) {                                \
        rmsnorm_fwd<T, V>(x, delta, w, sum, y, rows, h, eps);                                                    \
    }
#define NORM_ENTRIES(T, S)                                                                                       \
    NORM_FWD(T, S, 1)                                                                                            \
    NORM_FWD(T, S, 8)                                                                                            \
    extern "C" __global__ void colsum_##S(const float* partial, T* out, int rows, int h) {                      \
        colsum<T>(partial, out, rows, h);                                                                        \
    }                                                                                                            \
    NORM_BWD(T, S, 1)                                                                                            \
    NORM_BWD(T, S, 2)                                                                                            \
    NORM_BWD(T, S, 3)                                                                                            \
    NORM_BWD(T, S, 4)                                                                                            \
    NORM_BWD(T, S, 5)                                                                                            \
    NORM_BWD(T, S, 6)
NORM_ENTRIES(bf16, bf16)
NORM_ENTRIES(float, f32)
