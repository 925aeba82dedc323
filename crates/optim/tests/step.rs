//! The CPU reference step: agreement with textbook AdamW, resets, v monotonicity under
//! nearest BF16, stall accounting.

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::states::format::bf16;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, StallCounts, StatesConfig};
use proptest::prelude::*;

const HYPER: Hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };

/// Update `t` of tensor `i` alone: the update's plan, then the tensor's CPU step.
fn step_one(o: &mut LowbitAdamW, t: u64, lr: f64, grad_scale: f32, i: usize, w: Weights, g: &[f32]) -> StallCounts {
    let plan = o.moments.plan(t, lr, grad_scale).unwrap();
    o.step_cpu(&plan, i, w, g)
}

fn opt(m: &str, v: &str, cfg: impl Fn(&mut StatesConfig), len: usize) -> LowbitAdamW {
    let mut s = StatesConfig { m_format: m.into(), v_format: v.into(), ..Default::default() };
    cfg(&mut s);
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len, weight_decay: true };
    LowbitAdamW::new(HYPER, s.resolve(0.999).unwrap(), 1, vec![info])
}

fn grads(step: u64, n: usize) -> Vec<f32> {
    (0..n).map(|i| (((i as u64 * 7919 + step * 104729) % 1000) as f32 / 500.0 - 1.0) * 1e-2).collect()
}

#[test]
fn fp32_states_match_textbook_adamw_in_f64() {
    let n = 1000;
    let mut o = opt("fp32", "fp32", |_| {}, n);
    let mut w: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32) - 0.5).collect();
    let (mut p64, mut m64, mut v64) = (w.iter().map(|&x| x as f64).collect::<Vec<_>>(), vec![0f64; n], vec![0f64; n]);
    let lr = 1e-2;
    for t in 1..=20u64 {
        let g = grads(t, n);
        step_one(&mut o, t, lr, 1.0, 0, Weights::F32(&mut w), &g);
        for i in 0..n {
            let gi = g[i] as f64;
            m64[i] = 0.9 * m64[i] + 0.1 * gi;
            v64[i] = 0.999 * v64[i] + 0.001 * gi * gi;
            let mh = m64[i] / (1.0 - 0.9f64.powi(t as i32));
            let vh = v64[i] / (1.0 - 0.999f64.powi(t as i32));
            p64[i] = p64[i] * (1.0 - lr * 0.1) - lr * mh / (vh.sqrt() + 1e-8);
        }
    }
    for i in 0..n {
        assert!((w[i] as f64 - p64[i]).abs() < 1e-5, "{i}: {} vs {}", w[i], p64[i]);
    }
}

#[test]
fn reset_zeroes_the_state_and_restarts_bias_correction() {
    let n = 256;
    let mut o = opt(
        "bf16",
        "bf16",
        |s| {
            s.m_reset_every = 3.into();
            s.v_reset_every = 3.into();
        },
        n,
    );
    let mut w = vec![0.25f32; n];
    for t in 1..=3 {
        step_one(&mut o, t, 1e-3, 1.0, 0, Weights::F32(&mut w), &grads(t, n));
    }
    let g4 = grads(4, n);
    step_one(&mut o, 4, 1e-3, 1.0, 0, Weights::F32(&mut w), &g4);
    // after the reset at step 4, m = (1 - b1) g and v = (1 - b2) g^2 (rounded to bf16)
    let m = o.moments.tensors[0].m.decode_all();
    let v = o.moments.tensors[0].v.decode_all();
    for i in 0..n {
        let want_m = bf16::decode(bf16::encode(0.1f32 * g4[i], lowbit_optim::Rounding::Nearest, 0));
        let want_v = bf16::decode(bf16::encode(0.001f32 * (g4[i] * g4[i]), lowbit_optim::Rounding::Nearest, 0));
        assert_eq!(m[i], want_m, "m[{i}]");
        assert_eq!(v[i], want_v, "v[{i}]");
    }
    let s = o.moments.plan(4, 1e-3, 1.0).unwrap().tensors[0].scalars;
    assert!(s.reset_m && s.reset_v);
    assert_eq!(s.inv_bias_correction1, 10.0f32);
}

/// The counters of one step: updated / stalled (lowbit's estimator), unchanged / elements (the
/// paper's, zero gradients included) and the zero gradients themselves. BF16 m and v after one
/// step: a zero gradient decays m by 0.9 (a change) and v by 0.999 (below half a BF16 ULP,
/// 2^-9: stalled, unchanged); a gradient 20x the first moves both.
#[test]
fn counters_split_updates_from_unchanged_entries() {
    let n = 64;
    let mut o = opt("bf16", "bf16", |_| {}, n);
    let mut w = vec![0.0f32; n];
    step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![1e-2; n]);
    // half the gradients zero, half 20x the first
    let g: Vec<f32> = (0..n).map(|i| if i % 2 == 0 { 0.0 } else { 0.2 }).collect();
    let c = step_one(&mut o, 2, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
    assert_eq!(c.zero_grad, 32);
    assert_eq!((c.m.elements, c.v.elements, c.w.elements), (64, 64, 0));
    // m: every element changes (0.9 m + 0.1 g differs from m), none stalls at BF16's 2^-8
    assert_eq!((c.m.updated, c.m.stalled, c.m.unchanged), (64, 0, 0));
    assert_eq!((c.v.updated, c.v.stalled, c.v.unchanged), (64, 32, 32));
    assert_eq!((c.v.fraction(), c.v.unchanged_fraction()), (Some(0.5), Some(0.5)));
    // one step later with zero gradients only: m and v decay; v's entries all stay
    let c = step_one(&mut o, 3, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![0.0; n]);
    assert_eq!((c.zero_grad, c.v.updated, c.v.unchanged), (64, 64, 64));
}

/// A v reset without an m reset (the paper's asymmetric policy, Table 6) is allowed; at its
/// first update every element with a zero gradient has v = 0 and moves by lr * m / eps, which
/// the step's zero-gradient count exposes.
#[test]
fn v_only_reset_moves_zero_gradient_elements_by_lr_m_over_eps() {
    let n = 8;
    let mut o = opt("fp32", "fp32", |s| s.v_reset_every = 2.into(), n);
    assert!(o.moments.spec.resets_v_without_m());
    let mut w = vec![0.0f32; n];
    for t in 1..=2 {
        step_one(&mut o, t, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![1e-2; n]);
    }
    let before = w.clone();
    let m_before = o.moments.tensors[0].m.decode_all();
    let g: Vec<f32> = (0..n).map(|i| if i < 3 { 0.0 } else { 1e-2 }).collect();
    let s = o.moments.plan(3, 1e-3, 1.0).unwrap().tensors[0].scalars;
    assert!(s.reset_v && !s.reset_m);
    let c = step_one(&mut o, 3, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
    assert_eq!(c.zero_grad, 3);
    assert_eq!(c.zero_v, 3, "the three zero-gradient elements moved with v = 0, m != 0");
    for i in 0..3 {
        let m_hat = 0.9 * m_before[i] as f64 / (1.0 - 0.9f64.powi(3));
        let moved = (before[i] - w[i]) as f64;
        assert!((moved - 1e-3 * m_hat / 1e-8).abs() <= 1e-3 * moved.abs(), "{i}: moved {moved}, lr m/eps {}", 1e-3 * m_hat / 1e-8);
    }
}

/// The paper's FP8 (E4M3, one amax scale per tensor, zero kept): a v more than 2^-9 / 448 below
/// the tensor's largest rounds to 0 under nearest rounding (E4M3's smallest subnormal is
/// 2^-9 of the scale unit amax / 448), so with a zero gradient at the next update the element
/// moves by lr * m^ / eps: `zero_v` counts exactly those. The zero-free v (`v_zero =
/// "exclude"`) keeps them at the smallest code: none.
#[test]
fn zero_v_counts_the_updates_of_a_v_rounded_to_zero() {
    let n = 8;
    // element 0 large, elements 1..4 a gradient 1e-4 of it (v 1e-8 of v0: rounds to 0), 4..8 zero
    let g1: Vec<f32> = (0..n)
        .map(|i| match i {
            0 => 1.0,
            1..4 => 1e-4,
            _ => 0.0,
        })
        .collect();
    let g2: Vec<f32> = (0..n).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect();
    for (v_zero, want) in [(lowbit_optim::VZero::Keep, 3), (lowbit_optim::VZero::Exclude, 0)] {
        let mut o = opt(
            "fp8",
            "fp8",
            |s| {
                s.block_size = 0;
                s.scale = lowbit_optim::ScaleChoice::Amax;
                s.v_zero = v_zero;
            },
            n,
        );
        let mut w = vec![0.0f32; n];
        let c = step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g1);
        assert_eq!(c.zero_v, 0, "step 1: every element with m != 0 has v != 0");
        let v = o.moments.tensors[0].v.decode_all();
        assert_eq!(v[1..4].iter().all(|&x| x == 0.0), want == 3, "{v_zero:?}: stored v {v:?}");
        let before = w.clone();
        let c = step_one(&mut o, 2, 1e-3, 1.0, 0, Weights::F32(&mut w), &g2);
        assert_eq!((c.zero_v, c.zero_grad), (want, 7), "{v_zero:?}");
        if want == 3 {
            let moved = (before[1] - w[1]).abs() as f64;
            assert!(moved > 1.0, "lr * m^ / eps with m ~ 1e-5 and eps 1e-8: a step of ~1, moved {moved}");
        }
    }
}

/// `v_reset_idle = "keep"`: at the same v-only reset, the zero-gradient elements keep their v
/// (and move by about lr * m_hat / sqrt(v_hat), a normal step) while the others restart v.
#[test]
fn v_only_reset_can_keep_the_v_of_zero_gradient_elements() {
    let n = 8;
    let mut o = opt(
        "fp32",
        "fp32",
        |s| {
            s.v_reset_every = 2.into();
            s.v_reset_idle = lowbit_optim::VResetIdle::Keep;
        },
        n,
    );
    let mut w = vec![0.0f32; n];
    for t in 1..=2 {
        step_one(&mut o, t, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![1e-2; n]);
    }
    let (before, v_before) = (w.clone(), o.moments.tensors[0].v.decode_all());
    let g: Vec<f32> = (0..n).map(|i| if i < 3 { 0.0 } else { 1e-2 }).collect();
    assert!(o.moments.plan(3, 1e-3, 1.0).unwrap().tensors[0].scalars.keep_idle_v);
    assert_eq!(step_one(&mut o, 3, 1e-3, 1.0, 0, Weights::F32(&mut w), &g).zero_v, 0, "no element moved with v = 0");
    let v = o.moments.tensors[0].v.decode_all();
    for i in 0..n {
        let want = if i < 3 { 0.999 * v_before[i] } else { 0.001 * 1e-4 };
        assert!((v[i] - want).abs() <= 1e-6 * want, "{i}: v {} want {want}", v[i]);
        let moved = (before[i] - w[i]).abs();
        assert!(moved < 2e-3, "{i}: moved {moved}, a normal step (lr 1e-3 x about 1)");
    }
    // m and v reset together: every element restarts (the guard only acts on v-only resets)
    let mut o = opt(
        "fp32",
        "fp32",
        |s| {
            s.m_reset_every = 2.into();
            s.v_reset_every = 2.into();
            s.v_reset_idle = lowbit_optim::VResetIdle::Keep;
        },
        n,
    );
    assert!(!o.moments.plan(3, 1e-3, 1.0).unwrap().tensors[0].scalars.keep_idle_v);
}

/// The adaptive rule (Alg. 2) inside the optimizer: with v stalled entirely (fraction 1) the
/// first decision that sees a measurement resets m and v and restarts bias correction; updates
/// decided before need no measurement.
#[test]
fn adaptive_resets_follow_the_observed_stalled_fraction() {
    use lowbit_optim::states::reset::ADAPTIVE_LAG;
    use lowbit_optim::ResetRule;
    let n = 16;
    let mut o = opt("bf16", "bf16", |s| s.reset = ResetRule::Adaptive, n);
    let mut w = vec![0.0f32; n];
    let stalled = |n: u64| {
        let mut c = StallCounts::default();
        c.v.unchanged = n;
        c.v.elements = n;
        c
    };
    for t in 1..=ADAPTIVE_LAG + 1 {
        let plan = o.moments.plan(t, 1e-3, 1.0).unwrap();
        assert!(!plan.tensors[0].scalars.reset_v);
        o.step_cpu(&plan, 0, Weights::F32(&mut w), &grads(t, n));
        o.moments.observe(t, &stalled(n as u64));
    }
    let t = ADAPTIVE_LAG + 2;
    let s = o.moments.plan(t, 1e-3, 1.0).unwrap().tensors[0].scalars;
    assert!(s.reset_m && s.reset_v);
    assert_eq!((s.inv_bias_correction1, s.inv_bias_correction2), (10.0, (1.0 / (1.0 - 0.999f64)) as f32));
    // a missing measurement is an error
    let mut o = opt("bf16", "bf16", |s| s.reset = ResetRule::Adaptive, n);
    assert!(o.moments.plan(ADAPTIVE_LAG + 2, 1e-3, 1.0).unwrap_err().to_string().contains("not observed"));
}

#[test]
fn state_memory_matches_the_format() {
    let n = 1 << 16;
    assert_eq!(opt("fp32", "fp32", |_| {}, n).moments.state_bytes(), 8 * n);
    assert_eq!(opt("bf16", "bf16", |_| {}, n).moments.state_bytes(), 4 * n);
    // fp8 m + v: 2 bytes per element + one 4-byte scale per 128-element block each
    assert_eq!(opt("fp8", "fp8", |_| {}, n).moments.state_bytes(), 2 * n + 2 * 4 * n / 128);
    assert_eq!(opt("fp4", "fp4", |_| {}, n).moments.state_bytes(), n + 2 * 4 * n / 128);
}

#[test]
fn stochastic_rounding_is_deterministic_per_seed_and_step() {
    let n = 5000;
    let run = |seed: u64| {
        let mut o = opt(
            "fp8",
            "fp4",
            |s| {
                s.m_rounding = lowbit_optim::Rounding::Stochastic;
                s.v_rounding = lowbit_optim::Rounding::Stochastic;
            },
            n,
        );
        o.moments.seed = seed;
        let mut w = vec![0.1f32; n];
        let mut counts = vec![];
        for t in 1..=5 {
            counts.push(step_one(&mut o, t, 1e-3, 1.0, 0, Weights::F32(&mut w), &grads(t, n)));
        }
        (w, o.moments.tensors[0].m.code_bytes(), o.moments.tensors[0].v.code_bytes(), counts)
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1).1, run(2).1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// With nearest rounding of a bf16 v at b2 = 0.999, the relative decrease of v per step
    /// (at most 0.1%) is below half a bf16 ULP (>= 2^-9 relative): v never decreases.
    #[test]
    fn bf16_nearest_v_never_decreases(
        gs in prop::collection::vec(prop::collection::vec(-1e-2f32..1e-2, 64), 1..30),
        zero_mask in prop::collection::vec(any::<bool>(), 64),
    ) {
        let mut o = opt("bf16", "bf16", |_| {}, 64);
        let mut w = vec![0.0f32; 64];
        let mut prev = o.moments.tensors[0].v.decode_all();
        for (t, g) in gs.iter().enumerate() {
            // many elements see zero gradients, so v would only decay
            let g: Vec<f32> = g.iter().zip(&zero_mask).map(|(&x, &z)| if z && t > 0 { 0.0 } else { x }).collect();
            step_one(&mut o, t as u64 + 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
            let v = o.moments.tensors[0].v.decode_all();
            for i in 0..64 {
                prop_assert!(v[i] >= prev[i], "step {} elem {}: {} < {}", t + 1, i, v[i], prev[i]);
            }
            prev = v;
        }
    }
}

#[test]
fn bf16_weights_count_stalls() {
    let n = 4096;
    let mut o = opt("fp32", "fp32", |_| {}, n);
    let mut w: Vec<u16> = (0..n).map(|_| bf16::encode(1.0, lowbit_optim::Rounding::Nearest, 0)).collect();
    // lr 1e-4 moves a weight of 1.0 by ~1e-4, far below half a bf16 ULP at 1.0 (2^-8):
    // every update stalls with nearest rounding.
    let s = step_one(&mut o, 1, 1e-4, 1.0, 0, Weights::Bf16(&mut w), &grads(1, n));
    assert!(s.w.updated > 4000);
    assert_eq!(s.w.stalled, s.w.updated);
    assert!(w.iter().all(|&x| bf16::decode(x) == 1.0));
}

/// int8 blocks with a tiny absmax (below 2^-128 the plain reciprocal 1 / absmax overflows)
/// are normalized like every other block (`int8::normalizer`): the largest element keeps
/// code 255, smaller ones land next to their value, zeros stay zero (with an infinite
/// reciprocal every nonzero element would saturate to an end of the map).
#[test]
fn int8_blocks_with_subnormal_absmax_keep_their_values() {
    use lowbit_optim::rules::adamw::step::{encode_block, BlockWrite, Skip};
    use lowbit_optim::states::format::{int8, Rounding, StateFormat};
    use lowbit_optim::ScaleKind;
    let t = int8::dynamic_map(true);
    for absmax in [1e-39f32, f32::from_bits(3), 1e-30] {
        let x = [absmax, -absmax / 2.0, 0.0, absmax / 4.0];
        let (mut codes, mut scale) = ([0u8; 4], 1.0f32);
        encode_block(
            StateFormat::Int8,
            true,
            false,
            ScaleKind::Pow2,
            &mut codes,
            &mut scale,
            &x,
            &BlockWrite::plain(Rounding::Nearest, 0),
            0,
            Skip::NEVER,
        );
        assert_eq!(scale, absmax);
        assert_eq!(codes[0], 255, "absmax {absmax:e}");
        assert_eq!(codes[2], t.zero_index(), "absmax {absmax:e}");
        for j in [1, 3] {
            let back = t[codes[j] as usize] * absmax;
            assert!((back - x[j]).abs() <= 0.02 * absmax, "absmax {absmax:e}: {} -> {back:e}", x[j]);
        }
    }
}

/// Through the `Optimizer` trait, a gate decided on the device (`GradScale::Device`, here a
/// CPU tensor `[factor, skip]`): without skip the step is the host factor's, bit for bit;
/// with skip nothing changes (weights and states), and the same update number steps later.
#[test]
fn a_device_gate_steps_with_its_factor_or_skips() {
    use candle_core::{Device, Tensor, Var};
    use lowbit_optim::{GradScale, Optimizer};
    let n = 300;
    let w0: Vec<f32> = (0..n).map(|i| 0.01 * (i % 97) as f32 - 0.4).collect();
    let g = grads(1, n);
    let tensor = |v: &[f32]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap();
    let var = || Var::from_tensor(&tensor(&w0)).unwrap();
    let states = |o: &LowbitAdamW| (o.moments.tensors[0].m.codes.clone(), o.moments.tensors[0].v.codes.clone());
    let (mut host, mut gated) = (opt("fp8e4m3", "fp8e4m3", |_| {}, n), opt("fp8e4m3", "fp8e4m3", |_| {}, n));
    let (wh, wg) = ([var()], [var()]);
    let fresh = states(&gated);
    // skipped: nothing moves
    Optimizer::step(&mut gated, 1, 1e-2, GradScale::Device(&tensor(&[0.25, 1.0])), &wg, &[tensor(&g)]).unwrap();
    assert_eq!(wg[0].as_tensor().to_vec1::<f32>().unwrap(), w0);
    assert_eq!(states(&gated), fresh);
    // the same update with the gate's factor: the host factor's step
    Optimizer::step(&mut host, 1, 1e-2, GradScale::Host(0.25), &wh, &[tensor(&g)]).unwrap();
    Optimizer::step(&mut gated, 1, 1e-2, GradScale::Device(&tensor(&[0.25, 0.0])), &wg, &[tensor(&g)]).unwrap();
    let (a, b) = (wh[0].as_tensor().to_vec1::<f32>().unwrap(), wg[0].as_tensor().to_vec1::<f32>().unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a != w0);
    assert_eq!(states(&host), states(&gated));
    assert_ne!(states(&gated), fresh);
}
