//! Validation documents shared with the training shards are counted (the trainer warns).

mod common;

use common::*;
use lowbit_data::shared_documents;

#[test]
fn bundled_validation_is_disjoint_from_train() {
    let (train, val) = (sample_train(), sample_validation());
    assert_eq!(shared_documents(&cfg(&[&train], &[&val], 64), &t5(), 200).unwrap(), 0);
}

#[test]
fn validation_set_to_the_training_files_is_detected() {
    let train = sample_train();
    assert_eq!(shared_documents(&cfg(&[&train], &[&train], 64), &t5(), 200).unwrap(), 200);
}

#[test]
fn a_few_shared_documents_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let docs: Vec<String> = (0..10).map(|i| c4(&format!("training document number {i}"))).collect();
    let train = write_gz(dir.path(), "train.json.gz", &docs);
    let mut val_docs = vec![c4("a validation document"), c4("another one")];
    val_docs.extend([docs[2].clone(), docs[7].clone(), docs[9].clone()]);
    let val = write_gz(dir.path(), "val.json.gz", &val_docs);
    let cfg = cfg(&[&train], &[&val], 16);
    assert_eq!(shared_documents(&cfg, &t5(), 100).unwrap(), 3);
    // Only the first `sample` documents of each side are compared: docs[2] is among the first
    // 4 of both; docs[7] only among validation's.
    assert_eq!(shared_documents(&cfg, &t5(), 4).unwrap(), 1);
}
