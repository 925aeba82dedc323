//! The optimizer over a whole model: one [`QuantState`] pair per parameter tensor, the
//! host-side per-step constants (learning rate, bias corrections, resets, RNG keys) and the
//! CPU reference step. The CUDA path (`cuda` feature) uses the same constants and keys.

use crate::adamw::{step_tensor, Roundings, Scratch, StepKeys, StepScalars, Weights};
use crate::config::{StatesSpec, VZero};
use crate::reset::reset_at;
use crate::rng::{stream_key, StateKind};
use crate::stalls::StallCounts;
use crate::state::QuantState;

/// AdamW hyper-parameters that do not change during a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// First-moment decay b1 (paper: 0.9).
    pub beta1: f64,
    /// Second-moment decay b2 (paper: 0.999).
    pub beta2: f64,
    /// Denominator epsilon (paper: 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (Loshchilov & Hutter 2019), applied to tensors with
    /// `ParamInfo::weight_decay`.
    pub weight_decay: f64,
}

/// What the optimizer needs to know about one parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Parameter name (e.g. `model.layers.0.mlp.up_proj.weight`).
    pub name: String,
    /// Tensor group for stall aggregation (`embed`, `attn`, `mlp`, `norm`, `head`).
    pub group: String,
    /// Number of elements.
    pub len: usize,
    /// Whether decoupled weight decay applies (matrices yes, norm gains no).
    pub weight_decay: bool,
}

/// Optimizer state of one tensor.
#[derive(Debug, Clone)]
pub struct TensorState {
    pub info: ParamInfo,
    /// First moment.
    pub m: QuantState,
    /// Second moment.
    pub v: QuantState,
}

/// AdamW with low-precision moment states (CPU reference implementation).
pub struct LowbitAdamW {
    pub hyper: Hyper,
    pub spec: StatesSpec,
    /// Seed of the stochastic-rounding streams.
    pub seed: u64,
    /// One entry per parameter, in the order given to [`LowbitAdamW::new`] (the tensor id).
    pub tensors: Vec<TensorState>,
    scratch: Scratch,
}

impl LowbitAdamW {
    /// Zero-initialised states for `params`. The index in `params` is the tensor id of the
    /// RNG stream, so pass parameters in a stable order (e.g. sorted by name).
    pub fn new(hyper: Hyper, spec: StatesSpec, seed: u64, params: Vec<ParamInfo>) -> Self {
        let tensors = params
            .into_iter()
            .map(|info| TensorState {
                m: QuantState::zeros(spec.m_format, info.len, spec.block_size, true),
                v: QuantState::zeros(spec.v_format, info.len, spec.block_size, false)
                    .with_zero_free(spec.v_zero == VZero::Exclude),
                info,
            })
            .collect();
        LowbitAdamW { hyper, spec, seed, tensors, scratch: Scratch::default() }
    }

    /// FP32 constants of step `step` (1-based) at learning rate `lr` for a tensor with or
    /// without weight decay; the raw gradient is multiplied by `grad_scale` first.
    pub fn scalars(&self, step: u64, lr: f64, grad_scale: f32, decay: bool) -> StepScalars {
        let h = &self.hyper;
        let (reset_m, tm) = reset_at(step, self.spec.m_reset_every, self.spec.bias_correction);
        let (reset_v, tv) = reset_at(step, self.spec.v_reset_every, self.spec.bias_correction);
        let wd = if decay { h.weight_decay } else { 0.0 };
        StepScalars {
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
        }
    }

    /// RNG stream keys of tensor `idx` at `step`.
    pub fn keys(&self, step: u64, idx: usize) -> StepKeys {
        let k = |kind| stream_key(self.seed, step, idx as u64, kind);
        StepKeys { m: k(StateKind::M), v: k(StateKind::V), w: k(StateKind::W) }
    }

    /// Write-back roundings.
    pub fn roundings(&self) -> Roundings {
        Roundings { m: self.spec.m_rounding, v: self.spec.v_rounding, w: self.spec.weight_rounding }
    }

    /// One CPU step on tensor `idx`: `w` updated in place from the FP32 gradient `g`
    /// (multiplied by `grad_scale` inside the step).
    pub fn step_cpu(
        &mut self,
        step: u64,
        lr: f64,
        grad_scale: f32,
        idx: usize,
        w: Weights,
        g: &[f32],
    ) -> StallCounts {
        let h = self.scalars(step, lr, grad_scale, self.tensors[idx].info.weight_decay);
        let keys = self.keys(step, idx);
        let r = self.roundings();
        let t = &mut self.tensors[idx];
        step_tensor(w, g, &mut t.m, &mut t.v, &h, &r, &keys, &mut self.scratch)
    }

    /// Bytes of all optimizer states (codes + scales).
    pub fn state_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.m.bytes() + t.v.bytes()).sum()
    }

    /// Number of parameters covered.
    pub fn num_params(&self) -> usize {
        self.tensors.iter().map(|t| t.info.len).sum()
    }
}

impl LowbitAdamW {
    /// A copy of the optimizer (settings and states), e.g. to upload to a device.
    pub fn clone_states(&self) -> LowbitAdamW {
        LowbitAdamW {
            hyper: self.hyper,
            spec: self.spec,
            seed: self.seed,
            tensors: self.tensors.clone(),
            scratch: Scratch::default(),
        }
    }
}
