// Embedding lookup and its backward without atomics.
// Rust twin: crates/model/src/fused/embedding.rs (forward, backward); CPU reference: candle's
// embedding (index_select) in crates/model/src/llama.rs.

#pragma once
#include "common.cuh"

// Embedding: y[r, :] = w[ids[r], :]. Backward without atomics: the host sorts the rows by
// token id; block u sums dy over the rows order[offsets[u] .. offsets[u+1]) into
// dw[ids_unique[u], :], in a fixed order: warp w sums the rows w, w + WARPS, ... of the
// token's list, in that order, and the WARPS sums are added in warp order. (A token may
// have thousands of rows in a batch; one sequence of dependent loads per column made the
// most frequent tokens' blocks the whole pass's length.) Rows of dw of absent tokens stay
// as given (zeros).

template <typename T>
__device__ void embedding_fwd(const T* w, const uint32_t* ids, T* y, int rows, int h) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * h) return;
    size_t r = idx / h;
    y[idx] = w[(size_t)ids[r] * h + idx % h];
}

// Columns per lane in one chunk of the embedding backward: a chunk of 1024 columns covers
// every preset's width at once (the partials: WARPS x 1024 floats, 32 KiB).
#define EMB_COLS 32

template <typename T>
__device__ void embedding_bwd(const T* dy, const uint32_t* order, const uint32_t* offsets, const uint32_t* unique, T* dw, int h) {
    __shared__ float part[WARPS][32 * EMB_COLS];
    int u = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t a = offsets[u], b = offsets[u + 1];
    size_t dst = (size_t)unique[u] * h;
    for (int c0 = 0; c0 < h; c0 += 32 * EMB_COLS) {
        float s[EMB_COLS];
#pragma unroll
        for (int i = 0; i < EMB_COLS; i++) s[i] = 0.f;
        // the warp's rows 32 at a time: their positions loaded at once (one per lane), then
        // broadcast; several rows' loads in flight
        for (uint32_t k0 = a + warp; k0 < b; k0 += 32 * WARPS) {
            uint32_t kl = k0 + WARPS * lane, n = min(32u, (b - k0 + WARPS - 1) / WARPS);
            uint32_t pos = kl < b ? order[kl] : 0u;
#pragma unroll 4
            for (uint32_t m = 0; m < n; m++) {
                const T* r = dy + (size_t)__shfl_sync(0xffffffffu, pos, m) * h;
#pragma unroll
                for (int i = 0; i < EMB_COLS; i++) {
                    int c = c0 + lane + 32 * i;
                    if (c < h) s[i] += to_f(r[c]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < EMB_COLS; i++) part[warp][lane + 32 * i] = s[i];
        __syncthreads();
        for (int j = threadIdx.x; j < 32 * EMB_COLS && c0 + j < h; j += blockDim.x) {
            float t = part[0][j];
            for (int w = 1; w < WARPS; w++) t += part[w][j];
            dw[dst + c0 + j] = from_f<T>(t);
        }
        __syncthreads();  // part is read before the next chunk overwrites it
    }
}

// extern "C" entry points: embedding_fwd_<dtype>, embedding_bwd_<dtype>.
#define EMBEDDING_ENTRIES(T, S)                                                                                  \
    extern "C" __global__ void embedding_fwd_##S(const T* w, const uint32_t* ids, T* y, int rows, int h) {      \
        embedding_fwd<T>(w, ids, y, rows, h);                                                                    \
    }                                                                                                            \
    extern "C" __global__ void embedding_bwd_##S(const T* dy, const uint32_t* order, const uint32_t* offsets,   \
                                                 const uint32_t* unique, T* dw, int h) {                         \
        embedding_bwd<T>(dy, order, offsets, unique, dw, h);                                                     \
    }
EMBEDDING_ENTRIES(bf16, bf16)
EMBEDDING_ENTRIES(float, f32)
