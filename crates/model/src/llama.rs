//! The decoder: embedding → L × (pre-norm attention + pre-norm SwiGLU) → final norm → head:
//! its structure and weights; its passes, composed or fused, are in `passes.rs`.

use candle_core::{Device, Result, Tensor};
use candle_nn::VarBuilder;
use std::sync::OnceLock;

use crate::attention::{causal_mask, Attention};
use crate::config::LlamaConfig;
use crate::kernels::Kernels;
use crate::mlp::Mlp;
use crate::norm::RmsNorm;
use crate::rope::Rope;

/// One HF `LlamaDecoderLayer`.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) input_layernorm: RmsNorm,
    pub(crate) self_attn: Attention,
    pub(crate) post_attention_layernorm: RmsNorm,
    pub(crate) mlp: Mlp,
}

impl Block {
    fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_layernorm: RmsNorm::new(h, eps, vb.pp("input_layernorm"))?,
            self_attn: Attention::new(cfg, vb.pp("self_attn"))?,
            post_attention_layernorm: RmsNorm::new(h, eps, vb.pp("post_attention_layernorm"))?,
            mlp: Mlp::new(h, cfg.intermediate_size, vb.pp("mlp"))?,
        })
    }
}

/// LLaMA causal language model with HF `LlamaForCausalLM` tensor names and semantics
/// (pre-norm RMSNorm, RoPE rotate-half, causal GQA attention, SwiGLU, untied `lm_head`,
/// no biases). With [`Kernels::Composed`] every op is differentiable through candle's
/// autograd on CPU and CUDA; with [`Kernels::Fused`] no autograd graph is built and the
/// gradients come from [`Llama::training_pass`].
#[derive(Debug, Clone)]
pub struct Llama {
    pub(crate) cfg: LlamaConfig,
    pub(crate) embed_tokens: Tensor,
    pub(crate) layers: Vec<Block>,
    pub(crate) norm: RmsNorm,
    pub(crate) lm_head: Tensor,
    pub(crate) rope: Rope,
    /// The composed ops' additive causal mask `[max_seq_len, max_seq_len]`, built at their
    /// first forward ([`Llama::causal_mask`]): the fused kernels never need it.
    mask: OnceLock<Tensor>,
    device: Device,
    pub(crate) kernels: Kernels,
}

impl Llama {
    /// Builds the model from `vb` (root path: tensors are read as `model.embed_tokens.weight`,
    /// `model.layers.{i}.…`, `model.norm.weight`, `lm_head.weight`). With
    /// `VarBuilder::from_varmap(&init_params(..)?, dtype, device)` the model's tensors are the
    /// VarMap's `Var`s, so [`Llama::training_pass`] gives their gradients (and, with
    /// [`Kernels::Composed`], so does `loss.backward()`). Also works with a
    /// safetensors-backed `VarBuilder` (e.g. an HF checkpoint).
    pub fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate()?;
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let device = vb.device().clone();
        let m = vb.pp("model");
        let layers = (0..cfg.num_layers).map(|i| Block::new(cfg, m.pp(format!("layers.{i}")))).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens: m.pp("embed_tokens").get((v, h), "weight")?,
            layers,
            norm: RmsNorm::new(h, cfg.rms_norm_eps, m.pp("norm"))?,
            lm_head: vb.pp("lm_head").get((v, h), "weight")?,
            rope: Rope::new(cfg.head_dim(), cfg.max_seq_len, cfg.rope_theta, &device)?,
            mask: OnceLock::new(),
            kernels: Kernels::for_model(cfg, &device),
            device,
        })
    }

    /// The same model running `kernels` (default: [`Kernels::for_model`]). Errors when the
    /// kernels cannot run on the model's device or do not take its sizes ([`Kernels::fits`]).
    pub fn with_kernels(mut self, kernels: Kernels) -> Result<Self> {
        kernels.check(&self.device)?;
        if kernels == Kernels::Fused {
            Kernels::fits(&self.cfg).map_err(candle_core::Error::msg)?;
        }
        self.kernels = kernels;
        Ok(self)
    }

    /// The ops the forward pass runs.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The composed ops' causal mask of `t <= max_seq_len` positions: the top-left corner of
    /// the model's `[max_seq_len, max_seq_len]` mask, built once, at the first call.
    pub(crate) fn causal_mask(&self, t: usize) -> Result<Tensor> {
        let mask = match self.mask.get() {
            Some(m) => m,
            None => {
                let m = causal_mask(self.cfg.max_seq_len, &self.device)?;
                self.mask.get_or_init(|| m)
            }
        };
        mask.narrow(0, 0, t)?.narrow(1, 0, t)?.contiguous()
    }

    /// Errors for sequences longer than `max_seq_len` (the RoPE tables' length).
    pub(crate) fn check_seq_len(&self, t: usize) -> Result<()> {
        if t > self.cfg.max_seq_len {
            candle_core::bail!("sequence length {t} exceeds max_seq_len {}", self.cfg.max_seq_len);
        }
        Ok(())
    }

    /// Every weight tensor: the embedding, each layer's two norms and seven projections, the
    /// final norm and the LM head.
    pub(crate) fn weights(&self) -> Vec<&Tensor> {
        let mut w = vec![&self.embed_tokens, &self.norm.weight, &self.lm_head];
        for l in &self.layers {
            let (a, m) = (&l.self_attn, &l.mlp);
            w.extend([&l.input_layernorm.weight, &l.post_attention_layernorm.weight, &a.q, &a.k, &a.v, &a.o, &m.gate, &m.up, &m.down]);
        }
        w
    }
}
