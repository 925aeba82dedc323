//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lowbit_data::{load_tokenizer, DataConfig, Tokens};

pub mod parquet_file;

/// The repository's `data/` folder (the bundled sample).
pub fn repo_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

/// `tokenizers/NAME` of the shared data beside the checkout (`../shared/data`); panics naming
/// the path when it is absent (the tests that read it are ignored unless asked for).
pub fn shared_tokenizer(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tokenizers").join(name);
    assert!(path.is_file(), "{} not present (the shared data lives beside the checkout)", path.display());
    path
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

/// The first `docs` documents of the bundled train sample: real text of mixed lengths, from
/// 50 bytes to 35 kB.
pub fn sample_texts(docs: usize) -> Vec<String> {
    let reader = lowbit_data::ShardReader::open(&sample_train(), lowbit_data::BadInput::Fail).unwrap();
    reader.take(docs).map(Result::unwrap).collect()
}

/// [`sample_texts`]`(docs)` dealt round-robin into `shards` gzip shards in `dir`: small enough
/// to load in memory in a fraction of a second.
pub fn small_corpus(dir: &Path, shards: usize, docs: usize) -> Vec<PathBuf> {
    let texts = sample_texts(docs);
    (0..shards)
        .map(|s| {
            let lines: Vec<String> = texts.iter().skip(s).step_by(shards).map(|t| c4(t)).collect();
            write_gz(dir, &format!("c4-train.{s:05}-of-{shards:05}.json.gz"), &lines)
        })
        .collect()
}

/// A config over [`small_corpus`]`(dir, shards, docs)` (train and validation alike), rows of
/// `seq_len`.
pub fn small_cfg(dir: &Path, shards: usize, docs: usize, seq_len: usize) -> DataConfig {
    let paths = small_corpus(dir, shards, docs);
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    cfg(&paths, &paths, seq_len)
}

/// The three row orders, as settings on a config: file order, in memory, streaming through
/// a buffer of `buffer` rows.
pub fn orders(buffer: usize) -> [(&'static str, DataConfig); 3] {
    let base = DataConfig::default();
    [
        ("file order", DataConfig { shuffle: false, ..base.clone() }),
        ("in memory", base.clone()),
        ("streaming", DataConfig { in_memory_max_tokens: 0, shuffle_buffer: buffer, ..base }),
    ]
}

/// `cfg` read in the order `order` gives (one of [`orders`]).
pub fn in_order(cfg: &DataConfig, order: &DataConfig) -> DataConfig {
    DataConfig {
        shuffle: order.shuffle,
        in_memory_max_tokens: order.in_memory_max_tokens,
        shuffle_buffer: order.shuffle_buffer,
        ..cfg.clone()
    }
}

/// `cfg` in every row order ([`orders`]`(buffer)`) and packing mode, each with its name.
pub fn every_setting(cfg: &DataConfig, buffer: usize) -> Vec<(String, DataConfig)> {
    let mut out = Vec::new();
    for (name, order) in orders(buffer) {
        for mode in [lowbit_data::SeqMode::Concat, lowbit_data::SeqMode::TruncatePad] {
            out.push((format!("{name}, {mode:?}"), DataConfig { mode, ..in_order(cfg, &order) }));
        }
    }
    out
}

/// Runs `f` with this thread's tracing output captured; returns (f's result, the log text).
pub fn with_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf(Arc::new(Mutex::new(Vec::new())));
    let w = buf.clone();
    let sub = tracing_subscriber::fmt().with_ansi(false).with_writer(move || w.clone()).finish();
    let out = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (out, text)
}
