//! `[model]` section of the run config: LLaMA dimensions, presets, parameter count and the
//! Hugging Face `config.json` export.

use candle_core::DType;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// Standard deviation of the normal init of embeddings and linear weights
/// (HF `initializer_range`, written into the exported `config.json`).
pub const INIT_STD: f64 = 0.02;

fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_max_seq_len() -> usize {
    1024
}

/// Dimensions of a LLaMA decoder (pre-norm RMSNorm, RoPE, SwiGLU, untied embeddings, no biases).
///
/// This is the `[model]` table of the run config. `rms_norm_eps` (1e-6), `rope_theta` (10000)
/// and `max_seq_len` (1024) may be omitted; unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaConfig {
    /// Vocabulary size `V` (rows of `embed_tokens` and `lm_head`); comes from the tokenizer.
    pub vocab_size: usize,
    /// Residual width `H`.
    pub hidden_size: usize,
    /// SwiGLU inner width `I`.
    pub intermediate_size: usize,
    /// Number of decoder blocks `L`.
    pub num_layers: usize,
    /// Number of query heads; `head_dim = hidden_size / num_heads`.
    pub num_heads: usize,
    /// Number of key/value heads (GQA); equal to `num_heads` for plain multi-head attention.
    pub num_kv_heads: usize,
    /// Longest sequence the RoPE tables are built for (HF `max_position_embeddings`).
    #[serde(default = "default_max_seq_len")]
    pub max_seq_len: usize,
    /// RMSNorm epsilon (HF `rms_norm_eps`).
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base (HF `rope_theta`).
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
}

/// Names accepted by [`LlamaConfig::preset`], smallest first.
const PRESET_NAMES: &[&str] = &["tiny", "llama20m", "llama60m", "llama100m", "llama130m", "llama350m"];

impl LlamaConfig {
    /// A model of hidden size `h`, intermediate size `i`, `heads` heads and `layers` layers
    /// with every preset's other settings: `num_kv_heads = heads`, `max_seq_len = 1024`,
    /// `rms_norm_eps = 1e-6`, `rope_theta = 10000`.
    pub fn with_dims(vocab_size: usize, h: usize, i: usize, heads: usize, layers: usize) -> Self {
        Self {
            vocab_size,
            hidden_size: h,
            intermediate_size: i,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: heads,
            max_seq_len: default_max_seq_len(),
            rms_norm_eps: default_rms_norm_eps(),
            rope_theta: default_rope_theta(),
        }
    }

    /// `tiny`: hidden 128, intermediate 352, 4 heads, 2 layers. Not from a paper: a fast CPU
    /// smoke-test model for this repository (≈8.6M parameters at vocab 32100, almost all of
    /// them in the embedding and head).
    pub fn tiny(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 128, 352, 4, 2)
    }
    /// `llama20m`: hidden 256, intermediate 688, 4 heads, 4 layers — `llama_20m.json` of the
    /// ReLoRA / GaLore C4 pre-training configs (≈19.6M parameters at vocab 32100).
    pub fn llama20m(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 256, 688, 4, 4)
    }
    /// `llama60m`: hidden 512, intermediate 1376, 8 heads, 8 layers — `llama_60m.json` of the
    /// ReLoRA / GaLore C4 configs (≈58.2M parameters at vocab 32100).
    pub fn llama60m(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 512, 1376, 8, 8)
    }
    /// `llama100m`: hidden 640, intermediate 1708, 10 heads, 12 layers — `llama_100m.json` of
    /// the GaLore C4 configs and the paper's main model (docs/numerics.md, "The run"); ≈100.1M
    /// parameters at vocab 32100.
    pub fn llama100m(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 640, 1708, 10, 12)
    }
    /// `llama130m`: hidden 768, intermediate 2048, 12 heads, 12 layers — `llama_130m.json` of
    /// the ReLoRA / GaLore C4 configs (≈134.3M parameters at vocab 32100).
    pub fn llama130m(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 768, 2048, 12, 12)
    }
    /// `llama350m`: hidden 1024, intermediate 2736, 16 heads, 24 layers — `llama_350m.json` of
    /// the ReLoRA / GaLore C4 configs (≈368.2M parameters at vocab 32100).
    pub fn llama350m(vocab_size: usize) -> Self {
        Self::with_dims(vocab_size, 1024, 2736, 16, 24)
    }

    /// The named preset (see [`LlamaConfig::preset_names`]) with the tokenizer's vocabulary
    /// size, or `None` for an unknown name. All presets use `num_kv_heads = num_heads`,
    /// `max_seq_len = 1024`, `rms_norm_eps = 1e-6`, `rope_theta = 10000`.
    pub fn preset(name: &str, vocab_size: usize) -> Option<Self> {
        Some(match name {
            "tiny" => Self::tiny(vocab_size),
            "llama20m" => Self::llama20m(vocab_size),
            "llama60m" => Self::llama60m(vocab_size),
            "llama100m" => Self::llama100m(vocab_size),
            "llama130m" => Self::llama130m(vocab_size),
            "llama350m" => Self::llama350m(vocab_size),
            _ => return None,
        })
    }

    /// Names accepted by [`LlamaConfig::preset`], smallest model first.
    pub fn preset_names() -> &'static [&'static str] {
        PRESET_NAMES
    }

    /// Per-head width `hidden_size / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Width of the K and V projections, `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim()
    }

    /// Exact number of trainable scalars:
    /// `2·V·H + L·(2·H² + 2·H·kv_dim + 3·H·I + 2·H) + H`
    /// (embedding + head, per layer q/o + k/v + gate/up/down + two norms, final norm).
    pub fn num_parameters(&self) -> usize {
        let (v, h, i, l) = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_layers);
        let kv = self.kv_dim();
        let per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h;
        2 * v * h + l * per_layer + h
    }

    /// Parameters excluding the embedding and the head (the "non-embedding" count).
    pub fn num_non_embedding_parameters(&self) -> usize {
        self.num_parameters() - 2 * self.vocab_size * self.hidden_size
    }

    /// Checks that every dimension is nonzero, `hidden_size % num_heads == 0`,
    /// `num_heads % num_kv_heads == 0`, the head dimension is even (RoPE rotates pairs), and
    /// `rms_norm_eps`/`rope_theta` are positive and finite.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::InvalidConfig(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return bad(format!("{name} must be > 0"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return bad(format!("hidden_size {} is not divisible by num_heads {}", self.hidden_size, self.num_heads));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!("num_heads {} is not divisible by num_kv_heads {}", self.num_heads, self.num_kv_heads));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim()));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad(format!("rms_norm_eps {} must be positive and finite", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta {} must be positive and finite", self.rope_theta));
        }
        Ok(())
    }

    /// `config.json` for transformers' `LlamaForCausalLM` with `torch_dtype = "float32"`;
    /// see [`LlamaConfig::hf_config_json_with_dtype`].
    pub fn hf_config_json(&self) -> serde_json::Value {
        self.hf_config_json_with_dtype(DType::F32)
    }

    /// `config.json` for transformers' `LlamaForCausalLM` (`model_type = "llama"`, untied
    /// embeddings, SiLU, no biases). Saved next to a `VarMap::save`d `model.safetensors`, the
    /// directory loads with `LlamaForCausalLM.from_pretrained(dir)`.
    /// `dtype` sets `torch_dtype` (`F32` → "float32", `BF16` → "bfloat16", `F16` → "float16").
    pub fn hf_config_json_with_dtype(&self, dtype: DType) -> serde_json::Value {
        let torch_dtype = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim(),
            "max_position_embeddings": self.max_seq_len,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "initializer_range": INIT_STD,
            "attention_bias": false,
            "attention_dropout": 0.0,
            "mlp_bias": false,
            "pretraining_tp": 1,
            "tie_word_embeddings": false,
            "use_cache": true,
            "torch_dtype": torch_dtype,
        })
    }
}
