//! # lowbit-model
//!
//! A LLaMA decoder for pre-training on candle, laid out exactly like Hugging Face
//! transformers' `LlamaForCausalLM`: pre-norm RMSNorm (f32 internally), rotary embeddings in
//! the "rotate_half" convention, causal (grouped-query) self-attention, SwiGLU MLP, final
//! norm and an untied `lm_head`, no biases. Tensor names match HF
//! (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, …,
//! `lm_head.weight`), so `VarMap::save` plus [`LlamaConfig::hf_config_json`] is a checkpoint
//! transformers loads.
//!
//! Two implementations of the model ([`Kernels`]): composed from candle tensor ops with a
//! backward under candle's autograd on every device (candle-nn 0.11's fused `rms_norm`,
//! `rope` and `softmax_last_dim` have none), the CPU path and the reference; and, in `cuda`
//! builds on CUDA tensors, this crate's fused kernels (`fused`, `cuda` feature): each op a forward and a
//! backward function, run by one fused path with an explicit backward (the default there).
//!
//! | module      | holds |
//! |-------------|-------|
//! | [`config`]  | [`LlamaConfig`], presets, parameter count, HF `config.json` |
//! | [`init`]    | [`init_params`]: seeded, device-independent Normal(0, 0.02) / ones init |
//! | [`llama`]   | [`Llama`]: the model (its structure and weights; mixed precision, [`Llama::with_compute_dtype`]: FP32 master weights, BF16 compute) |
//! | `passes`    | its passes, composed (candle autograd) or fused (each op's forward, then each backward in reverse): logits, loss, [`TrainingPass`] |
//! | [`grad_sum`] | [`GradSum`]: FP32 gradient sums over micro-batches |
//! | [`attention`], [`mlp`], [`norm`], [`rope`] | its parts |
//! | [`loss`]    | [`masked_cross_entropy`] |
//! | [`kernels`] | [`Kernels`]: composed or fused ops |
//! | `fused`     | the CUDA ops (`cuda` feature) |
//! | `gemm`      | their matrix products as cuBLAS's column-major calls (host logic, tested on the CPU) |
//! | `fused_sizes` | their other host logic from sizes alone: padding, chunks, grouping by id, attention geometry (tested on the CPU) |
//! | [`groups`]  | [`ParamGroup`], [`try_param_group`] |
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::VarBuilder;
//! use lowbit_model::{init_params, masked_cross_entropy, try_param_group, Llama, LlamaConfig};
//!
//! # fn main() -> candle_core::Result<()> {
//! let cfg = LlamaConfig::preset("tiny", 256).unwrap();
//! let dev = Device::Cpu;
//! let varmap = init_params(&cfg, 42, DType::F32, &dev)?;
//! let model = Llama::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
//!
//! let input = Tensor::new(&[[1u32, 2, 3, 4]], &dev)?;   // [B=1, T=4]
//! let target = Tensor::new(&[[2u32, 3, 4, 5]], &dev)?;
//! let mask = Tensor::ones((1, 4), DType::F32, &dev)?;
//! let logits = model.forward(&input)?;                   // [1, 4, 256]
//! assert_eq!(logits.dims(), &[1, 4, 256]);
//! let loss = masked_cross_entropy(&logits, &target, &mask)?; // f32 scalar ≈ ln(256)
//! let grads = loss.backward()?;
//! for (name, var) in varmap.data().lock().unwrap().iter() {
//!     let g = grads.get(var.as_tensor()).expect("every var has a grad");
//!     assert_eq!(g.dims(), var.dims());
//!     let _group = try_param_group(name); // embed / attn / mlp / norm / head
//! }
//! assert_eq!(varmap.all_vars().iter().map(|v| v.elem_count()).sum::<usize>(), cfg.num_parameters());
//! # Ok(()) }
//! ```

pub mod attention;
pub mod config;
pub mod error;
#[cfg(feature = "cuda")]
pub mod fused;
// Used by the CUDA ops; compiled and tested in every build.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod fused_sizes;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod gemm;
pub mod grad_sum;
pub mod groups;
pub mod init;
pub mod kernels;
pub mod llama;
pub mod loss;
pub mod mlp;
pub mod norm;
mod passes;
pub mod rope;

pub use config::{LlamaConfig, INIT_STD};
pub use error::ModelError;
pub use grad_sum::GradSum;
pub use groups::{try_param_group, ParamGroup};
pub use init::{init_params, param_specs, ParamSpec};
pub use kernels::{Kernels, FLASH_HEAD_DIMS, FUSED_MAX_HIDDEN, LM_HEAD_CHUNK_ROWS};
pub use llama::Llama;
pub use loss::masked_cross_entropy;
pub use passes::TrainingPass;
