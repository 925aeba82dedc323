//! The forward pass for training ([`Llama::training_pass`]): candle's autograd graph, or with
//! the fused CUDA kernels an explicit backward (`crate::fused::train`) that writes each
//! gradient once.

use crate::llama::Llama;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor};

impl Llama {
    /// The forward pass for training on `scale` times [`Llama::loss`]; its
    /// [`TrainingPass::backward`] gives the gradient of every weight. With [`crate::Kernels::Fused`]
    /// (and as many key/value heads as query heads) the backward is explicit, without
    /// candle's autograd graph (`crate::fused::train`: each gradient is written once instead
    /// of zero-filled and added per graph edge); otherwise it is `loss.backward()`.
    pub fn training_pass(&self, input: &Tensor, target: &Tensor, mask: &Tensor, scale: f64) -> Result<TrainingPass<'_>> {
        #[cfg(feature = "cuda")]
        if self.kernels == crate::Kernels::Fused && self.cfg.num_kv_heads == self.cfg.num_heads {
            self.check_seq_len(input.dim(1)?)?;
            return Ok(TrainingPass(Pass::Explicit(crate::fused::train::Forward::run(self, input, target, mask, scale)?)));
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
    Explicit(crate::fused::train::Forward<'a>),
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
            Pass::Explicit(f) => f.backward(),
        }
    }
}
