//! The NCCL backend on one GPU (run on a machine with a CUDA GPU and NCCL:
//! `cargo test --release --features cuda,nccl -p lowbit-train --test nccl_one_rank`; without the
//! `nccl` feature one ignored test says so, and with it every test fails when no GPU can be
//! opened).
//!
//! A communicator of one rank runs every device-side call that data parallelism makes, on a
//! machine with one GPU: the unique id, the communicator on candle's stream, `ncclAllReduce`
//! of a view at an element offset (the step's flat gradient buffer, [`Collective::all_reduce_tensor`])
//! and the grouped in-place `ncclBroadcast` of F32 and BF16 views (ZeRO-1's weight gather,
//! [`Collective::broadcast_views`]). Over one rank a sum and a broadcast are the identity: the
//! all-reduce (out of place) must return exactly the view's elements, so a wrong offset or
//! length in its slicing shows as a mismatch; the broadcast (in place) must be accepted by
//! NCCL for both dtypes and leave every element as it was. What one GPU cannot show, two ranks
//! exchanging data, is `scripts/check_data_parallel_gpu.sh` on a 2-GPU machine.

/// What a build without the `nccl` feature shows instead of passing without running.
#[cfg(not(feature = "nccl"))]
#[test]
#[ignore = "GPU test: build with `--features cuda,nccl` and run on a machine with a CUDA GPU"]
fn needs_a_gpu_build() {}

#[cfg(feature = "nccl")]
#[path = "nccl_one_rank/nccl.rs"]
mod nccl;
