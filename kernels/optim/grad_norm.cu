// The square of the global gradient norm, sum over all tensors of g^2, for gradient clipping
// (torch.nn.utils.clip_grad_norm_'s total norm, before the square root), in one launch per
// group of up to NORM_TENSORS tensors plus one final launch.
//
// Pass 1 (`sum_squares_*`): block b sums the squares of chunk b of the concatenated tensors
// (each tensor split into chunks of NORM_CHUNK elements; the host gives every tensor's first
// chunk) into partial[b]. Pass 2 (`sum_partials`): one block sums the partials and, when
// asked, decides the step's clip on the device (crates/optim/src/rules/clip.rs `clip_factor`, the
// same IEEE operations): the AdamW kernels read the factor from there. Squares and
// sums in FP64 (no underflow for BF16 gradients as small as 1e-38, no overflow), each block's
// sum in a fixed tree order: the same bits run to run.

#include <stdint.h>
#include <cuda_bf16.h>

// Shared with the Rust launcher through crates/optim/src/cuda/abi.rs (its tests read these).
#define NORM_TENSORS 256
#define NORM_CHUNK 65536
#define NORM_THREADS 256
#define NORM_ARGS_BYTES 6160

// `struct NormArgs` of crates/optim/src/cuda/grad_norm.rs (same field order).
struct NormArgs {
    uint64_t ptr[NORM_TENSORS];
    uint64_t len[NORM_TENSORS];
    uint64_t first_chunk[NORM_TENSORS + 1];  // chunks before tensor i; [count] = all chunks
    uint64_t count;
};
static_assert(sizeof(NormArgs) == NORM_ARGS_BYTES && NORM_ARGS_BYTES == 8 * (3 * NORM_TENSORS + 2), "NormArgs layout (grad_norm.rs NormArgs)");

// Sum of one block's threads' values in a fixed tree order (blockDim.x == NORM_THREADS).
__device__ double block_sum(double v) {
    __shared__ double s[NORM_THREADS];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = NORM_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    return s[0];
}

template <typename T> __device__ __forceinline__ double widen(T x);
template <> __device__ __forceinline__ double widen<float>(float x) { return (double)x; }
template <> __device__ __forceinline__ double widen<__nv_bfloat16>(__nv_bfloat16 x) { return (double)__bfloat162float(x); }

template <typename T>
__device__ void sum_squares(const NormArgs& a, double* partial, uint64_t partial_offset) {
    uint64_t chunk = blockIdx.x;
    int lo = 0, hi = (int)a.count - 1;  // the tensor whose chunks hold `chunk`
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (a.first_chunk[mid] <= chunk) lo = mid; else hi = mid - 1;
    }
    const T* g = reinterpret_cast<const T*>(a.ptr[lo]);
    uint64_t start = (chunk - a.first_chunk[lo]) * NORM_CHUNK;
    uint64_t end = min(start + NORM_CHUNK, a.len[lo]);
    double s = 0.0;
    for (uint64_t i = start + threadIdx.x; i < end; i += NORM_THREADS) {
        double x = widen<T>(g[i]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[partial_offset + chunk] = s;
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS) sum_squares_f32(const NormArgs a, double* partial, uint64_t off) {
    sum_squares<float>(a, partial, off);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS) sum_squares_bf16(const NormArgs a, double* partial, uint64_t off) {
    sum_squares<__nv_bfloat16>(a, partial, off);
}

// out[0] = sum of partial[0 .. n), one block: thread i sums i, i + NORM_THREADS, ... in order.
// With `gate` (else null): out[1] = *loss, and the clip of clip.rs `clip_factor`:
// norm = (float)sqrt(out[0]); gate = {factor, skip}: skip = 1 when the norm or the loss is not
// finite, factor = max_norm / norm when 0 < max_norm < norm, else 1; out[2] = skip (the host
// reads out in one copy).
extern "C" __global__ void __launch_bounds__(NORM_THREADS) sum_partials(const double* partial, uint64_t n, double* out,
                                                                        const float* loss, float max_norm, float* gate) {
    double s = 0.0;
    for (uint64_t i = threadIdx.x; i < n; i += NORM_THREADS) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        out[0] = s;
        if (gate) {
            const float norm = __double2float_rn(__dsqrt_rn(s)), l = *loss;
            out[1] = (double)l;
            gate[0] = (max_norm > 0.0f && norm > max_norm) ? __fdiv_rn(max_norm, norm) : 1.0f;
            gate[1] = (isfinite(norm) && isfinite(l)) ? 0.0f : 1.0f;
            out[2] = (double)gate[1];
        }
    }
}
