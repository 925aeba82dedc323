//! The [`Optimizer`] trait over candle parameters that every update rule implements, once per
//! device: the CPU references ([`crate::rules::adamw::LowbitAdamW`],
//! [`crate::rules::soap::LowbitSoap`]) and the CUDA adapters (`cuda::adamw::CudaAdamW`,
//! `cuda::soap::CudaSoap`, `cuda` feature); [`crate::select::for_device`] picks one. All step
//! from one [`crate::rules::step_plan::StepPlan`] per update, and all observe their own stall
//! counts for the adaptive reset rule when the trainer reads them ([`Optimizer::stall_counts`]).

use crate::error::OptimError;
use crate::rules::clip::GradScale;
use crate::states::moments::TensorState;
use crate::states::stalls::StallCounts;
use crate::states::state_dict::HostStates;
use candle_core::{Tensor, Var};

/// An optimizer over candle parameters, one adapter per update rule and device (the CPU
/// references and the fused CUDA kernels), chosen by [`crate::select::for_device`]. Each holds
/// its states, whole or a ZeRO-1 shard ([`crate::states::moments::Moments::shard`]), and
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
    /// [`crate::states::reset::ADAPTIVE_LAG`]).
    fn count_lag(&self) -> usize {
        0
    }

    /// Hands the counts of update `step` summed over all tensors to the adaptive reset rule
    /// ([`crate::states::moments::Moments::observe`]); [`Optimizer::stall_counts`] calls it.
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
    fn states(&mut self) -> Result<HostStates<'_>, OptimError>;
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

/// The counts a CPU adapter kept of its last step (`last`), if they are update `step`'s: the
/// CPU references' [`Optimizer::measured_counts`].
///
/// # Errors
/// [`OptimError::State`] when the counts kept are another update's, or none.
pub(crate) fn take_counts(last: &mut Option<(u64, Vec<StallCounts>)>, step: u64) -> Result<Vec<StallCounts>, OptimError> {
    match last.take() {
        Some((s, c)) if s == step => Ok(c),
        _ => Err(OptimError::State(format!("stall counts of step {step} were not kept (the CPU optimizer keeps only the last step)"))),
    }
}

/// The [`Optimizer`] methods every CPU reference shares, over its fields `moments` (the
/// [`crate::states::moments::Moments`], whose adaptive reset rule observes the counts) and
/// `last` (the counts of its last step, [`take_counts`]).
macro_rules! cpu_reference_counts {
    () => {
        fn measured_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
            $crate::rules::optimizer::take_counts(&mut self.last, step)
        }

        fn observe(&mut self, step: u64, total: &StallCounts) {
            self.moments.observe(step, total);
        }

        fn last_adaptive_reset(&self) -> Option<u64> {
            self.moments.last_adaptive_reset()
        }
    };
}
pub(crate) use cpu_reference_counts;
