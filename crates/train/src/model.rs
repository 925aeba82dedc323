//! The model a run trains ([`TrainModel`]): its dims from the run config and the tokenizer,
//! its weights initialised on the device, the model with the configured kernels and FP32
//! matmul precision ([`build_model`]), its parameters in the optimizer's order
//! ([`ParamSet`]) with their optimizer metadata ([`param_infos`]), and the `config.json` and
//! tokenizer files a checkpoint exports.

use crate::config::{KernelChoice, MatmulPrecision, RunConfig};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Var};
use lowbit_data::Tokens;
use lowbit_model::{init_params, try_param_group, Kernels, Llama, LlamaConfig};
use lowbit_optim::ParamInfo;

/// The model of a run, with its weights and what a checkpoint exports of it.
pub struct TrainModel {
    pub llama: Llama,
    /// The weights in the optimizer's order.
    pub params: ParamSet,
    /// The weights by name (what `model.safetensors` holds).
    pub varmap: candle_nn::VarMap,
    /// The weights' dtype (the optimizer's and the checkpoint's): F32 for `model.dtype =
    /// "f32"` and `"bf16-mixed"`, BF16 for `"bf16"`.
    pub dtype: DType,
    /// The dtype the passes compute in (matrix products, activations): BF16 for `"bf16"` and
    /// `"bf16-mixed"`, F32 for `"f32"`.
    pub compute_dtype: DType,
    /// The exported `config.json`: the model, and the tokenizer's special ids for `generate`.
    pub hf_config: serde_json::Value,
    /// The exported tokenizer files beside it ([`Tokens::hf_tokenizer_files`]: the run's
    /// tokenizer, its special tokens, `data.seq_len` as the model's length).
    pub hf_tokenizer: Vec<(&'static str, Vec<u8>)>,
}

impl TrainModel {
    /// The model of dims `mcfg` with `cfg`'s dtype, kernels and seed on `dev`, its weights
    /// freshly initialised (in the weights' dtype, [`crate::config::WeightDtype::weights`]:
    /// a `bf16-mixed` model starts from the same FP32 weights as an `f32` one).
    ///
    /// # Errors
    /// The weights cannot be allocated, or the kernels do not take the model or the device
    /// ([`build_model`]).
    pub fn build(cfg: &RunConfig, mcfg: &LlamaConfig, tok: &Tokens, dev: &Device) -> Result<TrainModel> {
        let (dtype, compute_dtype) = (cfg.model.dtype.weights(), cfg.model.dtype.compute());
        let mut hf_config = mcfg.hf_config_json_with_dtype(dtype);
        hf_config.as_object_mut().context("config.json is a JSON object")?.extend(tok.hf_token_ids());
        let varmap = init_params(mcfg, cfg.train.seed, dtype, dev)?;
        let llama = build_model(cfg, mcfg, &varmap, dtype, dev)?;
        let params = ParamSet::from_varmap(&varmap);
        let hf_tokenizer = tok.hf_tokenizer_files(cfg.data.seq_len);
        Ok(TrainModel { llama, params, varmap, dtype, compute_dtype, hf_config, hf_tokenizer })
    }
}

/// Model parameters in the optimizer's order (sorted by name; the index is the tensor id of
/// the RNG streams).
pub struct ParamSet {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
}

impl ParamSet {
    /// All variables of a VarMap, sorted by name.
    pub fn from_varmap(vm: &candle_nn::VarMap) -> Self {
        let data = vm.data().lock().unwrap();
        let mut pairs: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let (names, vars) = pairs.into_iter().unzip();
        ParamSet { names, vars }
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.vars.iter().map(|v| v.elem_count()).sum()
    }
}

/// Model parameters' optimizer metadata, sorted by name: the stall-report group of each
/// tensor (from its HF LLaMA name) and whether it takes weight decay (matrices do, vectors
/// (the norms' gains) do not, as nanoGPT's and torchtitan's AdamW groups).
///
/// # Errors
/// A tensor name outside the LLaMA layout (no group to report its stalls under).
pub fn param_infos(params: &ParamSet) -> Result<Vec<ParamInfo>> {
    params
        .names
        .iter()
        .zip(&params.vars)
        .map(|(n, v)| {
            let group =
                try_param_group(n).with_context(|| format!("parameter {n}: not a LLaMA tensor name (embed, attn, mlp, norm or head)"))?;
            Ok(ParamInfo { name: n.clone(), group: group.as_str().to_string(), len: v.elem_count(), weight_decay: v.rank() >= 2 })
        })
        .collect()
}

/// The model on `dev` with weights `varmap` of `dtype`, the configured kernels, FP32 matmul
/// precision and compute dtype (`model.dtype`, [`crate::config::WeightDtype::compute`]).
pub fn build_model(cfg: &RunConfig, mcfg: &LlamaConfig, varmap: &candle_nn::VarMap, dtype: DType, dev: &Device) -> Result<Llama> {
    let model = Llama::new(mcfg, candle_nn::VarBuilder::from_varmap(varmap, dtype, dev))?;
    let kernels = match cfg.model.kernels {
        KernelChoice::Auto => {
            let k = Kernels::for_model(mcfg, dev);
            if let (true, Err(why)) = (k != Kernels::for_device(dev), Kernels::fits(mcfg)) {
                tracing::warn!("model.kernels = \"auto\": composed ops ({why})");
            }
            k
        }
        KernelChoice::Fused => {
            if !(cfg!(feature = "cuda") && dev.is_cuda()) {
                bail!(
                    "model.kernels = \"fused\": the fused kernels run on CUDA in the CUDA build (train.device = \
                     \"cuda\"); on the CPU use \"auto\" or \"composed\""
                );
            }
            Kernels::fits(mcfg).map_err(|e| anyhow::anyhow!("model.kernels = \"fused\": {e}"))?;
            Kernels::Fused
        }
        KernelChoice::Composed => Kernels::Composed,
    };
    let tf32 = cfg.model.matmul_precision == MatmulPrecision::Tf32;
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
    #[cfg(not(feature = "cuda"))]
    let _ = tf32; // CPU matrix products are FP32
    let model = model.with_kernels(kernels).context("model.kernels")?;
    model.with_compute_dtype(cfg.model.dtype.compute()).with_context(|| format!("model.dtype = \"{}\"", cfg.model.dtype))
}
