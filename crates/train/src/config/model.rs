//! `[model]`: a preset by name or explicit dims (explicit fields over the preset), the weights'
//! dtype, the kernels and the FP32 matmul precision; resolved into the model's dims with the
//! tokenizer's vocabulary and the data's sequence length ([`ModelSection::resolve`]).

use anyhow::{bail, Context, Result};
use candle_core::DType;
use lowbit_model::LlamaConfig;
use serde::{Deserialize, Serialize};

/// `model.dtype`: the dtype of the model's weights (and of the optimizer's update of them)
/// and the dtype its passes compute in (matrix products, activations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    /// FP32 weights, FP32 compute (the paper's Table 2).
    #[default]
    F32,
    /// BF16 weights updated in place with `optim.states.weight_rounding`, BF16 compute (the
    /// paper's main table: no FP32 master copy).
    Bf16,
    /// Mixed precision, as `torch.autocast(dtype=torch.bfloat16)`: FP32 master weights and an
    /// FP32 optimizer update (as `f32`), BF16 matrix products (FP32 accumulation) and
    /// activations (as `bf16`: each pass runs the BF16 model on BF16 copies of the weights,
    /// `lowbit_model::Llama::with_compute_dtype`); FP32 gradients; checkpoints hold the FP32
    /// weights.
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
}

impl WeightDtype {
    /// The name `model.dtype` takes: `"f32"`, `"bf16"` or `"bf16-mixed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::Bf16Mixed => "bf16-mixed",
        }
    }

    /// The weights' dtype (the `Var`s the optimizer updates, the checkpoint's tensors): BF16
    /// for `bf16`, FP32 for `f32` and `bf16-mixed`.
    pub fn weights(self) -> DType {
        match self {
            WeightDtype::Bf16 => DType::BF16,
            WeightDtype::F32 | WeightDtype::Bf16Mixed => DType::F32,
        }
    }

    /// The dtype the model's passes compute in (matrix products and activations; the peak
    /// FLOP/s of MFU): FP32 for `f32`, BF16 for `bf16` and `bf16-mixed`.
    pub fn compute(self) -> DType {
        match self {
            WeightDtype::F32 => DType::F32,
            WeightDtype::Bf16 | WeightDtype::Bf16Mixed => DType::BF16,
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// Weight and compute dtype: "f32" (default), "bf16" or "bf16-mixed" (FP32 weights,
    /// BF16 compute), [`WeightDtype`].
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `model.dtype`'s three names parse, print back as written, and say the weights' and the
    /// compute dtype: `bf16-mixed` is FP32 weights with BF16 compute.
    #[test]
    fn weight_dtypes_name_their_weights_and_compute() {
        for (name, dtype, weights, compute) in [
            ("f32", WeightDtype::F32, DType::F32, DType::F32),
            ("bf16", WeightDtype::Bf16, DType::BF16, DType::BF16),
            ("bf16-mixed", WeightDtype::Bf16Mixed, DType::F32, DType::BF16),
        ] {
            let m: ModelSection = toml::from_str(&format!("dtype = \"{name}\"")).unwrap();
            assert_eq!(m.dtype, dtype, "{name}");
            assert_eq!((dtype.as_str(), dtype.to_string()), (name, name.to_string()));
            assert_eq!((dtype.weights(), dtype.compute()), (weights, compute), "{name}");
            let back = toml::to_string(&m).unwrap();
            assert!(back.contains(&format!("dtype = \"{name}\"")), "{back}");
        }
        assert!(toml::from_str::<ModelSection>("dtype = \"bf16_mixed\"").is_err());
    }
}
