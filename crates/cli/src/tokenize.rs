//! `train data tokenize`: a run config's C4-format shards tokenized once into token shards
//! ([`lowbit_data::token_shard`]), one per text shard, which the loader then reads without
//! tokenizing at every start; ~1.5x smaller than the gzip JSON, so more text fits in a
//! device command's carry. Shards already there with the same tokenizer and source are kept.

use anyhow::{bail, Result};
use clap::Args;
use indicatif::HumanBytes;
use lowbit_data::token_shard::{read_header, token_shard_path, tokenize_shard};
use lowbit_data::{expand_shards, tokenizer_of};
use lowbit_train::config::RunConfig;
use lowbit_train::outln;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `train data tokenize`'s arguments.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The run config whose `data.train` and `data.validation` shards are tokenized, with
    /// its `data.tokenizer` and `data.on_bad_line`.
    #[arg(long)]
    pub config: PathBuf,
    /// Config overrides, `section.key=value` (e.g. `data.train=[...]`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Folder for the token shards: `<out>/<shard name>.tokens.zst` per text shard.
    #[arg(long)]
    pub out: PathBuf,
    /// zstd level, 1 (fast) to 22; 19 gives ~0.81 bytes per T5 token.
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
}

/// Run `train data tokenize`: prints each shard as it is written and the `--set` lines that
/// point a run at them.
///
/// # Errors
/// A config that does not load; two text shards of one file name (their token shards would
/// collide), checked before anything is written; an `--out` folder that cannot be created or
/// written, before any shard is tokenized; reading, tokenizing and writing errors.
pub fn tokenize(a: &TokenizeArgs) -> Result<()> {
    let cfg = RunConfig::load(&crate::config_path::resolve(&a.config, Path::new(crate::config_path::CONFIG_DIR))?, &a.sets)?;
    let tok = tokenizer_of(&cfg.data)?;
    let sets = [("train", &cfg.data.train), ("validation", &cfg.data.validation)];
    let mut jobs = Vec::new();
    for (what, patterns) in sets {
        for src in expand_shards(patterns, what)? {
            if read_header(&src).is_ok() {
                bail!("data.{what} lists {}, a token shard already: point data.{what} at the JSON shards to tokenize", src.display());
            }
            let dst = token_shard_path(&src, &a.out);
            if let Some((other, _)) = jobs.iter().find(|(_, d): &&(PathBuf, PathBuf)| *d == dst) {
                bail!(
                    "{} and {} would both be tokenized into {}: give them different file names",
                    other.display(),
                    src.display(),
                    dst.display()
                );
            }
            jobs.push((src, dst));
        }
    }
    if jobs.is_empty() {
        bail!("data.train and data.validation list no shard: nothing to tokenize (give them the JSON shards' patterns)");
    }
    std::fs::create_dir_all(&a.out).map_err(|e| anyhow::anyhow!("cannot create {} (--out): {e}", a.out.display()))?;
    // a folder that takes no file is said now, not after the first shard's tokenizing
    let probe = a.out.join(".tokenize-write-check");
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| anyhow::anyhow!("cannot write into {} (--out): {e}", a.out.display()))?;
    let (mut tokens, mut bytes) = (0u64, 0u64);
    for (src, dst) in &jobs {
        let source = src.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        if let Ok(h) = read_header(dst) {
            // a shard of format version 1 (no per-document checksums) is made again
            if h.tokenizer_sha256 == tok.sha256 && h.source == source && h.checksums {
                outln!("{}: already there ({} tokens)", dst.display(), h.tokens);
                tokens += h.tokens;
                bytes += std::fs::metadata(dst).map_or(0, |m| m.len());
                continue;
            }
            let why = if h.tokenizer_sha256 != tok.sha256 {
                format!("made with another tokenizer ({}, SHA-256 {:.12}...)", h.tokenizer, h.tokenizer_sha256)
            } else if h.source != source {
                format!("made from another text shard ({})", h.source)
            } else {
                "of format version 1 (no checksums)".to_string()
            };
            lowbit_train::errln!("{}: {why}: replaced", dst.display());
        }
        let t0 = Instant::now();
        let (h, size) = tokenize_shard(src, dst, &tok, cfg.data.on_bad_line, a.level)?;
        outln!(
            "{}: {} documents, {} tokens, {} ({:.2} bytes/token; {:.0} s)",
            dst.display(),
            h.documents,
            h.tokens,
            HumanBytes(size),
            size as f64 / h.tokens as f64,
            t0.elapsed().as_secs_f64()
        );
        tokens += h.tokens;
        bytes += size;
    }
    // the configs' patterns with their file names mapped as the shards' were
    let set = |what: &str, patterns: &[String]| {
        let mapped: Vec<String> = patterns.iter().map(|p| format!("\"{}\"", token_shard_path(Path::new(p), &a.out).display())).collect();
        format!("data.{what}=[{}]", mapped.join(", "))
    };
    // only the lists that had shards: an empty `data.train` is refused by a run
    let sets: Vec<String> = [("train", &cfg.data.train), ("validation", &cfg.data.validation)]
        .into_iter()
        .filter(|(_, p)| !p.is_empty())
        .map(|(what, p)| format!("--set '{}'", set(what, p)))
        .collect();
    outln!(
        "{} token shards, {tokens} tokens, {} ({:.2} bytes/token). Point a run at them with\n  {}",
        jobs.len(),
        HumanBytes(bytes),
        bytes as f64 / tokens.max(1) as f64,
        sets.join(" ")
    );
    Ok(())
}
