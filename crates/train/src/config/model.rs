//! `[model]`: a preset by name or explicit dims (explicit fields over the preset), the weights'
//! dtype, the kernels and the FP32 matmul precision; resolved into the model's dims with the
//! tokenizer's vocabulary and the data's sequence length ([`ModelSection::resolve`]).

use anyhow::{bail, Context, Result};
use lowbit_model::LlamaConfig;
use serde::{Deserialize, Serialize};

/// Weight (and activation) dtype of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    /// FP32 weights (the paper's Table 2).
    #[default]
    F32,
    /// BF16 weights updated in place with `optim.states.weight_rounding` (the main table).
    Bf16,
}

/// `model.kernels`: which implementation of the model's ops runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelChoice {
    /// Fused CUDA kernels on a GPU, composed candle ops on the CPU and for models the fused
    /// kernels do not take (`lowbit_model::Kernels::fits`: hidden sizes above 1536,
    /// grouped-query attention).
    #[default]
    Auto,
    /// The fused CUDA kernels (`lowbit_model::fused`); an error on the CPU.
    Fused,
    /// Candle's composed ops under candle's autograd (the reference; slow on a GPU).
    Composed,
}

/// `model.matmul_precision`: how FP32 matrix products run on the GPU (BF16 models are
/// unaffected: BF16 inputs, FP32 accumulation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulPrecision {
    /// Full FP32 (PyTorch's default, `torch.backends.cuda.matmul.allow_tf32 = False`).
    #[default]
    Fp32,
    /// TensorFloat-32 inputs (10-bit mantissa), FP32 accumulation: several times faster.
    Tf32,
}

/// `[model]`: a preset by name, optionally with explicit dims overriding it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// tiny, llama20m, llama60m, llama100m, llama130m, llama350m.
    pub preset: Option<String>,
    /// Weight dtype: "f32" (default) or "bf16".
    #[serde(default)]
    pub dtype: WeightDtype,
    /// Vocabulary size; default: the tokenizer's.
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_layers: Option<usize>,
    pub num_heads: Option<usize>,
    pub num_kv_heads: Option<usize>,
    /// Longest sequence the model takes (RoPE table, causal mask); default: the preset's,
    /// raised to `data.seq_len`. Set shorter than `data.seq_len`, it is refused.
    pub max_seq_len: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    /// "auto" (default), "fused" or "composed".
    #[serde(default)]
    pub kernels: KernelChoice,
    /// "fp32" (default) or "tf32".
    #[serde(default)]
    pub matmul_precision: MatmulPrecision,
}

impl ModelSection {
    /// The model dims: the preset (or the explicit dims, with the presets' other settings),
    /// with explicit fields overriding it; the vocabulary the tokenizer's `tokenizer_vocab`
    /// unless set; `max_seq_len` at least `seq_len` (`data.seq_len`).
    ///
    /// # Errors
    /// An unknown preset, a missing dimension, a vocabulary smaller than the tokenizer's, an
    /// explicit `model.max_seq_len` below `seq_len`, or dimensions the model rejects.
    pub fn resolve(&self, tokenizer_vocab: usize, seq_len: usize) -> Result<LlamaConfig> {
        let m = self;
        let vocab = m.vocab_size.unwrap_or(tokenizer_vocab);
        if vocab < tokenizer_vocab {
            bail!(
                "model.vocab_size = {vocab} is smaller than the tokenizer's vocabulary ({tokenizer_vocab}): \
                 token ids would be out of range"
            );
        }
        let mut c = match &m.preset {
            Some(p) => LlamaConfig::preset(p, vocab)
                .with_context(|| format!("model.preset: unknown preset {p:?} (expected one of {:?})", LlamaConfig::preset_names()))?,
            None => {
                let need = |v: Option<usize>, key: &str| v.with_context(|| format!("model: set `preset` or `{key}`"));
                let (h, i) = (need(m.hidden_size, "hidden_size")?, need(m.intermediate_size, "intermediate_size")?);
                let (layers, heads) = (need(m.num_layers, "num_layers")?, need(m.num_heads, "num_heads")?);
                LlamaConfig::with_dims(vocab, h, i, heads, layers)
            }
        };
        macro_rules! over {
            ($($f:ident),*) => { $( if let Some(x) = m.$f { c.$f = x; } )* };
        }
        over!(hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, max_seq_len, rms_norm_eps, rope_theta);
        if m.num_kv_heads.is_none() && m.num_heads.is_some() {
            c.num_kv_heads = c.num_heads;
        }
        match m.max_seq_len {
            Some(n) if n < seq_len => bail!(
                "model.max_seq_len = {n} is shorter than data.seq_len = {seq_len}: raise it, or leave it out (it then \
                 follows data.seq_len)"
            ),
            _ => c.max_seq_len = c.max_seq_len.max(seq_len),
        }
        c.validate().map_err(|e| anyhow::anyhow!("model: {e}"))?;
        Ok(c)
    }
}
