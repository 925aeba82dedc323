//! The fused CUDA ops against the composed candle ops (`cuda` feature, on a GPU; without the
//! feature one ignored test says so, without a GPU every test fails): forward
//! value and every input gradient, BF16 and FP32, odd sizes, on random inputs made on the
//! CPU and copied to the GPU. Each gradient is of `sum(out · R)` for a fixed random `R`.
//!
//! Tolerance: the largest difference over the largest magnitude of the reference, at most
//! 2e-5 in FP32 (different summation orders) and 2e-2 in BF16 (the fused ops round once
//! where the composed ones round after every op; BF16's unit roundoff is 2^-8 = 3.9e-3).
//!
//!     cargo test --release --features cuda -p lowbit-model --test fused_parity

/// What a build without the `cuda` feature shows instead of passing without running.
#[cfg(not(feature = "cuda"))]
#[test]
#[ignore = "GPU test: build with `--features cuda` and run on a machine with a CUDA GPU"]
fn needs_a_gpu_build() {}

#[cfg(feature = "cuda")]
#[path = "fused_parity/ops.rs"]
mod ops;
