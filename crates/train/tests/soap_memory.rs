//! SOAP's optimizer-state bytes per parameter, as the README's SOAP section gives them: the
//! states a run builds (`lowbit_train::optimizer::states`, counted by
//! `LowbitAdamW::state_bytes`, the start banner's bytes/param) for LLaMA-20M and LLaMA-100M
//! (T5 vocabulary, 32,100) with the main table's FP32, BF16, FP8 and FP4 states, under AdamW
//! and under `optim.kind = "soap"` at `[optim.soap]`'s defaults, checked against the same count
//! made from the tensor shapes.

use candle_core::{DType, Device, Var};
use lowbit_model::param_specs;
use lowbit_optim::StatesPlan;
use lowbit_train::config::RunConfig;
use lowbit_train::model::ParamSet;
use lowbit_train::optimizer::states;
use std::path::Path;

/// Bytes of one state of `n` elements in a format of `bits` per element with one FP32 scale
/// per `block` elements (`Some(0)`: one per tensor; `None`: unscaled).
fn state(n: usize, bits: usize, block: Option<usize>) -> usize {
    let scales = block.map_or(0, |b| if b == 0 { 1 } else { n.div_ceil(b) });
    (n * bits).div_ceil(8) + 4 * scales
}

/// (parameters, state bytes under AdamW, under SOAP) of `preset` with the states of the main
/// table's `<format>_plain` cell, from the run's own code.
fn measured(preset: &str, format: &str) -> (usize, usize, usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../configs/llama100m_{format}_plain.toml"));
    let load = |kind: &str| RunConfig::load(&path, &[format!("model.preset=\"{preset}\""), format!("optim.kind=\"{kind}\"")]).unwrap();
    let cfg = load("adamw");
    let m = cfg.model_config(32_100).unwrap();
    // the model's tensors in the optimizer's order (by name); their values do not matter
    let mut specs = param_specs(&m);
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    let params = ParamSet {
        names: specs.iter().map(|s| s.name.clone()).collect(),
        vars: specs.iter().map(|s| Var::zeros(s.shape.as_slice(), DType::BF16, &Device::Cpu).unwrap()).collect(),
    };
    let bytes = |cfg: &RunConfig| {
        let plan = StatesPlan::resolve(&cfg.optim.states, cfg.optim.beta2).unwrap();
        let opt = states(cfg, plan, &params).unwrap();
        // the banner's and summary.json's per-group bytes add up to the same total
        let groups: usize = lowbit_train::logs::summary::StateGroup::of(opt.states()).iter().map(|g| g.state_bytes).sum();
        assert_eq!(groups, opt.states().state_bytes(), "{preset} {format}: state_groups");
        opt.states().state_bytes()
    };
    (params.num_params(), bytes(&cfg), bytes(&load("soap")))
}

/// The same from the shapes: m and v per tensor; under SOAP each matrix side of at most
/// 10,000 also holds its preconditioner (side², m's format) and its FP32 eigenbasis (side²).
fn counted(preset: &str, format: &str) -> (usize, usize, usize) {
    let m = lowbit_model::LlamaConfig::preset(preset, 32_100).unwrap();
    // (bits of m, of v, scale block): the main table's formats (FP8 E4M3 per tensor, FP4 in 128-blocks)
    let (bits_m, bits_v, block) = match format {
        "fp32" => (32, 32, None),
        "bf16" => (16, 16, None),
        "fp8" => (8, 8, Some(0)),
        "fp4" => (4, 4, Some(128)),
        f => panic!("{f}"),
    };
    let (mut params, mut adamw, mut soap) = (0, 0, 0);
    for s in param_specs(&m) {
        let n: usize = s.shape.iter().product();
        params += n;
        adamw += state(n, bits_m, block) + state(n, bits_v, block);
        if let [rows, cols] = s.shape[..] {
            soap += [rows, cols].iter().filter(|&&k| k <= 10_000).map(|&k| state(k * k, bits_m, block) + 4 * k * k).sum::<usize>();
        }
    }
    (params, adamw, adamw + soap)
}

/// Bytes per parameter, AdamW and SOAP, to 2 decimals: the README's table. SOAP's FP32
/// eigenbases are half of what it adds to FP32 states: 1.77 (20M) and 6.39 (100M).
const TABLE: [(&str, &str, &str, &str); 8] = [
    ("llama20m", "fp32", "8.00", "11.55"),
    ("llama20m", "bf16", "4.00", "6.66"),
    ("llama20m", "fp8", "2.00", "4.22"),
    ("llama20m", "fp4", "1.06", "3.07"),
    ("llama100m", "fp32", "8.00", "20.78"),
    ("llama100m", "bf16", "4.00", "13.58"),
    ("llama100m", "fp8", "2.00", "9.99"),
    ("llama100m", "fp4", "1.06", "8.30"),
];

#[test]
fn soap_state_bytes_per_parameter() {
    for (preset, format, adamw, soap) in TABLE {
        let (params, a, s) = measured(preset, format);
        assert_eq!((params, a, s), counted(preset, format), "{preset} {format}");
        let per = |b: usize| format!("{:.2}", b as f64 / params as f64);
        assert_eq!((per(a).as_str(), per(s).as_str()), (adamw, soap), "{preset} {format}");
    }
}
