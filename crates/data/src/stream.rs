//! The training stream: shards -> documents -> tokens -> rows -> batches, endlessly
//! (pass after pass), in one of three row orders ([`RowOrder`]):
//!
//! - **in memory** (`data.shuffle`, the text fits `data.in_memory_max_tokens`): every row
//!   loaded at start, each pass read in a seeded permutation ([`crate::memory`]);
//! - **streaming** (`data.shuffle`, a larger text): each pass's shards in a seeded
//!   permutation, their rows through a shuffle buffer (`shuffle_buffer.rs`);
//! - **file order** (`data.shuffle = false`): documents in sorted shard order.
//!
//! Streaming and file order read and tokenize in two background threads, joined by bounded
//! channels:
//!
//! ```text
//! reader thread:    DocSource (gunzip, JSON; or a token shard) --chunks of <= 1 MB of text--> [2]
//! tokenizer thread: encode_batch (rayon) + Packer --rows of one chunk--> [4]
//! caller:           (the shuffle buffer,) next_batch(rows) takes rows in order and builds a Batch
//!                   (or prefetch(rows) builds it earlier, while the caller waits anyway)
//! ```
//!
//! Determinism: every step is a pure function of the documents in order and the seed (chunk
//! borders depend only on the text, `encode_batch` returns results in input order, packing is
//! sequential, the random draws are counted), so batches and positions do not depend on
//! thread timing; the threads only decide how far ahead the work is done (at most ~6 chunks,
//! i.e. a few batches of 512x256, besides the shuffle buffer).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

use crate::batch::{Batch, DataPosition, Packer, Row, RowOrder};
use crate::config::{DataConfig, SeqMode};
use crate::error::{DataError, Result};
use crate::memory::MemoryRows;
use crate::pipeline::{chunk_bytes, next_chunk, pack_chunk};
use crate::reader::expand_shards;
use crate::shuffle_buffer::ShuffleBuffer;
use crate::source::{check_train_shards, estimate_tokens, shard_headers, shards_id, DocSource};
use crate::tokenize::Tokens;

/// The size of one pass over the training text, in target tokens (tokens that count in the
/// loss): exact in memory and for token shards in `concat` mode, else estimated
/// ([`DataConfig::in_memory_max_tokens`] says how; in `truncate_pad` the text's tokens, an
/// upper bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassSize {
    pub tokens: u64,
    pub exact: bool,
    /// Rows per pass, where they are known (in memory).
    pub rows: Option<u64>,
}

/// Where the rows come from.
enum Supply {
    /// The reader and tokenizer threads (file order, or streaming through `buffer`).
    Threads { rx: Option<Receiver<Result<Vec<Row>>>>, buffer: Option<ShuffleBuffer> },
    /// Every row in memory (`None` after an error closed the stream).
    Memory(Option<MemoryRows>),
}

/// Endless stream of training batches over the `train` shards.
///
/// ```no_run
/// # fn main() -> Result<(), lowbit_data::DataError> {
/// use lowbit_data::{load_tokenizer, DataConfig, DataPosition, TrainStream};
/// let cfg = DataConfig::default();
/// let tok = load_tokenizer(&cfg.tokenizer, cfg.allow_download)?;
/// let mut stream = TrainStream::new(&cfg, &tok, DataPosition::default())?;
/// let batch = stream.next_batch(8)?; // 8 rows of cfg.seq_len tokens
/// // ...store stream.position() in the checkpoint; TrainStream::new(&cfg, &tok, pos) resumes.
/// # Ok(()) }
/// ```
pub struct TrainStream {
    supply: Supply,
    order: RowOrder,
    pass: PassSize,
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
    workers: Vec<JoinHandle<()>>,
}

impl TrainStream {
    /// Opens the train shards and starts reading at `start` (`DataPosition::default()` for a
    /// fresh run; to resume, [`TrainStream::position`] of the stream that stopped, or a
    /// batch's `position` outside streaming mode). The row order follows `data.shuffle` and
    /// the size of the text ([`RowOrder`]); in memory mode the whole text is read here.
    ///
    /// # Errors
    /// [`DataError::Config`] for bad settings, [`DataError::MissingFile`] /
    /// [`DataError::NoMatch`] for train patterns, [`DataError::BadPosition`] if `start`
    /// points past the shard list, [`DataError::Resume`] if `start` was written with another
    /// row order, [`DataError::NoText`] (and, with `on_bad_line = "fail"`, the first bad line)
    /// when the shards hold no text: each shard is read up to its first document first (a
    /// token shard: its header, refused with [`DataError::TokenizerMismatch`] when made with
    /// another tokenizer). Errors met later while reading are returned by
    /// [`TrainStream::next_batch`].
    pub fn new(cfg: &DataConfig, tok: &Tokens, start: DataPosition) -> Result<Self> {
        cfg.validate()?;
        let shards = expand_shards(&cfg.train, "train")?;
        let headers = shard_headers(&shards)?;
        check_train_shards(&shards, &headers, cfg.on_bad_line, tok)?;
        let (estimate, exact) = estimate_tokens(&shards, &headers)?;
        let seed = cfg.seed.unwrap_or(0);
        let order = row_order(cfg, &start, seed, estimate, exact)?;
        let id = shards_id(&shards);
        if !start.shards_id.is_empty() && start.shards_id != id {
            tracing::warn!(
                "the training shards differ from those the position was taken in (their names or sizes: data.train or \
                 its files changed): the run goes on at the same position of these files, which does not replay it"
            );
        }
        tracing::info!(shards = shards.len(), first = %shards[0].display(), mode = ?cfg.mode, seq_len = cfg.seq_len, order = order.describe(), "train data");
        let mut stream = Self {
            supply: Supply::Memory(None),
            order,
            // outside memory, a pass's targets are its tokens in concat mode (the rows run on
            // from pass to pass: every token is a target once), fewer in truncate_pad
            pass: PassSize { tokens: estimate, exact: exact && cfg.mode == SeqMode::Concat, rows: None },
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            error: None,
            seq_len: cfg.seq_len,
            position: DataPosition { order, shards_id: id.clone(), ..start.clone() },
            bad_lines: 0,
            workers: Vec::new(),
        };
        if let RowOrder::Permuted { seed } = order {
            let rows = MemoryRows::load(&shards, cfg, tok, seed, (start.epoch, start.row, start.pass_rows))?;
            stream.pass = PassSize { tokens: rows.targets_per_pass(), exact: true, rows: Some(rows.rows()) };
            stream.bad_lines = rows.bad_lines();
            stream.supply = Supply::Memory(Some(rows));
            return Ok(stream);
        }
        stream.start_workers(shards, cfg, tok, &start, seed)?;
        Ok(stream)
    }

    /// The reader and tokenizer threads of a stream outside memory (file order or the shuffle
    /// buffer's) from `start` over `shards`, and the rows complete in `start`'s carry.
    ///
    /// # Errors
    /// A shuffle buffer that does not restore from `start`, or the shards failing to open.
    fn start_workers(&mut self, shards: Vec<PathBuf>, cfg: &DataConfig, tok: &Tokens, start: &DataPosition, seed: u64) -> Result<()> {
        let (order, width) = (self.order, cfg.seq_len + 1);
        let buffer = match order {
            RowOrder::Buffered { seed, buffer } if start.is_start() => Some(ShuffleBuffer::new(seed, buffer)),
            RowOrder::Buffered { seed, buffer } => {
                Some(ShuffleBuffer::restore(seed, buffer, start.draws, &start.buffer_tokens, &start.buffer_valid, width)?)
            }
            _ => None,
        };
        let shard_seed = matches!(order, RowOrder::Buffered { .. }).then_some(seed);
        let mut src = DocSource::new(shards, cfg.on_bad_line, tok, true, shard_seed, (start.epoch, start.shard, start.line))?;

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
        let tokenizer = std::thread::Builder::new()
            .name("lowbit-data-tokenize".into())
            .spawn(move || {
                for msg in doc_rx {
                    let out = msg.and_then(|docs| pack_chunk(&tok2, docs, &mut packer));
                    let failed = out.is_err();
                    if row_tx.send(out).is_err() || failed {
                        return;
                    }
                }
            })
            .expect("spawn tokenizer thread");
        self.supply = Supply::Threads { rx: Some(row_rx), buffer };
        self.workers = vec![reader, tokenizer];
        self.absorb(first_rows);
        Ok(())
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
                let batch = self.batch(&taken);
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
                let batch = self.batch(&taken);
                self.ready.push_back((taken, batch));
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// A batch of `rows`, its position in this stream's order (with the rows per pass, in
    /// memory).
    fn batch(&self, rows: &[Row]) -> Batch {
        let mut b = Batch::from_rows(rows, self.seq_len, self.order);
        b.position.pass_rows = self.pass.rows.unwrap_or(0);
        b.position.shards_id.clone_from(&self.position.shards_id);
        b
    }

    /// The rows of every prefetched batch back to the front of `pending`, in order.
    fn unready(&mut self) {
        for (taken, _) in self.ready.drain(..).rev() {
            for row in taken.into_iter().rev() {
                self.pending.push_front(row);
            }
        }
    }

    /// The next `rows` rows from `pending`, refilled as needed ([`TrainStream::refill`]); a
    /// reading error (kept by `prefetch`, or met now) closes the stream.
    fn take_rows(&mut self, rows: usize) -> Result<Vec<Row>> {
        while self.pending.len() < rows {
            if let Some(e) = self.error.take() {
                self.close();
                return Err(e);
            }
            if let Err(e) = self.refill() {
                self.close();
                return Err(e);
            }
        }
        Ok(self.pending.drain(..rows).collect())
    }

    /// More rows into `pending`: one from memory, or one chunk's from the tokenizer thread
    /// (through the shuffle buffer, which gives nothing back until it is full).
    fn refill(&mut self) -> Result<()> {
        match &mut self.supply {
            Supply::Memory(rows) => {
                let rows = rows.as_mut().ok_or(DataError::StreamClosed)?;
                self.pending.push_back(rows.next_row());
                Ok(())
            }
            Supply::Threads { rx, .. } => {
                let chunk = rx.as_ref().ok_or(DataError::StreamClosed)?.recv().map_err(|_| DataError::StreamClosed)??;
                self.absorb(chunk);
                Ok(())
            }
        }
    }

    /// Rows from the reader into `pending`, through the shuffle buffer if there is one.
    fn absorb(&mut self, rows: Vec<Row>) {
        match &mut self.supply {
            Supply::Threads { buffer: Some(b), .. } => self.pending.extend(rows.into_iter().filter_map(|r| b.push(r))),
            _ => self.pending.extend(rows),
        }
    }

    /// Ends the supply after an error: later calls get [`DataError::StreamClosed`].
    fn close(&mut self) {
        match &mut self.supply {
            Supply::Threads { rx, .. } => *rx = None,
            Supply::Memory(rows) => *rows = None,
        }
    }

    /// Position after the last batch returned (the `start` given to `new` before the first),
    /// complete: in streaming mode with the shuffle buffer's rows as they were then (rebuilt
    /// from the rows drawn since, `shuffle_buffer.rs`). What a checkpoint stores.
    pub fn position(&self) -> DataPosition {
        let mut p = self.position.clone();
        if let Supply::Threads { buffer: Some(b), .. } = &self.supply {
            let later = self.ready.iter().flat_map(|(rows, _)| rows.iter()).chain(self.pending.iter());
            (p.buffer_tokens, p.buffer_valid) = b.before(later);
        }
        p
    }

    /// The row order this stream reads in.
    pub fn order(&self) -> RowOrder {
        self.order
    }

    /// Target tokens of one pass over the training text (the passes a run makes are its
    /// target tokens over this).
    pub fn pass_size(&self) -> PassSize {
        self.pass
    }

    /// Bad lines skipped (`on_bad_line = "skip"`) in the documents consumed so far, counted
    /// from where this stream started (lines skipped before a resume point are not counted).
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }
}

impl Drop for TrainStream {
    fn drop(&mut self) {
        // Closing the receiver makes the tokenizer thread's next send fail; its exit closes
        // the reader thread's channel in turn. Both then end within one chunk of work.
        self.close();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Whether a run of `cfg` streams its training rows through the shuffle buffer (`data.shuffle`
/// with a training text above `data.in_memory_max_tokens`, as [`TrainStream::new`] decides from
/// the shards' headers or sizes), for the memory a run needs before anything is read.
///
/// # Errors
/// The shards do not expand or cannot be read (as [`TrainStream::new`] would fail).
pub fn reads_through_shuffle_buffer(cfg: &DataConfig) -> Result<bool> {
    if !cfg.shuffle {
        return Ok(false);
    }
    let shards = expand_shards(&cfg.train, "train")?;
    let headers = shard_headers(&shards)?;
    Ok(estimate_tokens(&shards, &headers)?.0 > cfg.in_memory_max_tokens)
}

/// The row order `cfg` asks for over a text of `estimate` tokens (`exact` or estimated from the
/// shards' size): file order, a seeded permutation in memory, or the shuffle buffer.
///
/// # Errors
/// [`DataError::Resume`] when `start` was written reading another order.
fn row_order(cfg: &DataConfig, start: &DataPosition, seed: u64, estimate: u64, exact: bool) -> Result<RowOrder> {
    let order = match (cfg.shuffle, estimate <= cfg.in_memory_max_tokens) {
        (false, _) => RowOrder::FileOrder,
        (true, true) => RowOrder::Permuted { seed },
        (true, false) => RowOrder::Buffered { seed, buffer: cfg.shuffle_buffer },
    };
    if !start.is_start() && start.order != order {
        return Err(DataError::Resume(format!(
            "the position was written reading {}, the config asks for {} (the text is {}{estimate} tokens, \
             data.in_memory_max_tokens = {}): set those data settings back to continue this run (data.seed \
             defaults to train.seed)",
            start.order.describe(),
            order.describe(),
            if exact { "" } else { "estimated at " },
            cfg.in_memory_max_tokens
        )));
    }
    Ok(order)
}
