// Fused forward and backward kernels of the LLaMA model's ops (crates/model/src/fused/).
// Every kernel exists for BF16 (`_bf16`) and FP32 (`_f32`) tensors; arithmetic is FP32,
// each output is rounded once to the tensor's dtype. Reductions run in a fixed order (no
// atomics), so results are the same run to run.
//
// Shapes (row-major, contiguous): N rows of width H (RMSNorm, SwiGLU: any N x H), attention
// [B, heads, T, T] scores, cross-entropy [N, V] logits.

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
// x rounded to T's precision, as FP32.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f(from_f<T>(x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum or max for blockDim.x == 256 (8 warps); every thread gets the result.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* smem) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // smem may still be read by a previous reduction
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float r = smem[0];
    for (int w = 1; w < 8; w++) r = MAX ? fmaxf(r, smem[w]) : r + smem[w];
    return r;
}

#define WARPS 8  // warps per block of the row kernels (blockDim.x = 256)

// 1 / sqrt(mean(x^2) + eps) of one row, computed by one warp.
template <typename T>
__device__ __forceinline__ float row_inv_rms(const T* x, int h, float eps) {
    float ss = 0.f;
    for (int c = threadIdx.x & 31; c < h; c += 32) {
        float v = to_f(x[c]);
        ss += v * v;
    }
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)h + eps);
}

// ---------------------------------------------------------------------------------------
// RMSNorm (HF LlamaRMSNorm): n = round_T(x * inv_rms(x)), y = round_T(n * w).
// Backward treats the rounding of n as the identity: with dn = dy * w,
// dx = inv * (dn - n * sum(dn * n) / H), dw = sum over rows of dy * n.

template <typename T>
__device__ void rmsnorm_fwd(const T* x, const T* w, T* y, int rows, int h, float eps) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const T* xr = x + (size_t)row * h;
    T* yr = y + (size_t)row * h;
    float inv = row_inv_rms(xr, h, eps);
    for (int c = threadIdx.x & 31; c < h; c += 32) yr[c] = from_f<T>(round_to<T>(to_f(xr[c]) * inv) * to_f(w[c]));
}

template <typename T>
__device__ void rmsnorm_bwd_x(const T* x, const T* w, const T* dy, T* dx, int rows, int h, float eps) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    size_t o = (size_t)row * h;
    float inv = row_inv_rms(x + o, h, eps);
    float dot = 0.f;
    for (int c = threadIdx.x & 31; c < h; c += 32) dot += to_f(dy[o + c]) * to_f(w[c]) * to_f(x[o + c]) * inv;
    dot = warp_sum(dot) / (float)h;
    for (int c = threadIdx.x & 31; c < h; c += 32) {
        float n = to_f(x[o + c]) * inv;
        dx[o + c] = from_f<T>(inv * (to_f(dy[o + c]) * to_f(w[c]) - n * dot));
    }
}

// Partial gain gradients: block b sums rows [b * rows_per_block, ...) into partial[b, :] (FP32);
// `colsum` adds the partials. Shared memory: WARPS * h floats.
template <typename T>
__device__ void rmsnorm_bwd_w(const T* x, const T* dy, float* partial, int rows, int h, float eps, int rows_per_block) {
    extern __shared__ float acc[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = threadIdx.x; c < WARPS * h; c += blockDim.x) acc[c] = 0.f;
    __syncthreads();
    int r0 = blockIdx.x * rows_per_block, r1 = min(rows, r0 + rows_per_block);
    for (int row = r0 + warp; row < r1; row += WARPS) {
        size_t o = (size_t)row * h;
        float inv = row_inv_rms(x + o, h, eps);
        for (int c = lane; c < h; c += 32) acc[warp * h + c] += to_f(dy[o + c]) * round_to<T>(to_f(x[o + c]) * inv);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < WARPS; k++) s += acc[k * h + c];
        partial[(size_t)blockIdx.x * h + c] = s;
    }
}

// out[c] = sum_r partial[r, c] for r in 0..rows, in order.
template <typename T>
__device__ void colsum(const float* partial, T* out, int rows, int h) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= h) return;
    float s = 0.f;
    for (int r = 0; r < rows; r++) s += partial[(size_t)r * h + c];
    out[c] = from_f<T>(s);
}

// ---------------------------------------------------------------------------------------
// RoPE, HF rotate_half convention, fused with the head transpose:
// x [B, T, n, d] (a projection's output) -> y [B, n, T, d],
// y_i = x_i cos_i + r_i sin_i with r_i = -x_{i+d/2} (i < d/2), x_{i-d/2} (i >= d/2);
// cos/sin: FP32 tables [>= T, d] (row t = position t).
// Backward: dy [B, n, T, d] -> dx [B, T, n, d],
// dx_j = dy_j cos_j + (j < d/2 ? dy_{j+d/2} sin_{j+d/2} : -dy_{j-d/2} sin_{j-d/2}).

template <typename T>
__device__ void rope_fwd(const T* x, const float* cos, const float* sin, T* y, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int i = idx % d;
    size_t r = idx / d;
    int p = r % t;
    r /= t;
    int head = r % n;
    size_t bi = r / n;
    const T* xr = x + ((bi * t + p) * n + head) * d;
    int half = d / 2;
    float rot = i < half ? -to_f(xr[i + half]) : to_f(xr[i - half]);
    y[idx] = from_f<T>(to_f(xr[i]) * cos[(size_t)p * d + i] + rot * sin[(size_t)p * d + i]);
}

template <typename T>
__device__ void rope_bwd(const T* dy, const float* cos, const float* sin, T* dx, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int j = idx % d;
    size_t r = idx / d;
    int head = r % n;
    r /= n;
    int p = r % t;
    size_t bi = r / t;
    const T* g = dy + ((bi * n + head) * t + p) * d;
    const float* c = cos + (size_t)p * d;
    const float* s = sin + (size_t)p * d;
    int half = d / 2;
    float other = j < half ? to_f(g[j + half]) * s[j + half] : -to_f(g[j - half]) * s[j - half];
    dx[idx] = from_f<T>(to_f(g[j]) * c[j] + other);
}

// Head layouts: split [B, T, n, d] -> [B, n, T, d]; merge is the inverse. One thread per
// output element.
template <typename T>
__device__ void split_heads(const T* x, T* y, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int i = idx % d;
    size_t r = idx / d;
    int p = r % t;
    r /= t;
    int head = r % n;
    size_t bi = r / n;
    y[idx] = x[((bi * t + p) * n + head) * d + i];
}

template <typename T>
__device__ void merge_heads(const T* x, T* y, int b, int t, int n, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * d) return;
    int i = idx % d;
    size_t r = idx / d;
    int head = r % n;
    r /= n;
    int p = r % t;
    size_t bi = r / t;
    y[idx] = x[((bi * n + head) * t + p) * d + i];
}

// ---------------------------------------------------------------------------------------
// Causal softmax of attention scores: s [rows = B*heads*T, T] FP32 (q.k, unscaled),
// p = softmax(scale * s) over columns j <= i (i = row % T), 0 above the diagonal.
// Backward: ds = scale * p * (dp - sum_j p_j dp_j), dp FP32.

template <typename T>
__device__ void causal_softmax_fwd(const float* s, T* p, int rows, int t, float scale) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31, last = row % t;
    const float* sr = s + (size_t)row * t;
    T* pr = p + (size_t)row * t;
    float m = -INFINITY;
    for (int j = lane; j <= last; j += 32) m = fmaxf(m, sr[j] * scale);
    m = warp_max(m);
    float sum = 0.f;
    for (int j = lane; j <= last; j += 32) sum += expf(sr[j] * scale - m);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < t; j += 32) pr[j] = from_f<T>(j <= last ? expf(sr[j] * scale - m) * inv : 0.f);
}

template <typename T>
__device__ void causal_softmax_bwd(const T* p, const float* dp, T* ds, int rows, int t, float scale) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31, last = row % t;
    size_t o = (size_t)row * t;
    float dot = 0.f;
    for (int j = lane; j <= last; j += 32) dot += to_f(p[o + j]) * dp[o + j];
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32) ds[o + j] = from_f<T>(j <= last ? scale * to_f(p[o + j]) * (dp[o + j] - dot) : 0.f);
}

// ---------------------------------------------------------------------------------------
// SwiGLU: h = silu(g) * u. Backward: dg = dh * u * sig(g) * (1 + g * (1 - sig(g))),
// du = dh * silu(g).
//
// Packed gate/up: gu [rows, 2 * w] holds g in columns [0, w) and u in [w, 2w) (one matrix
// product for both projections). h [rows, w] = silu(g) * u; the backward writes dg and du
// into dgu [rows, 2 * w] in the same layout.
template <typename T>
__device__ void swiglu_packed_fwd(const T* gu, T* h, size_t rows, int w) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    float x = to_f(gu[r * 2 * w + c]);
    h[i] = from_f<T>(x / (1.0f + expf(-x)) * to_f(gu[r * 2 * w + w + c]));
}

template <typename T>
__device__ void swiglu_packed_bwd(const T* gu, const T* dh, T* dgu, size_t rows, int w) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    size_t gi = r * 2 * w + c;
    float x = to_f(gu[gi]), u = to_f(gu[gi + w]), d = to_f(dh[i]);
    float sg = 1.0f / (1.0f + expf(-x));
    dgu[gi] = from_f<T>(d * u * sg * (1.0f + x * (1.0f - sg)));
    dgu[gi + w] = from_f<T>(d * x * sg);
}

// ---------------------------------------------------------------------------------------
// Cross-entropy per row of logits x [N, V] with row stride ld >= V (one block of 256
// threads per row):
// nll[r] = w[r] * (logsumexp(x_r) - x_r[target_r]), 0 where w[r] == 0.
// Backward: dx_r = coef[r] * (softmax(x_r) - onehot(target_r)), coef = w * upstream gradient;
// the padding columns [V, ld) of dx are set to 0.

template <typename T>
__device__ void row_max_sum(const T* xr, int v, float* smem, float* m_out, float* s_out) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, to_f(xr[j]));
    m = block_reduce<true>(m, smem);
    float s = 0.f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(to_f(xr[j]) - m);
    *s_out = block_reduce<false>(s, smem);
    *m_out = m;
}

template <typename T>
__device__ void cross_entropy_fwd(const T* x, const uint32_t* target, const float* w, float* nll, int v, int ld) {
    __shared__ float smem[WARPS];
    int row = blockIdx.x;
    if (w[row] == 0.f) {
        if (threadIdx.x == 0) nll[row] = 0.f;
        return;
    }
    const T* xr = x + (size_t)row * ld;
    float m, s;
    row_max_sum(xr, v, smem, &m, &s);
    if (threadIdx.x == 0) nll[row] = w[row] * (m + logf(s) - to_f(xr[target[row]]));
}

// dx = coef * (softmax(x) - onehot(target)) per row (dx may be x: in place); when `nll` is
// not null also nll[row] = coef * (logsumexp(x) - x[target]), as cross_entropy_fwd with w = coef.
template <typename T>
__device__ void cross_entropy_bwd(const T* x, const uint32_t* target, const float* coef, T* dx, float* nll, int v,
                                  int ld) {
    __shared__ float smem[WARPS];
    int row = blockIdx.x;
    const T* xr = x + (size_t)row * ld;
    T* dr = dx + (size_t)row * ld;
    float c = coef[row];
    for (int j = v + threadIdx.x; j < ld; j += blockDim.x) dr[j] = from_f<T>(0.f);  // padding
    if (c == 0.f) {
        for (int j = threadIdx.x; j < v; j += blockDim.x) dr[j] = from_f<T>(0.f);
        if (nll && threadIdx.x == 0) nll[row] = 0.f;
        return;
    }
    float m, s;
    row_max_sum(xr, v, smem, &m, &s);
    float scale = c / s;
    uint32_t tg = target[row];
    float xt = to_f(xr[tg]);
    __syncthreads();  // x[target] is read before any thread overwrites it
    if (nll && threadIdx.x == 0) nll[row] = c * (m + logf(s) - xt);
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        dr[j] = from_f<T>(expf(to_f(xr[j]) - m) * scale - (j == (int)tg ? c : 0.f));
}

// ---------------------------------------------------------------------------------------
// Embedding: y[r, :] = w[ids[r], :]. Backward without atomics: the host sorts the rows by
// token id; block u sums dy over the rows order[offsets[u] .. offsets[u+1]) (ascending row
// order) into dw[ids_unique[u], :]. Rows of dw of absent tokens stay as given (zeros).

template <typename T>
__device__ void embedding_fwd(const T* w, const uint32_t* ids, T* y, int rows, int h) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * h) return;
    size_t r = idx / h;
    y[idx] = w[(size_t)ids[r] * h + idx % h];
}

template <typename T>
__device__ void embedding_bwd(const T* dy, const uint32_t* order, const uint32_t* offsets, const uint32_t* unique, T* dw, int h) {
    int u = blockIdx.x;
    uint32_t a = offsets[u], b = offsets[u + 1];
    size_t dst = (size_t)unique[u] * h;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
        float s = 0.f;
        for (uint32_t k = a; k < b; k++) s += to_f(dy[(size_t)order[k] * h + c]);
        dw[dst + c] = from_f<T>(s);
    }
}

// ---------------------------------------------------------------------------------------
// Row copy between strides (padding a matrix's rows to an aligned stride and back):
// dst[r * dst_ld + c] = src[r * src_ld + c] for c < cols; padding columns are not written.

template <typename T>
__device__ void copy_rows(const T* src, T* dst, int rows, int cols, int src_ld, int dst_ld) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * cols) return;
    size_t r = idx / cols, c = idx % cols;
    dst[r * dst_ld + c] = src[r * src_ld + c];
}

// ---------------------------------------------------------------------------------------
// extern "C" entry points, one per dtype.

#define ENTRY(T, S)                                                                                              \
    extern "C" __global__ void rmsnorm_fwd_##S(const T* x, const T* w, T* y, int rows, int h, float eps) {      \
        rmsnorm_fwd<T>(x, w, y, rows, h, eps);                                                                   \
    }                                                                                                            \
    extern "C" __global__ void rmsnorm_bwd_x_##S(const T* x, const T* w, const T* dy, T* dx, int rows, int h,   \
                                                 float eps) {                                                    \
        rmsnorm_bwd_x<T>(x, w, dy, dx, rows, h, eps);                                                            \
    }                                                                                                            \
    extern "C" __global__ void rmsnorm_bwd_w_##S(const T* x, const T* dy, float* partial, int rows, int h,      \
                                                 float eps, int rows_per_block) {                                \
        rmsnorm_bwd_w<T>(x, dy, partial, rows, h, eps, rows_per_block);                                          \
    }                                                                                                            \
    extern "C" __global__ void colsum_##S(const float* partial, T* out, int rows, int h) {                      \
        colsum<T>(partial, out, rows, h);                                                                        \
    }                                                                                                            \
    extern "C" __global__ void rope_fwd_##S(const T* x, const float* cos, const float* sin, T* y, int b, int t, \
                                            int n, int d) {                                                      \
        rope_fwd<T>(x, cos, sin, y, b, t, n, d);                                                                 \
    }                                                                                                            \
    extern "C" __global__ void rope_bwd_##S(const T* dy, const float* cos, const float* sin, T* dx, int b,      \
                                            int t, int n, int d) {                                               \
        rope_bwd<T>(dy, cos, sin, dx, b, t, n, d);                                                               \
    }                                                                                                            \
    extern "C" __global__ void split_heads_##S(const T* x, T* y, int b, int t, int n, int d) {                 \
        split_heads<T>(x, y, b, t, n, d);                                                                        \
    }                                                                                                            \
    extern "C" __global__ void merge_heads_##S(const T* x, T* y, int b, int t, int n, int d) {                 \
        merge_heads<T>(x, y, b, t, n, d);                                                                        \
    }                                                                                                            \
    extern "C" __global__ void causal_softmax_fwd_##S(const float* s, T* p, int rows, int t, float scale) {     \
        causal_softmax_fwd<T>(s, p, rows, t, scale);                                                             \
    }                                                                                                            \
    extern "C" __global__ void causal_softmax_bwd_##S(const T* p, const float* dp, T* ds, int rows, int t,      \
                                                      float scale) {                                             \
        causal_softmax_bwd<T>(p, dp, ds, rows, t, scale);                                                        \
    }                                                                                                            \
    extern "C" __global__ void swiglu_packed_fwd_##S(const T* gu, T* h, size_t rows, int w) {                   \
        swiglu_packed_fwd<T>(gu, h, rows, w);                                                                    \
    }                                                                                                            \
    extern "C" __global__ void swiglu_packed_bwd_##S(const T* gu, const T* dh, T* dgu, size_t rows, int w) {    \
        swiglu_packed_bwd<T>(gu, dh, dgu, rows, w);                                                              \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_fwd_##S(const T* x, const uint32_t* target, const float* w,        \
                                                     float* nll, int v, int ld) {                                \
        cross_entropy_fwd<T>(x, target, w, nll, v, ld);                                                          \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_bwd_##S(const T* x, const uint32_t* target, const float* coef,      \
                                                     T* dx, float* nll, int v, int ld) {                         \
        cross_entropy_bwd<T>(x, target, coef, dx, nll, v, ld);                                                   \
    }                                                                                                            \
    extern "C" __global__ void copy_rows_##S(const T* src, T* dst, int rows, int cols, int src_ld, int dst_ld) { \
        copy_rows<T>(src, dst, rows, cols, src_ld, dst_ld);                                                      \
    }                                                                                                            \
    extern "C" __global__ void embedding_fwd_##S(const T* w, const uint32_t* ids, T* y, int rows, int h) {      \
        embedding_fwd<T>(w, ids, y, rows, h);                                                                    \
    }                                                                                                            \
    extern "C" __global__ void embedding_bwd_##S(const T* dy, const uint32_t* order, const uint32_t* offsets,   \
                                                 const uint32_t* unique, T* dw, int h) {                         \
        embedding_bwd<T>(dy, order, offsets, unique, dw, h);                                                     \
    }

ENTRY(bf16, bf16)
ENTRY(float, f32)
