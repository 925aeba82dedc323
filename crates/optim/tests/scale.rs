//! The two scale kinds of FP8/FP4 states (`optim.states.scale`): `amax` (the paper's: the
//! block's largest value maps to the format's largest) and `pow2`, in the CPU step.

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::states::format::{fp4, fp8};
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, QuantState, Rounding, ScaleKind, StallCounts, StatesConfig};

const HYPER: Hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };

/// Update `t` of tensor `i` alone: the update's plan, then the tensor's CPU step.
fn step_one(o: &mut LowbitAdamW, t: u64, lr: f64, grad_scale: f32, i: usize, w: Weights, g: &[f32]) -> StallCounts {
    let plan = o.moments.plan(t, lr, grad_scale).unwrap();
    o.step_cpu(&plan, i, w, g)
}

fn opt(m: &str, v: &str, scale: ScaleKind, block: usize, len: usize) -> LowbitAdamW {
    let s = StatesConfig { m_format: m.into(), v_format: v.into(), scale: scale.into(), block_size: block, ..Default::default() };
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len, weight_decay: false };
    LowbitAdamW::new(HYPER, s.resolve(0.999).unwrap(), 3, vec![info])
}

/// Gradients spread over two decades, signs mixed.
fn grads(n: usize) -> Vec<f32> {
    (0..n).map(|i| (1.0 + (i * 37 % 100) as f32) * 1e-4 * if i % 3 == 0 { -1.0 } else { 1.0 }).collect()
}

fn max_abs(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |a, x| a.max(x.abs()))
}

/// The mechanism behind FP4's nearest-rounding failure with power-of-two scales
/// (docs/numerics.md): after one gradient, 19 zero gradients should decay m by 0.9^19 = 0.135. With
/// `pow2` every E2M1 grid point g has 0.9 g rounding back to g while the block's scale stays in
/// its octave, so m does not decay at all; with `amax` the scale follows the block's maximum
/// down and m decays as in FP32, although every code stays the same (all stalled by code).
#[test]
fn fp4_m_decays_with_amax_scales_and_not_with_pow2() {
    let n = 256;
    for (kind, want) in [(ScaleKind::Amax, 0.9f32.powi(19)), (ScaleKind::Pow2, 1.0)] {
        let mut o = opt("fp4", "fp32", kind, 128, n);
        let mut w = vec![0.0f32; n];
        step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &grads(n));
        let first = max_abs(&o.moments.tensors[0].m.decode_all());
        let codes = o.moments.tensors[0].m.code_bytes();
        for t in 2..=20 {
            let c = step_one(&mut o, t, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![0.0; n]);
            assert_eq!(c.m.stalled, c.m.updated, "{kind:?} step {t}: every code stays");
            assert_eq!((c.m.unchanged, c.m.elements, c.zero_grad), (n as u64, n as u64, n as u64));
        }
        assert_eq!(o.moments.tensors[0].m.code_bytes(), codes, "{kind:?}");
        let ratio = max_abs(&o.moments.tensors[0].m.decode_all()) / first;
        assert!((ratio - want).abs() < 1e-3 * want.max(1.0), "{kind:?}: m decayed to {ratio}, want {want}");
    }
}

/// `amax`: the block's largest element encodes to the format's largest code and its scale is
/// amax / x_max (an FP32 division); with `block_size = 0` one scale covers the tensor (the
/// paper's per-tensor FP8).
#[test]
fn amax_scale_maps_the_largest_element_to_the_format_maximum() {
    let n = 300;
    let g = grads(n);
    for block in [128usize, 0] {
        let mut o = opt("fp8", "fp8", ScaleKind::Amax, block, n);
        let mut w = vec![0.0f32; n];
        step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
        let m = &o.moments.tensors[0].m;
        let bl = if block == 0 { n } else { block };
        assert_eq!(m.scales.len(), n.div_ceil(bl));
        for (b, &scale) in m.scales.iter().enumerate() {
            let new_m: Vec<f32> = g[b * bl..((b + 1) * bl).min(n)].iter().map(|&x| 0.1f32 * x).collect();
            let amax = max_abs(&new_m);
            assert_eq!(scale, amax / 448.0, "block {b} of {block}");
            let top = (b * bl..((b + 1) * bl).min(n)).max_by(|&i, &j| new_m[i - b * bl].abs().total_cmp(&new_m[j - b * bl].abs())).unwrap();
            assert_eq!(m.code(top) & 0x7F, fp8::E4M3.max_code, "block {b} of {block}");
        }
    }
}

/// An all-zero block keeps scale 0 and decodes to 0; the zero-free v floor applies to the
/// `amax` grid (tiny elements of a non-zero block store the smallest positive code).
#[test]
fn amax_zero_blocks_and_the_zero_free_floor() {
    let n = 256;
    let mut g = vec![0.0f32; n];
    g[128] = 1.0; // block 1 non-zero: one large element, the rest tiny
    for x in g.iter_mut().skip(129) {
        *x = 1e-6;
    }
    let mut o = opt("fp4", "fp4", ScaleKind::Amax, 128, n);
    let mut w = vec![0.0f32; n];
    step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
    let v = &o.moments.tensors[0].v;
    assert_eq!(v.scales[0], 0.0, "all-zero block: scale 0");
    assert!(v.decode_all()[..128].iter().all(|&x| x == 0.0));
    assert_eq!(v.scales[1], 1e-3f32 / fp4::UE2M2.max_finite);
    assert_eq!(v.code(128), fp4::UE2M2.max_code);
    assert!((129..n).all(|i| v.code(i) == 1), "the floor: code 1, not 0");
    assert!(w[129..].iter().all(|x| x.is_finite() && x.abs() < 0.1), "no lr * m / eps jumps");
}

/// A fresh `amax` state has scale 0 (every element decodes to 0, as after a reset); shards keep
/// the scale kind and a concatenation of different kinds is refused.
#[test]
fn scale_kind_travels_with_the_state() {
    let z = QuantState::zeros(lowbit_optim::StateFormat::Fp8E4M3, 10, 4, true).with_scale_kind(ScaleKind::Amax);
    assert_eq!(z.scales, vec![0.0; 3]);
    assert!(z.decode_all().iter().all(|&x| x == 0.0));
    let p = z.zeros_like(8);
    assert_eq!((p.scale_kind, p.len, p.scales.len()), (ScaleKind::Amax, 8, 2));
    let other = QuantState::zeros(lowbit_optim::StateFormat::Fp8E4M3, 4, 4, true);
    let e = QuantState::concat(&[&z.slice(0..8).unwrap(), &other]).unwrap_err().to_string();
    assert!(e.contains("cannot concatenate"), "{e}");
    let mut o = opt("fp4", "fp4", ScaleKind::Amax, 128, 8);
    let mut w = vec![0.0f32; 8];
    step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &[1e-3; 8]);
    assert!(o.moments.tensors[0].m.scales[0] > 0.0);
    assert_eq!(o.moments.spec.m_format.default_scale(), ScaleKind::Amax);
    let _ = Rounding::Nearest;
}

/// Per-tensor scales at their edges, FP8 E4M3 m and v with one scale per tensor:
/// a tensor whose m is subnormal (amax: below the floor 2^-100, m is stored on the floor's
/// grid, where it rounds to 0, so every update stalls and is counted so; pow2: the scale
/// 2^-126 still resolves it; nothing non-finite either way),
/// and a tensor whose m's amax is exactly a grid point (β1 = 0, so m = g exactly: the largest
/// element stores the format's largest code and decodes to itself with either scale kind).
#[test]
fn per_tensor_scales_at_their_edges() {
    use lowbit_optim::states::format::scale::{amax_scale, AMAX_FLOOR};
    let n = 1000;
    for kind in [ScaleKind::Amax, ScaleKind::Pow2] {
        // subnormal m: g = 1e-38 gives m = 1e-39 (FP32 subnormal) and v = 0
        let mut o = opt("fp8", "fp8", kind, 0, n);
        let mut w = vec![0.5f32; n];
        let c = step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &vec![1e-38f32; n]);
        let m = &o.moments.tensors[0].m;
        if kind == ScaleKind::Amax {
            assert_eq!(m.scales, vec![AMAX_FLOOR / 448.0], "the amax floor's scale");
            assert!(m.decode_all().iter().all(|&x| x == 0.0), "below the floor grid's smallest step");
            assert_eq!((c.m.updated, c.m.stalled), (n as u64, n as u64), "every update of m stalled, and counted");
        } else {
            // 2^-126 (k clamped) still resolves m = 1e-39: stored to E4M3's 4 significant bits
            assert_eq!(m.scales, vec![2f32.powi(-126)], "pow2: k clamped to -126");
            assert!(m.decode_all().iter().all(|&x| (x / 1e-39 - 1.0).abs() <= 1.0 / 16.0), "{:?}", &m.decode_all()[..3]);
            assert_eq!((c.m.updated, c.m.stalled), (n as u64, 0));
        }
        assert!(w.iter().all(|&x| x.is_finite() && (x - 0.5).abs() <= 1e-3), "{kind:?}: {:?}", &w[..3]);

        // amax exactly a grid point: 448 * 2^-12 (pow2's exponent -12 exactly; amax's factor 2^12)
        let hyper = lowbit_optim::Hyper { beta1: 0.0, ..HYPER };
        let s = StatesConfig { m_format: "fp8".into(), v_format: "fp8".into(), scale: kind.into(), block_size: 0, ..Default::default() };
        let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: n, weight_decay: false };
        let mut o = LowbitAdamW::new(hyper, s.resolve(0.999).unwrap(), 3, vec![info]);
        let top = 448.0 * 2f32.powi(-12);
        let mut g = grads(n);
        g[n / 2] = -top;
        let mut w = vec![0.0f32; n];
        step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
        let m = &o.moments.tensors[0].m;
        let expect = if kind == ScaleKind::Amax { amax_scale(top, 448.0).scale } else { 2f32.powi(-12) };
        assert_eq!(m.scales, vec![expect], "{kind:?}");
        assert_eq!(m.code(n / 2), 0x80 | fp8::E4M3.max_code, "{kind:?}: the largest code, not NaN (0x7F)");
        assert_eq!(m.decode_all()[n / 2], -top, "{kind:?}: a grid point decodes to itself");
    }
}

/// One scale over a tensor of 20M elements (more than LLaMA-20M's 16.4M-element embedding):
/// the scale is the one `amax_scale` gives for the tensor's largest m, which stores the
/// largest code; every element is counted.
#[test]
fn a_per_tensor_scale_over_20m_elements() {
    use lowbit_optim::states::format::scale::amax_scale;
    let n = 20_000_000;
    let mut o = opt("fp8", "fp8", ScaleKind::Amax, 0, n);
    let mut g = grads(n);
    g[n - 1] = 0.25; // the largest gradient, at the end (an index past 2^24: exact only as an integer)
    let mut w = vec![0.0f32; n];
    let c = step_one(&mut o, 1, 1e-3, 1.0, 0, Weights::F32(&mut w), &g);
    let m = &o.moments.tensors[0].m;
    let top = 0.25f32 * (1.0 - 0.9f64) as f32; // m = (1 - β1) g, in FP32 as the step computes it
    assert_eq!(m.scales, vec![amax_scale(top, 448.0).scale]);
    assert_eq!(m.code(n - 1), fp8::E4M3.max_code);
    assert_eq!((c.m.elements, c.v.elements), (n as u64, n as u64));
    assert!(w.iter().all(|x| x.is_finite()));
}
