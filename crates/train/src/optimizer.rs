//! Glue between candle parameters and the optimizer: one trait, so the CPU reference and
//! the fused CUDA kernels drop in behind the same call.

use anyhow::{Context, Result};
use candle_core::{DType, Tensor, Var};
use half::bf16;
use lowbit_optim::adamw::Weights;
use lowbit_optim::{LowbitAdamW, StallCounts};

/// Model parameters in the optimizer's order (sorted by name; the index is the tensor id of
/// the RNG streams).
pub struct ParamSet {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
}

impl ParamSet {
    /// All variables of a VarMap, sorted by name.
    pub fn from_varmap(vm: &candle_nn::VarMap) -> Self {
        let data = vm.data().lock().unwrap();
        let mut pairs: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let (names, vars) = pairs.into_iter().unzip();
        ParamSet { names, vars }
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.vars.iter().map(|v| v.elem_count()).sum()
    }
}

/// An optimizer over a [`ParamSet`].
pub trait Optimizer {
    /// One step at `step` (1-based) with learning rate `lr`. `grads[i]` is the gradient of
    /// `params.vars[i]` (F32, or BF16 from a BF16 model: widened exactly to FP32),
    /// multiplied by `grad_scale` inside the step.
    fn step(&mut self, step: u64, lr: f64, grad_scale: f32, params: &ParamSet, grads: &[Tensor]) -> Result<()>;

    /// Stall counts of each tensor at a completed `step` (reading them may wait for the
    /// device; call it [`Optimizer::count_lag`] steps later to keep the device busy).
    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>>;

    /// How many steps late the trainer reads stall counts (0 on the CPU; at most
    /// `lowbit_optim::reset::ADAPTIVE_LAG`).
    fn count_lag(&self) -> usize {
        0
    }

    /// The counts of update `step` summed over all tensors, for the adaptive reset rule
    /// (`LowbitAdamW::observe`); every update's, in order, once the trainer has read them.
    fn observe(&mut self, step: u64, total: &StallCounts);

    /// The states, on the host (for checkpoints and inspection).
    fn states(&mut self) -> Result<&LowbitAdamW>;
}

/// The CPU reference optimizer: copies each tensor to the host, steps it, writes it back.
pub struct HostAdamW {
    pub opt: LowbitAdamW,
    /// Counts of the last step, until the trainer reads them.
    last: Option<(u64, Vec<StallCounts>)>,
}

impl HostAdamW {
    pub fn new(opt: LowbitAdamW) -> Self {
        HostAdamW { opt, last: None }
    }
}

impl Optimizer for HostAdamW {
    fn step(
        &mut self,
        step: u64,
        lr: f64,
        grad_scale: f32,
        params: &ParamSet,
        grads: &[Tensor],
    ) -> Result<()> {
        self.opt.begin_update(step).map_err(anyhow::Error::msg)?;
        let mut out = Vec::with_capacity(params.vars.len());
        for (i, (var, grad)) in params.vars.iter().zip(grads).enumerate() {
            let g = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let t = var.as_tensor();
            let counts = match t.dtype() {
                DType::F32 => {
                    let mut p = t.flatten_all()?.to_vec1::<f32>()?;
                    let c = self.opt.step_cpu(step, lr, grad_scale, i, Weights::F32(&mut p), &g);
                    var.set(&Tensor::from_vec(p, t.shape(), t.device())?)?;
                    c
                }
                DType::BF16 => {
                    let mut p: Vec<u16> =
                        t.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect();
                    let c = self.opt.step_cpu(step, lr, grad_scale, i, Weights::Bf16(&mut p), &g);
                    let p: Vec<bf16> = p.into_iter().map(bf16::from_bits).collect();
                    var.set(&Tensor::from_vec(p, t.shape(), t.device())?)?;
                    c
                }
                d => anyhow::bail!("parameter {} has unsupported dtype {d:?}", params.names[i]),
            };
            out.push(counts);
        }
        self.last = Some((step, out));
        Ok(())
    }

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>> {
        match self.last.take() {
            Some((s, c)) if s == step => Ok(c),
            _ => anyhow::bail!("stall counts of step {step} were not kept (the CPU optimizer keeps only the last step)"),
        }
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        self.opt.observe(step, total);
    }

    fn states(&mut self) -> Result<&LowbitAdamW> {
        Ok(&self.opt)
    }
}

/// Global L2 norm of all gradients (any float dtype), so that finite gradients give a
/// finite norm (four elements of 1e19: 2e19) and tiny ones keep their precision: squares
/// summed in FP32, and again in F64 only when that sum overflowed or is below 1e-20 (where
/// FP32 squares may have underflowed); F64 every step costs two more copies of every
/// gradient. One host sync per pass. Matrices are summed by rows first: candle reduces a
/// whole tensor in one thread block. A norm beyond `f32::MAX` is returned as `inf`.
///
/// On a CUDA device (the `cuda` feature) the sum is one fused pass in FP64
/// ([`lowbit_optim::grad_norm::sum_of_squares`]: squares of F32 and BF16 gradients, a fixed
/// summation order).
pub fn global_norm(grads: &[Tensor]) -> Result<f32> {
    #[cfg(feature = "cuda")]
    if grads.first().is_some_and(|g| g.device().is_cuda()) {
        return Ok(lowbit_optim::grad_norm::sum_of_squares(grads)?.sqrt() as f32);
    }
    let sq = sum_of_squares(grads, DType::F32)?;
    if sq.is_nan() || (sq.is_finite() && sq >= 1e-20) {
        return Ok(sq.sqrt() as f32);
    }
    Ok(sum_of_squares(grads, DType::F64)?.sqrt() as f32)
}

/// Σ g² over all gradients, each squared and summed in `dtype`, read to the host.
fn sum_of_squares(grads: &[Tensor], dtype: DType) -> Result<f64> {
    let mut total: Option<Tensor> = None;
    for g in grads {
        let sq = g.to_dtype(dtype)?.sqr()?;
        let s = if g.rank() >= 2 { sq.sum(candle_core::D::Minus1)?.sum_all()? } else { sq.sum_all()? };
        total = Some(match total {
            None => s,
            Some(t) => (t + s)?,
        });
    }
    Ok(total.context("no gradients")?.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Squares of 1e19 overflow FP32 (1e38 each, 4e38 in all); the norm does not: 2e19.
    #[test]
    fn global_norm_of_huge_finite_gradients_is_finite() -> Result<()> {
        let dev = Device::Cpu;
        let matrix = Tensor::new(&[[1e19f32, 1e19], [0.0, 0.0]], &dev)?;
        let vector = Tensor::new(&[1e19f32, -1e19], &dev)?;
        let norm = global_norm(&[matrix, vector.to_dtype(DType::BF16)?])?;
        assert!((norm - 2e19).abs() < 2e19 * 1e-2, "{norm}"); // BF16 holds 1e19 to 3 digits
        let norm = global_norm(&[Tensor::new(&[[1e19f32, 1e19, 1e19, 1e19]], &dev)?])?;
        assert_eq!(norm, 2e19);
        // Tiny gradients keep their precision too (squares below FP32's smallest normal).
        let norm = global_norm(&[Tensor::new(&[3e-23f32, 4e-23], &dev)?])?;
        assert!((norm - 5e-23).abs() < 5e-23 * 1e-6, "{norm}");
        Ok(())
    }
}
