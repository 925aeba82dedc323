//! Which update rule, on which device: [`LowbitOptimizer`], the optimizer a run builds on the
//! host (AdamW, SOAP or Muon over the model's moments, restored from a checkpoint there), and
//! [`for_device`], the [`Optimizer`] that steps it on the run's device.

use crate::error::OptimError;
use crate::rules::adamw::LowbitAdamW;
use crate::rules::muon::LowbitMuon;
use crate::rules::optimizer::Optimizer;
use crate::rules::soap::LowbitSoap;
use crate::states::format::Rounding;
use crate::states::moments::Moments;
use crate::states::state_dict::{self, Array, HostStates};
use candle_core::Device;

/// The optimizer of a run on the host, one variant per update rule (`optim.kind`).
#[derive(Debug)]
pub enum LowbitOptimizer {
    /// AdamW over the moments.
    AdamW(LowbitAdamW),
    /// SOAP: the moments in the eigenbasis of its preconditioners.
    Soap(LowbitSoap),
    /// Muon for the attention and MLP matrices (their momentum alone), AdamW for the rest.
    Muon(LowbitMuon),
}

impl LowbitOptimizer {
    /// The moments and their settings (every rule has them).
    pub fn moments(&self) -> &Moments {
        match self {
            LowbitOptimizer::AdamW(a) => &a.moments,
            LowbitOptimizer::Soap(s) => &s.moments,
            LowbitOptimizer::Muon(m) => &m.moments,
        }
    }

    /// The moments, to change (a resume's older checkpoint formats).
    pub fn moments_mut(&mut self) -> &mut Moments {
        match self {
            LowbitOptimizer::AdamW(a) => &mut a.moments,
            LowbitOptimizer::Soap(s) => &mut s.moments,
            LowbitOptimizer::Muon(m) => &mut m.moments,
        }
    }

    /// Every state, borrowed ([`HostStates`]: what a checkpoint saves).
    pub fn states(&self) -> HostStates<'_> {
        match self {
            LowbitOptimizer::AdamW(a) => HostStates { moments: &a.moments, precond: None },
            LowbitOptimizer::Soap(s) => HostStates { moments: &s.moments, precond: Some(&s.precond) },
            LowbitOptimizer::Muon(m) => HostStates { moments: &m.moments, precond: None },
        }
    }

    /// Restore every state from `get` ([`state_dict::load_state_dict`]).
    ///
    /// # Errors
    /// Those of [`state_dict::load_state_dict`]: arrays that do not fit these states, or a
    /// checkpoint of the other rule.
    pub fn load_state_dict(&mut self, get: &mut dyn FnMut(&str) -> Option<Array>) -> Result<(), OptimError> {
        match self {
            LowbitOptimizer::AdamW(a) => state_dict::load_state_dict(&mut a.moments, None, get),
            LowbitOptimizer::Soap(s) => state_dict::load_state_dict(&mut s.moments, Some(&mut s.precond), get),
            LowbitOptimizer::Muon(m) => state_dict::load_state_dict(&mut m.moments, None, get),
        }
    }
}

/// The optimizer of `opt` on `dev`: the CPU reference itself on the CPU, the rule's CUDA
/// adapter (states uploaded) on a CUDA device (`cuda::adamw::CudaAdamW`,
/// `cuda::soap::CudaSoap`, `cuda::muon::CudaMuon`).
///
/// # Errors
/// The CUDA optimizer refusing the states or failing to upload them.
pub fn for_device(opt: LowbitOptimizer, dev: &Device) -> Result<Box<dyn Optimizer>, OptimError> {
    refuse_unported(&opt)?;
    match (opt, dev) {
        #[cfg(feature = "cuda")]
        (LowbitOptimizer::AdamW(a), Device::Cuda(d)) => Ok(Box::new(crate::cuda::adamw::CudaAdamW::new(a.moments, d)?)),
        #[cfg(feature = "cuda")]
        (LowbitOptimizer::Soap(s), Device::Cuda(d)) => Ok(Box::new(crate::cuda::soap::CudaSoap::new(s, d)?)),
        #[cfg(feature = "cuda")]
        (LowbitOptimizer::Muon(m), Device::Cuda(d)) => Ok(Box::new(crate::cuda::muon::CudaMuon::new(m, d)?)),
        (LowbitOptimizer::AdamW(a), _) => Ok(Box::new(a)),
        (LowbitOptimizer::Soap(s), _) => Ok(Box::new(s)),
        (LowbitOptimizer::Muon(m), _) => Ok(Box::new(m)),
    }
}

/// Settings an update rule does not take: dither inside SOAP (its eigenbasis refresh
/// rewrites the moments).
///
/// # Errors
/// Naming the setting and what to use instead.
pub fn refuse_unported(opt: &LowbitOptimizer) -> Result<(), OptimError> {
    let dither = opt.moments().tensors.iter().any(|t| t.spec.m_rounding == Rounding::Dither || t.spec.v_rounding == Rounding::Dither);
    match opt {
        LowbitOptimizer::Soap(_) if dither => Err(OptimError::Config(
            "optim.states.m_rounding / v_rounding = \"dither\" is implemented for AdamW only (SOAP's refresh rotates \
             the stored moments): use \"stochastic\" with optim.kind = \"soap\""
                .into(),
        )),
        _ => Ok(()),
    }
}
