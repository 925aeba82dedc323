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

// V consecutive elements as FP32 (16-byte loads where V elements fill whole 16-byte words:
// the address must then be 16-byte aligned), and back, each rounded once to T.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
    constexpr int PER = 16 / sizeof(T);
    if constexpr (V % PER == 0) {
#pragma unroll
        for (int k = 0; k < V / PER; k++) {
            uint4 u = reinterpret_cast<const uint4*>(p)[k];
            const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
            for (int j = 0; j < PER; j++) out[k * PER + j] = to_f(e[j]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) out[j] = to_f(p[j]);
    }
}
template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
    constexpr int PER = 16 / sizeof(T);
    if constexpr (V % PER == 0) {
#pragma unroll
        for (int k = 0; k < V / PER; k++) {
            uint4 u;
            T* e = reinterpret_cast<T*>(&u);
#pragma unroll
            for (int j = 0; j < PER; j++) e[j] = from_f<T>(in[k * PER + j]);
            reinterpret_cast<uint4*>(p)[k] = u;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) p[j] = from_f<T>(in[j]);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define WARPS 8  // warps per block of the row kernels (blockDim.x = 256)

// ---------------------------------------------------------------------------------------
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
// see `load_chunk`. Elements past h count as zeros. Measured on the H200 (dx bits unchanged):
// 16,384 x 1,024 BF16 rows with a residual gradient in 41 us (60 us reading twice), 32,768
// x 640 in 50 us (73 us).
// (dx is a buffer of its own: no input aliases it, which lets a lane's loads run ahead of
// its stores)
template <typename T, int CH>
__device__ void rmsnorm_bwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ dy,
                            const T* __restrict__ d_residual, T* __restrict__ dx, float* partial, int rows, int h,
                            float eps, int rows_per_block, bool vec) {
    constexpr int V = 8, WORDS = V * sizeof(T) / 16;
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

// ---------------------------------------------------------------------------------------
// RoPE, HF rotate_half convention, fused with the head transpose:
// x [B, T, n, d] (a projection's output) -> y [B, n, T, d],
// y_i = x_i cos_i + r_i sin_i with r_i = -x_{i+d/2} (i < d/2), x_{i-d/2} (i >= d/2);
// cos/sin: FP32 tables [>= T, d] (row t = position t).
// Backward: dy [B, n, T, d] -> dx [B, T, n, d],
// dx_j = dy_j cos_j + (j < d/2 ? dy_{j+d/2} sin_{j+d/2} : -dy_{j-d/2} sin_{j-d/2}).
// The [B, T, n, d] side (x, dx) has row stride ld >= n * d elements per position (a slot of
// a wider buffer: the q, k, v projections' outputs or gradients side by side).
// One thread per V elements of the first half of a row and their partners in the second
// half (V = 8: 16-byte loads and stores; the host takes V = 1 where d/2 is not a multiple
// of 8 or a buffer is not 16-byte aligned).

template <typename T, int V, bool BWD>
__device__ void rope(const T* src, const float* cos, const float* sin, T* dst, int b, int t, int n, int d, int ld) {
    int half = d / 2, chunks = half / V;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)b * t * n * chunks) return;
    int c = (int)(idx % chunks) * V;
    size_t r = idx / chunks;  // src's row: (bi * t + p) * n + head forward, (bi * n + head) * t + p backward
    int p = BWD ? r % t : (r / n) % t;
    int head = BWD ? (r / t) % n : r % n;
    size_t bi = r / ((size_t)t * n);
    T* out = dst + (BWD ? (bi * t + p) * ld + head * d : ((bi * n + head) * t + p) * d);
    const T* in = src + (BWD ? r * d : (bi * t + p) * ld + head * d);
    const float *cr = cos + (size_t)p * d, *sr = sin + (size_t)p * d;
    float a1[V], a2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    load_vec<T, V>(in + c, a1);
    load_vec<T, V>(in + half + c, a2);
    load_vec<float, V>(cr + c, c1);
    load_vec<float, V>(cr + half + c, c2);
    load_vec<float, V>(sr + c, s1);
    load_vec<float, V>(sr + half + c, s2);
#pragma unroll
    for (int j = 0; j < V; j++) {
        o1[j] = BWD ? a1[j] * c1[j] + a2[j] * s2[j] : a1[j] * c1[j] - a2[j] * s1[j];
        o2[j] = BWD ? a2[j] * c2[j] - a1[j] * s1[j] : a2[j] * c2[j] + a1[j] * s2[j];
    }
    store_vec<T, V>(out + c, o1);
    store_vec<T, V>(out + half + c, o2);
}

// ---------------------------------------------------------------------------------------
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
// into dgu [rows, 2 * w] in the same layout. One thread per V consecutive columns of h
// (V = 8: 16-byte accesses; w a multiple of V, buffers 16-byte aligned).
template <typename T, int V>
__device__ void swiglu_packed_fwd(const T* gu, T* h, size_t rows, int w) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    float g[V], u[V], out[V];
    load_vec<T, V>(gu + r * 2 * w + c, g);
    load_vec<T, V>(gu + r * 2 * w + w + c, u);
#pragma unroll
    for (int j = 0; j < V; j++) out[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    store_vec<T, V>(h + i, out);
}

template <typename T, int V>
__device__ void swiglu_packed_bwd(const T* gu, const T* dh, T* dgu, size_t rows, int w) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= rows * w) return;
    size_t r = i / w, c = i % w;
    size_t gi = r * 2 * w + c;
    float x[V], u[V], d[V], dg[V], du[V];
    load_vec<T, V>(gu + gi, x);
    load_vec<T, V>(gu + gi + w, u);
    load_vec<T, V>(dh + i, d);
#pragma unroll
    for (int j = 0; j < V; j++) {
        float sg = 1.0f / (1.0f + expf(-x[j]));
        dg[j] = d[j] * u[j] * sg * (1.0f + x[j] * (1.0f - sg));
        du[j] = d[j] * x[j] * sg;
    }
    store_vec<T, V>(dgu + gi, dg);
    store_vec<T, V>(dgu + gi + w, du);
}

// ---------------------------------------------------------------------------------------
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

template <typename T, int VEC>
__device__ void row_max_sum(const T* xr, int v, float* smem, float* m_out, float* s_out) {
    float m = -INFINITY, s = 0.f;
    int full = v / VEC * VEC;
    for (int j = threadIdx.x * VEC; j < full; j += blockDim.x * VEC) {
        float x[VEC];
        load_vec<T, VEC>(xr + j, x);
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
    for (int j = full + threadIdx.x; j < v; j += blockDim.x) combine(m, s, to_f(xr[j]), 1.f);
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
template <typename T, int VEC>
__device__ void cross_entropy_bwd(const T* x, const uint32_t* target, const float* coef, T* dx, float* nll, int v,
                                  int ld) {
    __shared__ float smem[2 * WARPS];
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
    row_max_sum<T, VEC>(xr, v, smem, &m, &s);
    float scale = c / s;
    int tg = (int)target[row];
    float xt = to_f(xr[tg]);
    __syncthreads();  // x[target] is read before any thread overwrites it
    if (nll && threadIdx.x == 0) nll[row] = c * (m + logf(s) - xt);
    int full = v / VEC * VEC;
    for (int j = threadIdx.x * VEC; j < full; j += blockDim.x * VEC) {
        float e[VEC];
        load_vec<T, VEC>(xr + j, e);
#pragma unroll
        for (int k = 0; k < VEC; k++) e[k] = __expf(e[k] - m) * scale - (j + k == tg ? c : 0.f);
        store_vec<T, VEC>(dr + j, e);
    }
    for (int j = full + threadIdx.x; j < v; j += blockDim.x)
        dr[j] = from_f<T>(__expf(to_f(xr[j]) - m) * scale - (j == tg ? c : 0.f));
}

// ---------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------
// Row copy between strides, padding with zeros (a weight padded to aligned rows or columns,
// two weights packed into one, a padded gradient cut back): for r < rows_out, c < dst_ld,
//   dst[r * dst_ld + c] = src[r * src_ld + c] if r < rows and c < cols, else 0,
// so dst needs no zero fill first. In units U: one element, or 16 bytes (uint4) where every
// width and address is a multiple of 16 bytes (the host's choice).

template <typename U> __device__ __forceinline__ U zero_unit() { return U(0.f); }
template <> __device__ __forceinline__ uint4 zero_unit<uint4>() { return make_uint4(0u, 0u, 0u, 0u); }

template <typename U>
__device__ void copy_padded(const U* src, U* dst, int rows, int cols, int src_ld, int rows_out, int dst_ld) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows_out * dst_ld) return;
    size_t r = idx / dst_ld, c = idx % dst_ld;
    dst[idx] = (r < (size_t)rows && c < (size_t)cols) ? src[r * src_ld + c] : zero_unit<U>();
}

// ---------------------------------------------------------------------------------------
// The sum of n FP32 values in a fixed order, by one block of 256 threads: thread i adds
// x[i], x[i + 256], ... in order, then a fixed tree over the threads.
extern "C" __global__ void ordered_sum_f32(const float* x, float* out, int n) {
    __shared__ float s[256];
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}

// ---------------------------------------------------------------------------------------
// extern "C" entry points, one per dtype.

// The kernels with V elements per thread: <name><V>_<dtype>.
// rmsnorm_bwd_c<CH>_<S>: the backward for rows of CH chunks of 8 per lane (h up to 256 CH); two
// blocks per SM (at most 128 registers a thread) where CH * sizeof(T) <= 8 (BF16 rows up to
// 1024 wide, FP32 up to 512): measured faster there; wider rows need more registers.
#define NORM_BWD(T, S, CH)                                                                                         \
    extern "C" __global__ void __launch_bounds__(256, CH * sizeof(T) <= 8 ? 2 : 1)                                 \
        rmsnorm_bwd_c##CH##_##S(const T* x, const T* w, const T* dy, const T* d_residual, T* dx, float* partial,   \
                                int rows, int h, float eps, int rows_per_block, int vec) {                         \
        rmsnorm_bwd<T, CH>(x, w, dy, d_residual, dx, partial, rows, h, eps, rows_per_block, vec != 0);             \
    }

#define VECTOR_ENTRY(T, S, V)                                                                                    \
    extern "C" __global__ void rope_fwd##V##_##S(const T* x, const float* cos, const float* sin, T* y, int b,   \
                                                 int t, int n, int d, int ld) {                                  \
        rope<T, V, false>(x, cos, sin, y, b, t, n, d, ld);                                                       \
    }                                                                                                            \
    extern "C" __global__ void rope_bwd##V##_##S(const T* dy, const float* cos, const float* sin, T* dx, int b, \
                                                 int t, int n, int d, int ld) {                                  \
        rope<T, V, true>(dy, cos, sin, dx, b, t, n, d, ld);                                                      \
    }                                                                                                            \
    extern "C" __global__ void swiglu_packed_fwd##V##_##S(const T* gu, T* h, size_t rows, int w) {              \
        swiglu_packed_fwd<T, V>(gu, h, rows, w);                                                                 \
    }                                                                                                            \
    extern "C" __global__ void swiglu_packed_bwd##V##_##S(const T* gu, const T* dh, T* dgu, size_t rows, int w) { \
        swiglu_packed_bwd<T, V>(gu, dh, dgu, rows, w);                                                           \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_fwd##V##_##S(const T* x, const uint32_t* target, const float* w,   \
                                                          float* nll, int v, int ld) {                           \
        cross_entropy_fwd<T, V>(x, target, w, nll, v, ld);                                                       \
    }                                                                                                            \
    extern "C" __global__ void cross_entropy_bwd##V##_##S(const T* x, const uint32_t* target, const float* coef, \
                                                          T* dx, float* nll, int v, int ld) {                    \
        cross_entropy_bwd<T, V>(x, target, coef, dx, nll, v, ld);                                                \
    }                                                                                                            \
    extern "C" __global__ void rmsnorm_fwd##V##_##S(const T* x, const T* delta, const T* w, T* sum, T* y,       \
                                                    int rows, int h, float eps) {                                \
        rmsnorm_fwd<T, V>(x, delta, w, sum, y, rows, h, eps);                                                    \
    }

#define ENTRY(T, S)                                                                                              \
    extern "C" __global__ void colsum_##S(const float* partial, T* out, int rows, int h) {                      \
        colsum<T>(partial, out, rows, h);                                                                        \
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
    VECTOR_ENTRY(T, S, 1)                                                                                        \
    VECTOR_ENTRY(T, S, 8)                                                                                        \
    NORM_BWD(T, S, 1)                                                                                            \
    NORM_BWD(T, S, 2)                                                                                            \
    NORM_BWD(T, S, 3)                                                                                            \
    NORM_BWD(T, S, 4)                                                                                            \
    NORM_BWD(T, S, 5)                                                                                            \
    NORM_BWD(T, S, 6)                                                                                            \
    extern "C" __global__ void copy_padded1_##S(const T* src, T* dst, int rows, int cols, int src_ld,          \
                                                int rows_out, int dst_ld) {                                      \
        copy_padded<T>(src, dst, rows, cols, src_ld, rows_out, dst_ld);                                          \
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

// copy_padded in 16-byte units: 8 BF16 or 4 FP32 elements
extern "C" __global__ void copy_padded8_bf16(const uint4* src, uint4* dst, int rows, int cols, int src_ld, int rows_out,
                                             int dst_ld) {
    copy_padded<uint4>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
extern "C" __global__ void copy_padded4_f32(const uint4* src, uint4* dst, int rows, int cols, int src_ld, int rows_out,
                                            int dst_ld) {
    copy_padded<uint4>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
