//! Subtractive dither (`m_rounding` / `v_rounding = "dither"`, `states::format::dither`): a
//! write and its read are unbiased in the grid coordinate for every format; a resumed run
//! replays the draws bit for bit; the stalled fraction measured on the theory's model matches
//! the derived prediction; the CPU step reads what the previous update wrote.

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::states::format::{bf16, dither, fp4, fp8, int8, precision, Rounding, StateFormat};
use lowbit_optim::states::quant::{read_code, read_code16};
use lowbit_optim::states::rng::{random_bits, stream_key, StateKind};
use lowbit_optim::states::state_dict::{load_state_dict, HostStates};
use lowbit_optim::states::theory;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, StatesConfig};

const DRAWS: u64 = 100_000;

/// Mean of DRAWS dithered write-then-read round trips of `x`, each with a fresh block draw;
/// `round_trip(x, bits)` writes `x` with the block's draw `bits` and reads it back. Between
/// neighbours `lo < hi` of equal spacing on both sides, `T(read) - T(x)` is uniform on one
/// step, so the read's standard deviation is one step / sqrt(12): the mean must be within 5
/// of its standard errors (taken at twice that deviation). The cases keep one spacing from
/// half a step below each value to one and a half above: across a binade's edge the read is
/// unbiased in the grid coordinate only (docs/formats.md).
fn check_unbiased(x: f32, step: f64, round_trip: impl Fn(f32, u64) -> f32, what: &str) {
    let key = stream_key(7, 3, x.to_bits() as u64, StateKind::M);
    let mut sum = 0.0;
    for i in 0..DRAWS {
        let r = round_trip(x, dither::block_bits(key, i)) as f64;
        assert!((r - x as f64).abs() <= 1.5 * step, "{what}: {x} read back as {r}, over 1.5 steps ({step}) away");
        sum += r;
    }
    let mean = sum / DRAWS as f64;
    let se = 2.0 * step / (12.0 * DRAWS as f64).sqrt();
    assert!((mean - x as f64).abs() <= 5.0 * se, "{what}: mean {mean} vs x {x} (5 SE = {})", 5.0 * se);
}

/// Fractions of a step at which each case is checked.
const AT: [f64; 4] = [0.1, 0.37, 0.5, 0.83];

#[test]
fn minifloat_round_trips_are_unbiased() {
    // (format, state signedness, a grid point, its spacing to the next): inside a binade,
    // both signs, across zero (signed m), the subnormal range, the top code
    let cases = [
        (StateFormat::Fp8E4M3, true, 1.25f32, 0.125f32),
        (StateFormat::Fp8E4M3, true, -1.25, 0.125),
        (StateFormat::Fp8E4M3, true, 0.0, 2f32.powi(-9)),
        (StateFormat::Fp8E4M3, true, -2f32.powi(-9), 2f32.powi(-9)),
        (StateFormat::Fp8E4M3, false, 2f32.powi(-9), 2f32.powi(-9)),
        (StateFormat::Fp8E4M3, true, 416.0, 32.0),
        (StateFormat::Fp4E2M1, true, 0.5, 0.5),
        (StateFormat::Fp4E2M1, true, -0.5, 0.5),
        (StateFormat::Fp4E2M1, true, -0.5 + 0.25, 0.5),
        (StateFormat::Fp4UE2M2, false, 1.0, 0.25),
    ];
    for (format, signed, lo, step) in cases {
        let mf = format.minifloat().unwrap();
        let round_trip = |x: f32, bits: u64| {
            let code = mf.encode(x, Rounding::Dither, dither::signed_bits(format, bits, x));
            read_code(format, signed, code, 1.0, dither::read_offset(format, bits))
        };
        for t in AT {
            let x = lo + (t * step as f64) as f32;
            check_unbiased(x, step as f64, round_trip, &format!("{} signed {signed}", format.name()));
        }
    }
    // the largest code's write saturates and its read extends the last spacing: still unbiased
    let f = &fp8::E4M3;
    check_unbiased(
        f.max_finite,
        32.0,
        |x, bits| {
            let code = f.encode(x, Rounding::Dither, dither::signed_bits(StateFormat::Fp8E4M3, bits, x));
            read_code(StateFormat::Fp8E4M3, true, code, 1.0, dither::read_offset(StateFormat::Fp8E4M3, bits))
        },
        "fp8 max",
    );
    let _ = fp4::E2M1;
    // non-finite codes read as stored: E5M2's Inf (a v that overflowed) stays Inf, NaN NaN
    let e5m2 = StateFormat::Fp8E5M2;
    assert_eq!(read_code(e5m2, false, 0x7C, 1.0, 0.25), f32::INFINITY);
    assert_eq!(read_code(e5m2, true, 0xFC, 1.0, -0.25), f32::NEG_INFINITY);
    assert!(read_code(e5m2, true, 0x7E, 1.0, 0.25).is_nan());
}

#[test]
fn bf16_precision_and_int8_round_trips_are_unbiased() {
    for (lo, step, signed) in [(1.5f32, 2f32.powi(-7), true), (-3.0, 2f32.powi(-6), true), (1.5 * 2f32.powi(-100), 2f32.powi(-107), false)]
    {
        let round_trip = |x: f32, bits: u64| {
            let h = bf16::encode(x, Rounding::Dither, dither::signed_bits(StateFormat::Bf16, bits, x));
            read_code16(StateFormat::Bf16, signed, h, dither::read_offset(StateFormat::Bf16, bits))
        };
        for t in AT {
            let x = lo + (t * step as f64) as f32;
            check_unbiased(x, step as f64, round_trip, "bf16");
        }
    }
    let e8m3 = StateFormat::E8m(3);
    let round_trip = |x: f32, bits: u64| {
        let h = precision::encode(x, 3, Rounding::Dither, dither::signed_bits(e8m3, bits, x));
        read_code16(e8m3, true, h, dither::read_offset(e8m3, bits))
    };
    for t in AT {
        check_unbiased(-(2.5 + (t * 0.25) as f32), 0.25, round_trip, "e8m3");
    }
    // int8's signed map near 0.5: equal spacing around the value checked
    let map = int8::dynamic_map(true);
    let c = map.values().iter().position(|&v| v >= 0.5).unwrap();
    let (lo, step) = (map[c], map[c + 1] - map[c]);
    assert!(((map[c] - map[c - 1]) - step).abs() < 1e-5 * step, "the test's point needs equal spacing on both sides");
    assert!(((map[c + 2] - map[c + 1]) - step).abs() < 1e-5 * step, "and one step above");
    let round_trip = |x: f32, bits: u64| {
        let code = map.encode(x, Rounding::Dither, dither::signed_bits(StateFormat::Int8, bits, x));
        read_code(StateFormat::Int8, true, code, 1.0, dither::read_offset(StateFormat::Int8, bits))
    };
    for t in AT {
        check_unbiased(lo + (t * step as f64) as f32, step as f64, round_trip, "int8");
    }
}

/// The theory's model (a settled v fed squared Gaussian gradients, a grid of constant relative
/// spacing: the precision-only `e8m3`, no range limit): the measured share of unchanged codes
/// matches `theory::p_stall_dither` (derived), as stochastic rounding's matches its own.
#[test]
fn measured_stalls_match_the_derived_prediction() {
    let (beta2, n, steps) = (0.99f64, 20_000usize, 40u64);
    for (rounding, predicted) in
        [(Rounding::Dither, theory::p_stall_dither(3, beta2)), (Rounding::Stochastic, theory::p_stall_stochastic(3, beta2))]
    {
        let s = StatesConfig { m_format: "fp32".into(), v_format: "e8m3".into(), v_rounding: rounding, ..Default::default() };
        let hyper = Hyper { beta1: 0.9, beta2, eps: 1e-8, weight_decay: 0.0 };
        let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: n, weight_decay: false };
        let mut o = LowbitAdamW::new(hyper, s.resolve(beta2).unwrap(), 5, vec![info]);
        let mut w = vec![0.0f32; n];
        let (mut unchanged, mut updated) = (0u64, 0u64);
        for t in 1..=steps + 2000 {
            // unit Gaussian gradients from the counter RNG (Box-Muller)
            let key = stream_key(9, t, 0, StateKind::W);
            let g: Vec<f32> = (0..n as u64)
                .map(|i| {
                    let r = random_bits(key, i);
                    let (u1, u2) = (((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64, (r & 0xFFFF_FFFF) as f64 / 2f64.powi(32));
                    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
                })
                .collect();
            let plan = o.moments.plan(t, 0.0, 1.0).unwrap();
            let c = o.step_cpu(&plan, 0, Weights::F32(&mut w), &g);
            if t > 2000 {
                unchanged += c.v.stalled;
                updated += c.v.updated;
            }
        }
        let measured = unchanged as f64 / updated as f64;
        assert!((measured - predicted).abs() < 0.02, "{}: measured {measured:.4}, predicted {predicted:.4}", rounding.as_str());
    }
    // the derived numbers the docs quote, at b2 = 0.999
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    assert_eq!([7, 3, 2].map(|b| r3(theory::p_stall_dither(b, 0.999))), [0.699, 0.75, 0.75]);
    assert_eq!(theory::dither_stall_given_update(0.0), 0.75);
}

fn adamw(rounding: Rounding, m: &str, v: &str, n: usize) -> LowbitAdamW {
    let s = StatesConfig { m_format: m.into(), v_format: v.into(), m_rounding: rounding, v_rounding: rounding, ..Default::default() };
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: n, weight_decay: true };
    LowbitAdamW::new(hyper, s.resolve(0.999).unwrap(), 11, vec![info])
}

fn grads(t: u64, n: usize) -> Vec<f32> {
    (0..n).map(|i| (((i as u64 * 7919 + t * 104729) % 1000) as f32 / 500.0 - 1.0) * 1e-2).collect()
}

fn run(o: &mut LowbitAdamW, w: &mut [f32], updates: std::ops::RangeInclusive<u64>) {
    for t in updates {
        let plan = o.moments.plan(t, 1e-3, 1.0).unwrap();
        let g = grads(t, w.len());
        o.step_cpu(&plan, 0, Weights::F32(w), &g);
    }
}

/// Six updates straight equal three, a save through the state dict, a fresh optimizer loading
/// it and three more, bit for bit: the draws of the write being read are regenerated.
#[test]
fn a_resumed_run_replays_the_dither_bit_for_bit() {
    for (m, v) in [("fp8", "fp8"), ("fp4", "fp4"), ("bf16", "bf16"), ("int8", "int8")] {
        let n = 1000;
        let (mut a, mut wa) = (adamw(Rounding::Dither, m, v, n), vec![0.1f32; n]);
        run(&mut a, &mut wa, 1..=6);
        let (mut b, mut wb) = (adamw(Rounding::Dither, m, v, n), vec![0.1f32; n]);
        run(&mut b, &mut wb, 1..=3);
        let saved: std::collections::HashMap<_, _> = HostStates { moments: &b.moments, precond: None }.state_dict().into_iter().collect();
        let mut c = adamw(Rounding::Dither, m, v, n);
        load_state_dict(&mut c.moments, None, &mut |k| saved.get(k).cloned()).unwrap();
        run(&mut c, &mut wb, 4..=6);
        assert_eq!(wa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), wb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{m}/{v}");
        assert_eq!(a.moments.tensors[0].m, c.moments.tensors[0].m, "{m}");
        assert_eq!(a.moments.tensors[0].v, c.moments.tensors[0].v, "{v}");
        // and the dither differs from stochastic rounding: the draws are per block
        let (mut s, mut ws) = (adamw(Rounding::Stochastic, m, v, n), vec![0.1f32; n]);
        run(&mut s, &mut ws, 1..=6);
        assert_ne!(ws, wa, "{m}/{v}: dither stepped as stochastic rounding");
    }
}

/// The read at update t subtracts the draw of update t - 1's write: m read back through the
/// plan's key equals the value written within a grid step, and its mean error over a tensor
/// is far below a step (the draws are per block, 128 elements each).
#[test]
fn the_step_reads_what_the_previous_update_wrote() {
    let n = 128 * 64;
    let mut o = adamw(Rounding::Dither, "fp8", "fp8", n);
    let mut w = vec![0.1f32; n];
    run(&mut o, &mut w, 1..=1);
    let plan = o.moments.plan(2, 1e-3, 1.0).unwrap();
    assert_eq!(plan.tensors[0].keys.m_read, Some(stream_key(11, 1, 0, StateKind::M)));
    let first = o.moments.plan(1, 1e-3, 1.0).unwrap();
    assert_eq!(first.tensors[0].keys.m_read, None, "update 1 reads fresh zeros as they are");
    // after update 1, m = (1 - b1) g exactly in FP32: the dithered read is within one step of it
    let m = &o.moments.tensors[0].m;
    let read = m.reader(0, plan.tensors[0].keys.m_read);
    let g = grads(1, n);
    let mut err = 0.0f64;
    for (i, &gi) in g.iter().enumerate() {
        let exact = 0.1f32 * gi;
        let r = read.get(i);
        let step = (exact.abs() * 0.125).max(m.scales[i / 128] * 2f32.powi(-9));
        assert!((r - exact).abs() <= 1.01 * step, "element {i}: read {r}, written {exact}");
        err += (r - exact) as f64 / step as f64;
    }
    assert!((err / n as f64).abs() < 0.05, "mean error {} steps", err / n as f64);
}
