// Row copy between strides, padding with zeros.
// Rust twin: crates/model/src/fused/mod.rs (copy_padded, used by linear.rs and mlp.rs); CPU
// reference: candle's narrow / pad / cat, which the composed path uses.

#pragma once
#include "common.cuh"

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

// extern "C" entry points: copy_padded1_<dtype> (one element per thread), and in 16-byte
// units copy_padded8_bf16 (8 BF16) and copy_padded4_f32 (4 FP32).
extern "C" __global__ void copy_padded1_bf16(const bf16* src, bf16* dst, int rows, int cols, int src_ld, int rows_out,
                                             int dst_ld) {
    copy_padded<bf16>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
extern "C" __global__ void copy_padded1_f32(const float* src, float* dst, int rows, int cols, int src_ld, int rows_out,
                                            int dst_ld) {
    copy_padded<float>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
extern "C" __global__ void copy_padded8_bf16(const uint4* src, uint4* dst, int rows, int cols, int src_ld, int rows_out,
                                             int dst_ld) {
    copy_padded<uint4>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
extern "C" __global__ void copy_padded4_f32(const uint4* src, uint4* dst, int rows, int cols, int src_ld, int rows_out,
                                            int dst_ld) {
    copy_padded<uint4>(src, dst, rows, cols, src_ld, rows_out, dst_ld);
}
