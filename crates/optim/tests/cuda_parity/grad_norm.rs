//! The fused squared gradient norm (`lowbit_optim::cuda::grad_norm`) against an FP64 sum on the
//! host (built with the `cuda` feature).

use candle_core::{DType, Device, Tensor};
use lowbit_optim::cuda::grad_norm::sum_of_squares;
use lowbit_optim::states::rng::{random_bits, stream_key, StateKind};

/// Uniform values in [-scale, scale) from the counter RNG.
fn uniform(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let key = stream_key(seed, 1, 0, StateKind::V);
    (0..n).map(|i| ((random_bits(key, i as u64) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).collect()
}

#[test]
fn sum_of_squares_matches_an_fp64_host_sum() {
    let dev = Device::new_cuda(0).unwrap_or_else(|e| panic!("cuda_parity needs a CUDA GPU: {e}"));
    // 300 tensors (two launches of F32, one of BF16), odd sizes, some above one chunk of
    // 65,536 elements; BF16 gradients as small as 1e-30 (their FP32 squares
    // would underflow to 0) and F32 ones as large as 1e18 (squares beyond f32::MAX).
    let mut grads = Vec::new();
    let mut expected = 0f64;
    for i in 0..300usize {
        let n = if i % 7 == 0 { 70_001 + i } else { 1 + 37 * i };
        let scale = match i % 5 {
            0 => 1e-30,
            1 => 1e18,
            _ => 1.0,
        };
        let host = uniform(i as u64, n, scale);
        let dtype = if i % 3 == 0 { DType::BF16 } else { DType::F32 };
        let t = Tensor::from_vec(host, n, &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        // the host sum of the values the device gets (BF16 rounded)
        expected += t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap().iter().map(|x| x * x).sum::<f64>();
        grads.push(t.to_device(&dev).unwrap());
    }
    // and a view: a contiguous narrow of a larger buffer
    let big = Tensor::from_vec(uniform(9, 1000, 2.0), 1000, &Device::Cpu).unwrap();
    expected += big.narrow(0, 3, 500).unwrap().to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap().iter().map(|x| x * x).sum::<f64>();
    grads.push(big.to_device(&dev).unwrap().narrow(0, 3, 500).unwrap());
    let got = sum_of_squares(&grads).unwrap();
    assert!(((got - expected) / expected).abs() < 1e-12, "device {got:e} vs host {expected:e}");
    // the same bits run to run
    assert_eq!(sum_of_squares(&grads).unwrap().to_bits(), got.to_bits());
    // the tiny BF16 gradients alone: about 1e-60 per element, not 0
    let tiny: Vec<Tensor> = grads[..300].iter().step_by(15).cloned().collect();
    let expected: f64 =
        tiny.iter().map(|t| t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap().iter().map(|x| x * x).sum::<f64>()).sum();
    let got = sum_of_squares(&tiny).unwrap();
    assert!(expected > 0.0 && expected < 1e-50, "the test's tiny set: {expected:e}");
    assert!(((got - expected) / expected).abs() < 1e-12, "tiny: device {got:e} vs host {expected:e}");
}

/// The clip decided on the device (`clip_on_device`) against the host's rule
/// (`clip::clip_factor` of `clip::norm_of`): the same factor bit for bit, the same skip, the
/// same reported loss and Σ g², at thresholds below, at and above the norm, without clipping,
/// and for a NaN gradient, an infinite loss and a norm beyond `f32::MAX` (values up to 3e38).
#[test]
fn the_device_clip_is_the_host_rule() {
    use lowbit_optim::cuda::grad_norm::clip_on_device;
    use lowbit_optim::rules::clip::{clip_factor, norm_of};
    use lowbit_optim::GradScale;
    let dev = Device::new_cuda(0).unwrap_or_else(|e| panic!("cuda_parity needs a CUDA GPU: {e}"));
    let grads = |scale: f32, nan: bool| -> Vec<Tensor> {
        (0..5)
            .map(|i| {
                let mut g = uniform(40 + i, 1000 + 77 * i as usize, scale);
                if nan && i == 3 {
                    g[17] = f32::NAN;
                }
                let t = Tensor::from_vec(g, 1000 + 77 * i as usize, &dev).unwrap();
                if i % 2 == 0 {
                    t.to_dtype(DType::BF16).unwrap()
                } else {
                    t
                }
            })
            .collect()
    };
    let norm = norm_of(sum_of_squares(&grads(1.0, false)).unwrap());
    let mut cases = vec![];
    for max_norm in [0.0, norm / 3.0, norm, norm * 2.0, 1e-3] {
        cases.push((grads(1.0, false), 2.75f32, max_norm));
    }
    cases.push((grads(1.0, true), 2.75, 1.0));
    cases.push((grads(1.0, false), f32::INFINITY, 1.0));
    cases.push((grads(3e38, false), 2.75, 1.0));
    for (i, (g, loss, max_norm)) in cases.iter().enumerate() {
        let l = Tensor::new(*loss, &dev).unwrap();
        let clip = clip_on_device(g, &l, *max_norm).unwrap();
        let GradScale::Device(gate) = clip.scale() else { panic!("a device gate") };
        let gate = gate.to_vec1::<f32>().unwrap();
        let (got_loss, sum, skipped) = clip.read().unwrap();
        assert_eq!(skipped, gate[1] != 0.0, "case {i}: read's skip is the gate's");
        assert_eq!(sum.to_bits(), sum_of_squares(g).unwrap().to_bits(), "case {i}: the same Σ g²");
        assert_eq!(got_loss.to_bits(), loss.to_bits(), "case {i}: the loss");
        let host = clip_factor(*loss, norm_of(sum), *max_norm);
        assert_eq!(gate[1] != 0.0, host.is_none(), "case {i}: skip {gate:?} vs host {host:?}");
        if let Some(f) = host {
            assert_eq!(gate[0].to_bits(), f.to_bits(), "case {i}: factor {} vs host {f}", gate[0]);
        }
        // the cases mean what they say
        match i {
            0 | 2 | 3 => assert_eq!(host, Some(1.0)),
            1 | 4 => assert!(host.is_some_and(|f| f < 1.0)),
            _ => assert_eq!(host, None, "case {i}"),
        }
    }
}
