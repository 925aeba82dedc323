//! Documents of a list of shards, pass after pass: text shards (C4 JSON lines and parquet,
//! [`ShardReader`]) and token shards ([`TokenShardDocs`]) alike, the shards of each pass in
//! sorted order or in a seeded permutation (streaming shuffle: llm.c's shard permutation, HF
//! datasets' `shuffle` of a streamed dataset's files).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::BadInput;
use crate::error::{DataError, Result};
use crate::order::{key, permutation, Purpose};
use crate::parquet_shard::text_bytes;
use crate::reader::{starts_with, ShardReader, GZIP_MAGIC};
use crate::text_format::TextFormat;
use crate::token_shard::{check_tokenizer, is_token_shard, read_header, TokenShardDocs, TokenShardHeader};
use crate::tokenize::Tokens;

/// A document's content: text to tokenize, or ids from a token shard (EOS included).
#[derive(Debug)]
pub(crate) enum Content {
    Text(String),
    Ids(Vec<u32>),
}

impl Content {
    /// Bytes it stands for (ids count 4 bytes, about one token of English text): sizes a chunk.
    pub fn bytes(&self) -> usize {
        match self {
            Content::Text(t) => t.len(),
            Content::Ids(ids) => 4 * ids.len(),
        }
    }
}

/// One document with the stream position right after it.
#[derive(Debug)]
pub(crate) struct Doc {
    pub content: Content,
    /// Its shard (for messages).
    pub origin: Arc<Path>,
    pub epoch: u64,
    /// Index of its shard in this pass's shard order.
    pub shard: usize,
    /// Records of `shard` consumed including this document's: lines of a JSON shard, rows of a
    /// parquet shard, documents of a token shard.
    pub line: u64,
    /// Bad lines seen since the stream was opened, including this shard so far.
    pub bad_lines: u64,
}

/// An open shard of either kind.
enum Open {
    Text(ShardReader),
    Tokens(TokenShardDocs),
}

impl Open {
    fn reader(path: &Path, on_bad: BadInput, tok: &Tokens) -> Result<Open> {
        Ok(match is_token_shard(path)? {
            true => Open::Tokens(TokenShardDocs::open(path, tok)?),
            false => Open::Text(ShardReader::open(path, on_bad)?),
        })
    }

    fn skip(&mut self, n: u64) -> Result<u64> {
        match self {
            Open::Text(r) => r.skip_lines(n),
            Open::Tokens(t) => t.skip(n),
        }
    }

    fn next(&mut self) -> Result<Option<Content>> {
        Ok(match self {
            Open::Text(r) => r.next_text()?.map(Content::Text),
            Open::Tokens(t) => t.next_doc()?.map(Content::Ids),
        })
    }

    fn line(&self) -> u64 {
        match self {
            Open::Text(r) => r.line(),
            Open::Tokens(t) => t.docs_read(),
        }
    }

    fn bad_lines(&self) -> u64 {
        match self {
            Open::Text(r) => r.bad_lines(),
            Open::Tokens(_) => 0,
        }
    }
}

/// Checks every train shard before a run claims its folder: a token shard by its header (made
/// with `tok`, holding documents), a text shard (JSON, parquet) by reading it up to its first
/// usable document. None holding text is [`DataError::NoText`]; with `on_bad_line = "fail"` a
/// bad line or corrupt gzip met on the way is its error (`file:line`); with `"skip"` a shard
/// without text is named in a warning and skipped, as the stream skips it.
///
/// # Errors
/// [`DataError::NoText`], [`DataError::TokenShard`], [`DataError::TokenizerMismatch`],
/// [`DataError::Parquet`] (a parquet shard without a `text` column), and what
/// [`ShardReader::next_text`] returns.
pub(crate) fn check_train_shards(shards: &[PathBuf], headers: &[Option<TokenShardHeader>], on_bad: BadInput, tok: &Tokens) -> Result<()> {
    refuse_text_twice(shards, headers, "train")?;
    let mut empty = Vec::new();
    for (path, header) in shards.iter().zip(headers) {
        if let Some(h) = header {
            check_tokenizer(path, h, tok)?;
            if h.documents == 0 {
                empty.push((path, 0, 0));
            }
            continue;
        }
        let mut r = ShardReader::open(path, on_bad)?;
        if r.next_text()?.is_none() {
            empty.push((path, r.line(), r.bad_lines()));
        }
    }
    if empty.len() == shards.len() {
        return Err(DataError::NoText { what: "train", shards: shards.to_vec() });
    }
    for (path, lines, bad) in empty {
        tracing::warn!("{}: no usable document ({lines} lines, {bad} bad); the stream skips this train shard", path.display());
    }
    Ok(())
}

/// The header of each token shard in `shards` (`None` for a text shard), read once for the
/// checks and the size estimate that need them.
///
/// # Errors
/// [`DataError::Io`], and a token shard's header errors.
pub(crate) fn shard_headers(shards: &[PathBuf]) -> Result<Vec<Option<TokenShardHeader>>> {
    shards.iter().map(|p| Ok(if is_token_shard(p)? { Some(read_header(p)?) } else { None })).collect()
}

/// Refuses a list that holds a token shard beside the text shard it was made from (a glob such
/// as `en-train.*` over a folder holding both): every document would be read twice. `headers`
/// are [`shard_headers`]'s.
///
/// # Errors
/// [`DataError::Config`] naming both files and `data.<what>`.
pub(crate) fn refuse_text_twice(shards: &[PathBuf], headers: &[Option<TokenShardHeader>], what: &str) -> Result<()> {
    let name = |p: &Path| p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    for (path, header) in shards.iter().zip(headers) {
        let Some(source) = header.as_ref().map(|h| &h.source) else { continue };
        if let Some(text) = shards.iter().find(|p| *p != path && name(p) == *source) {
            return Err(DataError::Config(format!(
                "data.{what} lists {} and {}, the text shard it was tokenized from: every document would be read \
                 twice; keep one of them",
                path.display(),
                text.display()
            )));
        }
    }
    Ok(())
}

/// Documents of a list of shards, optionally cycling over passes (epochs), each pass's shards
/// in sorted order or, with a shard seed, in the permutation that seed gives that pass.
pub(crate) struct DocSource {
    shards: Vec<PathBuf>,
    /// Each shard's size and modification time when the source was made: a shard changed
    /// since (replaced while the run reads the list) is said when it is opened.
    stamps: Vec<Option<Stamp>>,
    on_bad: BadInput,
    tok: Tokens,
    cycle: bool,
    /// Seed of the shard permutation of each pass; `None`: sorted order.
    shard_seed: Option<u64>,
    /// This pass's shard order: `order[i]` is the index in `shards` of the i-th shard read.
    order: Vec<usize>,
    epoch: u64,
    shard: usize,
    skip: u64,
    current: Option<(Open, Arc<Path>)>,
    bad_before_shard: u64,
    /// Whether the current epoch began at its first line (so "no documents" means none at all).
    whole_epoch: bool,
    docs_this_epoch: u64,
}

impl DocSource {
    /// Starts at `(epoch, shard, line)` (`shard` indexes that pass's order): `line` records
    /// (lines, parquet rows, token-shard documents) of that shard are skipped unread.
    ///
    /// # Errors
    /// [`DataError::BadPosition`] when `shard` is past the list.
    pub fn new(
        shards: Vec<PathBuf>,
        on_bad: BadInput,
        tok: &Tokens,
        cycle: bool,
        shard_seed: Option<u64>,
        (epoch, shard, line): (u64, usize, u64),
    ) -> Result<Self> {
        if shard > shards.len() || (shard == shards.len() && line > 0) {
            return Err(DataError::BadPosition { shard, count: shards.len() });
        }
        let order = pass_order(shards.len(), shard_seed, epoch);
        Ok(Self {
            stamps: shards.iter().map(|p| stamp(p)).collect(),
            whole_epoch: shard == 0 && line == 0,
            shards,
            on_bad,
            tok: tok.clone(),
            cycle,
            shard_seed,
            order,
            epoch,
            shard,
            skip: line,
            current: None,
            bad_before_shard: 0,
            docs_this_epoch: 0,
        })
    }

    /// The next document, `None` when the shards are exhausted and `cycle` is off.
    pub fn next_doc(&mut self) -> Result<Option<Doc>> {
        loop {
            if self.current.is_none() {
                if self.shard >= self.shards.len() {
                    if !self.cycle {
                        return Ok(None);
                    }
                    if self.whole_epoch && self.docs_this_epoch == 0 {
                        return Err(DataError::NoText { what: "train", shards: self.shards.clone() });
                    }
                    self.epoch += 1;
                    self.shard = 0;
                    self.order = pass_order(self.shards.len(), self.shard_seed, self.epoch);
                    self.whole_epoch = true;
                    self.docs_this_epoch = 0;
                    // (debug: the reader runs megabytes ahead; the trainer logs when training reaches the epoch)
                    tracing::debug!(
                        epoch = self.epoch,
                        shards = self.shards.len(),
                        "reader reached the end of the train shards; next epoch"
                    );
                }
                let path = &self.shards[self.order[self.shard]];
                if stamp(path) != self.stamps[self.order[self.shard]] {
                    tracing::warn!(
                        "{}: changed since the run started (size or modification time): read as it is now, so the rows \
                         from it are not those a run reading it before would see",
                        path.display()
                    );
                    self.stamps[self.order[self.shard]] = stamp(path);
                }
                let mut r = Open::reader(path, self.on_bad, &self.tok)?;
                if self.skip > 0 {
                    let n = r.skip(self.skip)?;
                    if n < self.skip {
                        tracing::warn!("{}: resume position is line {} but the shard has only {n} lines", path.display(), self.skip);
                    }
                    self.skip = 0;
                }
                self.current = Some((r, path.as_path().into()));
            }
            let (r, origin) = self.current.as_mut().expect("shard open");
            match r.next()? {
                Some(content) => {
                    self.docs_this_epoch += 1;
                    return Ok(Some(Doc {
                        content,
                        origin: Arc::clone(origin),
                        epoch: self.epoch,
                        shard: self.shard,
                        line: r.line(),
                        bad_lines: self.bad_before_shard + r.bad_lines(),
                    }));
                }
                None => {
                    self.bad_before_shard += r.bad_lines();
                    self.current = None;
                    self.shard += 1;
                }
            }
        }
    }

    /// Bad lines seen so far.
    pub fn bad_lines(&self) -> u64 {
        self.bad_before_shard + self.current.as_ref().map_or(0, |(r, _)| r.bad_lines())
    }
}

/// A file's size and modification time.
type Stamp = (u64, std::time::SystemTime);

/// `path`'s [`Stamp`], `None` when it cannot be read (opening it then says why).
fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// An identity of the text in `shards`: CRC-32 of each file's name and size, in order. A
/// resume compares it with the position's ([`crate::DataPosition::shards_id`]).
pub(crate) fn shards_id(shards: &[PathBuf]) -> String {
    let mut h = crc32fast::Hasher::new();
    for p in shards {
        let name = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        h.update(format!("{name}\t{}\n", stamp(p).map_or(0, |s| s.0)).as_bytes());
    }
    format!("{:08x}", h.finalize())
}

/// The shard order of pass `epoch`: sorted, or the seed's permutation for that pass.
fn pass_order(n: usize, seed: Option<u64>, epoch: u64) -> Vec<usize> {
    match seed {
        None => (0..n).collect(),
        Some(s) => permutation(n, key(s, Purpose::Shards, epoch)).into_iter().map(|i| i as usize).collect(),
    }
}

/// Tokens of the training text in `shards` (with their [`shard_headers`]), and whether the
/// count is exact: a token shard's header is; a JSON shard is estimated from its size, one
/// token per byte of gzip file (measured 0.8-0.9 tokens per byte on the offline corpora, ~0.5
/// on C4, whose lines also hold a URL and a timestamp) and one per four bytes of plain JSON
/// (English text runs ~4.5 bytes per T5 token); a parquet shard at one token per four bytes
/// of its `text` column uncompressed (its footer's sizes).
///
/// # Errors
/// [`DataError::Io`] for a JSON shard's size; [`DataError::Parquet`] for a parquet shard's
/// footer.
pub(crate) fn estimate_tokens(shards: &[PathBuf], headers: &[Option<TokenShardHeader>]) -> Result<(u64, bool)> {
    let (mut tokens, mut exact) = (0u64, true);
    for (path, header) in shards.iter().zip(headers) {
        if let Some(h) = header {
            tokens += h.tokens;
            continue;
        }
        tokens += match TextFormat::of(path) {
            TextFormat::Parquet => text_bytes(path)? / 4,
            TextFormat::Json => {
                let bytes = std::fs::metadata(path).map_err(|error| DataError::Io { path: path.clone(), error })?.len();
                bytes / if starts_with(path, &GZIP_MAGIC)? { 1 } else { 4 }
            }
        };
        exact = false;
    }
    Ok((tokens, exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pass_reads_the_shards_in_its_own_order() {
        assert_eq!(pass_order(6, None, 3), vec![0, 1, 2, 3, 4, 5], "file order: sorted, every pass");
        let passes: Vec<Vec<usize>> = (0..8).map(|e| pass_order(6, Some(0), e)).collect();
        for p in &passes {
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4, 5], "a permutation: {p:?}");
        }
        assert!(passes.windows(2).all(|w| w[0] != w[1]), "a new order each pass: {passes:?}");
        assert_eq!(passes[5], pass_order(6, Some(0), 5), "a function of the seed and the pass");
        assert_ne!(passes[5], pass_order(6, Some(1), 5), "another seed, another order");
    }
}
