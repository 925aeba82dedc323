//! AdamW with low-precision moment states (Loshchilov & Hutter 2019; the equations are the
//! crate's, [`crate`]): the per-element CPU reference maths ([`step`]) and the CPU optimizer
//! over a whole model ([`LowbitAdamW`]). The fused kernel that matches it bit for bit is
//! `cuda::adamw::CudaAdamW`.

pub mod step;

use crate::error::OptimError;
use crate::rules::clip::{host_factor, GradScale};
use crate::rules::optimizer::{check_sizes, cpu_reference_counts, Optimizer};
use crate::rules::step_plan::{StepPlan, TensorPlan};
use crate::states::moments::{Hyper, Moments, ParamInfo, TensorState};
use crate::states::plan::StatesPlan;
use crate::states::stalls::StallCounts;
use crate::states::state_dict::HostStates;
use candle_core::{DType, Tensor, Var};
use half::bf16;
use step::{step_tensor, Scratch, Weights};

/// AdamW with low-precision moment states: the CPU reference implementation, and the
/// [`Optimizer`] on the CPU.
#[derive(Debug)]
pub struct LowbitAdamW {
    /// The moments it steps, with their settings.
    pub moments: Moments,
    /// The CPU step's buffers ([`LowbitAdamW::step_cpu`]).
    scratch: Scratch,
    /// Stall counts of the last step, until they are asked for
    /// ([`Optimizer::measured_counts`]).
    last: Option<(u64, Vec<StallCounts>)>,
}

impl LowbitAdamW {
    /// Zero-initialised states for `params`, each tensor's as `plan` says ([`Moments::new`]).
    pub fn new(hyper: Hyper, plan: impl Into<StatesPlan>, seed: u64, params: Vec<ParamInfo>) -> Self {
        Self::from_moments(Moments::new(hyper, plan, seed, params))
    }

    /// AdamW over `moments` (e.g. a ZeRO-1 shard, [`Moments::shard`]).
    pub fn from_moments(moments: Moments) -> Self {
        LowbitAdamW { moments, scratch: Scratch::default(), last: None }
    }

    /// The CPU reference step of tensor `idx` under `plan` ([`Moments::plan`] of this
    /// update): `w` updated in place from the FP32 gradient `g`. In a sharded optimizer `w`
    /// and `g` are the held shard's elements (`first .. first + len` of the tensor).
    pub fn step_cpu(&mut self, plan: &StepPlan, idx: usize, w: Weights, g: &[f32]) -> StallCounts {
        let p = &plan.tensors[idx];
        let t = &mut self.moments.tensors[idx];
        step_tensor(w, g, &mut t.m, &mut t.v, &p.scalars, &p.roundings, &p.keys, t.first, &mut self.scratch)
    }
}

/// Tensor `t` (whose parameter is `var`, gradient `grad`) copied to the host, stepped under
/// its part `p` of the update's plan over the elements its states cover
/// ([`LowbitAdamW::step_cpu`]'s maths) and written back: the CPU reference's step of one
/// AdamW tensor (Muon's CPU reference steps its non-matrix tensors with it too).
///
/// # Errors
/// A parameter neither F32 nor BF16, or a tensor operation failing.
pub(crate) fn step_var(
    t: &mut TensorState,
    p: &TensorPlan,
    scratch: &mut Scratch,
    var: &Var,
    grad: &Tensor,
) -> Result<StallCounts, OptimError> {
    let tensor = var.as_tensor();
    let r = t.first..t.first + t.m.len;
    let g = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut step = |w: Weights| step_tensor(w, &g[r.clone()], &mut t.m, &mut t.v, &p.scalars, &p.roundings, &p.keys, t.first, scratch);
    match tensor.dtype() {
        DType::F32 => {
            let mut w = tensor.flatten_all()?.to_vec1::<f32>()?;
            let c = step(Weights::F32(&mut w[r.clone()]));
            var.set(&Tensor::from_vec(w, tensor.shape(), tensor.device())?)?;
            Ok(c)
        }
        DType::BF16 => {
            let mut w: Vec<u16> = tensor.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect();
            let c = step(Weights::Bf16(&mut w[r.clone()]));
            let w: Vec<bf16> = w.into_iter().map(bf16::from_bits).collect();
            var.set(&Tensor::from_vec(w, tensor.shape(), tensor.device())?)?;
            Ok(c)
        }
        d => Err(OptimError::State(format!("parameter {} has unsupported dtype {d:?} (F32 or BF16)", t.info.name))),
    }
}

/// The CPU reference behind the trait: each tensor copied to the host, stepped over the
/// elements the states cover ([`LowbitAdamW::step_cpu`]), written back.
impl Optimizer for LowbitAdamW {
    /// With a [`GradScale::Device`] the factor is read from the device first; a skip plans
    /// nothing (the next call plans the same update).
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.moments.tensors, params, grads)?;
        let Some(grad_scale) = host_factor(scale)? else { return Ok(()) };
        let plan = self.moments.plan(step, lr, grad_scale)?;
        let (tensors, scratch) = (&mut self.moments.tensors, &mut self.scratch);
        let out = tensors
            .iter_mut()
            .zip(&plan.tensors)
            .zip(params.iter().zip(grads))
            .map(|((t, p), (var, grad))| step_var(t, p, scratch, var, grad))
            .collect::<Result<_, _>>()?;
        self.last = Some((step, out));
        Ok(())
    }

    cpu_reference_counts!();

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        Ok(HostStates { moments: &self.moments, precond: None })
    }
}
