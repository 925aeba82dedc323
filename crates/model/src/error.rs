//! Error type of the model crate.

/// Errors raised by configuration checks and model construction.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The `[model]` configuration is inconsistent (zero dimension, indivisible heads, ...).
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// An error bubbled up from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl From<ModelError> for candle_core::Error {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Candle(c) => c,
            other => candle_core::Error::Msg(other.to_string()),
        }
    }
}
