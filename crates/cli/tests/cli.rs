//! Exits, signals, output and friction, through the `train` binary: a closed
//! stdout pipe, config values validated up front, errors that name the file or field and
//! what to do, bare config names, `--print-config`, reader warnings once per line, and what a
//! redirected training log holds.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{cli_dir, root, train, train_bin, Ran};

/// Run `train ARGS` in `cwd` with stdout a pipe whose reading end is already closed.
fn with_closed_stdout(cwd: &Path, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(train_bin()).args(args).current_dir(cwd).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("$ train {} | (closed)\n-> {:?}\n{err}", args.join(" "), out.status.code());
    (out.status.code(), err)
}

/// A hand-made `stalls.jsonl` row for `step`: half of m and v stalled.
fn stall_row(step: u64) -> String {
    format!(
        r#"{{"step":{step},"m":{{"updated":10,"stalled":5}},"v":{{"updated":10,"stalled":5}},"w":{{"updated":0,"stalled":0}},"frac":{{"m":0.5,"v":0.5}},"groups":{{}},"theory":{{"v":0.9}}}}"#
    )
}

#[test]
fn a_closed_stdout_pipe_panics_no_subcommand_and_training_still_plots() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let (code, err) = with_closed_stdout(d, &["predict", "--format", "bf16"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, err) = with_closed_stdout(d, &["--config", "c.toml", "--print-config"]);
    assert_eq!(code, Some(0), "{err}");
    // training prints its summary into the closed pipe, then writes the plots
    let (code, err) = with_closed_stdout(d, &["--config", "c.toml", "--set", "train.max_steps=2", "--set", "run.plots=true"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(d.join("runs/x/loss.png").is_file() && d.join("runs/x/stalls.png").is_file());
    // the redirected log: no colour codes, and the step-0 validation says what it does
    assert!(!err.contains('\x1b'), "{err}");
    assert!(err.contains("step 0: validation loss of the initial model (8 batches of the validation set)"), "{err}");
    // every train row of metrics.jsonl says whether it was skipped
    let metrics = std::fs::read_to_string(d.join("runs/x/metrics.jsonl")).unwrap();
    let train_rows: Vec<Value> =
        metrics.lines().map(|l| serde_json::from_str(l).unwrap()).filter(|r: &Value| r["kind"] == "train").collect();
    assert_eq!(train_rows.len(), 2);
    assert!(train_rows.iter().all(|r| r["skipped"] == false), "{metrics}");
    for args in [vec!["stalls", "runs/x"], vec!["plot", "runs/x"]] {
        let (code, err) = with_closed_stdout(d, &args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
}

/// `train ... 2>&1 | head`: the log (stderr) and stdout go into a pipe that closes; the run
/// still finishes with its checkpoint and summary (tracing's report of the failed write and
/// `eprintln!` panicked with exit 101), and an error still exits 1.
#[test]
fn a_closed_stderr_pipe_stops_nothing() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let run = |args: &[&str]| {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status =
            Command::new(train_bin()).args(args).current_dir(d).stdout(writer.try_clone().unwrap()).stderr(writer).status().unwrap();
        status.code()
    };
    assert_eq!(run(&["--config", "c.toml", "--set", "train.max_steps=2"]), Some(0));
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(d.join("runs/x/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    assert!(d.join("runs/x/checkpoints/step_0000002").is_dir());
    assert_eq!(run(&["--config", "c.toml", "--set", "optim.eps=nan"]), Some(1));
}

#[test]
fn nonsensical_config_values_are_refused_up_front_naming_the_field() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    for (set, needle) in [
        ("optim.eps=nan", "optim.eps: must be a positive number, got NaN"),
        ("optim.weight_decay=inf", "optim.weight_decay: must be a number >= 0, got inf"),
        ("optim.grad_clip=nan", "optim.grad_clip: must be a number >= 0, got NaN"),
        ("run.name=\"..\"", "run.name: must be a folder name inside run.dir"),
        ("run.name=\"a/b\"", "run.name: must be a folder name inside run.dir"),
        ("data.val_tokens=0", "data.val_tokens: must be > 0"),
        ("train.keep_checkpoints=0", "train.keep_checkpoints: must be > 0"),
        ("run.dir=\"\"", "run.dir: must name a folder (\".\" for the working directory)"),
        ("optim.soap.shampoo_beta=0.5", "optim.soap.shampoo_beta: SOAP's setting, read only with optim.kind = \"soap\""),
        ("optim.soap.precond_format=\"fp32\"", "optim.soap.precond_format: SOAP's setting, read only with optim.kind = \"soap\""),
        ("optim.states.weight_rounding=\"dither\"", "optim.states.weight_rounding: \"dither\" is for the moment states"),
    ] {
        let r = train(d, &["--config", "c.toml", "--set", set]);
        assert_eq!(r.code, Some(1), "{set}");
        assert!(r.stderr.contains(&format!("invalid config (--set {set}): {needle}")), "{set}: {}", r.stderr);
    }
    // SOAP's own ranges, and what it does not take
    for (set, needle) in [
        ("optim.soap.shampoo_beta=1.0", "optim.soap.shampoo_beta: must be in [0, 1), got 1"),
        ("optim.soap.precondition_frequency=0", "optim.soap.precondition_frequency: must be >= 1"),
        ("optim.soap.precond_format=\"fp9\"", "unknown state format `fp9` (expected one of fp32, bf16, fp8, fp8e4m3, fp8e5m2, fp4, fp4e2m1, fp4ue2m2, int8, e8m1 .. e8m7) (key `optim.soap.precond_format`)"),
        ("optim.states.v_skip_prob=0.5", "optim.states.v_skip_prob: simulated stalling is AdamW's probe"),
        ("train.zero=1", "train.zero: SOAP's states are not sharded"),
        ("optim.states.m_rounding=\"dither\"", "optim.states.m_rounding = \"dither\": dither is AdamW's for now"),
        ("optim.states.groups.mlp.v_rounding=\"dither\"", "optim.states.groups.mlp.v_rounding = \"dither\": dither is AdamW's for now"),
    ] {
        let r = train(d, &["--config", "c.toml", "--set", "optim.kind=\"soap\"", "--set", set]);
        assert_eq!(r.code, Some(1), "{set}");
        assert!(r.stderr.contains(needle), "{set}: {}", r.stderr);
    }
    // Muon's ranges, and what it does not take
    for (sets, needle) in [
        (&["optim.muon.momentum=1.0"][..], "optim.muon.momentum: must be in [0, 1), got 1"),
        (&["optim.muon.ns_steps=0"], "optim.muon.ns_steps: must be >= 1"),
        (&["train.zero=1"], "train.zero: Muon orthogonalises whole matrices"),
        (&["model.dtype=\"bf16\"", "optim.states.weight_rounding=\"stochastic\""], "Muon's matrices round their BF16 weights to nearest"),
        (
            &["optim.states.reset=\"adaptive\"", "optim.states.m_reset_every=0", "optim.states.v_reset_every=0"],
            "optim.states.reset = \"adaptive\": the rule watches v's stalls",
        ),
        (
            &["optim.states.groups.mlp.m_reset_every=\"auto\""],
            "optim.states.groups.mlp.m_reset_every = \"auto\": K* follows from v's format",
        ),
    ] {
        let mut args = vec!["--config", "c.toml", "--set", "optim.kind=\"muon\""];
        args.extend(sets.iter().flat_map(|s| ["--set", *s]));
        let r = train(d, &args);
        assert_eq!(r.code, Some(1), "{sets:?}");
        assert!(r.stderr.contains(needle), "{sets:?}: {}", r.stderr);
    }
    let r = train(d, &["--config", "c.toml", "--set", "optim.muon.nesterov=false"]);
    assert!(
        r.code == Some(1) && r.stderr.contains("optim.muon.nesterov: Muon's setting, read only with optim.kind = \"muon\""),
        "{}",
        r.stderr
    );
    assert!(!d.join("runs").exists(), "a refused config touched the run folder");
    // the default checkpoint period is not 0 (a kill would lose the whole run)
    std::fs::write(d.join("min.toml"), "extends = \"c.toml\"\n").unwrap();
    let text = std::fs::read_to_string(d.join("c.toml")).unwrap().replace("checkpoint_every = 3\n", "");
    std::fs::write(d.join("c.toml"), text).unwrap();
    let r = train(d, &["--config", "min.toml", "--print-config"]);
    assert!(r.stdout.contains("checkpoint_every = 500\n"), "{}", r.stdout);
}

/// Sizes that aborted or panicked (`data.shuffle_buffer` in an allocation or a capacity
/// overflow, `train.grad_accum` after the run folder was claimed) are refused at the config
/// check, naming the key and its range, before the folder is touched: the corrected command
/// then runs.
#[test]
fn absurd_sizes_are_refused_at_the_config_check() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    for (set, needle) in [
        ("data.shuffle_buffer=1000000000000", "data.shuffle_buffer: must be in 1..=100000000 rows"),
        ("data.shuffle_buffer=9223372036854775807", "data.shuffle_buffer: must be in 1..=100000000 rows"),
        ("train.grad_accum=9223372036854775807", "train.grad_accum: must be in 1..=1000000 (micro-batches per optimizer step)"),
    ] {
        let r = train(d, &["--config", "c.toml", "--set", "data.in_memory_max_tokens=0", "--set", set]);
        assert_eq!(r.code, Some(1), "{set}: {}", r.stderr);
        assert!(r.stderr.contains(&format!("invalid config (--set {set}): {needle}")), "{set}: {}", r.stderr);
        assert!(!r.stderr.contains("panicked") && !d.join("runs").exists(), "{set}: {}", r.stderr);
    }
    let r = train(d, &["--config", "c.toml", "--set", "train.grad_accum=2", "--set", "train.max_steps=2"]);
    assert_eq!(r.code, Some(0), "the corrected command: {}", r.stderr);
}

#[test]
fn errors_name_the_file_or_field_and_what_to_do() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let err = |args: &[&str]| {
        let r = train(d, args);
        assert_eq!(r.code, Some(1), "{args:?}");
        r.stderr
    };
    let e = err(&["--resume", "missing_dir"]);
    assert!(e.contains("error: --resume missing_dir: no such run folder (give a folder written by train"), "{e}");
    std::fs::create_dir_all(d.join("shards")).unwrap();
    let e = err(&["--config", "c.toml", "--set", "data.train=[\"shards\"]"]);
    assert!(
        e.contains("train shard 'shards' is a folder, not a shard file: list its files, or use a glob such as 'shards/*.json.gz'"),
        "{e}"
    );
    let e = err(&["predict", "--format", "bf16", "--beta2", "-0.5"]);
    assert!(e.contains("--beta2 must be in [0, 1), got -0.5"), "{e}");
    let e = err(&["bench", "optimizer"]);
    assert!(e.contains("train bench optimizer needs the GPU build: cargo build --release -p lowbit-cli --features cuda"), "{e}");
    // the data pipeline's benchmark is CPU work: it runs in this build, on the config's data
    let r = train(d, &["bench", "data", "--config", "c.toml", "--batch", "2", "--seq", "32", "--batches", "3"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // one line per row order: `<rate> tokens/s after a first batch in <s> s: <order>`
    assert!(r.stdout.starts_with("data pipeline, 3 batches of 2 x 32,"), "{}", r.stdout);
    for order in ["file order (data.shuffle = false)", "rows permuted in memory", "streamed through a shuffle buffer"] {
        let line = r.stdout.lines().find(|l| l.ends_with(order) || l.contains(order)).unwrap_or_else(|| panic!("{order}: {}", r.stdout));
        let rate: f64 = line.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
        assert!(rate > 0.0 && line.contains("tokens/s after a first batch in"), "{line}");
    }

    // one corrupt line in stalls.jsonl: the rest is read, the line is named
    let run = d.join("fake");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("stalls.jsonl"), format!("{}\n{{garbage\n{}\n", stall_row(1), stall_row(2))).unwrap();
    let r = train(d, &["stalls", "fake"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("step 2 (2 rows; mean over all 2 steps; stalled / updated elements)"), "{}", r.stdout);
    assert!(r.stderr.contains("fake/stalls.jsonl:2: skipping a corrupt row"), "{}", r.stderr);
    let e = err(&["stalls", "nowhere"]);
    assert!(e.contains("nowhere: no stalls.jsonl (not a run folder"), "{e}");

    // plot --out naming a file, not a folder
    std::fs::write(run.join("metrics.jsonl"), "").unwrap();
    std::fs::write(d.join("afile"), "").unwrap();
    let e = err(&["plot", "fake", "--out", "afile"]);
    assert!(e.contains("cannot create the plot folder afile (--out names a folder)"), "{e}");
}

#[test]
fn bare_config_names_resolve_under_configs_and_print_config_shows_the_result() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    std::fs::create_dir_all(d.join("configs")).unwrap();
    std::fs::rename(d.join("c.toml"), d.join("configs/tiny_test.toml")).unwrap();
    let r = train(d, &["--config", "tiny_test.toml", "--set", "optim.lr=6e-4", "--print-config"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("[optim]\nlr = 0.0006\n"), "{}", r.stdout);
    assert!(!d.join("runs").exists(), "--print-config started a run");
    let r = train(d, &["--config", "tiny_tset", "--print-config"]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr.contains("error: --config tiny_tset: no such file nor under configs/; nearest: configs/tiny_test.toml"),
        "{}",
        r.stderr
    );
}

#[test]
fn reader_warns_once_per_bad_line_and_skips_blank_lines_silently() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let sample = root().join("data/c4-sample/en-validation.00000-of-00001.json.gz");
    let out = Command::new("gzip").arg("-dc").arg(&sample).output().unwrap();
    let good: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().take(40).collect();
    let mut shard = String::new();
    for (i, l) in good.iter().enumerate() {
        shard += l;
        shard.push('\n');
        match i {
            3 => shard += "not json\n",
            7 => shard += "\n   \n",
            9 => shard += "{\"no_text\": 1}\n",
            _ => {}
        }
    }
    std::fs::write(d.join("bad.json"), shard).unwrap();
    // the same shard for training and validation, several epochs: read many times over
    let r = train(
        d,
        &[
            "--config",
            "c.toml",
            "--set",
            "data.train=[\"bad.json\"]",
            "--set",
            "data.validation=[\"bad.json\"]",
            "--set",
            "train.max_steps=3",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stderr.matches("skipping bad C4 line").count(), 2, "{}", r.stderr);
    assert!(r.stderr.contains("bad.json:5: skipping bad C4 line: not JSON"), "{}", r.stderr);
    assert!(!r.stderr.contains("bad.json:9:") && !r.stderr.contains("bad.json:10:"), "blank lines warned: {}", r.stderr);
}

/// The start says which order the rows are read in and how many passes the run will make,
/// and warns past 4; the summary (stdout and summary.json) records the passes made.
#[test]
fn a_run_reports_its_passes_over_the_text_and_warns_past_four() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let docs: String =
        (0..6).map(|i| format!("{{\"text\": \"{}\"}}\n", format!("document {i} of a tiny corpus, one of six. ").repeat(12))).collect();
    std::fs::write(d.join("tiny.json"), docs).unwrap();
    let r = train(d, &["--config", "c.toml", "--set", "data.train=[\"tiny.json\"]", "--set", "train.max_steps=40"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(d.join("runs/x/summary.json")).unwrap()).unwrap();
    let (epochs, per_epoch) = (summary["epochs"].as_f64().unwrap(), summary["tokens_per_epoch"].as_u64().unwrap());
    // 40 steps of 2 x 2 rows of 32 targets, in memory: whole rows of the text per pass
    assert!(per_epoch > 0 && per_epoch % 32 == 0 && summary["tokens_per_epoch_exact"] == true, "{summary}");
    assert!((epochs - 40.0 * 4.0 * 32.0 / per_epoch as f64).abs() < 1e-9, "{epochs} passes of {per_epoch}");
    assert_eq!(summary["data_order"], "rows permuted in memory (data.shuffle = true, data.seed = 7)");
    let planned = format!("{per_epoch} target tokens per pass; 40 steps make {epochs:.2} passes");
    assert!(r.stdout.contains(&planned), "{}", r.stdout);
    assert!(
        epochs > 4.0
            && r.stderr.contains("train.max_steps = 40 x 4 sequences of 32 tokens make")
            && r.stderr.contains("passes over the training text")
            && r.stderr.contains("Muennighoff"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout.contains(&format!("data: {epochs:.2} passes over the training text ({per_epoch} tokens each), rows permuted in memory")),
        "{}",
        r.stdout
    );
    // a run within 4 passes is not warned about
    let r = train(d, &["--config", "c.toml", "--set", "train.max_steps=2", "--set", "run.name=y"]);
    assert!(r.code == Some(0) && !r.stderr.contains("Muennighoff"), "{}", r.stderr);
}

/// Per-group state formats: the embedding's states in FP32 beside the config's FP4 m / FP8 v
/// (32-element blocks) cost 8 bytes per embedding parameter, the rest 1.75 (0.5 + 1 + two FP32
/// scales per 32); the banner and summary.json say which tensors got which; the FP32 states
/// never stall; a group the model does not have is refused before the run folder is made.
#[test]
fn group_states_keep_the_embedding_in_fp32() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let fp32 = ["--set", "optim.states.groups.embed.m_format=fp32", "--set", "optim.states.groups.embed.v_format=fp32"];
    let r = train(d, &[&["--config", "c.toml", "--set", "train.max_steps=6"][..], &fp32].concat());
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(d.join("runs/x/summary.json")).unwrap()).unwrap();
    let groups = summary["state_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{summary}");
    let (rest, embed) = (&groups[0], &groups[1]);
    assert_eq!(embed["groups"], serde_json::json!(["embed"]));
    assert!(embed["states"].as_str().unwrap().starts_with("m fp32 (stochastic) | v fp32 (stochastic)"), "{embed}");
    let embed_params = embed["params"].as_u64().unwrap();
    assert_eq!(embed_params, 32100 * 32, "the T5 vocabulary x hidden 32");
    assert_eq!((embed["state_bytes"].as_u64(), embed["state_bytes_per_param"].as_f64()), (Some(8 * embed_params), Some(8.0)));
    assert!(rest["groups"].as_array().unwrap().iter().all(|g| g != "embed"), "{rest}");
    let rest_params = rest["params"].as_u64().unwrap();
    assert_eq!(rest_params + embed_params, summary["params"].as_u64().unwrap());
    assert!(rest["state_bytes_per_param"].as_f64().unwrap() >= 1.75, "{rest}");
    assert_eq!(rest["state_bytes"].as_u64().unwrap() + 8 * embed_params, summary["state_bytes"].as_u64().unwrap());
    assert!(r.stdout.contains("states for embed (1 tensors, 1027200 params, 8.000 bytes/param): m fp32"), "{}", r.stdout);
    // the embedding's FP32 states stall nowhere; the FP4/FP8 ones do
    let rows: Vec<Value> =
        std::fs::read_to_string(d.join("runs/x/stalls.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 6);
    for row in &rows {
        assert!(
            [row["groups"]["embed"]["m"].as_f64(), row["groups"]["embed"]["v"].as_f64()].iter().all(|f| f.is_none_or(|f| f == 0.0)),
            "{row}"
        );
    }
    assert!(rows.iter().any(|r| r["groups"]["mlp"]["v"].as_f64() > Some(0.0)), "the quantized states stall");
    // a resume with other group states is refused, naming the tensor
    let r = train(d, &["--config", "c.toml", "--set", "train.max_steps=8", "--resume", "runs/x"]);
    assert!(
        r.code != Some(0) && r.stderr.contains("model.embed_tokens.weight") && r.stderr.contains("optim.states.groups"),
        "{}",
        r.stderr
    );
    // also when the group's states have the base's widths (FP8 E5M2 v over the base's E4M3): the
    // checkpoint's bytes would load and be read in the wrong format
    let r = train(d, &["--config", "c.toml", "--set", "run.name=z", "--set", "train.max_steps=4"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = train(
        d,
        &[
            "--config",
            "c.toml",
            "--set",
            "run.name=z",
            "--set",
            "train.max_steps=6",
            "--set",
            "optim.states.groups.embed.v_format=fp8e5m2",
            "--resume",
            "runs/z",
        ],
    );
    assert!(
        r.code != Some(0)
            && r.stderr.contains("model.embed_tokens.weight has states [optim.states]'s in the checkpoint, the config gives it m fp4")
            && r.stderr.contains("| v fp8e5m2"),
        "{}",
        r.stderr
    );
    // a group the model does not have
    let r = train(d, &["--config", "c.toml", "--set", "run.name=y", "--set", "optim.states.groups.embedding.m_format=fp32"]);
    assert!(
        r.code != Some(0) && r.stderr.contains("optim.states.groups.embedding: the model has no tensor group \"embedding\""),
        "{}",
        r.stderr
    );
    assert!(!d.join("runs/y").exists());
}

/// `train data tokenize`: token shards of a config's train and validation shards, which a run
/// then reads through the `--set` lines the command prints; a second call keeps them.
#[test]
fn data_tokenize_writes_token_shards_a_run_reads() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let doc = |i: usize| format!("{{\"text\": \"{}\"}}\n", format!("document {i} is read as tokens. ").repeat(20));
    std::fs::write(d.join("a.json"), (0..8).map(doc).collect::<String>()).unwrap();
    std::fs::write(d.join("v.json"), (8..10).map(doc).collect::<String>()).unwrap();
    let sets = ["--set", "data.train=[\"a.json\"]", "--set", "data.validation=[\"v.json\"]"];
    let args = [&["data", "tokenize", "--config", "c.toml", "--out", "tok", "--level", "3"][..], &sets[..]].concat();
    let r = train(d, &args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("tok/a.tokens.zst: 8 documents,") && r.stdout.contains("tok/v.tokens.zst: 2 documents,"), "{}", r.stdout);
    let hint = "--set 'data.train=[\"tok/a.tokens.zst\"]' --set 'data.validation=[\"tok/v.tokens.zst\"]'";
    assert!(r.stdout.contains(hint), "{}", r.stdout);
    let again = train(d, &args);
    assert!(again.code == Some(0) && again.stdout.contains("tok/a.tokens.zst: already there"), "{}", again.stdout);
    let r = train(
        d,
        &[
            "--config",
            "c.toml",
            "--set",
            "data.train=[\"tok/a.tokens.zst\"]",
            "--set",
            "data.validation=[\"tok/v.tokens.zst\"]",
            "--set",
            "train.max_steps=2",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(d.join("runs/x/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["tokens_per_epoch_exact"], true);
    // a config that reads token shards already: nothing to tokenize
    let r = train(d, &["data", "tokenize", "--config", "c.toml", "--out", "tok2", "--set", "data.train=[\"tok/a.tokens.zst\"]"]);
    assert!(r.code == Some(1) && r.stderr.contains("data.train lists tok/a.tokens.zst, a token shard already"), "{}", r.stderr);
    // only the validation shard: the hint names only the list that had shards
    let only_val =
        ["data", "tokenize", "--config", "c.toml", "--out", "tok3", "--set", "data.train=[]", "--set", "data.validation=[\"v.json\"]"];
    let r = train(d, &only_val);
    assert!(r.code == Some(0) && r.stdout.contains("--set 'data.validation=[\"tok3/v.tokens.zst\"]'"), "{}", r.stdout);
    assert!(!r.stdout.contains("data.train="), "{}", r.stdout);
    // no shard at all: an error, not an empty success
    let r = train(d, &["data", "tokenize", "--config", "c.toml", "--out", "tok4", "--set", "data.train=[]", "--set", "data.validation=[]"]);
    assert!(r.code == Some(1) && r.stderr.contains("nothing to tokenize"), "{}", r.stderr);
    // a shard made with another tokenizer is replaced, and the command says so
    let mut other = std::fs::read_to_string(root().join("data/tokenizers/t5-tokenizer.json")).unwrap();
    other.push('\n');
    std::fs::write(d.join("other.json"), other).unwrap();
    let with_other = [&args[..], &["--set", "data.tokenizer=\"other.json\""]].concat();
    let r = train(d, &with_other);
    assert!(r.code == Some(0) && r.stderr.contains("tok/a.tokens.zst: made with another tokenizer (t5-tokenizer.json"), "{}", r.stderr);
    assert!(r.stderr.contains(": replaced"), "{}", r.stderr);
}

/// `train data tokenize` into an `--out` it cannot write (a read-only folder, run as a user
/// permissions bind) or create (below a file): refused before any shard is tokenized, saying
/// it cannot write or create that folder, the OS error once.
#[test]
fn data_tokenize_into_a_folder_it_cannot_write_says_so() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = cli_dir("x");
    let d = tmp.path();
    for f in ["a.json", "v.json"] {
        std::fs::write(d.join(f), "{\"text\": \"one document\"}\n").unwrap();
    }
    let sets = ["--set", "data.train=[\"a.json\"]", "--set", "data.validation=[\"v.json\"]"];
    let tokenize = |out: &'static str| [&["data", "tokenize", "--config", "c.toml", "--out", out][..], &sets[..]].concat();
    let once = |r: &Ran, said: &str| {
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        assert!(r.stderr.contains(said) && r.stderr.matches("(os error").count() == 1, "{}", r.stderr);
        assert!(!r.stderr.contains("cannot read") && !r.stdout.contains("documents"), "{}\n{}", r.stdout, r.stderr);
    };
    once(&train(d, &tokenize("a.json/tok")), "cannot create a.json/tok (--out): Not a directory (os error 20)");
    let Some(as_user) = common::unprivileged_train() else {
        eprintln!("SKIPPED the read-only case: user nobody cannot run {}", train_bin().display());
        return;
    };
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(d.join("ro")).unwrap();
    std::fs::set_permissions(d.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let r = common::run(as_user().args(tokenize("ro")).current_dir(d), "(as nobody) train data tokenize --out ro");
    once(&r, "cannot write into ro (--out): Permission denied (os error 13)");
    assert_eq!(std::fs::read_dir(d.join("ro")).unwrap().count(), 0);
}

/// `train stalls --follow` into a pipe (`| less`, `> file`): no terminal escape codes, each
/// redraw a plain table after a blank line, and the command ends once the run has a summary.
#[test]
fn stalls_follow_into_a_pipe_writes_plain_tables() {
    use std::io::{BufRead, BufReader, Read};
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let run = d.join("live");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("stalls.jsonl"), format!("{}\n{}\n", stall_row(1), stall_row(2))).unwrap();
    // a live run (no summary.json yet, its lock held by a live process: this one): redraws
    // until the summary appears
    std::fs::write(run.join("train.lock"), std::process::id().to_string()).unwrap();
    let mut child = Command::new(train_bin())
        .args(["stalls", "live", "--follow", "--interval", "0.1"])
        .current_dir(d)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    while out.matches("step 2 (").count() < 3 {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "train stalls --follow ended early: {out}");
        out += &line;
    }
    std::fs::write(run.join("summary.json"), r#"{"status":"finished"}"#).unwrap();
    stdout.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{out}");
    assert!(!out.contains('\x1b'), "escape codes in piped output: {out:?}");
    let tables = out.matches("step 2 (2 rows; mean over all 2 steps; stalled / updated elements)\n").count();
    assert!(tables >= 3, "{out}");
    assert_eq!(out.matches("\n\nstep 2 (").count(), tables - 1, "a blank line before each redraw: {out:?}");
    assert!(out.ends_with("run finished\n"), "{out:?}");
    // a finished run: one table, then it stops
    let r = train(d, &["stalls", "live", "--follow"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout.matches("step 2 (").count(), 1, "{}", r.stdout);
    assert!(!r.stdout.contains('\x1b') && r.stdout.ends_with("run finished\n"), "{:?}", r.stdout);
}

/// `train stalls --follow` stops when the run ends however it ends, and when
/// its reader goes away; it waits for a run that has not written a step yet.
#[test]
fn stalls_follow_stops_on_a_dead_or_interrupted_run_and_a_closed_pipe() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let run = d.join("live");
    std::fs::create_dir_all(&run).unwrap();
    let follow = |extra: &[&str]| -> std::process::Child {
        Command::new(train_bin())
            .args(["stalls", "live", "--follow", "--interval", "0.1"])
            .args(extra)
            .current_dir(d)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // not started yet: it waits (it used to fail with "no stalls.jsonl"), then draws
    let mut child = follow(&[]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "--follow gave up on a run that has not started");
    std::fs::write(run.join("train.lock"), std::process::id().to_string()).unwrap();
    std::fs::write(run.join("stalls.jsonl"), format!("{}\n", stall_row(1))).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("step 1 ("), "{line:?}");
    // its reader goes away (`| head -1`): it stops (it used to poll forever)
    drop(stdout);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "--follow kept running after its pipe closed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // the run was killed (its lock names a process that is gone): it says so and stops
    std::fs::write(run.join("train.lock"), "4000000000").unwrap();
    let r = train(d, &["stalls", "live", "--follow"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.ends_with("it was killed or crashed; resume with: train --resume live\n"), "{}", r.stdout);
    // an interrupted run is not "finished"
    std::fs::write(run.join("summary.json"), r#"{"status":"interrupted","steps":5}"#).unwrap();
    let r = train(d, &["stalls", "live", "--follow"]);
    assert!(r.stdout.ends_with("run interrupted at step 5; resume with: train --resume live\n"), "{}", r.stdout);
}

/// `sr` / `rne` are rounding names in configs as in `train predict --rounding`;
/// settings that do nothing or waste a bit are said; the step-0 validation shows progress;
/// a config reading C4 that is not there says how to fetch it.
#[test]
fn one_rounding_vocabulary_warnings_and_validation_progress() {
    let tmp = cli_dir("x");
    let d = tmp.path();
    let r = train(
        d,
        &[
            "--config",
            "c.toml",
            "--set",
            "train.max_steps=1",
            "--set",
            "optim.states.m_rounding=\"sr\"",
            "--set",
            "optim.states.v_rounding=\"rne\"",
            "--set",
            "optim.states.v_format=\"fp4e2m1\"",
            "--set",
            "optim.states.weight_rounding=\"stochastic\"",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let saved = std::fs::read_to_string(d.join("runs/x/config.toml")).unwrap();
    assert!(saved.contains("m_rounding = \"stochastic\"") && saved.contains("v_rounding = \"nearest\""), "{saved}");
    assert!(r.stderr.contains("v_format = \"fp4e2m1\" is signed"), "{}", r.stderr);
    assert!(r.stderr.contains("weight_rounding = \"stochastic\" does nothing with model.dtype = \"f32\""), "{}", r.stderr);
    // 8 validation batches: a line at each quarter before the loss
    for done in [2, 4, 6] {
        assert!(r.stderr.contains(&format!("step 0: validation {done}/8 batches")), "{}", r.stderr);
    }
    let bad = train(d, &["predict", "--format", "bf16", "--rounding", "round"]);
    assert!(bad.stderr.contains("`nearest` (or `rne`), `stochastic` (or `sr`) or `dither`"), "{}", bad.stderr);

    let c4 = r#"data.train=["data/local/c4/en/c4-train.*-of-01024.json.gz"]"#;
    let r = train(d, &["--config", "c.toml", "--set", c4, "--set", "run.name=\"c4\""]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("matched no file") && r.stderr.contains("get C4 with `train data fetch c4"), "{}", r.stderr);
}

#[test]
fn version_names_the_commit_and_the_devices() {
    let tmp = cli_dir("x");
    let r = train(tmp.path(), &["--version"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(root()).output().unwrap();
    let commit = match String::from_utf8_lossy(&head.stdout).trim() {
        c if head.status.success() && !c.is_empty() => format!("commit {c}"),
        _ => "unknown commit".into(),
    };
    let devices = if cfg!(feature = "nccl") {
        "CUDA + NCCL"
    } else if cfg!(feature = "cuda") {
        "CUDA"
    } else {
        "CPU only"
    };
    assert_eq!(r.stdout.trim(), format!("train {} ({commit}, {devices})", env!("CARGO_PKG_VERSION")));
}

/// The adaptive rule's resets are logged, each with the updates since the last
/// (b2 = 0.9 so that the rule's threshold E(j) falls within a short run). Each logged reset is
/// at the step of its update, and no two are closer than the rule allows (ADAPTIVE_LAG + 1 =
/// 9 updates).
#[test]
fn adaptive_resets_are_logged_with_their_spacing() {
    let dir = cli_dir("adaptive");
    let d = dir.path();
    let sets = [
        "optim.states.v_format=\"fp4\"",
        "optim.states.m_reset_every=0",
        "optim.states.v_reset_every=0",
        "optim.states.reset=\"adaptive\"",
        "optim.beta2=0.9",
        "train.max_steps=60",
        "train.eval_every=0",
    ];
    let mut args = vec!["--config", "c.toml"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let r = train(d, &args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let resets: Vec<(u64, u64, Option<u64>)> = r
        .stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("step ").nth(1)?;
            let (step, rest) = rest.split_once(": adaptive reset of m and v (Alg. 2) before update ")?;
            let (update, since) = match rest.split_once(", ") {
                Some((u, s)) => (u, Some(s.strip_suffix(" updates after the last")?.parse().ok()?)),
                None => (rest, None),
            };
            Some((step.parse().ok()?, update.parse().ok()?, since))
        })
        .collect();
    assert!(resets.len() >= 2, "{}", r.stderr);
    assert_eq!(resets[0].2, None, "the first has no last");
    for (i, &(step, update, since)) in resets.iter().enumerate() {
        assert_eq!(step, update, "no skipped steps in this run");
        if i > 0 {
            assert_eq!(since, Some(update - resets[i - 1].1));
            assert!(since.unwrap() >= 9, "{resets:?}");
        }
    }
}
