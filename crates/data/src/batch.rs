//! Rows, batches, the stream position, and the two packing modes.
//!
//! Both modes produce rows of `seq_len + 1` tokens; a row gives `input = row[..seq_len]` and
//! `target = row[1..]`.
//!
//! - `concat`: the token stream `doc0 EOS doc1 EOS ...` is cut at multiples of `seq_len`;
//!   row k is `stream[k*seq_len .. k*seq_len + seq_len + 1]`, so consecutive rows share one
//!   token (row k's last target is row k+1's first input) and every token after the first is
//!   a target exactly once. Tokens not yet in a row are the *carry*.
//! - `truncate_pad`: row = the document's first `seq_len + 1` tokens, then `pad_id`;
//!   `mask[i] = 1.0` iff `target[i]` is a document token. Documents of fewer than 2 tokens
//!   (nothing to predict) are skipped, in both modes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::SeqMode;

/// Position in the train stream, taken *after* a batch. Passing it to
/// [`crate::TrainStream::new`] continues the stream exactly where it left off.
///
/// Serializable (store it in the checkpoint). It refers to shards by index in the sorted
/// shard list, so resume with the same `train` patterns and files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Completed passes over the train shards (0 during the first).
    pub epoch: u64,
    /// Index of the current shard in the sorted shard list.
    pub shard: usize,
    /// Lines of that shard already consumed (skipped unparsed on resume).
    pub line: u64,
    /// `concat` only: tokens already read but not yet emitted in a row; they begin the next
    /// row. At most `seq_len` tokens plus the unused part of the last document read (long
    /// documents make it long). Empty in `truncate_pad`.
    pub carry: Vec<u32>,
}

/// One micro-batch: `rows` rows of `seq_len` tokens, row-major (`[rows, seq_len]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Number of rows (sequences).
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Input token ids, `rows * seq_len`.
    pub input: Vec<u32>,
    /// Next-token targets (`input` shifted left by one within the row), `rows * seq_len`.
    pub target: Vec<u32>,
    /// 1.0 where the target counts in the loss, 0.0 on padding (`truncate_pad`); all ones in
    /// `concat`. `rows * seq_len`.
    pub mask: Vec<f32>,
    /// Stream position after this batch (for exact resume).
    pub position: DataPosition,
}

impl Batch {
    /// Number of targets that count in the loss (sum of `mask`).
    pub fn target_tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m != 0.0).count()
    }

    /// Builds a batch from rows; the position is the last row's.
    pub(crate) fn from_rows(rows: &[Row], seq_len: usize) -> Self {
        let n = rows.len();
        let mut input = Vec::with_capacity(n * seq_len);
        let mut target = Vec::with_capacity(n * seq_len);
        let mut mask = Vec::with_capacity(n * seq_len);
        for r in rows {
            input.extend_from_slice(&r.tokens[..seq_len]);
            target.extend_from_slice(&r.tokens[1..]);
            mask.extend((1..=seq_len).map(|i| if i < r.valid { 1.0f32 } else { 0.0 }));
        }
        let position = rows.last().map(Row::position).unwrap_or_default();
        Self { rows: n, seq_len, input, target, mask, position }
    }
}

/// One row of `seq_len + 1` tokens with the stream position after it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub tokens: Vec<u32>,
    /// Real (non-pad) tokens at the start of `tokens`.
    pub valid: usize,
    pub epoch: u64,
    pub shard: usize,
    pub line: u64,
    /// The carry after this row is `carry_src[carry_from..]`; materialized only when a batch
    /// ends on this row (copying it per row would be quadratic in a long document).
    pub carry_src: Option<Arc<[u32]>>,
    pub carry_from: usize,
    /// Bad lines seen in the stream up to this row's document.
    pub bad_lines: u64,
}

impl Row {
    pub fn position(&self) -> DataPosition {
        DataPosition {
            epoch: self.epoch,
            shard: self.shard,
            line: self.line,
            carry: self.carry_src.as_ref().map_or_else(Vec::new, |s| s[self.carry_from..].to_vec()),
        }
    }

    /// Targets that count in the loss.
    pub fn target_tokens(&self) -> usize {
        self.valid.saturating_sub(1)
    }
}

/// Turns tokenized documents into rows, per [`SeqMode`].
pub(crate) struct Packer {
    mode: SeqMode,
    seq_len: usize,
    pad_id: u32,
    carry: Vec<u32>,
}

impl Packer {
    /// `carry` is the position's carry when resuming (ignored in `truncate_pad`).
    pub fn new(mode: SeqMode, seq_len: usize, pad_id: u32, carry: Vec<u32>) -> Self {
        let carry = if mode == SeqMode::Concat { carry } else { Vec::new() };
        Self { mode, seq_len, pad_id, carry }
    }

    /// Appends one document's tokens (with EOS); pushes the rows it completes to `out`.
    pub fn push(&mut self, tokens: &[u32], epoch: u64, shard: usize, line: u64, bad_lines: u64, out: &mut Vec<Row>) {
        if tokens.len() < 2 {
            return;
        }
        let width = self.seq_len + 1;
        match self.mode {
            SeqMode::TruncatePad => {
                let valid = tokens.len().min(width);
                let mut row = Vec::with_capacity(width);
                row.extend_from_slice(&tokens[..valid]);
                row.resize(width, self.pad_id);
                out.push(Row { tokens: row, valid, epoch, shard, line, carry_src: None, carry_from: 0, bad_lines });
            }
            SeqMode::Concat => {
                self.carry.extend_from_slice(tokens);
                self.emit_carry(epoch, shard, line, bad_lines, out);
            }
        }
    }

    /// `concat`: pushes the full rows the carry holds (positions `epoch, shard, line`) and
    /// keeps the rest. Called after each document, and once when resuming, since a resume
    /// carry taken inside a long document can hold many rows that were not yet emitted.
    pub fn emit_carry(&mut self, epoch: u64, shard: usize, line: u64, bad_lines: u64, out: &mut Vec<Row>) {
        let width = self.seq_len + 1;
        if self.mode != SeqMode::Concat || self.carry.len() < width {
            return;
        }
        let stream: Arc<[u32]> = std::mem::take(&mut self.carry).into();
        let mut start = 0;
        while start + width <= stream.len() {
            let next = start + self.seq_len;
            out.push(Row {
                tokens: stream[start..start + width].to_vec(),
                valid: width,
                epoch,
                shard,
                line,
                carry_src: Some(Arc::clone(&stream)),
                carry_from: next,
                bad_lines,
            });
            start = next;
        }
        self.carry = stream[start..].to_vec();
    }
}
