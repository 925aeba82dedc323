//! Causal multi-head self-attention with RoPE and grouped-query key/value heads.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::VarBuilder;

use crate::config::LlamaConfig;
use crate::mlp::linear;
use crate::rope::Rope;

/// Additive causal mask `[t, t]` (f32): 0 on and below the diagonal, `-inf` above.
pub fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t).flat_map(|i| (0..t).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
    Tensor::from_vec(mask, (t, t), device)
}

/// Softmax over the last dimension from composed ops (so it has a backward on every device).
/// The row max is detached: softmax is invariant to it, so gradients are unchanged.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// HF `LlamaAttention` without biases: q/k/v/o projections `[out, in]`.
#[derive(Debug, Clone)]
pub struct Attention {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) o: Tensor,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Attention {
    /// Loads `q_proj` `[H, H]`, `k_proj`/`v_proj` `[kv_dim, H]`, `o_proj` `[H, H]` from `vb`
    /// (= `…self_attn`).
    pub fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (h, kv) = (cfg.hidden_size, cfg.kv_dim());
        Ok(Self {
            q: vb.pp("q_proj").get((h, h), "weight")?,
            k: vb.pp("k_proj").get((kv, h), "weight")?,
            v: vb.pp("v_proj").get((kv, h), "weight")?,
            o: vb.pp("o_proj").get((h, h), "weight")?,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim(),
        })
    }

    fn repeat_kv(&self, x: Tensor) -> Result<Tensor> {
        let rep = self.num_heads / self.num_kv_heads;
        if rep == 1 {
            return Ok(x);
        }
        let (b, nkv, t, hd) = x.dims4()?;
        x.unsqueeze(2)?.broadcast_as((b, nkv, rep, t, hd))?.reshape((b, nkv * rep, t, hd))
    }

    /// `x`: `[B, T, H]` → `[B, T, H]` (weights' dtype). `mask`: additive `[T, T]` f32
    /// (see [`causal_mask`]). Scores and softmax are computed in f32.
    pub fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let dtype = x.dtype();
        let heads =
            |w: &Tensor, n: usize| -> Result<Tensor> { linear(x, w)?.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?.contiguous() };
        let q = rope.apply(&heads(&self.q, self.num_heads)?)?;
        let k = self.repeat_kv(rope.apply(&heads(&self.k, self.num_kv_heads)?)?)?;
        let v = self.repeat_kv(heads(&self.v, self.num_kv_heads)?)?;
        let scores = (q.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
        let probs = softmax_last_dim(&scores.broadcast_add(mask)?)?.to_dtype(dtype)?;
        let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, self.num_heads * self.head_dim))?;
        linear(&out, &self.o)
    }
}
