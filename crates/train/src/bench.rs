//! `train bench optimizer` (CUDA builds): speed of the fused optimizer step on the parameter
//! shapes of a model preset, from one run on one GPU:
//! * device copy bandwidth (the driver's device-to-device copy of 1 GiB: bytes read + written / s,
//!   after a warm-up);
//! * per state format x rounding: step time over all tensors (median of 7 windows of
//!   `--iters` steps; a format's nearest and stochastic windows alternate), effective GB/s
//!   (bytes the step must move: weights read+write, gradient read (in the weights' dtype, as
//!   training with one micro-batch passes them), m and v codes read+write, scales) and its
//!   fraction of copy bandwidth;
//! * stochastic / nearest time ratio per format.
//!
//! PyTorch's fused AdamW on the same shapes is timed by `scripts/bench_torch_adamw.py`;
//! `scripts/bench_optimizer.sh` runs both and writes `bench/optimizer_<gpu>.md`.

use anyhow::{Context, Result};
use candle_core::{CudaDevice, DType, Device, Tensor};
use lowbit_model::{init::param_specs, LlamaConfig};
use lowbit_optim::cuda::CudaAdamW;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, Rounding, StatesConfig};
use std::time::Instant;

/// Timed windows per configuration; the median is reported.
const REPEATS: usize = 7;

/// One measured configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    pub m_format: String,
    pub v_format: String,
    /// Scale block length (0 for unscaled formats).
    pub block: usize,
    pub rounding: String,
    pub weights: String,
    pub step_ms: f64,
    pub bytes_moved: u64,
    pub gb_per_s: f64,
    pub fraction_of_copy: f64,
}

fn sync(dev: &Device) -> Result<()> {
    dev.synchronize()?;
    Ok(())
}

/// Device copy bandwidth in GB/s (read + write bytes per second): `cuMemcpyDtoDAsync` of a
/// 1 GiB buffer, the driver's own copy; the median of REPEATS windows of `iters` copies after
/// ~0.1 s of copies that bring the clocks up (a GPU fresh from idle copied 25% slower).
fn copy_bandwidth(dev: &CudaDevice, iters: usize) -> Result<f64> {
    let stream = dev.cuda_stream();
    let n = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(n)?;
    let mut dst = stream.alloc_zeros::<u8>(n)?;
    for _ in 0..200 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    stream.synchronize()?;
    let mut windows = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let t = Instant::now();
        for _ in 0..iters {
            stream.memcpy_dtod(&src, &mut dst)?;
        }
        stream.synchronize()?;
        windows.push(2.0 * n as f64 * iters as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(median(windows))
}

/// Median of the REPEATS timed windows.
fn median(mut windows: Vec<f64>) -> f64 {
    windows.sort_by(f64::total_cmp);
    windows[windows.len() / 2]
}

/// Bytes one step must move for `n` elements: weights and codes (+ scales) read and
/// written, the gradient (in the weights' dtype) read.
fn bytes_moved(spec: &lowbit_optim::StatesSpec, n: usize, weight_bytes: usize) -> u64 {
    let codes = |f: lowbit_optim::StateFormat| 2 * f.storage_bytes(n, spec.block_size);
    (3 * weight_bytes * n + codes(spec.m_format) + codes(spec.v_format)) as u64
}

/// Run the benchmark on the shapes of `preset` for the m formats in `only_formats` and the
/// weight dtypes in `only_weights` (empty: all); returns the copy bandwidth and the rows.
pub fn optimizer(preset: &str, iters: usize, only_formats: &[String], only_weights: &[String]) -> Result<(f64, Vec<BenchRow>)> {
    let wanted = |list: &[String], x: &str| list.is_empty() || list.iter().any(|l| l == x);
    let cuda = lowbit_optim::cuda::open_device(0).context("bench needs a CUDA device")?;
    let dev = Device::Cuda(cuda.clone());
    let mcfg = LlamaConfig::preset(preset, 32100).with_context(|| format!("unknown preset {preset}"))?;
    let specs = param_specs(&mcfg);
    let n: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
    let copy = copy_bandwidth(&cuda, 20)?;
    crate::outln!("preset {preset}: {n} parameters in {} tensors; device copy bandwidth {copy:.0} GB/s", specs.len());
    let grads: Vec<Tensor> = specs
        .iter()
        .map(|s| Tensor::randn(0f32, 1e-3, s.shape.as_slice(), &dev))
        .collect::<candle_core::Result<_>>()?;
    let mut rows = vec![];
    // int8 twice: bitsandbytes' block of 2048 and the FP8/FP4 block of 128
    let formats = [
        ("fp32", "fp32", 0),
        ("bf16", "bf16", 0),
        ("fp8e4m3", "fp8e4m3", 128),
        ("fp8e5m2", "fp8e5m2", 128),
        ("fp4e2m1", "fp4ue2m2", 128),
        ("int8", "int8", 2048),
        ("int8", "int8", 128),
    ];
    for weights in [DType::F32, DType::BF16] {
        if !wanted(only_weights, if weights == DType::F32 { "f32" } else { "bf16" }) {
            continue;
        }
        let params: Vec<Tensor> = specs
            .iter()
            .map(|s| Tensor::randn(0f32, 0.02, s.shape.as_slice(), &dev).and_then(|t| t.to_dtype(weights)))
            .collect::<candle_core::Result<_>>()?;
        // gradients in the weights' dtype, as a BF16 model's backward gives them (and PyTorch's
        // fused AdamW reads them)
        let grads: Vec<Tensor> = grads.iter().map(|g| g.to_dtype(weights)).collect::<candle_core::Result<_>>()?;
        for (m, v, block) in formats.into_iter().filter(|f| wanted(only_formats, f.0)) {
            // one optimizer per rounding (both states in memory at once), their windows
            // interleaved so that clock or thermal drift during the run moves both medians alike
            let roundings = [Rounding::Nearest, Rounding::Stochastic];
            let mut opts = Vec::with_capacity(roundings.len());
            for rounding in roundings {
                let states = StatesConfig {
                    m_format: m.into(),
                    v_format: v.into(),
                    m_rounding: rounding,
                    v_rounding: rounding,
                    weight_rounding: rounding,
                    block_size: if block == 0 { 128 } else { block },
                    ..Default::default()
                };
                let spec = states.resolve(0.999).map_err(anyhow::Error::msg)?;
                let infos = specs
                    .iter()
                    .map(|s| ParamInfo { name: s.name.clone(), group: "x".into(), len: s.shape.iter().product(), weight_decay: true })
                    .collect();
                let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
                let mut opt = CudaAdamW::new(LowbitAdamW::new(hyper, spec, 0, infos), &cuda)?;
                for s in 1..=3 {
                    opt.step(s, 1e-4, 1.0, &params, &grads)?;
                }
                opts.push((rounding, spec, opt, Vec::with_capacity(REPEATS)));
            }
            // median over REPEATS windows of `iters` steps (one window is ~10 ms: the spread
            // between windows is a few percent), in the order N S S N N S ... so that a linear
            // drift cancels; the step counter is shared (each optimizer sees gaps: harmless)
            let mut s = 4u64;
            for r in 0..REPEATS {
                for i in [r % 2, 1 - r % 2] {
                    let (_, _, opt, windows) = &mut opts[i];
                    sync(&dev)?;
                    let t = Instant::now();
                    for _ in 0..iters {
                        opt.step(s, 1e-4, 1.0, &params, &grads)?;
                        s += 1;
                    }
                    sync(&dev)?;
                    windows.push(t.elapsed().as_secs_f64() / iters as f64);
                }
            }
            for (rounding, spec, _, windows) in opts {
                let secs = median(windows);
                let wb = if weights == DType::F32 { 4 } else { 2 };
                let bytes = bytes_moved(&spec, n, wb);
                let gbs = bytes as f64 / secs / 1e9;
                rows.push(BenchRow {
                    m_format: m.into(),
                    v_format: v.into(),
                    block,
                    rounding: rounding.as_str().into(),
                    weights: if wb == 4 { "f32".into() } else { "bf16".into() },
                    step_ms: secs * 1e3,
                    bytes_moved: bytes,
                    gb_per_s: gbs,
                    fraction_of_copy: gbs / copy,
                });
            }
        }
    }
    Ok((copy, rows))
}

/// Markdown table of the rows with the SR/nearest ratio per format and weight dtype.
pub fn render(preset: &str, copy: f64, rows: &[BenchRow]) -> String {
    let mut s = format!(
        "### lowbit fused AdamW step, {preset} shapes\n\ndevice copy bandwidth: {copy:.0} GB/s (read + write)\n\n\
         | weights | m / v | block | rounding | step (ms) | moved (MB) | GB/s | of copy | SR / nearest |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let ratio = if r.rounding == "stochastic" {
            rows.iter()
                .find(|n| n.rounding == "nearest" && n.m_format == r.m_format && n.block == r.block && n.weights == r.weights)
                .map_or("-".into(), |n| format!("{:.3}", r.step_ms / n.step_ms))
        } else {
            "".into()
        };
        s += &format!(
            "| {} | {} / {} | {} | {} | {:.3} | {:.0} | {:.0} | {:.0}% | {} |\n",
            r.weights,
            r.m_format,
            r.v_format,
            if r.block == 0 { "-".to_string() } else { r.block.to_string() },
            r.rounding,
            r.step_ms,
            r.bytes_moved as f64 / 1e6,
            r.gb_per_s,
            100.0 * r.fraction_of_copy,
            ratio
        );
    }
    s
}
