//! The `[data]` section of a run config.

use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};

/// How documents become rows of `seq_len + 1` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SeqMode {
    /// One document per row: cut to `seq_len + 1` tokens, padded with the pad id; padded
    /// targets get mask 0.0 (the GaLore / ReLoRA C4 setup). Text past the cut is lost.
    TruncatePad,
    /// All documents (each followed by EOS) joined into one token stream and cut into rows;
    /// no padding, no text lost. Consecutive rows overlap by one token (the last target of a
    /// row is the first input of the next), so every token after the first is a target
    /// exactly once.
    #[default]
    Concat,
}

/// What to do with a line that is not a JSON object with a string `text` (a parquet row whose
/// `text` is null or not UTF-8), or with a corrupt gzip stream (parquet page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BadInput {
    /// Log a warning naming `file:line` (or row), count the line, go on. A corrupt gzip stream
    /// (parquet page) ends that shard (warning) and reading continues with the next shard.
    #[default]
    Skip,
    /// Stop with an error naming `file:line` (or the file, for a corrupt gzip stream).
    Fail,
}

/// `[data]` section of the run config.
///
/// Paths are relative to the working directory of the process (the repository root when
/// run as documented). The defaults point at the sample bundled in `data/`.
///
/// ```toml
/// [data]
/// train = ["data/local/c4/en/c4-train.*-of-01024.json.gz"]
/// validation = ["data/local/c4/en/c4-validation.0000[0-7]-of-00008.json.gz"]
/// tokenizer = "data/tokenizers/t5-tokenizer.json"
/// seq_len = 256
/// mode = "concat"
/// val_tokens = 10_000_000
/// shuffle = true            # the default: rows in a seeded random order
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// File paths or glob patterns of train shards: C4-format JSON lines (`*.json.gz` or
    /// `*.json`), parquet files with a string column `text` (`*.parquet`: FineWeb-Edu), or
    /// token shards (`*.tokens.zst`, `train data tokenize`). All matches of all patterns are
    /// read in sorted path order (or a seeded permutation of it, [`DataConfig::shuffle`]),
    /// cycling in epochs.
    pub train: Vec<String>,
    /// Same for the validation shards.
    pub validation: Vec<String>,
    /// Path to a `tokenizer.json`, or a Hugging Face hub id such as `"google-t5/t5-base"`
    /// (looked up in the local hub cache; fetched only with `allow_download = true`).
    pub tokenizer: String,
    /// Allow fetching `tokenizer.json` of a hub id over the network. Default false.
    pub allow_download: bool,
    /// The end-of-sequence token appended to every document, as the vocabulary writes it
    /// (`"<|endoftext|>"`). Unset (the default): the first of [`crate::EOS_CANDIDATES`] in
    /// the vocabulary. Left out of the resolved config when unset, so that configs without
    /// it keep their fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    /// Tokens per row fed to the model (targets are the next `seq_len` tokens). Default 256.
    pub seq_len: usize,
    /// `"concat"` (default) or `"truncate_pad"`.
    pub mode: SeqMode,
    /// Validation size in target tokens (rounded up to whole rows), always taken from the
    /// start of the validation shards so it is identical in every run. Default 1_000_000.
    pub val_tokens: usize,
    /// `"skip"` (default) or `"fail"` on a bad line or corrupt shard.
    pub on_bad_line: BadInput,
    /// Read the training rows in a seeded random order (default true; validation always
    /// reads in order). Documents are cut into rows as without it; what is randomised is
    /// the order of the rows: all rows of a pass permuted in memory when the training text
    /// fits `in_memory_max_tokens`, else each pass's shards permuted and their rows passed
    /// through a `shuffle_buffer`-row buffer ([`crate::RowOrder`]). `false` reads documents
    /// in sorted shard order, which on a corpus of long documents fills each batch from one
    /// or two of them (measured at LLaMA-20M, 128 x 256, 1000 steps: ~0.75 nats worse).
    pub shuffle: bool,
    /// Seed of the data order, apart from the model's initialisation so that runs that
    /// differ in their optimizer see the same rows. The trainer sets it to `train.seed`
    /// when it is not given; this crate reads a missing seed as 0.
    pub seed: Option<u64>,
    /// Streaming mode's shuffle buffer, rows (default 10,000: 2.6M tokens at `seq_len`
    /// 256, ~5,000 C4 documents, 5x the 1,000 documents of HF datasets' default buffer that
    /// GaLore's C4 loader uses, and ~20 steps of the paper's 512 rows; 10 MB of ids, kept in
    /// each checkpoint). The buffer fills before the first batch.
    pub shuffle_buffer: usize,
    /// In-memory mode when the training text is at most this many tokens (default 250M,
    /// 1 GB of ids): exact for token shards (their header), estimated for JSON shards at one
    /// token per byte of gzip file (measured: 0.8-0.9 on the offline corpora, ~0.5 on C4),
    /// four bytes per token of plain JSON, and for parquet shards at four bytes per token of
    /// their `text` column uncompressed. 0 always streams.
    pub in_memory_max_tokens: u64,
}

/// The largest `data.shuffle_buffer`, rows (100M: ~100 GB of ids at `seq_len` 256, held in
/// memory and written into each checkpoint); a larger one is refused by [`DataConfig::validate`].
pub const MAX_SHUFFLE_BUFFER: usize = 100_000_000;

/// Refuses a `data.shuffle_buffer` above [`MAX_SHUFFLE_BUFFER`] (it aborted in its allocation,
/// or panicked on a capacity overflow), with a message that starts with the key.
///
/// # Errors
/// The message: the key, the range and the value.
pub fn check_shuffle_buffer(rows: usize) -> std::result::Result<(), String> {
    if rows > MAX_SHUFFLE_BUFFER {
        return Err(format!(
            "data.shuffle_buffer: must be in 1..={MAX_SHUFFLE_BUFFER} rows (each row's data.seq_len + 1 token ids are held \
             in memory and written into every checkpoint), got {rows}"
        ));
    }
    Ok(())
}

/// Bytes one shuffle-buffer row of `seq_len` holds in memory: `seq_len + 1` token ids, its
/// vector's header and its count of real tokens.
pub fn shuffle_buffer_row_bytes(seq_len: usize) -> f64 {
    (seq_len as f64 + 1.0) * 4.0 + 32.0
}

/// Bytes a checkpoint stores of a full shuffle buffer of `rows` rows of `seq_len`: each row's
/// `seq_len + 1` ids and its count of real tokens.
pub fn shuffle_buffer_checkpoint_bytes(rows: usize, seq_len: usize) -> f64 {
    rows as f64 * (seq_len as f64 + 2.0) * 4.0
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            train: vec!["data/c4-sample/en-train.*.json.gz".into()],
            validation: vec!["data/c4-sample/en-validation.*.json.gz".into()],
            tokenizer: "data/tokenizers/t5-tokenizer.json".into(),
            allow_download: false,
            eos_token: None,
            seq_len: 256,
            mode: SeqMode::Concat,
            val_tokens: 1_000_000,
            on_bad_line: BadInput::Skip,
            shuffle: true,
            seed: None,
            shuffle_buffer: 10_000,
            in_memory_max_tokens: 250_000_000,
        }
    }
}

impl DataConfig {
    /// Checks the values that would otherwise fail later and less clearly.
    ///
    /// # Errors
    /// [`DataError::Config`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.seq_len == 0 {
            return Err(DataError::Config("seq_len must be at least 1".into()));
        }
        if self.train.is_empty() {
            return Err(DataError::Config("train lists no shard path or pattern".into()));
        }
        if self.tokenizer.trim().is_empty() {
            return Err(DataError::Config("tokenizer is empty".into()));
        }
        check_shuffle_buffer(self.shuffle_buffer).map_err(DataError::Config)?;
        if self.shuffle && self.shuffle_buffer == 0 {
            return Err(DataError::Config(
                "shuffle_buffer = 0 with shuffle = true: give the streaming shuffle buffer at least one row, or set \
                 shuffle = false"
                    .into(),
            ));
        }
        Ok(())
    }
}
