//! The [`Optimizer`] trait over candle parameters, one adapter per device: the CPU reference
//! ([`LowbitAdamW`] itself, here) and the fused CUDA kernels (`cuda::CudaAdamW`, `cuda`
//! feature); [`crate::for_device`] picks one. Both step from one [`crate::step_plan::StepPlan`]
//! per update, and both observe their own stall counts for the adaptive reset rule when the
//! trainer reads them ([`Optimizer::stall_counts`]).

use crate::adamw::Weights;
use crate::clip::GradScale;
use crate::error::OptimError;
use crate::optimizer::{LowbitAdamW, TensorState};
use crate::stalls::StallCounts;
use candle_core::{DType, Tensor, Var};
use half::bf16;

/// An optimizer over candle parameters, one adapter per device: the CPU reference
/// ([`LowbitAdamW`]) and the fused CUDA kernels (`cuda::CudaAdamW`, `cuda` feature), chosen by
/// [`crate::for_device`]. Each holds its states, whole or a ZeRO-1 shard ([`LowbitAdamW::shard`]), and
/// updates the elements they cover (`first .. first + len` of each tensor) of the whole
/// parameters it is given.
pub trait Optimizer {
    /// One step at `step` (1-based) with learning rate `lr`. `grads[i]` is the gradient of
    /// `params[i]` (F32, or BF16 from a BF16 model: widened exactly to FP32), multiplied by
    /// the factor `scale` gives inside the step; a [`GradScale::Device`] that says skip makes
    /// the step change nothing (call it again with the same `step` for the next update).
    ///
    /// # Errors
    /// Tensors that do not fit the states (count, sizes, dtypes, device), a tensor operation
    /// failing, or the adaptive reset rule missing a measurement.
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError>;

    /// Stall counts of each tensor at completed update `step`, which the optimizer's adaptive
    /// reset rule then observes ([`Optimizer::observe`] of their total over all tensors): read
    /// every update's, once, in order (reading them may wait for the device; read them
    /// [`Optimizer::count_lag`] steps later to keep the device busy).
    ///
    /// # Errors
    /// Those of [`Optimizer::measured_counts`].
    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
        let counts = self.measured_counts(step)?;
        self.observe(step, &counts.iter().copied().sum());
        Ok(counts)
    }

    /// Stall counts of each tensor at completed update `step` as measured (summed over the
    /// ranks by a ZeRO-1 wrapper), not observed: what [`Optimizer::stall_counts`] reads.
    ///
    /// # Errors
    /// Counts no longer kept, or the copy from the device failing.
    fn measured_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError>;

    /// How many steps late the trainer reads stall counts (0 on the CPU; at most
    /// [`crate::reset::ADAPTIVE_LAG`]).
    fn count_lag(&self) -> usize {
        0
    }

    /// Hands the counts of update `step` summed over all tensors to the adaptive reset rule
    /// ([`LowbitAdamW::observe`]); [`Optimizer::stall_counts`] calls it.
    fn observe(&mut self, step: u64, total: &StallCounts);

    /// The update before which the adaptive reset rule (the paper's Alg. 2) last reset m and
    /// v; `None` without the rule or before its first reset. The trainer logs each reset from
    /// it.
    fn last_adaptive_reset(&self) -> Option<u64> {
        None
    }

    /// The states, on the host (for checkpoints and inspection).
    ///
    /// # Errors
    /// The copy from the device failing.
    fn states(&mut self) -> Result<&LowbitAdamW, OptimError>;
}

/// Checks, before anything is stepped, that `params` and `grads` match `tensors` one for
/// one: as many of each as tensors, each gradient the size of its parameter, and the
/// elements the states hold (`first .. first + m.len`) inside it.
///
/// # Errors
/// [`OptimError::State`] naming the first tensor that does not match.
pub(crate) fn check_sizes(tensors: &[TensorState], params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
    if params.len() != tensors.len() || grads.len() != tensors.len() {
        return Err(OptimError::State(format!("{} parameters and {} gradients for {} tensors", params.len(), grads.len(), tensors.len())));
    }
    for (s, (p, g)) in tensors.iter().zip(params.iter().zip(grads)) {
        let n = p.elem_count();
        if g.elem_count() != n || s.first + s.m.len > n {
            return Err(OptimError::State(format!(
                "{}: a parameter of {n} and a gradient of {} elements, the states hold elements {}..{}",
                s.info.name,
                g.elem_count(),
                s.first,
                s.first + s.m.len
            )));
        }
    }
    Ok(())
}

/// The CPU reference behind the trait: each tensor copied to the host, stepped over the
/// elements the states cover ([`LowbitAdamW::step_cpu`]), written back.
impl Optimizer for LowbitAdamW {
    /// With a [`GradScale::Device`] the factor is read from the device first; a skip plans
    /// nothing (the next call plans the same update).
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.tensors, params, grads)?;
        let Some(grad_scale) = crate::clip::host_factor(scale)? else { return Ok(()) };
        let plan = self.plan(step, lr, grad_scale)?;
        if self.soap.is_some() {
            let out = crate::soap::host::step_all(self, &plan, params, grads)?;
            self.last = Some((step, out));
            return Ok(());
        }
        let mut out = Vec::with_capacity(params.len());
        for (i, (var, grad)) in params.iter().zip(grads).enumerate() {
            let (first, len) = (self.tensors[i].first, self.tensors[i].m.len);
            let t = var.as_tensor();
            let r = first..first + len;
            let g = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let counts = match t.dtype() {
                DType::F32 => {
                    let mut p = t.flatten_all()?.to_vec1::<f32>()?;
                    let c = self.step_cpu(&plan, i, Weights::F32(&mut p[r.clone()]), &g[r]);
                    var.set(&Tensor::from_vec(p, t.shape(), t.device())?)?;
                    c
                }
                DType::BF16 => {
                    let mut p: Vec<u16> = t.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect();
                    let c = self.step_cpu(&plan, i, Weights::Bf16(&mut p[r.clone()]), &g[r]);
                    let p: Vec<bf16> = p.into_iter().map(bf16::from_bits).collect();
                    var.set(&Tensor::from_vec(p, t.shape(), t.device())?)?;
                    c
                }
                d => {
                    return Err(OptimError::State(format!(
                        "parameter {} has unsupported dtype {d:?} (F32 or BF16)",
                        self.tensors[i].info.name
                    )))
                }
            };
            out.push(counts);
        }
        self.last = Some((step, out));
        Ok(())
    }

    fn measured_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
        match self.last.take() {
            Some((s, c)) if s == step => Ok(c),
            _ => Err(OptimError::State(format!("stall counts of step {step} were not kept (the CPU optimizer keeps only the last step)"))),
        }
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        LowbitAdamW::observe(self, step, total);
    }

    fn last_adaptive_reset(&self) -> Option<u64> {
        self.adaptive.as_ref().and_then(|a| a.last_reset())
    }

    fn states(&mut self) -> Result<&LowbitAdamW, OptimError> {
        Ok(self)
    }
}
