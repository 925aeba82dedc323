//! The synchronous steps shared by the train stream, the in-memory corpus and validation:
//! read documents in chunks, tokenize a chunk, pack its documents into rows.

use crate::batch::{Packer, Row};
use crate::error::{DataError, Result};
use crate::source::{Content, Doc, DocSource};
use crate::tokenize::Tokens;

/// A chunk closes once it holds [`chunk_bytes`] of text...
const CHUNK_BYTES: usize = 1 << 20;
/// ...or this many documents. ~1 MB of English is ~250k T5 tokens: enough documents for
/// `encode_batch` to keep every core busy, small enough for a quick first batch.
const CHUNK_DOCS: usize = 4096;

/// Text per chunk for rows of `seq_len` tokens: about a thousand rows' worth (~4 bytes per
/// token), from 64 KiB up to [`CHUNK_BYTES`] (reached at `seq_len` 256, the paper's). The
/// stream reads ahead a few chunks: a run of short rows (the tests', `seq_len` 32) then
/// tokenizes ~1 MB ahead instead of ~7 MB, and a validation set of a few hundred tokens
/// reads 128 KiB. Rows do not depend on it (documents are packed one by one, in order).
pub(crate) fn chunk_bytes(seq_len: usize) -> usize {
    seq_len.saturating_mul(4096).clamp(1 << 16, CHUNK_BYTES)
}

/// The next chunk of documents (up to `max_bytes` of text, a token shard's ids counting 4
/// bytes each), `None` when the source is exhausted.
pub(crate) fn next_chunk(src: &mut DocSource, max_bytes: usize) -> Result<Option<Vec<Doc>>> {
    let mut docs = Vec::new();
    let mut bytes = 0;
    while bytes < max_bytes && docs.len() < CHUNK_DOCS {
        match src.next_doc()? {
            Some(d) => {
                bytes += d.content.bytes();
                docs.push(d);
            }
            None => break,
        }
    }
    Ok(if docs.is_empty() { None } else { Some(docs) })
}

/// The ids of a chunk's documents, in order: texts tokenized (in parallel inside
/// `tokenizers`), a token shard's ids as they are.
///
/// # Errors
/// [`DataError::Encode`] naming the document's shard and line.
pub(crate) fn encode_chunk(tok: &Tokens, docs: &mut [Doc]) -> Result<Vec<Vec<u32>>> {
    let texts: Vec<(usize, &str)> = (docs.iter().enumerate())
        .filter_map(|(i, d)| match &d.content {
            Content::Text(t) => Some((i, t.as_str())),
            Content::Ids(_) => None,
        })
        .collect();
    let mut encoded = match texts.is_empty() {
        true => Vec::new(),
        false => tok.encode_texts(&texts.iter().map(|&(_, t)| t).collect::<Vec<_>>()).map_err(|(k, msg)| {
            let d = &docs[texts[k].0];
            DataError::Encode { origin: d.origin.display().to_string(), line: d.line, msg }
        })?,
    }
    .into_iter();
    Ok(docs
        .iter_mut()
        .map(|d| match &mut d.content {
            Content::Text(_) => encoded.next().expect("one encoding per text"),
            Content::Ids(ids) => std::mem::take(ids),
        })
        .collect())
}

/// Tokenizes a chunk ([`encode_chunk`]) and packs it; rows in document order.
pub(crate) fn pack_chunk(tok: &Tokens, mut docs: Vec<Doc>, packer: &mut Packer) -> Result<Vec<Row>> {
    let ids = encode_chunk(tok, &mut docs)?;
    let mut rows = Vec::new();
    for (d, t) in docs.iter().zip(&ids) {
        packer.push(t, d.epoch, d.shard, d.line, d.bad_lines, &mut rows);
    }
    Ok(rows)
}
