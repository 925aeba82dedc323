//! The kinds of text shard ([`TextFormat`]): C4's JSON lines (gzip or plain) and parquet,
//! told apart by the file name, and what each calls its records in messages.

use std::path::Path;

/// The kind of a text shard, from its file name: `*.parquet` is parquet, anything else C4 JSON
/// lines (gzip or plain). Says what its records are called in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// JSON lines, gzip-compressed or plain: a record is a line.
    Json,
    /// A parquet file: a record is a row.
    Parquet,
}

impl TextFormat {
    /// The format of the shard at `path`: [`TextFormat::Parquet`] for a name ending in
    /// `.parquet` (any case), else [`TextFormat::Json`].
    pub fn of(path: &Path) -> TextFormat {
        match path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet")) {
            true => TextFormat::Parquet,
            false => TextFormat::Json,
        }
    }

    /// A record, in messages: `C4 line`, `parquet row`.
    pub fn record(self) -> &'static str {
        match self {
            TextFormat::Json => "C4 line",
            TextFormat::Parquet => "parquet row",
        }
    }

    /// What the records are counted in: `line`, `row`.
    pub fn unit(self) -> &'static str {
        match self {
            TextFormat::Json => "line",
            TextFormat::Parquet => "row",
        }
    }

    /// The bytes that can be corrupt: `gzip stream`, `parquet data`.
    pub fn stream(self) -> &'static str {
        match self {
            TextFormat::Json => "gzip stream",
            TextFormat::Parquet => "parquet data",
        }
    }
}
