//! Validation documents that are also training documents: a validation loss on them
//! measures memorisation, not generalisation. Checked on a sample, by hashes of the text, or
//! of the token ids when a token shard is involved (its text is not kept).

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::config::DataConfig;
use crate::error::Result;
use crate::pipeline::encode_chunk;
use crate::reader::expand_shards;
use crate::source::{Content, DocSource};
use crate::token_shard::is_token_shard;
use crate::tokenize::Tokens;

/// Documents sampled from the start of the validation shards and of each training shard by
/// [`shared_documents`]: enough to catch a validation set that is (part of) the training set,
/// a few megabytes of reading.
pub const OVERLAP_SAMPLE: usize = 1000;

fn hash(x: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// Hashes of up to `n` documents from the start of `shards` (read in order, no cycling): of
/// their text, or with `by_ids` of their token ids (a text tokenized for it).
fn first_documents(shards: Vec<std::path::PathBuf>, cfg: &DataConfig, tok: &Tokens, by_ids: bool, n: usize) -> Result<Vec<u64>> {
    let mut src = DocSource::new(shards, cfg.on_bad_line, tok, false, None, (0, 0, 0))?;
    let mut docs = Vec::with_capacity(n);
    while docs.len() < n {
        match src.next_doc()? {
            Some(d) => docs.push(d),
            None => break,
        }
    }
    if by_ids {
        return Ok(encode_chunk(tok, &mut docs)?.iter().map(hash).collect());
    }
    Ok(docs
        .iter()
        .map(|d| match &d.content {
            Content::Text(t) => hash(t),
            Content::Ids(ids) => hash(ids),
        })
        .collect())
}

/// How many of the first `sample` documents of each training shard have the text of one of
/// the first `sample` documents of the validation shards (0 for disjoint sets; with
/// `validation` set to the training files, `sample` or more). Texts are compared by a 64-bit
/// hash.
///
/// # Errors
/// Pattern and reading errors of the shards, as [`crate::TrainStream::new`] and
/// [`crate::validation_batches`] give them.
pub fn shared_documents(cfg: &DataConfig, tok: &Tokens, sample: usize) -> Result<usize> {
    let (validation, train) = (expand_shards(&cfg.validation, "validation")?, expand_shards(&cfg.train, "train")?);
    let mut by_ids = false;
    for path in validation.iter().chain(&train) {
        by_ids |= is_token_shard(path)?;
    }
    let validation: HashSet<u64> = first_documents(validation, cfg, tok, by_ids, sample)?.into_iter().collect();
    let mut shared = 0;
    for shard in train {
        shared += first_documents(vec![shard], cfg, tok, by_ids, sample)?.iter().filter(|h| validation.contains(h)).count();
    }
    Ok(shared)
}
