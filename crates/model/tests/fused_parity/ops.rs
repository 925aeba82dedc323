//! The tests of `fused_parity.rs` (built with the `cuda` feature).

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarBuilder;
use lowbit_model::attention::{causal_mask, softmax_last_dim};
use lowbit_model::norm::RmsNorm;
use lowbit_model::rope::Rope;
use lowbit_model::{fused, init_params, masked_cross_entropy_with, Kernels, Llama, LlamaConfig};

/// The GPU, or a failure that says why (these tests exist only to run on one).
fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("fused_parity needs a CUDA GPU: {e}"))
}

fn tol(dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        2e-2
    } else {
        2e-5
    }
}

/// Random normal values (seeded SplitMix64 + Box-Muller) scaled by `std`, made on the CPU.
fn randn(shape: &[usize], std: f32, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut uniform = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    let n: usize = shape.iter().product();
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform().max(1e-7), uniform());
            std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
        })
        .collect()
}

fn var(shape: &[usize], std: f32, seed: u64, dtype: DType, dev: &Device) -> Var {
    let t = Tensor::from_vec(randn(shape, std, seed), shape, &Device::Cpu).unwrap();
    Var::from_tensor(&t.to_dtype(dtype).unwrap().to_device(dev).unwrap()).unwrap()
}

/// Largest |a − b| over the largest |b|.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff.is_finite(), "non-finite values");
    diff / scale
}

/// Compares `fused(inputs)` with `composed(inputs)`: the output and the gradient of
/// `sum(out · R)` with respect to every input.
fn check(name: &str, dtype: DType, inputs: &[Var], fused: impl Fn(&[Tensor]) -> Tensor, composed: impl Fn(&[Tensor]) -> Tensor) {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let (yf, yc) = (fused(&ts), composed(&ts));
    let e = rel_err(&yf, &yc);
    assert!(e <= tol(dtype), "{name} {dtype:?} forward: relative error {e}");
    let r = Tensor::from_vec(randn(yc.dims(), 1.0, 99), yc.dims(), &Device::Cpu).unwrap().to_device(yc.device()).unwrap();
    let loss = |y: &Tensor| (y.to_dtype(DType::F32).unwrap() * &r).unwrap().sum_all().unwrap();
    let (gf, gc) = (loss(&yf).backward().unwrap(), loss(&yc).backward().unwrap());
    for (i, v) in inputs.iter().enumerate() {
        let (a, b) = (gf.get(v.as_tensor()), gc.get(v.as_tensor()));
        let (Some(a), Some(b)) = (a, b) else { panic!("{name}: no gradient for input {i}") };
        let e = rel_err(a, b);
        assert!(e <= tol(dtype), "{name} {dtype:?} gradient of input {i}: relative error {e}");
        println!("{name} {dtype:?}: input {i} gradient relative error {e:.2e}");
    }
}

const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

#[test]
fn rms_norm_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        for (rows, h) in [(37, 96), (5, 640), (129, 1024), (70, 100)] {
            let x = var(&[rows, h], 1.0, 1, dtype, &dev);
            let w = var(&[h], 0.3, 2, dtype, &dev);
            let w1 = Var::from_tensor(&(w.as_tensor() + 1.0).unwrap()).unwrap();
            check(
                "rms_norm",
                dtype,
                &[x, w1],
                |t| fused::rms_norm(&t[0], &t[1], 1e-6).unwrap(),
                |t| candle_core::Module::forward(&RmsNorm::from_weight(t[1].clone(), 1e-6), &t[0]).unwrap(),
            );
        }
    }
}

#[test]
fn rope_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        for (b, t, n, d) in [(2, 13, 3, 16), (1, 257, 2, 64), (2, 33, 1, 128)] {
            let rope = Rope::new(d, 300, 10_000.0, &dev).unwrap();
            let x = var(&[b, t, n * d], 1.0, 3, dtype, &dev);
            check(
                "rope",
                dtype,
                &[x],
                |v| fused::rope(&v[0], rope.cos(), rope.sin(), n).unwrap(),
                |v| rope.apply(&v[0].reshape((b, t, n, d)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap()).unwrap(),
            );
        }
    }
}

#[test]
fn attention_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        for (b, h, t, d) in [(2, 3, 19, 64), (1, 2, 130, 128), (1, 1, 2048, 64)] {
            let scale = 1.0 / (d as f64).sqrt();
            let q = var(&[b, h, t, d], 1.0, 4, dtype, &dev);
            let k = var(&[b, h, t, d], 1.0, 5, dtype, &dev);
            let v = var(&[b, t, h * d], 1.0, 6, dtype, &dev);
            let mask = causal_mask(t, &dev).unwrap();
            check(
                "attention",
                dtype,
                &[q, k, v],
                |x| fused::causal_attention(&x[0], &x[1], &x[2], scale).unwrap(),
                |x| {
                    let s = (x[0].matmul(&x[1].t().unwrap()).unwrap() * scale).unwrap().to_dtype(DType::F32).unwrap();
                    let p = softmax_last_dim(&s.broadcast_add(&mask).unwrap()).unwrap().to_dtype(dtype).unwrap();
                    let v = x[2].reshape((b, t, h, d)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap();
                    p.matmul(&v).unwrap().transpose(1, 2).unwrap().reshape((b, t, h * d)).unwrap()
                },
            );
        }
    }
}

#[test]
fn linear_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        for (inp, out) in [(96, 80), (90, 77)] {
            let x = var(&[3, 7, inp], 1.0, 13, dtype, &dev);
            let w = var(&[out, inp], 0.1, 14, dtype, &dev);
            check(
                "linear",
                dtype,
                &[x, w],
                |t| fused::linear(&t[0], &t[1]).unwrap(),
                |t| lowbit_model::mlp::linear(&t[0], &t[1]).unwrap(),
            );
        }
    }
}

/// Gate and up projections with the gate: the first I columns against the composed ops,
/// the padding columns exactly 0 (I = 90 pads to 96; I = 64 has none).
#[test]
fn gate_up_swiglu_matches_composed() {
    use lowbit_model::mlp::linear;
    let dev = gpu();
    for dtype in DTYPES {
        for i in [90, 64] {
            let x = var(&[5, 7, 64], 1.0, 7, dtype, &dev);
            let wg = var(&[i, 64], 0.2, 8, dtype, &dev);
            let wu = var(&[i, 64], 0.2, 15, dtype, &dev);
            let out = fused::gate_up_swiglu(x.as_tensor(), wg.as_tensor(), wu.as_tensor()).unwrap();
            assert_eq!(out.dims(), &[5, 7, i.div_ceil(8) * 8]);
            if out.dim(2).unwrap() > i {
                let pad = out.narrow(2, i, out.dim(2).unwrap() - i).unwrap().to_dtype(DType::F32).unwrap();
                assert_eq!(pad.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0, "padding is not 0");
            }
            check(
                "gate_up_swiglu",
                dtype,
                &[x, wg, wu],
                |t| fused::gate_up_swiglu(&t[0], &t[1], &t[2]).unwrap().narrow(2, 0, i).unwrap(),
                |t| (linear(&t[0], &t[1]).unwrap().silu().unwrap() * linear(&t[0], &t[2]).unwrap()).unwrap(),
            );
        }
    }
}

#[test]
fn embedding_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        let w = var(&[60, 24], 1.0, 9, dtype, &dev);
        // repeated ids, absent ids, ids out of order
        let ids: Vec<u32> = (0..2 * 17).map(|i| (i * 7 % 13 + (i % 3) * 20) as u32).collect();
        let ids = Tensor::from_vec(ids, (2, 17), &dev).unwrap();
        check(
            "embedding",
            dtype,
            &[w],
            |t| fused::embedding(&t[0], &ids).unwrap(),
            |t| t[0].index_select(&ids.flatten_all().unwrap(), 0).unwrap(),
        );
    }
}

#[test]
fn cross_entropy_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        for (b, t, v) in [(3, 7, 101), (2, 5, 32100)] {
            let logits = var(&[b, t, v], 3.0, 10, dtype, &dev);
            let target: Vec<u32> = (0..b * t).map(|i| ((i * 7919) % v) as u32).collect();
            let target = Tensor::from_vec(target, (b, t), &dev).unwrap();
            let mask: Vec<f32> = (0..b * t).map(|i| if i % 4 == 3 { 0.0 } else { 1.0 }).collect();
            let mask = Tensor::from_vec(mask, (b, t), &dev).unwrap();
            check(
                "cross_entropy",
                dtype,
                &[logits],
                |x| masked_cross_entropy_with(&x[0], &target, &mask, Kernels::Fused).unwrap(),
                |x| masked_cross_entropy_with(&x[0], &target, &mask, Kernels::Composed).unwrap(),
            );
        }
    }
}

/// The LM head and loss in chunks against `linear` + the composed cross-entropy (4100 rows:
/// two chunks of the fused op), with the gradients from the forward pass (`train`) and
/// recomputed in the backward.
#[test]
fn lm_head_cross_entropy_matches_composed() {
    let dev = gpu();
    for (dtype, train) in DTYPES.into_iter().flat_map(|d| [(d, false), (d, true)]) {
        let (n, h, v) = (4100, 64, 301);
        let hidden = var(&[n, h], 1.0, 11, dtype, &dev);
        let w = var(&[v, h], 0.2, 12, dtype, &dev);
        let target = Tensor::from_vec((0..n).map(|i| ((i * 7919) % v) as u32).collect::<Vec<_>>(), n, &dev).unwrap();
        let mask = Tensor::from_vec((0..n).map(|i| if i % 5 == 2 { 0f32 } else { 1.0 }).collect::<Vec<_>>(), n, &dev).unwrap();
        check(
            if train { "lm_head_cross_entropy (train)" } else { "lm_head_cross_entropy" },
            dtype,
            &[hidden, w],
            |x| fused::lm_head_cross_entropy(&x[0], &x[1], &target, &mask, train).unwrap(),
            |x| {
                let logits = x[0].matmul(&x[1].t().unwrap()).unwrap().unsqueeze(0).unwrap();
                let (t3, m3) = (target.unsqueeze(0).unwrap(), mask.unsqueeze(0).unwrap());
                // the composed loss is the mean over unmasked rows: times their count, the sum
                let lse = masked_cross_entropy_with(&logits, &t3, &m3, Kernels::Composed).unwrap();
                (lse * mask.sum_all().unwrap().to_scalar::<f32>().unwrap() as f64).unwrap()
            },
        );
    }
}

/// A tiny model (`intermediate_size` 340, not a multiple of 8: the padded MLP path), its
/// weights, and a batch of 3 x 41 tokens.
struct Tiny {
    varmap: candle_nn::VarMap,
    fused: Llama,
    composed: Llama,
    input: Tensor,
    target: Tensor,
    mask: Tensor,
}

fn tiny(dtype: DType, dev: &Device) -> Tiny {
    let mut cfg = LlamaConfig::preset("tiny", 300).unwrap();
    cfg.max_seq_len = 64;
    cfg.intermediate_size = 340;
    let varmap = init_params(&cfg, 7, dtype, dev).unwrap();
    let vb = VarBuilder::from_varmap(&varmap, dtype, dev);
    let fused = Llama::new(&cfg, vb.clone()).unwrap().with_kernels(Kernels::Fused).unwrap();
    let composed = Llama::new(&cfg, vb).unwrap().with_kernels(Kernels::Composed).unwrap();
    let ids: Vec<u32> = (0..3 * 41).map(|i| ((i * 31 + 7) % 300) as u32).collect();
    let input = Tensor::from_vec(ids.clone(), (3, 41), dev).unwrap();
    let target = Tensor::from_vec(ids.iter().map(|&i| (i + 1) % 300).collect::<Vec<u32>>(), (3, 41), dev).unwrap();
    let mask = Tensor::from_vec((0..3 * 41).map(|i| if i % 7 == 3 { 0f32 } else { 1.0 }).collect::<Vec<_>>(), (3, 41), dev).unwrap();
    Tiny { varmap, fused, composed, input, target, mask }
}

/// The whole model: logits, loss and the gradient of every parameter.
#[test]
fn model_matches_composed() {
    let dev = gpu();
    for dtype in DTYPES {
        let Tiny { varmap, fused, composed, input, target, mask } = tiny(dtype, &dev);
        let run = |m: &Llama| {
            let loss = m.loss(&input, &target, &mask).unwrap();
            (m.forward(&input).unwrap(), loss.backward().unwrap(), loss.to_scalar::<f32>().unwrap())
        };
        let (lf, gf, loss_f) = run(&fused);
        let eval = fused.eval_loss(&input, &target, &mask).unwrap().to_scalar::<f32>().unwrap();
        assert!((eval - loss_f).abs() <= 1e-6 * loss_f.abs(), "model {dtype:?}: eval_loss {eval} vs loss {loss_f}");
        let (lc, gc, loss_c) = run(&composed);
        let e = rel_err(&lf, &lc);
        assert!(e <= tol(dtype), "model {dtype:?} logits: relative error {e}");
        assert!((loss_f - loss_c).abs() <= 1e-2 * loss_c.abs().max(1.0), "model {dtype:?} loss {loss_f} vs {loss_c}");
        let grad_tol = if dtype == DType::BF16 { 6e-2 } else { 1e-4 };
        for (name, v) in varmap.data().lock().unwrap().iter() {
            let e = rel_err(gf.get(v.as_tensor()).unwrap(), gc.get(v.as_tensor()).unwrap());
            assert!(e <= grad_tol, "model {dtype:?} gradient of {name}: relative error {e}");
        }
    }
}

/// The explicit backward of the fused model (`Llama::training_pass`) against candle's
/// autograd over the same fused ops, with a loss scale of 0.3: the scaled loss (the same
/// kernels: equal to 1e-6) and every weight's gradient (the same ops; the sums of two
/// gradient contributions run in another order and, in BF16, round once more or less:
/// within 1e-5 in FP32 and one BF16 rounding, 1e-2, in BF16).
#[test]
fn explicit_backward_matches_autograd() {
    let dev = gpu();
    for dtype in DTYPES {
        let Tiny { varmap, fused, input, target, mask, .. } = tiny(dtype, &dev);
        let loss = fused.loss(&input, &target, &mask).unwrap().affine(0.3, 0.0).unwrap();
        let ga = loss.backward().unwrap();
        let pass = fused.training_pass(&input, &target, &mask, 0.3).unwrap();
        let (la, le) = (loss.to_scalar::<f32>().unwrap(), pass.loss().to_scalar::<f32>().unwrap());
        assert!((la - le).abs() <= 1e-6 * la.abs(), "{dtype:?}: explicit loss {le} vs autograd {la}");
        let ge = pass.backward().unwrap();
        let grad_tol = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
        for (name, v) in varmap.data().lock().unwrap().iter() {
            let (a, e) = (ga.get(v.as_tensor()).unwrap(), ge.get(v.as_tensor()).unwrap_or_else(|| panic!("no explicit gradient for {name}")));
            assert_eq!(a.dtype(), e.dtype(), "{name}");
            let err = rel_err(e, a);
            assert!(err <= grad_tol, "{dtype:?} explicit gradient of {name}: relative error {err}");
            println!("{dtype:?} explicit gradient of {name}: relative error {err:.2e}");
        }
    }
}
