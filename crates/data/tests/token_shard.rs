//! Token shards (`train data tokenize`): the same rows as the text they come from, in every
//! row order; refused when made with another tokenizer or damaged.

mod common;

use common::*;
use lowbit_data::token_shard::{check_tokenizer, read_header, token_shard_path, tokenize_shard};
use lowbit_data::{load_tokenizer, shared_documents, validation_batches, BadInput, DataError, DataPosition, TrainStream};
use std::path::{Path, PathBuf};

/// Token shards of `texts` in `out`.
fn tokenized(texts: &[PathBuf], out: &Path) -> Vec<PathBuf> {
    let tok = t5();
    texts
        .iter()
        .map(|src| {
            let dst = token_shard_path(src, out);
            tokenize_shard(src, &dst, &tok, BadInput::Fail, 3).unwrap();
            dst
        })
        .collect()
}

#[test]
fn token_shards_give_the_rows_of_their_text_in_every_order() {
    let dir = tempfile::tempdir().unwrap();
    let texts = small_corpus(dir.path(), 3, 45);
    let out = dir.path().join("tok");
    std::fs::create_dir(&out).unwrap();
    let shards = tokenized(&texts, &out);
    assert_eq!(shards[1].file_name().unwrap(), "c4-train.00001-of-00003.tokens.zst");
    let tok = t5();
    let h = read_header(&shards[0]).unwrap();
    assert_eq!((h.vocab_size, h.eos_id, h.documents, h.source.as_str()), (32100, 1, 15, "c4-train.00000-of-00003.json.gz"));
    assert_eq!(h.tokenizer, "t5-tokenizer.json");
    assert_eq!(h.tokenizer_sha256, tok.sha256);
    let texts_ref: Vec<&Path> = texts.iter().map(PathBuf::as_path).collect();
    let shards_ref: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    for (name, order) in orders(30) {
        let from_text = in_order(&cfg(&texts_ref, &texts_ref, 32), &order);
        let from_tokens = in_order(&cfg(&shards_ref, &shards_ref, 32), &order);
        let mut a = TrainStream::new(&from_text, &tok, DataPosition::default()).unwrap();
        let mut b = TrainStream::new(&from_tokens, &tok, DataPosition::default()).unwrap();
        for i in 0..40 {
            let (x, y) = (a.next_batch(7).unwrap(), b.next_batch(7).unwrap());
            assert!(x.input == y.input && x.target == y.target && x.mask == y.mask, "{name}: batch {i}");
        }
        let other_files = DataPosition { shards_id: a.position().shards_id, ..b.position() };
        assert_eq!(a.position(), other_files, "{name}: the same position (lines count documents), of other files");
        if name == "in memory" {
            assert_eq!(a.pass_size(), b.pass_size());
        } else {
            assert!(b.pass_size().exact && !a.pass_size().exact, "{name}: a token shard's size is known");
        }
    }
    assert_eq!(
        validation_batches(&cfg(&texts_ref, &texts_ref, 32), &tok, 8).unwrap(),
        validation_batches(&cfg(&shards_ref, &shards_ref, 32), &tok, 8).unwrap()
    );
    // the text's documents are found among the token shard's, by their ids
    assert_eq!(shared_documents(&cfg(&shards_ref, &texts_ref, 32), &tok, 100).unwrap(), 45);
}

#[test]
fn the_file_is_zstd_around_safetensors_with_u16_ids() {
    let dir = tempfile::tempdir().unwrap();
    let texts = small_corpus(dir.path(), 1, 5);
    let shard = &tokenized(&texts, dir.path())[0];
    let raw = zstd::stream::decode_all(std::fs::File::open(shard).unwrap()).unwrap();
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    let t = st.tensor("tokens").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::U16);
    let tok = t5();
    let first = lowbit_data::ShardReader::open(&texts[0], BadInput::Fail).unwrap().next_text().unwrap().unwrap();
    let ids = tok.encode(&first).unwrap();
    let got: Vec<u32> = t.data().chunks_exact(2).take(ids.len()).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).collect();
    assert_eq!(got, ids);
    let ends = st.tensor("doc_ends").unwrap();
    assert_eq!((ends.dtype(), ends.shape()), (safetensors::Dtype::U64, &[5][..]));
    assert_eq!(u64::from_le_bytes(ends.data()[..8].try_into().unwrap()), ids.len() as u64);
    // each document's CRC-32 (IEEE) of its ids as stored
    let crcs = st.tensor("doc_crc32").unwrap();
    assert_eq!((crcs.dtype(), crcs.shape()), (safetensors::Dtype::U32, &[5][..]));
    let first_bytes = &t.data()[..2 * ids.len()];
    assert_eq!(u32::from_le_bytes(crcs.data()[..4].try_into().unwrap()), crc32fast::hash(first_bytes));
}

#[test]
fn a_shard_of_another_tokenizer_or_damaged_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let texts = small_corpus(dir.path(), 1, 5);
    let shard = tokenized(&texts, dir.path()).remove(0);
    // the same vocabulary in another file: refused too (ids are only safe with the same file)
    let other = dir.path().join("other-tokenizer.json");
    let mut json = std::fs::read_to_string(repo_data().join("tokenizers/t5-tokenizer.json")).unwrap();
    json.push('\n');
    std::fs::write(&other, json).unwrap();
    let other_tok = load_tokenizer(other.to_str().unwrap(), false).unwrap();
    let mut c = cfg(&[&shard], &[&shard], 16);
    c.tokenizer = other.display().to_string();
    let e = TrainStream::new(&c, &other_tok, DataPosition::default()).err().unwrap();
    assert!(matches!(e, DataError::TokenizerMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("tokenized with t5-tokenizer.json") && msg.contains("other-tokenizer.json") && msg.contains("train data tokenize"),
        "{msg}"
    );
    let e = validation_batches(&c, &other_tok, 4).unwrap_err().to_string();
    assert!(e.contains("tokenized with t5-tokenizer.json"), "{e}");

    // beside the text it was made from: every document twice
    let both = cfg(&[&texts[0], &shard], &[&texts[0]], 16);
    let e = TrainStream::new(&both, &t5(), DataPosition::default()).err().unwrap().to_string();
    assert!(e.contains("data.train lists") && e.contains("the text shard it was tokenized from"), "{e}");
    let e = validation_batches(&cfg(&[&texts[0]], &[&shard, &texts[0]], 16), &t5(), 4).unwrap_err().to_string();
    assert!(e.contains("data.validation lists"), "{e}");

    // truncated
    let bytes = std::fs::read(&shard).unwrap();
    let cut = dir.path().join("cut.tokens.zst");
    std::fs::write(&cut, &bytes[..bytes.len() - 40]).unwrap();
    let c = cfg(&[&cut], &[&cut], 16);
    let e = TrainStream::new(&c, &t5(), DataPosition::default()).err().unwrap().to_string();
    assert!(e.contains("cut.tokens.zst: not a usable token shard") && e.contains("incomplete frame"), "{e}");
    // zstd, but not a token shard
    let plain = dir.path().join("plain.tokens.zst");
    std::fs::write(&plain, zstd::encode_all(&b"{\"text\": \"hello\"}\n"[..], 3).unwrap()).unwrap();
    let e = read_header(&plain).unwrap_err().to_string();
    assert!(e.contains("plain.tokens.zst: not a usable token shard"), "{e}");
}

/// The token shards bundled in data/c4-sample (what configs/tiny_cpu.toml and the trainer's
/// tests read) hold exactly the bundled JSON shards' text, tokenized with the bundled T5
/// tokenizer: remade by `train data tokenize` when either changes (data/README.md).
#[test]
fn the_bundled_token_shards_are_the_bundled_text() {
    let tok = t5();
    for (json, tokens) in [
        (sample_train(), repo_data().join("c4-sample/en-train.00000-of-00001.tokens.zst")),
        (sample_validation(), repo_data().join("c4-sample/en-validation.00000-of-00001.tokens.zst")),
    ] {
        let all = |p: &Path| {
            let mut c = cfg(&[p], &[p], 256);
            c.val_tokens = usize::MAX;
            validation_batches(&c, &tok, 64).unwrap()
        };
        assert!(all(&json) == all(&tokens), "{} is not {} tokenized", tokens.display(), json.display());
    }
}

/// The shard's bytes as safetensors (decompressed), changed by `edit`, written back as one
/// zstd frame at `dst`.
fn rewrite(src: &Path, dst: &Path, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let raw = zstd::stream::decode_all(std::fs::File::open(src).unwrap()).unwrap();
    std::fs::write(dst, zstd::encode_all(&edit(raw)[..], 3).unwrap()).unwrap();
}

/// One flipped byte in a document's ids (zstd checks nothing here: the frame decodes) is refused
/// when that document is read, naming the shard and the document, before any of its ids is
/// used; the other documents read as before.
#[test]
fn a_flipped_byte_is_refused_naming_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let texts = small_corpus(dir.path(), 1, 5);
    let shard = tokenized(&texts, dir.path()).remove(0);
    assert!(read_header(&shard).unwrap().checksums);
    let bad = dir.path().join("flipped.tokens.zst");
    rewrite(&shard, &bad, |mut raw| {
        let n = raw.len();
        raw[n - 3] ^= 0x01; // the low byte of an id of the last document
        raw
    });
    let tok = t5();
    let mut c = cfg(&[&bad], &[&bad], 16);
    c.val_tokens = usize::MAX;
    let e = validation_batches(&c, &tok, 4).unwrap_err().to_string();
    assert!(e.contains("flipped.tokens.zst: not a usable token shard") && e.contains("document 4: its ids have CRC-32"), "{e}");
    assert!(e.contains("the shard is corrupt"), "{e}");
    // in memory (the default) the shard is read whole before the first step: refused at start;
    // streaming, when the reader reaches the document, before its ids make a batch
    let e = TrainStream::new(&cfg(&[&bad], &[&shard], 16), &tok, DataPosition::default()).err().unwrap().to_string();
    assert!(e.contains("flipped.tokens.zst") && e.contains("document 4"), "{e}");
    let mut streaming = cfg(&[&bad], &[&shard], 16);
    streaming.in_memory_max_tokens = 0;
    let mut stream = TrainStream::new(&streaming, &tok, DataPosition::default()).unwrap();
    let e = (0..100).find_map(|_| stream.next_batch(4).err()).expect("the corrupt document is refused").to_string();
    assert!(e.contains("flipped.tokens.zst") && e.contains("document 4"), "{e}");
}

/// A shard of format version 1 (before the checksums: no `doc_crc32`) is still read, the same
/// rows as today's.
#[test]
fn a_version_1_shard_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let texts = small_corpus(dir.path(), 1, 5);
    let shard = tokenized(&texts, dir.path()).remove(0);
    let old = dir.path().join("old.tokens.zst");
    rewrite(&shard, &old, |raw| {
        let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&raw).unwrap();
        let mut meta = meta.metadata().clone().unwrap();
        meta.insert("version".into(), "1".into());
        let keep: Vec<(String, safetensors::tensor::TensorView)> =
            ["tokens", "doc_ends"].iter().map(|n| (n.to_string(), st.tensor(n).unwrap())).collect();
        safetensors::serialize(keep, Some(meta)).unwrap()
    });
    assert!(!read_header(&old).unwrap().checksums);
    let tok = t5();
    let all = |p: &Path| {
        let mut c = cfg(&[p], &[p], 32);
        c.val_tokens = usize::MAX;
        validation_batches(&c, &tok, 8).unwrap()
    };
    assert!(all(&old) == all(&shard));
}

/// A token shard made with the same tokenizer file but another EOS
/// (`data.eos_token`) is refused, naming both ids and the key.
#[test]
fn a_token_shard_of_another_eos_is_refused() {
    let shard = repo_data().join("c4-sample/en-train.00000-of-00001.tokens.zst");
    let header = read_header(&shard).unwrap();
    check_tokenizer(&shard, &header, &t5()).unwrap();
    let t5_path = repo_data().join("tokenizers/t5-tokenizer.json");
    let pad_eos = lowbit_data::load_tokenizer_eos(t5_path.to_str().unwrap(), false, Some("<pad>")).unwrap();
    assert_eq!(pad_eos.eos_id, 0);
    let err = check_tokenizer(&shard, &header, &pad_eos).unwrap_err();
    assert!(matches!(err, DataError::TokenShard { .. }));
    let err = err.to_string();
    assert!(err.contains("EOS id 1") && err.contains("is id 0") && err.contains("data.eos_token"), "{err}");
}

/// A vocabulary past 65,536 ids (LLaMA-3's 128,256) is stored as `U32` ids and round-trips: a
/// word-level tokenizer of 70,000 words, documents of words past id 65,535, tokenized into a
/// shard whose ids read back as the text's.
#[test]
fn a_vocabulary_past_u16_round_trips_as_u32_ids() {
    let dir = tempfile::tempdir().unwrap();
    let n = 70_000;
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    for i in 1..n - 1 {
        vocab.insert(format!("w{i}"), i.into());
    }
    vocab.insert("</s>".into(), (n - 1).into());
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": n - 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    let tok_path = dir.path().join("wide-tokenizer.json");
    std::fs::write(&tok_path, tokenizer.to_string()).unwrap();
    let tok = lowbit_data::load_tokenizer(tok_path.to_str().unwrap(), false).unwrap();
    assert_eq!((tok.vocab_size(), tok.eos_id), (n, n as u32 - 1));
    let texts: Vec<String> = (0..6).map(|d| (0..40).map(|k| format!("w{}", 65_500 + d * 40 + k)).collect::<Vec<_>>().join(" ")).collect();
    let src = write_gz(dir.path(), "wide.json.gz", &texts.iter().map(|t| c4(t)).collect::<Vec<_>>());
    let dst = token_shard_path(&src, dir.path());
    tokenize_shard(&src, &dst, &tok, BadInput::Fail, 3).unwrap();
    let raw = zstd::stream::decode_all(std::fs::File::open(&dst).unwrap()).unwrap();
    assert_eq!(safetensors::SafeTensors::deserialize(&raw).unwrap().tensor("tokens").unwrap().dtype(), safetensors::Dtype::U32);
    let all = |p: &Path| {
        let mut c = cfg(&[p], &[p], 32);
        c.tokenizer = tok_path.display().to_string();
        c.val_tokens = usize::MAX;
        validation_batches(&c, &tok, 4).unwrap()
    };
    let (from_text, from_shard) = (all(&src), all(&dst));
    assert!(from_text == from_shard, "the shard's ids are the text's");
    let max = from_shard.iter().flat_map(|b| b.input.iter().copied()).max().unwrap();
    assert!(max > 65_535, "ids past u16 were stored: {max}");
}
