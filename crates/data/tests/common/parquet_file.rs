//! Parquet files for the tests, written with the `parquet` crate's own writer: columns of
//! strings (nullable, as pyarrow and datatrove write FineWeb's) and of integers, cut into row
//! groups of a given size, each row group into pages of 3 rows (so a resume skips pages and
//! row groups), no dictionary. Shared by lowbit-data's and lowbit-train's tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// One column's values, a row each.
pub enum Values {
    /// `OPTIONAL BYTE_ARRAY (UTF8)`: `None` is a null. The bytes are written as they are
    /// (not checked as UTF-8).
    Str(Vec<Option<Vec<u8>>>),
    /// `REQUIRED INT64`.
    Int(Vec<i64>),
}

impl Values {
    /// Strings, none of them null.
    pub fn strings<S: AsRef<str>>(texts: &[S]) -> Values {
        Values::Str(texts.iter().map(|t| Some(t.as_ref().as_bytes().to_vec())).collect())
    }

    fn len(&self) -> usize {
        match self {
            Values::Str(v) => v.len(),
            Values::Int(v) => v.len(),
        }
    }
}

/// Writes `columns` (name and values, all of one length) to `path`, `group` rows per row
/// group, compressed with `compression`.
pub fn write_parquet(path: &Path, columns: &[(&str, Values)], group: usize, compression: Compression) {
    let fields: Vec<String> = columns
        .iter()
        .map(|(name, v)| match v {
            Values::Str(_) => format!("OPTIONAL BYTE_ARRAY {name} (UTF8);"),
            Values::Int(_) => format!("REQUIRED INT64 {name};"),
        })
        .collect();
    let schema = Arc::new(parse_message_type(&format!("message doc {{ {} }}", fields.join(" "))).unwrap());
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_enabled(false)
        .set_data_page_row_count_limit(3)
        .set_write_batch_size(3)
        .build();
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    let rows = columns[0].1.len();
    for start in (0..rows).step_by(group.max(1)) {
        let end = (start + group).min(rows);
        let mut rg = w.next_row_group().unwrap();
        for (_, values) in columns {
            let mut col = rg.next_column().unwrap().expect("a column per schema field");
            match values {
                Values::Str(v) => {
                    let defs: Vec<i16> = v[start..end].iter().map(|x| i16::from(x.is_some())).collect();
                    let present: Vec<ByteArray> = v[start..end].iter().flatten().map(|b| ByteArray::from(b.clone())).collect();
                    col.typed::<ByteArrayType>().write_batch(&present, Some(&defs), None).unwrap();
                }
                Values::Int(v) => {
                    col.typed::<Int64Type>().write_batch(&v[start..end], None, None).unwrap();
                }
            }
            col.close().unwrap();
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// `texts` in a shard of FineWeb-Edu's kind: an `id`, the `text`, a `url` (the reader looks the
/// column up by name), rows in groups of `group`.
pub fn write_fineweb_like<S: AsRef<str>>(path: &Path, texts: &[S], group: usize, compression: Compression) {
    let n = texts.len();
    let ids = Values::Int((0..n as i64).collect());
    let urls = Values::strings(&(0..n).map(|i| format!("https://example.com/{i}")).collect::<Vec<_>>());
    write_parquet(path, &[("id", ids), ("text", Values::strings(texts)), ("url", urls)], group, compression);
}
