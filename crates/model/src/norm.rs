//! RMSNorm (computed in f32, HF `LlamaRMSNorm` semantics).

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

/// `y = weight * (x / sqrt(mean(x², last dim) + eps))`, with the normalisation done in f32
/// and cast back to the input dtype before the gain (as HF `LlamaRMSNorm`).
/// Built from composed tensor ops so it has a candle backward on every device.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub(crate) weight: Tensor,
    pub(crate) eps: f64,
}

impl RmsNorm {
    /// Loads `weight` `[size]` from `vb` (e.g. `vb.pp("input_layernorm")`).
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self { weight: vb.get(size, "weight")?, eps })
    }

    /// Wraps an existing gain tensor `[size]`.
    pub fn from_weight(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }
}

impl Module for RmsNorm {
    /// `x`: `[..., size]` in any float dtype → same shape and dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let xf = x.to_dtype(DType::F32)?;
        let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (var + self.eps)?.sqrt()?.recip()?;
        let normed = xf.broadcast_mul(&inv)?.to_dtype(dtype)?;
        normed.broadcast_mul(&self.weight.to_dtype(dtype)?)
    }
}
