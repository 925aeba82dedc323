//! Simulated stalling (the paper's section 3.3; `optim.states.m_skip_prob` / `v_skip_prob`):
//! after the warmup each element's write-back of m (v) is skipped with probability p, so the
//! stored state keeps its old value while the update uses the new one. Checked on the CPU
//! reference (the GPU kernels match it bit for bit: `cuda_parity`'s
//! `simulated_stalling_matches_cpu`): the skipped elements are exactly those the `skip`
//! stream names, their stored bits or codes are the old ones, the measured stalled fraction
//! of FP32 states is p within 5 binomial standard errors, nothing is skipped during the
//! warmup, and the update of the step is the one without skips.

use lowbit_optim::rules::adamw::step::{Skip, Weights};
use lowbit_optim::states::quant::Codes;
use lowbit_optim::states::rng::{stream_key, StateKind};
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, QuantState, StallCounts, StatesConfig};

const HYPER: Hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
const N: usize = 40_000;
const SEED: u64 = 11;

fn opt(format: &str, m_skip: f64, v_skip: f64, skip_after: u64) -> LowbitAdamW {
    let s =
        StatesConfig { m_format: format.into(), v_format: format.into(), m_skip_prob: m_skip, v_skip_prob: v_skip, ..Default::default() };
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: N, weight_decay: false };
    let mut o = LowbitAdamW::new(HYPER, s.resolve(0.999).unwrap(), SEED, vec![info]);
    o.moments.skip_after = skip_after;
    o
}

/// A non-zero gradient per element (varied sign and size), different per update `t`.
fn grad(t: u64) -> Vec<f32> {
    (0..N).map(|i| ((i as f32 * 0.37 + t as f32 * 1.3).sin() + 1.5) * 1e-2 * if i % 3 == 0 { -1.0 } else { 1.0 }).collect()
}

/// Updates 1..=`steps` from w = 0.5; the weights and the last update's counts.
fn run(o: &mut LowbitAdamW, steps: u64) -> (Vec<f32>, StallCounts) {
    let mut w = vec![0.5f32; N];
    let mut last = StallCounts::default();
    for t in 1..=steps {
        let plan = o.moments.plan(t, 1e-3, 1.0).unwrap();
        last = o.step_cpu(&plan, 0, Weights::F32(&mut w), &grad(t));
    }
    (w, last)
}

fn skipper(t: u64, p: f64, shift: u32) -> Skip {
    Skip { key: stream_key(SEED, t, 0, StateKind::Skip), threshold: lowbit_optim::states::config::skip_threshold(p), shift }
}

#[test]
fn fp32_states_skip_exactly_the_drawn_elements_at_rate_p() {
    let (pm, pv) = (0.25, 0.6);
    let mut skipping = opt("fp32", pm, pv, 2);
    let mut plain = opt("fp32", 0.0, 0.0, 0);
    let (w_skip, _) = run(&mut skipping, 2);
    let (w_plain, counts2) = run(&mut plain, 2);
    // updates 1 and 2 are the warmup: no skips, identical runs
    assert_eq!(w_skip, w_plain);
    assert_eq!(counts2.m.stalled + counts2.v.stalled, 0);
    let (m_old, v_old) = (skipping.moments.tensors[0].m.decode_all(), skipping.moments.tensors[0].v.decode_all());
    // update 3: each state keeps its old value exactly where the stream says, else takes the
    // new FP32 moment (the plain run's), and the weights move as without skips
    let (mut w1, mut w2) = (w_skip.clone(), w_plain.clone());
    let g = grad(3);
    let plan = skipping.moments.plan(3, 1e-3, 1.0).unwrap();
    let c = skipping.step_cpu(&plan, 0, Weights::F32(&mut w1), &g);
    let plan = plain.moments.plan(3, 1e-3, 1.0).unwrap();
    plain.step_cpu(&plan, 0, Weights::F32(&mut w2), &g);
    assert_eq!(w1, w2, "the update uses the new moments: skips change only the stored states");
    for (kind, old, got, new, skip) in [
        ("m", &m_old, skipping.moments.tensors[0].m.decode_all(), plain.moments.tensors[0].m.decode_all(), skipper(3, pm, 0)),
        ("v", &v_old, skipping.moments.tensors[0].v.decode_all(), plain.moments.tensors[0].v.decode_all(), skipper(3, pv, 32)),
    ] {
        for i in 0..N {
            let want = if skip.skips(i as u64) { old[i] } else { new[i] };
            assert_eq!(got[i].to_bits(), want.to_bits(), "{kind}[{i}]");
        }
    }
    // every element has a non-zero update, so the stalled fraction is the skip rate: p within
    // 5 binomial standard errors
    for (kind, counter, p) in [("m", c.m, pm), ("v", c.v, pv)] {
        assert_eq!(counter.updated, N as u64, "{kind}");
        let f = counter.fraction().unwrap();
        let se = (p * (1.0 - p) / N as f64).sqrt();
        assert!((f - p).abs() < 5.0 * se, "{kind}: stalled fraction {f} vs p = {p}");
    }
    // m's and v's skips are independent draws: both skipped at rate pm * pv
    let both = (0..N as u64).filter(|&i| skipper(3, pm, 0).skips(i) && skipper(3, pv, 32).skips(i)).count() as f64 / N as f64;
    let se = (pm * pv * (1.0 - pm * pv) / N as f64).sqrt();
    assert!((both - pm * pv).abs() < 5.0 * se, "both skipped: {both}");
}

#[test]
fn scaled_states_keep_the_old_code_of_a_skipped_element() {
    for format in ["fp8", "fp4", "int8", "bf16"] {
        let mut o = opt(format, 0.5, 0.5, 1);
        run(&mut o, 1);
        let before = o.moments.tensors[0].clone();
        let plan = o.moments.plan(2, 1e-3, 1.0).unwrap();
        let mut w = vec![0.5f32; N];
        let c = o.step_cpu(&plan, 0, Weights::F32(&mut w), &grad(2));
        let after = &o.moments.tensors[0];
        for (kind, old, new, skip) in [("m", &before.m, &after.m, skipper(2, 0.5, 0)), ("v", &before.v, &after.v, skipper(2, 0.5, 32))] {
            // a skipped element's code is its old one (its value moves only with the block's
            // scale); of the others, most change
            let (mut skipped, mut changed) = (0, 0);
            for i in 0..N {
                if skip.skips(i as u64) {
                    skipped += 1;
                    assert_eq!(code(old, i), code(new, i), "{format} {kind}[{i}]");
                } else {
                    changed += usize::from(code(old, i) != code(new, i));
                }
            }
            assert!((skipped as f64 / N as f64 - 0.5).abs() < 0.02, "{format} {kind}: {skipped} skipped");
            assert!(changed > (N - skipped) / 2, "{format} {kind}: {changed} of {} changed", N - skipped);
        }
        // each skipped element with a changed value counts as stalled: at least the skipped share
        assert!(c.m.fraction().unwrap() >= 0.48 && c.v.fraction().unwrap() >= 0.48, "{format}: {c:?}");
    }
}

/// Element `i`'s stored code (FP32 bits, BF16 bits, a byte, or an FP4 nibble).
fn code(s: &QuantState, i: usize) -> u32 {
    match &s.codes {
        Codes::F32(c) => c[i].to_bits(),
        Codes::Bf16(c) => u32::from(c[i]),
        Codes::Bytes(c) if s.format.bits() == 4 => u32::from((c[i / 2] >> (4 * (i % 2))) & 0xF),
        Codes::Bytes(c) => u32::from(c[i]),
    }
}

#[test]
fn skip_probabilities_outside_0_1_are_refused_and_unset_ones_not_written() {
    for (key, p) in [("m_skip_prob", 1.0), ("v_skip_prob", -0.1), ("v_skip_prob", f64::NAN)] {
        let mut s = StatesConfig::default();
        if key == "m_skip_prob" {
            s.m_skip_prob = p;
        } else {
            s.v_skip_prob = p;
        }
        let e = s.resolve(0.999).unwrap_err().to_string();
        assert!(e.contains(&format!("optim.states.{key}")) && e.contains("[0, 1)"), "{e}");
    }
    let text = toml::to_string(&StatesConfig::default()).unwrap();
    assert!(!text.contains("skip"), "{text}");
    let s: StatesConfig = toml::from_str("v_skip_prob = 0.9").unwrap();
    assert_eq!(lowbit_optim::states::config::skip_threshold(s.v_skip_prob), 3_865_470_566);
    assert!(s
        .resolve(0.999)
        .unwrap()
        .describe()
        .ends_with("simulated stalling after the warmup: m write-backs skipped with p = 0, v with p = 0.9"));
}
