//! `train bench optimizer` (CUDA builds): speed of the fused optimizer step on the parameter
//! shapes of a model preset, from one run on one GPU:
//! * device copy bandwidth (the driver's device-to-device copy of 1 GiB: bytes read + written / s,
//!   after a warm-up);
//! * per state format x scale kind (FP8/FP4: `pow2` and `amax`, in 128-blocks and, for E4M3,
//!   per tensor) x rounding: step time over all tensors (median of 7 windows of `--iters`
//!   steps; a format's nearest and stochastic windows alternate), effective GB/s (bytes the
//!   step must move: weights read+write, gradient read (in the weights' dtype, as training
//!   with one micro-batch passes them), m and v codes read+write, scales) and its fraction of
//!   copy bandwidth;
//! * stochastic / nearest time ratio per format, and amax / pow2 per format and rounding.
//!
//! PyTorch's fused AdamW on the same shapes is timed by `scripts/bench_torch_adamw.py`;
//! `scripts/bench_optimizer.sh` runs both and writes `bench/optimizer_<gpu>.md`.

use anyhow::{Context, Result};
use candle_core::{CudaDevice, DType, Device, Tensor};
use lowbit_model::init::{param_specs, ParamSpec};
use lowbit_model::LlamaConfig;
use lowbit_optim::cuda::adamw::CudaAdamW;
use lowbit_optim::{GradScale, Hyper, Moments, ParamInfo, Rounding, ScaleKind, StatesConfig, StatesSpec};
use std::time::Instant;

/// Timed windows per configuration; the median is reported (also `bench lm-head`'s).
pub(crate) const REPEATS: usize = 7;

/// One measured configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    pub m_format: String,
    pub v_format: String,
    /// Scale block length: `Some(0)` one scale per tensor, `None` for unscaled formats.
    pub block: Option<usize>,
    /// Scale kind of FP8/FP4 states (`amax` / `pow2`), `None` for the others.
    pub scale: Option<String>,
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

/// Median of timed windows (the upper one of an even count); also `bench soap`'s and
/// `bench lm-head`'s.
pub(crate) fn median(mut windows: Vec<f64>) -> f64 {
    windows.sort_by(f64::total_cmp);
    windows[windows.len() / 2]
}

/// Bytes one step must move for `n` elements: weights and codes (+ scales) read and
/// written, the gradient (in the weights' dtype) read.
fn bytes_moved(spec: &lowbit_optim::StatesSpec, n: usize, weight_bytes: usize) -> u64 {
    let codes = |f: lowbit_optim::StateFormat| 2 * f.storage_bytes(n, spec.block_size);
    (3 * weight_bytes * n + codes(spec.m_format) + codes(spec.v_format)) as u64
}

/// The (m, v, block size, scale kind) pairs stepped: int8 twice, bitsandbytes' block of 2048
/// and the FP8/FP4 block of 128; FP8/FP4 with both scale kinds, E4M3 also per tensor (the
/// paper's FP8: a global amax pass first).
const FORMATS: [(&str, &str, Option<usize>, Option<ScaleKind>); 12] = [
    ("fp32", "fp32", None, None),
    ("bf16", "bf16", None, None),
    ("fp8e4m3", "fp8e4m3", Some(128), Some(ScaleKind::Pow2)),
    ("fp8e4m3", "fp8e4m3", Some(128), Some(ScaleKind::Amax)),
    ("fp8e4m3", "fp8e4m3", Some(0), Some(ScaleKind::Pow2)),
    ("fp8e4m3", "fp8e4m3", Some(0), Some(ScaleKind::Amax)),
    ("fp8e5m2", "fp8e5m2", Some(128), Some(ScaleKind::Pow2)),
    ("fp8e5m2", "fp8e5m2", Some(128), Some(ScaleKind::Amax)),
    ("fp4e2m1", "fp4ue2m2", Some(128), Some(ScaleKind::Pow2)),
    ("fp4e2m1", "fp4ue2m2", Some(128), Some(ScaleKind::Amax)),
    ("int8", "int8", Some(2048), None),
    ("int8", "int8", Some(128), None),
];

/// The fused optimizer of the states `(m, v, block, scale)` with `rounding` for the tensors
/// `specs` on `cuda`, after 3 warm-up steps on `params` and `grads`, with its resolved states.
fn warm_optimizer(
    specs: &[ParamSpec],
    cuda: &CudaDevice,
    (m, v, block, scale): (&str, &str, Option<usize>, Option<ScaleKind>),
    rounding: Rounding,
    params: &[Tensor],
    grads: &[Tensor],
) -> Result<(StatesSpec, CudaAdamW)> {
    let states = StatesConfig {
        m_format: m.into(),
        v_format: v.into(),
        m_rounding: rounding,
        v_rounding: rounding,
        weight_rounding: rounding,
        block_size: block.unwrap_or(128),
        scale: scale.map_or(Default::default(), Into::into),
        ..Default::default()
    };
    let spec = states.resolve(0.999).map_err(anyhow::Error::msg)?;
    let infos = specs
        .iter()
        .map(|s| ParamInfo { name: s.name.clone(), group: "x".into(), len: s.shape.iter().product(), weight_decay: true })
        .collect();
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
    let mut opt = CudaAdamW::new(Moments::new(hyper, spec, 0, infos), cuda)?;
    for s in 1..=3 {
        opt.step(s, 1e-4, GradScale::Host(1.0), params, grads)?;
    }
    Ok((spec, opt))
}

/// Run the benchmark on the shapes of `preset` for the m formats in `only_formats` and the
/// weight dtypes in `only_weights` (empty: all); returns the copy bandwidth and the rows.
pub fn optimizer(preset: &str, iters: usize, only_formats: &[String], only_weights: &[String]) -> Result<(f64, Vec<BenchRow>)> {
    let wanted = |list: &[String], x: &str| list.is_empty() || list.iter().any(|l| l == x);
    let cuda = lowbit_train::device::open_cuda(0).context("bench needs a CUDA device")?;
    let dev = Device::Cuda(cuda.clone());
    let mcfg = LlamaConfig::preset(preset, 32100).with_context(|| format!("unknown preset {preset}"))?;
    let specs = param_specs(&mcfg);
    let n: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
    let copy = copy_bandwidth(&cuda, 20)?;
    lowbit_train::outln!("preset {preset}: {n} parameters in {} tensors; device copy bandwidth {copy:.0} GB/s", specs.len());
    let grads: Vec<Tensor> =
        specs.iter().map(|s| Tensor::randn(0f32, 1e-3, s.shape.as_slice(), &dev)).collect::<candle_core::Result<_>>()?;
    let mut rows = vec![];
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
        for (m, v, block, scale) in FORMATS.into_iter().filter(|f| wanted(only_formats, f.0)) {
            // one optimizer per rounding (both states in memory at once), their windows
            // interleaved so that clock or thermal drift during the run moves both medians alike
            let roundings = [Rounding::Nearest, Rounding::Stochastic];
            let mut opts = Vec::with_capacity(roundings.len());
            for rounding in roundings {
                let (spec, opt) = warm_optimizer(&specs, &cuda, (m, v, block, scale), rounding, &params, &grads)?;
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
                        opt.step(s, 1e-4, GradScale::Host(1.0), &params, &grads)?;
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
                    scale: scale.map(|k| k.as_str().into()),
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

/// Markdown table of the rows with the SR/nearest ratio per format and weight dtype, and the
/// amax/pow2 ratio of the amax rows.
pub fn render(preset: &str, copy: f64, rows: &[BenchRow]) -> String {
    let mut s = format!(
        "### lowbit fused AdamW step, {preset} shapes\n\ndevice copy bandwidth: {copy:.0} GB/s (read + write)\n\n\
         | weights | m / v | block | scale | rounding | step (ms) | moved (MB) | GB/s | of copy | SR / nearest | amax / pow2 |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let same = |a: &BenchRow, b: &BenchRow| a.m_format == b.m_format && a.block == b.block && a.weights == b.weights;
    let ratio = |r: &BenchRow, base: Option<&BenchRow>| base.map_or("-".into(), |b| format!("{:.3}", r.step_ms / b.step_ms));
    for r in rows {
        let sr = match r.rounding.as_str() {
            "stochastic" => ratio(r, rows.iter().find(|n| n.rounding == "nearest" && same(n, r) && n.scale == r.scale)),
            _ => String::new(),
        };
        let kind = match r.scale.as_deref() {
            Some("amax") => ratio(r, rows.iter().find(|n| n.scale.as_deref() == Some("pow2") && same(n, r) && n.rounding == r.rounding)),
            _ => String::new(),
        };
        s += &format!(
            "| {} | {} / {} | {} | {} | {} | {:.3} | {:.0} | {:.0} | {:.0}% | {sr} | {kind} |\n",
            r.weights,
            r.m_format,
            r.v_format,
            match r.block {
                None => "-".to_string(),
                Some(0) => "tensor".to_string(),
                Some(b) => b.to_string(),
            },
            r.scale.as_deref().unwrap_or("-"),
            r.rounding,
            r.step_ms,
            r.bytes_moved as f64 / 1e6,
            r.gb_per_s,
            100.0 * r.fraction_of_copy,
        );
    }
    s
}
