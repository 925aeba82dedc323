//! The `[optim.states]` config section: how each state is stored, scaled, rounded and reset.

use crate::error::OptimError;
use crate::states::format::scale::ScaleKind;
use crate::states::format::{Rounding, StateFormat};
use crate::states::reset::{reset_at, BiasCorrection};
use crate::states::theory;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether a block-scaled second moment may decode to 0 in a non-zero block (docs/numerics.md,
/// "Second moment without zero"; the zero-point problem of Li et al., "Memory Efficient
/// Optimizers with 4-bit States", NeurIPS 2023).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VZero {
    /// In a block with a non-zero amax, v's smallest stored value is the grid's smallest
    /// positive one: values below it encode to it (default). An all-zero block stays 0.
    Exclude,
    /// v rounds to 0 like any value (reproduces the fault: an element with v = 0, m != 0 moves
    /// by lr * m / eps).
    Keep,
}

impl VZero {
    /// Config name (`exclude` / `keep`).
    pub fn as_str(self) -> &'static str {
        match self {
            VZero::Exclude => "exclude",
            VZero::Keep => "keep",
        }
    }
}

/// What a reset of v without one of m does to an element whose gradient is 0 at that update
/// (`optim.states.v_reset_idle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VResetIdle {
    /// Resets it like every element (the paper's Alg. 1): with v = 0 and m kept, it moves by
    /// lr * m / eps at that update.
    #[default]
    Reset,
    /// Keeps its stored v (the guard): only elements with a gradient restart v.
    Keep,
}

impl VResetIdle {
    fn is_reset(&self) -> bool {
        *self == VResetIdle::Reset
    }
}

/// `optim.states.scale`: a scale kind, or each format's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleChoice {
    /// The format's default ([`StateFormat::default_scale`]).
    #[default]
    Default,
    /// [`ScaleKind::Amax`] (the paper's).
    Amax,
    /// [`ScaleKind::Pow2`].
    Pow2,
}

impl ScaleChoice {
    fn is_default(&self) -> bool {
        *self == ScaleChoice::Default
    }

    /// The kind for a state of format `f`.
    pub fn kind_for(self, f: StateFormat) -> ScaleKind {
        match self {
            ScaleChoice::Default => f.default_scale(),
            ScaleChoice::Amax => ScaleKind::Amax,
            ScaleChoice::Pow2 => ScaleKind::Pow2,
        }
    }
}

impl From<ScaleKind> for ScaleChoice {
    fn from(k: ScaleKind) -> Self {
        match k {
            ScaleKind::Amax => ScaleChoice::Amax,
            ScaleKind::Pow2 => ScaleChoice::Pow2,
        }
    }
}

/// A reset period in a config: a number of optimizer updates (0 = never) or `"auto"`, the
/// paper's K* for the v format (Prop. 5.2, [`theory::reset_period`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetEvery {
    /// Reset after every this many updates (0 = never).
    Steps(u64),
    /// K* from the v format's fraction bits, b2 and `reset_s0`.
    Auto,
}

impl From<u64> for ResetEvery {
    fn from(k: u64) -> Self {
        ResetEvery::Steps(k)
    }
}

impl Serialize for ResetEvery {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ResetEvery::Steps(k) => s.serialize_u64(*k),
            ResetEvery::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for ResetEvery {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ResetEvery;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of steps (0 = never) or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, k: u64) -> Result<ResetEvery, E> {
                Ok(ResetEvery::Steps(k))
            }
            fn visit_i64<E: serde::de::Error>(self, k: i64) -> Result<ResetEvery, E> {
                u64::try_from(k).map(ResetEvery::Steps).map_err(|_| E::custom(format!("a reset period cannot be negative, got {k}")))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ResetEvery, E> {
                match s {
                    "auto" => Ok(ResetEvery::Auto),
                    _ => Err(E::custom(format!("expected a number of steps or \"auto\", got \"{s}\""))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Who decides when the states reset (`optim.states.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetRule {
    /// Every `m_reset_every` / `v_reset_every` updates (the paper's Alg. 1).
    Periodic,
    /// m and v together, when the measured stalled fraction of v says so (the paper's
    /// Alg. 2, [`crate::states::reset::AdaptiveReset`]).
    Adaptive,
}

impl ResetRule {
    /// Config name (`periodic` / `adaptive`).
    pub fn as_str(self) -> &'static str {
        match self {
            ResetRule::Periodic => "periodic",
            ResetRule::Adaptive => "adaptive",
        }
    }
}

fn is_periodic(r: &ResetRule) -> bool {
    *r == ResetRule::Periodic
}

fn is_default_s0(s0: &f64) -> bool {
    *s0 == theory::DEFAULT_RESET_S0
}

/// `[optim.states]`: storage format, rounding and reset period of m and v, and the rounding
/// of BF16 weights. Every cell of the paper's tables is a combination of these knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatesConfig {
    /// First-moment format: fp32, bf16, fp8 (= fp8e4m3), fp8e5m2, fp4 (= fp4e2m1), int8, or
    /// a precision-only e8m1 .. e8m7 (e8m7 = bf16).
    pub m_format: String,
    /// Second-moment format: as m, plus fp4ue2m2; `fp4` means the unsigned fp4ue2m2 here.
    pub v_format: String,
    /// Block-scaled v (fp8, fp8e5m2, fp4, int8): `exclude` (default) keeps v off 0 in a
    /// non-zero block, `keep` lets it round to 0. Ignored by unscaled formats.
    pub v_zero: VZero,
    /// Scale kind of fp8/fp4 states: `amax`, `pow2` ([`crate::states::format::scale`]) or `default`
    /// (each format's, [`StateFormat::default_scale`]: FP4 `amax`, FP8 `pow2`, chosen by
    /// measurement). int8 keeps its absmax scale; formats without scales ignore it.
    #[serde(skip_serializing_if = "ScaleChoice::is_default")]
    pub scale: ScaleChoice,
    /// Write-back rounding of m: `nearest` or `stochastic`.
    pub m_rounding: Rounding,
    /// Write-back rounding of v.
    pub v_rounding: Rounding,
    /// Elements per scale block for fp8/fp4/int8 (0 = one scale per tensor). A multiple of 4.
    pub block_size: usize,
    /// Zero m every this many updates (0 = never), or `"auto"`: v's period K*. Paper: 1000
    /// (bf16), 300 (fp8), 200 (fp4).
    pub m_reset_every: ResetEvery,
    /// Zero v every this many updates (0 = never), or `"auto"`: K* of the paper's Prop. 5.2 for
    /// the v format, b2 and `reset_s0` (bf16 1116, fp8 320, fp4 224 at b2 = 0.999). A v reset
    /// without an m reset (the paper's best FP8 policy, Table 6) moves every element whose
    /// gradient is 0 at the next update by lr * m / eps; the trainer logs how many there were.
    pub v_reset_every: ResetEvery,
    /// At a reset of v without m: `reset` (default, the paper's) every element, or `keep` the
    /// stored v of the elements whose gradient is 0 at that update (they would move by
    /// lr * m / eps). Reset of m and v together: every element, either way.
    #[serde(skip_serializing_if = "VResetIdle::is_reset")]
    pub v_reset_idle: VResetIdle,
    /// `periodic` (default: the periods above) or `adaptive` (the paper's Alg. 2: m and v reset
    /// together when the measured v stalled fraction says so; the periods must be 0).
    #[serde(skip_serializing_if = "is_periodic")]
    pub reset: ResetRule,
    /// Threshold s0 of `"auto"` periods and of the adaptive rule, in (0, 1) (paper: 0.6).
    #[serde(skip_serializing_if = "is_default_s0")]
    pub reset_s0: f64,
    /// Bias-correction counter after a reset: `restart` (default) or `continue`.
    pub bias_correction: BiasCorrection,
    /// Rounding of BF16 weights after the update (`model.dtype = "bf16"`).
    pub weight_rounding: Rounding,
    /// `[optim.states.groups.<group>]`: other settings for the states of one tensor group
    /// (`embed`, `attn`, `mlp`, `norm`, `head`), e.g. `m_format = "fp32"` and `v_format =
    /// "fp32"` for the embedding, as torchao's and bitsandbytes' users keep chosen parameters
    /// in 32-bit states. Unset keys take the values above. Resolved by
    /// [`crate::states::plan::StatesPlan`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, GroupStates>,
    /// Tensors with fewer elements than this keep FP32 m and v, whatever their group's
    /// formats (bitsandbytes' `min_8bit_size`, 4096 there; 0 = none, the default and the
    /// paper's setting). Resets and roundings stay as configured.
    #[serde(skip_serializing_if = "is_zero")]
    pub min_quantized_numel: usize,
    /// Simulated stalling (the paper's section 3.3): after the warmup, each element's write-back
    /// of m is skipped with this probability, independently per element and update (the stored
    /// m keeps its old value, as a stalled element's does; the update itself uses the new m).
    /// In [0, 1); 0 = off (the default). Any format; the draws come from the counter RNG
    /// ([`crate::states::rng`], stream `skip`), so CPU and GPU skip the same elements and a resumed run
    /// skips as an uninterrupted one.
    #[serde(skip_serializing_if = "is_zero_prob")]
    pub m_skip_prob: f64,
    /// As `m_skip_prob`, for v.
    #[serde(skip_serializing_if = "is_zero_prob")]
    pub v_skip_prob: f64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero_prob(p: &f64) -> bool {
    *p == 0.0
}

/// The 32-bit threshold of a skip probability `p` in [0, 1): an element skips when its 32
/// random bits are below it, so the probability is `floor(p * 2^32) / 2^32` (within 2^-32 of p).
pub fn skip_threshold(p: f64) -> u32 {
    (p * 4_294_967_296.0).floor() as u32
}

/// `[optim.states.groups.<group>]`: the keys of `[optim.states]` a tensor group may set for
/// its own states; each unset one takes `[optim.states]`'s value. The reset rule
/// (`reset`, `reset_s0`) and the weights' rounding are the whole model's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupStates {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub m_format: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v_format: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v_zero: Option<VZero>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub m_rounding: Option<Rounding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v_rounding: Option<Rounding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub m_reset_every: Option<ResetEvery>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v_reset_every: Option<ResetEvery>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v_reset_idle: Option<VResetIdle>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias_correction: Option<BiasCorrection>,
}

impl GroupStates {
    /// Whether this group sets `key` (a key of `[optim.states]`, e.g. `"block_size"`); `false`
    /// for a key a group cannot set.
    pub fn sets(&self, key: &str) -> bool {
        match key {
            "m_format" => self.m_format.is_some(),
            "v_format" => self.v_format.is_some(),
            "v_zero" => self.v_zero.is_some(),
            "scale" => self.scale.is_some(),
            "m_rounding" => self.m_rounding.is_some(),
            "v_rounding" => self.v_rounding.is_some(),
            "block_size" => self.block_size.is_some(),
            "m_reset_every" => self.m_reset_every.is_some(),
            "v_reset_every" => self.v_reset_every.is_some(),
            "v_reset_idle" => self.v_reset_idle.is_some(),
            "bias_correction" => self.bias_correction.is_some(),
            _ => false,
        }
    }

    /// `base` with this group's keys set over it (and no groups of its own).
    pub fn over(&self, base: &StatesConfig) -> StatesConfig {
        let b = base.clone();
        StatesConfig {
            m_format: self.m_format.clone().unwrap_or(b.m_format),
            v_format: self.v_format.clone().unwrap_or(b.v_format),
            v_zero: self.v_zero.unwrap_or(b.v_zero),
            scale: self.scale.unwrap_or(b.scale),
            m_rounding: self.m_rounding.unwrap_or(b.m_rounding),
            v_rounding: self.v_rounding.unwrap_or(b.v_rounding),
            block_size: self.block_size.unwrap_or(b.block_size),
            m_reset_every: self.m_reset_every.unwrap_or(b.m_reset_every),
            v_reset_every: self.v_reset_every.unwrap_or(b.v_reset_every),
            v_reset_idle: self.v_reset_idle.unwrap_or(b.v_reset_idle),
            bias_correction: self.bias_correction.unwrap_or(b.bias_correction),
            groups: BTreeMap::new(),
            min_quantized_numel: 0,
            ..b
        }
    }
}

impl Default for StatesConfig {
    fn default() -> Self {
        StatesConfig {
            m_format: "fp32".into(),
            v_format: "fp32".into(),
            v_zero: VZero::Exclude,
            scale: ScaleChoice::Default,
            m_rounding: Rounding::Nearest,
            v_rounding: Rounding::Nearest,
            block_size: 128,
            m_reset_every: ResetEvery::Steps(0),
            v_reset_every: ResetEvery::Steps(0),
            v_reset_idle: VResetIdle::Reset,
            reset: ResetRule::Periodic,
            reset_s0: theory::DEFAULT_RESET_S0,
            bias_correction: BiasCorrection::Restart,
            weight_rounding: Rounding::Nearest,
            groups: BTreeMap::new(),
            min_quantized_numel: 0,
            m_skip_prob: 0.0,
            v_skip_prob: 0.0,
        }
    }
}

/// The largest `optim.states.block_size`: the CUDA kernel takes it as a 32-bit number.
pub const MAX_BLOCK_SIZE: usize = u32::MAX as usize;

/// `[optim.states]` after validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatesSpec {
    pub m_format: StateFormat,
    pub v_format: StateFormat,
    pub v_zero: VZero,
    /// Scale kinds of m and v (meaningful for fp8/fp4 states only).
    pub m_scale: ScaleKind,
    pub v_scale: ScaleKind,
    pub m_rounding: Rounding,
    pub v_rounding: Rounding,
    pub block_size: usize,
    /// Periods in optimizer updates (0 = never), `"auto"` resolved; 0 under `adaptive`.
    pub m_reset_every: u64,
    pub v_reset_every: u64,
    pub v_reset_idle: VResetIdle,
    pub reset: ResetRule,
    pub reset_s0: f64,
    pub bias_correction: BiasCorrection,
    pub weight_rounding: Rounding,
    /// Simulated stalling: the probabilities of skipping an element's write-back of m and v
    /// (0 = off), applied after the trainer's warmup ([`crate::states::moments::Moments::skip_after`]) with
    /// the thresholds of [`skip_threshold`].
    pub m_skip_prob: f64,
    pub v_skip_prob: f64,
}

impl StatesConfig {
    /// Validate and resolve format names, scale kinds and `"auto"` reset periods (which need
    /// the AdamW `beta2`) of the `[optim.states]` settings themselves: the states of every
    /// tensor outside [`Self::groups`] and above [`Self::min_quantized_numel`]
    /// ([`crate::states::plan::StatesPlan`] resolves those). Errors name the offending key.
    pub fn resolve(&self, beta2: f64) -> Result<StatesSpec, OptimError> {
        self.resolve_at(beta2, "optim.states")
    }

    /// The reset period `every` of the key `key` (named in errors): a number of updates as it
    /// is, `"auto"` the paper's K* for `v_format` at `beta2` (Prop. 5.2).
    fn reset_period(&self, every: ResetEvery, key: &str, v_format: StateFormat, beta2: f64) -> Result<u64, OptimError> {
        match every {
            ResetEvery::Steps(k) => Ok(k),
            ResetEvery::Auto if v_format == StateFormat::Fp32 => Err(OptimError::Config(format!(
                "{key} = \"auto\" is the paper's K* for a low-precision v (Prop. 5.2: the period \
                 after which v's stalled updates outweigh what it averaged); with v_format = \"fp32\" v hardly \
                 ever stalls (theory {:.1e} at b2 = {beta2}), so K* would reset it for no reason: give a number \
                 of updates, or 0",
                theory::p_stall(23, beta2, Rounding::Nearest)
            ))),
            ResetEvery::Auto => {
                let bits = v_format.fraction_bits().ok_or_else(|| {
                    OptimError::Config(format!(
                        "{key} = \"auto\": the reset period K* needs a floating-point v format, not {}",
                        v_format.name()
                    ))
                })?;
                theory::reset_period(bits, beta2, self.reset_s0).ok_or_else(|| {
                    OptimError::Config(format!(
                        "{key} = \"auto\": v in {} at b2 = {beta2} has no finite reset period K* \
                         up to {} updates (Prop. 5.2); give a number of steps or 0",
                        v_format.name(),
                        theory::MAX_RESET_PERIOD
                    ))
                })
            }
        }
    }

    /// [`Self::resolve`] with errors naming the keys under `at` (e.g.
    /// `optim.states.groups.embed` for a group's merged settings).
    pub(crate) fn resolve_at(&self, beta2: f64, at: &str) -> Result<StatesSpec, OptimError> {
        let m_format = StateFormat::parse(&self.m_format, false).map_err(|e| OptimError::Config(format!("{at}.m_format: {e}")))?;
        let v_format = StateFormat::parse(&self.v_format, true).map_err(|e| OptimError::Config(format!("{at}.v_format: {e}")))?;
        if !self.block_size.is_multiple_of(4) {
            return Err(OptimError::Config(format!(
                "{at}.block_size: must be a multiple of 4 (fp4 packs two codes per byte; the \
                 CUDA kernel moves 4 elements at a time), or 0 for one scale per tensor; got {}",
                self.block_size
            )));
        }
        if self.block_size > MAX_BLOCK_SIZE {
            return Err(OptimError::Config(format!(
                "{at}.block_size: at most {MAX_BLOCK_SIZE} elements (the CUDA kernel's block index is 32-bit; \
                 a block as large as a tensor is one scale per tensor: use 0), got {}",
                self.block_size
            )));
        }
        for (key, p) in [("m_skip_prob", self.m_skip_prob), ("v_skip_prob", self.v_skip_prob)] {
            if !(0.0..1.0).contains(&p) {
                return Err(OptimError::Config(format!(
                    "{at}.{key}: a probability in [0, 1) (the share of write-backs skipped after the warmup; 0 = off), got {p}"
                )));
            }
        }
        if self.weight_rounding == Rounding::Dither {
            return Err(OptimError::Config(format!(
                "{at}.weight_rounding: \"dither\" is for the moment states (a dithered weight would need its draw \
                 subtracted by every reader of the weights); use \"nearest\" or \"stochastic\""
            )));
        }
        for (key, r, p) in [("m", self.m_rounding, self.m_skip_prob), ("v", self.v_rounding, self.v_skip_prob)] {
            if r == Rounding::Dither && p > 0.0 {
                return Err(OptimError::Config(format!(
                    "{at}.{key}_rounding = \"dither\" with {at}.{key}_skip_prob = {p}: a skipped write-back keeps a code \
                     whose dither the next read no longer matches; simulated stalling needs \"nearest\" or \"stochastic\""
                )));
            }
        }
        if !(self.reset_s0 > 0.0 && self.reset_s0 < 1.0) {
            return Err(OptimError::Config(format!("{at}.reset_s0: must be in (0, 1) (paper: 0.6), got {}", self.reset_s0)));
        }
        let period = |every: ResetEvery, key: &str| self.reset_period(every, &format!("{at}.{key}"), v_format, beta2);
        let (m_reset_every, v_reset_every) = (period(self.m_reset_every, "m_reset_every")?, period(self.v_reset_every, "v_reset_every")?);
        if self.reset == ResetRule::Adaptive && (m_reset_every > 0 || v_reset_every > 0) {
            return Err(OptimError::Config(format!(
                "optim.states.reset = \"adaptive\" decides when m and v reset from the measured stalled fraction: \
                 {at}.m_reset_every and {at}.v_reset_every must be 0, got {m_reset_every} and {v_reset_every}"
            )));
        }
        Ok(StatesSpec {
            m_format,
            v_format,
            v_zero: self.v_zero,
            m_scale: self.scale.kind_for(m_format),
            v_scale: self.scale.kind_for(v_format),
            m_rounding: self.m_rounding,
            v_rounding: self.v_rounding,
            block_size: self.block_size,
            m_reset_every,
            v_reset_every,
            v_reset_idle: self.v_reset_idle,
            reset: self.reset,
            reset_s0: self.reset_s0,
            bias_correction: self.bias_correction,
            weight_rounding: self.weight_rounding,
            m_skip_prob: self.m_skip_prob,
            v_skip_prob: self.v_skip_prob,
        })
    }
}

impl StatesSpec {
    /// Whether v resets at updates where m does not (a v-only reset: zero-gradient elements
    /// then move by lr * m / eps at their next update).
    pub fn resets_v_without_m(&self) -> bool {
        self.v_reset_every > 0 && (self.m_reset_every == 0 || !self.v_reset_every.is_multiple_of(self.m_reset_every))
    }

    /// Whether m resets at updates where v does not (an m-only reset: with the bias-correction
    /// counter restarted, m's first update after it is a single gradient over v's long average).
    pub fn resets_m_without_v(&self) -> bool {
        self.m_reset_every > 0 && (self.v_reset_every == 0 || !self.m_reset_every.is_multiple_of(self.v_reset_every))
    }

    /// One line for a run's banner: formats with their scale kinds and blocks, roundings, the
    /// reset rule.
    pub fn describe(&self) -> String {
        let state = |f: StateFormat, kind: ScaleKind, r: Rounding| {
            format!("{} ({}{})", f.name(), r.as_str(), scale_words(f, kind, self.block_size))
        };
        let resets = match (self.reset, self.m_reset_every, self.v_reset_every) {
            (ResetRule::Adaptive, ..) => format!("adaptive (Alg. 2, s0 = {})", self.reset_s0),
            (_, 0, 0) => "none".into(),
            (_, m, v) if m == v => format!("m and v every {m} updates"),
            (_, m, v) => format!(
                "m every {m}, v every {v} updates (0 = never){}",
                if self.v_reset_idle == VResetIdle::Keep { ", v kept where the gradient is 0" } else { "" }
            ),
        };
        let skips = match (self.m_skip_prob, self.v_skip_prob) {
            (m, v) if m == 0.0 && v == 0.0 => String::new(),
            (m, v) => format!(" | simulated stalling after the warmup: m write-backs skipped with p = {m}, v with p = {v}"),
        };
        format!(
            "m {} | v {}{} | resets: {resets}{skips}",
            state(self.m_format, self.m_scale, self.m_rounding),
            state(self.v_format, self.v_scale, self.v_rounding),
            if self.v_format.is_scaled() && self.v_zero == VZero::Exclude { ", zero-free" } else { "" },
        )
    }

    /// Whether update `step` resets v but not m (periodic rules; the adaptive rule resets
    /// both).
    pub fn v_only_reset_at(&self, step: u64) -> bool {
        let bc = self.bias_correction;
        reset_at(step, self.v_reset_every, bc).0 && !reset_at(step, self.m_reset_every, bc).0
    }
}

/// The scales of a state in `f` with scale kind `kind` and `block` elements per scale (0: one
/// per tensor) as the banner words them, after a comma (`", amax scale per tensor"`,
/// `", pow2 scales per 128"`, `", absmax scales per 64"` for int8; empty for unscaled formats).
pub fn scale_words(f: StateFormat, kind: ScaleKind, block: usize) -> String {
    let per = if block == 0 { "tensor".to_string() } else { block.to_string() };
    match (f.minifloat(), block) {
        (Some(_), 0) => format!(", {} scale per tensor", kind.as_str()),
        (Some(_), b) => format!(", {} scales per {b}", kind.as_str()),
        (None, _) if f.is_scaled() => format!(", absmax scales per {per}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<StatesSpec, String> {
        let c: StatesConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.resolve(0.999).map_err(|e| e.to_string())
    }

    #[test]
    fn auto_periods_and_scale_defaults_resolve() {
        let s = resolve("m_format = \"fp8\"\nv_format = \"fp8\"\nm_reset_every = \"auto\"\nv_reset_every = \"auto\"").unwrap();
        assert_eq!((s.m_reset_every, s.v_reset_every), (320, 320));
        assert_eq!((s.m_scale, s.v_scale), (ScaleKind::Pow2, ScaleKind::Pow2));
        // FP4: v's E2M2 eps for both, m takes v's period
        let s =
            resolve("m_format = \"fp4\"\nv_format = \"fp4\"\nm_reset_every = \"auto\"\nv_reset_every = \"auto\"\nreset_s0 = 0.5").unwrap();
        assert_eq!((s.m_reset_every, s.v_reset_every), (206, 206));
        assert_eq!((s.m_scale, s.v_scale), (ScaleKind::Amax, ScaleKind::Amax));
        let s = resolve("m_format = \"fp4\"\nv_format = \"bf16\"\nscale = \"pow2\"\nv_reset_every = 300").unwrap();
        assert_eq!((s.m_scale, s.m_reset_every, s.v_reset_every), (ScaleKind::Pow2, 0, 300));
        assert!(s.resets_v_without_m(), "a v-only reset is allowed (the paper's asymmetric policy)");
        assert!(!s.resets_m_without_v());
        // m every 20, v every 40: m alone at 21, 61, ...; m every 40, v every 20: never
        let periods = |m: u64, v: u64| StatesSpec { m_reset_every: m, v_reset_every: v, ..s };
        assert!(periods(20, 40).resets_m_without_v() && periods(20, 0).resets_m_without_v());
        assert!(!periods(40, 20).resets_m_without_v() && !periods(20, 20).resets_m_without_v() && !periods(0, 20).resets_m_without_v());
        assert!(s.v_only_reset_at(301) && !s.v_only_reset_at(300));
        assert_eq!(
            s.describe(),
            "m fp4e2m1 (nearest, pow2 scales per 128) | v bf16 (nearest) | resets: m every 0, v every 300 updates (0 = never)"
        );
        let s =
            resolve("m_format = \"fp8\"\nv_format = \"fp8\"\nblock_size = 0\nscale = \"amax\"\nv_zero = \"keep\"\nreset = \"adaptive\"")
                .unwrap();
        assert_eq!(
            s.describe(),
            "m fp8e4m3 (nearest, amax scale per tensor) | v fp8e4m3 (nearest, amax scale per tensor) | resets: adaptive (Alg. 2, s0 = 0.6)"
        );
    }

    #[test]
    fn bad_reset_and_scale_settings_name_their_key() {
        let e = resolve("v_format = \"int8\"\nv_reset_every = \"auto\"").unwrap_err();
        assert!(e.contains("optim.states.v_reset_every = \"auto\"") && e.contains("int8"), "{e}");
        let e = toml::from_str::<StatesConfig>("scale = \"pow3\"").unwrap_err().to_string();
        assert!(e.contains("amax") && e.contains("pow2") && e.contains("default"), "{e}");
        let e = resolve("reset = \"adaptive\"\nv_reset_every = 300").unwrap_err();
        assert!(e.contains("must be 0"), "{e}");
        assert!(resolve("reset_s0 = 1.0").unwrap_err().contains("reset_s0"));
        let e = toml::from_str::<StatesConfig>("v_reset_every = \"sometimes\"").unwrap_err().to_string();
        assert!(e.contains("\"auto\""), "{e}");
        let e = toml::from_str::<StatesConfig>("v_reset_every = -3").unwrap_err().to_string();
        assert!(e.contains("negative"), "{e}");
        // K* is about low-precision grids: FP32 v would reset every 1454 updates for nothing
        for key in ["m_reset_every", "v_reset_every"] {
            let e = resolve(&format!("{key} = \"auto\"")).unwrap_err();
            assert!(
                e.contains(&format!("optim.states.{key} = \"auto\"")) && e.contains("v_format = \"fp32\"") && e.contains("hardly"),
                "{e}"
            );
        }
        assert_eq!(resolve("v_format = \"bf16\"\nv_reset_every = \"auto\"").unwrap().v_reset_every, 1116);
        // a block past the kernel's 32-bit index (2^40 used to be taken, as a scale per tensor)
        let e = resolve("v_format = \"fp8\"\nblock_size = 1099511627776").unwrap_err();
        assert!(e.contains("optim.states.block_size: at most 4294967295") && e.contains("use 0"), "{e}");
        // dither: the states' rounding, not the weights'; not beside simulated stalling
        assert_eq!(resolve("m_rounding = \"dither\"\nv_rounding = \"dither\"").unwrap().v_rounding, Rounding::Dither);
        let e = resolve("weight_rounding = \"dither\"").unwrap_err();
        assert!(e.contains("optim.states.weight_rounding") && e.contains("moment states"), "{e}");
        let e = resolve("v_rounding = \"dither\"\nv_skip_prob = 0.5").unwrap_err();
        assert!(e.contains("optim.states.v_rounding = \"dither\"") && e.contains("v_skip_prob = 0.5"), "{e}");
    }

    #[test]
    fn unset_new_keys_leave_the_resolved_toml_as_before() {
        let text = toml::to_string(&StatesConfig { v_reset_every: ResetEvery::Auto, ..Default::default() }).unwrap();
        assert_eq!(resolve("scale = \"default\"").unwrap(), resolve("").unwrap());
        assert!(!text.contains("scale") && !text.contains("reset =") && !text.contains("reset_s0"), "{text}");
        assert!(text.contains("v_reset_every = \"auto\"") && text.contains("m_reset_every = 0"), "{text}");
    }
}
