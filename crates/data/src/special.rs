//! Special tokens written in document text stay text.
//!
//! `tokenizers` splits added tokens out of the text before the model sees it; with
//! `set_encode_special_tokens(true)` it no longer does, but a Unigram model (T5) still has the
//! special pieces (`</s>`, `<pad>`, `<extra_id_N>`) in its vocabulary at score 0, the best
//! score there is, so `"a </s> b"` would still encode an EOS. Their scores are lowered here
//! below any path of text pieces, as SentencePiece never matches control symbols in text.

use serde_json::Value;
use tokenizers::{ModelWrapper, Tokenizer};

/// The tokenizer of a parsed `tokenizer.json` that encodes special-token strings in text as
/// text: special tokens are not split out, a Unigram model's special pieces are demoted
/// ([`demote_unigram_specials`], the unknown-piece penalty kept), and the result is checked
/// ([`check_specials_stay_text`]). Errors say what failed.
pub(crate) fn text_tokenizer(mut json: Value) -> Result<Tokenizer, String> {
    let min_score = demote_unigram_specials(&mut json);
    let unknown = unknown_id(&json);
    let mut tokenizer: Tokenizer = serde_json::from_value(json).map_err(|e| format!("cannot load tokenizer.json: {e}"))?;
    if let (Some(min_score), ModelWrapper::Unigram(u)) = (min_score, tokenizer.get_model()) {
        // Keep the unknown-piece penalty (`min_score - 10`) of the file's own pieces: below
        // the demoted score it would make a special piece beat an unknown character.
        let mut u = u.clone();
        u.min_score = min_score;
        tokenizer.with_model(u);
    }
    tokenizer.set_encode_special_tokens(true);
    check_specials_stay_text(&tokenizer, unknown)?;
    Ok(tokenizer)
}

/// Score given to special pieces of a Unigram vocabulary: below any path of ordinary or
/// unknown pieces over the same characters (those score above `min_score - 10` per piece,
/// tens of nats; a special piece covers a few characters).
const UNREACHABLE_SCORE: f64 = -1e9;

/// Lowers the scores of a `tokenizer.json` Unigram model's special pieces (the contents of
/// `added_tokens` with `special: true`) to [`UNREACHABLE_SCORE`]; returns the lowest score
/// of the other pieces (the model's `min_score`, which sets the unknown-piece penalty), or
/// `None` when the model is not Unigram or has no special pieces.
pub(crate) fn demote_unigram_specials(json: &mut Value) -> Option<f64> {
    let specials: Vec<String> = json["added_tokens"]
        .as_array()?
        .iter()
        .filter(|t| t["special"].as_bool() == Some(true))
        .filter_map(|t| t["content"].as_str().map(str::to_string))
        .collect();
    let model = &mut json["model"];
    if model["type"].as_str() != Some("Unigram") {
        return None;
    }
    let mut min_score = f64::INFINITY;
    let mut demoted = 0;
    for piece in model["vocab"].as_array_mut()? {
        let (Some(text), Some(score)) = (piece[0].as_str(), piece[1].as_f64()) else { continue };
        if specials.iter().any(|s| s == text) {
            piece[1] = Value::from(UNREACHABLE_SCORE);
            demoted += 1;
        } else {
            min_score = min_score.min(score);
        }
    }
    (demoted > 0 && min_score.is_finite()).then_some(min_score)
}

/// Id of a `tokenizer.json` model's unknown piece (Unigram `unk_id`, BPE / WordPiece
/// `unk_token`), if it has one.
pub(crate) fn unknown_id(json: &Value) -> Option<u32> {
    let model = &json["model"];
    let id = model["unk_id"].as_u64().or_else(|| model["vocab"][model["unk_token"].as_str()?].as_u64())?;
    u32::try_from(id).ok()
}

/// Checks that no special token, written as text, encodes to a control id: a special id
/// other than `unknown` (characters missing from the vocabulary, such as T5's `<`, are
/// unknown pieces in any text). The tokenizer must have `set_encode_special_tokens(true)`.
/// Errors with the token and its ids.
pub(crate) fn check_specials_stay_text(tokenizer: &Tokenizer, unknown: Option<u32>) -> Result<(), String> {
    let specials = tokenizer.get_added_tokens_decoder();
    let special_ids: Vec<u32> = specials.iter().filter(|(&id, t)| t.special && Some(id) != unknown).map(|(&id, _)| id).collect();
    for t in specials.values().filter(|t| t.special) {
        let enc = tokenizer.encode_fast(format!("a {} b", t.content), false).map_err(|e| e.to_string())?;
        if let Some(id) = enc.get_ids().iter().find(|id| special_ids.contains(id)) {
            return Err(format!(
                "the text `{}` encodes to the special id {id} ({:?}): special tokens in documents must stay text",
                t.content,
                enc.get_ids()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t5_json() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/t5-tokenizer.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn splitting_off(json: Value) -> Tokenizer {
        let mut t: Tokenizer = serde_json::from_value(json).unwrap();
        t.set_encode_special_tokens(true);
        t
    }

    /// Without the demotion T5's Unigram still matches `</s>` and friends in text: the
    /// check names the token; with it the check passes and the other pieces keep their scores.
    #[test]
    fn t5_needs_its_special_pieces_demoted() {
        let json = t5_json();
        assert_eq!(unknown_id(&json), Some(2));
        let err = check_specials_stay_text(&splitting_off(json.clone()), Some(2)).unwrap_err();
        assert!(err.contains("encodes to the special id"), "{err}");
        let mut demoted = json.clone();
        let min_score = demote_unigram_specials(&mut demoted).unwrap();
        assert!(min_score < -10.0 && min_score > -100.0, "{min_score}");
        assert_eq!(demoted["model"]["vocab"][1][1].as_f64(), Some(UNREACHABLE_SCORE)); // </s>
        assert_eq!(demoted["model"]["vocab"][3], json["model"]["vocab"][3]); // ▁
                                                                             // Demoted but with the unknown penalty below the demoted score: `<` (not in T5's
                                                                             // vocabulary) costs more as an unknown piece than `</s>` as a special piece.
        let err = check_specials_stay_text(&splitting_off(demoted), Some(2)).unwrap_err();
        assert!(err.contains("encodes to the special id"), "{err}");
        text_tokenizer(json).unwrap();
    }
}
