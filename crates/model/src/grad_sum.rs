//! FP32 sums of the weights' gradients over the micro-batches of a step (gradient
//! accumulation, [`crate::TrainingPass::accumulate`]).

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor};

/// One FP32 sum per weight, keyed by the weight tensor, each made by the first pass that
/// added to it (so later passes may add into it in place: a sum read with [`GradSum::get`]
/// and kept changes with the passes that follow).
#[derive(Default)]
pub struct GradSum(GradStore);

impl GradSum {
    /// No sums yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sum of weight `w`'s gradients (F32, `w`'s shape; possibly a view into a padded
    /// buffer), if a pass added to it.
    pub fn get(&self, w: &Tensor) -> Option<&Tensor> {
        self.0.get(w)
    }

    /// `sum[w] += grad` out of place, widened to FP32 (`sum[w] = grad` widened where there is
    /// none).
    pub(crate) fn add(&mut self, w: &Tensor, grad: &Tensor) -> Result<()> {
        let g = grad.to_dtype(DType::F32)?;
        let g = match self.0.get(w) {
            Some(prev) => (prev + g)?,
            None => g,
        };
        self.0.insert(w, g);
        Ok(())
    }

    /// Replaces `w`'s sum by `sum` (what an op returned that added into it, in place or not).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn set(&mut self, w: &Tensor, sum: Tensor) {
        self.0.insert(w, sum);
    }
}
