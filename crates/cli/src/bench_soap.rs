//! `train bench optimizer --optimizer soap` (CUDA builds): SOAP's step on the parameter shapes
//! of a model preset beside lowbit's fused AdamW step with the same states, from one run on one
//! GPU, BF16 weights, per state format (FP32, BF16, FP8 E4M3 per tensor as the paper's FP8
//! cells, FP4 in 128-blocks): the states' bytes per parameter (moments, preconditioners L and
//! R in the states' format, FP32 eigenbases), AdamW's step, SOAP's step between refreshes, a
//! refresh step (one QR power step per preconditioner on the GPU, `optim.soap`'s defaults),
//! the first update (full eigendecompositions on the host), and the step amortised over the refresh
//! interval with the refresh's share of it.

use crate::bench::median;
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use lowbit_model::{init::param_specs, LlamaConfig};
use lowbit_optim::{GradScale, Hyper, LowbitAdamW, LowbitOptimizer, LowbitSoap, Moments, ParamInfo, SoapConfig, StatesConfig};
use std::time::Instant;

/// One measured state format.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoapRow {
    pub states: String,
    /// Optimizer state bytes per parameter: AdamW's, SOAP's.
    pub adamw_bytes_per_param: f64,
    pub soap_bytes_per_param: f64,
    /// Milliseconds: AdamW's step, SOAP's between refreshes, with a refresh, the first update.
    pub adamw_ms: f64,
    pub soap_ms: f64,
    pub refresh_ms: f64,
    pub first_ms: f64,
    /// SOAP's step amortised over `precondition_frequency` updates, and the refresh's share.
    pub amortised_ms: f64,
    pub refresh_share: f64,
}

/// Time SOAP and AdamW on `preset`'s shapes over `cycles` refresh intervals (at least 2): every
/// update timed alone (SOAP reads its stall counts at each update's end, so it synchronises),
/// medians reported.
pub fn soap(preset: &str, cycles: u64) -> Result<Vec<SoapRow>> {
    let cuda = lowbit_train::device::open_cuda(0).context("bench needs a CUDA device")?;
    let dev = Device::Cuda(cuda);
    let mcfg = LlamaConfig::preset(preset, 32100).with_context(|| format!("unknown preset {preset}"))?;
    let specs = param_specs(&mcfg);
    let n: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
    let params: Vec<Var> = specs
        .iter()
        .map(|s| {
            Tensor::randn(0f32, 0.02, s.shape.as_slice(), &dev).and_then(|t| t.to_dtype(DType::BF16)).and_then(|t| Var::from_tensor(&t))
        })
        .collect::<candle_core::Result<_>>()?;
    let grads: Vec<Tensor> = specs
        .iter()
        .map(|s| Tensor::randn(0f32, 1e-3, s.shape.as_slice(), &dev).and_then(|t| t.to_dtype(DType::BF16)))
        .collect::<candle_core::Result<_>>()?;
    let dims: Vec<Vec<usize>> = specs.iter().map(|s| s.shape.clone()).collect();
    let cfg = SoapConfig::default();
    let f = cfg.precondition_frequency;
    let mut rows = vec![];
    for (name, m, v, block) in
        [("fp32", "fp32", "fp32", 128), ("bf16", "bf16", "bf16", 128), ("fp8 per tensor", "fp8", "fp8", 0), ("fp4", "fp4", "fp4", 128)]
    {
        let states = StatesConfig { m_format: m.into(), v_format: v.into(), block_size: block, ..Default::default() };
        let spec = states.resolve(0.999).map_err(anyhow::Error::msg)?;
        let infos = specs
            .iter()
            .map(|s| ParamInfo { name: s.name.clone(), group: "x".into(), len: s.shape.iter().product(), weight_decay: s.shape.len() == 2 })
            .collect();
        let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
        let moments = Moments::new(hyper, spec, 0, infos);
        let soap = LowbitOptimizer::Soap(LowbitSoap::new(moments.clone(), cfg, &dims));
        let adamw = LowbitOptimizer::AdamW(LowbitAdamW::from_moments(moments));
        let bytes = |o: &LowbitOptimizer| o.states().state_bytes() as f64 / n as f64;
        let (adamw_bytes, soap_bytes) = (bytes(&adamw), bytes(&soap));
        let time = |opt: &mut Box<dyn lowbit_optim::Optimizer>, s: u64| -> Result<f64> {
            dev.synchronize()?;
            let t = Instant::now();
            opt.step(s, 1e-4, GradScale::Host(1.0), &params, &grads)?;
            opt.stall_counts(s)?;
            dev.synchronize()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        let mut a = lowbit_optim::for_device(adamw, &dev)?;
        let mut s = lowbit_optim::for_device(soap, &dev)?;
        let first = time(&mut s, 1)?;
        let (mut plain, mut refresh, mut fused) = (vec![], vec![], vec![]);
        for u in 2..=cycles.max(2) * f {
            let ms = time(&mut s, u)?;
            if u % f == 0 {
                refresh.push(ms)
            } else {
                plain.push(ms)
            }
            fused.push(time(&mut a, u)?);
        }
        let (soap_ms, refresh_ms) = (median(plain), median(refresh));
        let amortised = ((f - 1) as f64 * soap_ms + refresh_ms) / f as f64;
        rows.push(SoapRow {
            states: name.into(),
            adamw_bytes_per_param: adamw_bytes,
            soap_bytes_per_param: soap_bytes,
            adamw_ms: median(fused),
            soap_ms,
            refresh_ms,
            first_ms: first,
            amortised_ms: amortised,
            refresh_share: (refresh_ms - soap_ms) / f as f64 / amortised,
        });
    }
    Ok(rows)
}

/// Markdown table of the rows.
pub fn render(preset: &str, rows: &[SoapRow]) -> String {
    let f = SoapConfig::default().precondition_frequency;
    let mut s = format!(
        "### SOAP step beside lowbit's fused AdamW step, {preset} shapes, BF16 weights (refresh every {f} updates)\n\n\
         | states | bytes/param AdamW | bytes/param SOAP | AdamW (ms) | SOAP (ms) | refresh step (ms) | first update (ms) | SOAP amortised (ms) | refresh share | SOAP / AdamW |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        s += &format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.0} | {:.2} | {:.1}% | {:.1}x |\n",
            r.states,
            r.adamw_bytes_per_param,
            r.soap_bytes_per_param,
            r.adamw_ms,
            r.soap_ms,
            r.refresh_ms,
            r.first_ms,
            r.amortised_ms,
            100.0 * r.refresh_share,
            r.amortised_ms / r.adamw_ms
        );
    }
    s
}
