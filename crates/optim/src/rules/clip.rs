//! Gradient clipping by the global L2 norm (Pascanu et al. 2013, "On the difficulty of
//! training recurrent neural networks"; PyTorch's `clip_grad_norm_`) and the skip of a step
//! whose loss or norm is not finite (as PyTorch's `GradScaler` skips `optimizer.step()`), as
//! one rule for both devices. The host applies it here ([`clip_factor`]); on a CUDA device
//! `kernels/optim/grad_norm.cu` (`sum_partials`) applies the same IEEE operations to the
//! norm it has just summed and the AdamW kernels read the factor from device memory
//! ([`GradScale::Device`]), so a step waits for no host read before its update.

use crate::error::OptimError;
use candle_core::{DType, Tensor};

/// What the optimizer multiplies every raw gradient by (`g = grad * grad_scale`: the clip
/// factor, with any other scaling folded in), and whether it steps at all.
#[derive(Debug, Clone, Copy)]
pub enum GradScale<'a> {
    /// Known on the host: step with this factor.
    Host(f32),
    /// Decided on the device: an F32 tensor `[factor, skip]` on the parameters' device,
    /// written by work queued before the step on the same stream
    /// (`grad_norm::clip_on_device`). The step reads it when it runs: with `skip != 0` it
    /// changes nothing (weights, states and scales stay as they were, the step's stall counts
    /// read zero: an update that did not happen), else it steps with `factor`.
    Device(&'a Tensor),
}

/// Checks a [`GradScale::Device`] gate before a step uses it: F32 with 2 elements
/// (`[factor, skip]`).
///
/// # Errors
/// [`OptimError::State`] naming the gate's dtype and shape.
pub(crate) fn check_gate(gate: &Tensor) -> Result<(), OptimError> {
    if gate.dtype() != DType::F32 || gate.elem_count() != 2 {
        return Err(OptimError::State(format!("a device clip gate is F32 [factor, skip], not {:?} {:?}", gate.dtype(), gate.shape())));
    }
    Ok(())
}

/// The gradient factor of `scale` on the host: the factor itself, or the device gate's read
/// back (it synchronises); `None` when the gate says skip (the step changes nothing).
///
/// # Errors
/// A gate that is not F32 `[factor, skip]` ([`check_gate`]), or the copy failing.
pub(crate) fn host_factor(scale: GradScale) -> Result<Option<f32>, OptimError> {
    match scale {
        GradScale::Host(f) => Ok(Some(f)),
        GradScale::Device(gate) => {
            check_gate(gate)?;
            match gate.flatten_all()?.to_vec1::<f32>()?[..] {
                [_, skip] if skip != 0.0 => Ok(None),
                [factor, _] => Ok(Some(factor)),
                _ => unreachable!("check_gate: two elements"),
            }
        }
    }
}

/// The global gradient norm as reported, from Σ g² (FP64): its square root rounded to FP32
/// (`inf` beyond `f32::MAX`, which makes the step skip).
pub fn norm_of(sum_of_squares: f64) -> f32 {
    sum_of_squares.sqrt() as f32
}

/// The clip of a step with loss `loss` and global gradient norm `norm` ([`norm_of`]):
/// `None` when either is not finite (the step is skipped), else the factor
/// `max_norm / norm` when `0 < max_norm < norm` (FP32 division), else 1. `max_norm` = 0:
/// no clipping.
pub fn clip_factor(loss: f32, norm: f32, max_norm: f32) -> Option<f32> {
    if !(loss.is_finite() && norm.is_finite()) {
        return None;
    }
    Some(if max_norm > 0.0 && norm > max_norm { max_norm / norm } else { 1.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_factor_clips_above_the_threshold_and_skips_non_finite_steps() {
        assert_eq!(clip_factor(2.5, 4.0, 1.0), Some(0.25));
        assert_eq!(clip_factor(2.5, 1.0, 1.0), Some(1.0)); // at the threshold: unchanged
        assert_eq!(clip_factor(2.5, 0.5, 1.0), Some(1.0));
        assert_eq!(clip_factor(2.5, 1e30, 0.0), Some(1.0)); // no clipping
        assert_eq!(clip_factor(2.5, 3.0, 1.0), Some(1.0f32 / 3.0));
        assert_eq!(clip_factor(f32::NAN, 1.0, 1.0), None);
        assert_eq!(clip_factor(2.5, f32::INFINITY, 1.0), None);
        assert_eq!(clip_factor(f32::NEG_INFINITY, 1.0, 0.0), None);
        // a norm beyond f32::MAX is reported as inf: skipped
        assert_eq!(norm_of(1e80), f32::INFINITY);
        assert_eq!(clip_factor(2.5, norm_of(1e80), 1.0), None);
        assert_eq!(norm_of(6.25), 2.5);
    }
}
