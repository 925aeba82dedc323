//! The training stream: shards -> documents -> tokens -> rows -> batches, endlessly
//! (epoch after epoch), with reading and tokenizing in background threads.
//!
//! Two threads, joined by bounded channels:
//!
//! ```text
//! reader thread:    DocSource (gunzip, JSON) --chunks of <= 1 MB of text--> [2]
//! tokenizer thread: encode_batch (rayon) + Packer --rows of one chunk--> [4]
//! caller:           next_batch(rows) takes rows in order and builds a Batch
//!                   (or prefetch(rows) builds it earlier, while the caller waits anyway)
//! ```
//!
//! Determinism: every step is a pure function of the documents in order (chunk borders
//! depend only on the text, `encode_batch` returns results in input order, packing is
//! sequential), so batches and positions do not depend on thread timing; the threads only
//! decide how far ahead the work is done (at most ~6 chunks, i.e. a few batches of 512x256).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

use crate::batch::{Batch, DataPosition, Packer, Row};
use crate::config::DataConfig;
use crate::error::{DataError, Result};
use crate::pipeline::{chunk_bytes, next_chunk, pack_chunk};
use crate::reader::{check_train_shards, expand_shards, DocSource};
use crate::tokenize::Tokens;

/// Endless stream of training batches over the `train` shards.
///
/// ```no_run
/// # fn main() -> Result<(), lowbit_data::DataError> {
/// use lowbit_data::{load_tokenizer, DataConfig, DataPosition, TrainStream};
/// let cfg = DataConfig::default();
/// let tok = load_tokenizer(&cfg.tokenizer, cfg.allow_download)?;
/// let mut stream = TrainStream::new(&cfg, &tok, DataPosition::default())?;
/// let batch = stream.next_batch(8)?; // 8 rows of cfg.seq_len tokens
/// // ...store batch.position in the checkpoint; TrainStream::new(&cfg, &tok, pos) resumes.
/// # Ok(()) }
/// ```
pub struct TrainStream {
    rx: Option<Receiver<Result<Vec<Row>>>>,
    pending: VecDeque<Row>,
    /// Batches built ahead by [`TrainStream::prefetch`], in order, each with its rows (which
    /// go back to `pending` if the next request is for another size).
    ready: VecDeque<(Vec<Row>, Batch)>,
    /// A reading error met by [`TrainStream::prefetch`], for the `next_batch` that needs rows
    /// past it.
    error: Option<DataError>,
    seq_len: usize,
    position: DataPosition,
    bad_lines: u64,
    shards: Vec<PathBuf>,
    workers: Vec<JoinHandle<()>>,
}

impl TrainStream {
    /// Opens the train shards and starts the background threads at `start`
    /// (`DataPosition::default()` for a fresh run, a batch's `position` to resume).
    ///
    /// # Errors
    /// [`DataError::Config`] for bad settings, [`DataError::MissingFile`] /
    /// [`DataError::NoMatch`] for train patterns, [`DataError::BadPosition`] if `start`
    /// points past the shard list, [`DataError::NoText`] (and, with `on_bad_line = "fail"`,
    /// the first bad line) when the shards hold no text: each shard is read up to its first
    /// document first. Errors met later while reading are returned by
    /// [`TrainStream::next_batch`].
    pub fn new(cfg: &DataConfig, tok: &Tokens, start: DataPosition) -> Result<Self> {
        cfg.validate()?;
        let shards = expand_shards(&cfg.train, "train")?;
        check_train_shards(&shards, cfg.on_bad_line)?;
        tracing::info!(shards = shards.len(), first = %shards[0].display(), ?cfg.mode, cfg.seq_len, "train data");
        let mut src = DocSource::new(shards.clone(), cfg.on_bad_line, true, start.epoch, start.shard, start.line)?;

        let (doc_tx, doc_rx) = mpsc::sync_channel(2);
        let chunk = chunk_bytes(cfg.seq_len);
        let reader = std::thread::Builder::new()
            .name("lowbit-data-read".into())
            .spawn(move || loop {
                match next_chunk(&mut src, chunk) {
                    Ok(Some(docs)) => {
                        if doc_tx.send(Ok(docs)).is_err() {
                            return; // the stream was dropped
                        }
                    }
                    Ok(None) => return, // not reached: the train source cycles
                    Err(e) => {
                        let _ = doc_tx.send(Err(e));
                        return;
                    }
                }
            })
            .expect("spawn reader thread");

        let (row_tx, row_rx) = mpsc::sync_channel(4);
        let mut packer = Packer::new(cfg.mode, cfg.seq_len, tok.pad_id, start.carry.clone());
        // Rows already complete in a resumed carry come first, with the resume position.
        let mut first_rows = Vec::new();
        packer.emit_carry(start.epoch, start.shard, start.line, 0, &mut first_rows);
        let tok2 = tok.clone();
        let shards2 = shards.clone();
        let tokenizer = std::thread::Builder::new()
            .name("lowbit-data-tokenize".into())
            .spawn(move || {
                for msg in doc_rx {
                    let out = msg.and_then(|docs| pack_chunk(&tok2, &shards2, &docs, &mut packer));
                    let failed = out.is_err();
                    if row_tx.send(out).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawn tokenizer thread");

        Ok(Self {
            rx: Some(row_rx),
            pending: first_rows.into(),
            ready: VecDeque::new(),
            error: None,
            seq_len: cfg.seq_len,
            position: start,
            bad_lines: 0,
            shards,
            workers: vec![reader, tokenizer],
        })
    }

    /// The next `rows` rows as a batch (`[rows, seq_len]`); blocks until they are ready. A
    /// batch [`TrainStream::prefetch`] built for the same size is returned as it is; one of
    /// another size gives its rows back first (the data order never depends on prefetching).
    ///
    /// # Errors
    /// [`DataError::Config`] if `rows == 0`; any reading error met in the shards
    /// ([`DataError::BadLine`], [`DataError::Corrupt`] with `on_bad_line = "fail"`,
    /// [`DataError::NoText`], [`DataError::Io`]); [`DataError::StreamClosed`] on calls after
    /// such an error.
    pub fn next_batch(&mut self, rows: usize) -> Result<Batch> {
        if rows == 0 {
            return Err(DataError::Config("a batch needs at least one row".into()));
        }
        let (taken, batch) = match self.ready.front() {
            Some((taken, _)) if taken.len() == rows => self.ready.pop_front().expect("a ready batch"),
            _ => {
                self.unready();
                let taken = self.take_rows(rows)?;
                let batch = Batch::from_rows(&taken, self.seq_len);
                (taken, batch)
            }
        };
        self.bad_lines = taken.last().map_or(self.bad_lines, |r| r.bad_lines);
        self.position = batch.position.clone();
        Ok(batch)
    }

    /// Builds the batch that a later `next_batch(rows)` will return, now: for a caller that
    /// would otherwise wait here anyway (the training step, while the device runs its
    /// update), so that the next step starts without the host's part of its data. Blocks
    /// until the rows are ready. A reading error is kept for the `next_batch` that needs rows
    /// past it; `position` and `bad_lines` move only when `next_batch` returns the batch.
    pub fn prefetch(&mut self, rows: usize) {
        if rows == 0 || self.error.is_some() {
            return;
        }
        match self.take_rows(rows) {
            Ok(taken) => {
                let batch = Batch::from_rows(&taken, self.seq_len);
                self.ready.push_back((taken, batch));
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// The rows of every prefetched batch back to the front of `pending`, in order.
    fn unready(&mut self) {
        for (taken, _) in self.ready.drain(..).rev() {
            for row in taken.into_iter().rev() {
                self.pending.push_front(row);
            }
        }
    }

    /// The next `rows` rows from `pending`, receiving chunks from the tokenizer thread as
    /// needed; a reading error (kept by `prefetch`, or received now) closes the stream.
    fn take_rows(&mut self, rows: usize) -> Result<Vec<Row>> {
        while self.pending.len() < rows {
            if let Some(e) = self.error.take() {
                self.rx = None;
                return Err(e);
            }
            let rx = self.rx.as_ref().ok_or(DataError::StreamClosed)?;
            match rx.recv() {
                Ok(Ok(chunk)) => self.pending.extend(chunk),
                Ok(Err(e)) => {
                    self.rx = None;
                    return Err(e);
                }
                Err(_) => {
                    self.rx = None;
                    return Err(DataError::StreamClosed);
                }
            }
        }
        Ok(self.pending.drain(..rows).collect())
    }

    /// Position after the last batch returned (the `start` given to `new` before the first).
    pub fn position(&self) -> &DataPosition {
        &self.position
    }

    /// Bad lines skipped (`on_bad_line = "skip"`) in the documents consumed so far, counted
    /// from where this stream started (lines skipped before a resume point are not counted).
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }

    /// The train shards, in the order they are read.
    pub fn shards(&self) -> &[PathBuf] {
        &self.shards
    }

    /// Tokens per row.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

impl Drop for TrainStream {
    fn drop(&mut self) {
        // Closing the receiver makes the tokenizer thread's next send fail; its exit closes
        // the reader thread's channel in turn. Both then end within one chunk of work.
        self.rx = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
