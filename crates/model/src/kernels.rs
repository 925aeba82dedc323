//! Which implementation of the model's ops a forward pass runs.

use crate::config::LlamaConfig;
use candle_core::{Device, Result};

/// Largest `hidden_size` the fused kernels take: the RMSNorm backward (`rmsnorm_bwd` in
/// `kernels/model/rmsnorm.cuh`) keeps 8 warps' FP32 gain-gradient sums of a whole row in shared
/// memory, 8 x 1536 x 4 bytes = the 48 KiB a kernel gets without opting in (the launcher could
/// opt in to more; widths above 1536 have not been tested on the GPU), and its kernels exist
/// for up to 6 chunks of 8 elements per lane (6 x 8 x 32 = 1536), each lane holding its share
/// of a row in registers.
pub const FUSED_MAX_HIDDEN: usize = 1536;

/// Rows of logits the fused LM head and loss materialise at once (`crate::fused`'s
/// `lm_head`): 4096 x 32100 BF16 logits are 263 MB, whatever the micro-batch.
pub const LM_HEAD_CHUNK_ROWS: usize = 4096;

/// Head dimensions the fused attention (FlashAttention-2 style, `kernels/model/flash_attention*.cu`)
/// takes: no `[T, T]` score matrix in memory; other head dimensions use cuBLAS products with FP32
/// scores.
pub const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];

/// The ops behind [`crate::Llama`]'s forward and backward passes.
///
/// * `Composed`: candle tensor ops under candle's autograd, on every device (the CPU path
///   and the reference the fused ops are tested against).
/// * `Fused`: the CUDA kernels of `crate::fused` (`cuda` feature, CUDA tensors only), each
///   op a forward and a backward function, run without an autograd graph: training through
///   [`crate::Llama::training_pass`]'s explicit backward. As many key/value heads as query
///   heads, hidden sizes up to [`FUSED_MAX_HIDDEN`] ([`Kernels::fits`]).
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

    /// The fastest available on `device` for a model of `cfg`'s sizes: [`Kernels::for_device`],
    /// but `Composed` where a size is beyond the fused kernels ([`Kernels::fits`]).
    pub fn for_model(cfg: &LlamaConfig, device: &Device) -> Self {
        match Kernels::for_device(device) {
            Kernels::Fused if Kernels::fits(cfg).is_err() => Kernels::Composed,
            k => k,
        }
    }

    /// Whether the fused kernels take a model of `cfg`'s sizes (checked before a run writes
    /// anything, not at its first backward pass).
    ///
    /// # Errors
    /// `hidden_size` above [`FUSED_MAX_HIDDEN`], or fewer key/value heads than query heads
    /// (grouped-query attention: the fused path has no head repeat), naming the setting and
    /// the way out.
    pub fn fits(cfg: &LlamaConfig) -> std::result::Result<(), String> {
        if cfg.num_kv_heads != cfg.num_heads {
            return Err(format!(
                "fused kernels need as many key/value heads as query heads, this model has {} and {}: set \
                 model.kernels = \"composed\" (or \"auto\", which picks it for this model)",
                cfg.num_kv_heads, cfg.num_heads
            ));
        }
        if cfg.hidden_size > FUSED_MAX_HIDDEN {
            return Err(format!(
                "fused kernels take hidden sizes up to {FUSED_MAX_HIDDEN} (the RMSNorm backward keeps a row of FP32 \
                 partial sums per warp in 48 KiB of shared memory), this model has {}: set model.kernels = \"composed\" \
                 (or \"auto\", which picks it for this size)",
                cfg.hidden_size
            ));
        }
        Ok(())
    }

    /// Checks that these kernels can run on `device`.
    pub fn check(self, device: &Device) -> Result<()> {
        if self == Kernels::Fused && !(cfg!(feature = "cuda") && device.is_cuda()) {
            candle_core::bail!("fused kernels need a CUDA device and a build with `--features cuda`");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hidden size the fused kernels cannot take is known from the config
    /// (before a run writes anything), and `auto` picks the composed ops for it.
    #[test]
    fn hidden_sizes_beyond_the_fused_kernels_are_known_from_the_config() {
        let mut cfg = LlamaConfig::preset("tiny", 256).unwrap();
        cfg.hidden_size = FUSED_MAX_HIDDEN;
        Kernels::fits(&cfg).unwrap();
        cfg.hidden_size = 2048;
        let e = Kernels::fits(&cfg).unwrap_err();
        assert!(e.starts_with("fused kernels take hidden sizes up to 1536"), "{e}");
        assert!(e.contains("this model has 2048: set model.kernels = \"composed\""), "{e}");
        assert_eq!(Kernels::for_model(&cfg, &Device::Cpu), Kernels::Composed);
        let gqa = LlamaConfig { num_kv_heads: 2, ..LlamaConfig::preset("tiny", 256).unwrap() };
        let e = Kernels::fits(&gqa).unwrap_err();
        assert!(e.starts_with("fused kernels need as many key/value heads as query heads, this model has 2 and 4"), "{e}");
    }
}
