//! `train data fetch c4` and `fineweb-edu` against a hub on 127.0.0.1
//! (`common/hub_server.rs`: a real HTTP server in the hub's URL layout, started by each test;
//! no other address is contacted): files byte-identical to the served ones, a second call
//! fetches nothing, a connection dropped mid-file is resumed (within a call, and by the next
//! call), a file the hub lacks is refused before anything is written, the token is sent,
//! offline says what to do, and the shard count comes from the config's tokens; FineWeb-Edu's
//! files land in `train/` and `validation/`, and its `--dry-run` needs no hub.

mod common;
#[path = "common/hub_server.rs"]
mod hub_server;

use common::{train_bin, Ran};
use hub_server::HubServer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const C4: &str = "datasets/allenai/c4/resolve/main/";
const TRAIN0: &str = "en/c4-train.00000-of-01024.json.gz";
const VAL0: &str = "en/c4-validation.00000-of-00008.json.gz";
const TOKENIZER: &str = "google-t5/t5-base/resolve/main/tokenizer.json";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the hub serves: train shard 0 and validation shard 0 are the bundled sample's real
/// C4-format shards (2.5 MB and 0.35 MB), train shards 1..`train` distinct made-up bytes, and
/// the bundled T5 tokenizer.
fn hub_files(train: usize) -> HashMap<String, Vec<u8>> {
    let read = |p: &str| std::fs::read(repo_root().join(p)).unwrap();
    let mut files = HashMap::new();
    files.insert(format!("{C4}{TRAIN0}"), read("data/c4-sample/en-train.00000-of-00001.json.gz"));
    files.insert(format!("{C4}{VAL0}"), read("data/c4-sample/en-validation.00000-of-00001.json.gz"));
    files.insert(TOKENIZER.to_string(), read("data/tokenizers/t5-tokenizer.json"));
    for i in 1..train {
        let bytes: Vec<u8> = (0..40_000u32 + i as u32).map(|k| (k.wrapping_mul(2654435761) >> (8 + i % 8)) as u8).collect();
        files.insert(format!("{C4}en/c4-train.{i:05}-of-01024.json.gz"), bytes);
    }
    files
}

/// `train data fetch c4 ARGS` in `cwd` against `endpoint`, with a clean hub environment
/// (`HF_HOME` in `cwd`, no token unless `env` sets one).
fn fetch(cwd: &Path, endpoint: &str, args: &[&str], env: &[(&str, &str)]) -> Ran {
    fetch_corpus("c4", cwd, endpoint, args, env)
}

/// [`fetch`] of the corpus `corpus` (`c4`, `fineweb-edu`).
fn fetch_corpus(corpus: &str, cwd: &Path, endpoint: &str, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut cmd = Command::new(train_bin());
    cmd.args(["data", "fetch", corpus]).args(args).current_dir(cwd);
    for k in ["HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"] {
        cmd.env_remove(k);
    }
    cmd.env("HF_ENDPOINT", endpoint).env("HF_HOME", cwd.join("hf_home"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let r = Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("$ train data fetch {corpus} {}\n-> {:?}\n{}{}", args.join(" "), r.code, r.stdout, r.stderr);
    r
}

/// The fetched file `rel` under `out` equals what the hub served at `key`.
fn assert_same(out: &Path, rel: &str, files: &HashMap<String, Vec<u8>>, key: &str) {
    let got = std::fs::read(out.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert!(got == files[key], "{rel}: {} bytes, served {}", got.len(), files[key].len());
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                all.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    all.sort();
    all
}

#[test]
fn files_arrive_byte_identical_and_a_second_call_fetches_nothing() {
    let files = hub_files(2);
    let hub = HubServer::start(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--train-shards", "1", "--val-shards", "1", "--out", "c4"];
    let r = fetch(tmp.path(), &hub.url, &args, &[("HF_TOKEN", "hf_test")]);
    assert_eq!(r.code, Some(0));
    let out = tmp.path().join("c4");
    assert_same(&out, TRAIN0, &files, &format!("{C4}{TRAIN0}"));
    assert_same(&out, VAL0, &files, &format!("{C4}{VAL0}"));
    assert_same(&out, "tokenizer.json", &files, TOKENIZER);
    // exactly those files: nothing partial, no staging cache left behind
    assert_eq!(tree(&out), [TRAIN0, VAL0, "tokenizer.json"]);
    // the size before the download: 2501618 + 348326 + 2424064 bytes
    let total = 2_501_618 + 348_326 + 2_424_064;
    assert!(r.stdout.contains(&format!("3 file(s) to fetch into c4: {}", indicatif::HumanBytes(total))), "{}", r.stdout);
    // the token went with every request to the hub
    let seen = hub.seen();
    let to_hub: Vec<_> = seen.iter().filter(|s| !s.url.starts_with("/cdn/")).collect();
    assert!(!to_hub.is_empty() && to_hub.iter().all(|s| s.auth.as_deref() == Some("Bearer hf_test")), "{seen:?}");
    // only the hub's URL layout was asked for
    assert!(
        seen.iter().all(|s| s.url.starts_with("/datasets/allenai/c4/resolve/main/en/")
            || s.url == "/google-t5/t5-base/resolve/main/tokenizer.json"
            || s.url.starts_with("/cdn/")),
        "{seen:?}"
    );

    let before = hub.seen().len();
    let r = fetch(tmp.path(), &hub.url, &args, &[]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains("all 3 file(s) are in c4") && r.stdout.contains("nothing to fetch"), "{}", r.stdout);
    assert_eq!(hub.seen().len(), before, "a second call makes no request");
    // and it needs no network at all
    let r = fetch(tmp.path(), "http://127.0.0.1:9", &args, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

/// A hub serving train shard 0, whose first download of it drops the connection half way,
/// and a folder to fetch into.
fn dropping_hub() -> (HashMap<String, Vec<u8>>, HubServer, tempfile::TempDir) {
    let files = hub_files(1);
    let hub = HubServer::start(files.clone());
    hub.drop_once(&format!("{C4}{TRAIN0}"));
    (files, hub, tempfile::tempdir().unwrap())
}

#[test]
fn a_connection_dropped_mid_file_is_resumed_within_the_call() {
    let (files, hub, tmp) = dropping_hub();
    let r = fetch(tmp.path(), &hub.url, &["--train-shards", "1", "--val-shards", "0", "--no-tokenizer", "--out", "c4"], &[]);
    assert_eq!(r.code, Some(0));
    assert_same(&tmp.path().join("c4"), TRAIN0, &files, &format!("{C4}{TRAIN0}"));
    assert_eq!(tree(&tmp.path().join("c4")), [TRAIN0]);
    // the retry asked for the rest only
    let half = 2_501_618 / 2;
    let resumed = hub.seen().iter().filter(|s| s.range.as_deref() == Some(&format!("bytes={half}-"))).count();
    assert!(resumed >= 1, "{:?}", hub.seen());
}

#[test]
fn an_interrupted_download_leaves_no_final_file_and_the_next_call_resumes_it() {
    let (files, hub, tmp) = dropping_hub();
    let args = ["--train-shards", "1", "--val-shards", "0", "--no-tokenizer", "--out", "c4", "--retries", "0"];
    let r = fetch(tmp.path(), &hub.url, &args, &[]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains(&format!("cannot fetch {TRAIN0}")) && r.stderr.contains("run the same command again to resume"),
        "{}",
        r.stderr
    );
    let out = tmp.path().join("c4");
    assert!(!out.join(TRAIN0).exists(), "no truncated file under the final name");
    let partial: Vec<String> = tree(&out).into_iter().filter(|p| p.ends_with(".part")).collect();
    assert_eq!(partial.len(), 1, "{:?}", tree(&out));
    assert_eq!(std::fs::metadata(out.join(&partial[0])).unwrap().len(), 2_501_618 / 2);

    let r = fetch(tmp.path(), &hub.url, &args, &[]);
    assert_eq!(r.code, Some(0));
    assert_same(&out, TRAIN0, &files, &format!("{C4}{TRAIN0}"));
    assert_eq!(tree(&out), [TRAIN0]);
    let last_download = hub.seen().into_iter().rev().find(|s| s.url.starts_with("/cdn/")).unwrap();
    assert_eq!(last_download.range.as_deref(), Some(&*format!("bytes={}-", 2_501_618 / 2)));
}

#[test]
fn a_file_the_hub_lacks_is_refused_before_anything_is_written() {
    let hub = HubServer::start(hub_files(2));
    let tmp = tempfile::tempdir().unwrap();
    let r = fetch(tmp.path(), &hub.url, &["--train-shards", "3", "--val-shards", "1", "--out", "c4"], &[]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("cannot fetch en/c4-train.00002-of-01024.json.gz") && r.stderr.contains("not found (404)"), "{}", r.stderr);
    // (the hub's URL holds a random port, which may contain the digits 401)
    assert!(r.stderr.contains("no token was sent") || !r.stderr.contains("(401)"), "{}", r.stderr);
    assert!(!tmp.path().join("c4").exists(), "nothing written: {:?}", tree(&tmp.path().join("c4")));
    assert!(hub.seen().iter().all(|s| !s.url.starts_with("/cdn/") || s.range.as_deref() == Some("bytes=0-0")));
}

#[test]
fn offline_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    // a port nothing listens on
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let r = fetch(tmp.path(), &format!("http://127.0.0.1:{port}"), &["--train-shards", "1", "--val-shards", "0", "--out", "c4"], &[]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("seems to be offline") && r.stderr.contains("HF_ENDPOINT"), "{}", r.stderr);
    assert!(!tmp.path().join("c4").exists());
    let r = fetch(tmp.path(), "http://127.0.0.1:9", &["--train-shards", "1", "--val-shards", "0"], &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("HF_HUB_OFFLINE is set"), "{}", r.stderr);
}

#[test]
fn the_shard_count_comes_from_the_config_tokens() {
    let hub = HubServer::start(hub_files(18));
    let tmp = tempfile::tempdir().unwrap();
    let config = repo_root().join("configs/paper/base_llama100m.toml");
    let args = ["--config", config.to_str().unwrap(), "--dry-run", "--out", "c4"];
    let r = fetch(tmp.path(), &hub.url, &args, &[]);
    assert_eq!(r.code, Some(0));
    assert!(
        r.stdout.contains("trains on 2.62B tokens (20000 steps x 512 sequences x 256) and validates on 10.0M: 18 train shard(s)")
            && r.stdout.contains("1 validation shard(s)"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("20 file(s) to fetch into c4") && r.stdout.contains("en/c4-train.00017-of-01024.json.gz"), "{}", r.stdout);
    assert!(!r.stdout.contains("c4-train.00018"), "{}", r.stdout);
    assert!(!tmp.path().join("c4").exists(), "--dry-run writes nothing");
    // a smaller run needs fewer shards; a flag wins over the config
    let r = fetch(tmp.path(), &hub.url, &["--config", config.to_str().unwrap(), "--set", "train.max_steps=1000", "--dry-run"], &[]);
    assert!(r.stdout.contains(": 1 train shard(s)"), "{}", r.stdout);
    let r = fetch(tmp.path(), &hub.url, &["--config", config.to_str().unwrap(), "--train-shards", "2", "--dry-run"], &[]);
    assert!(r.stdout.contains("(the flag given wins)") && r.stdout.contains("4 file(s) to fetch"), "{}", r.stdout);
}

#[test]
fn a_plain_file_server_is_named_as_no_hub_mirror() {
    // serves every path with 200 and the bytes, without ETag / X-Repo-Commit / ranges
    let server = std::sync::Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let s = server.clone();
    let thread = std::thread::spawn(move || {
        for rq in s.incoming_requests() {
            let _ = rq.respond(tiny_http::Response::from_data(vec![b'x'; 1000]));
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let r = fetch(tmp.path(), &url, &["--train-shards", "1", "--val-shards", "0", "--no-tokenizer", "--out", "c4"], &[]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains(&format!("cannot fetch {TRAIN0}")), "{}", r.stderr);
    assert!(r.stderr.contains("a hub mirror (HF_ENDPOINT) must answer as huggingface.co does"), "{}", r.stderr);
    assert!(!r.stderr.contains("run the same command again"), "{}", r.stderr);
    assert!(!tmp.path().join("c4").join(TRAIN0).exists());
    server.unblock();
    thread.join().unwrap();
}

const FINEWEB: &str = "datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT/";

/// FineWeb-Edu's dry run asks nothing of the hub (offline, and a dead endpoint): the plan from
/// the config's tokens, then the files it would fetch with their listed sizes; it writes
/// nothing.
#[test]
fn fineweb_edu_dry_run_is_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo_root().join("configs/llama100m_fp8_sr_reset_fineweb.toml");
    let offline = [("HF_HUB_OFFLINE", "1")];
    let r = fetch_corpus("fineweb-edu", tmp.path(), "http://127.0.0.1:9", &["--config", config.to_str().unwrap(), "--dry-run"], &offline);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "trains on 2.62B tokens (20000 steps x 512 sequences x 256) and validates on 10.0M: 4 train shard(s) of ~700.0M tokens"
        ) && r.stdout.contains("1 validation shard(s) of ~170.0M"),
        "{}",
        r.stdout
    );
    let total = 2_152_819_114u64 + 2_152_222_432 + 2_151_796_315 + 2_152_437_524 + 540_632_672;
    assert!(
        r.stdout.contains(&format!("5 file(s) to fetch into data/local/fineweb-edu: {}", indicatif::HumanBytes(total))),
        "{}",
        r.stdout
    );
    for f in ["000", "003", "013"] {
        assert!(r.stdout.contains(&format!("HuggingFaceFW/fineweb-edu sample/10BT/{f}_00000.parquet")), "{f}: {}", r.stdout);
    }
    assert!(!r.stdout.contains("004_00000") && r.stdout.contains("the hub was not asked"), "{}", r.stdout);
    assert!(!tmp.path().join("data").exists(), "--dry-run writes nothing");
    // counts past the subset are refused naming the flag
    let r = fetch_corpus(
        "fineweb-edu",
        tmp.path(),
        "http://127.0.0.1:9",
        &["--train-shards", "14", "--val-shards", "1", "--dry-run"],
        &offline,
    );
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("--train-shards 14") && r.stderr.contains("13 training files"), "{}", r.stderr);
}

/// The fetch itself, against the hub on 127.0.0.1: the training files into `train/`, the
/// held-out last file into `validation/`, byte-identical, the repo's URL layout asked for.
#[test]
fn fineweb_edu_files_land_in_train_and_validation() {
    let files: HashMap<String, Vec<u8>> = ["000", "001", "013"]
        .iter()
        .map(|f| (format!("{FINEWEB}{f}_00000.parquet"), format!("parquet file {f}").repeat(1000).into_bytes()))
        .collect();
    let hub = HubServer::start(files.clone());
    let tmp = tempfile::tempdir().unwrap();
    let r = fetch_corpus("fineweb-edu", tmp.path(), &hub.url, &["--train-shards", "2", "--val-shards", "1", "--out", "fw"], &[]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = tmp.path().join("fw");
    assert_eq!(tree(&out), ["train/000_00000.parquet", "train/001_00000.parquet", "validation/013_00000.parquet"]);
    for (rel, f) in [("train/000_00000.parquet", "000"), ("validation/013_00000.parquet", "013")] {
        assert_same(&out, rel, &files, &format!("{FINEWEB}{f}_00000.parquet"));
    }
    assert!(hub.seen().iter().all(|s| s.url.starts_with(&format!("/{FINEWEB}")) || s.url.starts_with("/cdn/")), "{:?}", hub.seen());
}
