//! SwiGLU feed-forward block and the bias-free linear helper.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

/// `x @ wᵀ` for `x`: `[..., in]`, `w`: `[out, in]` (nn.Linear layout, no bias) → `[..., out]`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let Some((&inp, batch)) = x.dims().split_last() else { candle_core::bail!("linear: a scalar input has no feature dimension") };
    let rows = x.elem_count() / inp;
    let y = x.reshape((rows, inp))?.matmul(&w.t()?)?;
    let out_dims: Vec<usize> = batch.iter().copied().chain([w.dim(0)?]).collect();
    y.reshape(out_dims)
}

/// `down_proj(silu(gate_proj(x)) * up_proj(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    pub(crate) down: Tensor,
}

impl Mlp {
    /// Loads `gate_proj`/`up_proj` `[I, H]` and `down_proj` `[H, I]` from `vb` (= `…mlp`).
    pub fn new(hidden: usize, inter: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            gate: vb.pp("gate_proj").get((inter, hidden), "weight")?,
            up: vb.pp("up_proj").get((inter, hidden), "weight")?,
            down: vb.pp("down_proj").get((hidden, inter), "weight")?,
        })
    }
}

impl Module for Mlp {
    /// `x`: `[..., H]` → `[..., H]`, weights' dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = linear(x, &self.gate)?.silu()?;
        let u = linear(x, &self.up)?;
        linear(&(g * u)?, &self.down)
    }
}
