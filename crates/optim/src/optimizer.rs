//! The optimizer over a whole model: one [`QuantState`] pair per parameter tensor, the
//! host-side per-step constants (learning rate, bias corrections, resets, RNG keys) and the
//! CPU reference step; the [`Optimizer`] trait over candle parameters, with its two adapters,
//! one per device: [`LowbitAdamW`] itself on the CPU and `cuda::CudaAdamW` (`cuda` feature),
//! which uses the same constants and keys; [`crate::for_device`] picks one.

use crate::adamw::{step_tensor, Roundings, Scratch, StepKeys, StepScalars, Weights};
use crate::clip::GradScale;
use crate::config::{ResetRule, StatesSpec, VResetIdle, VZero};
use crate::error::OptimError;
use crate::plan::StatesPlan;
use crate::reset::{reset_at, AdaptiveReset};
use crate::rng::{stream_key, StateKind};
use crate::stalls::StallCounts;
use crate::state::QuantState;
use candle_core::{DType, Tensor, Var};
use half::bf16;

/// AdamW hyper-parameters that do not change during a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// First-moment decay b1 (paper: 0.9).
    pub beta1: f64,
    /// Second-moment decay b2 (paper: 0.999).
    pub beta2: f64,
    /// Denominator epsilon (paper: 1e-6, arXiv:2603.16731v1 A.9).
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

/// Optimizer state of one tensor, or of a contiguous shard of it (ZeRO-1, [`LowbitAdamW::shard`]).
#[derive(Debug, Clone)]
pub struct TensorState {
    /// The whole tensor's metadata (`info.len` is the whole tensor's length, also in a shard).
    pub info: ParamInfo,
    /// Index in the whole tensor of the first element held (0 unsharded); the states hold
    /// elements `first .. first + m.len`.
    pub first: usize,
    /// This tensor's state settings ([`StatesPlan::for_tensor`]): formats, scales, roundings,
    /// periods. The reset rule, `reset_s0` and the weights' rounding are [`LowbitAdamW::spec`]'s.
    pub spec: StatesSpec,
    /// First moment.
    pub m: QuantState,
    /// Second moment.
    pub v: QuantState,
}

/// AdamW with low-precision moment states: the CPU reference implementation, and the
/// [`Optimizer`] on the CPU.
pub struct LowbitAdamW {
    pub hyper: Hyper,
    /// `[optim.states]` itself: the states of every tensor without settings of its own
    /// ([`TensorState::spec`]), and the whole model's reset rule.
    pub spec: StatesSpec,
    /// Seed of the stochastic-rounding streams.
    pub seed: u64,
    /// One entry per parameter, in the order given to [`LowbitAdamW::new`] (the tensor id).
    pub tensors: Vec<TensorState>,
    /// The adaptive reset rule's state (`optim.states.reset = "adaptive"`), else `None`.
    pub adaptive: Option<AdaptiveReset>,
    scratch: Scratch,
    /// Stall counts of the last [`Optimizer::step`], until [`Optimizer::stall_counts`] reads them.
    last: Option<(u64, Vec<StallCounts>)>,
}

impl LowbitAdamW {
    /// Zero-initialised states for `params`, each tensor's as `plan` says (a [`StatesSpec`]:
    /// the same for all). The index in `params` is the tensor id of the RNG stream, so pass
    /// parameters in a stable order (e.g. sorted by name).
    pub fn new(hyper: Hyper, plan: impl Into<StatesPlan>, seed: u64, params: Vec<ParamInfo>) -> Self {
        let plan = plan.into();
        let tensors = params
            .into_iter()
            .map(|info| {
                let spec = plan.for_tensor(&info.group, info.len);
                TensorState {
                    first: 0,
                    m: QuantState::zeros(spec.m_format, info.len, spec.block_size, true).with_scale_kind(spec.m_scale),
                    v: QuantState::zeros(spec.v_format, info.len, spec.block_size, false)
                        .with_scale_kind(spec.v_scale)
                        .with_zero_free(spec.v_zero == VZero::Exclude),
                    spec,
                    info,
                }
            })
            .collect();
        let spec = plan.base;
        let adaptive = (spec.reset == ResetRule::Adaptive).then(AdaptiveReset::default);
        LowbitAdamW { hyper, spec, seed, tensors, adaptive, scratch: Scratch::default(), last: None }
    }

    /// Every state setting some tensor has, [`Self::spec`] first, each once, with the indices
    /// of its tensors (in tensor order).
    pub fn spec_groups(&self) -> Vec<(StatesSpec, Vec<usize>)> {
        let mut out: Vec<(StatesSpec, Vec<usize>)> = vec![(self.spec, vec![])];
        for (i, t) in self.tensors.iter().enumerate() {
            match out.iter_mut().find(|(s, _)| *s == t.spec) {
                Some((_, ids)) => ids.push(i),
                None => out.push((t.spec, vec![i])),
            }
        }
        if out[0].1.is_empty() && out.len() > 1 {
            out.remove(0);
        }
        out
    }

    /// Decide the resets of update `step` (1-based, updates in increasing order) before its
    /// [`Self::scalars`]: the adaptive rule consumes the measurements it may see
    /// ([`AdaptiveReset::reset_before`]); periodic resets need nothing (a no-op).
    ///
    /// # Errors
    /// The adaptive rule is missing a measurement ([`Self::observe`] was not called for it).
    pub fn begin_update(&mut self, step: u64) -> Result<(), OptimError> {
        let (beta2, s0) = (self.hyper.beta2, self.spec.reset_s0);
        if let Some(a) = &mut self.adaptive {
            a.reset_before(step, beta2, s0)?;
        }
        Ok(())
    }

    /// Record update `step`'s stall counts over all tensors (the adaptive rule reads v's
    /// unchanged fraction, the paper's estimator); a no-op for periodic resets.
    pub fn observe(&mut self, step: u64, total: &StallCounts) {
        if let Some(a) = &mut self.adaptive {
            a.observe(step, total.v.unchanged_fraction().unwrap_or(0.0));
        }
    }

    /// FP32 constants of step `step` (1-based) at learning rate `lr` for tensor `idx` (its
    /// periods, bias correction and weight decay); the raw gradient is multiplied by
    /// `grad_scale` first. With the adaptive rule, the resets are those
    /// [`Self::begin_update`] decided.
    pub fn scalars(&self, idx: usize, step: u64, lr: f64, grad_scale: f32) -> StepScalars {
        let h = &self.hyper;
        let (spec, decay) = (&self.tensors[idx].spec, self.tensors[idx].info.weight_decay);
        let bc = spec.bias_correction;
        let ((reset_m, tm), (reset_v, tv)) = match &self.adaptive {
            None => (reset_at(step, spec.m_reset_every, bc), reset_at(step, spec.v_reset_every, bc)),
            Some(a) => {
                let now = (step == a.cycle_start && step > 1, a.bias_t(step, bc));
                (now, now)
            }
        };
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
            keep_idle_v: reset_v && !reset_m && spec.v_reset_idle == VResetIdle::Keep,
        }
    }

    /// RNG stream keys of tensor `idx` at `step`.
    pub fn keys(&self, step: u64, idx: usize) -> StepKeys {
        let k = |kind| stream_key(self.seed, step, idx as u64, kind);
        StepKeys { m: k(StateKind::M), v: k(StateKind::V), w: k(StateKind::W) }
    }

    /// Write-back roundings of tensor `idx` (the weights' is the whole model's).
    pub fn roundings(&self, idx: usize) -> Roundings {
        let spec = &self.tensors[idx].spec;
        Roundings { m: spec.m_rounding, v: spec.v_rounding, w: self.spec.weight_rounding }
    }

    /// One CPU step on tensor `idx`: `w` updated in place from the FP32 gradient `g`
    /// (multiplied by `grad_scale` inside the step). In a sharded optimizer `w` and `g` are
    /// the held shard's elements (`first .. first + len` of the tensor). Call
    /// [`Self::begin_update`] once per update first.
    pub fn step_cpu(&mut self, step: u64, lr: f64, grad_scale: f32, idx: usize, w: Weights, g: &[f32]) -> StallCounts {
        let h = self.scalars(idx, step, lr, grad_scale);
        let keys = self.keys(step, idx);
        let r = self.roundings(idx);
        let t = &mut self.tensors[idx];
        step_tensor(w, g, &mut t.m, &mut t.v, &h, &r, &keys, t.first, &mut self.scratch)
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
    /// The states of element range `ranges[i]` of tensor `i` (ZeRO-1: the shard a rank
    /// owns), with the same settings and tensor ids, so that [`Self::step_cpu`] on the shard
    /// rounds exactly as the whole tensor's step does on those elements.
    ///
    /// # Errors
    /// A range count that differs from the tensor count, or a range that is out of bounds or
    /// cut inside a scale block ([`QuantState::slice`]).
    pub fn shard(&self, ranges: &[std::ops::Range<usize>]) -> Result<LowbitAdamW, OptimError> {
        if ranges.len() != self.tensors.len() {
            return Err(OptimError::State(format!("{} shard ranges for {} tensors", ranges.len(), self.tensors.len())));
        }
        let tensors = self
            .tensors
            .iter()
            .zip(ranges)
            .map(|(t, r)| {
                let (a, b) = (r.start - t.first, r.end - t.first);
                let cut = |s: &QuantState| s.slice(a..b).map_err(|e| OptimError::State(format!("{}: {e}", t.info.name)));
                Ok(TensorState { info: t.info.clone(), first: r.start, spec: t.spec, m: cut(&t.m)?, v: cut(&t.v)? })
            })
            .collect::<Result<_, OptimError>>()?;
        Ok(LowbitAdamW { tensors, ..self.clone_states() })
    }

    /// The whole optimizer from the shards of every rank, in rank order (the inverse of
    /// [`Self::shard`]: shard `r` of each tensor must start where shard `r - 1` ends).
    ///
    /// # Errors
    /// No shards, shards of different tensor lists, or shards that do not tile each tensor.
    pub fn unshard(shards: &[LowbitAdamW]) -> Result<LowbitAdamW, OptimError> {
        let head = shards.first().ok_or_else(|| OptimError::State("no shards".into()))?;
        let mut tensors = Vec::with_capacity(head.tensors.len());
        for (i, t) in head.tensors.iter().enumerate() {
            let parts: Vec<&TensorState> = shards
                .iter()
                .map(|s| s.tensors.get(i))
                .collect::<Option<_>>()
                .ok_or_else(|| OptimError::State("shards hold different tensor lists".into()))?;
            let (ms, vs): (Vec<_>, Vec<_>) = parts.iter().map(|p| (&p.m, &p.v)).unzip();
            let mut at = 0;
            for p in &parts {
                if p.info != t.info || p.spec != t.spec || p.first != at {
                    return Err(OptimError::State(format!("{}: shard at element {} does not continue at {at}", t.info.name, p.first)));
                }
                at += p.m.len;
            }
            if at != t.info.len {
                return Err(OptimError::State(format!("{}: shards hold {at} of {} elements", t.info.name, t.info.len)));
            }
            tensors.push(TensorState {
                info: t.info.clone(),
                first: 0,
                spec: t.spec,
                m: QuantState::concat(&ms)?,
                v: QuantState::concat(&vs)?,
            });
        }
        Ok(LowbitAdamW { tensors, ..head.clone_states() })
    }

    /// A copy of the optimizer (settings and states), e.g. to upload to a device.
    pub fn clone_states(&self) -> LowbitAdamW {
        LowbitAdamW {
            hyper: self.hyper,
            spec: self.spec,
            seed: self.seed,
            tensors: self.tensors.clone(),
            adaptive: self.adaptive.clone(),
            scratch: Scratch::default(),
            last: None,
        }
    }
}

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

    /// Stall counts of each tensor at a completed `step` (reading them may wait for the
    /// device; call it [`Optimizer::count_lag`] steps later to keep the device busy).
    ///
    /// # Errors
    /// Counts no longer kept, or the copy from the device failing.
    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError>;

    /// How many steps late the trainer reads stall counts (0 on the CPU; at most
    /// [`crate::reset::ADAPTIVE_LAG`]).
    fn count_lag(&self) -> usize {
        0
    }

    /// The counts of update `step` summed over all tensors, for the adaptive reset rule
    /// ([`LowbitAdamW::observe`]); every update's, in order, once the trainer has read them.
    fn observe(&mut self, step: u64, total: &StallCounts);

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
    fn step(&mut self, step: u64, lr: f64, scale: GradScale, params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        check_sizes(&self.tensors, params, grads)?;
        if let GradScale::Device(gate) = scale {
            crate::clip::check_gate(gate)?;
        }
        self.begin_update(step)?;
        let grad_scale = match scale {
            GradScale::Host(f) => f,
            GradScale::Device(gate) => match gate.flatten_all()?.to_vec1::<f32>()?[..] {
                [_, skip] if skip != 0.0 => return Ok(()),
                [factor, _] => factor,
                _ => unreachable!("check_gate: two elements"),
            },
        };
        let mut out = Vec::with_capacity(params.len());
        for (i, (var, grad)) in params.iter().zip(grads).enumerate() {
            let (first, len) = (self.tensors[i].first, self.tensors[i].m.len);
            let t = var.as_tensor();
            let r = first..first + len;
            let g = grad.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let counts = match t.dtype() {
                DType::F32 => {
                    let mut p = t.flatten_all()?.to_vec1::<f32>()?;
                    let c = self.step_cpu(step, lr, grad_scale, i, Weights::F32(&mut p[r.clone()]), &g[r]);
                    var.set(&Tensor::from_vec(p, t.shape(), t.device())?)?;
                    c
                }
                DType::BF16 => {
                    let mut p: Vec<u16> = t.flatten_all()?.to_vec1::<bf16>()?.into_iter().map(|x| x.to_bits()).collect();
                    let c = self.step_cpu(step, lr, grad_scale, i, Weights::Bf16(&mut p[r.clone()]), &g[r]);
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

    fn stall_counts(&mut self, step: u64) -> Result<Vec<StallCounts>, OptimError> {
        match self.last.take() {
            Some((s, c)) if s == step => Ok(c),
            _ => Err(OptimError::State(format!("stall counts of step {step} were not kept (the CPU optimizer keeps only the last step)"))),
        }
    }

    fn observe(&mut self, step: u64, total: &StallCounts) {
        LowbitAdamW::observe(self, step, total);
    }

    fn states(&mut self) -> Result<&LowbitAdamW, OptimError> {
        Ok(self)
    }
}
