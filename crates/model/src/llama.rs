//! The decoder: embedding → L × (pre-norm attention + pre-norm SwiGLU) → final norm → head,
//! and its passes: the composed one under candle's autograd (every device) and the fused one
//! (`crate::fused::model`, CUDA), each for logits, for a loss and for training.

use candle_core::backprop::GradStore;
use candle_core::{Device, Module, Result, Tensor};
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

    fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let attn = self.self_attn.forward(&self.input_layernorm.forward(x)?, rope, mask)?;
        let h = (x + attn)?;
        &h + self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?
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
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return crate::fused::model::hidden(self, input);
        }
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?.contiguous()?;
        let mut x = self.embed_tokens.index_select(&input.flatten_all()?, 0)?.reshape((b, t, self.cfg.hidden_size))?;
        for layer in &self.layers {
            x = layer.forward(&x, &self.rope, &mask)?;
        }
        self.norm.forward(&x)
    }

    fn check_seq_len(&self, t: usize) -> Result<()> {
        if t > self.cfg.max_seq_len {
            candle_core::bail!("sequence length {t} exceeds max_seq_len {}", self.cfg.max_seq_len);
        }
        Ok(())
    }

    /// Next-token logits: `input` `[B, T]` u32 token ids → `[B, T, V]` in the weights' dtype.
    /// Position `t` only sees tokens `0..=t`.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let hidden = self.forward_hidden(input)?;
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return crate::fused::linear::forward(&hidden, &self.lm_head);
        }
        linear(&hidden, &self.lm_head)
    }

    /// Mean next-token loss over the positions where `mask` is nonzero, as
    /// [`crate::masked_cross_entropy`] of [`Llama::forward`]: `input`, `target` `[B, T]` u32,
    /// `mask` `[B, T]` (1 = counts) → F32 scalar. With [`Kernels::Composed`] differentiable
    /// under candle's autograd; with [`Kernels::Fused`] the LM head and the loss run in chunks
    /// of rows ([`crate::fused::lm_head::loss`]: the `[B, T, V]` logits are never held) and
    /// no graph is kept (validation; train with [`Llama::training_pass`]).
    pub fn loss(&self, input: &Tensor, target: &Tensor, mask: &Tensor) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            self.check_seq_len(input.dim(1)?)?;
            return crate::fused::model::loss(self, input, target, mask);
        }
        crate::masked_cross_entropy(&self.forward(input)?, target, mask)
    }

    /// The forward pass for training on `scale` times [`Llama::loss`]; its
    /// [`TrainingPass::backward`] gives the gradient of every weight. With [`Kernels::Fused`]
    /// the backward is explicit (`crate::fused::model`: each op's backward function in reverse
    /// order, each gradient written once); with [`Kernels::Composed`] it is candle's
    /// `loss.backward()`.
    pub fn training_pass(&self, input: &Tensor, target: &Tensor, mask: &Tensor, scale: f64) -> Result<TrainingPass<'_>> {
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            self.check_seq_len(input.dim(1)?)?;
            return Ok(TrainingPass(Pass::Explicit(crate::fused::model::Forward::run(self, input, target, mask, scale)?)));
        }
        let loss = self.loss(input, target, mask)?.affine(scale, 0.0)?;
        Ok(TrainingPass(Pass::Autograd(loss, std::marker::PhantomData)))
    }
}

/// A forward pass for training ([`Llama::training_pass`]).
pub struct TrainingPass<'a>(Pass<'a>);

enum Pass<'a> {
    Autograd(Tensor, std::marker::PhantomData<&'a Llama>),
    #[cfg(feature = "cuda")]
    Explicit(crate::fused::model::Forward<'a>),
}

impl TrainingPass<'_> {
    /// `scale` times the mean loss: F32 scalar (tracked by autograd only on the autograd path).
    pub fn loss(&self) -> &Tensor {
        match &self.0 {
            Pass::Autograd(loss, _) => loss,
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => &f.loss,
        }
    }

    /// The gradient of [`TrainingPass::loss`] for every weight, keyed by the weight tensors
    /// as `Tensor::backward` keys them (the weights' dtype).
    pub fn backward(self) -> Result<GradStore> {
        match self.0 {
            Pass::Autograd(loss, _) => loss.backward(),
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => Ok(f.backward(None)?.expect("a store of its own")),
        }
    }

    /// Adds the gradient of [`TrainingPass::loss`] for every weight to its FP32 sum in `sum`
    /// (a weight without one gets one): gradient accumulation over the micro-batches of a
    /// step. On the composed path each gradient is widened and added; on the fused path the
    /// matrix products of the weights' gradients accumulate into the sums in place (FP32
    /// products, without rounding each pass's gradient to the weights' dtype first), the
    /// other gradients are widened and added.
    pub fn accumulate(self, sum: &mut GradStore) -> Result<()> {
        match self.0 {
            Pass::Autograd(loss, _) => {
                let grads = loss.backward()?;
                for id in grads.get_ids().copied().collect::<Vec<_>>() {
                    add_to_sum(sum, id, grads.get_id(id).expect("listed"))?;
                }
            }
            #[cfg(feature = "cuda")]
            Pass::Explicit(f) => {
                f.backward(Some(sum))?;
            }
        }
        Ok(())
    }
}

/// `sum[id] += grad` in FP32 (`sum[id] = grad` widened where there is none).
pub(crate) fn add_to_sum(sum: &mut GradStore, id: candle_core::TensorId, grad: &Tensor) -> Result<()> {
    let g = grad.to_dtype(candle_core::DType::F32)?;
    let g = match sum.get_id(id) {
        Some(prev) => (prev + g)?,
        None => g,
    };
    sum.insert_id(id, g);
    Ok(())
}
