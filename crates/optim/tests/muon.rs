//! Muon (`rules::muon`): the Newton-Schulz iteration against its scalar recurrence on known
//! singular values, the momentum step against its formula bit for bit (and its stalls), the
//! update's RMS as Moonlight scales it, the tensors Muon takes, and m-only checkpoints.

use candle_core::{DType, Device, Tensor, Var};
use lowbit_optim::rules::muon::orthogonalize::{newton_schulz, orthogonalize_all, NS_COEFFICIENTS, NS_EPS};
use lowbit_optim::states::state_dict::load_state_dict;
use lowbit_optim::{GradScale, Hyper, LowbitMuon, LowbitOptimizer, Moments, MuonConfig, Optimizer, ParamInfo, StatesConfig};

/// The quintic's scalar recurrence in f64: what Newton-Schulz does to one singular value `s`
/// of a matrix whose Frobenius norm is `norm`.
fn scalar_ns(s: f64, norm: f64, steps: usize) -> f64 {
    let (a, b, c) = NS_COEFFICIENTS;
    let mut x = s / (norm + NS_EPS);
    for _ in 0..steps {
        x = a * x + b * x.powi(3) + c * x.powi(5);
    }
    x
}

/// A `rows x cols` matrix with `sigma` on its diagonal (its singular values) and zeros elsewhere.
fn diagonal(rows: usize, cols: usize, sigma: &[f32]) -> Tensor {
    let mut m = vec![0f32; rows * cols];
    for (i, s) in sigma.iter().enumerate() {
        m[i * cols + i] = *s;
    }
    Tensor::from_vec(m, (1, rows, cols), &Device::Cpu).unwrap()
}

/// On a diagonal matrix each singular value follows the scalar recurrence (to FP32's rounding
/// over 5 steps), every one of 0.02 .. 1 (relative) ends in [0.68, 1.2] (the reference's
/// coefficients' band), nothing leaves the diagonal; a tall matrix gives the transpose of the
/// wide one.
#[test]
fn newton_schulz_follows_the_scalar_recurrence() {
    let sigma: Vec<f32> = (0..12).map(|i| 0.02 + 0.98 * i as f32 / 11.0).collect();
    let norm = sigma.iter().map(|s| (*s as f64).powi(2)).sum::<f64>().sqrt();
    let wide = newton_schulz(&diagonal(12, 20, &sigma), 5).unwrap();
    let w = wide.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
    for (i, row) in w.iter().enumerate() {
        for (j, &x) in row.iter().enumerate() {
            if i == j {
                let want = scalar_ns(sigma[i] as f64, norm, 5);
                assert!((x as f64 - want).abs() <= 1e-5, "sigma {}: {x} vs the recurrence's {want}", sigma[i]);
                assert!((0.68..=1.2).contains(&x), "sigma {}: {x} outside the band", sigma[i]);
            } else {
                assert_eq!(x, 0.0, "({i}, {j}) off the diagonal");
            }
        }
    }
    let tall = newton_schulz(&diagonal(12, 20, &sigma).transpose(1, 2).unwrap(), 5).unwrap();
    let diff = (tall.transpose(1, 2).unwrap() - &wide).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff <= 1e-6, "tall vs wide: {diff}");
    // matrices of one shape batched give what each gives alone
    let a = Tensor::randn(0f32, 1.0, (16, 8), &Device::Cpu).unwrap();
    let b = Tensor::randn(0f32, 1.0, (16, 8), &Device::Cpu).unwrap();
    let both = orthogonalize_all(&[a.clone(), b.clone(), a.t().unwrap().contiguous().unwrap()], 5).unwrap();
    let alone = newton_schulz(&b.unsqueeze(0).unwrap(), 5).unwrap().squeeze(0).unwrap();
    let diff = (&both[1] - alone).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff <= 1e-6 && both[2].dims() == [8, 16], "batched vs alone: {diff}");
}

fn muon(states: StatesConfig, groups: &[(&str, &[usize])], config: MuonConfig) -> LowbitMuon {
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let infos = groups
        .iter()
        .enumerate()
        .map(|(i, (g, s))| ParamInfo { name: format!("p{i}"), group: g.to_string(), len: s.iter().product(), weight_decay: true })
        .collect();
    let moments = Moments::new(hyper, states.resolve(0.999).unwrap(), 3, infos);
    LowbitMuon::new(moments, config, &groups.iter().map(|(_, s)| s.to_vec()).collect::<Vec<_>>())
}

/// Muon takes the attention and MLP matrices; the embedding, the head, the norm gains (and a
/// vector of any group) keep AdamW's m and v.
#[test]
fn muon_takes_the_attention_and_mlp_matrices() {
    let shapes: [(&str, &[usize]); 5] = [("embed", &[10, 4]), ("attn", &[4, 4]), ("mlp", &[8, 4]), ("norm", &[4]), ("head", &[10, 4])];
    let m = muon(StatesConfig::default(), &shapes, MuonConfig::default());
    let got: Vec<(bool, usize)> = m.moments.tensors.iter().map(|t| (t.momentum.is_some(), t.v.len)).collect();
    assert_eq!(got, [(false, 40), (true, 0), (true, 0), (false, 4), (false, 40)]);
    let mo = m.moments.tensors[2].momentum.unwrap();
    assert_eq!((mo.beta, mo.nesterov, mo.rows, mo.cols), (0.95, true, 8, 4));
}

/// FP32 momentum: after two updates m is b (b m1 + (1 - b) g1)... bit for bit as the formula
/// computes it in FP32 (no FMA); the update uses the Nesterov mix of the unrounded m; BF16
/// momentum with gradients far below half a ULP of m stalls every element.
#[test]
fn momentum_is_the_formula_and_stalls_below_half_an_ulp() {
    let shapes: [(&str, &[usize]); 1] = [("mlp", &[4, 8])];
    let mut opt = muon(StatesConfig::default(), &shapes, MuonConfig::default());
    let p = Var::from_tensor(&Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap()).unwrap();
    let g1: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 7.0).collect();
    let g2: Vec<f32> = (0..32).map(|i| ((i * 7) % 11) as f32 / 3.0 - 1.5).collect();
    for (t, g) in [(1u64, &g1), (2, &g2)] {
        opt.step(t, 1e-2, GradScale::Host(1.0), std::slice::from_ref(&p), &[Tensor::from_slice(g, (4, 8), &Device::Cpu).unwrap()]).unwrap();
    }
    let (b, c) = (0.95f32, (1.0 - 0.95f64) as f32);
    let want: Vec<f32> = g1.iter().zip(&g2).map(|(x, y)| b * (b * 0.0 + c * x) + c * y).collect();
    assert_eq!(opt.moments.tensors[0].m.decode_all(), want);

    let states = StatesConfig { m_format: "bf16".into(), v_format: "bf16".into(), ..Default::default() };
    let mut opt = muon(states, &shapes, MuonConfig::default());
    let ones = Tensor::ones((4, 8), DType::F32, &Device::Cpu).unwrap();
    opt.step(1, 1e-2, GradScale::Host(1.0), std::slice::from_ref(&p), &[(&ones * 20.0).unwrap()]).unwrap(); // m = 1.0
    opt.stall_counts(1).unwrap();
    opt.step(2, 1e-2, GradScale::Host(1.0), std::slice::from_ref(&p), &[(&ones * 1.001).unwrap()]).unwrap();
    let c = opt.stall_counts(2).unwrap()[0];
    // m = 0.95 * 1 + 0.05 * 1.001 = 1.00005: a change below half of BF16's ULP at 1 (2^-8)
    assert_eq!((c.m.updated, c.m.stalled, c.v.elements), (32, 32, 0));
}

/// One update from zero momentum moves FP32 weights by an RMS of ~lr * update_rms (Moonlight's
/// scaling: 0.2 sqrt(max(rows, cols)) times an update of singular values ~1, within the
/// quintic's band), for a wide and a tall matrix; with update_rms = 0.4 twice that.
#[test]
fn the_update_rms_is_moonlights() {
    for (shape, rms) in [([32usize, 96usize], 0.2), ([96, 32], 0.2), ([32, 96], 0.4)] {
        let shapes: [(&str, &[usize]); 1] = [("attn", &shape)];
        let mut opt = muon(StatesConfig::default(), &shapes, MuonConfig { update_rms: rms, ..Default::default() });
        let p = Var::from_tensor(&Tensor::zeros((shape[0], shape[1]), DType::F32, &Device::Cpu).unwrap()).unwrap();
        let g = Tensor::randn(0f32, 1.0, (shape[0], shape[1]), &Device::Cpu).unwrap();
        opt.step(1, 1e-3, GradScale::Host(1.0), std::slice::from_ref(&p), &[g]).unwrap();
        let got = p.as_tensor().sqr().unwrap().mean_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap() as f64 / 1e-3;
        assert!((0.6 * rms..=1.2 * rms).contains(&got), "{shape:?}: update RMS {got} / lr, want ~{rms}");
    }
}

/// A Muon checkpoint holds m alone for its matrices, loads back into Muon, and is refused by
/// AdamW (and an AdamW one by Muon) naming `optim.kind`.
#[test]
fn muon_checkpoints_hold_m_alone_and_load_only_as_muon() {
    let shapes: [(&str, &[usize]); 2] = [("attn", &[4, 4]), ("norm", &[4])];
    let states = StatesConfig { m_format: "fp8".into(), v_format: "fp8".into(), ..Default::default() };
    let mut opt = muon(states.clone(), &shapes, MuonConfig::default());
    let p: Vec<Var> = shapes.iter().map(|(_, s)| Var::from_tensor(&Tensor::ones(*s, DType::F32, &Device::Cpu).unwrap()).unwrap()).collect();
    let g: Vec<Tensor> = shapes.iter().map(|(_, s)| Tensor::ones(*s, DType::F32, &Device::Cpu).unwrap()).collect();
    opt.step(1, 1e-2, GradScale::Host(1.0), &p, &g).unwrap();
    let saved = opt.states().unwrap().state_dict();
    let names: Vec<&str> = saved.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"p0.m.codes") && !names.iter().any(|k| k.starts_with("p0.v")) && names.contains(&"p1.v.codes"), "{names:?}");
    let get = |k: &str| saved.iter().find(|(n, _)| n == k).map(|(_, a)| a.clone());
    let mut fresh = LowbitOptimizer::Muon(muon(states.clone(), &shapes, MuonConfig::default()));
    fresh.load_state_dict(&mut |k| get(k)).unwrap();
    assert_eq!(fresh.moments().tensors[0].m, opt.moments.tensors[0].m);
    let mut adamw =
        Moments::new(opt.moments.hyper, states.resolve(0.999).unwrap(), 3, opt.moments.tensors.iter().map(|t| t.info.clone()).collect());
    let e = load_state_dict(&mut adamw, None, &mut |k| get(k)).unwrap_err().to_string();
    assert!(e.contains("p0.v.codes") && e.contains("optim.kind must match"), "{e}");
    let adamw_saved = lowbit_optim::states::state_dict::HostStates { moments: &adamw, precond: None }.state_dict();
    let e = fresh.load_state_dict(&mut |k| adamw_saved.iter().find(|(n, _)| n == k).map(|(_, a)| a.clone())).unwrap_err().to_string();
    assert!(e.contains("p0.v.codes") && e.contains("config asks for Muon"), "{e}");
}
