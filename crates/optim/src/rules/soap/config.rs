//! `[optim.soap]`: SOAP's own settings (Vyas et al. 2024, "SOAP: Improving and Stabilizing
//! Shampoo using Adam", arXiv:2409.11321), with the defaults of Topollai & Choromanska
//! (arXiv:2603.16731, A.9, following Wang et al. 2024, "4-bit Shampoo"): eigenbasis refresh
//! every 10 updates, largest preconditioned dimension 10,000, preconditioner EMA 0.999.

use crate::error::OptimError;
use crate::states::format::StateFormat;
use crate::states::precond::PrecondStorage;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `[optim.soap]` (read only with `optim.kind = "soap"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SoapConfig {
    /// Updates between eigenbasis refreshes (one QR power step each; the first basis is a full
    /// eigendecomposition): SOAP's `precondition_frequency`.
    pub precondition_frequency: u64,
    /// EMA coefficient of the preconditioners L = EMA(G Gᵀ) and R = EMA(Gᵀ G): SOAP's
    /// `shampoo_beta`.
    pub shampoo_beta: f64,
    /// A side of a matrix longer than this keeps no preconditioner and is not rotated (the
    /// 32,100-row embedding's rows): SOAP's `max_precond_dim`.
    pub max_precond_dim: usize,
    /// The storage format of L and R (a first-moment format name of `optim.states.m_format`:
    /// `fp32`, `bf16`, `fp8`, ...); `None` (the default, left out): m's format, block size,
    /// scale kind. Another format than m's takes m's block size and its own default scale kind.
    /// L and R are written with m's rounding either way.
    #[serde(serialize_with = "format_out", deserialize_with = "format_in", skip_serializing_if = "Option::is_none")]
    pub precond_format: Option<StateFormat>,
}

impl Default for SoapConfig {
    fn default() -> Self {
        SoapConfig { precondition_frequency: 10, shampoo_beta: 0.999, max_precond_dim: 10_000, precond_format: None }
    }
}

/// `precond_format` as its config name.
fn format_out<S: Serializer>(f: &Option<StateFormat>, s: S) -> Result<S::Ok, S::Error> {
    match f {
        Some(f) => s.serialize_str(f.name()),
        None => s.serialize_none(),
    }
}

/// `precond_format` from a config name ([`StateFormat::parse`] as m's format).
fn format_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StateFormat>, D::Error> {
    let name = String::deserialize(d)?;
    StateFormat::parse(&name, false).map(Some).map_err(serde::de::Error::custom)
}

impl SoapConfig {
    /// How the preconditioners are stored: [`Self::max_precond_dim`], [`Self::precond_format`].
    pub fn storage(&self) -> PrecondStorage {
        PrecondStorage { max_dim: self.max_precond_dim, format: self.precond_format }
    }

    /// The defaults (left out of a resolved config).
    pub fn is_default(&self) -> bool {
        *self == SoapConfig::default()
    }

    /// Checks the ranges: a refresh interval and a largest dimension of at least 1, a beta in
    /// [0, 1).
    ///
    /// # Errors
    /// [`OptimError::Config`] naming the key.
    pub fn validate(&self) -> Result<(), OptimError> {
        if self.precondition_frequency == 0 {
            return Err(OptimError::Config("optim.soap.precondition_frequency: must be >= 1 (updates between refreshes)".into()));
        }
        if !(0.0..1.0).contains(&self.shampoo_beta) {
            return Err(OptimError::Config(format!("optim.soap.shampoo_beta: must be in [0, 1), got {}", self.shampoo_beta)));
        }
        if self.max_precond_dim == 0 {
            return Err(OptimError::Config("optim.soap.max_precond_dim: must be >= 1".into()));
        }
        Ok(())
    }
}
