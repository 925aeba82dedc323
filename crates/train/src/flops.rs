//! Model FLOPs utilisation (MFU): the FLOPs a step's matrix products need, against the card's
//! dense peak.
//!
//! FLOPs per token: `6 N + 12 L H T` (nanoGPT's and PaLM's estimate: forward and backward of
//! the `N` parameters' products, plus attention's scores and weighted sums; `N` without the
//! embedding table, whose lookup is no matrix product; `L` layers, hidden size `H`, `T` tokens
//! per row). Used by a run's metrics rows (`mfu`) and by `train bench training`.

use candle_core::DType;

/// FLOPs of one token's forward and backward pass: `6 n + 12 layers hidden seq_len`, `n` the
/// parameters without the embedding table.
pub fn flops_per_token(n: usize, layers: usize, hidden: usize, seq_len: usize) -> f64 {
    6.0 * n as f64 + 12.0 * layers as f64 * hidden as f64 * seq_len as f64
}

/// Dense peak FLOP/s of the card `name` (the CUDA driver's or `nvidia-smi`'s name, e.g.
/// `"NVIDIA H100 80GB HBM3"`) for products in `dtype` (`tf32`: FP32 products on TF32 tensor
/// cores); `None` for a card not in the table. From NVIDIA's datasheets, without sparsity:
///
/// | card | BF16 | TF32 | FP32 |
/// |---|---|---|---|
/// | H200, H100 SXM (`H100 80GB HBM3`), GH200 | 989 T | 494 T | 67 T |
/// | H100 NVL | 835 T | 418 T | 60 T |
/// | H100 PCIe | 756 T | 378 T | 51 T |
/// | A100 | 312 T | 156 T | 19.5 T |
pub fn peak_flops(name: &str, dtype: DType, tf32: bool) -> Option<f64> {
    let [bf16, tf, fp32] = if name.contains("H200") {
        [989e12, 494e12, 67e12]
    } else if name.contains("H100") && name.contains("NVL") {
        [835e12, 418e12, 60e12]
    } else if name.contains("H100") && name.contains("PCIe") {
        [756e12, 378e12, 51e12]
    } else if name.contains("H100") {
        [989e12, 494e12, 67e12]
    } else if name.contains("A100") {
        [312e12, 156e12, 19.5e12]
    } else {
        return None;
    };
    Some(match (dtype, tf32) {
        (DType::BF16, _) => bf16,
        (_, true) => tf,
        _ => fp32,
    })
}

/// The fraction of `peak` FLOP/s that `tokens_per_s` tokens of `flops_per_token` each use.
pub fn mfu(tokens_per_s: f64, flops_per_token: f64, peak: f64) -> f64 {
    tokens_per_s * flops_per_token / peak
}

/// Seconds one step of this rank (`train.micro_batch` x its micro-batches x `data.seq_len`
/// positions, padding included: the products run over it) would take at the card's dense
/// peak: a step's MFU is this over the step's seconds. `n_params`: all of the model's
/// parameters (the embedding table is taken off here); `dtype`: the dtype of the matrix
/// products (the compute dtype: BF16 for `model.dtype = "bf16-mixed"`). `None` on the CPU or a card without a
/// known peak ([`peak_flops`]).
pub fn peak_step_seconds(
    cfg: &crate::config::RunConfig,
    mcfg: &lowbit_model::LlamaConfig,
    n_params: usize,
    dtype: DType,
    accum_per_rank: usize,
    dev: &candle_core::Device,
) -> Option<f64> {
    let tf32 = cfg.model.matmul_precision == crate::config::MatmulPrecision::Tf32;
    let peak = peak_flops(&card_name(dev)?, dtype, tf32)?;
    let n = n_params.saturating_sub(mcfg.vocab_size * mcfg.hidden_size);
    let per_token = flops_per_token(n, mcfg.num_layers, mcfg.hidden_size, cfg.data.seq_len);
    let positions = cfg.train.micro_batch * accum_per_rank * cfg.data.seq_len;
    Some(per_token * positions as f64 / peak)
}

/// Name of the GPU a device runs on (the CUDA driver's), `None` on the CPU.
pub fn card_name(dev: &candle_core::Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = dev {
        return d.cuda_stream().context().name().ok();
    }
    let _ = dev;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand numbers: the tiny preset's shape (4 layers, hidden 256, seq 128) with 3M
    /// non-embedding parameters: 6 * 3e6 + 12 * 4 * 256 * 128 = 18e6 + 1,572,864 FLOPs per
    /// token; at 100k tokens/s on an H100 SXM in BF16, 1.9573e12 / 989e12.
    #[test]
    fn mfu_of_a_known_shape() {
        let f = flops_per_token(3_000_000, 4, 256, 128);
        assert_eq!(f, 19_572_864.0);
        let peak = peak_flops("NVIDIA H100 80GB HBM3", DType::BF16, false).unwrap();
        assert_eq!(peak, 989e12);
        let m = mfu(100_000.0, f, peak);
        assert!((m - 1.957_286_4e12 / 989e12).abs() < 1e-15, "{m}");
        assert!((m - 0.001_979_05).abs() < 1e-8, "{m}");
    }

    #[test]
    fn peaks_by_card_dtype_and_precision() {
        assert_eq!(peak_flops("NVIDIA H200", DType::F32, true), Some(494e12));
        assert_eq!(peak_flops("NVIDIA H200", DType::F32, false), Some(67e12));
        assert_eq!(peak_flops("NVIDIA H100 PCIe", DType::BF16, false), Some(756e12));
        assert_eq!(peak_flops("NVIDIA H100 NVL", DType::F32, false), Some(60e12));
        assert_eq!(peak_flops("NVIDIA A100-SXM4-80GB", DType::BF16, true), Some(312e12));
        assert_eq!(peak_flops("NVIDIA GeForce RTX 4090", DType::BF16, false), None);
    }
}
