//! In-memory mode of the shuffled training stream: every row of the training text, held in
//! memory, each pass read in its own seeded permutation of the rows (nanoGPT samples random
//! offsets of `train.bin`; llm.c's loader permutes its samples; here every row is seen exactly
//! once per pass).
//!
//! The rows are those the file-order stream would cut in its first pass (documents in sorted
//! shard order, packed by `data.mode`); in `concat` mode the tokens left after the last full
//! row (fewer than `seq_len + 1`) are not used. A pass's permutation is a function of
//! `data.seed` and the pass number ([`crate::order`]), so the position is `(pass, rows
//! taken)` and a resume loads the text again and continues; the position also records the
//! rows per pass, so that a resume over another text (or other rows of it: `data.seq_len`,
//! `data.mode`) is refused rather than read through another permutation.

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
    /// Tokens per row (`seq_len + 1`), and the id padding a short row to it.
    width: usize,
    pad_id: u32,
    /// Each row's real (non-pad) ids, one row after the other in file order: a
    /// `truncate_pad` row of a short document keeps only its document's ids.
    tokens: Vec<u32>,
    /// Where each row's ids start in `tokens` (one entry more than rows: the end).
    starts: Vec<u64>,
    /// Bad lines skipped while the text was read (`on_bad_line = "skip"`).
    bad_lines: u64,
    seed: u64,
    /// The pass being read, its permutation, and the rows of it taken.
    epoch: u64,
    perm: Vec<u32>,
    next: u64,
}

impl MemoryRows {
    /// Reads and tokenizes every training shard (a reader thread beside the tokenizer, which
    /// runs on every core) and keeps the rows; then stands at `(epoch, row)` of a text of
    /// `rows` rows per pass (0: not known, a fresh start).
    ///
    /// # Errors
    /// Reading and tokenizing errors, as the stream gives them; [`DataError::NoText`] when the
    /// text holds no full row; [`DataError::Resume`] when `rows` is not this text's row count
    /// (the text or `data.seq_len` / `data.mode` changed since the position was taken).
    pub fn load(shards: &[PathBuf], cfg: &DataConfig, tok: &Tokens, seed: u64, (epoch, row, rows): (u64, u64, u64)) -> Result<Self> {
        let t0 = Instant::now();
        let mut src = DocSource::new(shards.to_vec(), cfg.on_bad_line, tok, false, None, (0, 0, 0))?;
        let mut packer = Packer::new(cfg.mode, cfg.seq_len, tok.pad_id, Vec::new());
        let (mut tokens, mut starts) = (Vec::new(), vec![0u64]);
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
                    tokens.extend_from_slice(&r.tokens[..r.valid]);
                    starts.push(tokens.len() as u64);
                }
            }
            Ok(reader.join().expect("the reader thread does not panic"))
        })?;
        let n = starts.len() as u64 - 1;
        if n == 0 {
            return Err(DataError::NoText { what: "train", shards: shards.to_vec() });
        }
        if rows != 0 && rows != n {
            return Err(DataError::Resume(format!(
                "the position was taken in a text of {rows} rows per pass, the config's is {n} rows: data.train, \
                 data.seq_len or data.mode changed since (set them back to continue this run)"
            )));
        }
        tokens.shrink_to_fit();
        starts.shrink_to_fit();
        let secs = t0.elapsed().as_secs_f64();
        tracing::info!(
            rows = n,
            targets = targets(&starts),
            bad_lines,
            seconds = format!("{secs:.1}"),
            "training text in memory; each pass reads its rows in a new random order"
        );
        if tokens.len() as u64 > cfg.in_memory_max_tokens {
            tracing::warn!(
                "the training text holds {} tokens, more than data.in_memory_max_tokens = {} (its size was estimated \
                 from the shards' bytes): it is held in memory all the same; lower data.in_memory_max_tokens to \
                 stream it",
                tokens.len(),
                cfg.in_memory_max_tokens
            );
        }
        let perm = permutation(n as usize, key(seed, Purpose::Rows, epoch));
        Ok(Self { width: cfg.seq_len + 1, pad_id: tok.pad_id, tokens, starts, bad_lines, seed, epoch, perm, next: row })
    }

    /// Rows per pass.
    pub fn rows(&self) -> u64 {
        self.starts.len() as u64 - 1
    }

    /// Targets that count in the loss, per pass.
    pub fn targets_per_pass(&self) -> u64 {
        targets(&self.starts)
    }

    /// Bad lines skipped while the text was read.
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }

    /// The next row of the pass (the first of a new pass, in a new permutation, after the
    /// last), with its position `(epoch, rows taken)`.
    pub fn next_row(&mut self) -> Row {
        if self.next == self.rows() {
            self.epoch += 1;
            self.perm = permutation(self.perm.len(), key(self.seed, Purpose::Rows, self.epoch));
            self.next = 0;
        }
        let i = self.perm[self.next as usize] as usize;
        self.next += 1;
        let ids = &self.tokens[self.starts[i] as usize..self.starts[i + 1] as usize];
        let mut tokens = Vec::with_capacity(self.width);
        tokens.extend_from_slice(ids);
        tokens.resize(self.width, self.pad_id);
        Row { row: self.next, ..Row::new(tokens, ids.len(), self.epoch, 0, 0, self.bad_lines) }
    }
}

/// Targets of the rows that `starts` delimits (each row's ids but its first).
fn targets(starts: &[u64]) -> u64 {
    starts.windows(2).map(|w| (w[1] - w[0]).saturating_sub(1)).sum()
}
