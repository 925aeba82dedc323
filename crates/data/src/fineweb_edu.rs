//! FineWeb-Edu on the Hugging Face hub (`HuggingFaceFW/fineweb-edu`: FineWeb's English web
//! pages that an educational-quality classifier scored 3 or more; Penedo et al. 2024): the
//! files of its `sample-10BT` subset, how many a number of tokens needs, and where `train data
//! fetch fineweb-edu` puts them.
//!
//! `sample-10BT` is a random ~10B-token sample of the whole, in 14 parquet files
//! `sample/10BT/000_00000.parquet` .. `013_00000.parquet` (one document per row: `text`, `id`,
//! `url`, `score`, ...), 13 of ~2.15 GB and a last one of 0.54 GB, 28.5 GB in all
//! ([`FILE_BYTES`]). The dataset has no validation split:
//! the last, smallest file is held out for validation and the others are the training files,
//! fetched from the first, into `<out>/train/` and `<out>/validation/`, so that a glob over
//! each folder never mixes them.

use std::path::Path;

use hf_hub::RepoType;

use crate::error::{DataError, Result};
use crate::hub::HubFile;

/// The dataset repo.
pub const REPO: &str = "HuggingFaceFW/fineweb-edu";
/// The subset fetched.
pub const SUBSET: &str = "sample-10BT";
/// The subset's files' sizes, in bytes, in order: as recorded for the dataset's revision
/// `fc9850dff5e2` (not checked here, offline). A fetch asks the hub for the current sizes
/// before it starts; `--dry-run`, which makes no request, lists these.
pub const FILE_BYTES: [u64; 14] = [
    2_152_819_114,
    2_152_222_432,
    2_151_796_315,
    2_152_437_524,
    2_152_338_550,
    2_152_189_947,
    2_152_689_867,
    2_150_686_637,
    2_151_274_846,
    2_151_913_277,
    2_152_798_864,
    2_152_323_681,
    2_152_069_689,
    540_632_672,
];
/// Training files: all but the last (`000` .. `012`).
pub const TRAIN_FILES: usize = FILE_BYTES.len() - 1;
/// Validation files: the last (`013`).
pub const VAL_FILES: usize = 1;

/// Tokens in one training file, rounded down, an estimate for sizing a download: the
/// subset's 10B tokens (GPT-2's, the dataset's `token_count`) over 13.25 files' worth of
/// bytes is ~750M per 2.15 GB file; T5's tokenizer, which the configs use, is assumed to give
/// about as many on English text (not measured on FineWeb-Edu).
pub const TRAIN_FILE_TOKENS: u64 = 700_000_000;
/// Tokens in the validation file, rounded down likewise (~190M for its 0.54 GB).
pub const VAL_FILE_TOKENS: u64 = 170_000_000;

/// The repo path of file `i` of the subset: `sample/10BT/000_00000.parquet`.
pub fn repo_file(i: usize) -> String {
    format!("sample/10BT/{i:03}_00000.parquet")
}

/// The training files `0..train` (to `<out>/train/`) and the validation file if `val` is 1
/// (to `<out>/validation/`), each listed with its size in [`FILE_BYTES`].
///
/// # Errors
/// [`DataError::Config`] when `train` is above [`TRAIN_FILES`] or `val` above
/// [`VAL_FILES`] (naming the flag), or when nothing is asked for.
pub fn files(out: &Path, train: usize, val: usize) -> Result<Vec<HubFile>> {
    if train > TRAIN_FILES {
        return Err(DataError::Config(format!(
            "--train-shards {train}: FineWeb-Edu {SUBSET} has {TRAIN_FILES} training files (and one held out for validation)"
        )));
    }
    if val > VAL_FILES {
        return Err(DataError::Config(format!("--val-shards {val}: FineWeb-Edu {SUBSET} holds out {VAL_FILES} file for validation")));
    }
    let file = |i: usize, split: &str| {
        let path = repo_file(i);
        let dest = out.join(split).join(path.rsplit('/').next().expect("a file name"));
        HubFile { repo_id: REPO.into(), kind: RepoType::Dataset, dest, path, listed_bytes: Some(FILE_BYTES[i]) }
    };
    let all: Vec<HubFile> =
        (0..train).map(|i| file(i, "train")).chain((TRAIN_FILES..TRAIN_FILES + val).map(|i| file(i, "validation"))).collect();
    if all.is_empty() {
        return Err(DataError::Config("nothing to fetch: no training and no validation file".into()));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::shards_for;

    #[test]
    fn names_follow_the_repo_layout() {
        assert_eq!(repo_file(0), "sample/10BT/000_00000.parquet");
        assert_eq!(repo_file(13), "sample/10BT/013_00000.parquet");
        assert_eq!(FILE_BYTES.iter().sum::<u64>(), 28_518_193_415, "28.5 GB in all");
    }

    #[test]
    fn training_and_validation_files_are_apart() {
        let f = files(Path::new("data/local/fineweb-edu"), 2, 1).unwrap();
        let got: Vec<(&str, String, Option<u64>)> =
            f.iter().map(|f| (f.path.as_str(), f.dest.display().to_string(), f.listed_bytes)).collect();
        assert_eq!(
            got,
            [
                ("sample/10BT/000_00000.parquet", "data/local/fineweb-edu/train/000_00000.parquet".into(), Some(2_152_819_114)),
                ("sample/10BT/001_00000.parquet", "data/local/fineweb-edu/train/001_00000.parquet".into(), Some(2_152_222_432)),
                ("sample/10BT/013_00000.parquet", "data/local/fineweb-edu/validation/013_00000.parquet".into(), Some(540_632_672)),
            ]
        );
        assert_eq!(f[0].repo().folder_name(), "datasets--HuggingFaceFW--fineweb-edu");
        // every training file, none of them the validation file
        let all = files(Path::new("x"), TRAIN_FILES, 1).unwrap();
        assert!(all[..TRAIN_FILES].iter().all(|f| !f.path.starts_with("sample/10BT/013")));
    }

    #[test]
    fn the_paper_run_needs_four_training_files() {
        // 20000 steps x 512 x 256 tokens; 10M validation tokens
        assert_eq!(shards_for(20_000 * 512 * 256, TRAIN_FILE_TOKENS), 4);
        assert_eq!(shards_for(10_000_000, VAL_FILE_TOKENS), 1);
    }

    #[test]
    fn counts_beyond_the_subset_are_refused() {
        let e = files(Path::new("x"), 14, 0).unwrap_err().to_string();
        assert!(e.contains("--train-shards 14") && e.contains("13 training files"), "{e}");
        let e = files(Path::new("x"), 0, 2).unwrap_err().to_string();
        assert!(e.contains("--val-shards 2"), "{e}");
        assert!(files(Path::new("x"), 0, 0).is_err());
    }
}
