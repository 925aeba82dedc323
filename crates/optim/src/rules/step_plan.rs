//! One update's plan ([`StepPlan`]), computed once on the host before any tensor is stepped
//! ([`Moments::plan`]): the resets the update does (the adaptive rule decides them here), and
//! for every tensor its FP32 constants ([`StepScalars`], the resets due included), its
//! write-back roundings and its random stream keys. Every rule steps from it: the CPU
//! references ([`crate::rules::adamw::LowbitAdamW::step_cpu`], SOAP's
//! [`crate::rules::soap::host::step_all`]) and the CUDA kernels' launch arguments
//! (`cuda::adamw::CudaAdamW`, `cuda::soap::CudaSoap`) read this one value, so the paths cannot
//! ask for different numbers.

use crate::error::OptimError;
use crate::rules::adamw::step::{Roundings, StepKeys, StepScalars};
use crate::states::config::{skip_threshold, VResetIdle};
use crate::states::format::Rounding;
use crate::states::moments::Moments;
use crate::states::reset::reset_at;
use crate::states::rng::{stream_key, StateKind};

/// What an update does to one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorPlan {
    /// FP32 constants, with the resets due before this update (`reset_m`, `reset_v`,
    /// `keep_idle_v`).
    pub scalars: StepScalars,
    /// Rounding of each write-back.
    pub roundings: Roundings,
    /// Random stream keys of the write-backs.
    pub keys: StepKeys,
}

/// The plan of one update: one [`TensorPlan`] per tensor, in tensor order.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    /// The update (the optimizer's 1-based step number).
    pub update: u64,
    /// Per tensor, in the optimizer's tensor order.
    pub tensors: Vec<TensorPlan>,
}

impl Moments {
    /// The plan of update `update` (1-based, updates in increasing order; planning the same
    /// update again gives the same plan) at learning rate `lr`, the raw gradients multiplied
    /// by `grad_scale` inside the step. The adaptive reset rule decides here whether m and v
    /// reset before this update, from the stall counts observed so far
    /// ([`AdaptiveReset::reset_before`](crate::states::reset::AdaptiveReset::reset_before)); periodic
    /// resets are a function of `update` alone.
    ///
    /// # Errors
    /// The adaptive rule is missing a measurement (the counts of an earlier update were not
    /// observed: [`Moments::observe`]).
    pub fn plan(&mut self, update: u64, lr: f64, grad_scale: f32) -> Result<StepPlan, OptimError> {
        let (beta2, s0) = (self.hyper.beta2, self.spec.reset_s0);
        if let Some(a) = &mut self.adaptive {
            a.reset_before(update, beta2, s0)?;
        }
        let tensors = (0..self.tensors.len()).map(|i| self.tensor_plan(i, update, lr, grad_scale)).collect();
        Ok(StepPlan { update, tensors })
    }

    /// Tensor `idx`'s part of the plan of `update` (its periods, bias correction, weight decay,
    /// roundings and keys; with the adaptive rule, the resets it decided).
    fn tensor_plan(&self, idx: usize, update: u64, lr: f64, grad_scale: f32) -> TensorPlan {
        let h = &self.hyper;
        let (spec, decay) = (&self.tensors[idx].spec, self.tensors[idx].info.weight_decay);
        let bc = spec.bias_correction;
        let ((reset_m, tm), (reset_v, tv)) = match &self.adaptive {
            None => (reset_at(update, spec.m_reset_every, bc), reset_at(update, spec.v_reset_every, bc)),
            Some(a) => {
                let now = (update == a.cycle_start && update > 1, a.bias_t(update, bc));
                (now, now)
            }
        };
        let wd = if decay { h.weight_decay } else { 0.0 };
        let mut scalars = StepScalars {
            grad_scale,
            lr: lr as f32,
            beta1: h.beta1 as f32,
            beta2: h.beta2 as f32,
            one_minus_beta1: (1.0 - h.beta1) as f32,
            one_minus_beta2: (1.0 - h.beta2) as f32,
            eps: h.eps as f32,
            decay: (1.0 - lr * wd) as f32,
            inv_bias_correction1: (1.0 / (1.0 - h.beta1.powi(tm.min(i32::MAX as u64) as i32))) as f32,
            inv_bias_correction2: (1.0 / (1.0 - h.beta2.powi(tv.min(i32::MAX as u64) as i32))) as f32,
            reset_m,
            reset_v,
            keep_idle_v: reset_v && !reset_m && spec.v_reset_idle == VResetIdle::Keep,
            skip_m: if update > self.skip_after { skip_threshold(spec.m_skip_prob) } else { 0 },
            skip_v: if update > self.skip_after { skip_threshold(spec.v_skip_prob) } else { 0 },
        };
        // Muon's momentum (m only): b1 is its momentum, no bias correction, no v
        if let Some(mo) = self.tensors[idx].momentum {
            scalars.beta1 = mo.beta as f32;
            scalars.one_minus_beta1 = (1.0 - mo.beta) as f32;
            scalars.inv_bias_correction1 = 1.0;
            (scalars.reset_v, scalars.keep_idle_v, scalars.skip_v) = (false, false, 0);
        }
        // (the weights' rounding is the whole model's)
        let roundings = Roundings { m: spec.m_rounding, v: spec.v_rounding, w: self.spec.weight_rounding };
        let key = |kind| stream_key(self.seed, update, idx as u64, kind);
        // dither: read what the previous update wrote, unless nothing was written (update 1) or
        // a reset zeroed it (v's idle elements kept by `keep_idle_v` were written: read them;
        // the zeroed ones are v = 0, which reads 0)
        let read = |rounding, reset: bool, kind| {
            (rounding == Rounding::Dither && update > 1 && !reset).then(|| stream_key(self.seed, update - 1, idx as u64, kind))
        };
        let keys = StepKeys {
            m: key(StateKind::M),
            v: key(StateKind::V),
            w: key(StateKind::W),
            skip: key(StateKind::Skip),
            m_read: read(roundings.m, scalars.reset_m, StateKind::M),
            v_read: read(roundings.v, scalars.reset_v && !scalars.keep_idle_v, StateKind::V)
                .filter(|_| self.tensors[idx].momentum.is_none()),
        };
        TensorPlan { scalars, roundings, keys }
    }
}
