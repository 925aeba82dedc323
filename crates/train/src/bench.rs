//! `train bench optimizer` (CUDA builds): speed of the fused optimizer step on the parameter
//! shapes of a model preset, from one run on one GPU:
//! * device copy bandwidth (device-to-device copy of a 1 GiB buffer: bytes read + written / s);
//! * per state format x rounding: step time over all tensors, effective GB/s (bytes the
//!   step must move: weights read+write, FP32 gradient read, m and v codes read+write,
//!   scales) and its fraction of copy bandwidth;
//! * stochastic / nearest time ratio per format.
//!
//! PyTorch's fused AdamW on the same shapes is timed by `scripts/bench_torch_adamw.py`;
//! `scripts/bench_optimizer.sh` runs both and writes `bench/optimizer_<gpu>.md`.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use lowbit_model::{init::param_specs, LlamaConfig};
use lowbit_optim::cuda::CudaAdamW;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, Rounding, StatesConfig};
use std::time::Instant;

/// One measured configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    pub m_format: String,
    pub v_format: String,
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

/// Device copy bandwidth in GB/s (read + write bytes per second).
fn copy_bandwidth(dev: &Device, iters: usize) -> Result<f64> {
    let n = 1usize << 28; // 1 GiB of f32
    let src = Tensor::zeros(n, DType::F32, dev)?;
    let mut dst = src.copy()?;
    sync(dev)?;
    let t = Instant::now();
    for _ in 0..iters {
        dst = src.copy()?;
    }
    sync(dev)?;
    drop(dst);
    Ok(2.0 * 4.0 * n as f64 * iters as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// Bytes one step must move for `n` elements: weights and codes (+ scales) read and
/// written, the FP32 gradient read.
fn bytes_moved(spec: &lowbit_optim::StatesSpec, n: usize, weight_bytes: usize) -> u64 {
    let codes = |f: lowbit_optim::StateFormat| 2 * f.storage_bytes(n, spec.block_size);
    (2 * weight_bytes * n + 4 * n + codes(spec.m_format) + codes(spec.v_format)) as u64
}

/// Run the benchmark on the shapes of `preset`; prints a markdown table and returns rows.
pub fn optimizer(preset: &str, iters: usize) -> Result<(f64, Vec<BenchRow>)> {
    let dev = Device::new_cuda(0).context("bench needs a CUDA device")?;
    let cuda = match &dev {
        Device::Cuda(d) => d.clone(),
        _ => unreachable!(),
    };
    let mcfg = LlamaConfig::preset(preset, 32100).with_context(|| format!("unknown preset {preset}"))?;
    let specs = param_specs(&mcfg);
    let n: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
    let copy = copy_bandwidth(&dev, 20)?;
    println!("preset {preset}: {n} parameters in {} tensors; device copy bandwidth {copy:.0} GB/s", specs.len());
    let grads: Vec<Tensor> = specs
        .iter()
        .map(|s| Tensor::randn(0f32, 1e-3, s.shape.as_slice(), &dev))
        .collect::<candle_core::Result<_>>()?;
    let mut rows = vec![];
    let formats = [("fp32", "fp32"), ("bf16", "bf16"), ("fp8e4m3", "fp8e4m3"), ("fp8e5m2", "fp8e5m2"), ("fp4e2m1", "fp4ue2m2"), ("int8", "int8")];
    for weights in [DType::F32, DType::BF16] {
        let params: Vec<Tensor> = specs
            .iter()
            .map(|s| Tensor::randn(0f32, 0.02, s.shape.as_slice(), &dev).and_then(|t| t.to_dtype(weights)))
            .collect::<candle_core::Result<_>>()?;
        for (m, v) in formats {
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let states = StatesConfig {
                    m_format: m.into(),
                    v_format: v.into(),
                    m_rounding: rounding,
                    v_rounding: rounding,
                    weight_rounding: rounding,
                    block_size: if m == "int8" { 2048 } else { 128 },
                    ..Default::default()
                };
                let spec = states.resolve().map_err(anyhow::Error::msg)?;
                let infos = specs
                    .iter()
                    .map(|s| ParamInfo { name: s.name.clone(), group: "x".into(), len: s.shape.iter().product(), weight_decay: true })
                    .collect();
                let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
                let mut opt = CudaAdamW::new(LowbitAdamW::new(hyper, spec, 0, infos), &cuda)?;
                let mut step = |s: u64| -> Result<()> {
                    opt.begin_step(s)?;
                    for (i, (p, g)) in params.iter().zip(&grads).enumerate() {
                        opt.step_tensor(s, 1e-4, 1.0, i, p, g)?;
                    }
                    Ok(())
                };
                for s in 1..=3 {
                    step(s)?;
                }
                sync(&dev)?;
                let t = Instant::now();
                for s in 4..4 + iters as u64 {
                    step(s)?;
                }
                sync(&dev)?;
                let secs = t.elapsed().as_secs_f64() / iters as f64;
                let wb = if weights == DType::F32 { 4 } else { 2 };
                let bytes = bytes_moved(&spec, n, wb);
                let gbs = bytes as f64 / secs / 1e9;
                rows.push(BenchRow {
                    m_format: m.into(),
                    v_format: v.into(),
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
         | weights | m / v | rounding | step (ms) | moved (MB) | GB/s | of copy | SR / nearest |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let ratio = if r.rounding == "stochastic" {
            rows.iter()
                .find(|n| n.rounding == "nearest" && n.m_format == r.m_format && n.weights == r.weights)
                .map_or("-".into(), |n| format!("{:.3}", r.step_ms / n.step_ms))
        } else {
            "".into()
        };
        s += &format!(
            "| {} | {} / {} | {} | {:.3} | {:.0} | {:.0} | {:.0}% | {} |\n",
            r.weights,
            r.m_format,
            r.v_format,
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
