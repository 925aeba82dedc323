//! The moment states of a whole model ([`Moments`]): the settings they are stepped with, one
//! [`QuantState`] pair (m, v) per parameter tensor (or per shard of one, ZeRO-1) and the
//! adaptive reset rule's state. Every update rule keeps them (AdamW's m and v; SOAP's, in its
//! eigenbasis, beside its preconditioners [`crate::states::precond`]); an update's plan is
//! [`crate::rules::step_plan`]'s.

use crate::error::OptimError;
use crate::states::config::{ResetRule, StatesSpec, VZero};
use crate::states::plan::StatesPlan;
use crate::states::quant::QuantState;
use crate::states::reset::AdaptiveReset;
use crate::states::stalls::StallCounts;

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

/// Optimizer state of one tensor, or of a contiguous shard of it (ZeRO-1, [`Moments::shard`]).
#[derive(Debug, Clone)]
pub struct TensorState {
    /// The whole tensor's metadata (`info.len` is the whole tensor's length, also in a shard).
    pub info: ParamInfo,
    /// Index in the whole tensor of the first element held (0 unsharded); the states hold
    /// elements `first .. first + m.len`.
    pub first: usize,
    /// This tensor's state settings ([`StatesPlan::for_tensor`]): formats, scales, roundings,
    /// periods. The reset rule, `reset_s0` and the weights' rounding are [`Moments::spec`]'s.
    pub spec: StatesSpec,
    /// First moment.
    pub m: QuantState,
    /// Second moment (empty for a [`Momentum`] tensor: Muon keeps m only).
    pub v: QuantState,
    /// `Some` for a matrix that Muon steps ([`crate::rules::muon`]): m is its momentum buffer,
    /// v is empty; `None`: AdamW's m and v.
    pub momentum: Option<Momentum>,
}

/// Muon's state of one matrix (`optim.kind = "muon"`, [`crate::rules::muon`]): m alone, the
/// momentum buffer m = b m + (1 - b) g (Jordan et al. 2024, "Muon", the `lerp` form of the
/// reference code: an EMA like AdamW's m, with no bias correction), stored in m's format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Momentum {
    /// Momentum b (`optim.muon.momentum`; the reference's 0.95).
    pub beta: f64,
    /// Nesterov: the update orthogonalised is (1 - b) g + b m, else m.
    pub nesterov: bool,
    /// The matrix's rows and columns (row-major, as the parameter is stored).
    pub rows: usize,
    pub cols: usize,
}

/// The moment states of every tensor with their settings: what each update rule steps
/// ([`crate::rules`]), whole or as a ZeRO-1 shard ([`Self::shard`]).
#[derive(Debug, Clone)]
pub struct Moments {
    pub hyper: Hyper,
    /// `[optim.states]` itself: the states of every tensor without settings of its own
    /// ([`TensorState::spec`]), and the whole model's reset rule.
    pub spec: StatesSpec,
    /// Seed of the stochastic-rounding streams.
    pub seed: u64,
    /// One entry per parameter, in the order given to [`Moments::new`] (the tensor id).
    pub tensors: Vec<TensorState>,
    /// Updates before simulated stalling starts (`optim.states.m_skip_prob` / `v_skip_prob`
    /// skip from update `skip_after + 1` on): the trainer's warmup steps; 0 from [`Self::new`].
    pub skip_after: u64,
    /// The adaptive reset rule's state (`optim.states.reset = "adaptive"`), else `None`.
    pub adaptive: Option<AdaptiveReset>,
}

impl Moments {
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
                    momentum: None,
                }
            })
            .collect();
        let spec = plan.base;
        let adaptive = (spec.reset == ResetRule::Adaptive).then(AdaptiveReset::default);
        Moments { hyper, spec, seed, tensors, skip_after: 0, adaptive }
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

    /// Record update `step`'s stall counts over all tensors (the adaptive rule reads v's
    /// unchanged fraction, the paper's estimator); a no-op for periodic resets.
    pub fn observe(&mut self, step: u64, total: &StallCounts) {
        if let Some(a) = &mut self.adaptive {
            a.observe(step, total.v.unchanged_fraction().unwrap_or(0.0));
        }
    }

    /// Bytes of the moment states (codes + scales).
    pub fn state_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.m.bytes() + t.v.bytes()).sum()
    }

    /// The update before which the adaptive reset rule last reset m and v; `None` without the
    /// rule or before its first reset.
    pub fn last_adaptive_reset(&self) -> Option<u64> {
        self.adaptive.as_ref().and_then(|a| a.last_reset())
    }

    /// Number of parameters covered.
    pub fn num_params(&self) -> usize {
        self.tensors.iter().map(|t| t.info.len).sum()
    }
}

impl Moments {
    /// The states of element range `ranges[i]` of tensor `i` (ZeRO-1: the shard a rank
    /// owns), with the same settings and tensor ids, so that [`crate::rules::adamw::LowbitAdamW::step_cpu`] on the shard
    /// rounds exactly as the whole tensor's step does on those elements.
    ///
    /// # Errors
    /// A range count that differs from the tensor count, or a range that is out of bounds or
    /// cut inside a scale block ([`QuantState::slice`]).
    pub fn shard(&self, ranges: &[std::ops::Range<usize>]) -> Result<Moments, OptimError> {
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
                Ok(TensorState { info: t.info.clone(), first: r.start, spec: t.spec, m: cut(&t.m)?, v: cut(&t.v)?, momentum: t.momentum })
            })
            .collect::<Result<_, OptimError>>()?;
        Ok(Moments { tensors, ..self.clone() })
    }

    /// The whole optimizer from the shards of every rank, in rank order (the inverse of
    /// [`Self::shard`]: shard `r` of each tensor must start where shard `r - 1` ends).
    ///
    /// # Errors
    /// No shards, shards of different tensor lists, or shards that do not tile each tensor.
    pub fn unshard(shards: &[Moments]) -> Result<Moments, OptimError> {
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
                momentum: t.momentum,
            });
        }
        Ok(Moments { tensors, ..head.clone() })
    }
}
