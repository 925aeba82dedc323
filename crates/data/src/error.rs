//! The one error type of this crate. Every variant names the file (and the line, where there
//! is one) and says what is wrong, so a message in a training log is enough to find the
//! offending input.

use std::path::PathBuf;

use crate::text_format::TextFormat;

/// Everything that can go wrong while reading shards, tokenizing or batching.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A `[data]` setting is out of range (e.g. `seq_len = 0`, no train patterns).
    #[error("invalid [data] config: {0}")]
    Config(String),

    /// A plain path (no `*`, `?`, `[`) in `train`/`validation` does not exist.
    #[error("{what} shard '{pattern}' does not exist")]
    MissingFile { what: &'static str, pattern: String },

    /// A plain path in `train`/`validation` is a folder.
    #[error("{what} shard '{pattern}' is a folder, not a shard file: list its files, or use a glob such as '{pattern}/*.json.gz'")]
    IsFolder { what: &'static str, pattern: String },

    /// A glob pattern in `train`/`validation` matched no file.
    #[error("{what} pattern '{pattern}' matched no file")]
    NoMatch { what: &'static str, pattern: String },

    /// A glob pattern is malformed.
    #[error("{what} pattern '{pattern}' is not a valid glob: {msg}")]
    BadPattern { what: &'static str, pattern: String, msg: String },

    /// A shard could not be opened or read (permissions, I/O error before any decoding). The
    /// OS error is part of the message, not a separate `source` (which `{:#}` would print
    /// again).
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },

    /// A file could not be created or written (a token shard of `train data tokenize`); the
    /// OS error is part of the message, as for [`DataError::Io`].
    #[error("cannot write {}: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },

    /// The gzip stream of a JSON shard, or a page of a parquet shard, is corrupt or truncated
    /// (raised with `on_bad_line = "fail"`; with `"skip"` the rest of the shard is skipped
    /// with a warning). `line`: the lines (rows) read before it. The error is part of the
    /// message, as for [`DataError::Io`].
    #[error("corrupt or truncated {} in {} after {} {line}: {error}", format.stream(), path.display(), format.unit())]
    Corrupt { path: PathBuf, format: TextFormat, line: u64, error: std::io::Error },

    /// A line is not a JSON object with a string `text` field, or a parquet row's `text` is
    /// null or not UTF-8 (raised with `on_bad_line = "fail"`; `line` is the 1-based line or
    /// row).
    #[error("{}:{line}: bad {}: {msg}", path.display(), format.record())]
    BadLine { path: PathBuf, format: TextFormat, line: u64, msg: String },

    /// A `.parquet` shard cannot be read as a text shard: not a parquet file (its footer is
    /// missing or corrupt), or without a string column `text` (the message lists its columns).
    /// Raised whatever `on_bad_line` says: none of its rows could be read.
    #[error("{}: not a usable parquet shard: {msg}", path.display())]
    Parquet { path: PathBuf, msg: String },

    /// The shards hold no usable document (a whole epoch over the train shards, or all the
    /// validation shards, gave no row).
    #[error(
        "no {what} text: the {what} shards {shards:?} contain no usable document (empty, or only \
         bad lines or rows or corrupt bytes, which `data.on_bad_line = \"skip\"` skips with a warning; \
         \"fail\" stops at the first)"
    )]
    NoText { what: &'static str, shards: Vec<PathBuf> },

    /// A resume position does not fit the shard list (shards added or removed since the
    /// checkpoint was written).
    #[error("resume position refers to shard {shard}, but only {count} train shards match the config")]
    BadPosition { shard: usize, count: usize },

    /// The tokenizer file could not be loaded, lacks an EOS token, or the hub id could not
    /// be resolved (see the message for how to fix it).
    #[error("tokenizer '{spec}': {msg}")]
    Tokenizer { spec: String, msg: String },

    /// Encoding a document failed inside the `tokenizers` crate. `origin` is the shard path
    /// (or `<text>` for [`crate::Tokens::encode_batch`]), `line` the 1-based line (or index).
    #[error("{origin}:{line}: tokenizing the document failed: {msg}")]
    Encode { origin: String, line: u64, msg: String },

    /// A file could not be fetched from the Hugging Face hub (`file` is its path in the repo;
    /// the message says why and what to do: resume, a token, offline).
    #[error("cannot fetch {file}: {msg}")]
    Fetch { file: String, msg: String },

    /// A token shard (`train data tokenize`) is unreadable: not zstd, not safetensors inside, or
    /// without the tensors and header fields of the format ([`crate::token_shard`]).
    #[error("{}: not a usable token shard: {msg}", path.display())]
    TokenShard { path: PathBuf, msg: String },

    /// A token shard was written with another tokenizer than `data.tokenizer`: its ids would
    /// mean other words.
    #[error(
        "{}: tokenized with {shard}, but data.tokenizer is {config}: tokenize the text again with \
         `train data tokenize` and this tokenizer, or set data.tokenizer to the shard's",
        path.display()
    )]
    TokenizerMismatch { path: PathBuf, shard: Box<TokenizerId>, config: Box<TokenizerId> },

    /// A resume position was written with another data order than the config asks for
    /// (`data.shuffle`, `data.seed`, `data.shuffle_buffer`, or the in-memory / streaming
    /// choice): continuing would not replay the run.
    #[error("cannot resume the training data where it stopped: {0}")]
    Resume(String),

    /// The background tokenizer thread stopped (after an earlier error or a panic).
    #[error("the training data stream has stopped (an earlier error ended it)")]
    StreamClosed,
}

/// Shorthand used throughout the crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// A tokenizer as a token shard or a config names it: its file, SHA-256 and vocabulary size.
#[derive(Debug)]
pub struct TokenizerId {
    pub name: String,
    pub sha256: String,
    pub vocab: usize,
}

impl std::fmt::Display for TokenizerId {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} (sha256 {}, vocabulary {})", self.name, self.sha256, self.vocab)
    }
}
