//! Muon on the GPU (`cuda::muon::CudaMuon`: the fused kernel's momentum-only mode, candle's
//! products) against the CPU reference (`rules::muon::LowbitMuon`): for every m format x
//! rounding (nearest, stochastic, dither) x Nesterov or not x weight dtype, three updates with
//! an m reset before the third: every state (Muon's m, AdamW's m and v of the other tensors)
//! and every stall count bit for bit (but the BF16 Muon matrices' weight counts), the weights
//! within a stated tolerance (the
//! Newton-Schulz products are cuBLAS's on the GPU, the CPU's gemm here); a device clip's skip
//! changes nothing.

use super::kernels::{gpu, values};
use candle_core::{DType, Device, Tensor, Var};
use lowbit_optim::{GradScale, Hyper, LowbitMuon, LowbitOptimizer, Moments, MuonConfig, Optimizer, ParamInfo, StatesConfig};

/// The model's tensors: attention and MLP matrices (Muon, two of one shape: one batch), an
/// embedding (AdamW) and a norm gain (AdamW).
const SHAPES: [(&str, &[usize]); 5] = [("attn", &[48, 48]), ("attn", &[48, 48]), ("mlp", &[96, 48]), ("embed", &[64, 48]), ("norm", &[48])];

fn optimizers(states: &StatesConfig, config: MuonConfig, dev: &Device) -> (Box<dyn Optimizer>, Box<dyn Optimizer>) {
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };
    let infos = SHAPES
        .iter()
        .enumerate()
        .map(|(i, (g, s))| ParamInfo { name: format!("p{i}"), group: g.to_string(), len: s.iter().product(), weight_decay: s.len() == 2 })
        .collect();
    let moments = Moments::new(hyper, states.resolve(0.999).unwrap(), 5, infos);
    let dims: Vec<Vec<usize>> = SHAPES.iter().map(|(_, s)| s.to_vec()).collect();
    let host = LowbitMuon::new(moments, config, &dims);
    let copy = LowbitMuon::from_moments(host.moments.clone(), host.config);
    let cpu = lowbit_optim::for_device(LowbitOptimizer::Muon(copy), &Device::Cpu).unwrap();
    (cpu, lowbit_optim::for_device(LowbitOptimizer::Muon(host), dev).unwrap())
}

fn vars(init: &[Vec<f32>], dtype: DType, d: &Device) -> Vec<Var> {
    SHAPES
        .iter()
        .zip(init)
        .map(|((_, s), w)| Var::from_tensor(&Tensor::from_slice(w, *s, d).unwrap().to_dtype(dtype).unwrap()).unwrap())
        .collect()
}

fn host(v: &Var) -> Vec<f32> {
    v.as_tensor().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn muon_matches_cpu_states_bit_for_bit_weights_within_tolerance() {
    let dev = gpu();
    let formats = [("fp32", 0), ("bf16", 0), ("fp8", 0), ("fp8", 128), ("fp4", 128), ("fp4", 64), ("int8", 128)];
    let mut cases = 0;
    for (format, block) in formats {
        for rounding in ["nearest", "stochastic", "dither"] {
            for nesterov in [true, false] {
                for dtype in [DType::F32, DType::BF16] {
                    let states = StatesConfig {
                        m_format: format.into(),
                        v_format: format.into(),
                        block_size: block,
                        m_rounding: rounding.parse().unwrap(),
                        v_rounding: rounding.parse().unwrap(),
                        m_reset_every: 2.into(),
                        ..Default::default()
                    };
                    let config = MuonConfig { nesterov, ..Default::default() };
                    let label = format!("{format} block {block} {rounding} nesterov {nesterov} {dtype:?}");
                    let (mut cpu, mut gpu_opt) = optimizers(&states, config, &dev);
                    let init: Vec<Vec<f32>> =
                        SHAPES.iter().enumerate().map(|(i, (_, s))| values(100 + i as u64, s.iter().product(), 0.1, false)).collect();
                    let (pc, pg) = (vars(&init, dtype, &Device::Cpu), vars(&init, dtype, &dev));
                    for t in 1..=3u64 {
                        let grads: Vec<Vec<f32>> = SHAPES
                            .iter()
                            .enumerate()
                            .map(|(i, (_, s))| values(1000 * t + i as u64, s.iter().product(), 0.5, false))
                            .collect();
                        let g = |d: &Device| -> Vec<Tensor> {
                            SHAPES
                                .iter()
                                .zip(&grads)
                                .map(|((_, s), g)| Tensor::from_slice(g, *s, d).unwrap().to_dtype(dtype).unwrap())
                                .collect()
                        };
                        cpu.step(t, 1e-2, GradScale::Host(1.0), &pc, &g(&Device::Cpu)).unwrap();
                        gpu_opt.step(t, 1e-2, GradScale::Host(1.0), &pg, &g(&dev)).unwrap();
                        // every count bit for bit but the BF16 Muon matrices' weights' (written from the
                        // products' results: a rounding may flip, as the weights' tolerance allows)
                        let (mut a, mut b) = (cpu.stall_counts(t).unwrap(), gpu_opt.stall_counts(t).unwrap());
                        for c in a[..3].iter_mut().chain(b[..3].iter_mut()) {
                            c.w = Default::default();
                        }
                        assert_eq!(a, b, "{label} update {t}: stall counts");
                    }
                    let (a, b) = (cpu.states().unwrap().state_dict(), gpu_opt.states().unwrap().state_dict());
                    assert_eq!(a.len(), b.len(), "{label}: arrays");
                    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
                        assert!(ka == kb && va == vb, "{label}: {ka} differs");
                    }
                    // weights: the AdamW tensors bit for bit, Muon's within 1e-3 of their move (F32) or
                    // one BF16 step of the largest weight (BF16: a rounding may flip)
                    for (i, (c, gw)) in pc.iter().zip(&pg).enumerate() {
                        let (c, gw) = (host(c), host(gw));
                        let moved = c.iter().zip(&init[i]).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                        let diff = c.iter().zip(&gw).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                        let top = init[i].iter().fold(0.0f32, |a, x| a.max(x.abs()));
                        let tol = if i >= 3 {
                            0.0
                        } else if dtype == DType::F32 {
                            1e-3 * moved
                        } else {
                            top / 128.0
                        };
                        assert!(moved > 0.0 && diff <= tol, "{label} tensor {i}: GPU - CPU {diff} vs move {moved} (tolerance {tol})");
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 7 * 3 * 2 * 2);
}

/// A device clip that says skip: weights and states stay, the step counts nothing.
#[test]
fn muon_skipped_update_changes_nothing() {
    let dev = gpu();
    let states = StatesConfig { m_format: "fp8".into(), v_format: "fp8".into(), ..Default::default() };
    let (_, mut opt) = optimizers(&states, MuonConfig::default(), &dev);
    let init: Vec<Vec<f32>> = SHAPES.iter().enumerate().map(|(i, (_, s))| values(7 + i as u64, s.iter().product(), 0.1, false)).collect();
    let p = vars(&init, DType::BF16, &dev);
    let g: Vec<Tensor> = SHAPES.iter().map(|(_, s)| Tensor::ones(*s, DType::BF16, &dev).unwrap()).collect();
    let before = opt.states().unwrap().state_dict();
    let gate = Tensor::new(&[1.0f32, 1.0], &dev).unwrap();
    opt.step(1, 1e-2, GradScale::Device(&gate), &p, &g).unwrap();
    let w: Vec<Vec<f32>> = p.iter().map(host).collect();
    let want: Vec<Vec<f32>> = vars(&init, DType::BF16, &Device::Cpu).iter().map(host).collect();
    assert_eq!(w, want, "weights after a skipped update");
    assert!(opt.states().unwrap().state_dict() == before, "states after a skipped update");
    let counts = opt.stall_counts(1).unwrap();
    assert!(
        counts.iter().all(|c| [c.m, c.v, c.w].iter().all(|k| k.updated + k.stalled + k.unchanged == 0) && c.zero_grad == 0),
        "a skipped update counted {counts:?}"
    );
}
