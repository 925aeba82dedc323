//! The shard reader: good input, bad lines, corrupt gzip, missing files, empty shards.

mod common;

use common::*;
use lowbit_data::{expand_shards, BadInput, DataError, ShardReader};

#[test]
fn bundled_shards_have_the_documented_document_counts() {
    let val = ShardReader::open(&sample_validation(), BadInput::Fail).unwrap();
    assert_eq!(val.count_documents().unwrap(), 183);
    let train = ShardReader::open(&sample_train(), BadInput::Fail).unwrap();
    assert_eq!(train.count_documents().unwrap(), 1040);
}

#[test]
fn reads_text_in_order_gzip_and_plain() {
    let dir = tempfile::tempdir().unwrap();
    let lines = vec![c4("first doc"), c4("second doc"), c4("third doc")];
    let gz = write_gz(dir.path(), "a.json.gz", &lines);
    let plain = dir.path().join("b.json");
    std::fs::write(&plain, lines.join("\n") + "\n").unwrap();
    for p in [gz, plain] {
        let texts: Vec<String> = ShardReader::open(&p, BadInput::Fail).unwrap().map(Result::unwrap).collect();
        assert_eq!(texts, ["first doc", "second doc", "third doc"]);
    }
}

fn bad_file(dir: &std::path::Path) -> std::path::PathBuf {
    write_gz(
        dir,
        "bad.json.gz",
        &[
            c4("good one"),
            "this is { not json".to_string(),
            r#"{"timestamp": "", "url": "no text field"}"#.to_string(),
            r#"{"text": 42, "url": "text is not a string"}"#.to_string(),
            c4("good two"),
        ],
    )
}

#[test]
fn bad_lines_are_skipped_counted_and_logged_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_file(dir.path());
    let ((texts, bad), logs) = with_logs(|| {
        let mut r = ShardReader::open(&path, BadInput::Skip).unwrap();
        let texts: Vec<String> = r.by_ref().map(Result::unwrap).collect();
        (texts, r.bad_lines())
    });
    assert_eq!(texts, ["good one", "good two"]);
    assert_eq!(bad, 3);
    let name = path.display().to_string();
    for line in [2, 3, 4] {
        assert!(logs.contains(&format!("{name}:{line}: skipping bad C4 line")), "line {line} not in logs:\n{logs}");
    }
    assert!(!logs.contains(&format!("{name}:1:")) && !logs.contains(&format!("{name}:5:")));
}

#[test]
fn bad_line_fails_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_file(dir.path());
    let mut r = ShardReader::open(&path, BadInput::Fail).unwrap();
    assert_eq!(r.next_text().unwrap().as_deref(), Some("good one"));
    let err = r.next_text().unwrap_err();
    assert!(matches!(err, DataError::BadLine { line: 2, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("{}:2: bad C4 line: not JSON", path.display())), "{msg}");

    // The line missing `text` is named too.
    let mut r = ShardReader::open(&path, BadInput::Fail).unwrap();
    r.skip_lines(2).unwrap();
    let msg = r.next_text().unwrap_err().to_string();
    assert!(msg.contains("bad.json.gz:3:") && msg.contains("missing field `text`"), "{msg}");
}

fn truncated_gz(dir: &std::path::Path) -> std::path::PathBuf {
    let lines: Vec<String> = (0..2000).map(|i| c4(&format!("document number {i} with some words {}", i * 7919))).collect();
    let path = write_gz(dir, "trunc.json.gz", &lines);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    path
}

#[test]
fn truncated_gzip_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = truncated_gz(dir.path());
    let r = ShardReader::open(&path, BadInput::Fail).unwrap();
    let err = r.count_documents().unwrap_err();
    assert!(matches!(err, DataError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()) && msg.contains("corrupt or truncated gzip"), "{msg}");
}

#[test]
fn truncated_gzip_is_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = truncated_gz(dir.path());
    let (n, logs) = with_logs(|| ShardReader::open(&path, BadInput::Skip).unwrap().count_documents().unwrap());
    assert!(n > 100 && n < 2000, "read {n} documents before the cut");
    assert!(logs.contains("corrupt or truncated gzip stream") && logs.contains("trunc.json.gz"), "{logs}");
}

#[test]
fn missing_file_and_empty_glob_name_the_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("c4-train.00000-of-01024.json.gz").display().to_string();
    let err = expand_shards(std::slice::from_ref(&missing), "train").unwrap_err();
    assert!(matches!(err, DataError::MissingFile { .. }));
    assert_eq!(err.to_string(), format!("train shard '{missing}' does not exist"));

    let pattern = dir.path().join("c4-validation.*.json.gz").display().to_string();
    let err = expand_shards(std::slice::from_ref(&pattern), "validation").unwrap_err();
    assert_eq!(err.to_string(), format!("validation pattern '{pattern}' matched no file"));
}

#[test]
fn glob_expansion_is_sorted_and_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    for i in [2, 0, 1] {
        write_gz(dir.path(), &format!("c4-train.0000{i}-of-00003.json.gz"), &[c4("x")]);
    }
    let pat = dir.path().join("c4-train.*.json.gz").display().to_string();
    let one = dir.path().join("c4-train.00001-of-00003.json.gz").display().to_string();
    let shards = expand_shards(&[pat, one], "train").unwrap();
    let names: Vec<String> = shards.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["c4-train.00000-of-00003.json.gz", "c4-train.00001-of-00003.json.gz", "c4-train.00002-of-00003.json.gz"]);
}

#[test]
fn empty_shards_warn_and_hold_no_documents() {
    let dir = tempfile::tempdir().unwrap();
    let zero_bytes = dir.path().join("zero.json.gz");
    std::fs::write(&zero_bytes, b"").unwrap();
    let empty_gz = write_gz(dir.path(), "empty.json.gz", &[]);
    for p in [zero_bytes, empty_gz] {
        let (n, logs) = with_logs(|| ShardReader::open(&p, BadInput::Fail).unwrap().count_documents().unwrap());
        assert_eq!(n, 0);
        assert!(logs.contains("empty shard") && logs.contains(&p.display().to_string()), "{logs}");
    }
}
