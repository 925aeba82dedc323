//! The optimizer crate's error type.

/// Why an optimizer call or a states config was refused. Each message names what to fix (the
/// config key, the tensor, the update).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    /// A states config or format name that cannot be used (`optim.states.*`).
    #[error("{0}")]
    Config(String),
    /// States that do not fit together: code bytes of the wrong length, a slice or shard
    /// outside the tensor, shards that do not tile it.
    #[error("{0}")]
    State(String),
    /// The adaptive reset rule asked out of order or before its stalled fraction was observed.
    #[error("{0}")]
    Reset(String),
    /// A tensor, device or collective operation failed (candle's or the backend's message).
    #[error("{0}")]
    Runtime(String),
}

impl From<candle_core::Error> for OptimError {
    fn from(e: candle_core::Error) -> Self {
        OptimError::Runtime(e.to_string())
    }
}
