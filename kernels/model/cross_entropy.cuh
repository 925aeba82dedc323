// Cross-entropy per row of logits, forward and backward.
// Rust twin: crates/model/src/fused/lm_head.rs (loss, loss_and_grads); CPU reference: the
// composed log-softmax + gather of crates/model/src/loss.rs.

#pragma once
#include "common.cuh"

// Cross-entropy per row of logits x [N, V] with row stride ld >= V (one block of 256
// threads per row):
// nll[r] = w[r] * (logsumexp(x_r) - x_r[target_r]), 0 where w[r] == 0.
// Backward: dx_r = coef[r] * (softmax(x_r) - onehot(target_r)), coef = w * upstream gradient;
// the padding columns [V, ld) of dx are set to 0.
// The row's max and sum of exponentials in one pass (the online softmax of Milakov &
// Gimelshein 2018: each thread keeps (max, sum) and rescales its sum when the max grows),
// VEC elements per access (VEC = 8: 16-byte loads; the host takes 1 where ld or the buffers
// are not 16-byte aligned).

// (m, s) combined with (m2, s2): the max and the sum rescaled to it (an empty side has
// m = -inf, s = 0).
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.f : s * __expf(m - mx)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mx));
    m = mx;
}

// The row's max and sum of exponentials; with `stage` (shared memory, v elements) each element
// read is also kept there, so that a second pass over the row reads the block's copy.
template <typename T, int VEC>
__device__ void row_max_sum(const T* xr, int v, float* smem, float* m_out, float* s_out, T* stage = nullptr) {
    float m = -INFINITY, s = 0.f;
    int full = v / VEC * VEC;
#pragma unroll 4
    for (int j = threadIdx.x * VEC; j < full; j += blockDim.x * VEC) {
        float x[VEC];
        load_vec<T, VEC>(xr + j, x);
        if (stage) store_vec<T, VEC>(stage + j, x);  // T -> FP32 -> T is exact
        float cm = x[0];
#pragma unroll
        for (int k = 1; k < VEC; k++) cm = fmaxf(cm, x[k]);
        if (cm > m) {
            s = m == -INFINITY ? 0.f : s * __expf(m - cm);
            m = cm;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) s += __expf(x[k] - m);
    }
    for (int j = full + threadIdx.x; j < v; j += blockDim.x) {
        if (stage) stage[j] = xr[j];
        combine(m, s, to_f(xr[j]), 1.f);
    }
    for (int o = 16; o > 0; o >>= 1) combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // smem may still be read by a previous reduction
    if (lane == 0) {
        smem[warp] = m;
        smem[WARPS + warp] = s;
    }
    __syncthreads();
    m = smem[0];
    s = smem[WARPS];
    for (int w = 1; w < WARPS; w++) combine(m, s, smem[w], smem[WARPS + w]);
    *m_out = m;
    *s_out = s;
}

template <typename T, int VEC>
__device__ void cross_entropy_fwd(const T* x, const uint32_t* target, const float* w, float* nll, int v, int ld) {
    __shared__ float smem[2 * WARPS];
    int row = blockIdx.x;
    if (w[row] == 0.f) {
        if (threadIdx.x == 0) nll[row] = 0.f;
        return;
    }
    const T* xr = x + (size_t)row * ld;
    float m, s;
    row_max_sum<T, VEC>(xr, v, smem, &m, &s);
    if (threadIdx.x == 0) nll[row] = w[row] * (m + logf(s) - to_f(xr[target[row]]));
}

// dx = coef * (softmax(x) - onehot(target)) per row (dx may be x: in place); when `nll` is
// not null also nll[row] = coef * (logsumexp(x) - x[target]), as cross_entropy_fwd with w = coef.
// STAGED: the row is kept in dynamic shared memory (v elements of T) by the max/sum pass and
// the gradient pass reads that copy: one read and one write of the row in global memory where
// the unstaged kernel reads it twice. Each thread sees the same elements in the same order
// either way, so both give the same bits.
template <typename T, int VEC, bool STAGED>
__device__ void cross_entropy_bwd(const T* x, const uint32_t* target, const float* coef, T* dx, float* nll, int v,
                                  int ld) {
    __shared__ float smem[2 * WARPS];
    extern __shared__ __align__(16) unsigned char staged_row[];
    int row = blockIdx.x;
    const T* xr = x + (size_t)row * ld;
    T* stage = STAGED ? reinterpret_cast<T*>(staged_row) : nullptr;
    T* dr = dx + (size_t)row * ld;
    float c = coef[row];
    for (int j = v + threadIdx.x; j < ld; j += blockDim.x) dr[j] = from_f<T>(0.f);  // padding
    if (c == 0.f) {
        for (int j = threadIdx.x; j < v; j += blockDim.x) dr[j] = from_f<T>(0.f);
        if (nll && threadIdx.x == 0) nll[row] = 0.f;
        return;
    }
    float m, s;
    row_max_sum<T, VEC>(xr, v, smem, &m, &s, stage);  // its barriers complete the copy
    const T* src = STAGED ? stage : xr;
    float scale = c / s;
    int tg = (int)target[row];
    float xt = to_f(src[tg]);
    __syncthreads();  // x[target] is read before any thread overwrites it
    if (nll && threadIdx.x == 0) nll[row] = c * (m + logf(s) - xt);
    int full = v / VEC * VEC;
#pragma unroll 4
    for (int j = threadIdx.x * VEC; j < full; j += blockDim.x * VEC) {
        float e[VEC];
        load_vec<T, VEC>(src + j, e);
#pragma unroll
        for (int k = 0; k < VEC; k++) e[k] = __expf(e[k] - m) * scale - (j + k == tg ? c : 0.f);
        store_vec<T, VEC>(dr + j, e);
    }
    for (int j = full + threadIdx.x; j < v; j += blockDim.x)
        dr[j] = from_f<T>(__expf(to_f(src[j]) - m) * scale - (j == tg ? c : 0.f));
}

// extern "C" entry points: cross_entropy_fwd<V>_<dtype>, cross_entropy_bwd<V>_<dtype>,
// cross_entropy_bwd_staged<V>_<dtype> (v * sizeof(T) bytes of dynamic shared memory).
#define CROSS_ENTROPY_ENTRIES(T, S, V)                                                                           \
    extern "C" __global__ void cross_entropy_fwd##V##_##S(const T* x, const uint32_t* target, const float* w,   \
                                                          float* nll, int v, int ld) {                           \
        cross_entropy_fwd<T, V>(x, target, w, nll, v, ld);                                                       \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_bwd##V##_##S(const T* x, const uint32_t* target, const float* coef, \
                                                          T* dx, float* nll, int v, int ld) {                    \
        cross_entropy_bwd<T, V, false>(x, target, coef, dx, nll, v, ld);                                         \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_bwd_staged##V##_##S(const T* x, const uint32_t* target,            \
                                                                 const float* coef, T* dx, float* nll, int v,    \
                                                                 int ld) {                                       \
        cross_entropy_bwd<T, V, true>(x, target, coef, dx, nll, v, ld);                                          \
    }
CROSS_ENTROPY_ENTRIES(bf16, bf16, 1)
CROSS_ENTROPY_ENTRIES(bf16, bf16, 8)
CROSS_ENTROPY_ENTRIES(float, f32, 1)
CROSS_ENTROPY_ENTRIES(float, f32, 8)
