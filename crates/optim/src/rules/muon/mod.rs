//! Muon with low-precision momentum (Jordan et al. 2024, "Muon: An optimizer for hidden layers
//! in neural networks", kellerjordan.github.io/posts/muon; reference code
//! github.com/KellerJordan/Muon; the update's scale as Moonlight's, Liu et al. 2025,
//! arXiv:2502.16982): the attention and MLP matrices step by Muon, every other tensor (the
//! embedding, the LM head, the norm gains) by AdamW, as the reference recipes split them
//! ([`is_muon_matrix`]).
//!
//! Per Muon matrix W (`rows x cols`) and update, in FP32:
//! ```text
//! m = b m + (1 - b) g ;  u = (1 - b) g + b m  (Nesterov; else u = m)     [momentum]
//! O = NewtonSchulz5(u)                                                    [orthogonalize]
//! W = W (1 - lr wd) - lr * update_rms * sqrt(max(rows, cols)) * O         [apply]
//! ```
//! m, Muon's one state, is stored in `[optim.states]`'s m format with m's rounding (nearest,
//! stochastic or dither), m's resets and m's stall counters, exactly as AdamW's m is (the same
//! write-back, [`crate::rules::adamw::step::write_back`]); the tensor keeps no v
//! ([`crate::states::moments::Momentum`]). Only m stalls (measured; the closed-form theory is v's):
//! a clean test of the paper's section 3.3 (m stalls hurt more than v stalls). The momentum step is per element and
//! bit-exact between the CPU reference ([`momentum`]) and the fused kernel; orthogonalisation
//! and the weight update are candle operations on the parameters' device ([`orthogonalize`],
//! [`apply`]): the same operations on CPU and GPU, equal to within the products' rounding.
//! BF16 weights of the Muon matrices round to nearest.

pub mod apply;
pub mod config;
pub mod momentum;
pub mod orthogonalize;

use crate::error::OptimError;
use crate::rules::adamw::step::Scratch;
use crate::rules::adamw::step_var;
use crate::rules::clip::{host_factor, GradScale};
use crate::rules::optimizer::{check_sizes, cpu_reference_counts, Optimizer};
use crate::rules::step_plan::StepPlan;
use crate::states::moments::{Moments, Momentum, ParamInfo};
use crate::states::stalls::{Counter, StallCounts};
use crate::states::state_dict::HostStates;
use candle_core::{DType, Device, Tensor, Var};
pub use config::MuonConfig;

/// Whether Muon steps a parameter of shape `dims`: a matrix of the attention or MLP blocks
/// (groups `attn`, `mlp`); the embedding, the LM head and the norm gains take AdamW.
pub fn is_muon_matrix(info: &ParamInfo, dims: &[usize]) -> bool {
    dims.len() == 2 && matches!(info.group.as_str(), "attn" | "mlp")
}

/// The weight update's factors of Muon tensor `idx` at learning rate `lr` under `plan`: its
/// decay `1 - lr wd` (the plan's) and its step `lr * config.lr_factor(rows, cols)` (in f64,
/// rounded once to FP32), as [`apply::apply_update`] takes them.
///
/// # Panics
/// Tensor `idx` is not a Muon matrix.
pub fn step_size(moments: &Moments, plan: &StepPlan, config: &MuonConfig, idx: usize, lr: f64) -> (f32, f32) {
    let mo = moments.tensors[idx].momentum.expect("a Muon tensor");
    (plan.tensors[idx].scalars.decay, (lr * config.lr_factor(mo.rows, mo.cols)) as f32)
}

/// Muon with low-precision momentum: the CPU reference implementation, and the [`Optimizer`]
/// for `optim.kind = "muon"` on the CPU.
#[derive(Debug)]
pub struct LowbitMuon {
    /// The states: m only for the Muon matrices ([`crate::states::moments::TensorState::momentum`]),
    /// AdamW's m and v for the rest.
    pub moments: Moments,
    /// `[optim.muon]`.
    pub config: MuonConfig,
    /// The AdamW tensors' step buffers.
    scratch: Scratch,
    /// Stall counts of the last step, until they are asked for.
    last: Option<(u64, Vec<StallCounts>)>,
}

impl LowbitMuon {
    /// Muon over `moments` for parameters of shapes `dims` (tensor order): each Muon matrix
    /// ([`is_muon_matrix`]) gets its momentum settings and loses its v.
    pub fn new(mut moments: Moments, config: MuonConfig, dims: &[Vec<usize>]) -> Self {
        for (t, d) in moments.tensors.iter_mut().zip(dims) {
            if is_muon_matrix(&t.info, d) {
                t.momentum = Some(Momentum { beta: config.momentum, nesterov: config.nesterov, rows: d[0], cols: d[1] });
                t.v = t.v.zeros_like(0);
            }
        }
        Self::from_moments(moments, config)
    }

    /// Muon over states that exist already (a copy from a device, a checkpoint's).
    pub fn from_moments(moments: Moments, config: MuonConfig) -> Self {
        LowbitMuon { moments, config, scratch: Scratch::default(), last: None }
    }
}

/// The weight counts of a BF16 Muon matrix of `len` elements from [`apply::apply_update`]'s
/// `[updated, stalled, unchanged]`.
pub fn weight_counter(counts: &[u32], len: usize) -> Counter {
    Counter { updated: counts[0].into(), stalled: counts[1].into(), unchanged: counts[2].into(), elements: len as u64 }
}

/// The CPU reference behind the trait: AdamW's tensors as [`crate::rules::adamw::LowbitAdamW`]
/// steps them, the Muon matrices' momentum ([`momentum::momentum_step`]), their updates
/// orthogonalised by shape ([`orthogonalize::orthogonalize_all`]) and applied
/// ([`apply::apply_update`]).
impl Optimizer for LowbitMuon {
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.moments.tensors, params, grads)?;
        let Some(grad_scale) = host_factor(scale)? else { return Ok(()) };
        let plan = self.moments.plan(step, lr, grad_scale)?;
        let mut out = vec![StallCounts::default(); params.len()];
        let (mut ids, mut updates) = (vec![], vec![]);
        for (i, t) in self.moments.tensors.iter_mut().enumerate() {
            let p = &plan.tensors[i];
            match t.momentum {
                Some(mo) => {
                    let g = grads[i].to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                    let (u, counts) = momentum::momentum_step(t, p, &g);
                    out[i] = counts;
                    ids.push(i);
                    updates.push(Tensor::from_vec(u, (mo.rows, mo.cols), &Device::Cpu)?);
                }
                None => out[i] = step_var(t, p, &mut self.scratch, &params[i], &grads[i])?,
            }
        }
        let orthogonal = orthogonalize::orthogonalize_all(&updates, self.config.ns_steps)?;
        for (&i, o) in ids.iter().zip(orthogonal) {
            let (decay, size) = step_size(&self.moments, &plan, &self.config, i, lr);
            if let Some(c) = apply::apply_update(&params[i], &o.to_device(params[i].device())?, decay, size, None)? {
                out[i].w = weight_counter(&c.to_vec1::<u32>()?, self.moments.tensors[i].m.len);
            }
        }
        self.last = Some((step, out));
        Ok(())
    }

    cpu_reference_counts!();

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        Ok(HostStates { moments: &self.moments, precond: None })
    }
}
