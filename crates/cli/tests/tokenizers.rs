//! Any Hugging Face tokenizer's end-of-sequence token. A GPT-2-style byte-level BPE
//! tokenizer (EOS `<|endoftext|>`, no `</s>`, no `<pad>`) trains a tiny model on the CPU
//! through the `train` binary; one with none of the known EOS names is refused with an error
//! naming `data.eos_token`, and trains once `data.eos_token` names its EOS. Its checkpoints
//! carry the tokenizer files transformers' `AutoTokenizer` reads.

use lowbit_train::logs::metrics::{read_rows, MetricsRow};
use serde_json::{json, Map, Value};
use std::path::Path;

mod common;
use common::{cli_dir, train};

/// GPT-2's byte-to-character map (`bytes_to_unicode`): printable bytes stand for
/// themselves, the others for the characters from U+0100 on.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// A `tokenizer.json` of GPT-2's shape: byte-level pre-tokenizer and decoder, a BPE over the
/// 256 byte characters (id = byte) with a few merges, and one special token `special` (id
/// 260, last, as GPT-2's 50256).
fn write_byte_level_bpe(path: &Path, special: &str) {
    let mut vocab = Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(b));
    }
    let merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + i));
    }
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 260, "content": special, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab),
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>(),
        }
    });
    std::fs::write(path, serde_json::to_string(&tokenizer).unwrap()).unwrap();
}

/// A small C4-format shard (plain JSON lines) of `docs` short documents.
fn write_shard(path: &Path, docs: usize) {
    let words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "in", "then", "<|endoftext|>", "ünïcödé"];
    let lines: Vec<String> = (0..docs)
        .map(|d| {
            let text: Vec<&str> = (0..8 + d % 13).map(|w| words[(d * 7 + w * 3) % words.len()]).collect();
            json!({"text": text.join(" "), "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com"}).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The `--set` arguments that point the tiny config at the shards and tokenizer in `d`.
fn data_sets(d: &Path, tokenizer: &str) -> Vec<String> {
    let shard = d.join("docs.json").display().to_string();
    vec![
        format!("data.train=[\"{shard}\"]"),
        format!("data.validation=[\"{shard}\"]"),
        format!("data.tokenizer=\"{}\"", d.join(tokenizer).display()),
        "data.val_tokens=64".into(),
    ]
}

fn args<'a>(base: &[&'a str], sets: &'a [String]) -> Vec<&'a str> {
    let mut out = base.to_vec();
    for s in sets {
        out.extend(["--set", s.as_str()]);
    }
    out
}

#[test]
fn a_gpt2_style_tokenizer_trains_and_an_unknown_eos_is_named() {
    let tmp = cli_dir("gpt2");
    let d = tmp.path();
    write_shard(&d.join("docs.json"), 200);
    write_byte_level_bpe(&d.join("gpt2.json"), "<|endoftext|>");
    write_byte_level_bpe(&d.join("stop.json"), "<|stop|>");

    // found: `<|endoftext|>` is the EOS; two steps train; the rows parse, without `mfu` on the CPU
    let sets = data_sets(d, "gpt2.json");
    let r = train(d, &args(&["--config", "c.toml", "--set", "train.max_steps=2"], &sets));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let run = d.join("runs/gpt2");
    let rows = read_rows::<MetricsRow>(&run.join("metrics.jsonl")).unwrap();
    let train_rows: Vec<_> = rows
        .iter()
        .filter_map(|r| if let MetricsRow::Train { step, loss, mfu, .. } = r { Some((*step, *loss, *mfu)) } else { None })
        .collect();
    assert_eq!(train_rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2]);
    assert!(train_rows.iter().all(|r| r.1.is_finite() && r.2.is_none()), "{train_rows:?}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(!metrics.contains("mfu"), "{metrics}");
    // the exported config.json names `<|endoftext|>` (id 260) as EOS; no BOS, no pad
    let ck = lowbit_train::checkpoint::latest(&run).unwrap();
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(ck.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (&hf["bos_token_id"], &hf["eos_token_id"], &hf["pad_token_id"], &hf["vocab_size"]),
        (&Value::Null, &json!(260), &Value::Null, &json!(261)),
        "{hf}"
    );
    // beside it the tokenizer, for AutoTokenizer.from_pretrained(folder): its tokenizer.json
    // encodes a text to the run's ids; the configs name `<|endoftext|>`, and no BOS, pad or unk
    let exported = tokenizers::Tokenizer::from_file(ck.join("tokenizer.json")).unwrap();
    let text = "the quick brown fox jumps then ünïcödé";
    let ids = exported.encode(text, false).unwrap().get_ids().to_vec();
    let run_tokenizer = lowbit_data::Tokens::from_file(&d.join("gpt2.json")).unwrap();
    assert_eq!([&ids[..], &[260]].concat(), run_tokenizer.encode(text).unwrap(), "text ids, then the EOS");
    let json_of = |f: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(ck.join(f)).unwrap()).unwrap() };
    let tokenizer_config = json_of("tokenizer_config.json");
    let want = json!({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32, "eos_token": "<|endoftext|>"});
    assert_eq!(tokenizer_config, want);
    assert_eq!(json_of("special_tokens_map.json"), json!({"eos_token": "<|endoftext|>"}));
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(!config.contains("eos_token"), "unset, the key stays out of the resolved config: {config}");

    // none of the known names: refused, naming the key and the names tried
    let sets = data_sets(d, "stop.json");
    let r = train(d, &args(&["--config", "c.toml", "--set", "run.name=\"stop\"", "--set", "train.max_steps=1"], &sets));
    assert_ne!(r.code, Some(0));
    for name in ["data.eos_token", "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>"] {
        assert!(r.stderr.contains(name), "{name}: {}", r.stderr);
    }
    // named: it trains, and the resolved config keeps the key
    let mut sets = sets;
    sets.push("data.eos_token=\"<|stop|>\"".into());
    let r = train(d, &args(&["--config", "c.toml", "--set", "run.name=\"stop\"", "--set", "train.max_steps=1"], &sets));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let config = std::fs::read_to_string(d.join("runs/stop/config.toml")).unwrap();
    assert!(config.contains("eos_token = \"<|stop|>\""), "{config}");
}
