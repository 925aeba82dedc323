//! Rows of `metrics.jsonl` (one JSON object per line) and an append-only JSONL writer
//! that flushes every line, so a reader can follow a run in progress.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// A training-step row (`kind = "train"`) or an evaluation row (`kind = "eval"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MetricsRow {
    Train {
        step: u64,
        /// Training tokens consumed so far (targets counted in the loss).
        tokens: u64,
        lr: f64,
        /// Mean training loss over the step's micro-batches (nats/token); `null` when
        /// non-finite (JSON has no NaN/Inf), read back as NaN.
        #[serde(deserialize_with = "nan_if_null")]
        loss: f64,
        /// Global gradient norm before clipping (`null` when non-finite).
        #[serde(deserialize_with = "nan_if_null")]
        grad_norm: f64,
        /// Wall time of the step (s).
        step_time: f64,
        tokens_per_s: f64,
        /// The update was skipped (non-finite loss or gradient norm); always written (rows
        /// written before it always was read as `false` when it is missing).
        #[serde(default)]
        skipped: bool,
        /// Model FLOPs utilisation of the step on one GPU, a fraction ([`crate::flops`]);
        /// absent on the CPU, on a card without a known peak, and in rows written before it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mfu: Option<f64>,
    },
    Eval {
        step: u64,
        tokens: u64,
        /// Validation loss (nats/token) over the fixed validation set (`null` when non-finite).
        #[serde(deserialize_with = "nan_if_null")]
        val_loss: f64,
        #[serde(deserialize_with = "nan_if_null")]
        val_ppl: f64,
    },
}

/// serde_json writes a non-finite f64 as `null`; read it back as NaN instead of failing.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Appends JSON lines to a file, flushing each.
pub struct JsonlWriter {
    file: File,
    path: PathBuf,
}

impl JsonlWriter {
    /// Open for appending; with `keep_through = Some(step)`, first drop rows whose `step` is
    /// greater (used on resume so the log continues exactly where the checkpoint was).
    pub fn open(path: &Path, keep_through: Option<u64>) -> Result<Self> {
        if let Some(last) = keep_through {
            truncate_after(path, last)?;
        } else if path.exists() {
            std::fs::remove_file(path).with_context(|| format!("cannot replace {}", path.display()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {} for writing", path.display()))?;
        Ok(JsonlWriter { file, path: path.to_path_buf() })
    }

    pub fn write<T: Serialize>(&mut self, row: &T) -> Result<()> {
        let mut line = serde_json::to_string(row)?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", self.path.display()))?;
        self.file.flush()?;
        Ok(())
    }
}

/// Keep only the complete lines of `path` whose `step` is <= `last`.
fn truncate_after(path: &Path, last: u64) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let reader = BufReader::new(File::open(path)?);
    let mut kept = String::new();
    for line in reader.lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if v.get("step").and_then(|s| s.as_u64()).is_some_and(|s| s <= last) {
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    crate::checkpoint::write_atomic(path, kept.as_bytes())
}

/// Read all complete JSON rows of a JSONL file, skipping a partly written last line. A
/// corrupt line elsewhere is skipped with a warning naming the file and line (one bad line
/// does not make the rest of a run's log unreadable).
pub fn read_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut rows = Vec::new();
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => rows.push(r),
            // the last line may be mid-write by a running trainer
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => tracing::warn!("{}:{}: skipping a corrupt row: {e}", path.display(), i + 1),
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mfu` is written only when known, and a row without it (the CPU's, or one written
    /// before it existed) reads back as `None`.
    #[test]
    fn mfu_is_optional_in_train_rows() {
        let old = r#"{"kind":"train","step":3,"tokens":96,"lr":0.001,"loss":5.5,"grad_norm":1.25,"step_time":0.5,"tokens_per_s":64.0,"skipped":false}"#;
        let row: MetricsRow = serde_json::from_str(old).unwrap();
        assert!(matches!(row, MetricsRow::Train { step: 3, mfu: None, .. }));
        assert_eq!(serde_json::to_string(&row).unwrap(), old);
        let MetricsRow::Train { step, tokens, lr, loss, grad_norm, step_time, tokens_per_s, skipped, .. } = row else { unreachable!() };
        let with = MetricsRow::Train { step, tokens, lr, loss, grad_norm, step_time, tokens_per_s, skipped, mfu: Some(0.375) };
        let text = serde_json::to_string(&with).unwrap();
        assert!(text.ends_with(r#""skipped":false,"mfu":0.375}"#), "{text}");
        assert!(matches!(serde_json::from_str(&text).unwrap(), MetricsRow::Train { mfu: Some(m), .. } if m == 0.375));
    }
}
