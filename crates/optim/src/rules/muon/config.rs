//! `[optim.muon]`: Muon's own settings (Jordan et al. 2024, "Muon: An optimizer for hidden
//! layers in neural networks", kellerjordan.github.io/posts/muon, and its reference code
//! github.com/KellerJordan/Muon), with the update scaled as Moonlight's (Liu et al. 2025,
//! "Muon is Scalable for LLM Training", arXiv:2502.16982, section 2.2) so that AdamW's learning
//! rate and weight decay serve both rules.

use crate::error::OptimError;
use serde::{Deserialize, Serialize};

/// `[optim.muon]` (read only with `optim.kind = "muon"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MuonConfig {
    /// Momentum b of the buffer m = b m + (1 - b) g (the reference's 0.95).
    pub momentum: f64,
    /// Nesterov momentum: orthogonalise (1 - b) g + b m instead of m (the reference's default).
    pub nesterov: bool,
    /// Newton-Schulz iterations (the reference's 5, with its quintic coefficients
    /// [`crate::rules::muon::orthogonalize::NS_COEFFICIENTS`]).
    pub ns_steps: usize,
    /// The orthogonalised update O of a `rows x cols` matrix is applied as
    /// `lr * update_rms * sqrt(max(rows, cols)) * O`: an update of RMS ~`update_rms`, AdamW's
    /// typical 0.2-0.4 (Moonlight's 0.2), so one `optim.lr` and `optim.weight_decay` serve the
    /// Muon matrices and the AdamW tensors.
    pub update_rms: f64,
}

impl Default for MuonConfig {
    fn default() -> Self {
        MuonConfig { momentum: 0.95, nesterov: true, ns_steps: 5, update_rms: 0.2 }
    }
}

impl MuonConfig {
    /// The defaults (left out of a resolved config).
    pub fn is_default(&self) -> bool {
        *self == MuonConfig::default()
    }

    /// The step-size factor of a `rows x cols` matrix: `update_rms * sqrt(max(rows, cols))`.
    pub fn lr_factor(&self, rows: usize, cols: usize) -> f64 {
        self.update_rms * (rows.max(cols) as f64).sqrt()
    }

    /// Checks the ranges: a momentum in [0, 1), at least one Newton-Schulz step, an update RMS
    /// above 0.
    ///
    /// # Errors
    /// [`OptimError::Config`] naming the key.
    pub fn validate(&self) -> Result<(), OptimError> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(OptimError::Config(format!("optim.muon.momentum: must be in [0, 1), got {}", self.momentum)));
        }
        if self.ns_steps == 0 {
            return Err(OptimError::Config("optim.muon.ns_steps: must be >= 1 (Newton-Schulz iterations)".into()));
        }
        if !(self.update_rms > 0.0 && self.update_rms.is_finite()) {
            return Err(OptimError::Config(format!("optim.muon.update_rms: must be a number > 0, got {}", self.update_rms)));
        }
        Ok(())
    }
}
