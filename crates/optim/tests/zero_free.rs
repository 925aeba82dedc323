//! Second moment without zero (docs/numerics.md, "Second moment without zero"): in a block-scaled v
//! a small element's v must not round to 0 while its m does not, or the element moves by
//! lr * m / eps. For every block-scaled format x rounding: one large and many tiny second
//! moments in a block, then zero gradients; each tiny element's total displacement stays
//! within 10x of what FP32 states give on the same gradients (an overestimated v only slows
//! an element: the floor's cost), nothing NaN/Inf; `v_zero = "keep"` still shows the fault.

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, Rounding, ScaleKind, StallCounts, StatesConfig, VZero};

const HYPER: Hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };

/// Update `t` of tensor `i` alone: the update's plan, then the tensor's CPU step.
fn step_one(o: &mut LowbitAdamW, t: u64, lr: f64, grad_scale: f32, i: usize, w: Weights, g: &[f32]) -> StallCounts {
    let plan = o.moments.plan(t, lr, grad_scale).unwrap();
    o.step_cpu(&plan, i, w, g)
}
const LR: f64 = 1e-3;
const BLOCK: usize = 128;

fn opt(m: &str, v: &str, rounding: Rounding, v_zero: VZero) -> LowbitAdamW {
    opt_scaled(m, v, rounding, v_zero, None)
}

/// As [`opt`], with the scale kind of fp8/fp4 states (`None`: each format's default).
fn opt_scaled(m: &str, v: &str, rounding: Rounding, v_zero: VZero, scale: Option<ScaleKind>) -> LowbitAdamW {
    let s = StatesConfig {
        scale: scale.map_or(Default::default(), Into::into),
        m_format: m.into(),
        v_format: v.into(),
        m_rounding: rounding,
        v_rounding: rounding,
        v_zero,
        block_size: BLOCK,
        ..Default::default()
    };
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: BLOCK, weight_decay: false };
    LowbitAdamW::new(HYPER, s.resolve(0.999).unwrap(), 7, vec![info])
}

/// Step 1: gradient 1 for element 0 and `tiny` for the other 127; then `zero_steps` steps of
/// zero gradients for all. Returns each element's displacement |w_end - w_0| in units of lr.
fn displacement(o: &mut LowbitAdamW, tiny: f32, zero_steps: u64) -> Vec<f64> {
    let mut w = vec![0.0f32; BLOCK];
    let mut g = vec![tiny; BLOCK];
    g[0] = 1.0;
    step_one(o, 1, LR, 1.0, 0, Weights::F32(&mut w), &g);
    let zero = vec![0.0f32; BLOCK];
    for t in 2..=1 + zero_steps {
        step_one(o, t, LR, 1.0, 0, Weights::F32(&mut w), &zero);
    }
    w.iter().map(|&x| (x as f64).abs() / LR).collect()
}

/// Block-scaled (m, v) format pairs with a gradient that is tiny for each: small enough that
/// v rounds to 0 in the block of a unit gradient with `v_zero = "keep"` (the values).
const CASES: [(&str, &str, f32); 4] = [("fp8", "fp8", 1e-3), ("fp8e5m2", "fp8e5m2", 1e-5), ("int8", "int8", 1e-4), ("fp4", "fp4", 0.1)];

/// Each format with its default scale kind (FP4: `amax`), and FP4 with `pow2` scales.
#[test]
fn tiny_elements_move_no_more_than_with_fp32_states() {
    let cases = CASES.iter().map(|&(m, v, tiny)| (m, v, tiny, None)).chain([("fp4", "fp4", 0.1, Some(ScaleKind::Pow2))]);
    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
        for (m, v, tiny, scale) in cases.clone() {
            let fp32 = displacement(&mut opt("fp32", "fp32", rounding, VZero::Exclude), tiny, 200);
            let mut o = opt_scaled(m, v, rounding, VZero::Exclude, scale);
            let got = displacement(&mut o, tiny, 200);
            let worst = (1..BLOCK).map(|i| got[i] / fp32[i]).fold(0.0, f64::max);
            let large = got[0] / fp32[0];
            assert!(got.iter().all(|d| d.is_finite()), "{m}/{v} {rounding:?}: non-finite weight");
            if scale == Some(ScaleKind::Pow2) && rounding == Rounding::Nearest {
                // With power-of-two scales, E2M1 m under round-to-nearest never decays with
                // zero gradients: every grid point x is where 0.9 x rounds back to (0.45 -> 0.5,
                // 0.9 -> 1, 1.35 -> 1.5, 1.8 -> 2, 2.7 -> 3, 3.6 -> 4, 5.4 -> 6), and the block
                // scale follows the stalled amax. Every element, the large one included, then
                // moves by a constant step for 200 steps (measured: large 27x, tiny 18x the
                // FP32-state distance): m stalling, which the `amax` scale (the FP4 default),
                // SR and resets fix, not the zero point. The tiny elements move no more than
                // the large one, relative to FP32 states.
                assert!(large > 10.0 && worst <= large, "{m} nearest pow2: large {large:.2}x, tiny {worst:.2}x");
            } else {
                assert!(worst <= 10.0, "{m}/{v} {rounding:?}: a tiny element moved {worst:.3e}x its FP32-state distance");
                // the large element is not held back by the floor
                assert!((0.5..1.5).contains(&large), "{m}/{v} {rounding:?}: large element {large:.3}x");
            }
            // and v is never 0 in the (non-zero) block
            assert!(o.moments.tensors[0].v.decode_all().iter().all(|&x| x > 0.0), "{m}/{v} {rounding:?}: v decodes to 0");
        }
    }
}

#[test]
fn keep_reproduces_the_zero_point_fault() {
    for (m, v, tiny) in CASES {
        let fp32 = displacement(&mut opt("fp32", "fp32", Rounding::Nearest, VZero::Keep), tiny, 200);
        let got = displacement(&mut opt(m, v, Rounding::Nearest, VZero::Keep), tiny, 200);
        let worst = (1..BLOCK).map(|i| got[i] / fp32[i]).fold(0.0, f64::max);
        assert!(worst > 10.0, "{m}/{v}: with v_zero = keep the fault should show, worst ratio {worst:.3e}");
    }
}

/// The case: FP8 E4M3, nearest, step 1 gradient [1, 1e-3 x 127], step 2 gradient
/// [1, 0 x 127]: with v kept at 0 each small element moves by ~4.7e4 lr at step 2, with FP32
/// states by 0.67 lr.
#[test]
fn fp8_block_regression_step_two() {
    let step2 = |o: &mut LowbitAdamW| {
        let mut w = vec![0.0f32; BLOCK];
        let mut g = vec![1e-3f32; BLOCK];
        g[0] = 1.0;
        step_one(o, 1, LR, 1.0, 0, Weights::F32(&mut w), &g);
        let before = w[1];
        g[1..].fill(0.0);
        step_one(o, 2, LR, 1.0, 0, Weights::F32(&mut w), &g);
        ((w[1] - before) as f64).abs() / LR
    };
    let fp32 = step2(&mut opt("fp32", "fp32", Rounding::Nearest, VZero::Exclude));
    assert!((fp32 - 0.67).abs() < 0.01, "fp32 states: {fp32}");
    let keep = step2(&mut opt("fp8", "fp8", Rounding::Nearest, VZero::Keep));
    assert!((4.0e4..6.0e4).contains(&keep), "keep: {keep}");
    let exclude = step2(&mut opt("fp8", "fp8", Rounding::Nearest, VZero::Exclude));
    assert!(exclude <= fp32, "exclude: {exclude} vs fp32 {fp32}");
}

/// An all-zero block (a fresh or just-reset v) still stores exact zeros, and decodes to 0.
#[test]
fn all_zero_block_stays_zero() {
    for (m, v, _) in CASES {
        let mut o = opt(m, v, Rounding::Stochastic, VZero::Exclude);
        let mut w = vec![0.5f32; BLOCK];
        step_one(&mut o, 1, LR, 1.0, 0, Weights::F32(&mut w), &vec![0.0; BLOCK]);
        assert!(o.moments.tensors[0].v.decode_all().iter().all(|&x| x == 0.0), "{m}/{v}");
        assert!(w.iter().all(|&x| x == 0.5), "{m}/{v}");
    }
}
