//! Measurements for data/README.md (ignored by default; run with
//! `cargo test --release -p lowbit-data --test throughput -- --ignored --nocapture`).

mod common;

use std::time::Instant;

use common::*;
use lowbit_data::{BadInput, DataPosition, ShardReader, TrainStream};

#[test]
#[ignore]
fn measure_bundled_sample_tokens_and_throughput() {
    let tok = t5();
    for path in [sample_train(), sample_validation()] {
        let texts: Vec<String> = ShardReader::open(&path, BadInput::Fail).unwrap().map(Result::unwrap).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let t = Instant::now();
        let ids = tok.encode_batch(&refs).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let n: usize = ids.iter().map(Vec::len).sum();
        let bytes: usize = texts.iter().map(String::len).sum();
        println!(
            "{}: {} documents, {} bytes of text, {} T5 tokens (text + one EOS per document); encode_batch {:.0} tokens/s",
            path.file_name().unwrap().to_string_lossy(),
            texts.len(),
            bytes,
            n,
            n as f64 / secs
        );
    }
    // End to end: gunzip + JSON + tokenize + pack, one epoch of the train sample.
    let mut cfg = cfg(&[&sample_train()], &[&sample_validation()], 256);
    cfg.shuffle = false;
    let t = Instant::now();
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let mut tokens = 0usize;
    let mut batches = 0usize;
    while s.position().epoch == 0 {
        let b = s.next_batch(64).unwrap();
        tokens += b.rows * b.seq_len;
        batches += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "TrainStream concat seq_len 256: {batches} batches of 64 rows ({tokens} targets) in {secs:.2} s = {:.0} tokens/s on {} threads",
        tokens as f64 / secs,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}
