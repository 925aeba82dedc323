//! # lowbit-optim: optimizers with low-precision states
//!
//! AdamW, SOAP and Muon whose states (moments, preconditioners, momentum) are stored in BF16, FP8, FP4, int8 and
//! the precision-only formats, with stochastic rounding, resets and stall counting; a CPU
//! reference of each update rule that the fused CUDA kernels match bit for bit. Three layers,
//! each a folder, each using only the ones above it in this list:
//!
//! - [`states`]: what is stored. The formats ([`states::format`]: bit layouts, rounding, block
//!   scales), one state's codes and scales ([`states::quant`]: [`QuantState`]), the counter RNG
//!   ([`states::rng`]), the `[optim.states]` settings ([`states::config`]) and per-group plan
//!   ([`states::plan`]), a whole model's moments ([`states::moments`]: [`Moments`]) and SOAP's
//!   preconditioners ([`states::precond`]: [`SoapStates`]), resets ([`states::reset`]), stall
//!   counters ([`states::stalls`]), the closed-form stall prediction ([`states::theory`]), and
//!   the states as named arrays for checkpoints ([`states::state_dict`]).
//! - [`rules`]: the update rules, each with its CPU reference maths: AdamW ([`rules::adamw`]:
//!   [`LowbitAdamW`]), SOAP ([`rules::soap`]: [`LowbitSoap`]) and Muon ([`rules::muon`]:
//!   [`LowbitMuon`]), which one a run takes ([`rules::kind`]); what they share, the
//!   [`Optimizer`] trait ([`rules::optimizer`]), one update's plan ([`rules::step_plan`]:
//!   [`StepPlan`]) and the global-norm clip's factor ([`rules::clip`]).
//! - [`cuda`]: the kernels' ABI ([`cuda::abi`]) and, with the `cuda` feature, the launchers of
//!   each rule (`cuda::adamw`, `cuda::soap`, `cuda::refresh`, `cuda::muon`, `cuda::grad_norm`).
//!
//! On top, [`select`]: [`LowbitOptimizer`], the rule a run builds on the host, and
//! [`for_device`], the [`Optimizer`] that steps it on the run's device; and the crate's error
//! ([`error`]).
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
//! value stays, as a stalled element's does ([`rules::adamw::step::Skip`]).
//! An element *stalls* when its FP32 update is non-zero but its stored representation (bits,
//! or code for scaled formats) is unchanged (Topollai & Choromanska 2026, arXiv:2603.16731;
//! [`states::stalls`] also counts the paper's estimator, unchanged entries over all entries).
//!
//! ## Example
//! ```
//! use lowbit_optim::{rules::adamw::step::Weights, Hyper, LowbitAdamW, ParamInfo, StatesConfig};
//! let mut states = StatesConfig::default();
//! states.m_format = "fp8".into();
//! states.v_format = "fp8".into();
//! let spec = states.resolve(0.999).unwrap();
//! let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
//! let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: 4, weight_decay: true };
//! let mut opt = LowbitAdamW::new(hyper, spec, 0, vec![info]);
//! let mut w = vec![0.5f32; 4];
//! let plan = opt.moments.plan(1, 1e-3, 1.0).unwrap();
//! let stalls = opt.step_cpu(&plan, 0, Weights::F32(&mut w), &[0.1, -0.2, 0.0, 0.3]);
//! assert!(w[0] < 0.5 && w[1] > 0.5);
//! assert_eq!((stalls.m.updated, stalls.m.elements, stalls.zero_grad), (3, 4, 1));
//! ```

pub mod cuda;
pub mod error;
pub mod rules;
pub mod select;
pub mod states;

pub use error::OptimError;
pub use rules::adamw::LowbitAdamW;
pub use rules::clip::GradScale;
pub use rules::kind::OptimizerKind;
pub use rules::muon::{LowbitMuon, MuonConfig};
pub use rules::soap::{LowbitSoap, SoapConfig};
pub use rules::step_plan::{StepPlan, TensorPlan};
pub use rules::Optimizer;
pub use select::{for_device, LowbitOptimizer};
pub use states::config::{GroupStates, ResetEvery, ResetRule, ScaleChoice, StatesConfig, StatesSpec, VResetIdle, VZero};
pub use states::format::{rounding::Rounding, scale::ScaleKind, StateFormat};
pub use states::moments::{Hyper, Moments, Momentum, ParamInfo, TensorState};
pub use states::plan::StatesPlan;
pub use states::precond::{PrecondStorage, SoapStates};
pub use states::quant::QuantState;
pub use states::reset::BiasCorrection;
pub use states::stalls::{Counter, StallCounts};
pub use states::state_dict::HostStates;
/// The closed-form stall prediction, at the crate's root as before the layers
/// ([`states::theory`]).
pub use states::theory;
