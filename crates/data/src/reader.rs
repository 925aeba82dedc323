//! Streaming reader of C4-format shards.
//!
//! C4 (`allenai/c4`, `en`) is published as `c4-train.XXXXX-of-01024.json.gz` and
//! `c4-validation.XXXXX-of-00008.json.gz`: gzip-compressed JSON lines, one document per line,
//! `{"text": ..., "timestamp": ..., "url": ...}`. Only `text` is used. Shards are read line by
//! line (never whole into memory), in sorted path order, without shuffling (C4 shards are
//! already shuffled). Gzip is recognised by its magic bytes, so plain `.json` works too;
//! concatenated gzip members (as written by `cat a.gz b.gz`) are read as one stream.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;

use crate::config::BadInput;
use crate::error::{DataError, Result};

/// Expands file paths and glob patterns into the sorted, de-duplicated list of shards.
///
/// `what` ("train" / "validation") only labels error messages.
///
/// # Errors
/// [`DataError::MissingFile`] for a plain path that does not exist, [`DataError::IsFolder`]
/// for one that is a folder, [`DataError::NoMatch`]
/// for a pattern that matches nothing, [`DataError::BadPattern`] for a malformed pattern.
pub fn expand_shards(patterns: &[String], what: &'static str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for pattern in patterns {
        let is_glob = pattern.contains(['*', '?', '[']);
        if !is_glob {
            let p = PathBuf::from(pattern);
            if p.is_dir() {
                return Err(DataError::IsFolder { what, pattern: pattern.clone() });
            }
            if !p.is_file() {
                return Err(DataError::MissingFile { what, pattern: pattern.clone() });
            }
            out.push(p);
            continue;
        }
        let paths = glob::glob(pattern).map_err(|e| DataError::BadPattern { what, pattern: pattern.clone(), msg: e.to_string() })?;
        let before = out.len();
        for entry in paths {
            let p = entry.map_err(|e| DataError::Io {
                path: e.path().to_path_buf(),
                error: std::io::Error::new(e.error().kind(), e.error().to_string()),
            })?;
            if p.is_file() {
                out.push(p);
            }
        }
        if out.len() == before {
            return Err(DataError::NoMatch { what, pattern: pattern.clone() });
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Whether the file at `path` starts with the bytes `magic` (gzip's `1f 8b`, zstd's frame
/// magic): how shards are told apart, whatever their names.
///
/// # Errors
/// [`DataError::Io`] when the file cannot be read.
pub(crate) fn starts_with(path: &Path, magic: &[u8]) -> Result<bool> {
    let io_err = |error| DataError::Io { path: path.to_path_buf(), error };
    let mut head = vec![0u8; magic.len()];
    let mut f = File::open(path).map_err(io_err)?;
    let mut got = 0;
    while got < head.len() {
        match std::io::Read::read(&mut f, &mut head[got..]).map_err(io_err)? {
            0 => return Ok(false),
            n => got += n,
        }
    }
    Ok(head == magic)
}

/// The first two bytes of every gzip member (RFC 1952, 2.3.1).
pub(crate) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Log `msg` as a warning the first time this process meets `(path, line)`: shards are read
/// more than once (validation, overlap sample, each epoch, read-ahead), a bad line is one
/// problem however often it is read.
fn warn_once(path: &Path, line: u64, msg: std::fmt::Arguments) {
    static SEEN: Mutex<Option<HashSet<(PathBuf, u64)>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert((path.to_path_buf(), line)) {
        tracing::warn!("{msg}");
    }
}

/// The one field of a C4 line we need; `timestamp`, `url` and anything else are ignored.
#[derive(Deserialize)]
struct C4Line<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

/// Reads the documents of one shard, line by line.
///
/// Bad lines (not JSON, or no string `text`) are handled per [`BadInput`]: skipped with a
/// warning naming `file:line` and counted in [`ShardReader::bad_lines`], or returned as
/// [`DataError::BadLine`]. A corrupt or truncated gzip stream ends the shard with a warning
/// (`Skip`) or is returned as [`DataError::Corrupt`] (`Fail`). Lines whose `text` is empty or
/// only whitespace, and blank lines, are passed over silently (they hold no tokens). Each
/// warning is logged once per process for a file and line, however often the shard is read.
pub struct ShardReader {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    on_bad: BadInput,
    /// Lines consumed so far (= 1-based number of the last line read).
    line: u64,
    bad_lines: u64,
    docs: u64,
    buf: Vec<u8>,
    done: bool,
}

impl ShardReader {
    /// Opens a shard (gzip or plain JSON lines).
    ///
    /// # Errors
    /// [`DataError::Io`] if the file cannot be opened.
    pub fn open(path: &Path, on_bad: BadInput) -> Result<Self> {
        let io_err = |error| DataError::Io { path: path.to_path_buf(), error };
        let file = File::open(path).map_err(io_err)?;
        let mut raw = BufReader::with_capacity(1 << 16, file);
        let is_gz = raw.fill_buf().map_err(io_err)?.starts_with(&GZIP_MAGIC);
        let reader: Box<dyn BufRead + Send> =
            if is_gz { Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(raw))) } else { Box::new(raw) };
        Ok(Self { path: path.to_path_buf(), reader, on_bad, line: 0, bad_lines: 0, docs: 0, buf: Vec::with_capacity(1 << 14), done: false })
    }

    /// The shard's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines consumed so far, i.e. the 1-based number of the last line read (0 at the start).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Bad lines skipped so far (only with [`BadInput::Skip`]).
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }

    /// Skips `n` lines without parsing them (used to resume). Returns how many lines were
    /// actually skipped (fewer if the shard ends first).
    ///
    /// # Errors
    /// As [`ShardReader::next_text`] for a corrupt stream.
    pub fn skip_lines(&mut self, n: u64) -> Result<u64> {
        let mut skipped = 0;
        while skipped < n {
            match self.read_raw_line()? {
                true => skipped += 1,
                false => break,
            }
        }
        Ok(skipped)
    }

    /// Reads one raw line into `self.buf`; false at the end of the shard (or after a corrupt
    /// stream was skipped).
    fn read_raw_line(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        self.buf.clear();
        match self.reader.read_until(b'\n', &mut self.buf) {
            Ok(0) => {
                self.done = true;
                if self.line == 0 {
                    warn_once(&self.path, 0, format_args!("{}: empty shard (no lines)", self.path.display()));
                }
                Ok(false)
            }
            Ok(_) => {
                self.line += 1;
                Ok(true)
            }
            Err(error) => {
                self.done = true;
                match self.on_bad {
                    BadInput::Fail => Err(DataError::Corrupt { path: self.path.clone(), line: self.line, error }),
                    BadInput::Skip => {
                        warn_once(
                            &self.path,
                            self.line + 1,
                            format_args!(
                                "{}: corrupt or truncated gzip stream after line {}: {error}; skipping the \
                                 rest of this shard",
                                self.path.display(),
                                self.line
                            ),
                        );
                        Ok(false)
                    }
                }
            }
        }
    }

    /// The `text` of the next document, or `None` at the end of the shard.
    ///
    /// # Errors
    /// With [`BadInput::Fail`]: [`DataError::BadLine`] naming `file:line`, or
    /// [`DataError::Corrupt`] naming the file. With `Skip` only I/O errors are returned.
    pub fn next_text(&mut self) -> Result<Option<String>> {
        loop {
            if !self.read_raw_line()? {
                return Ok(None);
            }
            if self.buf.trim_ascii().is_empty() {
                continue; // a blank line holds no document, and is no error
            }
            let parsed = match serde_json::from_slice::<C4Line>(&self.buf) {
                Ok(l) => Ok(l.text),
                Err(e) if e.is_syntax() || e.is_eof() => Err(format!("not JSON ({e})")),
                Err(e) => Err(format!("not a C4 object with a string `text` ({e})")),
            };
            match parsed {
                Ok(text) => {
                    if text.trim().is_empty() {
                        continue;
                    }
                    self.docs += 1;
                    return Ok(Some(text.into_owned()));
                }
                Err(msg) => match self.on_bad {
                    BadInput::Fail => return Err(DataError::BadLine { path: self.path.clone(), line: self.line, msg }),
                    BadInput::Skip => {
                        self.bad_lines += 1;
                        warn_once(
                            &self.path,
                            self.line,
                            format_args!("{}:{}: skipping bad C4 line: {msg}", self.path.display(), self.line),
                        );
                    }
                },
            }
        }
    }

    /// Reads the rest of the shard and returns how many documents it held.
    ///
    /// # Errors
    /// As [`ShardReader::next_text`].
    pub fn count_documents(mut self) -> Result<u64> {
        while self.next_text()?.is_some() {}
        Ok(self.docs)
    }
}

impl Iterator for ShardReader {
    type Item = Result<String>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_text().transpose()
    }
}
