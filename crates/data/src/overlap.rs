//! Validation documents that are also training documents: a validation loss on them
//! measures memorisation, not generalisation. Checked on a sample, by hashes of the text.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::config::DataConfig;
use crate::error::Result;
use crate::reader::{expand_shards, DocSource};

/// Documents sampled from the start of the validation shards and of each training shard by
/// [`shared_documents`]: enough to catch a validation set that is (part of) the training set,
/// a few megabytes of reading.
pub const OVERLAP_SAMPLE: usize = 1000;

fn text_hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Hashes of up to `n` documents from the start of `shards` (read in order, no cycling).
fn first_documents(shards: Vec<std::path::PathBuf>, cfg: &DataConfig, n: usize) -> Result<Vec<u64>> {
    let mut src = DocSource::new(shards, cfg.on_bad_line, false, 0, 0, 0)?;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match src.next_doc()? {
            Some(d) => out.push(text_hash(&d.text)),
            None => break,
        }
    }
    Ok(out)
}

/// How many of the first `sample` documents of each training shard have the text of one of
/// the first `sample` documents of the validation shards (0 for disjoint sets; with
/// `validation` set to the training files, `sample` or more). Texts are compared by a 64-bit
/// hash.
///
/// # Errors
/// Pattern and reading errors of the shards, as [`crate::TrainStream::new`] and
/// [`crate::validation_batches`] give them.
pub fn shared_documents(cfg: &DataConfig, sample: usize) -> Result<usize> {
    let validation: HashSet<u64> =
        first_documents(expand_shards(&cfg.validation, "validation")?, cfg, sample)?.into_iter().collect();
    let mut shared = 0;
    for shard in expand_shards(&cfg.train, "train")? {
        shared += first_documents(vec![shard], cfg, sample)?.iter().filter(|h| validation.contains(h)).count();
    }
    Ok(shared)
}
