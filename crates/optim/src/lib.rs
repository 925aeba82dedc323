//! # lowbit-optim: AdamW with low-precision moment states
//!
//! The CPU reference of lowbit's optimizer (the oracle the CUDA kernels match bit for bit):
//! state formats ([`mod@format`]), rounding ([`format::rounding`]), the counter RNG ([`rng`]),
//! the step ([`adamw`]), the global-norm clip ([`clip`]), resets ([`reset`]), stall counting ([`stalls`]), the closed-form
//! stall prediction ([`theory`]), which states each tensor gets ([`plan`]: per-group
//! formats), the states as named arrays for checkpoints ([`state_dict`])
//! and the crate's error ([`error`]); the whole model's states ([`optimizer`]: [`LowbitAdamW`]),
//! one update's plan ([`step_plan`]: [`StepPlan`]) and the [`Optimizer`] trait over candle
//! parameters with one adapter per device ([`adapter`]: [`LowbitAdamW`] on the CPU,
//! `cuda::CudaAdamW` with the `cuda` feature).
//!
//! ## The update (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
//! Kingma & Ba, "Adam", ICLR 2015), per element, in FP32, in this order:
//! ```text
//! m_old, v_old = decode(m), decode(v)            (0 right after a reset)
//! g  = grad * grad_scale                         (clipping and 1/accumulation folded in)
//! m  = b1 * m_old + (1 - b1) * g
//! v  = b2 * v_old + (1 - b2) * g^2
//! m^ = m * (1 / (1 - b1^t_m)) ; v^ = v * (1 / (1 - b2^t_v))   (t since the state's last reset;
//!                                                the inverses computed once per step in f64)
//! p  = p * (1 - lr * wd) - lr * m^ / (sqrt(v^) + eps)
//! m, v = encode(m), encode(v)                    (nearest or stochastic rounding)
//! ```
//! The parameter update uses the unrounded FP32 moments; only the write-back is rounded.
//! Simulated stalling (the paper's section 3.3, `optim.states.m_skip_prob` / `v_skip_prob`)
//! skips an element's write-back of m or v with probability p after the warmup: the stored
//! value stays, as a stalled element's does ([`adamw::Skip`]).
//! An element *stalls* when its FP32 update is non-zero but its stored representation (bits,
//! or code for scaled formats) is unchanged (Topollai & Choromanska 2026, arXiv:2603.16731;
//! [`stalls`] also counts the paper's estimator, unchanged entries over all entries).
//!
//! ## Example
//! ```
//! use lowbit_optim::{adamw::Weights, Hyper, LowbitAdamW, ParamInfo, StatesConfig};
//! let mut states = StatesConfig::default();
//! states.m_format = "fp8".into();
//! states.v_format = "fp8".into();
//! let spec = states.resolve(0.999).unwrap();
//! let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
//! let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: 4, weight_decay: true };
//! let mut opt = LowbitAdamW::new(hyper, spec, 0, vec![info]);
//! let mut w = vec![0.5f32; 4];
//! let plan = opt.plan(1, 1e-3, 1.0).unwrap();
//! let stalls = opt.step_cpu(&plan, 0, Weights::F32(&mut w), &[0.1, -0.2, 0.0, 0.3]);
//! assert!(w[0] < 0.5 && w[1] > 0.5);
//! assert_eq!((stalls.m.updated, stalls.m.elements, stalls.zero_grad), (3, 4, 1));
//! ```

pub mod adamw;
pub mod adapter;
pub mod clip;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_refresh;
#[cfg(feature = "cuda")]
pub mod cuda_soap;
pub mod error;
pub mod format;
#[cfg(feature = "cuda")]
pub mod grad_norm;
pub mod kernel_abi;
pub mod optimizer;
pub mod plan;
pub mod reset;
pub mod rng;
pub mod soap;
pub mod stalls;
pub mod state;
pub mod state_dict;
pub mod step_plan;
pub mod theory;

pub use adapter::Optimizer;
pub use clip::GradScale;
pub use config::{GroupStates, ResetEvery, ResetRule, ScaleChoice, StatesConfig, StatesSpec, VResetIdle, VZero};
pub use error::OptimError;
pub use format::{rounding::Rounding, scale::ScaleKind, StateFormat};
pub use optimizer::{Hyper, LowbitAdamW, ParamInfo, TensorState};
pub use plan::StatesPlan;
pub use reset::BiasCorrection;
pub use soap::{OptimizerKind, SoapConfig, SoapStates};
pub use stalls::{Counter, StallCounts};
pub use state::QuantState;
pub use step_plan::{StepPlan, TensorPlan};

use candle_core::Device;

/// The optimizer of `states` on `dev`: the CPU reference itself on the CPU, the fused kernels
/// (states uploaded) on a CUDA device; with SOAP's states ([`LowbitAdamW::soap`]) SOAP there
/// (`cuda_soap::CudaSoap`).
///
/// # Errors
/// The CUDA optimizer refusing the states or failing to upload them.
pub fn for_device(states: LowbitAdamW, dev: &Device) -> Result<Box<dyn Optimizer>, OptimError> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) if states.soap.is_some() => Ok(Box::new(cuda_soap::CudaSoap::new(states, d)?)),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => Ok(Box::new(cuda::CudaAdamW::new(states, d)?)),
        _ => Ok(Box::new(states)),
    }
}
