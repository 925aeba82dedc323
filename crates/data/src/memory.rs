//! In-memory mode of the shuffled training stream: every row of the training text, held in
//! memory, each pass read in its own seeded permutation of the rows (nanoGPT samples random
//! offsets of `train.bin`; llm.c's loader permutes its samples; here every row is seen exactly
//! once per pass).
//!
//! The rows are those the file-order stream would cut in its first pass (documents in sorted
//! shard order, packed by `data.mode`); in `concat` mode the tokens left after the last full
//! row (fewer than `seq_len + 1`) are not used. A pass's permutation is a function of
//! `data.seed` and the pass number ([`crate::order`]), so the position is `(pass, rows
//! taken)` and a resume loads the text again and continues.

use std::path::PathBuf;
use std::time::Instant;

use crate::batch::{Packer, Row};
use crate::config::DataConfig;
use crate::error::{DataError, Result};
use crate::order::{key, permutation, Purpose};
use crate::pipeline::{chunk_bytes, next_chunk, pack_chunk};
use crate::source::DocSource;
use crate::tokenize::Tokens;

/// All rows of the training text and where a pass through them stands.
pub(crate) struct MemoryRows {
    /// Tokens per row (`seq_len + 1`).
    width: usize,
    /// `[rows, width]` ids, row-major, in file order.
    tokens: Vec<u32>,
    /// Real (non-pad) tokens at the start of each row.
    valid: Vec<u32>,
    seed: u64,
    /// The pass being read, its permutation, and the rows of it taken.
    epoch: u64,
    perm: Vec<u32>,
    next: u64,
}

impl MemoryRows {
    /// Reads and tokenizes every training shard (a reader thread beside the tokenizer, which
    /// runs on every core) and keeps the rows; then stands at `(epoch, row)`.
    ///
    /// # Errors
    /// Reading and tokenizing errors, as the stream gives them; [`DataError::NoText`] when the
    /// text holds no full row; [`DataError::BadPosition`] when `row` is past the pass.
    pub fn load(shards: &[PathBuf], cfg: &DataConfig, tok: &Tokens, seed: u64, (epoch, row): (u64, u64)) -> Result<Self> {
        let t0 = Instant::now();
        let width = cfg.seq_len + 1;
        let mut src = DocSource::new(shards.to_vec(), cfg.on_bad_line, tok, false, None, (0, 0, 0))?;
        let mut packer = Packer::new(cfg.mode, cfg.seq_len, tok.pad_id, Vec::new());
        let (mut tokens, mut valid) = (Vec::new(), Vec::new());
        let chunk = chunk_bytes(cfg.seq_len);
        let bad_lines = std::thread::scope(|s| -> Result<u64> {
            let (tx, rx) = std::sync::mpsc::sync_channel(2);
            let reader = s.spawn(move || loop {
                let next = next_chunk(&mut src, chunk);
                let end = !matches!(next, Ok(Some(_)));
                if tx.send(next).is_err() || end {
                    return src.bad_lines();
                }
            });
            for docs in rx {
                let Some(docs) = docs? else { break };
                for r in pack_chunk(tok, docs, &mut packer)? {
                    tokens.extend_from_slice(&r.tokens);
                    valid.push(r.valid as u32);
                }
            }
            Ok(reader.join().expect("the reader thread does not panic"))
        })?;
        if valid.is_empty() {
            return Err(DataError::NoText { what: "train", shards: shards.to_vec() });
        }
        let rows = valid.len() as u64;
        if row > rows {
            return Err(DataError::Resume(format!("the position is row {row} of a pass, but the training text holds {rows} rows")));
        }
        let secs = t0.elapsed().as_secs_f64();
        tracing::info!(
            rows,
            tokens = tokens.len(),
            bad_lines,
            seconds = format!("{secs:.1}"),
            "training text in memory; each pass reads its rows in a new random order"
        );
        let perm = permutation(valid.len(), key(seed, Purpose::Rows, epoch));
        Ok(Self { width, tokens, valid, seed, epoch, perm, next: row })
    }

    /// Rows per pass.
    pub fn rows(&self) -> u64 {
        self.valid.len() as u64
    }

    /// Targets that count in the loss, per pass.
    pub fn targets_per_pass(&self) -> u64 {
        self.valid.iter().map(|&v| v.saturating_sub(1) as u64).sum()
    }

    /// The next row of the pass (the first of a new pass, in a new permutation, after the
    /// last), with its position `(epoch, rows taken)`.
    pub fn next_row(&mut self) -> Row {
        if self.next == self.rows() {
            self.epoch += 1;
            self.perm = permutation(self.valid.len(), key(self.seed, Purpose::Rows, self.epoch));
            self.next = 0;
        }
        let i = self.perm[self.next as usize] as usize;
        self.next += 1;
        let tokens = self.tokens[i * self.width..(i + 1) * self.width].to_vec();
        Row { row: self.next, ..Row::new(tokens, self.valid[i] as usize, self.epoch, 0, 0, 0) }
    }
}
