//! The two packing modes on hand-made documents with known tokens (read in file order).

mod common;

use common::*;
use lowbit_data::{DataPosition, SeqMode, TrainStream};

const DOCS: [&str; 4] = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Low-precision optimizer states stall when updates are smaller than half a grid step.",
    "Short.",
];

#[test]
fn concat_rows_are_contiguous_and_targets_are_inputs_shifted() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = DOCS.iter().map(|d| c4(d)).collect();
    let path = write_gz(dir.path(), "c4-train.00000-of-00001.json.gz", &lines);
    let tok = t5();
    // The expected token stream: each document + EOS, repeated over epochs.
    let one_epoch: Vec<u32> = DOCS.iter().flat_map(|d| tok.encode(d).unwrap()).collect();
    assert_eq!(&one_epoch[..3], &[8774, 296, 1]);
    let stream: Vec<u32> = one_epoch.iter().copied().cycle().take(one_epoch.len() * 20).collect();

    let seq = 8;
    let mut cfg = cfg(&[&path], &[&path], seq);
    cfg.shuffle = false;
    assert_eq!(cfg.mode, SeqMode::Concat);
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let mut row = 0;
    for _ in 0..6 {
        let b = s.next_batch(3).unwrap();
        assert_eq!((b.rows, b.seq_len, b.input.len(), b.target.len(), b.mask.len()), (3, seq, 24, 24, 24));
        assert!(b.mask.iter().all(|&m| m == 1.0));
        for r in 0..3 {
            let start = row * seq;
            assert_eq!(&b.input[r * seq..(r + 1) * seq], &stream[start..start + seq], "row {row} input");
            assert_eq!(&b.target[r * seq..(r + 1) * seq], &stream[start + 1..start + seq + 1], "row {row} target");
            row += 1;
        }
        // The carry is exactly the part of the documents read so far not yet in a row.
        let p = &b.position;
        let consumed =
            p.epoch as usize * one_epoch.len() + DOCS[..p.line as usize].iter().map(|d| tok.encode(d).unwrap().len()).sum::<usize>();
        assert_eq!(p.carry, stream[row * seq..consumed].to_vec());
    }
    assert!(s.position().epoch >= 2, "144 tokens of stream cover several epochs of {}", one_epoch.len());
}

#[test]
fn truncate_pad_pads_with_pad_id_and_masks_exactly_the_padded_targets() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = DOCS.iter().map(|d| c4(d)).collect();
    let path = write_gz(dir.path(), "c4-train.00000-of-00001.json.gz", &lines);
    let tok = t5();
    let seq = 12;
    let mut cfg = cfg(&[&path], &[&path], seq);
    cfg.mode = SeqMode::TruncatePad;
    cfg.shuffle = false;
    let mut s = TrainStream::new(&cfg, &tok, DataPosition::default()).unwrap();
    let b = s.next_batch(4).unwrap();
    for (r, doc) in DOCS.iter().enumerate() {
        let ids = tok.encode(doc).unwrap();
        let n = ids.len().min(seq + 1); // real tokens in the row
        let mut row = ids[..n].to_vec();
        row.resize(seq + 1, tok.pad_id);
        let (input, target, mask) = (&b.input[r * seq..][..seq], &b.target[r * seq..][..seq], &b.mask[r * seq..][..seq]);
        assert_eq!(input, &row[..seq], "doc {r}");
        assert_eq!(target, &row[1..], "doc {r}");
        let expect_mask: Vec<f32> = (0..seq).map(|i| if i + 1 < n { 1.0 } else { 0.0 }).collect();
        assert_eq!(mask, &expect_mask[..], "doc {r}");
    }
    // "Hello world" + EOS: targets 296, 1 count, the rest is padding (id 0), masked.
    assert_eq!(&b.input[..4], &[8774, 296, 1, 0]);
    assert_eq!(&b.target[..4], &[296, 1, 0, 0]);
    assert_eq!(&b.mask[..4], &[1.0, 1.0, 0.0, 0.0]);
    // The long document is cut: all 12 targets count.
    assert!(b.mask[2 * seq..3 * seq].iter().all(|&m| m == 1.0));
    let expect: usize = DOCS.iter().map(|d| tok.encode(d).unwrap().len().min(seq + 1) - 1).sum();
    assert_eq!(b.target_tokens(), expect);
    assert_eq!(b.position.shards_id.len(), 8, "the shards' identity, a CRC-32 in hex");
    assert_eq!(
        b.position,
        DataPosition { epoch: 0, shard: 0, line: 4, shards_id: b.position.shards_id.clone(), ..DataPosition::default() }
    );
}
