// Fused forward and backward kernels of the LLaMA model's ops (crates/model/src/fused/).
// Every kernel exists for BF16 (`_bf16`) and FP32 (`_f32`) tensors; arithmetic is FP32,
// each output is rounded once to the tensor's dtype. Reductions run in a fixed order (no
// atomics), so results are the same run to run.
//
// Shapes (row-major, contiguous): N rows of width H (RMSNorm, SwiGLU: any N x H), attention
// [B, heads, T, T] scores, cross-entropy [N, V] logits.
//
// One op family per file, each opening with its Rust twin and CPU reference; this file
// gathers them into one module (one fatbin, kernels looked up by name).

#include "common.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "heads.cuh"
#include "softmax.cuh"
#include "swiglu.cuh"
#include "cross_entropy.cuh"
#include "embedding.cuh"
#include "copy_padded.cuh"
#include "ordered_sum.cuh"
