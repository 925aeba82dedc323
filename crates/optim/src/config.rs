//! The `[optim.states]` config section: how each state is stored, rounded and reset.

use crate::format::{Rounding, StateFormat};
use serde::{Deserialize, Serialize};

/// When the bias-correction counter starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BiasCorrection {
    /// `t` counts steps since the state's last reset (default; a reset state is a fresh Adam).
    Restart,
    /// `t` counts steps since the start of training, ignoring resets.
    Continue,
}

/// Whether a block-scaled second moment may decode to 0 in a non-zero block (DESIGN.md,
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
    /// Write-back rounding of m: `nearest` or `stochastic`.
    pub m_rounding: Rounding,
    /// Write-back rounding of v.
    pub v_rounding: Rounding,
    /// Elements per scale block for fp8/fp4/int8 (0 = one scale per tensor). A multiple of 4.
    pub block_size: usize,
    /// Zero m every this many steps (0 = never). Paper: 1000 (bf16), 300 (fp8), 200 (fp4).
    pub m_reset_every: u64,
    /// Zero v every this many steps (0 = never). Must be a multiple of `m_reset_every`:
    /// resetting v alone leaves m / (sqrt(v) + eps) = m / eps for zero-gradient elements.
    pub v_reset_every: u64,
    /// Bias-correction counter after a reset: `restart` (default) or `continue`.
    pub bias_correction: BiasCorrection,
    /// Rounding of BF16 weights after the update (`model.dtype = "bf16"`).
    pub weight_rounding: Rounding,
}

impl Default for StatesConfig {
    fn default() -> Self {
        StatesConfig {
            m_format: "fp32".into(),
            v_format: "fp32".into(),
            v_zero: VZero::Exclude,
            m_rounding: Rounding::Nearest,
            v_rounding: Rounding::Nearest,
            block_size: 128,
            m_reset_every: 0,
            v_reset_every: 0,
            bias_correction: BiasCorrection::Restart,
            weight_rounding: Rounding::Nearest,
        }
    }
}

/// `[optim.states]` after validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatesSpec {
    pub m_format: StateFormat,
    pub v_format: StateFormat,
    pub v_zero: VZero,
    pub m_rounding: Rounding,
    pub v_rounding: Rounding,
    pub block_size: usize,
    pub m_reset_every: u64,
    pub v_reset_every: u64,
    pub bias_correction: BiasCorrection,
    pub weight_rounding: Rounding,
}

impl StatesConfig {
    /// Validate and resolve format names. Errors name the offending key.
    pub fn resolve(&self) -> Result<StatesSpec, String> {
        let m_format = StateFormat::parse(&self.m_format, false)
            .map_err(|e| format!("optim.states.m_format: {e}"))?;
        let v_format = StateFormat::parse(&self.v_format, true)
            .map_err(|e| format!("optim.states.v_format: {e}"))?;
        if !self.block_size.is_multiple_of(4) {
            return Err(format!(
                "optim.states.block_size: must be a multiple of 4 (fp4 packs two codes per byte; the \
                 CUDA kernel moves 4 elements at a time), or 0 for one scale per tensor; got {}",
                self.block_size
            ));
        }
        if self.v_reset_every > 0 && (self.m_reset_every == 0 || !self.v_reset_every.is_multiple_of(self.m_reset_every)) {
            return Err(format!(
                "optim.states.v_reset_every = {}: a v reset needs an m reset at the same step \
                 (m_reset_every must divide it, got {}): with v = 0 and m != 0 the update of an \
                 element with zero gradient is lr * m / eps",
                self.v_reset_every, self.m_reset_every
            ));
        }
        Ok(StatesSpec {
            m_format,
            v_format,
            v_zero: self.v_zero,
            m_rounding: self.m_rounding,
            v_rounding: self.v_rounding,
            block_size: self.block_size,
            m_reset_every: self.m_reset_every,
            v_reset_every: self.v_reset_every,
            bias_correction: self.bias_correction,
            weight_rounding: self.weight_rounding,
        })
    }
}
