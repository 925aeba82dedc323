//! ZeRO-1 shards of the CPU reference step: stepping each shard of a tensor on its own (with
//! the shard's whole-tensor element offset) and concatenating the states gives bit for bit
//! the unsharded step: same weights, same codes and scales, same stall counts.
#![allow(clippy::single_range_in_vec_init, reason = "`shard` takes one range per tensor: a one-tensor optimizer takes `&[a..b]`")]

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::{Counter, GradScale, Hyper, LowbitAdamW, Moments, ParamInfo, Rounding, StallCounts, StatesConfig};
use std::ops::Range;

const HYPER: Hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };

/// Update `t` of tensor `i` alone: the update's plan, then the tensor's CPU step.
fn step_one(o: &mut LowbitAdamW, t: u64, lr: f64, grad_scale: f32, i: usize, w: Weights, g: &[f32]) -> StallCounts {
    let plan = o.moments.plan(t, lr, grad_scale).unwrap();
    o.step_cpu(&plan, i, w, g)
}

fn opt(m: &str, v: &str, block: usize, len: usize, rounding: Rounding) -> LowbitAdamW {
    opt_rounding(m, v, block, &[("w", len)], rounding)
}

/// The optimizer of `tensors` (name, length), with stochastic rounding.
fn opt_for(m: &str, v: &str, block: usize, tensors: &[(&str, usize)]) -> LowbitAdamW {
    opt_rounding(m, v, block, tensors, Rounding::Stochastic)
}

/// The optimizer of `tensors` (name, length), m and v written back with `rounding` (BF16
/// weights stochastically).
fn opt_rounding(m: &str, v: &str, block: usize, tensors: &[(&str, usize)], rounding: Rounding) -> LowbitAdamW {
    let s = StatesConfig {
        m_format: m.into(),
        v_format: v.into(),
        block_size: block,
        m_rounding: rounding,
        v_rounding: rounding,
        weight_rounding: Rounding::Stochastic,
        m_reset_every: 3.into(),
        ..Default::default()
    };
    let infos = tensors.iter().map(|&(name, len)| ParamInfo { name: name.into(), group: "mlp".into(), len, weight_decay: true });
    LowbitAdamW::new(HYPER, s.resolve(0.999).unwrap(), 7, infos.collect())
}

fn grads(step: u64, n: usize) -> Vec<f32> {
    (0..n).map(|i| (((i as u64 * 7919 + step * 104729) % 1000) as f32 / 500.0 - 1.0) * 1e-2 * (1.0 + (i % 5) as f32)).collect()
}

/// 4 steps of the whole tensor and of its shards `ranges` (BF16 weights, so the weights'
/// stochastic rounding is checked too); asserts identical weights, states and counts.
fn check(m: &str, v: &str, block: usize, len: usize, ranges: &[Range<usize>]) {
    check_rounding(m, v, block, len, ranges, Rounding::Stochastic);
}

/// [`check`] with m and v written back with `rounding`.
fn check_rounding(m: &str, v: &str, block: usize, len: usize, ranges: &[Range<usize>], rounding: Rounding) {
    let mut whole = opt(m, v, block, len, rounding);
    let mut shards: Vec<LowbitAdamW> =
        ranges.iter().map(|r| LowbitAdamW::from_moments(whole.moments.shard(std::slice::from_ref(r)).unwrap())).collect();
    let w0: Vec<u16> = (0..len).map(|i| half::bf16::from_f32(0.01 * (i % 97) as f32 - 0.4).to_bits()).collect();
    let (mut w_whole, mut w_sharded) = (w0.clone(), w0);
    for step in 1..=4 {
        let g = grads(step, len);
        let c = step_one(&mut whole, step, 1e-2, 0.5, 0, Weights::Bf16(&mut w_whole), &g);
        let (mut cm, mut cv, mut cw) = (Counter::default(), Counter::default(), Counter::default());
        for (s, r) in shards.iter_mut().zip(ranges) {
            let c = step_one(s, step, 1e-2, 0.5, 0, Weights::Bf16(&mut w_sharded[r.clone()]), &g[r.clone()]);
            (cm, cv, cw) = (add(cm, c.m), add(cv, c.v), add(cw, c.w));
        }
        assert_eq!(w_sharded, w_whole, "{m}/{v} block {block}: weights differ at step {step}");
        assert_eq!((cm, cv, cw), (c.m, c.v, c.w), "{m}/{v} block {block}: stall counts differ at step {step}");
        assert!(c.m.updated > 0, "the step updated something");
    }
    let joined = Moments::unshard(&shards.iter().map(|s| s.moments.clone()).collect::<Vec<_>>()).unwrap();
    let t = (&joined.tensors[0], &whole.moments.tensors[0]);
    assert_eq!(t.0.m, t.1.m, "{m}/{v} block {block}: m states differ");
    assert_eq!(t.0.v, t.1.v, "{m}/{v} block {block}: v states differ");
    assert_ne!(t.1.v.decode_all().iter().filter(|&&x| x > 0.0).count(), 0, "v is non-zero");
}

fn add(mut a: Counter, b: Counter) -> Counter {
    a += b;
    a
}

#[test]
fn sharded_steps_are_bit_identical_to_the_whole_tensor_step() {
    let len = 1000; // 7 full blocks of 128 and a partial one
    let cuts = [0..256, 256..768, 768..1000];
    for (m, v) in [("fp8e4m3", "fp8e4m3"), ("fp4", "fp4"), ("int8", "int8"), ("fp8e5m2", "fp8e4m3")] {
        check(m, v, 128, len, &cuts);
    }
    // unscaled formats: any cut, even inside a 64-bit random draw (BF16 slices 4 per draw)
    for (m, v) in [("bf16", "bf16"), ("e8m3", "e8m3"), ("fp32", "fp32")] {
        check(m, v, 128, len, &[0..3, 3..501, 501..502, 502..1000]);
    }
    // an empty shard (a rank that owns nothing of a small tensor)
    check("fp8e4m3", "fp8e4m3", 128, len, &[0..0, 0..1000]);
    // dither: a shard reads and writes its blocks' draws; unscaled states cut anywhere, also
    // with one draw per tensor (block 0), which every shard takes whole
    for (m, v) in [("fp8e4m3", "fp8e4m3"), ("fp4", "fp4"), ("int8", "int8")] {
        check_rounding(m, v, 128, len, &cuts, Rounding::Dither);
    }
    for block in [128, 0] {
        check_rounding("bf16", "e8m3", block, len, &[0..3, 3..501, 501..502, 502..1000], Rounding::Dither);
    }
}

#[test]
fn shards_cut_inside_a_scale_block_are_refused() {
    let o = opt("fp8e4m3", "fp8e4m3", 128, 1000, Rounding::Stochastic);
    let e = o.moments.shard(&[100..500]).err().unwrap();
    assert!(matches!(e, lowbit_optim::OptimError::State(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("cuts a scale block of 128"), "{e}");
    let e = o.moments.shard(&[0..1001]).err().unwrap().to_string();
    assert!(e.contains("outside"), "{e}");
    // one scale for the whole tensor: only the whole tensor is a shard
    let o = opt("fp8e4m3", "fp8e4m3", 0, 1000, Rounding::Stochastic);
    assert!(o.moments.shard(&[0..512]).is_err());
    assert_eq!(o.moments.shard(&[0..1000]).unwrap().tensors[0].m.len, 1000);
    // shards that do not tile the tensor are not joined
    let a = opt("bf16", "bf16", 128, 1000, Rounding::Stochastic);
    let parts = [a.moments.shard(&[0..400]).unwrap(), a.moments.shard(&[500..1000]).unwrap()];
    assert!(Moments::unshard(&parts).err().unwrap().to_string().contains("does not continue at 400"));
}

/// Through the `Optimizer` trait (the path `Zero1` takes on the CPU): a shard steps its range
/// of the whole tensor in place and leaves the rest; a gradient of another size (of the
/// second tensor) is refused before anything is stepped (the first tensor unchanged too).
#[test]
fn trait_step_of_a_shard_and_refused_sizes() {
    use candle_core::{Device, Tensor, Var};
    use lowbit_optim::Optimizer;
    let len = 300;
    let mut whole = opt_for("fp8e4m3", "fp8e4m3", 128, &[("a", len), ("b", len)]);
    let mut shard = LowbitAdamW::from_moments(whole.moments.shard(&[128..len, 128..len]).unwrap());
    let w0: Vec<f32> = (0..len).map(|i| 0.01 * (i % 97) as f32 - 0.4).collect();
    let g = grads(1, len);
    let mut expected = w0.clone();
    step_one(&mut whole, 1, 1e-2, 1.0, 0, Weights::F32(&mut expected), &g);
    let tensor = |v: &[f32]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap();
    let vars = [Var::from_tensor(&tensor(&w0)).unwrap(), Var::from_tensor(&tensor(&w0)).unwrap()];
    let err = Optimizer::step(&mut shard, 1, 1e-2, GradScale::Host(1.0), &vars, &[tensor(&g), tensor(&g[..len - 1])]).unwrap_err();
    assert!(err.to_string().contains("b: a parameter of 300 and a gradient of 299 elements"), "{err}");
    assert_eq!(vars[0].as_tensor().to_vec1::<f32>().unwrap(), w0, "nothing stepped");
    Optimizer::step(&mut shard, 1, 1e-2, GradScale::Host(1.0), &vars, &[tensor(&g), tensor(&g)]).unwrap();
    let w = vars[0].as_tensor().to_vec1::<f32>().unwrap();
    assert_eq!(&w[..128], &w0[..128], "outside the shard: unchanged");
    assert_eq!(&w[128..], &expected[128..], "the shard's range: the whole tensor's step, bit for bit");
}
