//! The run folder's logs: `metrics.jsonl` ([`metrics`]), `stalls.jsonl` ([`stalls`], written
//! by the [`stall_writer`]), the same curves as TensorBoard scalars ([`tensorboard`], in
//! [`event_file`]s) and `summary.json` ([`summary`]).

pub mod event_file;
pub mod metrics;
pub mod stall_writer;
pub mod stalls;
pub mod summary;
pub mod tensorboard;

use anyhow::Result;
use metrics::{JsonlWriter, MetricsRow};
use stalls::StallRow;
use std::path::Path;

/// The per-step logs of a run (rank 0): each row goes to its JSONL file and, with
/// `run.tensorboard`, to the event file.
pub struct RunLogs {
    metrics: JsonlWriter,
    stalls: JsonlWriter,
    scalars: Option<tensorboard::Scalars>,
}

impl RunLogs {
    /// Open the logs of the run in `dir`; `resumed_at`: the checkpoint's step of a resumed
    /// run, whose JSONL rows past it are dropped (and TensorBoard told to drop its events).
    ///
    /// # Errors
    /// A log file cannot be opened, cut or created.
    pub fn open(dir: &Path, resumed_at: Option<u64>, tensorboard: bool) -> Result<RunLogs> {
        Ok(RunLogs {
            metrics: JsonlWriter::open(&dir.join("metrics.jsonl"), resumed_at)?,
            stalls: JsonlWriter::open(&dir.join("stalls.jsonl"), resumed_at)?,
            scalars: tensorboard.then(|| tensorboard::Scalars::open(dir, resumed_at)).transpose()?,
        })
    }

    /// Log a `metrics.jsonl` row.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn metric(&mut self, row: &MetricsRow) -> Result<()> {
        self.metrics.write(row)?;
        self.scalars.as_mut().map_or(Ok(()), |s| s.metrics(row))
    }

    /// Log a `stalls.jsonl` row.
    ///
    /// # Errors
    /// A log cannot be written.
    pub fn stall(&mut self, row: &StallRow) -> Result<()> {
        self.stalls.write(row)?;
        self.scalars.as_mut().map_or(Ok(()), |s| s.stalls(row))
    }
}
