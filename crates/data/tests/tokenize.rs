//! Tokenizer loading and encoding.

mod common;

use common::*;
use lowbit_data::{load_tokenizer, DataError};

#[test]
fn t5_hello_world() {
    let tok = t5();
    assert_eq!(tok.encode("Hello world").unwrap(), [8774, 296, 1]);
    assert_eq!((tok.eos_id, tok.pad_id, tok.vocab_size()), (1, 0, 32100));
    let batch = tok.encode_batch(&["Hello world", "Hello"]).unwrap();
    assert_eq!(batch, vec![vec![8774, 296, 1], vec![8774, 1]]);
    assert_eq!(tok.decode(&batch[0]).unwrap(), "Hello world");
}

#[test]
fn llama2_uses_eos_2_and_pads_with_eos() {
    let path = std::path::Path::new("/work/shared/data/tokenizers/llama2-tokenizer.json");
    if !path.exists() {
        eprintln!("skipped: {} not present", path.display());
        return;
    }
    let tok = load_tokenizer(path.to_str().unwrap(), false).unwrap();
    assert_eq!((tok.eos_id, tok.pad_id, tok.vocab_size()), (2, 2, 32000));
    // No BOS: documents are text + EOS only.
    assert_eq!(tok.encode("Hello world!").unwrap(), [15043, 3186, 29991, 2]);
}

#[test]
fn missing_file_and_undownloadable_hub_id_say_how_to_fix() {
    let err = load_tokenizer("data/tokenizers/nope.json", false).unwrap_err();
    assert!(matches!(err, DataError::Tokenizer { .. }));
    assert!(err.to_string().contains("file not found"), "{err}");

    // Point the hub cache at an empty folder so the lookup cannot succeed.
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("HF_HOME", dir.path());
    let err = load_tokenizer("google-t5/t5-base", false).unwrap_err().to_string();
    assert!(err.contains("allow_download = true") && err.contains("data/tokenizers/t5-tokenizer.json"), "{err}");
}
