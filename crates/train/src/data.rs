//! The data a run reads: its tokenizer ([`tokenizer`]), the fixed validation batches (with a
//! warning when they share documents with the training shards) and the training stream from a
//! position ([`open`]); data errors as one line that says how to get the data ([`data_err`]).

use crate::config::RunConfig;
use anyhow::Result;
use lowbit_data::{shared_documents, tokenizer_of, validation_batches, Batch, DataPosition, Tokens, TrainStream, OVERLAP_SAMPLE};

/// The tokenizer of `data.tokenizer`, its EOS `data.eos_token` or found.
///
/// # Errors
/// It cannot be loaded (or downloaded, with `data.allow_download`).
pub fn tokenizer(cfg: &RunConfig) -> Result<Tokens> {
    tokenizer_of(&cfg.data).map_err(data_err)
}

/// The validation batches of `cfg` (micro-batches of `train.micro_batch` rows) and the
/// training stream from `position`.
///
/// # Errors
/// Shards missing or unreadable, or a position that does not fit them.
pub fn open(cfg: &RunConfig, tok: &Tokens, position: &DataPosition) -> Result<(Vec<Batch>, TrainStream)> {
    let val = validation_batches(&cfg.data, tok, cfg.train.micro_batch).map_err(data_err)?;
    // (no validation set, as in `train bench training`: nothing to overlap)
    let shared = if cfg.data.val_tokens == 0 { 0 } else { shared_documents(&cfg.data, tok, OVERLAP_SAMPLE).map_err(data_err)? };
    if shared > 0 {
        tracing::warn!(
            shared,
            sample = OVERLAP_SAMPLE,
            "the validation shards share documents with the training shards ({shared} of the first \
             {OVERLAP_SAMPLE} documents of each training shard): the validation loss measures \
             memorisation; check data.validation"
        );
    }
    let stream = TrainStream::new(&cfg.data_config(), tok, position.clone()).map_err(data_err)?;
    Ok((val, stream))
}

/// A data error as one line, with how to get the data when it is a corpus the README
/// fetches.
pub fn data_err(e: lowbit_data::DataError) -> anyhow::Error {
    use lowbit_data::DataError::{MissingFile, NoMatch};
    let hint = match &e {
        MissingFile { pattern, .. } | NoMatch { pattern, .. } if pattern.contains("data/local/c4") => {
            "; get C4 with `train data fetch c4 --config <this config>` (as many shards as the config's tokens need; \
             docs/data.md), or point data.train / data.validation at your shards"
        }
        MissingFile { pattern, .. } | NoMatch { pattern, .. } if pattern.contains("data/local/corpus") => {
            "; link the shared corpus with `scripts/link_shared_corpus.sh` (docs/data.md)"
        }
        _ => "",
    };
    anyhow::anyhow!("{e}{hint}")
}
