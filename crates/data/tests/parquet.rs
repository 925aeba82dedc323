//! Parquet shards: the same text as JSON shards gives the same batches in every row order and
//! packing mode, resumes mid-file exactly, tokenizes into the same token shard; bad files are
//! refused naming the file, bad rows and corrupt pages handled as bad lines and corrupt gzip.

mod common;

use common::parquet_file::{write_fineweb_like, write_parquet, Values};
use common::*;
use lowbit_data::token_shard::{token_shard_path, tokenize_shard};
use lowbit_data::{validation_batches, BadInput, Batch, DataConfig, DataError, DataPosition, ShardReader, TextFormat, TrainStream};
use parquet::basic::{Compression, ZstdLevel};
use std::path::{Path, PathBuf};

/// Rows per row group of the test files: groups of 7 rows, pages of 3, so a resume skips
/// whole row groups, whole pages and rows inside a page.
const GROUP: usize = 7;

/// The documents of [`small_corpus`]`(dir, shards, docs)` dealt the same way into parquet
/// shards named like its JSON shards (so that they sort alike), one snappy, the next zstd.
fn parquet_corpus(dir: &Path, shards: usize, docs: usize) -> Vec<PathBuf> {
    let texts = sample_texts(docs);
    (0..shards)
        .map(|s| {
            let path = dir.join(format!("c4-train.{s:05}-of-{shards:05}.parquet"));
            let mine: Vec<&String> = texts.iter().skip(s).step_by(shards).collect();
            let codec = if s % 2 == 0 { Compression::SNAPPY } else { Compression::ZSTD(ZstdLevel::default()) };
            write_fineweb_like(&path, &mine, GROUP, codec);
            path
        })
        .collect()
}

/// The JSON and the parquet configs over the same 60 documents in 2 shards each, rows of 64.
fn twin_configs(dir: &Path) -> (DataConfig, DataConfig) {
    let (j, p) = (dir.join("json"), dir.join("parquet"));
    std::fs::create_dir_all(&j).unwrap();
    std::fs::create_dir_all(&p).unwrap();
    let json = small_corpus(&j, 2, 60);
    let parquet = parquet_corpus(&p, 2, 60);
    let paths = |v: &[PathBuf]| v.iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
    let json_cfg = cfg(&json.iter().map(PathBuf::as_path).collect::<Vec<_>>(), &[json[1].as_path()], 64);
    let parquet_cfg = DataConfig { train: paths(&parquet), validation: paths(&parquet[1..]), ..json_cfg.clone() };
    (json_cfg, parquet_cfg)
}

/// `n` batches of `rows` rows from `start`, each with the stream's whole position after it.
fn take(cfg: &DataConfig, start: DataPosition, n: usize, rows: usize) -> Vec<(Batch, DataPosition)> {
    let tok = t5();
    let mut s = TrainStream::new(cfg, &tok, start).unwrap();
    (0..n).map(|_| (s.next_batch(rows).unwrap(), s.position())).collect()
}

/// A position without the shards' identity (file names and sizes, which differ between a
/// JSON shard and a parquet shard of the same text).
fn anonymous(p: &DataPosition) -> DataPosition {
    DataPosition { shards_id: String::new(), ..p.clone() }
}

/// Same ids, targets, masks and positions (record counts: a JSON shard's lines are the
/// parquet shard's rows).
fn assert_same(got: &[(Batch, DataPosition)], want: &[(Batch, DataPosition)], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: batch count");
    for (i, ((g, gp), (w, wp))) in got.iter().zip(want).enumerate() {
        assert!(g.input == w.input && g.target == w.target && g.mask == w.mask, "{ctx}: batch {i} data differs");
        assert!(anonymous(gp) == anonymous(wp), "{ctx}: batch {i}: position {:?} vs {:?}", (gp.shard, gp.line), (wp.shard, wp.line));
    }
}

#[test]
fn parquet_shards_give_the_batches_of_the_same_text_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let (json, parquet) = twin_configs(dir.path());
    let tok = t5();
    for (name, order) in every_setting(&json, 40) {
        let want = take(&order, DataPosition::default(), 12, 16);
        let got = take(&DataConfig { train: parquet.train.clone(), ..order.clone() }, DataPosition::default(), 12, 16);
        assert_same(&got, &want, &name);
        let val = |c: &DataConfig| validation_batches(&DataConfig { val_tokens: 3000, ..c.clone() }, &tok, 8).unwrap();
        let (vj, vp) = (val(&order), val(&DataConfig { validation: parquet.validation.clone(), ..order.clone() }));
        assert!(vj.len() > 2 && vj == vp, "{name}: validation batches differ");
    }
}

#[test]
fn a_parquet_shard_resumes_mid_file_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (_, parquet) = twin_configs(dir.path());
    for (name, cfg) in every_setting(&parquet, 40) {
        let all = take(&cfg, DataPosition::default(), 12, 16);
        for i in [0, 4, 9] {
            // through serde, as a checkpoint stores it
            let pos: DataPosition = serde_json::from_str(&serde_json::to_string(&all[i].1).unwrap()).unwrap();
            assert_same(&take(&cfg, pos, 11 - i, 16), &all[i + 1..], &format!("{name}, resumed after batch {i}"));
        }
        if !name.starts_with("in memory") {
            let lines: Vec<u64> = all.iter().map(|(b, _)| b.position.line).collect();
            assert!(lines.iter().any(|&l| l > GROUP as u64 && l % 3 != 0), "{name}: no resume inside a page past a row group: {lines:?}");
        }
    }
}

#[test]
fn skipping_rows_passes_over_row_groups_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..40).map(|i| format!("document {i}")).collect();
    let path = dir.path().join("docs.parquet");
    write_fineweb_like(&path, &texts, GROUP, Compression::SNAPPY);
    assert_eq!(ShardReader::open(&path, BadInput::Fail).unwrap().format(), TextFormat::Parquet);
    for read_first in [0, 2, 8] {
        for skip in [0, 1, 3, 5, 6, 7, 13, 14, 30, 40 - read_first as u64, 45] {
            let mut r = ShardReader::open(&path, BadInput::Fail).unwrap();
            let first: Vec<String> = r.by_ref().take(read_first).map(Result::unwrap).collect();
            assert_eq!(first, texts[..read_first]);
            let skipped = r.skip_lines(skip).unwrap();
            let at = (read_first + skip as usize).min(texts.len());
            assert_eq!((skipped, r.line()), ((at - read_first) as u64, at as u64), "read {read_first}, skip {skip}");
            let rest: Vec<String> = r.map(Result::unwrap).collect();
            assert_eq!(rest, texts[at..], "read {read_first}, skip {skip}");
        }
    }
}

#[test]
fn a_parquet_shard_tokenizes_into_the_json_shards_token_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (json, parquet) = twin_configs(dir.path());
    let tok = t5();
    let out = dir.path().join("tok");
    std::fs::create_dir_all(&out).unwrap();
    let (j, p) = (PathBuf::from(&json.train[0]), PathBuf::from(&parquet.train[0]));
    assert_eq!(token_shard_path(&p, &out), out.join("c4-train.00000-of-00002.tokens.zst"));
    // the ids, document ends and checksums (the headers differ in the source's name)
    let tensors = |src: &Path, name: &str| {
        let (h, _) = tokenize_shard(src, &out.join(name), &tok, BadInput::Fail, 3).unwrap();
        let raw = zstd::stream::decode_all(std::fs::File::open(out.join(name)).unwrap()).unwrap();
        let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
        (h.documents, h.tokens, ["tokens", "doc_ends", "doc_crc32"].map(|t| st.tensor(t).unwrap().data().to_vec()))
    };
    let (from_json, from_parquet) = (tensors(&j, "a.tokens.zst"), tensors(&p, "b.tokens.zst"));
    assert_eq!(from_json.0, 30);
    assert!(from_json == from_parquet, "the token shards differ");
}

/// Writes `bytes` to `dir/name`.
fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The error of opening the shard `path` (it must fail), as a message, checked to name it.
fn open_error(path: &Path) -> String {
    let e = ShardReader::open(path, BadInput::Skip).err().expect("the shard is refused");
    assert!(matches!(e, DataError::Parquet { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}: not a usable parquet shard: ", path.display())), "{msg}");
    msg
}

#[test]
fn bad_parquet_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // no `text` column: the columns there are are named
    let no_text = d.join("no-text.parquet");
    write_parquet(&no_text, &[("id", Values::Int(vec![1, 2])), ("body", Values::strings(&["a", "b"]))], 2, Compression::SNAPPY);
    let msg = open_error(&no_text);
    assert!(msg.contains("no column `text` (its columns: id, body)"), "{msg}");
    // a `text` that is no string
    let ints = d.join("int-text.parquet");
    write_parquet(&ints, &[("text", Values::Int(vec![1, 2]))], 2, Compression::SNAPPY);
    assert!(open_error(&ints).contains("column `text` holds INT64 values, not strings"));
    // not parquet at all, and a real one cut short (its footer lost)
    let garbage = file(d, "garbage.parquet", b"{\"text\": \"JSON under a parquet name\"}\n");
    let msg = open_error(&garbage);
    assert!(msg.to_lowercase().contains("parquet"), "{msg}");
    let whole = d.join("whole.parquet");
    write_fineweb_like(&whole, &sample_texts(20), GROUP, Compression::SNAPPY);
    let bytes = std::fs::read(&whole).unwrap();
    open_error(&file(d, "cut.parquet", &bytes[..bytes.len() / 2]));

    // the run refuses them too, before any step, naming the file (whatever on_bad_line says)
    let tok = t5();
    for bad in [&no_text, &garbage] {
        let c = cfg(&[bad], &[bad], 32);
        let e = TrainStream::new(&c, &tok, DataPosition::default()).err().expect("refused").to_string();
        assert!(e.contains(&bad.display().to_string()) && e.contains("not a usable parquet shard"), "{e}");
        let e = validation_batches(&c, &tok, 4).unwrap_err().to_string();
        assert!(e.contains(&bad.display().to_string()), "{e}");
    }
}

#[test]
fn null_and_non_utf8_rows_are_bad_lines_named_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.parquet");
    let rows = vec![Some(b"good one".to_vec()), None, Some(vec![0xff, 0xfe, b'x']), Some(b"  ".to_vec()), Some(b"good two".to_vec())];
    write_parquet(&path, &[("text", Values::Str(rows))], 2, Compression::SNAPPY);
    let ((texts, bad), logs) = with_logs(|| {
        let mut r = ShardReader::open(&path, BadInput::Skip).unwrap();
        let texts: Vec<String> = r.by_ref().map(Result::unwrap).collect();
        (texts, r.bad_lines())
    });
    assert_eq!((texts, bad), (vec!["good one".to_string(), "good two".to_string()], 2), "the blank text is no error");
    let name = path.display();
    assert!(logs.contains(&format!("{name}:2: skipping bad parquet row: `text` is null")), "{logs}");
    assert!(logs.contains(&format!("{name}:3: skipping bad parquet row: `text` is not UTF-8")), "{logs}");

    let mut r = ShardReader::open(&path, BadInput::Fail).unwrap();
    assert_eq!(r.next_text().unwrap().as_deref(), Some("good one"));
    let e = r.next_text().unwrap_err();
    assert!(matches!(e, DataError::BadLine { line: 2, format: TextFormat::Parquet, .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("{name}:2: bad parquet row: `text` is null"));
}

#[test]
fn a_corrupt_page_fails_or_ends_the_shard_naming_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pages.parquet");
    let texts: Vec<String> = (0..20).map(|i| format!("document number {i}")).collect();
    write_fineweb_like(&path, &texts, GROUP, Compression::SNAPPY);
    // overwrite the page header that starts the second row group's `text` chunk
    let offset = {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let r = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        r.metadata().row_group(1).column(1).data_page_offset() as usize
    };
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset..offset + 12].fill(0xff);
    std::fs::write(&path, &bytes).unwrap();

    let e = ShardReader::open(&path, BadInput::Fail).unwrap().count_documents().unwrap_err();
    assert!(matches!(e, DataError::Corrupt { line: 7, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("corrupt or truncated parquet data in {} after row 7: row group 1", path.display())), "{msg}");

    let (n, logs) = with_logs(|| ShardReader::open(&path, BadInput::Skip).unwrap().count_documents().unwrap());
    assert_eq!(n, GROUP as u64, "the first row group is read, the rest of the shard skipped");
    assert!(logs.contains(&format!("{}: corrupt or truncated parquet data after row 7", path.display())), "{logs}");
}
