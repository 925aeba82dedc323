//! SOAP with low-precision states (crates/optim/src/rules/soap): the CPU reference against values
//! computed independently (numpy, float64, the equations of the module docs), exact resume
//! through the state dict, stall counts of the preconditioners, resets and sizes.

use candle_core::{Device, Tensor, Var};
use lowbit_optim::states::state_dict::{load_state_dict, Array};
use lowbit_optim::{
    GradScale, HostStates, Hyper, LowbitSoap, Moments, Optimizer, ParamInfo, ResetEvery, Rounding, SoapConfig, StateFormat, StatesConfig,
};
use std::collections::HashMap;

const W0: [f32; 6] = [0.5, -0.25, 0.125, 0.75, -0.5, 0.375];
const B0: [f32; 2] = [1.0, -1.0];
const G: [[f32; 6]; 4] = [
    [0.3, -0.2, 0.1, 0.4, -0.5, 0.25],
    [-0.1, 0.6, 0.2, -0.3, 0.4, 0.1],
    [0.25, 0.15, -0.35, 0.05, 0.2, -0.45],
    [0.05, -0.3, 0.45, 0.2, -0.15, 0.35],
];
const GB: [[f32; 2]; 4] = [[0.2, -0.1], [0.3, 0.05], [-0.1, 0.2], [0.0, 0.4]];

/// A 3 x 2 matrix and a vector of 2 under SOAP with `states`.
fn soap(states: StatesConfig, cfg: SoapConfig, seed: u64) -> LowbitSoap {
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let infos = vec![
        ParamInfo { name: "w".into(), group: "mlp".into(), len: 6, weight_decay: true },
        ParamInfo { name: "b".into(), group: "norm".into(), len: 2, weight_decay: false },
    ];
    let moments = Moments::new(hyper, states.resolve(0.999).unwrap(), seed, infos);
    LowbitSoap::new(moments, cfg, &[vec![3, 2], vec![2]])
}

/// Every state of `opt` by name (what a checkpoint saves).
fn saved(opt: &LowbitSoap) -> HashMap<String, Array> {
    HostStates { moments: &opt.moments, precond: Some(&opt.precond) }.state_dict().into_iter().collect()
}

fn params() -> Vec<Var> {
    vec![
        Var::from_tensor(&Tensor::from_slice(&W0, (3, 2), &Device::Cpu).unwrap()).unwrap(),
        Var::from_tensor(&Tensor::from_slice(&B0, 2, &Device::Cpu).unwrap()).unwrap(),
    ]
}

fn grads(t: usize) -> Vec<Tensor> {
    let k = (t - 1) % 4;
    vec![Tensor::from_slice(&G[k], (3, 2), &Device::Cpu).unwrap(), Tensor::from_slice(&GB[k], 2, &Device::Cpu).unwrap()]
}

fn values(p: &[Var]) -> Vec<f32> {
    p.iter().flat_map(|v| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
}

fn run(opt: &mut LowbitSoap, p: &[Var], steps: std::ops::RangeInclusive<usize>) {
    for t in steps {
        opt.step(t as u64, 0.1, GradScale::Host(1.0), p, &grads(t)).unwrap();
        opt.stall_counts(t as u64).unwrap();
    }
}

/// Refresh interval 1, FP32 states: four updates equal SOAP's equations computed in float64 by
/// numpy (eigh for the first bases, one QR power step with the columns sorted by their
/// eigenvalue estimate at every later update; the left basis's columns 1 and 2 swap at update
/// 2, so v's rows move): the weights within 2e-6. The vector steps as plain Adam.
#[test]
fn refresh_every_update_matches_the_reference_maths() {
    let cfg = SoapConfig { precondition_frequency: 1, shampoo_beta: 0.95, max_precond_dim: 10_000, ..Default::default() };
    let mut opt = soap(StatesConfig::default(), cfg, 0);
    let p = params();
    run(&mut opt, &p, 1..=4);
    // scripts/soap_reference.py (numpy 2.4, float64)
    let want = [0.5056718322, -0.456067536, 0.0746796701, 0.8488937622, -0.6703868702, 0.3271989982, 0.6977434705, -0.9881445504];
    let got = values(&p);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() < 2e-6, "element {i}: {g} vs {w}");
    }
}

/// The first update of a matrix only builds its bases: its weights and moments stay, its L and
/// R hold (1 - bs) G Gᵀ and (1 - bs) Gᵀ G; the vector steps at once.
#[test]
fn first_update_builds_the_bases_only() {
    let cfg = SoapConfig { precondition_frequency: 10, shampoo_beta: 0.5, max_precond_dim: 10_000, ..Default::default() };
    let mut opt = soap(StatesConfig::default(), cfg, 0);
    let p = params();
    run(&mut opt, &p, 1..=1);
    let got = values(&p);
    assert_eq!(&got[..6], &W0[..]);
    assert_ne!(&got[6..], &B0[..]);
    let t = &opt.moments.tensors[0];
    assert!(t.m.decode_all().iter().chain(&t.v.decode_all()).all(|&x| x == 0.0));
    let pc = &opt.precond.tensors[0];
    let g = G[0];
    let l: Vec<f32> = (0..9).map(|k| 0.5 * (0..2).map(|c| g[(k / 3) * 2 + c] * g[(k % 3) * 2 + c]).sum::<f32>()).collect();
    assert_eq!(pc.l.as_ref().unwrap().decode_all(), l);
    assert_eq!((pc.q_l.len(), pc.q_r.len()), (9, 4));
    // the vector has no preconditioner
    let pv = &opt.precond.tensors[1];
    assert!(pv.l.is_none() && pv.r.is_none() && pv.q_l.is_empty());
}

/// FP8 states with stochastic rounding: six updates straight equal three, a save through the
/// state dict, a fresh optimizer loading it and three more, bit for bit (weights, every state
/// and both bases; the refresh at update 5 included).
#[test]
fn resume_through_the_state_dict_is_exact() {
    let states = StatesConfig {
        m_format: "fp8".into(),
        v_format: "fp8".into(),
        m_rounding: Rounding::Stochastic,
        v_rounding: Rounding::Stochastic,
        block_size: 0,
        ..Default::default()
    };
    let cfg = SoapConfig { precondition_frequency: 5, shampoo_beta: 0.9, max_precond_dim: 10_000, ..Default::default() };
    let mut a = soap(states.clone(), cfg, 3);
    let pa = params();
    run(&mut a, &pa, 1..=6);

    let mut b = soap(states.clone(), cfg, 3);
    let pb = params();
    run(&mut b, &pb, 1..=3);
    let saved = saved(&b);
    assert!(saved.contains_key("w.soap_l.codes") && saved.contains_key("w.soap_q_r") && !saved.contains_key("b.soap_l.codes"));
    let states_again = states.clone();
    let mut c = soap(states, cfg, 3);
    load_state_dict(&mut c.moments, Some(&mut c.precond), &mut |k| saved.get(k).cloned()).unwrap();
    run(&mut c, &pb, 4..=6);
    assert_eq!(values(&pa).iter().map(|x| x.to_bits()).collect::<Vec<_>>(), values(&pb).iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(a.precond, c.precond);
    assert_eq!(self::saved(&a), self::saved(&c));

    // an AdamW optimizer refuses SOAP's states, naming the key; SOAP refuses AdamW's; another
    // largest preconditioned dimension (the matrix's 3 rows no longer preconditioned) is refused
    let mut adamw = soap(states_again.clone(), cfg, 3).moments;
    let e = load_state_dict(&mut adamw, None, &mut |k| saved.get(k).cloned()).unwrap_err().to_string();
    assert!(e.contains("w.soap_l.codes") && e.contains("SOAP's states") && e.contains("optim.kind"), "{e}");
    let adamw_saved: HashMap<String, Array> = HostStates { moments: &adamw, precond: None }.state_dict().into_iter().collect();
    let mut c = soap(states_again.clone(), cfg, 3);
    let e = load_state_dict(&mut c.moments, Some(&mut c.precond), &mut |k| adamw_saved.get(k).cloned()).unwrap_err().to_string();
    assert!(e.contains("AdamW's states") && e.contains("optim.kind"), "{e}");
    let narrow = SoapConfig { max_precond_dim: 2, ..cfg };
    let mut c = soap(states_again, narrow, 3);
    let e = load_state_dict(&mut c.moments, Some(&mut c.precond), &mut |k| saved.get(k).cloned()).unwrap_err().to_string();
    assert!(e.contains("w.soap_l.codes") && e.contains("max_precond_dim"), "{e}");
}

/// Counts: after the first update every update writes m and v of both tensors (8 elements)
/// and L and R of the matrix (9 + 4 elements, `precond`); BF16 states stall some of them with
/// b = 0.999 over small gradients. Sizes: FP8 L and R with one scale each, plus FP32 bases.
#[test]
fn preconditioners_are_counted_and_sized() {
    let states = StatesConfig { m_format: "bf16".into(), v_format: "bf16".into(), ..Default::default() };
    let cfg = SoapConfig { precondition_frequency: 10, shampoo_beta: 0.999, max_precond_dim: 10_000, ..Default::default() };
    let mut opt = soap(states, cfg, 0);
    let p = params();
    let g = grads(1);
    opt.step(1, 0.1, GradScale::Host(1.0), &p, &g).unwrap();
    let first: lowbit_optim::StallCounts = opt.stall_counts(1).unwrap().into_iter().sum();
    assert_eq!((first.m.elements, first.v.elements, first.precond.elements), (2, 2, 13));
    let mut stalled = 0;
    for t in 2..=20u64 {
        opt.step(t, 0.1, GradScale::Host(1e-3), &p, &grads(t as usize)).unwrap();
        let c: lowbit_optim::StallCounts = opt.stall_counts(t).unwrap().into_iter().sum();
        assert_eq!((c.m.elements, c.v.elements, c.precond.elements), (8, 8, 13));
        stalled += c.precond.stalled;
    }
    assert!(stalled > 0, "BF16 preconditioners at bs = 0.999 stall");

    let fp8 = StatesConfig { m_format: "fp8".into(), v_format: "fp8".into(), block_size: 0, ..Default::default() };
    let o = soap(fp8, cfg, 0);
    // m, v: 8 bytes + 2 scales each tensor (4 x 4 B); L: 9 B + 4 B, R: 4 B + 4 B; bases 36 + 16 floats
    assert_eq!(
        HostStates { moments: &o.moments, precond: Some(&o.precond) }.state_bytes(),
        2 * (6 + 4) + 2 * (2 + 4) + (9 + 4) + (4 + 4) + 4 * (9 + 4)
    );
}

/// A reset of v (period 3: before update 4) zeroes v and both preconditioners: with FP32
/// states, L after update 4 is exactly (1 - bs) G4 G4ᵀ; m (never reset) keeps its history.
#[test]
fn a_reset_of_v_zeroes_the_preconditioners() {
    let states = StatesConfig { v_reset_every: ResetEvery::Steps(3), ..Default::default() };
    let cfg = SoapConfig { precondition_frequency: 10, shampoo_beta: 0.5, max_precond_dim: 10_000, ..Default::default() };
    let mut opt = soap(states, cfg, 0);
    let p = params();
    run(&mut opt, &p, 1..=4);
    let g = G[3];
    let l: Vec<f32> = (0..9).map(|k| 0.5 * (0..2).map(|c| g[(k / 3) * 2 + c] * g[(k % 3) * 2 + c]).sum::<f32>()).collect();
    assert_eq!(opt.precond.tensors[0].l.as_ref().unwrap().decode_all(), l);
    let m = opt.moments.tensors[0].m.decode_all();
    let fresh: Vec<f32> = G[3].iter().map(|x| 0.1 * x).collect();
    assert_ne!(m, fresh, "m was not reset");
}

/// A side longer than `max_precond_dim` keeps no preconditioner (the embedding's rows): a 3 x 2
/// matrix with a limit of 2 is rotated on its right side only.
#[test]
fn long_sides_are_not_preconditioned() {
    let cfg = SoapConfig { precondition_frequency: 10, shampoo_beta: 0.95, max_precond_dim: 2, ..Default::default() };
    let mut opt = soap(StatesConfig::default(), cfg, 0);
    let pc = &opt.precond.tensors[0];
    assert!(pc.l.is_none() && pc.r.is_some());
    let p = params();
    run(&mut opt, &p, 1..=3);
    assert!(values(&p)[..6] != W0[..]);
}

/// `precond_format` stores L and R in their own format: with FP8 moments (one scale per tensor)
/// and FP32 preconditioners, L after update 1 is exactly (1 - bs) G1 G1ᵀ (FP8 L is not: its
/// grid rounds it), m and v stay FP8, and the bytes shrink or grow with the format.
#[test]
fn preconditioners_take_their_own_format() {
    let states = StatesConfig { m_format: "fp8".into(), v_format: "fp8".into(), block_size: 0, ..Default::default() };
    let base = SoapConfig { precondition_frequency: 10, shampoo_beta: 0.5, max_precond_dim: 10_000, ..Default::default() };
    let fp32 = SoapConfig { precond_format: Some(StateFormat::Fp32), ..base };
    let g = G[0];
    let exact: Vec<f32> = (0..9).map(|k| 0.5 * (0..2).map(|c| g[(k / 3) * 2 + c] * g[(k % 3) * 2 + c]).sum::<f32>()).collect();
    let mut l = vec![];
    let mut bytes = vec![];
    for cfg in [base, fp32] {
        let mut opt = soap(states.clone(), cfg, 0);
        let p = params();
        run(&mut opt, &p, 1..=1);
        let pc = &opt.precond.tensors[0];
        assert_eq!(opt.moments.tensors[0].m.format, StateFormat::Fp8E4M3);
        l.push((pc.l.as_ref().unwrap().format, pc.l.as_ref().unwrap().decode_all()));
        bytes.push(pc.bytes());
    }
    assert_eq!(l[0].0, StateFormat::Fp8E4M3);
    assert_ne!(l[0].1, exact, "FP8 rounds L");
    assert_eq!(l[1], (StateFormat::Fp32, exact));
    // L 3 x 3 and R 2 x 2: 13 codes of 1 byte + 2 scales, or 13 FP32 values; both + FP32 bases
    assert_eq!(bytes, vec![13 + 8 + 52, 52 + 52]);
}
