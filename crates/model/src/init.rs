//! Deterministic parameter initialisation into a [`candle_nn::VarMap`].
//!
//! Values are drawn on the host with ChaCha8 (one independent stream per tensor, keyed by the
//! tensor's position in [`param_specs`]) and a Box–Muller transform, so the same seed gives
//! bit-identical weights on every device and platform; they are then converted to the target
//! dtype and moved to the target device.

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::VarMap;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::config::{LlamaConfig, INIT_STD};

/// How a tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitKind {
    /// Normal(0, std).
    Normal(f64),
    /// All ones (RMSNorm gains).
    Ones,
}

/// One trainable tensor: HF name, shape, init.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// HF transformers name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Shape (`[out, in]` for linears, `[V, H]` for the embedding, `[H]` for norms).
    pub shape: Vec<usize>,
    /// Initialiser.
    pub init: InitKind,
}

/// Every trainable tensor of the model in a fixed order (embedding, layers 0..L, final norm,
/// head). Their element counts sum to [`LlamaConfig::num_parameters`].
pub fn param_specs(cfg: &LlamaConfig) -> Vec<ParamSpec> {
    let (v, h, i, kv) = (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.kv_dim());
    let n = InitKind::Normal(INIT_STD);
    let mut out = Vec::with_capacity(3 + 9 * cfg.num_layers);
    let mut push = |name: String, shape: Vec<usize>, init: InitKind| out.push(ParamSpec { name, shape, init });
    push("model.embed_tokens.weight".into(), vec![v, h], n);
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        push(format!("{p}.self_attn.q_proj.weight"), vec![h, h], n);
        push(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], n);
        push(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], n);
        push(format!("{p}.self_attn.o_proj.weight"), vec![h, h], n);
        push(format!("{p}.mlp.gate_proj.weight"), vec![i, h], n);
        push(format!("{p}.mlp.up_proj.weight"), vec![i, h], n);
        push(format!("{p}.mlp.down_proj.weight"), vec![h, i], n);
        push(format!("{p}.input_layernorm.weight"), vec![h], InitKind::Ones);
        push(format!("{p}.post_attention_layernorm.weight"), vec![h], InitKind::Ones);
    }
    push("model.norm.weight".into(), vec![h], InitKind::Ones);
    push("lm_head.weight".into(), vec![v, h], n);
    out
}

/// `n` samples of Normal(0, std) from ChaCha8 seeded with `seed`, stream `stream`.
pub fn normal_samples(seed: u64, stream: u64, n: usize, std: f64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut out = Vec::with_capacity(n + 1);
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    while out.len() < n {
        // u1 in (0, 1], u2 in [0, 1)
        let u1 = ((rng.next_u64() >> 11) + 1) as f64 * SCALE;
        let u2 = (rng.next_u64() >> 11) as f64 * SCALE;
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        out.push((r * c) as f32);
        out.push((r * s) as f32);
    }
    out.truncate(n);
    out
}

/// Fresh parameters for `cfg`, named as HF `LlamaForCausalLM`: Normal(0, 0.02) for the
/// embedding, every projection and `lm_head`; ones for the RMSNorm weights.
///
/// Deterministic in `seed`, identical on CPU and CUDA (drawn on the host in f32, then
/// `to_dtype(dtype)` and `to_device(device)`). Build the model with
/// `Llama::new(cfg, VarBuilder::from_varmap(&varmap, dtype, device))`.
pub fn init_params(cfg: &LlamaConfig, seed: u64, dtype: DType, device: &Device) -> Result<VarMap> {
    cfg.validate()?;
    let specs = param_specs(cfg);
    let host: Vec<Vec<f32>> = specs
        .par_iter()
        .enumerate()
        .map(|(idx, spec)| {
            let n: usize = spec.shape.iter().product();
            match spec.init {
                InitKind::Normal(std) => normal_samples(seed, idx as u64, n, std),
                InitKind::Ones => vec![1.0f32; n],
            }
        })
        .collect();
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().unwrap();
        for (spec, values) in specs.into_iter().zip(host) {
            let t = Tensor::from_vec(values, spec.shape.as_slice(), &Device::Cpu)?.to_dtype(dtype)?.to_device(device)?;
            data.insert(spec.name, Var::from_tensor(&t)?);
        }
    }
    Ok(varmap)
}
