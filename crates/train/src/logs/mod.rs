//! The run folder's logs: `metrics.jsonl` ([`metrics`]), `stalls.jsonl` ([`stalls`]) and
//! `summary.json` ([`summary`]).

pub mod metrics;
pub mod stalls;
pub mod summary;
