//! # lowbit-data — C4-format and parquet text to token batches
//!
//! Reads C4-format shards (`allenai/c4` `en`: gzip JSON lines with `text`, `timestamp`,
//! `url`; plain `.json` also works) and parquet shards (`*.parquet` with a string column
//! `text`: FineWeb-Edu and most of the hub's text corpora), tokenizes them with a
//! `tokenizers` `tokenizer.json` (T5 by default, as in the usual LLaMA-on-C4 setups), and cuts
//! the tokens into `[rows, seq_len]` batches of inputs, next-token targets and a loss mask.
//!
//! - [`DataConfig`]: the `[data]` section of a run config (serde, unknown keys rejected).
//! - [`load_tokenizer`] / [`tokenizer_of`] -> [`Tokens`]: local `tokenizer.json` or hub id;
//!   EOS (`data.eos_token` or found, [`EOS_CANDIDATES`]) and pad ids.
//! - [`TrainStream`]: endless train batches, pass after pass, in a seeded random order by
//!   default ([`RowOrder`]: rows permuted in memory, or streamed through a shuffle buffer;
//!   file order with `shuffle = false`), deterministic, resumable exactly from its
//!   [`DataPosition`].
//! - [`validation_batches`]: the first `val_tokens` targets of the validation shards;
//!   [`shared_documents`]: how many sampled training documents are also validation documents.
//! - [`ShardReader`] / [`expand_shards`]: the streaming reader of one text shard (JSON lines
//!   or parquet, [`TextFormat`]) on its own.
//! - [`token_shard`]: a corpus tokenized once into compact zstd shards (`train data
//!   tokenize`), which `train` and `validation` read like JSON shards, without tokenizing.
//! - [`c4`], [`fineweb_edu`] and [`hub`]: C4 `en` shards and the T5 tokenizer, or
//!   FineWeb-Edu's `sample-10BT` parquet files, fetched from the Hugging Face hub into a local
//!   folder (`train data fetch c4`, `train data fetch fineweb-edu`), resumable, complete files
//!   only.
//!
//! Packing ([`SeqMode`]): `concat` joins documents (each + EOS) into one stream cut into rows
//! (no padding, nothing lost); `truncate_pad` makes one row per document, cut and padded,
//! with padded targets masked. Bad input ([`BadInput`]): skip with a warning naming
//! `file:line` (the row, in a parquet shard; the default) or fail with an error naming it
//! ([`DataError`]).
//!
//! ```no_run
//! # fn main() -> Result<(), lowbit_data::DataError> {
//! use lowbit_data::{load_tokenizer, validation_batches, DataConfig, DataPosition, SeqMode, TrainStream};
//!
//! let cfg: DataConfig = DataConfig {
//!     train: vec!["data/c4-sample/en-train.*.json.gz".into()],
//!     validation: vec!["data/c4-sample/en-validation.*.json.gz".into()],
//!     tokenizer: "data/tokenizers/t5-tokenizer.json".into(),
//!     seq_len: 256,
//!     mode: SeqMode::Concat,
//!     ..DataConfig::default()
//! };
//! let tok = load_tokenizer(&cfg.tokenizer, cfg.allow_download)?;
//! assert_eq!(tok.vocab_size(), 32100);
//!
//! let mut train = TrainStream::new(&cfg, &tok, DataPosition::default())?; // rows shuffled
//! let batch = train.next_batch(32)?;            // input/target/mask: 32 * 256 values
//! assert_eq!(batch.input.len(), 32 * 256);
//! let resume_at = train.position();             // save with the checkpoint
//!
//! let mut again = TrainStream::new(&cfg, &tok, resume_at)?;
//! assert_eq!(again.next_batch(32)?, train.next_batch(32)?);
//!
//! let val = validation_batches(&cfg, &tok, 32)?; // same batches in every run
//! # let _ = val; Ok(()) }
//! ```

mod batch;
pub mod c4;
mod config;
mod error;
pub mod fineweb_edu;
pub mod hub;
mod memory;
mod order;
mod overlap;
mod parquet_shard;
mod pipeline;
mod reader;
mod records;
mod shuffle_buffer;
mod source;
mod special;
mod stream;
mod text_format;
pub mod token_shard;
mod tokenize;
mod validation;

pub use batch::{Batch, DataPosition, RowOrder};
pub use config::{
    check_shuffle_buffer, shuffle_buffer_checkpoint_bytes, shuffle_buffer_row_bytes, BadInput, DataConfig, SeqMode, MAX_SHUFFLE_BUFFER,
};
pub use error::{DataError, Result};
pub use overlap::{shared_documents, OVERLAP_SAMPLE};
pub use reader::{expand_shards, ShardReader};
pub use stream::{reads_through_shuffle_buffer, PassSize, TrainStream};
pub use text_format::TextFormat;
pub use tokenize::{load_tokenizer, load_tokenizer_eos, pieces, tokenizer_of, Tokens, EOS_CANDIDATES, PIECE_BYTES};
pub use validation::validation_batches;
