//! GPU kernels against the CPU reference, bit for bit (run on a machine with a CUDA GPU:
//! `cargo test --release --features cuda -p lowbit-optim --test cuda_parity`; without the
//! `cuda` feature one ignored test says so, and with it every test fails when no GPU can be
//! opened: none passes without running). Also: ZeRO-1 shards of every tensor stepped on views of the whole weights give
//! the whole-tensor step, bit for bit.
//!
//! For every state format (as m and as v; the precision-only e8mK with K = 1, 2, 3, 6; block-
//! scaled v with `v_zero` exclude, and keep for fp8, fp4 and int8) x rounding x weight dtype x
//! block size (128 and 64: moments kept in registers; 256: two passes; per tensor), and for
//! the FP8/FP4 pairs both scale kinds (`pow2`, `amax`), starting from random non-zero states,
//! three steps on 265 tensors (more than one launch takes) of odd sizes (not a multiple of
//! the block) with edge-value gradients (zeros, subnormals, huge, +-Inf, NaN) and an m reset
//! at step 3 (a v-only reset for the int8 pairs): weights, codes, scales and every counter
//! (updated, stalled, unchanged of m, v, w; zero gradients) must be identical. With BF16
//! weights, half of the tensors of each step (alternating) get BF16 gradients (as a BF16
//! model with one micro-batch gives them; the CPU gets the same values in FP32), so one
//! step launches both BF16-weight kernel variants. NaN is compared as NaN (IEEE leaves
//! NaN payloads to the hardware; the encoders store one canonical NaN). Simulated stalling
//! (skipped write-backs of m and v) is one more case set: the kernels skip the elements the CPU
//! skips. SOAP (`cuda_parity/soap.rs`): its write-back kernels bit for bit, its updates within a
//! tolerance. Muon (`cuda_parity/muon.rs`): its states and counts bit for bit, its weights within
//! a tolerance.

/// What a build without the `cuda` feature shows instead of passing without running.
#[cfg(not(feature = "cuda"))]
#[test]
#[ignore = "GPU test: build with `--features cuda` and run on a machine with a CUDA GPU"]
fn needs_a_gpu_build() {}

#[cfg(feature = "cuda")]
#[path = "cuda_parity/kernels.rs"]
mod kernels;

#[cfg(feature = "cuda")]
#[path = "cuda_parity/grad_norm.rs"]
mod grad_norm;

#[cfg(feature = "cuda")]
#[path = "cuda_parity/soap.rs"]
mod soap;

#[cfg(feature = "cuda")]
#[path = "cuda_parity/muon.rs"]
mod muon;
