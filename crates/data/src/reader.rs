//! Streaming reader of text shards: C4-format JSON lines and parquet files.
//!
//! C4 (`allenai/c4`, `en`) is published as `c4-train.XXXXX-of-01024.json.gz` and
//! `c4-validation.XXXXX-of-00008.json.gz`: gzip-compressed JSON lines, one document per line,
//! `{"text": ..., "timestamp": ..., "url": ...}`. Only `text` is used. Gzip is recognised by
//! its magic bytes, so plain `.json` works too; concatenated gzip members (as written by `cat
//! a.gz b.gz`) are read as one stream.
//!
//! FineWeb, FineWeb-Edu and most corpora on the Hugging Face hub are parquet files
//! (`*.parquet`, told apart by that name ending): one document per row, its text in the
//! string column `text` ([`crate::parquet_shard`]).
//!
//! Both are read record by record (a line, a row; never whole into memory) by one
//! [`ShardReader`], which treats their bad records, corrupt bytes and resume positions alike.

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
use crate::parquet_shard::ParquetRows;
use crate::records::{Record, Records};
use crate::text_format::TextFormat;

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

/// The lines of a JSON-lines shard, gunzipped when it is gzip.
struct JsonLines {
    reader: Box<dyn BufRead + Send>,
    /// Lines consumed so far (= 1-based number of the last line read).
    line: u64,
    buf: Vec<u8>,
}

impl JsonLines {
    /// A reader of the open `file` at `path`, gzip when it starts with gzip's magic bytes.
    fn new(file: File, path: &Path) -> Result<JsonLines> {
        let mut raw = BufReader::with_capacity(1 << 16, file);
        let is_gz = raw.fill_buf().map_err(|error| DataError::Io { path: path.to_path_buf(), error })?.starts_with(&GZIP_MAGIC);
        let reader: Box<dyn BufRead + Send> =
            if is_gz { Box::new(BufReader::with_capacity(1 << 16, MultiGzDecoder::new(raw))) } else { Box::new(raw) };
        Ok(JsonLines { reader, line: 0, buf: Vec::with_capacity(1 << 14) })
    }

    /// The next raw line into `buf`; false at the end.
    fn read_line(&mut self) -> std::io::Result<bool> {
        self.buf.clear();
        let more = self.reader.read_until(b'\n', &mut self.buf)? > 0;
        self.line += u64::from(more);
        Ok(more)
    }
}

impl Records for JsonLines {
    fn next_record(&mut self) -> std::io::Result<Option<Record>> {
        if !self.read_line()? {
            return Ok(None);
        }
        if self.buf.trim_ascii().is_empty() {
            return Ok(Some(Record::Blank)); // a blank line holds no document, and is no error
        }
        Ok(Some(match serde_json::from_slice::<C4Line>(&self.buf) {
            Ok(l) => Record::Text(l.text.into_owned()),
            Err(e) if e.is_syntax() || e.is_eof() => Record::Bad(format!("not JSON ({e})")),
            Err(e) => Record::Bad(format!("not a C4 object with a string `text` ({e})")),
        }))
    }

    fn skip_records(&mut self, n: u64) -> std::io::Result<u64> {
        let start = self.line;
        while self.line - start < n && self.read_line()? {}
        Ok(self.line - start)
    }

    fn consumed(&self) -> u64 {
        self.line
    }
}

/// Reads the documents of one text shard (JSON lines or parquet, [`TextFormat::of`]), record
/// by record: a line, a row.
///
/// Bad records (a line that is not JSON or has no string `text`; a row whose `text` is null or
/// not UTF-8) are handled per [`BadInput`]: skipped with a warning naming `file:line` (the
/// 1-based line or row) and counted in [`ShardReader::bad_lines`], or returned as
/// [`DataError::BadLine`]. Corrupt or truncated bytes (gzip, a parquet page) end the shard with
/// a warning (`Skip`) or are returned as [`DataError::Corrupt`] (`Fail`). Records whose `text`
/// is empty or only whitespace, and blank lines, are passed over silently (they hold no
/// tokens). Each warning is logged once per process for a file and record, however often the
/// shard is read.
pub struct ShardReader {
    path: PathBuf,
    format: TextFormat,
    records: Box<dyn Records>,
    on_bad: BadInput,
    bad_lines: u64,
    docs: u64,
    done: bool,
}

impl ShardReader {
    /// Opens a shard: parquet for a name ending in `.parquet`, else JSON lines (gzip or plain).
    ///
    /// # Errors
    /// [`DataError::Io`] if the file cannot be opened; for parquet, [`DataError::Parquet`] when
    /// it is not a parquet file or has no string column `text` (whatever `on_bad`: nothing of
    /// it could be read).
    pub fn open(path: &Path, on_bad: BadInput) -> Result<Self> {
        let file = File::open(path).map_err(|error| DataError::Io { path: path.to_path_buf(), error })?;
        let format = TextFormat::of(path);
        let records: Box<dyn Records> = match format {
            TextFormat::Json => Box::new(JsonLines::new(file, path)?),
            TextFormat::Parquet => Box::new(ParquetRows::new(file, path)?),
        };
        Ok(Self { path: path.to_path_buf(), format, records, on_bad, bad_lines: 0, docs: 0, done: false })
    }

    /// The shard's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The shard's format.
    pub fn format(&self) -> TextFormat {
        self.format
    }

    /// Records consumed so far, i.e. the 1-based number of the last line (or parquet row) read
    /// (0 at the start).
    pub fn line(&self) -> u64 {
        self.records.consumed()
    }

    /// Bad records skipped so far (only with [`BadInput::Skip`]).
    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }

    /// Skips `n` records (lines, rows) without decoding them (used to resume; a parquet
    /// shard passes over whole row groups unread). Returns how many were actually skipped
    /// (fewer if the shard ends first).
    ///
    /// # Errors
    /// As [`ShardReader::next_text`] for corrupt bytes.
    pub fn skip_lines(&mut self, n: u64) -> Result<u64> {
        if self.done {
            return Ok(0);
        }
        let start = self.line();
        if let Err(source) = self.records.skip_records(n) {
            self.corrupt(source)?;
        }
        Ok(self.line() - start)
    }

    /// Ends the shard at corrupt bytes: an error with [`BadInput::Fail`], a warning with `Skip`.
    fn corrupt(&mut self, source: std::io::Error) -> Result<()> {
        self.done = true;
        let (path, format, line) = (&self.path, self.format, self.line());
        match self.on_bad {
            BadInput::Fail => Err(DataError::Corrupt { path: path.clone(), format, line, error: source }),
            BadInput::Skip => {
                warn_once(
                    path,
                    line + 1,
                    format_args!(
                        "{}: corrupt or truncated {} after {} {line}: {source}; skipping the rest of this shard",
                        path.display(),
                        format.stream(),
                        format.unit()
                    ),
                );
                Ok(())
            }
        }
    }

    /// The next record, `None` at the end of the shard (or after corrupt bytes were skipped).
    fn next_record(&mut self) -> Result<Option<Record>> {
        if self.done {
            return Ok(None);
        }
        match self.records.next_record() {
            Ok(Some(r)) => Ok(Some(r)),
            Ok(None) => {
                self.done = true;
                if self.line() == 0 {
                    let unit = self.format.unit();
                    warn_once(&self.path, 0, format_args!("{}: empty shard (no {unit}s)", self.path.display()));
                }
                Ok(None)
            }
            Err(source) => self.corrupt(source).map(|()| None),
        }
    }

    /// The `text` of the next document, or `None` at the end of the shard.
    ///
    /// # Errors
    /// With [`BadInput::Fail`]: [`DataError::BadLine`] naming `file:line`, or
    /// [`DataError::Corrupt`] naming the file. With `Skip` only I/O errors are returned.
    pub fn next_text(&mut self) -> Result<Option<String>> {
        loop {
            let msg = match self.next_record()? {
                None => return Ok(None),
                Some(Record::Blank) => continue,
                Some(Record::Text(text)) if text.trim().is_empty() => continue,
                Some(Record::Text(text)) => {
                    self.docs += 1;
                    return Ok(Some(text));
                }
                Some(Record::Bad(msg)) => msg,
            };
            let (path, format, line) = (&self.path, self.format, self.line());
            match self.on_bad {
                BadInput::Fail => return Err(DataError::BadLine { path: path.clone(), format, line, msg }),
                BadInput::Skip => {
                    self.bad_lines += 1;
                    warn_once(path, line, format_args!("{}:{line}: skipping bad {}: {msg}", path.display(), format.record()));
                }
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
