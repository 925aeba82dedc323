//! Token shards: a corpus's documents already tokenized, as `train data tokenize` writes them
//! and the loader reads them in place of C4 JSON shards (llm.c's `.bin` shards and nanoGPT's
//! `train.bin`, compressed and with a header that names the tokenizer).
//!
//! A token shard (`NAME.tokens.zst`) is one zstd frame (RFC 8878) holding a safetensors file
//! (the Hugging Face format: an 8-byte little-endian header length, a JSON header, the raw
//! tensors) with two tensors:
//!
//! | tensor     | dtype                                          | shape | what                                  |
//! |------------|------------------------------------------------|-------|---------------------------------------|
//! | `tokens`   | `U16` when the vocabulary has at most 65,536 ids, else `U32` | `[n]` | every document's ids, each ending in EOS, in source order |
//! | `doc_ends` | `U64`                                          | `[d]` | end offset of each document in `tokens` (exclusive, increasing, the last = n) |
//! | `doc_crc32` | `U32`                                         | `[d]` | CRC-32 (IEEE) of each document's ids as stored (little-endian bytes) |
//!
//! and these header (`__metadata__`) fields, all strings: `format` = `lowbit-tokens`,
//! `version` = `2`, `tokenizer` (the tokenizer file's name), `tokenizer_sha256` (SHA-256 of
//! its bytes), `vocab_size`, `eos_id`, `tokens`, `documents`, and `source` (the text shard it
//! was made from). The layout of a document is [`crate::Tokens::encode`]'s: text ids, then
//! EOS. A shard made with another tokenizer file than `data.tokenizer` is refused
//! ([`check_tokenizer`]). zstd's frame carries no checksum of its own here, so a flipped byte
//! would decompress into other token ids without a word: each document's ids are checked
//! against `doc_crc32` as they are read, before any is used, and a mismatch refuses the shard
//! naming it and the document. Version-1 shards (before the checksums) are read with a warning.
//! Readable without lowbit:
//! `safetensors.numpy.load(zstandard.ZstdDecompressor().decompress(open(p, "rb").read(), max_output_size=1 << 34))`.
//!
//! Size (the offline corpus, T5 ids as `U16`, zstd level 19): 0.81 bytes per token, against
//! 1.21 for the gzip JSON text it comes from, and no tokenizing at start.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

use crate::error::{DataError, Result, TokenizerId};
use crate::reader::starts_with;
use crate::tokenize::Tokens;

/// The file name ending of a token shard.
pub const TOKEN_SHARD_SUFFIX: &str = ".tokens.zst";

/// The first four bytes of every zstd frame (RFC 8878, 3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// The `format` header field.
const FORMAT: &str = "lowbit-tokens";
/// The `version` header field this writer writes (per-document checksums).
const VERSION: &str = "2";
/// The version before the checksums, still read (with a warning).
const VERSION_1: &str = "1";

/// What a token shard's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenShardHeader {
    /// File name of the tokenizer it was made with (for messages).
    pub tokenizer: String,
    /// SHA-256 of that tokenizer file's bytes, lowercase hex.
    pub tokenizer_sha256: String,
    /// Its vocabulary size (added tokens included).
    pub vocab_size: usize,
    /// Its EOS id, which ends every document.
    pub eos_id: u32,
    /// Tokens in the shard (EOS included).
    pub tokens: u64,
    /// Documents in the shard.
    pub documents: u64,
    /// The text shard it was made from (file name).
    pub source: String,
    /// Whether each document carries a CRC-32 (`doc_crc32`, format version 2).
    pub checksums: bool,
}

/// Whether `path` starts with the zstd magic (a token shard; C4 shards are gzip or plain JSON).
///
/// # Errors
/// [`DataError::Io`] when the file cannot be read.
pub(crate) fn is_token_shard(path: &Path) -> Result<bool> {
    starts_with(path, &ZSTD_MAGIC)
}

fn bad(path: &Path, msg: impl Into<String>) -> DataError {
    DataError::TokenShard { path: path.to_path_buf(), msg: msg.into() }
}

/// A token shard's decoder after its safetensors header, with the parsed header JSON.
type Opened = (zstd::stream::read::Decoder<'static, std::io::BufReader<std::fs::File>>, serde_json::Value);

/// Opens a token shard and reads its safetensors header (decompressing its first kilobytes).
fn open(path: &Path) -> Result<Opened> {
    let file = std::fs::File::open(path).map_err(|error| DataError::Io { path: path.to_path_buf(), error })?;
    let mut z = zstd::stream::read::Decoder::new(file).map_err(|e| bad(path, format!("not zstd: {e}")))?;
    let mut len = [0u8; 8];
    z.read_exact(&mut len).map_err(|e| bad(path, format!("no safetensors header ({e})")))?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(bad(path, format!("a safetensors header of {n} bytes")));
    }
    let mut json = vec![0u8; n as usize];
    z.read_exact(&mut json).map_err(|e| bad(path, format!("truncated safetensors header ({e})")))?;
    let v = serde_json::from_slice(&json).map_err(|e| bad(path, format!("bad safetensors header ({e})")))?;
    Ok((z, v))
}

/// Reads only the header of a token shard (decompressing its first kilobytes).
///
/// # Errors
/// [`DataError::Io`], or [`DataError::TokenShard`] naming what is wrong.
pub fn read_header(path: &Path) -> Result<TokenShardHeader> {
    header_of(path, &open(path)?.1)
}

/// The header from a safetensors header's `__metadata__` map.
fn header_of(path: &Path, json: &serde_json::Value) -> Result<TokenShardHeader> {
    let meta: HashMap<String, String> = json
        .get("__metadata__")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| bad(path, format!("bad header fields ({e})")))?
        .unwrap_or_default();
    let field = |k: &str| meta.get(k).ok_or_else(|| bad(path, format!("header field `{k}` missing")));
    let number = |k: &str| -> Result<u64> {
        field(k)?.parse().map_err(|_| bad(path, format!("header field `{k}` is not a whole number: {:?}", meta[k])))
    };
    if field("format")? != FORMAT {
        return Err(bad(path, format!("header field `format` is {:?}, not {FORMAT:?}", meta["format"])));
    }
    let version = field("version")?;
    if version != VERSION && version != VERSION_1 {
        return Err(bad(path, format!("format version {version:?}; this build reads versions {VERSION_1} and {VERSION}")));
    }
    Ok(TokenShardHeader {
        tokenizer: field("tokenizer")?.clone(),
        tokenizer_sha256: field("tokenizer_sha256")?.clone(),
        vocab_size: number("vocab_size")? as usize,
        eos_id: number("eos_id")? as u32,
        tokens: number("tokens")?,
        documents: number("documents")?,
        source: field("source")?.clone(),
        checksums: version == VERSION,
    })
}

/// Refuses a token shard made with another tokenizer file than `tok` (compared by SHA-256),
/// or with another EOS (`data.eos_token`).
///
/// # Errors
/// [`DataError::TokenizerMismatch`] naming both tokenizers; [`DataError::TokenShard`] for
/// another EOS id.
pub fn check_tokenizer(path: &Path, header: &TokenShardHeader, tok: &Tokens) -> Result<()> {
    if header.tokenizer_sha256 == tok.sha256 {
        if header.eos_id != tok.eos_id {
            return Err(bad(
                path,
                format!(
                    "its documents end in the EOS id {}, but the tokenizer's EOS (data.eos_token) is id {}: tokenize the \
                     text again with this data.eos_token, or set data.eos_token to the shard's",
                    header.eos_id, tok.eos_id
                ),
            ));
        }
        return Ok(());
    }
    Err(DataError::TokenizerMismatch {
        path: path.to_path_buf(),
        shard: Box::new(TokenizerId { name: header.tokenizer.clone(), sha256: header.tokenizer_sha256.clone(), vocab: header.vocab_size }),
        config: Box::new(TokenizerId { name: tok.source.display().to_string(), sha256: tok.sha256.clone(), vocab: tok.vocab_size() }),
    })
}

/// Where a tensor's bytes lie in a safetensors file's data, and its dtype and length.
fn tensor_info(path: &Path, json: &serde_json::Value, name: &str) -> Result<(String, u64, u64, u64)> {
    let t = json.get(name).ok_or_else(|| bad(path, format!("no `{name}` tensor")))?;
    let dtype = t["dtype"].as_str().unwrap_or("").to_string();
    let len = t["shape"].as_array().filter(|s| s.len() == 1).and_then(|s| s[0].as_u64());
    let off = t["data_offsets"].as_array().filter(|o| o.len() == 2).map(|o| (o[0].as_u64(), o[1].as_u64()));
    match (len, off) {
        (Some(len), Some((Some(a), Some(b)))) => Ok((dtype, len, a, b)),
        _ => Err(bad(path, format!("`{name}` is not a 1-D tensor with data offsets"))),
    }
}

/// The documents of one token shard, read as they are asked for: the document ends first
/// (safetensors puts the `U64` tensor before the ids), then each document's ids, decompressed
/// as the stream reaches them, so a shard never sits whole in memory and reading its first
/// documents (the overlap check) decompresses only those.
pub(crate) struct TokenShardDocs {
    path: PathBuf,
    z: zstd::stream::read::Decoder<'static, std::io::BufReader<std::fs::File>>,
    ends: Vec<u64>,
    /// Each document's CRC-32 (empty for a version-1 shard: nothing to check).
    crcs: Vec<u32>,
    /// Bytes per id: 2 (`U16`) or 4 (`U32`).
    width: usize,
    vocab: usize,
    next: usize,
    buf: Vec<u8>,
}

impl TokenShardDocs {
    /// Opens a token shard and checks it: its header against `tok`, its document ends
    /// against the header (the ids are checked as they are read).
    ///
    /// # Errors
    /// [`DataError::Io`], [`DataError::TokenShard`], [`DataError::TokenizerMismatch`].
    pub fn open(path: &Path, tok: &Tokens) -> Result<Self> {
        let (mut z, json) = open(path)?;
        let header = header_of(path, &json)?;
        check_tokenizer(path, &header, tok)?;
        let (ends_dtype, docs, ends_at, ends_to) = tensor_info(path, &json, "doc_ends")?;
        let (ids_dtype, n, ids_at, ids_to) = tensor_info(path, &json, "tokens")?;
        let width = match ids_dtype.as_str() {
            "U16" => 2,
            "U32" => 4,
            d => return Err(bad(path, format!("`tokens` is {d}, not U16 or U32"))),
        };
        // the layout `write_token_shard` gives: the ends, the checksums (version 2), then the
        // ids, nothing else
        let crc_bytes = if header.checksums { 4 * docs } else { 0 };
        if header.checksums {
            let (crc_dtype, crcs, crc_at, crc_to) = tensor_info(path, &json, "doc_crc32")?;
            if (crc_dtype.as_str(), crcs, crc_at, crc_to) != ("U32", docs, 8 * docs, 8 * docs + crc_bytes) {
                return Err(bad(path, "not the layout `train data tokenize` writes (U64 `doc_ends`, U32 `doc_crc32`, then the ids)"));
            }
        } else {
            tracing::warn!(
                shard = %path.display(),
                "token shard of format version 1: its ids carry no checksum, so a corrupt byte cannot be detected; re-make it with `train data tokenize`"
            );
        }
        let data_at = 8 * docs + crc_bytes;
        if ends_dtype != "U64" || (ends_at, ends_to, ids_at, ids_to) != (0, 8 * docs, data_at, data_at + width as u64 * n) {
            return Err(bad(path, "not the layout `train data tokenize` writes (U64 `doc_ends`, then the ids)"));
        }
        if (n, docs) != (header.tokens, header.documents) {
            return Err(bad(
                path,
                format!("holds {n} tokens in {docs} documents, its header says {} in {}", header.tokens, header.documents),
            ));
        }
        let mut bytes = vec![0u8; data_at as usize];
        z.read_exact(&mut bytes).map_err(|e| bad(path, format!("corrupt zstd stream ({e})")))?;
        let (end_bytes, crc_bytes) = bytes.split_at(8 * docs as usize);
        let ends: Vec<u64> = end_bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        let crcs: Vec<u32> = crc_bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let increasing = ends.windows(2).all(|w| w[0] < w[1]) && ends.first().is_none_or(|&f| f > 0);
        if !increasing || ends.last().copied().unwrap_or(0) != n {
            return Err(bad(path, "`doc_ends` is not an increasing list of offsets ending at the token count"));
        }
        Ok(Self { path: path.to_path_buf(), z, ends, crcs, width, vocab: tok.vocab_size(), next: 0, buf: Vec::new() })
    }

    /// The ids of the next document as bytes in `self.buf`; false at the end of the shard.
    fn read_next(&mut self) -> Result<bool> {
        let Some(&end) = self.ends.get(self.next) else { return Ok(false) };
        let start = if self.next == 0 { 0 } else { self.ends[self.next - 1] };
        self.buf.resize((end - start) as usize * self.width, 0);
        let path = &self.path;
        self.z.read_exact(&mut self.buf).map_err(|e| bad(path, format!("corrupt zstd stream ({e})")))?;
        if let Some(&want) = self.crcs.get(self.next) {
            let got = crc32fast::hash(&self.buf);
            if got != want {
                return Err(bad(
                    path,
                    format!(
                        "document {}: its ids have CRC-32 {got:08x}, the shard says {want:08x}: the shard is corrupt (re-make it \
                         with `train data tokenize`)",
                        self.next
                    ),
                ));
            }
        }
        self.next += 1;
        Ok(true)
    }

    /// Skips `n` documents (a resume); returns how many there were to skip.
    ///
    /// # Errors
    /// [`DataError::TokenShard`] for a corrupt stream.
    pub fn skip(&mut self, n: u64) -> Result<u64> {
        let mut skipped = 0;
        while skipped < n && self.read_next()? {
            skipped += 1;
        }
        Ok(skipped)
    }

    /// The next document's ids, `None` at the end of the shard.
    ///
    /// # Errors
    /// [`DataError::TokenShard`] for a corrupt stream or an id outside the vocabulary.
    pub fn next_doc(&mut self) -> Result<Option<Vec<u32>>> {
        if !self.read_next()? {
            return Ok(None);
        }
        let ids: Vec<u32> = match self.width {
            2 => self.buf.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).collect(),
            _ => self.buf.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        };
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(bad(&self.path, format!("document {}: token id {id} is outside the vocabulary of {}", self.next, self.vocab)));
        }
        Ok(Some(ids))
    }

    /// Documents read so far (the resume position's `line` for a token shard).
    pub fn docs_read(&self) -> u64 {
        self.next as u64
    }
}

/// Writes `docs` (each a document's ids ending in EOS, as [`Tokens::encode`] makes them) as a
/// token shard made with `tok` from the text shard `source`, zstd level `level` (1..=22;
/// 19 gives the sizes quoted above). Written to a temporary file beside `path` and renamed,
/// so an interrupted write leaves no partial shard. Returns the file's size in bytes.
///
/// # Errors
/// [`DataError::Config`] for an empty document or an id outside the vocabulary,
/// [`DataError::Write`] naming the file that could not be written.
pub fn write_token_shard(path: &Path, docs: &[Vec<u32>], tok: &Tokens, source: &Path, level: i32) -> Result<u64> {
    let vocab = tok.vocab_size();
    let mut ends = Vec::with_capacity(docs.len());
    let mut n = 0u64;
    for d in docs {
        if d.is_empty() || d.iter().any(|&id| id as usize >= vocab) {
            return Err(DataError::Config(format!("{}: an empty document or an id outside the vocabulary", path.display())));
        }
        n += d.len() as u64;
        ends.push(n);
    }
    let (dtype, width, token_bytes): (Dtype, usize, Vec<u8>) = if vocab <= 1 << 16 {
        (Dtype::U16, 2, docs.iter().flatten().flat_map(|&id| (id as u16).to_le_bytes()).collect())
    } else {
        (Dtype::U32, 4, docs.iter().flatten().flat_map(|&id| id.to_le_bytes()).collect())
    };
    let end_bytes: Vec<u8> = ends.iter().flat_map(|e| e.to_le_bytes()).collect();
    let starts = std::iter::once(0).chain(ends.iter().copied());
    let crc_bytes: Vec<u8> =
        starts.zip(&ends).flat_map(|(a, &b)| crc32fast::hash(&token_bytes[a as usize * width..b as usize * width]).to_le_bytes()).collect();
    let name = |p: &Path| p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned());
    let meta: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("version", VERSION.to_string()),
        ("tokenizer", name(&tok.source)),
        ("tokenizer_sha256", tok.sha256.clone()),
        ("vocab_size", vocab.to_string()),
        ("eos_id", tok.eos_id.to_string()),
        ("tokens", n.to_string()),
        ("documents", docs.len().to_string()),
        ("source", name(source)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let view = |d, shape, data| safetensors::tensor::TensorView::new(d, vec![shape], data).expect("sizes match");
    let tensors = [
        ("tokens", view(dtype, n as usize, &token_bytes[..])),
        ("doc_ends", view(Dtype::U64, ends.len(), &end_bytes[..])),
        ("doc_crc32", view(Dtype::U32, ends.len(), &crc_bytes[..])),
    ];
    let bytes = safetensors::serialize(tensors, Some(meta)).map_err(|e| bad(path, format!("cannot serialize: {e}")))?;
    let tmp = PathBuf::from(format!("{}.partial", path.display()));
    let tmp_err = |error| DataError::Write { path: tmp.clone(), error };
    let out = std::fs::File::create(&tmp).map_err(tmp_err)?;
    let mut z = zstd::stream::write::Encoder::new(out, level).map_err(tmp_err)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    z.multithread(threads).map_err(tmp_err)?;
    std::io::copy(&mut &bytes[..], &mut z).map_err(tmp_err)?;
    let f = z.finish().map_err(tmp_err)?;
    f.sync_all().map_err(tmp_err)?;
    let size = f.metadata().map_err(tmp_err)?.len();
    drop(f);
    std::fs::rename(&tmp, path).map_err(|error| DataError::Write { path: path.to_path_buf(), error })?;
    Ok(size)
}

/// `NAME.tokens.zst` in `out` for the text shard `src` (`NAME.json.gz`, `NAME.json` or
/// `NAME.parquet`).
pub fn token_shard_path(src: &Path, out: &Path) -> PathBuf {
    let name = src.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let stem = name.strip_suffix(".gz").unwrap_or(&name);
    let stem = stem.strip_suffix(".json").or_else(|| stem.strip_suffix(".parquet")).unwrap_or(stem);
    out.join(format!("{stem}{TOKEN_SHARD_SUFFIX}"))
}

/// Tokenizes every document of the text shard `src` (C4 JSON lines or parquet, as the loader
/// reads them: [`Tokens::encode`]'s layout, bad lines or rows per `on_bad`) and writes them to `dst` as a token shard
/// ([`write_token_shard`]). Returns the new shard's header and size in bytes.
///
/// # Errors
/// Reading and tokenizing errors naming `file:line`, [`DataError::NoText`] for a shard
/// without a document, and the write's.
pub fn tokenize_shard(src: &Path, dst: &Path, tok: &Tokens, on_bad: crate::BadInput, level: i32) -> Result<(TokenShardHeader, u64)> {
    let mut reader = crate::reader::ShardReader::open(src, on_bad)?;
    let mut docs = Vec::new();
    loop {
        let (mut texts, mut lines, mut bytes) = (Vec::new(), Vec::new(), 0);
        while bytes < 1 << 22 {
            match reader.next_text()? {
                Some(t) => {
                    bytes += t.len();
                    lines.push(reader.line());
                    texts.push(t);
                }
                None => break,
            }
        }
        if texts.is_empty() {
            break;
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        docs.extend(tok.encode_texts(&refs).map_err(|(i, msg)| DataError::Encode {
            origin: src.display().to_string(),
            line: lines[i],
            msg,
        })?);
    }
    if docs.is_empty() {
        return Err(DataError::NoText { what: "source", shards: vec![src.to_path_buf()] });
    }
    let size = write_token_shard(dst, &docs, tok, src, level)?;
    Ok((read_header(dst)?, size))
}
