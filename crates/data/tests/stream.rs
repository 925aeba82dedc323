//! The train stream (epochs, bad lines, exact resume), validation, and the config.

mod common;

use common::*;
use lowbit_data::{validation_batches, BadInput, Batch, DataConfig, DataError, DataPosition, SeqMode, TrainStream};

/// Batch-by-batch equality with a short message (a full `Batch` debug print is huge).
fn assert_same(got: &[Batch], want: &[Batch], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: batch count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.input == w.input && g.target == w.target && g.mask == w.mask, "{ctx}: batch {i} data differs");
        assert!(
            g.position == w.position,
            "{ctx}: batch {i} position differs (line {} vs {}, carry {} vs {})",
            g.position.line,
            w.position.line,
            g.position.carry.len(),
            w.position.carry.len()
        );
    }
}

/// The input ids of `batches`, one after the other.
fn inputs(batches: &[Batch]) -> Vec<u32> {
    batches.iter().flat_map(|b| b.input.clone()).collect()
}

/// `n` batches of `rows` rows from `start`, with the stream's whole position after each (in
/// streaming mode with the shuffle buffer: what a checkpoint stores).
fn take(cfg: &DataConfig, start: DataPosition, n: usize, rows: usize) -> (Vec<Batch>, Vec<DataPosition>) {
    let tok = t5();
    let mut s = TrainStream::new(cfg, &tok, start).unwrap();
    (0..n).map(|_| (s.next_batch(rows).unwrap(), s.position())).unzip()
}

#[test]
fn resume_from_any_batch_position_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, cfg) in every_setting(&small_cfg(dir.path(), 2, 60, 64), 40) {
        let (all, positions) = take(&cfg, DataPosition::default(), 12, 16);
        for i in [0, 4, 9] {
            // Through serde, as a checkpoint would store it.
            let json = serde_json::to_string(&positions[i]).unwrap();
            let pos: DataPosition = serde_json::from_str(&json).unwrap();
            let (resumed, _) = take(&cfg, pos, 11 - i, 16);
            assert_same(&resumed, &all[i + 1..], &format!("{name}, resumed after batch {i}"));
        }
        if cfg.mode == SeqMode::Concat && !name.starts_with("in memory") {
            assert!(all.iter().all(|b| !b.position.carry.is_empty()), "{name}");
        }
    }
}

#[test]
fn resume_across_an_epoch_boundary_with_several_shards() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_gz(
        dir.path(),
        "c4-train.00000-of-00002.json.gz",
        &(0..7).map(|i| c4(&format!("alpha document {i} says hello to the world"))).collect::<Vec<_>>(),
    );
    let b = write_gz(dir.path(), "c4-train.00001-of-00002.json.gz", &(0..5).map(|i| c4(&format!("beta text {i}"))).collect::<Vec<_>>());
    for (name, order) in orders(5) {
        let cfg = in_order(&cfg(&[&b, &a], &[&a], 16), &order); // listed out of order: read sorted
        let (all, positions) = take(&cfg, DataPosition::default(), 30, 3);
        assert!(all.last().unwrap().position.epoch >= 2, "{name}");
        if name != "in memory" {
            let shards: Vec<usize> = all.iter().map(|b| b.position.shard).collect();
            assert!(shards.contains(&0) && shards.contains(&1), "{name}");
        }
        for i in [5, 13, 22] {
            let (resumed, _) = take(&cfg, positions[i].clone(), 29 - i, 3);
            assert_same(&resumed, &all[i + 1..], &format!("{name}: resumed after batch {i}"));
        }
        // Same data whatever the rows per call: 30 x 3 rows == 10 x 9 rows.
        let (nine, _) = take(&cfg, DataPosition::default(), 10, 9);
        assert_eq!(inputs(&all), inputs(&nine), "{name}");
    }
}

/// Prefetching changes nothing a caller sees: with batches built ahead (`prefetch`, as the
/// training step does before it waits for the device), of the same size or of another (whose
/// rows go back), `next_batch` returns the same batches, and `position` (with the shuffle
/// buffer rebuilt as it was) and `bad_lines` move only as batches are returned.
#[test]
fn prefetched_batches_are_the_batches_next_batch_would_build() {
    let dir = tempfile::tempdir().unwrap();
    for (name, cfg) in every_setting(&small_cfg(dir.path(), 2, 60, 64), 40) {
        let sizes = [16, 16, 16, 9, 16, 16, 5, 5];
        let tok = t5();
        let mut plain = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
        let want: Vec<(Batch, DataPosition)> = sizes.iter().map(|&r| (plain.next_batch(r).unwrap(), plain.position())).collect();
        let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
        let mut got = Vec::new();
        for (i, &rows) in sizes.iter().enumerate() {
            got.push(s.next_batch(rows).unwrap());
            let light = DataPosition { buffer_tokens: vec![], buffer_valid: vec![], ..s.position() };
            assert!(light == got[i].position, "{name}: batch {i}: position is the returned batch's");
            assert!(s.position() == want[i].1, "{name}: batch {i}: position");
            // ahead: two batches of this size (the next request may be another size)
            s.prefetch(rows);
            s.prefetch(rows);
            assert!(s.position() == want[i].1, "{name}: batch {i}: prefetching moved the position");
        }
        let want: Vec<Batch> = want.into_iter().map(|(b, _)| b).collect();
        assert_same(&got, &want, &format!("{name} with prefetching"));
        assert_eq!(s.bad_lines(), plain.bad_lines());
    }
}

/// In memory, every row of the text is read exactly once per pass, each pass in its own
/// order, none of them file order; the rows are those file order cuts.
#[test]
fn in_memory_each_row_appears_once_per_pass_in_a_new_order() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_cfg(dir.path(), 3, 40, 32);
    let [(_, file), (_, memory), _] = orders(1);
    for mode in [SeqMode::Concat, SeqMode::TruncatePad] {
        let base = DataConfig { mode, ..corpus.clone() };
        let tok = t5();
        let mut s = TrainStream::new(&in_order(&base, &memory), &tok, DataPosition::default()).unwrap();
        let rows = s.pass_size();
        let mut f = TrainStream::new(&in_order(&base, &file), &tok, DataPosition::default()).unwrap();
        let row = |b: &Batch| (b.input.clone(), b.target.clone(), b.target_tokens());
        let mut file_rows = Vec::new();
        while f.position().epoch == 0 {
            file_rows.push(row(&f.next_batch(1).unwrap()));
        }
        file_rows.pop(); // the first row of pass 1
        let n = file_rows.len();
        assert!(n >= 40, "{n} rows");
        let passes: Vec<Vec<_>> = (0..3).map(|_| (0..n).map(|_| row(&s.next_batch(1).unwrap())).collect()).collect();
        assert_eq!((s.position().epoch, s.position().row), (2, n as u64), "three passes");
        let mut sorted_file = file_rows.clone();
        sorted_file.sort();
        for (p, pass) in passes.iter().enumerate() {
            let mut sorted = pass.clone();
            sorted.sort();
            assert!(sorted == sorted_file, "{mode:?}: pass {p} holds each row of the text once");
            assert!(*pass != file_rows, "{mode:?}: pass {p} is not in file order");
            let kept = pass.iter().zip(&file_rows).filter(|(a, b)| a == b).count();
            assert!(kept < 5, "{mode:?}: pass {p} keeps {kept} rows in place");
        }
        assert!(passes[0] != passes[1] && passes[1] != passes[2], "{mode:?}: each pass a new order");
        let targets: usize = file_rows.iter().map(|r| r.2).sum();
        assert_eq!(rows, lowbit_data::PassSize { tokens: targets as u64, exact: true, rows: Some(n as u64) }, "{mode:?}");
    }
}

/// `data.seed` alone decides the order: the same seed gives the same rows, another seed
/// other rows (in memory and streaming alike).
#[test]
fn the_data_seed_decides_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_cfg(dir.path(), 4, 60, 32);
    for (name, order) in orders(50).into_iter().skip(1) {
        let with_seed = |seed| DataConfig { seed: Some(seed), ..in_order(&corpus, &order) };
        let (a, _) = take(&with_seed(3), DataPosition::default(), 20, 8);
        let (b, _) = take(&with_seed(3), DataPosition::default(), 20, 8);
        let (c, _) = take(&with_seed(4), DataPosition::default(), 20, 8);
        assert_same(&a, &b, &format!("{name}: seed 3 twice"));
        assert_ne!(inputs(&a), inputs(&c), "{name}: seeds 3 and 4");
    }
}

/// Streaming: a step's rows come from all over the text, not from a run of one document (in
/// file order, concat rows follow each other: each row's last target is the next row's first
/// input). The shards' order per pass is `source.rs`'s unit test.
#[test]
fn streaming_mixes_the_rows_of_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_cfg(dir.path(), 6, 120, 64);
    let [(_, file), _, (_, streaming)] = orders(400);
    let contiguous = |order: &DataConfig| -> usize {
        let (batches, _) = take(&in_order(&corpus, order), DataPosition::default(), 30, 32);
        let b = &batches[29];
        (1..32).filter(|&r| b.input[r * 64] == b.target[r * 64 - 1]).count()
    };
    let (in_file_order, streamed) = (contiguous(&file), contiguous(&streaming));
    assert!(
        in_file_order >= 28 && streamed <= 3,
        "rows following their predecessor: file order {in_file_order}, streaming {streamed} of 31"
    );
}

/// A resume over training shards that changed since the position was taken (a file edited or
/// replaced: its size changed) is warned about; unchanged ones are not.
#[test]
fn a_resume_over_changed_shards_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = DataConfig { shuffle: false, ..small_cfg(dir.path(), 2, 20, 32) };
    let (_, positions) = take(&corpus, DataPosition::default(), 3, 4);
    let warned = |logs: &str| logs.contains("the training shards differ from those the position was taken in");
    let (_, logs) = with_logs(|| TrainStream::new(&corpus, &t5(), positions[2].clone()).unwrap());
    assert!(!warned(&logs), "{logs}");
    let shard = std::path::PathBuf::from(&corpus.train[1]);
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes.extend(std::fs::read(&corpus.train[0]).unwrap()); // another gzip member: more documents
    std::fs::write(&shard, bytes).unwrap();
    let (_, logs) = with_logs(|| TrainStream::new(&corpus, &t5(), positions[2].clone()).unwrap());
    assert!(warned(&logs), "{logs}");
}

#[test]
fn a_resume_in_another_order_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_cfg(dir.path(), 2, 30, 32);
    let [(_, file), (_, memory), (_, streaming)] = orders(20);
    let (_, positions) = take(&in_order(&corpus, &file), DataPosition::default(), 3, 4);
    let e = TrainStream::new(&in_order(&corpus, &memory), &t5(), positions[2].clone()).err().unwrap().to_string();
    assert!(
        e.contains("file order (data.shuffle = false)") && e.contains("rows permuted in memory (data.shuffle = true, data.seed = 0)"),
        "{e}"
    );
    let (_, positions) = take(&in_order(&corpus, &streaming), DataPosition::default(), 3, 4);
    let other_seed = DataConfig { seed: Some(1), ..in_order(&corpus, &streaming) };
    let e = TrainStream::new(&other_seed, &t5(), positions[2].clone()).err().unwrap().to_string();
    assert!(e.contains("data.seed = 0, data.shuffle_buffer = 20") && e.contains("data.seed = 1"), "{e}");
    // a batch's position lacks the buffer: refused, not read as an empty buffer
    let light = DataPosition { buffer_tokens: vec![], buffer_valid: vec![], ..positions[2].clone() };
    let e = TrainStream::new(&in_order(&corpus, &streaming), &t5(), light).err().unwrap().to_string();
    assert!(e.contains("TrainStream::position()"), "{e}");
}

#[test]
fn stream_counts_skipped_bad_lines_and_fails_on_them_in_fail_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gz(
        dir.path(),
        "c4-train.00000-of-00001.json.gz",
        &[c4("one two three four five six seven"), "{oops".into(), c4("eight nine ten eleven twelve")],
    );
    let mut cfg = cfg(&[&path], &[&path], 4);
    cfg.shuffle = false;
    let tok = t5();
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    // Document 1 is 8 tokens with EOS: exactly one row of 5 (4 inputs + 1).
    assert_eq!(t5().encode("one two three four five six seven").unwrap().len(), 8);
    s.next_batch(1).unwrap();
    assert_eq!(s.bad_lines(), 0, "the bad line is not consumed yet");
    s.next_batch(2).unwrap(); // both rows end in document 3, after the bad line
    assert_eq!(s.bad_lines(), 1);
    for _ in 0..10 {
        s.next_batch(2).unwrap();
    }
    assert!(s.bad_lines() >= 3, "counted again in every epoch: {}", s.bad_lines());

    cfg.on_bad_line = BadInput::Fail;
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let err = s.next_batch(8).unwrap_err();
    assert!(err.to_string().contains("c4-train.00000-of-00001.json.gz:2: bad C4 line"), "{err}");
    assert!(matches!(s.next_batch(1), Err(DataError::StreamClosed)));
    // met while prefetching: kept for the next_batch that needs rows past it
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    s.prefetch(8);
    let err = s.next_batch(8).unwrap_err();
    assert!(err.to_string().contains("c4-train.00000-of-00001.json.gz:2: bad C4 line"), "{err}");
    assert!(matches!(s.next_batch(1), Err(DataError::StreamClosed)));
    // in memory the whole text is read at the start: the bad line stops it there
    cfg.shuffle = true;
    let err = TrainStream::new(&cfg, &tok, DataPosition::default()).err().unwrap();
    assert!(err.to_string().contains("c4-train.00000-of-00001.json.gz:2: bad C4 line"), "{err}");
}

#[test]
fn corrupt_shard_is_skipped_and_reading_goes_on_with_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..3000).map(|i| c4(&format!("doc {i} {}", i * 31))).collect();
    let bad = write_gz(dir.path(), "c4-train.00000-of-00002.json.gz", &lines);
    let bytes = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    let good_docs: Vec<String> =
        (0..10).map(|i| c4(&format!("the good shard holds this longer document number {i}, read after the corrupt one"))).collect();
    let good = write_gz(dir.path(), "c4-train.00001-of-00002.json.gz", &good_docs);
    let mut cfg = cfg(&[&bad, &good], &[&good], 32);
    cfg.shuffle = false;
    let tok = t5();
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let mut reached = false;
    for _ in 0..200 {
        if s.next_batch(8).unwrap().position.shard == 1 {
            reached = true;
            break;
        }
    }
    assert!(reached, "the good shard after the corrupt one was never reached");

    cfg.on_bad_line = BadInput::Fail;
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let err = (0..200).find_map(|_| s.next_batch(8).err()).expect("corrupt shard must fail");
    assert!(matches!(err, DataError::Corrupt { .. }) && err.to_string().contains("c4-train.00000-of-00002.json.gz"), "{err}");
}

#[test]
fn no_train_text_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write_gz(dir.path(), "c4-train.00000-of-00001.json.gz", &[]);
    let blank = write_gz(dir.path(), "c4-train.00001-of-00001.json.gz", &[c4(""), c4("   ")]);
    let cfg = cfg(&[&empty, &blank], &[&empty], 8);
    // found when the stream opens (before a run claims its folder)
    let err = TrainStream::new(&cfg, &t5(), DataPosition::default()).err().unwrap();
    assert!(matches!(err, DataError::NoText { what: "train", .. }), "{err:?}");
}

#[test]
fn bad_resume_position_is_rejected() {
    let mut cfg = cfg(&[&sample_train()], &[&sample_validation()], 8);
    cfg.shuffle = false;
    let pos = DataPosition { epoch: 0, shard: 3, line: 0, ..DataPosition::default() };
    let err = TrainStream::new(&cfg, &t5(), pos).err().unwrap();
    assert!(matches!(err, DataError::BadPosition { shard: 3, count: 1 }), "{err:?}");
}

#[test]
fn validation_is_deterministic_and_sized_in_target_tokens() {
    let tok = t5();
    let mut cfg = cfg(&[&sample_train()], &[&sample_validation()], 128);
    cfg.val_tokens = 50_000;
    let a = validation_batches(&cfg, &tok, 32).unwrap();
    let b = validation_batches(&cfg, &tok, 32).unwrap();
    assert_eq!(a, b);
    // ceil(50_000 / 128) = 391 rows of 128 targets: 12 batches of 32 + one of 7.
    let rows: Vec<usize> = a.iter().map(|b| b.rows).collect();
    assert_eq!(rows.len(), 13);
    assert_eq!(rows.iter().sum::<usize>(), 391);
    assert_eq!(*rows.last().unwrap(), 7);
    // The first row is the start of the first validation document.
    let first_doc = lowbit_data::ShardReader::open(&sample_validation(), BadInput::Fail).unwrap().next_text().unwrap().unwrap();
    let ids = tok.encode(&first_doc).unwrap();
    let n = ids.len().min(128);
    assert_eq!(&a[0].input[..n], &ids[..n]);

    cfg.mode = SeqMode::TruncatePad;
    cfg.val_tokens = 10_000; // 183 documents of at most 128 targets each hold ~21k
    let t = validation_batches(&cfg, &tok, 32).unwrap();
    let targets: usize = t.iter().map(|b| b.target_tokens()).sum();
    let last_row: usize = t.last().unwrap().mask[(t.last().unwrap().rows - 1) * 128..].iter().filter(|&&m| m == 1.0).count();
    assert!(targets >= 10_000 && targets - last_row < 10_000, "{targets}");
    assert_eq!(t, validation_batches(&cfg, &tok, 32).unwrap());
}

#[test]
fn whole_bundled_validation_shard_when_val_tokens_exceeds_it() {
    let tok = t5();
    let mut cfg = cfg(&[&sample_train()], &[&sample_validation()], 256);
    cfg.val_tokens = usize::MAX;
    let v = validation_batches(&cfg, &tok, 64).unwrap();
    let targets: usize = v.iter().map(|b| b.target_tokens()).sum();
    println!("bundled validation shard: {targets} concat targets at seq_len 256");
    assert!(targets > 100_000);
}

#[test]
fn config_parses_with_defaults_and_rejects_unknown_keys() {
    let cfg: DataConfig = toml::from_str(
        r#"
        train = ["data/local/c4/en/c4-train.*-of-01024.json.gz"]
        mode = "truncate_pad"
        on_bad_line = "fail"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.mode, SeqMode::TruncatePad);
    assert_eq!(cfg.on_bad_line, BadInput::Fail);
    assert_eq!((cfg.seq_len, cfg.val_tokens, cfg.allow_download), (256, 1_000_000, false));
    assert_eq!((cfg.shuffle, cfg.seed, cfg.shuffle_buffer, cfg.in_memory_max_tokens), (true, None, 10_000, 250_000_000));
    let e = DataConfig { shuffle_buffer: 0, ..cfg.clone() }.validate().unwrap_err().to_string();
    assert!(e.contains("shuffle_buffer = 0"), "{e}");
    let e = DataConfig { shuffle_buffer: lowbit_data::MAX_SHUFFLE_BUFFER + 1, ..cfg.clone() }.validate().unwrap_err().to_string();
    assert!(e.contains("data.shuffle_buffer: must be in 1..=100000000 rows") && e.ends_with("got 100000001"), "{e}");
    assert_eq!(cfg.validation, ["data/c4-sample/en-validation.*.json.gz"]);
    assert_eq!(DataConfig::default().mode, SeqMode::Concat);
    let err = toml::from_str::<DataConfig>("seqlen = 128").unwrap_err().to_string();
    assert!(err.contains("unknown field `seqlen`"), "{err}");
    assert!(toml::from_str::<DataConfig>("mode = \"packed\"").is_err());
}
