//! SOAP on the GPU against the CPU reference: the write-back kernels (`kernels/optim/soap.cu`)
//! bit for bit given the same inputs, for every format they take x rounding x scale block
//! (128, 64, 256, per tensor) x scale kind, from random states, on odd lengths with edge values
//! (zeros, subnormals, huge, +-Inf, NaN), and the direction kernel bit for bit; the basis
//! refresh on the GPU (cuSOLVER) against the host's (faer) and whole SOAP updates (candle's cuBLAS
//! products against the CPU's) within stated tolerances.

use super::kernels::{gpu, same_f32, values};
use candle_core::cuda::cudarc::driver::DevicePtr;
use candle_core::{DType, Device, Tensor, Var};
use lowbit_optim::cuda::refresh::QrRefresh;
use lowbit_optim::cuda::soap::{DeviceState, SoapKernels};
use lowbit_optim::rules::adamw::step::{write_back, Skip, Weights};
use lowbit_optim::rules::soap::step::{direction, refresh_all, Direction, Refresh};
use lowbit_optim::rules::soap::store::{ema_write, weights_write};
use lowbit_optim::states::format::scale::ScaleKind;
use lowbit_optim::{
    GradScale, Hyper, LowbitOptimizer, LowbitSoap, Moments, ParamInfo, QuantState, Rounding, SoapConfig, StateFormat, StatesConfig,
};

/// Every format SOAP's kernels take (signed as m, L and R are; FP4 v unsigned and zero-free)
/// x rounding x block x scale kind, lengths 1001 and 4133: codes, scales, new values and
/// counts identical.
#[test]
fn soap_write_backs_match_cpu_bit_for_bit() {
    let dev = gpu();
    let Device::Cuda(cd) = &dev else { unreachable!() };
    let stream = cd.cuda_stream();
    let mut k = SoapKernels::load(cd).unwrap();
    let mut counts = stream.alloc_zeros::<u64>(3).unwrap();
    let formats = [
        (StateFormat::Fp32, true, false),
        (StateFormat::Bf16, true, false),
        (StateFormat::Fp8E4M3, true, false),
        (StateFormat::Fp8E5M2, true, false),
        (StateFormat::Fp4E2M1, true, false),
        (StateFormat::Fp4UE2M2, false, true),
        (StateFormat::Fp8E4M3, false, true),
    ];
    let mut cases = 0;
    for (f, signed, zero_free) in formats {
        let blocks: &[usize] = if f.is_scaled() { &[0, 64, 128, 256] } else { &[0] };
        let kinds: &[ScaleKind] = if f.is_scaled() { &[ScaleKind::Pow2, ScaleKind::Amax] } else { &[ScaleKind::Pow2] };
        for &block in blocks {
            for &kind in kinds {
                for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                    for n in [1001usize, 4133] {
                        let seed = cases as u64 * 7 + 1;
                        let sign = |x: f32| if signed { x } else { x * x };
                        let mut state = QuantState::zeros(f, n, block, signed).with_scale_kind(kind).with_zero_free(zero_free);
                        let init: Vec<f32> = values(seed, n, 0.05, false).into_iter().map(sign).collect();
                        write_back(&mut state, &init, Rounding::Nearest, 0, None, 0, Skip::NEVER);
                        let u: Vec<f32> = values(seed + 1, n, 0.02, true).into_iter().map(sign).collect();
                        let (a, b, key) = (0.9f32, (1.0 - 0.9f64) as f32, 0xC0FFEE ^ seed);
                        let mut cpu = state.clone();
                        let (new, c) = ema_write(&mut cpu, &u, a, b, rounding, key);

                        let mut ds = DeviceState::upload(&state, &stream).unwrap();
                        let ut = Tensor::from_slice(&u, n, &dev).unwrap();
                        let out = Tensor::zeros(n, DType::F32, &dev).unwrap();
                        stream.memset_zeros(&mut counts).unwrap();
                        k.ema(&mut ds, &ut, &out, a, b, rounding, key, counts.device_ptr(&stream).0).unwrap();
                        let got = ds.download(&stream).unwrap().clone();
                        let label = format!("{} block {block} {kind:?} {rounding:?} n {n}", f.name());
                        // (FP32 states store the value itself: a NaN compares as NaN, its payload is the
                        // hardware's, as the AdamW kernels' parity allows)
                        match f {
                            StateFormat::Fp32 => {
                                assert!(got.decode_all().iter().zip(&cpu.decode_all()).all(|(x, y)| same_f32(*x, *y)), "{label}: codes")
                            }
                            _ => assert_eq!(got.code_bytes(), cpu.code_bytes(), "{label}: codes"),
                        }
                        assert_eq!(
                            got.scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
                            cpu.scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
                            "{label}: scales"
                        );
                        let out = out.to_vec1::<f32>().unwrap();
                        assert!(out.iter().zip(&new).all(|(x, y)| same_f32(*x, *y)), "{label}: new values");
                        assert_eq!(stream.clone_dtoh(&counts).unwrap(), vec![c.updated, c.stalled, c.unchanged], "{label}: counts");
                        cases += 1;
                    }
                }
            }
        }
    }
    println!("soap write-back cases: {cases}, all bit-identical");

    // the weights: FP32 exact, BF16 with both roundings, counted
    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
        let n = 3001;
        let p0 = values(11, n, 0.1, false);
        let upd = values(12, n, 1.0, true);
        let mut w32 = p0.clone();
        weights_write(Weights::F32(&mut w32), &upd, 1e-3, 0.999, rounding, 5);
        let mut w16: Vec<u16> = p0.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
        let c = weights_write(Weights::Bf16(&mut w16), &upd, 1e-3, 0.999, rounding, 5);
        let nt = Tensor::from_slice(&upd, n, &dev).unwrap();
        let g32 = Tensor::from_slice(&p0, n, &dev).unwrap();
        let g16 = Tensor::from_slice(&p0, n, &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
        stream.memset_zeros(&mut counts).unwrap();
        k.weights(&g32, &nt, 1e-3, 0.999, rounding, 5, counts.device_ptr(&stream).0).unwrap();
        k.weights(&g16, &nt, 1e-3, 0.999, rounding, 5, counts.device_ptr(&stream).0).unwrap();
        assert!(g32.to_vec1::<f32>().unwrap().iter().zip(&w32).all(|(a, b)| same_f32(*a, *b)), "FP32 weights {rounding:?}");
        let got16: Vec<u16> = g16.to_vec1::<half::bf16>().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(got16, w16, "BF16 weights {rounding:?}");
        assert_eq!(stream.clone_dtoh(&counts).unwrap(), vec![c.updated, c.stalled, c.unchanged], "BF16 weight counts");
    }
}

/// A model of two square matrices (32 x 32, 24 x 24: full-rank preconditioners from the first
/// update), a tall one whose long side is not preconditioned (40 x 8, max dim 32) and a
/// vector; 12 SOAP updates (refresh every 5) on the GPU and on the CPU from the same random
/// gradients. The products differ in rounding (cuBLAS vs the CPU's), so the weights agree within
/// a tolerance: FP32 states within 1e-3 of the weights' largest move, FP8 states (per-tensor
/// E4M3, nearest: a rounding that flips moves an element by up to a grid step) within 5e-2;
/// the counts' element totals are equal.
#[test]
fn soap_updates_match_cpu_within_tolerance() {
    let dev = gpu();
    let shapes: [&[usize]; 4] = [&[32, 32], &[24, 24], &[40, 8], &[24]];
    for (m_format, tol) in [("fp32", 1e-3), ("fp8", 5e-2)] {
        let states = StatesConfig { m_format: m_format.into(), v_format: m_format.into(), block_size: 0, ..Default::default() };
        let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };
        let infos = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| ParamInfo { name: format!("p{i}"), group: "mlp".into(), len: s.iter().product(), weight_decay: s.len() == 2 })
            .collect();
        let moments = Moments::new(hyper, states.resolve(0.999).unwrap(), 9, infos);
        let cfg = SoapConfig { precondition_frequency: 5, shampoo_beta: 0.95, max_precond_dim: 32, ..Default::default() };
        let dims: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
        let host = LowbitSoap::new(moments, cfg, &dims);
        let copy = LowbitSoap::from_states(host.moments.clone(), host.precond.clone(), host.config);
        let mut cpu = lowbit_optim::for_device(LowbitOptimizer::Soap(copy), &Device::Cpu).unwrap();
        let mut gpu_opt = lowbit_optim::for_device(LowbitOptimizer::Soap(host), &dev).unwrap();
        let init: Vec<Vec<f32>> = shapes.iter().enumerate().map(|(i, s)| values(100 + i as u64, s.iter().product(), 0.1, false)).collect();
        let vars = |d: &Device| -> Vec<Var> {
            shapes.iter().zip(&init).map(|(s, w)| Var::from_tensor(&Tensor::from_slice(w, *s, d).unwrap()).unwrap()).collect()
        };
        let (pc, pg) = (vars(&Device::Cpu), vars(&dev));
        for t in 1..=12u64 {
            let grads: Vec<Vec<f32>> =
                shapes.iter().enumerate().map(|(i, s)| values(1000 * t + i as u64, s.iter().product(), 0.5, false)).collect();
            let gc: Vec<Tensor> = shapes.iter().zip(&grads).map(|(s, g)| Tensor::from_slice(g, *s, &Device::Cpu).unwrap()).collect();
            let gg: Vec<Tensor> = shapes.iter().zip(&grads).map(|(s, g)| Tensor::from_slice(g, *s, &dev).unwrap()).collect();
            cpu.step(t, 1e-3, GradScale::Host(1.0), &pc, &gc).unwrap();
            gpu_opt.step(t, 1e-3, GradScale::Host(1.0), &pg, &gg).unwrap();
            let (a, b): (lowbit_optim::StallCounts, lowbit_optim::StallCounts) =
                (cpu.stall_counts(t).unwrap().into_iter().sum(), gpu_opt.stall_counts(t).unwrap().into_iter().sum());
            assert_eq!(
                (a.m.elements, a.v.elements, a.precond.elements),
                (b.m.elements, b.v.elements, b.precond.elements),
                "{m_format} update {t}: elements"
            );
        }
        for (i, (c, g)) in pc.iter().zip(&pg).enumerate() {
            let c = c.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let g = g.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let moved = c.iter().zip(&init[i]).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            let diff = c.iter().zip(&g).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            println!(
                "{m_format} tensor {i} {:?}: largest move {moved:.3e}, largest GPU - CPU {diff:.3e} ({:.2e} of the move)",
                shapes[i],
                diff / moved
            );
            assert!(moved > 0.0 && diff <= tol * moved, "{m_format} tensor {i}: GPU - CPU {diff} vs move {moved}");
        }
        // the states come back from the device with both bases
        let s = gpu_opt.states().unwrap();
        let p = &s.precond.unwrap().tensors;
        assert!(p[0].q_l.len() == 32 * 32 && p[2].q_l.is_empty() && p[2].q_r.len() == 64);
    }
}

/// The direction kernel (`soap_direction`) against the reference's candle operations on the CPU
/// (`rules::soap::step::direction`), same inputs with zeros in g, m' and v: values bit for bit (NaN as
/// NaN) and both counts equal.
#[test]
fn soap_direction_matches_cpu_bit_for_bit() {
    let dev = gpu();
    let Device::Cuda(cd) = &dev else { unreachable!() };
    let stream = cd.cuda_stream();
    let k = SoapKernels::load(cd).unwrap();
    let counts = stream.alloc_zeros::<u64>(2).unwrap();
    let n = 5003;
    let g = values(21, n, 0.5, true);
    let m = values(22, n, 0.01, true);
    let v: Vec<f32> = values(23, n, 0.001, true).into_iter().map(|x| x * x).collect();
    let d =
        Direction { inv_bias_correction1: 1.0 / (1.0 - 0.9f32.powi(7)), inv_bias_correction2: 1.0 / (1.0 - 0.999f32.powi(7)), eps: 1e-8 };
    let t = |x: &[f32], on: &Device| Tensor::from_slice(x, n, on).unwrap();
    let (want, zero_grad, zero_v) = direction(&t(&g, &Device::Cpu), &t(&m, &Device::Cpu), &t(&v, &Device::Cpu), d).unwrap();
    let out = Tensor::zeros(n, DType::F32, &dev).unwrap();
    k.direction(&t(&g, &dev), &t(&m, &dev), &t(&v, &dev), &out, d, counts.device_ptr(&stream).0).unwrap();
    let (got, want) = (out.to_vec1::<f32>().unwrap(), want.to_vec1::<f32>().unwrap());
    let differ = got.iter().zip(&want).filter(|(a, b)| !same_f32(**a, **b)).count();
    assert_eq!(differ, 0, "direction: {differ} of {n} elements differ");
    assert!(zero_grad > 0 && zero_v > 0, "the inputs hold zeros ({zero_grad}, {zero_v})");
    assert_eq!(stream.clone_dtoh(&counts).unwrap(), vec![zero_grad, zero_v], "zero gradients, zero v with m' != 0");
}

/// The refresh on the GPU (`QrRefresh`: candle products, cuSOLVER QR) against the host's
/// (faer) for requests of 5 sizes up to 300 (a first basis and power steps): preconditioners
/// with well-separated eigenvalues (Q diag(λ) Qᵀ, λ_j = 1 + j), rotated, from a basis with
/// its columns shuffled. Orders equal; each column equal up to sign within 1e-3 (FP32 QR of
/// matrices whose products round differently, condition number up to 300).
#[test]
fn soap_refresh_on_gpu_matches_host() {
    let dev = gpu();
    let Device::Cuda(cd) = &dev else { unreachable!() };
    let qr = QrRefresh::new(cd).unwrap();
    let sizes = [3usize, 17, 64, 129, 300];
    let mut requests = vec![];
    for (i, &n) in sizes.iter().enumerate() {
        // an orthogonal matrix from the host's eigenbasis of a random symmetric one
        let r = values(300 + i as u64, n * n, 1.0, false);
        let sym: Vec<f32> = (0..n * n).map(|k| r[k] + r[(k % n) * n + k / n]).collect();
        let u = lowbit_optim::rules::soap::basis::eigenbasis(&sym, n).unwrap();
        let a: Vec<f32> = (0..n * n)
            .map(|k| (0..n).map(|j| f64::from(u[(k / n) * n + j]) * (1.0 + j as f64) * f64::from(u[(k % n) * n + j])).sum::<f64>() as f32)
            .collect();
        // the current basis: u's columns in a shuffled order, slightly off
        let shuffle: Vec<usize> = (0..n).map(|j| (j * 7 + 3) % n).collect();
        let noise = values(400 + i as u64, n * n, 1e-3, false);
        let q: Vec<f32> = (0..n * n).map(|k| u[(k / n) * n + shuffle[k % n]] + noise[k]).collect();
        let on = |x: &[f32], d: &Device| Tensor::from_slice(x, (n, n), d).unwrap();
        let first = i == 0;
        requests.push((on(&a, &dev), (!first).then(|| on(&q, &dev)), on(&a, &Device::Cpu), (!first).then(|| on(&q, &Device::Cpu)), n));
    }
    let req = |gpu_side: bool| -> Vec<Vec<Refresh>> {
        requests
            .iter()
            .map(|(ag, qg, ac, qc, n)| {
                let (a, q) = if gpu_side { (ag.clone(), qg.clone()) } else { (ac.clone(), qc.clone()) };
                vec![Refresh { side: 0, n: *n, a, q }]
            })
            .collect()
    };
    let got = qr.refresh_all(&req(true)).unwrap();
    let want = refresh_all(&req(false)).unwrap();
    for ((g, w), n) in got.iter().zip(&want).zip(sizes) {
        let ((gq, go), (wq, wo)) = (&g[0], &w[0]);
        assert_eq!(go, wo, "n {n}: column order");
        let (gq, wq) = (gq.flatten_all().unwrap().to_vec1::<f32>().unwrap(), wq.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        let mut worst = 0f32;
        for c in 0..n {
            let sign = if (0..n).map(|r| gq[r * n + c] * wq[r * n + c]).sum::<f32>() < 0.0 { -1.0 } else { 1.0 };
            worst = (0..n).map(|r| (gq[r * n + c] - sign * wq[r * n + c]).abs()).fold(worst, f32::max);
        }
        println!("refresh n {n}: largest |GPU - CPU| of a basis entry (up to column sign) {worst:.2e}");
        assert!(worst < 1e-3, "n {n}: bases differ by {worst}");
    }
}
