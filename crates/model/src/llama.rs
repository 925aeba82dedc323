//! The decoder: embedding → L × (pre-norm attention + pre-norm SwiGLU) → final norm → head.

use candle_core::{Device, Result, Tensor};
use candle_nn::VarBuilder;

use crate::attention::{causal_mask, Attention};
use crate::config::LlamaConfig;
use crate::mlp::{linear, Mlp};
use crate::norm::RmsNorm;
use crate::rope::Rope;
use crate::Kernels;

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

    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor, k: Kernels) -> Result<Tensor> {
        let attn = self.self_attn.forward(&self.input_layernorm.forward_with(x, k)?, rope, mask, k)?;
        let h = (x + attn)?;
        &h + self.mlp.forward_with(&self.post_attention_layernorm.forward_with(&h, k)?, k)?
    }
}

/// LLaMA causal language model with HF `LlamaForCausalLM` tensor names and semantics
/// (pre-norm RMSNorm, RoPE rotate-half, causal GQA attention, SwiGLU, untied `lm_head`,
/// no biases). Every op is differentiable through candle autograd on CPU and CUDA.
#[derive(Debug, Clone)]
pub struct Llama {
    pub(crate) cfg: LlamaConfig,
    pub(crate) embed_tokens: Tensor,
    pub(crate) layers: Vec<Block>,
    pub(crate) norm: RmsNorm,
    pub(crate) lm_head: Tensor,
    pub(crate) rope: Rope,
    mask: Tensor,
    device: Device,
    pub(crate) kernels: Kernels,
}

impl Llama {
    /// Builds the model from `vb` (root path: tensors are read as `model.embed_tokens.weight`,
    /// `model.layers.{i}.…`, `model.norm.weight`, `lm_head.weight`). With
    /// `VarBuilder::from_varmap(&init_params(..)?, dtype, device)` the model's tensors are the
    /// VarMap's `Var`s, so `loss.backward()` yields their gradients. Also works with a
    /// safetensors-backed `VarBuilder` (e.g. an HF checkpoint).
    pub fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        cfg.validate()?;
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let device = vb.device().clone();
        let m = vb.pp("model");
        let layers = (0..cfg.num_layers)
            .map(|i| Block::new(cfg, m.pp(format!("layers.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens: m.pp("embed_tokens").get((v, h), "weight")?,
            layers,
            norm: RmsNorm::new(h, cfg.rms_norm_eps, m.pp("norm"))?,
            lm_head: vb.pp("lm_head").get((v, h), "weight")?,
            rope: Rope::new(cfg.head_dim(), cfg.max_seq_len, cfg.rope_theta, &device)?,
            mask: causal_mask(cfg.max_seq_len, &device)?,
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

    /// Final hidden states after `model.norm`: `input` `[B, T]` u32 token ids (T ≤
    /// `max_seq_len`) → `[B, T, H]` in the weights' dtype.
    pub fn forward_hidden(&self, input: &Tensor) -> Result<Tensor> {
        let (b, t) = input.dims2()?;
        self.check_seq_len(t)?;
        let k = self.kernels;
        let mask = match k {
            Kernels::Composed => self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?.contiguous()?,
            Kernels::Fused => self.mask.clone(), // the fused attention masks by position
        };
        let mut x = self.embed(input)?.reshape((b, t, self.cfg.hidden_size))?;
        for layer in &self.layers {
            x = layer.forward(&x, &self.rope, &mask, k)?;
        }
        self.norm.forward_with(&x, k)
    }

    pub(crate) fn check_seq_len(&self, t: usize) -> Result<()> {
        if t > self.cfg.max_seq_len {
            candle_core::bail!("sequence length {t} exceeds max_seq_len {}", self.cfg.max_seq_len);
        }
        Ok(())
    }

    /// Embedding rows of `input`'s ids, `[B·T, H]`.
    fn embed(&self, input: &Tensor) -> Result<Tensor> {
        let ids = input.flatten_all()?;
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return crate::fused::embedding(&self.embed_tokens, &ids);
        }
        self.embed_tokens.index_select(&ids, 0)
    }

    /// Mean next-token loss over the positions where `mask` is nonzero, as
    /// [`crate::masked_cross_entropy`] of [`Llama::forward`]: `input`, `target` `[B, T]` u32,
    /// `mask` `[B, T]` (1 = counts) → F32 scalar, for training: with [`Kernels::Fused`] the
    /// LM head and the loss run in chunks of rows ([`crate::fused::lm_head_cross_entropy`]):
    /// the `[B, T, V]` logits are never held, and the head's gradients are computed in this
    /// pass (held until the backward). Where no backward follows, [`Llama::eval_loss`].
    pub fn loss(&self, input: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.loss_with(input, target, mask, true)
    }

    /// [`Llama::loss`] without the gradient work of the fused head (validation, checks).
    pub fn eval_loss(&self, input: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.loss_with(input, target, mask, false)
    }

    fn loss_with(&self, input: &Tensor, target: &Tensor, mask: &Tensor, train: bool) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            let hidden = self.forward_hidden(input)?;
            let (b, t, h) = hidden.dims3()?;
            let (target, weight) = crate::loss::flat_weights(target, mask, b * t)?;
            return crate::fused::lm_head_cross_entropy(&hidden.reshape((b * t, h))?, &self.lm_head, &target, &weight, train);
        }
        let _ = train; // the composed head keeps its logits for the backward
        crate::masked_cross_entropy_with(&self.forward(input)?, target, mask, self.kernels)
    }

    /// Next-token logits: `input` `[B, T]` u32 token ids → `[B, T, V]` in the weights' dtype.
    /// Position `t` only sees tokens `0..=t`.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        linear(&self.forward_hidden(input)?, &self.lm_head)
    }
}
