//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use lowbit_data::{load_tokenizer, DataConfig, Tokens};

/// The repository's `data/` folder (the bundled sample).
pub fn repo_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

/// `tokenizers/NAME` of the shared data beside the checkout (`../shared/data`), or `None`
/// (with a note on stderr naming the path) when it is absent.
pub fn shared_tokenizer(name: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tokenizers").join(name);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: {} not present (the shared data lives beside the checkout)", path.display());
        None
    }
}

pub fn t5() -> Tokens {
    load_tokenizer(repo_data().join("tokenizers/t5-tokenizer.json").to_str().unwrap(), false).unwrap()
}

/// Writes `lines` (each + '\n') gzip-compressed to `dir/name`.
pub fn write_gz(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    for l in lines {
        gz.write_all(l.as_bytes()).unwrap();
        gz.write_all(b"\n").unwrap();
    }
    gz.finish().unwrap();
    path
}

/// A C4 line for `text`.
pub fn c4(text: &str) -> String {
    serde_json::json!({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com/"}).to_string()
}

/// A config over the given train/validation patterns with the bundled T5 tokenizer.
pub fn cfg(train: &[&Path], validation: &[&Path], seq_len: usize) -> DataConfig {
    DataConfig {
        train: train.iter().map(|p| p.display().to_string()).collect(),
        validation: validation.iter().map(|p| p.display().to_string()).collect(),
        tokenizer: repo_data().join("tokenizers/t5-tokenizer.json").display().to_string(),
        seq_len,
        ..DataConfig::default()
    }
}

pub fn sample_train() -> PathBuf {
    repo_data().join("c4-sample/en-train.00000-of-00001.json.gz")
}

pub fn sample_validation() -> PathBuf {
    repo_data().join("c4-sample/en-validation.00000-of-00001.json.gz")
}
