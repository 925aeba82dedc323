//! `train data fetch c4` and `train data fetch fineweb-edu`: a corpus from the Hugging Face
//! hub into `data/local/`: C4 `en` shards and the T5 tokenizer into `data/local/c4/` (where
//! the paper configs look), or FineWeb-Edu's `sample-10BT` parquet files into
//! `data/local/fineweb-edu/`; as many training files as the run config's tokens need unless
//! told. Files already there are skipped; the size of the rest is asked and printed before
//! anything is written; then each file is downloaded with a bar of its own and one for the
//! whole ([`lowbit_data::hub`] says how a broken transfer resumes). `--dry-run` prints the
//! plan and the files; FineWeb-Edu's sizes are listed in the code, so its dry run asks the hub
//! nothing (offline), C4's asks the hub for them.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressStyle};
use lowbit_data::hub::{shards_for, Hub, HubEnv, HubFile, Progress};
use lowbit_data::{c4, fineweb_edu};
use lowbit_train::config::RunConfig;
use lowbit_train::outln;
use std::path::{Path, PathBuf};

/// The arguments every corpus's fetch takes: what sizes it, and how it runs.
#[derive(Args, Debug)]
pub struct FetchArgs {
    /// The run config whose tokens size the download: training files for its `max_steps x
    /// micro_batch x grad_accum x seq_len` tokens, validation files for its
    /// `data.val_tokens` (ignored when both counts are given).
    #[arg(long, default_value = "configs/paper/base_llama100m.toml")]
    pub config: PathBuf,
    /// Config overrides, `section.key=value` (e.g. `train.max_steps=1000`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// The first N training shards (files; C4: of 1024, ~150M T5 tokens each; FineWeb-Edu:
    /// of 13, ~700M tokens each); default: what the config needs.
    #[arg(long, value_name = "N")]
    pub train_shards: Option<usize>,
    /// The first M validation shards (C4: of 8, ~19M T5 tokens each; FineWeb-Edu: 0 or 1, the
    /// held-out file of ~170M tokens); default: what the config needs.
    #[arg(long, value_name = "M")]
    pub val_shards: Option<usize>,
    /// Retries of a broken transfer within this call, each resuming where it stopped (a
    /// later call resumes too).
    #[arg(long, default_value_t = 3)]
    pub retries: usize,
    /// Print what would be fetched and its size; fetch nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `train data fetch c4`'s arguments.
#[derive(Args, Debug)]
pub struct C4Args {
    #[command(flatten)]
    pub fetch: FetchArgs,
    /// Destination folder: shards go to `<out>/en/`, the tokenizer to `<out>/tokenizer.json`.
    #[arg(long, default_value = "data/local/c4")]
    pub out: PathBuf,
    /// The model repo whose `tokenizer.json` is fetched (the configs use the identical
    /// `data/tokenizers/t5-tokenizer.json`).
    #[arg(long, default_value = c4::TOKENIZER_REPO, value_name = "REPO")]
    pub tokenizer_repo: String,
    /// Fetch no tokenizer.
    #[arg(long)]
    pub no_tokenizer: bool,
}

/// `train data fetch fineweb-edu`'s arguments.
#[derive(Args, Debug)]
pub struct FinewebEduArgs {
    #[command(flatten)]
    pub fetch: FetchArgs,
    /// Destination folder: training files go to `<out>/train/`, the validation file to
    /// `<out>/validation/` (where `configs/llama100m_fp8_sr_reset_fineweb.toml` looks).
    #[arg(long, default_value = "data/local/fineweb-edu")]
    pub out: PathBuf,
}

/// Run `train data fetch c4`.
///
/// # Errors
/// A config that does not load; shard counts beyond the repo's; a file the hub does not have,
/// refuses or cannot be reached for (all checked before the first download); a failed
/// download (what arrived is kept, and the same command resumes it).
pub fn fetch_c4(a: &C4Args) -> Result<()> {
    let (train, val) = shard_counts(&a.fetch, (c4::TRAIN_SHARD_TOKENS, c4::VAL_SHARD_TOKENS), "T5 tokens")?;
    let tokenizer = (!a.no_tokenizer).then_some(a.tokenizer_repo.as_str());
    fetch(&c4::files(&a.out, train, val, tokenizer)?, &a.out, &a.fetch)
}

/// Run `train data fetch fineweb-edu`.
///
/// # Errors
/// As [`fetch_c4`]; `--dry-run` makes no request.
pub fn fetch_fineweb_edu(a: &FinewebEduArgs) -> Result<()> {
    let per_file = (fineweb_edu::TRAIN_FILE_TOKENS, fineweb_edu::VAL_FILE_TOKENS);
    let (train, val) = shard_counts(&a.fetch, per_file, "tokens")?;
    fetch(&fineweb_edu::files(&a.out, train, val)?, &a.out, &a.fetch)
}

/// Fetches the `files` not yet in `out`: their sizes first (asked from the hub; in a dry run
/// the listed ones when every file has one, without a request), then each file.
fn fetch(files: &[HubFile], out: &Path, a: &FetchArgs) -> Result<()> {
    let (present, missing): (Vec<&HubFile>, Vec<&HubFile>) = files.iter().partition(|f| f.is_present());
    let have: u64 = present.iter().map(|f| std::fs::metadata(&f.dest).map_or(0, |m| m.len())).sum();
    if missing.is_empty() {
        outln!("all {} file(s) are in {} ({}); nothing to fetch", files.len(), out.display(), HumanBytes(have));
        return Ok(());
    }
    let listed: Option<Vec<u64>> = missing.iter().map(|f| f.listed_bytes).collect();
    let (hub, sizes) = match (a.dry_run, listed) {
        (true, Some(sizes)) => (None, sizes),
        _ => {
            let hub = Hub::new(HubEnv::from_env(), out, a.retries)?;
            let sizes = missing.iter().map(|f| hub.size(f)).collect::<Result<Vec<u64>, _>>()?;
            (Some(hub), sizes)
        }
    };
    let total: u64 = sizes.iter().sum();
    outln!(
        "{} file(s) to fetch into {}: {} ({} already there, {})",
        missing.len(),
        out.display(),
        HumanBytes(total),
        present.len(),
        HumanBytes(have)
    );
    if a.dry_run {
        for (f, size) in missing.iter().zip(&sizes) {
            outln!("  {} {} ({})", f.repo_id, f.path, HumanBytes(*size));
        }
        outln!("nothing fetched (--dry-run{})", if hub.is_none() { "; sizes as listed, the hub was not asked" } else { "" });
        return Ok(());
    }
    let hub = hub.expect("a hub outside --dry-run");
    let bars = MultiProgress::new();
    let overall = bars.add(bar(total, "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}"));
    overall.set_prefix("all");
    let mut done = 0u64;
    for (i, (f, size)) in missing.iter().zip(&sizes).enumerate() {
        let file = bars.insert_before(&overall, bar(*size, "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {msg}"));
        file.set_prefix(format!("{}/{}", i + 1, missing.len()));
        file.set_message(f.path.clone());
        hub.download(f, *size, Bars { file: file.clone(), overall: overall.clone(), before: done })?;
        done += size;
        file.finish_and_clear();
        bars.suspend(|| outln!("fetched {} ({})", f.dest.display(), HumanBytes(*size)));
    }
    overall.finish_and_clear();
    hub.finish()?;
    outln!("done: {} file(s) ({}) fetched into {}", missing.len(), HumanBytes(total), out.display());
    Ok(())
}

/// The training and validation file counts: the flags, else what `--config` needs at
/// `per_file` (training, validation) tokens each, counted in `unit` (said how).
fn shard_counts(a: &FetchArgs, per_file: (u64, u64), unit: &str) -> Result<(usize, usize)> {
    if let (Some(t), Some(v)) = (a.train_shards, a.val_shards) {
        return Ok((t, v));
    }
    let cfg = RunConfig::load(&a.config, &a.sets).with_context(|| format!("--config {} (sizes the download)", a.config.display()))?;
    let t = &cfg.train;
    let train_tokens = t.max_steps * (t.micro_batch * t.grad_accum * cfg.data.seq_len) as u64;
    let val_tokens = cfg.data.val_tokens as u64;
    let need = (shards_for(train_tokens, per_file.0), shards_for(val_tokens, per_file.1));
    outln!(
        "{} trains on {} tokens ({} steps x {} sequences x {}) and validates on {}: {} train shard(s) of ~{} {unit} \
         and {} validation shard(s) of ~{}{}",
        a.config.display(),
        tokens(train_tokens),
        t.max_steps,
        t.micro_batch * t.grad_accum,
        cfg.data.seq_len,
        tokens(val_tokens),
        need.0,
        tokens(per_file.0),
        need.1,
        tokens(per_file.1),
        match a.train_shards.or(a.val_shards) {
            Some(_) => " (the flag given wins)",
            None => "",
        }
    );
    Ok((a.train_shards.unwrap_or(need.0), a.val_shards.unwrap_or(need.1)))
}

/// `2.62B`, `10.0M`, `4096`.
fn tokens(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

fn bar(len: u64, template: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    b
}

/// A file's bar and the overall one, fed by `hf-hub` as bytes arrive (it starts again from
/// the resumed offset on each attempt).
struct Bars {
    file: ProgressBar,
    overall: ProgressBar,
    /// Bytes of the files fetched before this one.
    before: u64,
}

impl Progress for Bars {
    fn init(&mut self, size: usize, _filename: &str) {
        self.file.set_length(size as u64);
        self.file.set_position(0);
        self.overall.set_position(self.before);
    }
    fn update(&mut self, size: usize) {
        self.file.inc(size as u64);
        self.overall.inc(size as u64);
    }
    fn finish(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_read_short() {
        assert_eq!(tokens(20_000 * 512 * 256), "2.62B");
        assert_eq!(tokens(10_000_000), "10.0M");
        assert_eq!(tokens(4096), "4096");
    }
}
