//! Parquet text shards: one document per row, its text in the string column `text` (FineWeb,
//! FineWeb-Edu, and most text corpora on the Hugging Face hub; their other columns, `id`,
//! `url`, `score`, ..., are not read).
//!
//! Only the `text` column is read, a batch of rows at a time, through the `parquet` crate's
//! column reader (no Arrow): a row group's pages are decompressed one after the other (snappy
//! and zstd, the codecs the hub's parquet files use; another codec is refused at open, naming
//! it), so memory holds one page and one batch of texts, whatever the file's size. A row whose
//! `text` is null, or not UTF-8, is a bad record ([`crate::ShardReader`] skips or refuses it
//! per `data.on_bad_line`). The position in a shard is the rows consumed; a resume passes over
//! whole row groups by their row counts in the footer, unread, then skips the rest inside one.

use std::collections::VecDeque;
use std::fs::File;
use std::path::Path;

use parquet::basic::{Compression, Type as PhysicalType};
use parquet::column::reader::{get_typed_column_reader, ColumnReaderImpl};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::error::{DataError, Result};
use crate::records::{Record, Records};

/// The column that holds each row's document.
pub(crate) const TEXT_COLUMN: &str = "text";

/// Rows decoded per call of the column reader: ~0.5 MB of FineWeb-Edu text (~5 kB a document).
const BATCH_ROWS: usize = 128;

/// The rows of a parquet shard's `text` column, in file order.
pub(crate) struct ParquetRows {
    file: SerializedFileReader<File>,
    /// Index of the `text` leaf column, and its largest definition level (0: required, every
    /// row holds a value; 1: optional, a row below it is null).
    column: usize,
    max_def: i16,
    /// Rows of each row group (the footer's counts).
    group_rows: Vec<u64>,
    /// The next row group to open.
    next_group: usize,
    /// The open row group's reader and its rows not yet decoded.
    reader: Option<ColumnReaderImpl<ByteArrayType>>,
    left_in_group: u64,
    /// Decoded rows not yet returned (`None`: a null text).
    batch: VecDeque<Option<ByteArray>>,
    consumed: u64,
}

/// A [`DataError::Parquet`] for `path`.
fn unusable(path: &Path, msg: impl std::fmt::Display) -> DataError {
    DataError::Parquet { path: path.to_path_buf(), msg: msg.to_string() }
}

/// The footer of the parquet file at `path` and the index of its `text` column.
///
/// # Errors
/// [`DataError::Parquet`]: not a parquet file, no top-level string column `text` (the
/// message names the columns there are), or one compressed with a codec other than snappy
/// and zstd.
fn open_text_column(file: File, path: &Path) -> Result<(SerializedFileReader<File>, usize)> {
    let reader = SerializedFileReader::new(file).map_err(|e| unusable(path, e))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let Some(column) = schema.columns().iter().position(|c| c.path().parts() == [TEXT_COLUMN]) else {
        let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        return Err(unusable(path, format!("no column `{TEXT_COLUMN}` (its columns: {})", names.join(", "))));
    };
    let c = schema.column(column);
    if c.physical_type() != PhysicalType::BYTE_ARRAY {
        return Err(unusable(path, format!("column `{TEXT_COLUMN}` holds {} values, not strings", c.physical_type())));
    }
    if c.max_rep_level() > 0 {
        return Err(unusable(path, format!("column `{TEXT_COLUMN}` is repeated (a list), not one string per row")));
    }
    for (g, group) in reader.metadata().row_groups().iter().enumerate() {
        let codec = match group.column(column).compression() {
            Compression::UNCOMPRESSED | Compression::SNAPPY | Compression::ZSTD(_) => continue,
            Compression::GZIP(_) => "gzip",
            Compression::LZO => "lzo",
            Compression::BROTLI(_) => "brotli",
            Compression::LZ4 | Compression::LZ4_RAW => "lz4",
        };
        return Err(unusable(
            path,
            format!(
                "column `{TEXT_COLUMN}` of row group {g} is compressed with {codec}, and this build reads snappy, zstd \
                 and uncompressed parquet (the hub's codecs): write it again with one of those (pyarrow: \
                 `compression=\"zstd\"`)"
            ),
        ));
    }
    Ok((reader, column))
}

/// Bytes of `text` in the parquet file at `path`, uncompressed (the footer's sizes of its
/// column chunks: the strings, their 4-byte lengths and the page headers), read from the
/// footer alone: sizes the text for [`crate::DataConfig::in_memory_max_tokens`].
///
/// # Errors
/// [`DataError::Io`] if the file cannot be opened; [`DataError::Parquet`] as [`ParquetRows::new`].
pub(crate) fn text_bytes(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|error| DataError::Io { path: path.to_path_buf(), error })?;
    let (reader, column) = open_text_column(file, path)?;
    Ok(reader.metadata().row_groups().iter().map(|g| g.column(column).uncompressed_size().max(0) as u64).sum())
}

impl ParquetRows {
    /// The rows of the open parquet `file` at `path`, from the first.
    ///
    /// # Errors
    /// [`DataError::Parquet`]: not a parquet file (no footer, or a corrupt one), no
    /// top-level string column `text`, or one compressed with a codec other than snappy and
    /// zstd.
    pub fn new(file: File, path: &Path) -> Result<ParquetRows> {
        let (file, column) = open_text_column(file, path)?;
        let max_def = file.metadata().file_metadata().schema_descr().column(column).max_def_level();
        let group_rows = file.metadata().row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect();
        Ok(ParquetRows {
            file,
            column,
            max_def,
            group_rows,
            next_group: 0,
            reader: None,
            left_in_group: 0,
            batch: VecDeque::new(),
            consumed: 0,
        })
    }

    /// Opens the next row group that holds rows; false after the last.
    fn open_group(&mut self) -> std::io::Result<bool> {
        while self.next_group < self.group_rows.len() {
            let g = self.next_group;
            self.next_group += 1;
            if self.group_rows[g] == 0 {
                continue;
            }
            let group = self.file.get_row_group(g).map_err(|e| broken(g, e))?;
            let reader = group.get_column_reader(self.column).map_err(|e| broken(g, e))?;
            self.reader = Some(get_typed_column_reader::<ByteArrayType>(reader));
            self.left_in_group = self.group_rows[g];
            return Ok(true);
        }
        Ok(false)
    }

    /// Decodes the next batch of rows into `batch`; false at the end of the file.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.left_in_group == 0 && !self.open_group()? {
            return Ok(false);
        }
        let group = self.next_group - 1;
        let reader = self.reader.as_mut().expect("a row group is open");
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        let want = (self.left_in_group as usize).min(BATCH_ROWS);
        let (rows, _, _) = reader.read_records(want, Some(&mut defs), None, &mut values).map_err(|e| broken(group, e))?;
        if rows == 0 {
            let msg = format!("its pages end {} rows before the footer's count", self.left_in_group);
            return Err(broken(group, msg));
        }
        self.left_in_group -= rows as u64;
        let mut values = values.into_iter();
        match self.max_def {
            0 => self.batch.extend(values.map(Some)),
            max => self.batch.extend(defs.iter().map(|&d| if d == max { values.next() } else { None })),
        }
        Ok(true)
    }
}

/// The error of row group `group`'s bytes: corrupt, truncated, or compressed with a codec
/// this build lacks.
fn broken(group: usize, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("row group {group}: {e}"))
}

impl Records for ParquetRows {
    fn next_record(&mut self) -> std::io::Result<Option<Record>> {
        while self.batch.is_empty() {
            if !self.fill()? {
                return Ok(None);
            }
        }
        let value = self.batch.pop_front().expect("a decoded row");
        self.consumed += 1;
        Ok(Some(match value {
            None => Record::Bad(format!("`{TEXT_COLUMN}` is null")),
            Some(v) => match String::from_utf8(v.data().to_vec()) {
                Ok(text) => Record::Text(text),
                Err(e) => Record::Bad(format!("`{TEXT_COLUMN}` is not UTF-8 ({e})")),
            },
        }))
    }

    fn skip_records(&mut self, n: u64) -> std::io::Result<u64> {
        let start = self.consumed;
        let mut left = n;
        // rows already decoded first, then whole row groups unread, then rows inside one
        let buffered = left.min(self.batch.len() as u64);
        self.batch.drain(..buffered as usize);
        (self.consumed, left) = (self.consumed + buffered, left - buffered);
        while left > 0 {
            if self.left_in_group == 0 {
                match self.group_rows.get(self.next_group) {
                    None => break,
                    Some(&rows) if rows <= left => {
                        self.next_group += 1;
                        (self.consumed, left) = (self.consumed + rows, left - rows);
                        continue;
                    }
                    Some(_) => {
                        self.open_group()?;
                    }
                }
            }
            let group = self.next_group - 1;
            let want = left.min(self.left_in_group);
            let reader = self.reader.as_mut().expect("a row group is open");
            let skipped = reader.skip_records(want as usize).map_err(|e| broken(group, e))? as u64;
            if skipped == 0 {
                return Err(broken(group, format!("its pages end {} rows before the footer's count", self.left_in_group)));
            }
            self.left_in_group -= skipped;
            (self.consumed, left) = (self.consumed + skipped, left - skipped);
        }
        Ok(self.consumed - start)
    }

    fn consumed(&self) -> u64 {
        self.consumed
    }
}
