//! The tests of `cuda_parity.rs` (built with the `cuda` feature).

use candle_core::{DType, Device, Tensor, Var};
use half::bf16;
use lowbit_optim::cuda::adamw::CudaAdamW;
use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::states::format::bf16 as bf;
use lowbit_optim::states::rng::{random_bits, stream_key, StateKind};
use lowbit_optim::{
    GradScale, GroupStates, Hyper, LowbitAdamW, Moments, Optimizer, ParamInfo, Rounding, ScaleChoice, ScaleKind, StatesConfig, StatesPlan,
    VResetIdle, VZero,
};

/// The GPU, or a failure that says why (these tests exist only to run on one).
pub(crate) fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("cuda_parity needs a CUDA GPU: {e}"))
}

/// Deterministic pseudo-normal values with edge cases sprinkled in.
pub(crate) fn values(seed: u64, n: usize, scale: f32, edges: bool) -> Vec<f32> {
    let key = stream_key(seed, 0, 0, StateKind::M);
    (0..n)
        .map(|i| {
            let r = random_bits(key, i as u64);
            if edges {
                match r % 97 {
                    0 => return 0.0,
                    1 => return 1e-40,
                    2 => return -3e-39,
                    3 => return 1e30,
                    4 if i % 5 == 0 => return f32::INFINITY,
                    5 if i % 7 == 0 => return f32::NEG_INFINITY,
                    6 if i % 11 == 0 => return f32::NAN,
                    _ => {}
                }
            }
            let u1 = ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let u2 = (random_bits(key ^ 1, i as u64) >> 11) as f64 / (1u64 << 53) as f64;
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32 * scale
        })
        .collect()
}

pub(crate) fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

struct Case {
    m: &'static str,
    v: &'static str,
    rounding: Rounding,
    bf16_weights: bool,
    block: usize,
    v_zero: VZero,
    scale: ScaleKind,
    /// A v-only reset at step 3 that keeps the v of zero-gradient elements
    /// (`v_reset_idle = "keep"`).
    keep_idle: bool,
    /// Per-group states over the case's: tensors in turn of the groups mlp (the case's
    /// states), embed (FP32 m and v), head (FP4 in 128-blocks with amax scales and a v-only
    /// reset at step 3), norm (BF16 with stochastic m); tensors under 10 elements in FP32.
    groups: bool,
    /// Simulated stalling from step 4 on: m write-backs skipped with p = 0.3, v with 0.6.
    skip: bool,
}

/// The group of tensor `i` in a `groups` case, and its settings.
const GROUPS: [&str; 4] = ["mlp", "embed", "head", "norm"];

fn group_states() -> std::collections::BTreeMap<String, GroupStates> {
    let s = |m: &str, v: &str| GroupStates { m_format: Some(m.into()), v_format: Some(v.into()), ..Default::default() };
    [
        ("embed", s("fp32", "fp32")),
        (
            "head",
            GroupStates {
                block_size: Some(128),
                scale: Some(ScaleChoice::Amax),
                m_reset_every: Some(0.into()),
                v_reset_every: Some(2.into()),
                ..s("fp4e2m1", "fp4ue2m2")
            },
        ),
        ("norm", GroupStates { m_rounding: Some(Rounding::Stochastic), ..s("bf16", "bf16") }),
    ]
    .map(|(g, s)| (g.to_string(), s))
    .into()
}

fn run_case(dev: &Device, c: &Case) -> Result<(), String> {
    // more tensors than one launch takes (MAX_TENSORS = 240), odd sizes, tiny ones
    let mut sizes = vec![100_003usize, 5, 1];
    sizes.extend((0..262).map(|i| 3 + 7 * i));
    let mut states = StatesConfig {
        m_format: c.m.into(),
        v_format: c.v.into(),
        m_rounding: c.rounding,
        v_rounding: c.rounding,
        block_size: c.block,
        m_reset_every: 2.into(),
        v_reset_every: 0.into(),
        // (dither is the states' only: BF16 weights round stochastically beside it)
        weight_rounding: if c.rounding == Rounding::Dither { Rounding::Stochastic } else { c.rounding },
        v_zero: c.v_zero,
        ..Default::default()
    };
    let scaled = |f: &str| f.starts_with("fp8") || f.starts_with("fp4");
    if scaled(c.m) || scaled(c.v) {
        states.scale = c.scale.into();
    }
    if c.m == "fp32" {
        states.m_reset_every = 0.into();
    }
    if c.m == "int8" || c.keep_idle {
        // a v-only reset: v restarts at 0 while m keeps its value
        states.m_reset_every = 0.into();
        states.v_reset_every = 2.into();
        states.v_reset_idle = if c.keep_idle { VResetIdle::Keep } else { VResetIdle::Reset };
    }
    if c.groups {
        states.groups = group_states();
        states.min_quantized_numel = 10;
    }
    if c.skip {
        states.m_skip_prob = 0.3;
        states.v_skip_prob = 0.6;
    }
    let plan = StatesPlan::resolve(&states, 0.999).map_err(|e| e.to_string())?;
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.1 };
    let group = |i: usize| if c.groups { GROUPS[i % 4] } else { "mlp" };
    let infos: Vec<ParamInfo> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamInfo { name: format!("t{i}"), group: group(i).into(), len: n, weight_decay: i % 2 == 0 })
        .collect();
    let mut cpu = LowbitAdamW::new(hyper, plan, 7, infos);
    cpu.moments.skip_after = 3; // (skips from step 4: the GPU's optimizer is a copy of this one)
                                // random non-zero states: two CPU warm-up steps on random gradients
    let mut w32: Vec<Vec<f32>> = sizes.iter().enumerate().map(|(i, &n)| values(100 + i as u64, n, 0.05, false)).collect();
    let mut w16: Vec<Vec<u16>> = w32.iter().map(|w| w.iter().map(|&x| bf::encode(x, Rounding::Nearest, 0)).collect()).collect();
    for step in 1..=2u64 {
        let plan = cpu.moments.plan(step, 1e-3, 1.0).map_err(|e| e.to_string())?;
        for (i, &n) in sizes.iter().enumerate() {
            let g = values(200 + step * 10 + i as u64, n, 1e-3, false);
            if c.bf16_weights {
                cpu.step_cpu(&plan, i, Weights::Bf16(&mut w16[i]), &g);
            } else {
                cpu.step_cpu(&plan, i, Weights::F32(&mut w32[i]), &g);
            }
        }
    }
    let cuda_dev = match dev {
        Device::Cuda(d) => d.clone(),
        _ => unreachable!(),
    };
    let mut gpu = CudaAdamW::new(cpu.moments.clone(), &cuda_dev).map_err(|e| e.to_string())?;
    let params: Vec<Tensor> = (0..sizes.len())
        .map(|i| {
            if c.bf16_weights {
                let h: Vec<bf16> = w16[i].iter().map(|&b| bf16::from_bits(b)).collect();
                Tensor::from_vec(h, sizes[i], dev)
            } else {
                Tensor::from_vec(w32[i].clone(), sizes[i], dev)
            }
        })
        .collect::<candle_core::Result<_>>()
        .map_err(|e| e.to_string())?;
    for step in 3..=5u64 {
        let mut cpu_counts = vec![];
        let mut grads = vec![];
        let plan = cpu.moments.plan(step, 1e-3, 0.5).map_err(|e| e.to_string())?;
        for (i, &n) in sizes.iter().enumerate() {
            let g = values(300 + step * 10 + i as u64, n, 1e-2, true);
            let bf16_grads = c.bf16_weights && (step + i as u64) % 2 == 1;
            let g: Vec<f32> = if bf16_grads { g.iter().map(|&x| bf16::from_f32(x).to_f32()).collect() } else { g };
            cpu_counts.push(if c.bf16_weights {
                cpu.step_cpu(&plan, i, Weights::Bf16(&mut w16[i]), &g)
            } else {
                cpu.step_cpu(&plan, i, Weights::F32(&mut w32[i]), &g)
            });
            let grad = if bf16_grads {
                Tensor::from_vec(g.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(), n, dev)
            } else {
                Tensor::from_vec(g, n, dev)
            };
            grads.push(grad.map_err(|e| e.to_string())?);
        }
        // step 4 with the factor decided on the device (`GradScale::Device`), after a step
        // that the device gate skips: it must count nothing, and change nothing the real
        // step would then not match the CPU's on
        let (keep, skip) = (Tensor::new(&[0.5f32, 0.0], dev), Tensor::new(&[0.5f32, 1.0], dev));
        let (keep, skip) = (keep.map_err(|e| e.to_string())?, skip.map_err(|e| e.to_string())?);
        if step == 4 {
            gpu.step(step, 1e-3, GradScale::Device(&skip), &params, &grads).map_err(|e| e.to_string())?;
            let counted = gpu.read_counts(step).map_err(|e| e.to_string())?;
            if counted.iter().any(|c| [c.m, c.v, c.w].iter().any(|k| k.updated + k.stalled + k.unchanged > 0) || c.zero_grad > 0) {
                return Err(format!("step {step}: a skipped step counted {counted:?}"));
            }
        }
        let scale = if step == 4 { GradScale::Device(&keep) } else { GradScale::Host(0.5) };
        gpu.step(step, 1e-3, scale, &params, &grads).map_err(|e| e.to_string())?;
        let gpu_counts = gpu.read_counts(step).map_err(|e| e.to_string())?;
        if gpu_counts != cpu_counts {
            return Err(format!("step {step}: stall counts differ: gpu {gpu_counts:?} cpu {cpu_counts:?}"));
        }
        same_states(step, gpu.download().map_err(|e| e.to_string())?, &cpu.moments)?;
        for (i, p) in params.iter().enumerate() {
            same_weights(step, i, p, c.bf16_weights, &w16[i], &w32[i])?;
        }
    }
    Ok(())
}

/// The GPU's downloaded states against the CPU reference's: codes bit for bit (FP32 codes
/// with NaN as NaN), scales bit for bit.
fn same_states(step: u64, gpu: &Moments, cpu: &Moments) -> Result<(), String> {
    for (i, (tg, tc)) in gpu.tensors.iter().zip(&cpu.tensors).enumerate() {
        for (kind, a, b) in [("m", &tg.m, &tc.m), ("v", &tg.v, &tc.v)] {
            let (ga, cb) = (a.code_bytes(), b.code_bytes());
            let differ = if a.format.bits() == 32 {
                ga.chunks(4)
                    .zip(cb.chunks(4))
                    .any(|(x, y)| !same_f32(f32::from_le_bytes(x.try_into().unwrap()), f32::from_le_bytes(y.try_into().unwrap())))
            } else {
                ga != cb
            };
            if differ || ga.len() != cb.len() {
                let j = ga.iter().zip(&cb).position(|(x, y)| x != y).unwrap_or(0);
                return Err(format!("step {step} tensor {i}: {kind} codes differ (first byte {j}: gpu {} cpu {})", ga[j], cb[j]));
            }
            if a.scales.iter().zip(&b.scales).any(|(x, y)| x.to_bits() != y.to_bits()) {
                return Err(format!("step {step} tensor {i}: {kind} scales differ"));
            }
        }
    }
    Ok(())
}

/// GPU weights `p` against the CPU reference's (`w16` bit patterns or `w32`).
fn same_weights(step: u64, i: usize, p: &Tensor, bf16_weights: bool, w16: &[u16], w32: &[f32]) -> Result<(), String> {
    if bf16_weights {
        let gp: Vec<u16> = p.to_vec1::<bf16>().map_err(|e| e.to_string())?.iter().map(|x| x.to_bits()).collect();
        if gp != w16 {
            return Err(format!("step {step} tensor {i}: bf16 weights differ"));
        }
    } else {
        let gp = p.to_dtype(DType::F32).and_then(|t| t.to_vec1::<f32>()).map_err(|e| e.to_string())?;
        if let Some(j) = gp.iter().zip(w32).position(|(a, b)| !same_f32(*a, *b)) {
            return Err(format!("step {step} tensor {i}: weight {j} differs: gpu {} cpu {}", gp[j], w32[j]));
        }
    }
    Ok(())
}

/// ZeRO-1 on the GPU: two optimizers made from the two shards of every tensor
/// (`Moments::shard`, cut inside the tensor at a multiple of the scale block, or of 4
/// elements for unscaled states, as training cuts them; the 5-element tensor leaves rank 0 an
/// empty shard), each stepping its range of the whole weights and gradients through the
/// `Optimizer` trait (the path `Zero1` takes), together give the CPU reference's whole-tensor step bit for bit: weights, codes, scales (gathered
/// with `unshard`) and stall counts (summed), with stochastic rounding (the random bits are
/// the whole tensor's). Blocks of 128 (moments in registers) and 256 (two passes). A gradient
/// of another size is refused.
#[test]
fn sharded_step_matches_whole_tensor_step() {
    let dev = gpu();
    let Device::Cuda(cuda_dev) = &dev else { unreachable!() };
    let sizes = [100_003usize, 4096, 300, 5];
    let mut failures = vec![];
    let cases = [
        ("fp8e4m3", "fp8e4m3", 128, 128, ScaleKind::Pow2),
        ("fp8e4m3", "fp8e4m3", 256, 256, ScaleKind::Amax),
        ("fp4e2m1", "fp4ue2m2", 128, 128, ScaleKind::Amax),
        ("fp4e2m1", "fp4ue2m2", 128, 128, ScaleKind::Pow2),
        ("int8", "fp4ue2m2", 256, 256, ScaleKind::Amax),
        ("bf16", "bf16", 128, 4, ScaleKind::Pow2),
        ("e8m3", "e8m3", 128, 4, ScaleKind::Pow2),
        ("fp32", "fp32", 128, 4, ScaleKind::Pow2),
    ];
    for (m, v, block, unit, scale) in cases {
        for bf16_weights in [false, true] {
            let scaled = [m, v].iter().any(|f| f.starts_with("fp8") || f.starts_with("fp4"));
            let states = StatesConfig {
                m_format: m.into(),
                v_format: v.into(),
                m_rounding: Rounding::Stochastic,
                v_rounding: Rounding::Stochastic,
                weight_rounding: Rounding::Stochastic,
                block_size: block,
                scale: if scaled { scale.into() } else { Default::default() },
                ..Default::default()
            };
            let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };
            let infos: Vec<ParamInfo> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| ParamInfo { name: format!("t{i}"), group: "mlp".into(), len: n, weight_decay: true })
                .collect();
            let mut cpu = LowbitAdamW::new(hyper, states.resolve(0.999).unwrap(), 7, infos);
            let mut w32: Vec<Vec<f32>> = sizes.iter().enumerate().map(|(i, &n)| values(100 + i as u64, n, 0.05, false)).collect();
            let mut w16: Vec<Vec<u16>> = w32.iter().map(|w| w.iter().map(|&x| bf::encode(x, Rounding::Nearest, 0)).collect()).collect();
            // (one tensor of update `step`: its plan is the same for every tensor of the update)
            let step_cpu = |cpu: &mut LowbitAdamW, step: u64, i: usize, w16: &mut Vec<u16>, w32: &mut Vec<f32>, g: &[f32]| {
                let plan = cpu.moments.plan(step, 1e-3, 1.0).unwrap();
                if bf16_weights {
                    cpu.step_cpu(&plan, i, Weights::Bf16(w16), g)
                } else {
                    cpu.step_cpu(&plan, i, Weights::F32(w32), g)
                }
            };
            for (i, &n) in sizes.iter().enumerate() {
                step_cpu(&mut cpu, 1, i, &mut w16[i], &mut w32[i], &values(210 + i as u64, n, 1e-3, false));
            }
            // rank 0: elements 0..cut of each tensor, rank 1: cut..n (cut a multiple of `unit`)
            let cuts: Vec<usize> = sizes.iter().map(|&n| n / 2 / unit * unit).collect();
            let ranges = |r: usize| -> Vec<std::ops::Range<usize>> {
                sizes.iter().zip(&cuts).map(|(&n, &c)| if r == 0 { 0..c } else { c..n }).collect()
            };
            let mut shards: Vec<CudaAdamW> =
                (0..2).map(|r| CudaAdamW::new(cpu.moments.shard(&ranges(r)).unwrap(), cuda_dev).unwrap()).collect();
            let params: Vec<Tensor> = (0..sizes.len())
                .map(|i| match bf16_weights {
                    true => Tensor::from_vec(w16[i].iter().map(|&b| bf16::from_bits(b)).collect::<Vec<_>>(), sizes[i], &dev),
                    false => Tensor::from_vec(w32[i].clone(), sizes[i], &dev),
                })
                .collect::<candle_core::Result<_>>()
                .unwrap();
            let step = 2;
            let g: Vec<Vec<f32>> = sizes.iter().enumerate().map(|(i, &n)| values(320 + i as u64, n, 1e-2, true)).collect();
            let cpu_counts: Vec<_> = (0..sizes.len()).map(|i| step_cpu(&mut cpu, step, i, &mut w16[i], &mut w32[i], &g[i])).collect();
            let grads: Vec<Tensor> = g.iter().map(|g| Tensor::from_vec(g.clone(), g.len(), &dev).unwrap()).collect();
            let mut summed = vec![lowbit_optim::StallCounts::default(); sizes.len()];
            // Through the Optimizer trait with whole tensors: each shard's adapter steps its
            // own range of every tensor, in place.
            let vars: Vec<Var> = params.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
            for shard in shards.iter_mut() {
                Optimizer::step(shard, step, 1e-3, GradScale::Host(1.0), &vars, &grads).unwrap();
                for (s, c) in summed.iter_mut().zip(shard.read_counts(step).unwrap()) {
                    *s += c;
                }
            }
            // A gradient of another size is refused before anything is stepped.
            let short: Vec<Tensor> = grads.iter().map(|g| g.narrow(0, 0, g.elem_count() - 1).unwrap()).collect();
            let err = Optimizer::step(&mut shards[0], step + 1, 1e-3, GradScale::Host(1.0), &vars, &short).unwrap_err();
            assert!(err.to_string().contains("and a gradient of"), "{err}");
            let host: Vec<Moments> = shards.iter_mut().map(|s| s.download().unwrap().clone()).collect();
            let whole = Moments::unshard(&host).unwrap();
            let check = || -> Result<(), String> {
                if summed != cpu_counts {
                    return Err(format!("stall counts differ: shards {summed:?} cpu {cpu_counts:?}"));
                }
                same_states(step, &whole, &cpu.moments)?;
                for (i, p) in vars.iter().enumerate() {
                    same_weights(step, i, p.as_tensor(), bf16_weights, &w16[i], &w32[i])?;
                }
                Ok(())
            };
            if let Err(e) = check() {
                failures.push(format!("m={m} v={v} block={block} {scale:?} bf16w={bf16_weights}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn kernels_match_cpu_reference_bit_for_bit() {
    let dev = gpu();
    let pairs = [
        ("fp32", "fp32"),
        ("bf16", "bf16"),
        ("fp8e4m3", "fp8e4m3"),
        ("fp8e5m2", "fp8e5m2"),
        ("fp4e2m1", "fp4ue2m2"),
        ("int8", "int8"),
        ("fp8e4m3", "bf16"),
        ("bf16", "fp4ue2m2"),
        ("fp4e2m1", "fp8e5m2"),
        ("int8", "fp32"),
        ("e8m3", "e8m3"),
        ("e8m1", "e8m2"),
        ("fp32", "e8m6"),
        ("e8m2", "bf16"),
    ];
    let keep = [("fp8e4m3", "fp8e4m3"), ("fp4e2m1", "fp4ue2m2"), ("int8", "int8")];
    let runs = pairs.iter().map(|&p| (p, VZero::Exclude)).chain(keep.iter().map(|&p| (p, VZero::Keep)));
    // every pair with the pow2 scale; those with an fp8/fp4 state with amax as well
    let has_minifloat = |(m, v): (&str, &str)| [m, v].iter().any(|f| f.starts_with("fp8") || f.starts_with("fp4"));
    let runs = runs.flat_map(|(p, z)| {
        let kinds: &[ScaleKind] = if has_minifloat(p) { &[ScaleKind::Pow2, ScaleKind::Amax] } else { &[ScaleKind::Pow2] };
        kinds.iter().map(move |&k| (p, z, k))
    });
    let mut failures = vec![];
    let mut cases = 0;
    for ((m, v), v_zero, scale) in runs {
        for rounding in [Rounding::Nearest, Rounding::Stochastic, Rounding::Dither] {
            for bf16_weights in [false, true] {
                for block in [128usize, 64, 256, 0] {
                    let c = Case { m, v, rounding, bf16_weights, block, v_zero, scale, keep_idle: false, groups: false, skip: false };
                    cases += 1;
                    if let Err(e) = run_case(&dev, &c) {
                        failures.push(format!("m={m} v={v} {v_zero:?} {scale:?} {rounding:?} bf16w={bf16_weights} block={block}: {e}"));
                    }
                }
            }
        }
    }
    println!("{cases} cases, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every (state pair, rounding, weight dtype, block) of one variant of
/// `kernels_match_cpu_reference_bit_for_bit`'s case (`variant` sets its knob over the plain
/// case: zero-free v, no groups, no skips), each failure named with `label`.
fn sweep(label: &str, pairs: &[(&'static str, &'static str, ScaleKind)], blocks: &[usize], variant: impl Fn(Case) -> Case) {
    let dev = gpu();
    let mut failures = vec![];
    for &(m, v, scale) in pairs {
        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
            for bf16_weights in [false, true] {
                for &block in blocks {
                    let plain = Case {
                        m,
                        v,
                        rounding,
                        bf16_weights,
                        block,
                        v_zero: VZero::Exclude,
                        scale,
                        keep_idle: false,
                        groups: false,
                        skip: false,
                    };
                    if let Err(e) = run_case(&dev, &variant(plain)) {
                        failures.push(format!("{label} m={m} v={v} {rounding:?} bf16w={bf16_weights} block={block}: {e}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A reset of v without m that keeps the v of the elements whose gradient is 0
/// (`v_reset_idle = "keep"`): the kernel reads their codes and zeroes the others', as the CPU's
/// `zero_where`; every other check as `kernels_match_cpu_reference_bit_for_bit`.
#[test]
fn v_reset_keep_idle_matches_cpu() {
    let pairs = [
        ("fp8e4m3", "fp8e4m3", ScaleKind::Amax),
        ("fp4e2m1", "fp4ue2m2", ScaleKind::Pow2),
        ("bf16", "bf16", ScaleKind::Pow2),
        ("fp32", "int8", ScaleKind::Pow2),
    ];
    sweep("keep idle", &pairs, &[128, 256, 0], |c| Case { keep_idle: true, ..c });
}

/// Per-group state formats (`[optim.states.groups.*]`, `min_quantized_numel`): tensors of
/// four settings in one optimizer, each setting stepped by launches of its own (with one scale
/// per tensor in the base beside 128-blocks in a group), match the CPU bit for bit; every
/// other check as `kernels_match_cpu_reference_bit_for_bit`.
#[test]
fn per_group_formats_match_cpu() {
    let pairs = [("fp8e4m3", "fp8e4m3", ScaleKind::Amax), ("int8", "int8", ScaleKind::Pow2), ("e8m3", "e8m2", ScaleKind::Pow2)];
    sweep("groups over", &pairs, &[128, 0], |c| Case { v_zero: VZero::Keep, groups: true, ..c });
}

/// Simulated stalling (`m_skip_prob`, `v_skip_prob`, from step 4): the kernels skip the same
/// write-backs as the CPU, for unscaled, block-scaled (registers and two passes) and per-tensor
/// states; every other check as `kernels_match_cpu_reference_bit_for_bit`.
#[test]
fn simulated_stalling_matches_cpu() {
    let pairs = [
        ("fp32", "fp32", ScaleKind::Pow2),
        ("bf16", "bf16", ScaleKind::Pow2),
        ("fp8e4m3", "fp8e4m3", ScaleKind::Amax),
        ("fp4e2m1", "fp4ue2m2", ScaleKind::Amax),
        ("int8", "int8", ScaleKind::Pow2),
        ("e8m3", "e8m2", ScaleKind::Pow2),
    ];
    sweep("skips", &pairs, &[128, 256, 0], |c| Case { skip: true, ..c });
}

#[test]
fn bf16_gradients_for_f32_weights_are_refused() {
    let dev = gpu();
    let Device::Cuda(cuda_dev) = &dev else { unreachable!() };
    let spec = StatesConfig::default().resolve(0.999).unwrap();
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let infos = vec![ParamInfo { name: "w".into(), group: "mlp".into(), len: 8, weight_decay: false }];
    let mut gpu = CudaAdamW::new(Moments::new(hyper, spec, 0, infos), cuda_dev).unwrap();
    let p = Tensor::zeros(8, DType::F32, &dev).unwrap();
    let g = Tensor::zeros(8, DType::BF16, &dev).unwrap();
    let e = gpu.step(1, 1e-3, GradScale::Host(1.0), std::slice::from_ref(&p), &[g]).unwrap_err().to_string();
    assert!(e.contains("w: F32 weights with BF16 gradients"), "{e}");
    let g = Tensor::zeros(8, DType::F32, &dev).unwrap();
    gpu.step(1, 1e-3, GradScale::Host(1.0), &[p], &[g]).unwrap();
}

#[test]
fn precision_only_with_block_scaled_states_is_refused() {
    let dev = gpu();
    let Device::Cuda(cuda_dev) = &dev else { unreachable!() };
    let states = StatesConfig { m_format: "e8m3".into(), v_format: "fp8".into(), ..Default::default() };
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let infos = vec![ParamInfo { name: "w".into(), group: "mlp".into(), len: 8, weight_decay: false }];
    let e = CudaAdamW::new(Moments::new(hyper, states.resolve(0.999).unwrap(), 0, infos), cuda_dev).err().unwrap().to_string();
    assert!(e.contains("m = e8m3 and v = fp8e4m3"), "{e}");
}

#[test]
fn shard_not_starting_at_a_multiple_of_4_is_refused() {
    let dev = gpu();
    let Device::Cuda(cuda_dev) = &dev else { unreachable!() };
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let states = StatesConfig { m_format: "bf16".into(), v_format: "bf16".into(), ..Default::default() };
    let infos = vec![ParamInfo { name: "w".into(), group: "mlp".into(), len: 300, weight_decay: false }];
    let whole = Moments::new(hyper, states.resolve(0.999).unwrap(), 0, infos);
    let mut gpu = CudaAdamW::new(whole.shard(std::slice::from_ref(&(6..300))).unwrap(), cuda_dev).unwrap();
    let t = Tensor::zeros(294, DType::F32, &dev).unwrap();
    let e = gpu.step(1, 1e-3, GradScale::Host(1.0), std::slice::from_ref(&t), std::slice::from_ref(&t)).err().unwrap().to_string();
    assert!(e.contains("w: a shard must start at a multiple of 4 elements, not 6"), "{e}");
}
