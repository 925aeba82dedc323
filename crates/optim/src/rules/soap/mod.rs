//! SOAP with low-precision states (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo
//! using Adam", arXiv:2409.11321, Alg. 3; Topollai & Choromanska, arXiv:2603.16731, Table 7 and
//! section 6.3): Adam run in the eigenbasis of Shampoo's two preconditioners, every state —
//! Adam's m and v and the preconditioner EMAs L and R — stored in `[optim.states]`'s formats
//! and counted by the same stall counters.
//!
//! Per matrix W (`rows x cols`) and update, with G = grad * grad_scale and the bases Q_L, Q_R
//! (a side longer than `optim.soap.max_precond_dim`, and both sides of a vector, keep no
//! preconditioner: its Q is the identity):
//! ```text
//! G' = Q_Lᵀ G Q_R                                   (G in the eigenbasis)
//! m  = b1 m + (1 - b1) G                            (original basis, as SOAP keeps it)
//! v  = b2 v + (1 - b2) G'²                          (rotated basis)
//! N' = (Q_Lᵀ m Q_R) * (1 / (1 - b1^t)) / (sqrt(v * (1 / (1 - b2^t))) + eps)
//! W  = W (1 - lr wd) - lr Q_L N' Q_Rᵀ
//! L  = bs L + (1 - bs) G Gᵀ ;  R = bs R + (1 - bs) Gᵀ G      (bs = optim.soap.shampoo_beta)
//! every `precondition_frequency` updates: Q <- QR(L Q) with Q's columns sorted by their
//! eigenvalue estimate, v's rows (columns) moved with them ([`basis::refresh`]).
//! ```
//! m, v, L and R are written back rounded as AdamW's states are ([`store::ema_write`]); each
//! update uses the unrounded FP32 values, and a refresh uses this update's unrounded L and R.
//! The first update of a matrix with a preconditioner only fills L and R and takes their full
//! eigendecomposition ([`basis::eigenbasis`]): its weights, m and v stay (the reference skips
//! it so that no gradient is projected on a basis built from itself). Its bias correction counts
//! that update (t is the update number since the last reset, as AdamW's), so the second update's
//! step is ~0.74 of the reference's, a gap that fades within the warmup.
//! Resets: m with `m_reset_every`, v and the two preconditioners with `v_reset_every` (the
//! paper's section 6.3 zeroes L and R with the moments); the bases stay. L and R need no bias
//! correction: eigenvectors and the QR power step do not depend on their scale.
//! L and R take m's format, block size, scale kind and rounding (they are signed), or the format
//! `optim.soap.precond_format` names ([`crate::states::precond`]); their random streams are
//! [`crate::states::precond::precond_key`]'s.

pub mod basis;
pub mod config;
pub mod host;
pub mod step;
pub mod store;

use crate::error::OptimError;
use crate::rules::clip::{host_factor, GradScale};
use crate::rules::optimizer::{check_sizes, cpu_reference_counts, Optimizer};
use crate::states::moments::Moments;
use crate::states::precond::SoapStates;
use crate::states::stalls::StallCounts;
use crate::states::state_dict::HostStates;
use candle_core::{Tensor, Var};
pub use config::SoapConfig;

/// SOAP with low-precision states: the CPU reference implementation, and the [`Optimizer`] for
/// `optim.kind = "soap"` on the CPU.
#[derive(Debug)]
pub struct LowbitSoap {
    /// Adam's moments in the eigenbasis, with their settings.
    pub moments: Moments,
    /// The preconditioners L and R and their eigenbases.
    pub precond: SoapStates,
    /// `[optim.soap]`.
    pub config: SoapConfig,
    /// Stall counts of the last step, until they are asked for
    /// ([`Optimizer::measured_counts`]).
    last: Option<(u64, Vec<StallCounts>)>,
}

impl LowbitSoap {
    /// SOAP over `moments` for parameters of shapes `dims` (tensor order): fresh
    /// preconditioners as `config` stores them ([`SoapStates::new`]).
    pub fn new(moments: Moments, config: SoapConfig, dims: &[Vec<usize>]) -> Self {
        let precond = SoapStates::new(&moments, dims, config.storage());
        LowbitSoap { moments, precond, config, last: None }
    }

    /// SOAP over states that exist already (a copy from a device, a checkpoint's).
    pub fn from_states(moments: Moments, precond: SoapStates, config: SoapConfig) -> Self {
        LowbitSoap { moments, precond, config, last: None }
    }
}

/// The CPU reference behind the trait: [`host::step_all`].
impl Optimizer for LowbitSoap {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.moments.tensors, params, grads)?;
        let Some(grad_scale) = host_factor(scale)? else { return Ok(()) };
        let plan = self.moments.plan(step, lr, grad_scale)?;
        let out = host::step_all(&mut self.moments, &mut self.precond, &self.config, &plan, params, grads)?;
        self.last = Some((step, out));
        Ok(())
    }

    cpu_reference_counts!();

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        Ok(HostStates { moments: &self.moments, precond: Some(&self.precond) })
    }
}
