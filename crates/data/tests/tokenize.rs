//! Tokenizer loading and encoding.

mod common;

use common::*;
use std::path::{Path, PathBuf};

use lowbit_data::{load_tokenizer, DataError, Tokens};

#[test]
fn t5_hello_world() {
    let tok = t5();
    assert_eq!(tok.encode("Hello world").unwrap(), [8774, 296, 1]);
    assert_eq!((tok.eos_id, tok.pad_id, tok.vocab_size(), tok.bos_id), (1, 0, 32100, None));
    let batch = tok.encode_batch(&["Hello world", "Hello"]).unwrap();
    assert_eq!(batch, vec![vec![8774, 296, 1], vec![8774, 1]]);
    assert_eq!(tok.decode(&batch[0]).unwrap(), "Hello world");
}

#[test]
#[ignore = "reads the LLaMA-2 tokenizer from ../shared/data/tokenizers/, outside the repository (a fresh clone elsewhere lacks it): run with --ignored where ../shared is present"]
fn llama2_uses_eos_2_and_pads_with_eos() {
    let path = shared_tokenizer("llama2-tokenizer.json");
    let tok = load_tokenizer(path.to_str().unwrap(), false).unwrap();
    assert_eq!((tok.eos_id, tok.pad_id, tok.vocab_size(), tok.bos_id), (2, 2, 32000, Some(1)));
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

/// Every special token of `tok`, written in a document's text, stays text: the only control
/// id of the encoding is the EOS the pipeline appends (`<unk>` may stand for a character the
/// vocabulary lacks, such as T5's `<`, as it would anywhere in text).
fn special_tokens_in_text_stay_text(tok: &Tokens) {
    let unk = tok.tokenizer().token_to_id("<unk>");
    let specials: Vec<(u32, String)> =
        tok.tokenizer().get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, t)| (id, t.content)).collect();
    assert!(specials.len() >= 3, "{} special tokens", specials.len());
    for (_, text) in &specials {
        for doc in [format!("a {text} b"), format!("a{text}b"), text.clone()] {
            let ids = tok.encode(&doc).unwrap();
            let (last, body) = ids.split_last().unwrap();
            assert_eq!(*last, tok.eos_id, "{doc:?}: {ids:?}");
            let control: Vec<&u32> = body.iter().filter(|&&i| Some(i) != unk && specials.iter().any(|(s, _)| *s == i)).collect();
            assert!(control.is_empty(), "{doc:?} encodes control ids {control:?} inside the text: {ids:?}");
            // The text is kept (decoding skips special ids, so a leading `<` may be lost).
            let decoded = tok.decode(&ids).unwrap();
            assert!(decoded.contains(&text[1..]), "{doc:?} -> {ids:?} -> {decoded:?}");
        }
    }
}

#[test]
fn t5_special_tokens_in_text_stay_text() {
    special_tokens_in_text_stay_text(&t5());
}

#[test]
#[ignore = "reads the LLaMA-2 tokenizer from ../shared/data/tokenizers/, outside the repository (a fresh clone elsewhere lacks it): run with --ignored where ../shared is present"]
fn llama2_special_tokens_in_text_stay_text() {
    let path = shared_tokenizer("llama2-tokenizer.json");
    special_tokens_in_text_stay_text(&load_tokenizer(path.to_str().unwrap(), false).unwrap());
}

/// A document longer than `PIECE_BYTES` is encoded in pieces cut at spaces, with
/// the ids of the whole text (each piece's first word gets its `▁` as in context), so the
/// tokenizer's memory is bounded by the piece, not the document.
#[test]
fn long_documents_are_encoded_in_pieces_with_the_whole_texts_ids() {
    use lowbit_data::{pieces, PIECE_BYTES};
    let tok = t5();
    let unit = "the quick brown fox jumps over the lazy dog";
    let n = 2 * PIECE_BYTES / (unit.len() + 1) + 100;
    let text = vec![unit; n].join(" ");
    let cut = pieces(&text);
    assert!(cut.len() == 3 && cut.iter().all(|p| p.len() <= PIECE_BYTES && !p.is_empty() && !p.starts_with(' ')), "{}", cut.len());
    assert_eq!(cut.join(" "), text, "the pieces are the text, cut at spaces");
    let mut unit_ids = tok.encode(unit).unwrap();
    unit_ids.pop(); // EOS
    let mut want: Vec<u32> = unit_ids.iter().copied().cycle().take(unit_ids.len() * n).collect();
    want.push(tok.eos_id);
    assert_eq!(tok.encode(&text).unwrap(), want);
    // a text without spaces is cut on character boundaries
    let wide = "€".repeat(PIECE_BYTES / 3 + 1); // 3 bytes each: the limit falls inside one
    assert!(pieces(&wide).iter().all(|p| p.len() <= PIECE_BYTES) && pieces(&wide).concat() == wide);
}

/// A small GPT-2-style tokenizer (byte-level BPE, ByteLevel pre-tokenizer and decoder, no
/// `</s>`, no `<pad>`) trained with `tokenizers` on a few sentences, with the one special
/// token `special`; saved as `tokenizer.json` in `dir`.
fn byte_level_bpe(dir: &Path, special: &str) -> PathBuf {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(400)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(special.to_string(), true)])
        .build()
        .into();
    let mut tok = Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    let text =
        ["Hello world, the world says hello.", "The quick brown fox jumps over the lazy dog.", "Tokens end in an end of text token."];
    tok.train(&mut trainer, text.iter().cycle().take(30)).unwrap();
    let path = dir.join("tokenizer.json");
    tok.save(&path, false).unwrap();
    path
}

/// A GPT-2-style tokenizer's `<|endoftext|>` is found as the EOS (no `</s>` in the
/// vocabulary), appended to every document, and pads (no `<pad>`); special-token text stays
/// text; `data.eos_token` names another token; a tokenizer without any of
/// [`lowbit_data::EOS_CANDIDATES`] is refused with an error naming `data.eos_token` and the
/// names tried.
#[test]
fn a_gpt2_style_tokenizer_ends_documents_with_endoftext() {
    let dir = tempfile::tempdir().unwrap();
    let path = byte_level_bpe(dir.path(), "<|endoftext|>");
    let tok = load_tokenizer(path.to_str().unwrap(), false).unwrap();
    let eot = tok.tokenizer().token_to_id("<|endoftext|>").unwrap();
    assert!(tok.tokenizer().token_to_id("</s>").is_none());
    assert_eq!((tok.eos_id, tok.pad_id, tok.bos_id), (eot, eot, None));
    let docs = ["Hello world", "the lazy fox", "ünïcödé bytes too"];
    let ids = tok.encode_batch(&docs).unwrap();
    for (doc, ids) in docs.iter().zip(&ids) {
        assert_eq!(ids.last(), Some(&eot), "{doc:?}: {ids:?}");
        assert_eq!(ids.iter().filter(|&&i| i == eot).count(), 1, "{doc:?}: {ids:?}");
        assert_eq!(tok.decode(ids).unwrap(), *doc);
    }
    // the special token written in a document is text, not an EOS
    let inside = tok.encode("a <|endoftext|> b").unwrap();
    assert_eq!(inside.iter().filter(|&&i| i == eot).count(), 1, "{inside:?}");
    assert_eq!(tok.hf_token_ids()["eos_token_id"], eot);

    // `data.eos_token`, through the config
    let cfg =
        lowbit_data::DataConfig { tokenizer: path.display().to_string(), eos_token: Some("<|endoftext|>".into()), ..Default::default() };
    assert_eq!(lowbit_data::tokenizer_of(&cfg).unwrap().eos_id, eot);
    let other = tok.tokenizer().token_to_id("a").unwrap();
    let cfg = lowbit_data::DataConfig { eos_token: Some("a".into()), ..cfg };
    assert_eq!(lowbit_data::tokenizer_of(&cfg).unwrap().encode("hi").unwrap().last(), Some(&other));
    let cfg = lowbit_data::DataConfig { eos_token: Some("<eot>".into()), ..cfg };
    let err = lowbit_data::tokenizer_of(&cfg).unwrap_err().to_string();
    assert!(err.contains("`data.eos_token` = \"<eot>\" is not in the vocabulary"), "{err}");

    // none of the names: refused, saying which names were tried and which key to set
    let none = tempfile::tempdir().unwrap();
    let path = byte_level_bpe(none.path(), "<|stop|>");
    let err = load_tokenizer(path.to_str().unwrap(), false).unwrap_err();
    assert!(matches!(err, DataError::Tokenizer { .. }));
    let err = err.to_string();
    for name in lowbit_data::EOS_CANDIDATES.iter().chain(&["data.eos_token"]) {
        assert!(err.contains(name), "{name}: {err}");
    }
    let cfg = lowbit_data::DataConfig { tokenizer: path.display().to_string(), eos_token: Some("<|stop|>".into()), ..Default::default() };
    assert!(lowbit_data::tokenizer_of(&cfg).is_ok());
}

/// The resolved `[data]` section leaves `eos_token` out when unset (run fingerprints stay
/// as they were) and reads it back when set.
#[test]
fn eos_token_is_serialized_only_when_set() {
    let unset = serde_json::to_string(&lowbit_data::DataConfig::default()).unwrap();
    assert!(!unset.contains("eos_token"), "{unset}");
    let set = lowbit_data::DataConfig { eos_token: Some("<|endoftext|>".into()), ..Default::default() };
    let text = serde_json::to_string(&set).unwrap();
    assert!(text.contains(r#""eos_token":"<|endoftext|>""#), "{text}");
    assert_eq!(serde_json::from_str::<lowbit_data::DataConfig>(&text).unwrap(), set);
}
