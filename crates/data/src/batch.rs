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

/// How the training rows are ordered: `data.shuffle` and the mode the stream chose for the
/// corpus's size ([`crate::TrainStream::new`]). Part of the position, so that a resume with
/// another order is refused instead of silently reading other rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RowOrder {
    /// Documents in sorted shard order, rows as they come (`data.shuffle = false`; also every
    /// checkpoint written before shuffling existed).
    #[default]
    FileOrder,
    /// In-memory mode: all rows of the training text held in memory, each pass in its own
    /// seeded permutation (nanoGPT's and llm.c's random rows).
    Permuted {
        /// `data.seed`.
        seed: u64,
    },
    /// Streaming mode: each pass's shards in a seeded permutation, their rows through a
    /// shuffle buffer (HF datasets' streaming `shuffle`).
    Buffered {
        /// `data.seed`.
        seed: u64,
        /// `data.shuffle_buffer`, rows.
        buffer: usize,
    },
}

impl RowOrder {
    /// The settings that give this order, as a user writes them.
    pub fn describe(&self) -> String {
        match self {
            RowOrder::FileOrder => "file order (data.shuffle = false)".into(),
            RowOrder::Permuted { seed } => format!("rows permuted in memory (data.shuffle = true, data.seed = {seed})"),
            RowOrder::Buffered { seed, buffer } => {
                format!("streamed through a shuffle buffer (data.shuffle = true, data.seed = {seed}, data.shuffle_buffer = {buffer})")
            }
        }
    }
}

/// Position in the train stream, taken *after* a batch. Passing it to
/// [`crate::TrainStream::new`] continues the stream exactly where it left off.
///
/// Serializable (store it in the checkpoint). It refers to shards by index in the sorted
/// shard list (or in a pass's permutation of it), so resume with the same `train` patterns and
/// files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Completed passes over the train shards (0 during the first). In streaming mode the
    /// reader's passes, which run ahead of training by the shuffle buffer's rows.
    pub epoch: u64,
    /// Index of the current shard in the pass's shard order (file order and streaming mode).
    pub shard: usize,
    /// Records of that shard already consumed, skipped unparsed on resume: lines of a JSON
    /// shard, rows of a parquet shard (whole row groups passed over unread), documents of a
    /// token shard.
    pub line: u64,
    /// `concat` only: tokens already read but not yet emitted in a row; they begin the next
    /// row. At most `seq_len` tokens plus the unused part of the last document read (long
    /// documents make it long). Empty in `truncate_pad` and in-memory mode.
    pub carry: Vec<u32>,
    /// The row order this position belongs to (file order in checkpoints written before
    /// shuffling existed).
    #[serde(default)]
    pub order: RowOrder,
    /// In-memory mode: rows of pass `epoch` already taken, and the rows of a pass (a resume
    /// over a text of another row count is refused).
    #[serde(default)]
    pub row: u64,
    #[serde(default)]
    pub pass_rows: u64,
    /// Streaming mode: slots drawn from the shuffle buffer so far.
    #[serde(default)]
    pub draws: u64,
    /// Streaming mode: the shuffle buffer's rows, `[data.shuffle_buffer, seq_len + 1]` token
    /// ids row-major, filled only by [`crate::TrainStream::position`] (a batch's position
    /// leaves it empty: copying megabytes per batch would cost more than the batch).
    #[serde(default)]
    pub buffer_tokens: Vec<u32>,
    /// Streaming mode: the real (non-pad) tokens at the start of each buffered row.
    #[serde(default)]
    pub buffer_valid: Vec<u32>,
    /// The training shards' identity (their names and sizes, [`crate::TrainStream::new`]):
    /// a resume over shards that changed since is warned about. Empty in positions written
    /// before it was recorded.
    #[serde(default)]
    pub shards_id: String,
}

impl DataPosition {
    /// Whether this is the start of a run (nothing read yet), whatever its order says.
    pub fn is_start(&self) -> bool {
        *self == DataPosition { order: self.order, ..DataPosition::default() }
    }
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
    /// Stream position after this batch: enough to resume in file order and in memory; in
    /// streaming mode it lacks the shuffle buffer's rows, which [`crate::TrainStream::position`]
    /// adds.
    pub position: DataPosition,
}

impl Batch {
    /// Number of targets that count in the loss (sum of `mask`).
    pub fn target_tokens(&self) -> usize {
        self.mask.iter().filter(|&&m| m != 0.0).count()
    }

    /// Builds a batch from rows; the position is the last row's, in row order `order`.
    pub(crate) fn from_rows(rows: &[Row], seq_len: usize, order: RowOrder) -> Self {
        let n = rows.len();
        let mut input = Vec::with_capacity(n * seq_len);
        let mut target = Vec::with_capacity(n * seq_len);
        let mut mask = Vec::with_capacity(n * seq_len);
        for r in rows {
            input.extend_from_slice(&r.tokens[..seq_len]);
            target.extend_from_slice(&r.tokens[1..]);
            mask.extend((1..=seq_len).map(|i| if i < r.valid { 1.0f32 } else { 0.0 }));
        }
        let position = rows.last().map_or_else(DataPosition::default, |r| r.position(order));
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
    /// In-memory mode: rows of pass `epoch` taken up to this one.
    pub row: u64,
    /// Streaming mode: the buffer's draws up to this row, and the slot this row was drawn
    /// from (which held it until the draw).
    pub draws: u64,
    pub slot: usize,
}

impl Row {
    /// A row of `tokens` of which the first `valid` are real, at `(epoch, shard, line)`.
    pub fn new(tokens: Vec<u32>, valid: usize, epoch: u64, shard: usize, line: u64, bad_lines: u64) -> Row {
        Row { tokens, valid, epoch, shard, line, carry_src: None, carry_from: 0, bad_lines, row: 0, draws: 0, slot: 0 }
    }

    /// The stream position after this row (without the shuffle buffer's rows).
    pub fn position(&self, order: RowOrder) -> DataPosition {
        DataPosition {
            epoch: self.epoch,
            shard: self.shard,
            line: self.line,
            carry: self.carry_src.as_ref().map_or_else(Vec::new, |s| s[self.carry_from..].to_vec()),
            order,
            row: self.row,
            pass_rows: 0,
            draws: self.draws,
            buffer_tokens: Vec::new(),
            buffer_valid: Vec::new(),
            shards_id: String::new(),
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
                out.push(Row::new(row, valid, epoch, shard, line, bad_lines));
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
                carry_src: Some(Arc::clone(&stream)),
                carry_from: next,
                ..Row::new(stream[start..start + width].to_vec(), width, epoch, shard, line, bad_lines)
            });
            start = next;
        }
        self.carry = stream[start..].to_vec();
    }
}
