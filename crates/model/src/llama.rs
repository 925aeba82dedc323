//! The decoder: embedding → L × (pre-norm attention + pre-norm SwiGLU) → final norm → head:
//! its structure and weights; its passes, composed or fused, are in `passes.rs`.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use std::borrow::Cow;
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
///
/// Mixed precision ([`Llama::with_compute_dtype`]): the weights (the master copy, e.g. FP32
/// `Var`s) may be of another dtype than the one the passes compute in (e.g. BF16, as
/// `torch.autocast(dtype=torch.bfloat16)`): each pass then starts by casting every weight to
/// the compute dtype and runs the model of that dtype; the gradients come back keyed by the
/// master weights, in their dtype.
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
    /// The dtype the passes compute in (matrix products, activations): the weights' own
    /// unless set by [`Llama::with_compute_dtype`].
    compute_dtype: DType,
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
        let embed_tokens = m.pp("embed_tokens").get((v, h), "weight")?;
        Ok(Self {
            compute_dtype: embed_tokens.dtype(),
            cfg: cfg.clone(),
            embed_tokens,
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

    /// The same model computing in `dtype` (F32 or BF16) whatever its weights' dtype: mixed
    /// precision when they differ. With FP32 weights and `DType::BF16` (`model.dtype =
    /// "bf16-mixed"` in the trainer) every pass first casts each weight to BF16 (a
    /// differentiable `to_dtype`, `[V, H]` and `[out, in]` copies made anew each pass, since
    /// the optimizer updates the weights in place between passes) and runs the BF16 model on
    /// the copies: BF16 matrix products with FP32 accumulation, BF16 activations, RMSNorm
    /// statistics, attention softmax and the loss in FP32, as the BF16 model's; gradients
    /// come back keyed by the FP32 weights, in FP32 ([`TrainingPass`](crate::TrainingPass)).
    /// `dtype` equal to the weights' dtype is the plain model.
    ///
    /// # Errors
    /// A dtype other than F32 or BF16.
    pub fn with_compute_dtype(mut self, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            candle_core::bail!("compute dtype {dtype:?}: the model computes in F32 or BF16");
        }
        self.compute_dtype = dtype;
        Ok(self)
    }

    /// The dtype the passes compute in (matrix products and activations; logits come in it).
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// The weights' (master copy's) dtype: the dtype of the gradients the passes give.
    pub fn weight_dtype(&self) -> DType {
        self.embed_tokens.dtype()
    }

    /// The model a pass runs: this one when it computes in its weights' dtype, else a copy
    /// whose every weight is cast to the compute dtype (differentiable: candle's backward of
    /// the cast hands the gradient to the master weight in its dtype). Same order of weights
    /// as [`Llama::weights`].
    pub(crate) fn for_compute(&self) -> Result<Cow<'_, Llama>> {
        let dtype = self.compute_dtype;
        if self.weight_dtype() == dtype {
            return Ok(Cow::Borrowed(self));
        }
        if self.kernels == Kernels::Composed {
            // built once here, so that the copies share it instead of each building its own
            self.full_mask()?;
        }
        let mut m = self.clone();
        for w in m.weights_mut() {
            *w = w.to_dtype(dtype)?;
        }
        Ok(Cow::Owned(m))
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
        self.full_mask()?.narrow(0, 0, t)?.narrow(1, 0, t)?.contiguous()
    }

    /// The composed ops' whole `[max_seq_len, max_seq_len]` mask, built at the first call.
    fn full_mask(&self) -> Result<&Tensor> {
        Ok(match self.mask.get() {
            Some(m) => m,
            None => {
                let m = causal_mask(self.cfg.max_seq_len, &self.device)?;
                self.mask.get_or_init(|| m)
            }
        })
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

    /// [`Llama::weights`], mutable, in the same order.
    fn weights_mut(&mut self) -> Vec<&mut Tensor> {
        let mut w = vec![&mut self.embed_tokens, &mut self.norm.weight, &mut self.lm_head];
        for l in &mut self.layers {
            let (a, m) = (&mut l.self_attn, &mut l.mlp);
            w.extend([
                &mut l.input_layernorm.weight,
                &mut l.post_attention_layernorm.weight,
                &mut a.q,
                &mut a.k,
                &mut a.v,
                &mut a.o,
                &mut m.gate,
                &mut m.up,
                &mut m.down,
            ]);
        }
        w
    }
}
