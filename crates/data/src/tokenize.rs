//! Tokenizer loading and document encoding.
//!
//! A document becomes `encode(text, add_special_tokens = false) ++ [EOS]`, EOS being
//! `data.eos_token` or else the first of [`EOS_CANDIDATES`] in the vocabulary (`</s>` for T5
//! and LLaMA-1/2, `<|endoftext|>` for GPT-2 and Qwen, `<|end_of_text|>` for LLaMA-3, ...).
//! The tokenizer's own post-processor is not used, so T5 (which would append `</s>` itself) and LLaMA
//! (which would prepend `<s>`) give the same layout: text tokens, then one EOS. Special-token
//! strings inside the text (`"a </s> b"`, `<pad>`, `<extra_id_0>`) are encoded as the text
//! they are, so special ids enter only where the pipeline puts them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::config::DataConfig;
use crate::error::{DataError, Result};
use crate::special::{text_tokenizer, unknown_id};

/// End-of-sequence tokens looked up, in this order, when `data.eos_token` is not set: the
/// first one in the vocabulary is the EOS. `</s>`: T5, LLaMA-1/2, Mistral; `<|endoftext|>`:
/// GPT-2, GPT-NeoX, Qwen (base), Phi; `<|end_of_text|>`: LLaMA-3; `<|im_end|>`: chat
/// tokenizers without one of those; `<eos>`: Gemma.
pub const EOS_CANDIDATES: [&str; 5] = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"];

/// A loaded tokenizer with the ids this crate needs.
///
/// Cheap to clone (the tokenizer is shared behind an `Arc`).
#[derive(Clone)]
pub struct Tokens {
    tokenizer: Arc<Tokenizer>,
    /// Id of the EOS token (`data.eos_token`, else the first of [`EOS_CANDIDATES`] in the
    /// vocabulary), appended to every document (T5: 1, LLaMA-1/2: 2, GPT-2: 50256).
    pub eos_id: u32,
    /// Id of `<s>` if the vocabulary has one (LLaMA: 1; T5: none). Documents do not start
    /// with it; it is written to the exported `config.json`.
    pub bos_id: Option<u32>,
    /// Id of `<pad>` if the vocabulary has one (T5: 0), else `eos_id` (LLaMA, GPT-2). Used
    /// only by `truncate_pad` rows, where padded targets are masked out of the loss, so any
    /// id would do.
    pub pad_id: u32,
    /// The `tokenizer.json` file this was loaded from.
    pub source: PathBuf,
    /// SHA-256 of that file's bytes (lowercase hex): what a token shard records of its
    /// tokenizer ([`crate::token_shard`]).
    pub sha256: String,
    /// [`Tokens::vocab_size`], counted once (`tokenizers` counts the added tokens at every
    /// call, ~100 hash lookups for T5: 5 s when checked per id of a 4M-token shard).
    vocab: usize,
    /// Id of the model's unknown piece, if it has one (T5: `<unk>`, 2; byte-level BPE: none).
    unk_id: Option<u32>,
    /// The `tokenizer.json` file's text as it was read: what an export writes beside the
    /// weights ([`Tokens::hf_tokenizer_files`]).
    file_text: Arc<str>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("eos_id", &self.eos_id)
            .field("bos_id", &self.bos_id)
            .field("pad_id", &self.pad_id)
            .finish()
    }
}

/// Loads a tokenizer from a local `tokenizer.json` (or a folder holding one), or from the
/// Hugging Face hub.
///
/// `spec` is tried in this order: an existing file; an existing folder with
/// `tokenizer.json`; a hub model id (e.g. `"google-t5/t5-base"`) whose `tokenizer.json` is
/// already in the local hub cache (`HF_HOME`, default `~/.cache/huggingface`); and, only
/// when `allow_download` is true, that file fetched from the hub with `hf-hub`.
///
/// The EOS is the first of [`EOS_CANDIDATES`] in the vocabulary; [`tokenizer_of`] takes
/// `data.eos_token` too.
///
/// # Errors
/// [`DataError::Tokenizer`] when the file is missing or unreadable, when the vocabulary has
/// none of [`EOS_CANDIDATES`], or when a hub id is not cached and `allow_download` is false
/// (the message says how to fix it), or when the download fails.
pub fn load_tokenizer(spec: &str, allow_download: bool) -> Result<Tokens> {
    load_tokenizer_eos(spec, allow_download, None)
}

/// The tokenizer of a `[data]` section: `tokenizer`, `allow_download` and `eos_token`.
///
/// # Errors
/// As [`load_tokenizer_eos`].
pub fn tokenizer_of(cfg: &DataConfig) -> Result<Tokens> {
    load_tokenizer_eos(&cfg.tokenizer, cfg.allow_download, cfg.eos_token.as_deref())
}

/// [`load_tokenizer`] with the EOS token named (`data.eos_token`), or found among
/// [`EOS_CANDIDATES`] when `eos_token` is `None`.
///
/// # Errors
/// As [`load_tokenizer`], and when `eos_token` is not in the vocabulary.
pub fn load_tokenizer_eos(spec: &str, allow_download: bool, eos_token: Option<&str>) -> Result<Tokens> {
    let path = Path::new(spec);
    if path.is_file() {
        return Tokens::from_file_eos(path, eos_token);
    }
    if path.is_dir() {
        let inner = path.join("tokenizer.json");
        if inner.is_file() {
            return Tokens::from_file_eos(&inner, eos_token);
        }
        return Err(tok_err(spec, format!("folder {} has no tokenizer.json", path.display())));
    }
    let looks_like_path = spec.ends_with(".json") || spec.starts_with('.') || spec.starts_with('/') || spec.matches('/').count() > 1;
    if looks_like_path {
        return Err(tok_err(spec, "file not found (for the bundled T5 tokenizer use data/tokenizers/t5-tokenizer.json)".into()));
    }
    // A hub id: the local cache first, so a previously downloaded tokenizer works offline.
    let cache = hf_hub::Cache::from_env();
    if let Some(cached) = cache.model(spec.to_string()).get("tokenizer.json") {
        return Tokens::from_file_eos(&cached, eos_token);
    }
    if !allow_download {
        return Err(tok_err(
            spec,
            format!(
                "not a local file, and tokenizer.json of the hub model '{spec}' is not in the \
                 Hugging Face cache ({}); set `data.allow_download = true` to fetch it \
                 (needs network), or set `data.tokenizer` to a local tokenizer.json such as \
                 data/tokenizers/t5-tokenizer.json",
                cache.path().display()
            ),
        ));
    }
    tracing::info!(model = spec, "downloading tokenizer.json from the Hugging Face hub");
    let api = hf_hub::api::sync::ApiBuilder::from_env().build().map_err(|e| tok_err(spec, format!("cannot start the hub client: {e}")))?;
    let fetched = api
        .model(spec.to_string())
        .get("tokenizer.json")
        .map_err(|e| tok_err(spec, format!("downloading tokenizer.json from the hub failed: {e}")))?;
    Tokens::from_file_eos(&fetched, eos_token)
}

/// Id of `eos_token`, or of the first of [`EOS_CANDIDATES`] in the vocabulary; the error
/// names `data.eos_token` and what was tried.
fn eos_id(tokenizer: &Tokenizer, eos_token: Option<&str>) -> Result<u32, String> {
    if let Some(name) = eos_token {
        return tokenizer.token_to_id(name).ok_or_else(|| format!("`data.eos_token` = {name:?} is not in the vocabulary"));
    }
    EOS_CANDIDATES.iter().find_map(|name| tokenizer.token_to_id(name)).ok_or_else(|| {
        let tried: Vec<String> = EOS_CANDIDATES.iter().map(|n| format!("`{n}`")).collect();
        format!(
            "the vocabulary has no end-of-sequence token among {}: set `data.eos_token` to this tokenizer's end-of-sequence token",
            tried.join(", ")
        )
    })
}

fn tok_err(spec: &str, msg: String) -> DataError {
    DataError::Tokenizer { spec: spec.to_string(), msg }
}

impl Tokens {
    /// Loads a `tokenizer.json` file and looks up its EOS (the first of [`EOS_CANDIDATES`])
    /// and `<pad>`.
    ///
    /// Truncation and padding settings stored in the file are switched off: rows are cut
    /// and padded by this crate. Special tokens are not split out of text
    /// (`set_encode_special_tokens(true)`, and a Unigram model's special pieces are never
    /// matched: `special.rs`).
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] if the file cannot be parsed, has none of [`EOS_CANDIDATES`],
    /// or a special token written as text still encodes to a special id.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_file_eos(path, None)
    }

    /// [`Tokens::from_file`] with the EOS token named (`data.eos_token`); `None` looks for
    /// [`EOS_CANDIDATES`].
    ///
    /// # Errors
    /// As [`Tokens::from_file`], and when `eos_token` is not in the vocabulary; the message
    /// names `data.eos_token`.
    pub fn from_file_eos(path: &Path, eos_token: Option<&str>) -> Result<Self> {
        let spec = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| tok_err(&spec, format!("cannot read tokenizer.json: {e}")))?;
        let json = serde_json::from_str(&text).map_err(|e| tok_err(&spec, format!("cannot load tokenizer.json: {e}")))?;
        let unk_id = unknown_id(&json);
        let mut tokenizer = text_tokenizer(json).map_err(|msg| tok_err(&spec, msg))?;
        tokenizer.with_truncation(None).map_err(|e| tok_err(&spec, format!("cannot disable truncation: {e}")))?;
        tokenizer.with_padding(None);
        let eos_id = eos_id(&tokenizer, eos_token).map_err(|msg| tok_err(&spec, msg))?;
        let pad_id = tokenizer.token_to_id("<pad>").unwrap_or(eos_id);
        let bos_id = tokenizer.token_to_id("<s>");
        let sha256 = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let vocab = tokenizer.get_vocab_size(true);
        let file_text = text.into();
        Ok(Self { tokenizer: Arc::new(tokenizer), eos_id, bos_id, pad_id, source: path.to_path_buf(), sha256, vocab, unk_id, file_text })
    }

    /// Vocabulary size including added tokens (T5: 32100, LLaMA: 32000): the embedding rows
    /// the model needs.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The special tokens a transformers export names, by role (`bos`, `eos`, `pad`, `unk`),
    /// with their ids: `<s>`, the EOS, `<pad>` and the model's unknown piece, `None` where the
    /// vocabulary has no such token (T5: none, `</s>` 1, `<pad>` 0, `<unk>` 2; LLaMA-2: `<s>`
    /// 1, `</s>` 2, none, `<unk>` 0).
    fn hf_special_tokens(&self) -> [(&'static str, Option<u32>); 4] {
        let pad = self.tokenizer.token_to_id("<pad>");
        [("bos", self.bos_id), ("eos", Some(self.eos_id)), ("pad", pad), ("unk", self.unk_id)]
    }

    /// `bos_token_id`, `eos_token_id` and `pad_token_id` for a transformers `config.json`:
    /// `<s>`, the EOS and `<pad>`, `null` where the vocabulary has no such token (T5: null, 1,
    /// 0; LLaMA-2: 1, 2, null). Written explicitly, as transformers otherwise assumes LLaMA's
    /// ids (bos 1, eos 2: T5's `</s>` and `<unk>`).
    pub fn hf_token_ids(&self) -> serde_json::Map<String, serde_json::Value> {
        let roles = self.hf_special_tokens().into_iter().filter(|(role, _)| *role != "unk");
        roles.map(|(role, id)| (format!("{role}_token_id"), id.into())).collect()
    }

    /// The files transformers' `AutoTokenizer.from_pretrained(folder)` reads, for a model of
    /// `model_max_length` positions: `tokenizer.json` (this tokenizer's file as it was read),
    /// `tokenizer_config.json` (`PreTrainedTokenizerFast`, the special tokens and the length)
    /// and `special_tokens_map.json` (the special tokens: `bos_token`, `eos_token`,
    /// `pad_token`, `unk_token`, each left out where the vocabulary has none, as in
    /// [`Tokens::hf_token_ids`]).
    pub fn hf_tokenizer_files(&self, model_max_length: usize) -> Vec<(&'static str, Vec<u8>)> {
        let special: serde_json::Map<String, serde_json::Value> = self
            .hf_special_tokens()
            .into_iter()
            .filter_map(|(role, id)| Some((format!("{role}_token"), self.tokenizer.id_to_token(id?)?.into())))
            .collect();
        let mut config = serde_json::Map::new();
        config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
        config.insert("model_max_length".into(), model_max_length.into());
        config.extend(special.clone());
        let pretty = |v: serde_json::Map<String, serde_json::Value>| serde_json::to_vec_pretty(&v).expect("a JSON map serializes");
        vec![
            ("tokenizer.json", self.file_text.as_bytes().to_vec()),
            ("tokenizer_config.json", pretty(config)),
            ("special_tokens_map.json", pretty(special)),
        ]
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids of one document: the text without special tokens, then EOS.
    ///
    /// # Errors
    /// [`DataError::Encode`] (origin `<text>`, line 1).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode_batch(&[text])?.pop().expect("one input, one output"))
    }

    /// Token ids of many documents (each + EOS), encoded in parallel (rayon, inside
    /// `tokenizers`); the output order is the input order.
    ///
    /// # Errors
    /// [`DataError::Encode`] with origin `<text>` and `line` the 1-based index of the failing
    /// text.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        self.encode_texts(texts).map_err(|(i, msg)| DataError::Encode { origin: "<text>".into(), line: i as u64 + 1, msg })
    }

    /// Encodes; on failure returns the 0-based index of the failing text and the message. A
    /// text longer than [`PIECE_BYTES`] is encoded in pieces cut at spaces ([`pieces`]) and
    /// the ids joined, so that the tokenizer's memory does not grow with a document's length
    /// (a 60 MB document took 7.2 GB whole).
    pub(crate) fn encode_texts(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, (usize, String)> {
        let mut owner = Vec::with_capacity(texts.len());
        let mut all: Vec<&str> = Vec::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            for p in pieces(t) {
                owner.push(i);
                all.push(p);
            }
        }
        match self.tokenizer.encode_batch_fast(all, false) {
            Ok(encodings) => {
                let mut out = vec![Vec::new(); texts.len()];
                for (i, e) in owner.into_iter().zip(encodings) {
                    out[i].extend_from_slice(e.get_ids());
                }
                for ids in &mut out {
                    ids.push(self.eos_id);
                }
                Ok(out)
            }
            Err(batch_err) => {
                // Find which document failed, so the error can name it.
                for (i, t) in texts.iter().enumerate() {
                    if let Err(e) = self.tokenizer.encode_fast(*t, false) {
                        return Err((i, e.to_string()));
                    }
                }
                Err((0, batch_err.to_string()))
            }
        }
    }

    /// Text of a list of ids (special tokens skipped); for logs and tests.
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] if an id is out of range.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| tok_err(&self.source.display().to_string(), format!("decode failed: {e}")))
    }
}

/// Longest piece of a document given to the tokenizer at once, bytes.
pub const PIECE_BYTES: usize = 1 << 20;

/// `text` cut into pieces of at most [`PIECE_BYTES`] (one piece when it is shorter), each cut
/// at the last ASCII space before the limit, the space dropped: SentencePiece tokenizers (T5,
/// LLaMA) mark a word's leading space with `▁` on their own at the start of a piece, so the
/// pieces give the ids of the whole text. Without a space in the window the cut falls on a
/// character boundary.
pub fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > PIECE_BYTES {
        let mut end = PIECE_BYTES;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        match rest[..end].rfind(' ') {
            Some(space) if space > 0 => {
                out.push(&rest[..space]);
                rest = &rest[space + 1..];
            }
            _ => {
                out.push(&rest[..end]);
                rest = &rest[end..];
            }
        }
    }
    out.push(rest);
    out
}
