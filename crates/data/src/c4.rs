//! C4 `en` on the Hugging Face hub (`allenai/c4`, the T5 authors' corpus as AllenAI ships it):
//! its file names, how many shards a number of tokens needs, and the files `train data fetch
//! c4` puts under a folder: `<out>/en/c4-train.XXXXX-of-01024.json.gz`,
//! `<out>/en/c4-validation.XXXXX-of-00008.json.gz` (the repo's layout, which is where the
//! paper configs' globs look) and `<out>/tokenizer.json` (the T5 tokenizer, the same as
//! `data/tokenizers/t5-tokenizer.json`).

use crate::error::{DataError, Result};
use crate::hub::HubFile;
use hf_hub::RepoType;
use std::path::Path;

/// The dataset repo.
pub const REPO: &str = "allenai/c4";
/// Train shards of `en` (numbered 0..1023).
pub const TRAIN_SHARDS: usize = 1024;
/// Validation shards of `en` (numbered 0..7).
pub const VAL_SHARDS: usize = 8;
/// The model repo whose `tokenizer.json` is the T5 tokenizer the configs use.
pub const TOKENIZER_REPO: &str = "google-t5/t5-base";

/// T5 tokens in one train shard, rounded down: C4 `en` is ~156B T5 tokens in 1024 shards of
/// ~356k documents each (~152M). An estimate for sizing a download, not a count.
pub const TRAIN_SHARD_TOKENS: u64 = 150_000_000;
/// T5 tokens in one validation shard, rounded down (~364k documents in 8 shards, ~45.6k
/// documents of ~430 tokens each).
pub const VAL_SHARD_TOKENS: u64 = 19_000_000;

/// The repo path of train shard `i`: `en/c4-train.00000-of-01024.json.gz`.
pub fn train_file(i: usize) -> String {
    format!("en/c4-train.{i:05}-of-{TRAIN_SHARDS:05}.json.gz")
}

/// The repo path of validation shard `i`: `en/c4-validation.00000-of-00008.json.gz`.
pub fn val_file(i: usize) -> String {
    format!("en/c4-validation.{i:05}-of-{VAL_SHARDS:05}.json.gz")
}

/// The files of train shards `0..train`, validation shards `0..val` and, with `tokenizer`, the
/// `tokenizer.json` of that model repo, each with its path under `out`.
///
/// # Errors
/// [`DataError::Config`] when `train` is above 1024 or `val` above 8 (naming the flag), or
/// when nothing is asked for.
pub fn files(out: &Path, train: usize, val: usize, tokenizer: Option<&str>) -> Result<Vec<HubFile>> {
    if train > TRAIN_SHARDS {
        return Err(DataError::Config(format!("--train-shards {train}: C4 en has {TRAIN_SHARDS} train shards")));
    }
    if val > VAL_SHARDS {
        return Err(DataError::Config(format!("--val-shards {val}: C4 en has {VAL_SHARDS} validation shards")));
    }
    let shard = |path: String| HubFile { repo_id: REPO.into(), kind: RepoType::Dataset, dest: out.join(&path), path, listed_bytes: None };
    let mut all: Vec<HubFile> = (0..train).map(train_file).chain((0..val).map(val_file)).map(shard).collect();
    if let Some(repo) = tokenizer {
        let path = "tokenizer.json".to_string();
        all.push(HubFile { repo_id: repo.into(), kind: RepoType::Model, dest: out.join(&path), path, listed_bytes: None });
    }
    if all.is_empty() {
        return Err(DataError::Config("nothing to fetch: no shards and no tokenizer".into()));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::shards_for;

    #[test]
    fn names_follow_the_repo_layout() {
        assert_eq!(train_file(0), "en/c4-train.00000-of-01024.json.gz");
        assert_eq!(train_file(1023), "en/c4-train.01023-of-01024.json.gz");
        assert_eq!(val_file(7), "en/c4-validation.00007-of-00008.json.gz");
    }

    #[test]
    fn shard_counts_cover_the_tokens() {
        // the paper's run: 20000 steps x 512 x 256 tokens
        assert_eq!(shards_for(20_000 * 512 * 256, TRAIN_SHARD_TOKENS), 18);
        assert_eq!(shards_for(10_000_000, VAL_SHARD_TOKENS), 1);
        assert_eq!(shards_for(TRAIN_SHARD_TOKENS, TRAIN_SHARD_TOKENS), 1);
        assert_eq!(shards_for(TRAIN_SHARD_TOKENS + 1, TRAIN_SHARD_TOKENS), 2);
        assert_eq!(shards_for(0, TRAIN_SHARD_TOKENS), 1);
    }

    #[test]
    fn files_land_where_the_configs_look() {
        let f = files(Path::new("data/local/c4"), 2, 1, Some(TOKENIZER_REPO)).unwrap();
        let dests: Vec<String> = f.iter().map(|f| f.dest.display().to_string()).collect();
        assert_eq!(
            dests,
            [
                "data/local/c4/en/c4-train.00000-of-01024.json.gz",
                "data/local/c4/en/c4-train.00001-of-01024.json.gz",
                "data/local/c4/en/c4-validation.00000-of-00008.json.gz",
                "data/local/c4/tokenizer.json",
            ]
        );
        assert_eq!(f[3].repo().folder_name(), "models--google-t5--t5-base");
        assert_eq!(f[0].repo().folder_name(), "datasets--allenai--c4");
    }

    #[test]
    fn counts_beyond_the_repo_are_refused() {
        let e = files(Path::new("x"), 1025, 0, None).unwrap_err().to_string();
        assert!(e.contains("--train-shards 1025") && e.contains("1024"), "{e}");
        let e = files(Path::new("x"), 0, 9, None).unwrap_err().to_string();
        assert!(e.contains("--val-shards 9"), "{e}");
        assert!(files(Path::new("x"), 0, 0, None).is_err());
    }
}
