//! The validation set: a fixed number of target tokens from the start of the validation
//! shards (JSON or token shards), packed like the train data, always in file order.

use crate::batch::{Batch, Packer, RowOrder};
use crate::config::DataConfig;
use crate::error::{DataError, Result};
use crate::pipeline::{chunk_bytes, next_chunk, pack_chunk};
use crate::reader::expand_shards;
use crate::source::{refuse_text_twice, shard_headers, DocSource};
use crate::tokenize::Tokens;

/// The validation batches: rows from the start of the `validation` shards (same `mode` and
/// `seq_len` as training) until they hold at least `val_tokens` targets that count in the
/// loss (whole rows, so slightly more), cut into batches of `rows` rows (the last one may
/// be shorter). The same config always gives the same batches.
///
/// If the shards hold fewer targets than `val_tokens`, all of them are used (warning).
/// `val_tokens = 0` gives no batches.
///
/// # Errors
/// [`DataError::Config`] if `rows == 0`; pattern and reading errors as for the train stream;
/// [`DataError::NoText`] if the validation shards hold no usable document.
pub fn validation_batches(cfg: &DataConfig, tok: &Tokens, rows: usize) -> Result<Vec<Batch>> {
    cfg.validate()?;
    if rows == 0 {
        return Err(DataError::Config("a validation batch needs at least one row".into()));
    }
    if cfg.val_tokens == 0 {
        return Ok(Vec::new());
    }
    let shards = expand_shards(&cfg.validation, "validation")?;
    refuse_text_twice(&shards, &shard_headers(&shards)?, "validation")?;
    let mut src = DocSource::new(shards.clone(), cfg.on_bad_line, tok, false, None, (0, 0, 0))?;
    let mut packer = Packer::new(cfg.mode, cfg.seq_len, tok.pad_id, Vec::new());
    let mut kept = Vec::new();
    let mut targets = 0usize;
    'read: while let Some(docs) = next_chunk(&mut src, chunk_bytes(cfg.seq_len))? {
        for row in pack_chunk(tok, docs, &mut packer)? {
            targets += row.target_tokens();
            kept.push(row);
            if targets >= cfg.val_tokens {
                break 'read;
            }
        }
    }
    if kept.is_empty() {
        return Err(DataError::NoText { what: "validation", shards });
    }
    if targets < cfg.val_tokens {
        tracing::warn!(
            targets,
            val_tokens = cfg.val_tokens,
            "the validation shards hold fewer target tokens than val_tokens; using all of them"
        );
    }
    tracing::info!(rows = kept.len(), targets, bad_lines = src.bad_lines(), "validation set");
    Ok(kept.chunks(rows).map(|c| Batch::from_rows(c, cfg.seq_len, RowOrder::FileOrder)).collect())
}
