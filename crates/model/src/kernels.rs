//! Which implementation of the model's ops a forward pass runs.

use candle_core::{Device, Result};

/// The ops behind [`crate::Llama`]'s forward and backward passes.
///
/// * `Composed`: candle tensor ops under candle's autograd, on every device (the CPU path
///   and the reference the fused ops are tested against).
/// * `Fused`: the CUDA kernels of [`crate::fused`] (`cuda` feature, CUDA tensors only):
///   RMSNorm, RoPE, causal attention, SwiGLU, embedding and cross-entropy each one custom op
///   with its own backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    Composed,
    Fused,
}

impl Kernels {
    /// The fastest available on `device`: `Fused` on CUDA in a `cuda` build, else `Composed`.
    pub fn for_device(device: &Device) -> Self {
        if cfg!(feature = "cuda") && device.is_cuda() {
            Kernels::Fused
        } else {
            Kernels::Composed
        }
    }

    /// Checks that these kernels can run on `device`.
    pub fn check(self, device: &Device) -> Result<()> {
        if self == Kernels::Fused && !(cfg!(feature = "cuda") && device.is_cuda()) {
            candle_core::bail!("fused kernels need a CUDA device and a build with `--features cuda`");
        }
        Ok(())
    }
}
