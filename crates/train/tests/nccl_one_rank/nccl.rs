//! The tests of `nccl_one_rank.rs` (built with the `nccl` feature).

use candle_core::{DType, Device, Tensor};
use lowbit_train::distributed::collective::{Collective, Solo};
use lowbit_train::distributed::nccl::NcclCollective;
use std::sync::Arc;

/// Deterministic values in (-1, 1) that differ from element to element.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A one-rank communicator on GPU 0, or a failure that says why.
fn one_rank() -> (NcclCollective, Device) {
    let dev = lowbit_train::device::open_cuda(0).unwrap_or_else(|e| panic!("nccl_one_rank needs a CUDA GPU: {e}"));
    let comm = NcclCollective::new(Arc::new(Solo), &dev).expect("a one-rank NCCL communicator");
    (comm, Device::Cuda(dev))
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn all_reduce_of_a_view_at_an_offset_returns_its_elements() {
    let (comm, dev) = one_rank();
    let host = values(1, 1_000_003);
    let whole = Tensor::from_slice(&host, host.len(), &dev).unwrap();
    // odd start and length: the step's buffer holds tensors of any size back to back
    let (start, len) = (37, 999_001);
    let sum = comm.all_reduce_tensor(&whole.narrow(0, start, len).unwrap()).unwrap();
    assert_eq!(sum.dims(), &[len]);
    let want: Vec<u32> = host[start..start + len].iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits(&sum), want, "the sum over one rank is the view's own elements");
    assert!(comm.all_reduce_tensor(&whole.to_dtype(DType::BF16).unwrap()).is_err(), "BF16 is refused");
}

#[test]
fn grouped_broadcast_of_f32_and_bf16_views_keeps_every_element() {
    let (comm, dev) = one_rank();
    let f32_host = values(2, 4099);
    let f32_w = Tensor::from_slice(&f32_host, f32_host.len(), &dev).unwrap();
    let bf16_w = Tensor::from_slice(&values(3, 2053), 2053, &dev).unwrap().to_dtype(DType::BF16).unwrap();
    let (f32_before, bf16_before) = (bits(&f32_w), bits(&bf16_w));
    // rank 0 owns two ranges of each tensor (ZeRO-1 views start at multiples of 4) and an empty one
    let owned = vec![vec![
        f32_w.narrow(0, 0, 1024).unwrap(),
        f32_w.narrow(0, 2048, 2051).unwrap(),
        bf16_w.narrow(0, 512, 1024).unwrap(),
        bf16_w.narrow(0, 2052, 1).unwrap(),
        bf16_w.narrow(0, 4, 0).unwrap(),
    ]];
    comm.broadcast_views(&owned).unwrap();
    assert_eq!(bits(&f32_w), f32_before, "F32 weights after the broadcast");
    assert_eq!(bits(&bf16_w), bf16_before, "BF16 weights after the broadcast");
    let u8_view = vec![vec![f32_w.to_dtype(DType::U8).unwrap()]];
    assert!(comm.broadcast_views(&u8_view).is_err(), "a U8 view is refused before the NCCL group");
}
