//! Tokenizer loading and encoding.

mod common;

use common::*;
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
#[ignore = "needs the shared LLaMA-2 tokenizer beside the checkout (../shared/data/tokenizers/llama2-tokenizer.json): run with --ignored"]
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
#[ignore = "needs the shared LLaMA-2 tokenizer beside the checkout (../shared/data/tokenizers/llama2-tokenizer.json): run with --ignored"]
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
