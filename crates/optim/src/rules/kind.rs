//! Which update rule a run trains with (`optim.kind`): [`OptimizerKind`].

use serde::{Deserialize, Serialize};

/// Which optimizer a run trains with (`optim.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// AdamW (Loshchilov & Hutter 2019) with low-precision moments: the fused step.
    #[default]
    Adamw,
    /// SOAP: Adam in the eigenbasis of Shampoo's preconditioners ([`crate::rules::soap`]).
    Soap,
    /// Muon for the attention and MLP matrices, AdamW for the rest ([`crate::rules::muon`]).
    Muon,
}

impl OptimizerKind {
    /// AdamW (the default, left out of a resolved config).
    pub fn is_adamw(&self) -> bool {
        *self == OptimizerKind::Adamw
    }

    /// Config name (`adamw` / `soap` / `muon`).
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Adamw => "adamw",
            OptimizerKind::Soap => "soap",
            OptimizerKind::Muon => "muon",
        }
    }
}
