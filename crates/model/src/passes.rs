//! The model's passes, composed or fused by [`crate::Kernels`]: logits ([`Llama::forward`]), the
//! loss ([`Llama::loss`]) and the training pass ([`Llama::training_pass`], whose backward gives
//! each weight's gradient or adds it to a [`GradSum`]). The composed ones are candle ops
//! under autograd (`llama.rs`); the fused ones run `crate::fused::model`.

use crate::grad_sum::GradSum;
use crate::llama::Llama;
use crate::mlp::linear;
#[cfg(feature = "cuda")]
use crate::Kernels;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor};

impl Llama {
    /// Final hidden states after `model.norm`: `input` `[B, T]` u32 token ids (T ≤
    /// `max_seq_len`) → `[B, T, H]` in the weights' dtype.
    pub fn forward_hidden(&self, input: &Tensor) -> Result<Tensor> {
        self.check_seq_len(input.dim(1)?)?;
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            return crate::fused::model::hidden(self, input);
        }
        self.composed_hidden(input)
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
    /// `mask` `[B, T]` (1 = counts) → F32 scalar. With [`crate::Kernels::Composed`] differentiable
    /// under candle's autograd; with [`crate::Kernels::Fused`] the LM head and the loss run in chunks
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
    /// [`TrainingPass::backward`] gives the gradient of every weight. With [`crate::Kernels::Fused`]
    /// the backward is explicit (`crate::fused::model`: each op's backward function in reverse
    /// order, each gradient written once); with [`crate::Kernels::Composed`] it is candle's
    /// `loss.backward()`.
    ///
    /// `input_ids`: the values of `input` on the host (row-major, `B * T`), when the caller
    /// has them (a trainer copied them to the device): the fused backward groups the
    /// positions by id from them, where it would otherwise read `input` back from the device
    /// (a wait at the start of every pass); the composed path does not need them. They must
    /// equal `input`'s values: other ids give the embedding wrong gradients. Errors: a
    /// length other than `B * T`.
    pub fn training_pass(&self, input: &Tensor, target: &Tensor, mask: &Tensor, input_ids: Option<&[u32]>, scale: f64) -> Result<TrainingPass<'_>> {
        if let Some(ids) = input_ids {
            if ids.len() != input.elem_count() {
                candle_core::bail!("training_pass: {} host input ids for an input of shape {:?}", ids.len(), input.shape());
            }
        }
        #[cfg(feature = "cuda")]
        if self.kernels == Kernels::Fused {
            self.check_seq_len(input.dim(1)?)?;
            return Ok(TrainingPass(Pass::Explicit(crate::fused::model::Forward::run(self, input, target, mask, input_ids, scale)?)));
        }
        let loss = self.loss(input, target, mask)?.affine(scale, 0.0)?;
        Ok(TrainingPass(Pass::Autograd(loss, self)))
    }
}

/// A forward pass for training ([`Llama::training_pass`]).
pub struct TrainingPass<'a>(Pass<'a>);

enum Pass<'a> {
    Autograd(Tensor, &'a Llama),
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
    /// step. On the composed path each weight's gradient is widened and added; on the fused
    /// path the matrix products of the weights' gradients accumulate into the sums in place
    /// (FP32 products, without rounding each pass's gradient to the weights' dtype first), the
    /// other gradients are widened and added.
    pub fn accumulate(self, sum: &mut GradSum) -> Result<()> {
        match self.0 {
            Pass::Autograd(loss, model) => {
                let grads = loss.backward()?;
                for w in model.weights() {
                    if let Some(g) = grads.get(w) {
                        sum.add(w, g)?;
                    }
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
