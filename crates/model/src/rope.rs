//! Rotary position embedding in the HF "rotate_half" convention (non-interleaved: dimension
//! `i` is paired with `i + head_dim/2`), so HF LLaMA checkpoints give identical outputs
//! without permuting `q_proj`/`k_proj`.

use candle_core::{Device, Result, Tensor, D};

/// Precomputed `cos`/`sin` tables `[max_seq_len, head_dim]` (f32) with
/// `θ_i = rope_theta^(-2i/head_dim)` repeated over both halves (HF `cat(freqs, freqs)`).
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
    max_seq_len: usize,
}

/// `cat(-x[..., d/2:], x[..., :d/2])` along the last dimension.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

impl Rope {
    /// Builds the tables on `device`. `head_dim` must be even.
    pub fn new(head_dim: usize, max_seq_len: usize, theta: f64, device: &Device) -> Result<Self> {
        if !head_dim.is_multiple_of(2) {
            candle_core::bail!("rope: head_dim {head_dim} must be even");
        }
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64)).collect();
        let mut cos = Vec::with_capacity(max_seq_len * head_dim);
        let mut sin = Vec::with_capacity(max_seq_len * head_dim);
        for p in 0..max_seq_len {
            for _half in 0..2 {
                for f in &inv_freq {
                    let a = p as f64 * f;
                    cos.push(a.cos() as f32);
                    sin.push(a.sin() as f32);
                }
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_seq_len, head_dim), device)?,
            sin: Tensor::from_vec(sin, (max_seq_len, head_dim), device)?,
            max_seq_len,
        })
    }

    /// `cos` table `[max_seq_len, head_dim]`, f32.
    pub fn cos(&self) -> &Tensor {
        &self.cos
    }
    /// `sin` table `[max_seq_len, head_dim]`, f32.
    pub fn sin(&self) -> &Tensor {
        &self.sin
    }

    /// Rotates `x`: `[B, heads, T, head_dim]` (positions `0..T`) → same shape and dtype:
    /// `x * cos + rotate_half(x) * sin`, with the tables cast to `x`'s dtype first (as HF).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(2)?;
        if t > self.max_seq_len {
            candle_core::bail!("sequence length {t} exceeds max_seq_len {}", self.max_seq_len);
        }
        let cos = self.cos.narrow(0, 0, t)?.to_dtype(x.dtype())?;
        let sin = self.sin.narrow(0, 0, t)?.to_dtype(x.dtype())?;
        x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?
    }
}
