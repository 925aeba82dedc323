//! Checkpoints, exact resume, non-finite steps and bad input; parquet shards against JSON.
//!
//! Tiny model (hidden 32, 1 layer) on the bundled C4 sample, a few steps per run, so the
//! whole file runs in about two minutes on 2 CPU cores.
//!
//! v resets only at steps where m resets too: resetting v alone (or v underflowing to 0 in
//! fp4) while m is non-zero gives rows with a zero gradient an update of lr*m/eps, which
//! blows up a run this small (embedding rows of tokens absent from the batch).

use lowbit_train::checkpoint;
use lowbit_train::config::RunConfig;
use lowbit_train::eval::ExportCheck;
use lowbit_train::logs::summary::RunStatus;
use lowbit_train::progress::Logs;
use lowbit_train::run::{self, RunReport};
use lowbit_train::session::Launch;
use lowbit_train::train_state::TrainState;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

mod common;
use common::{base_toml, root};
#[path = "../../data/tests/common/parquet_file.rs"]
mod parquet_file;

/// Write `text` to `dir/file` and load it with overrides.
fn load_with(dir: &Path, file: &str, text: &str, sets: &[&str]) -> anyhow::Result<RunConfig> {
    let p = dir.join(file);
    std::fs::write(&p, text).unwrap();
    RunConfig::load(&p, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

fn config(dir: &Path, name: &str, sets: &[&str]) -> RunConfig {
    load_with(dir, &format!("{name}.toml"), &base_toml(&dir.join("runs"), name), sets).unwrap()
}

fn launch(config: RunConfig, resume_from: Option<PathBuf>, stop_after: Option<u64>) -> anyhow::Result<RunReport> {
    let start = match resume_from {
        Some(ck) => Launch::resume(config, ck),
        None => Launch::new(config),
    };
    run::train(Launch { stop_after, ..start }, &mut Logs)
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// metrics.jsonl rows without the wall-clock fields.
fn metrics(run_dir: &Path) -> Vec<Value> {
    rows(&run_dir.join("metrics.jsonl"))
        .into_iter()
        .map(|mut r| {
            let o = r.as_object_mut().unwrap();
            o.remove("step_time");
            o.remove("tokens_per_s");
            r
        })
        .collect()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Format an error as the binary prints it, and check it is one line naming `needles`.
fn one_line_error<T>(r: anyhow::Result<T>, needles: &[&str]) -> String {
    let e = match r {
        Ok(_) => panic!("expected an error containing {needles:?}"),
        Err(e) => format!("{e:#}"),
    };
    eprintln!("error: {e}");
    assert!(!e.contains('\n'), "error is not one line: {e}");
    for n in needles {
        assert!(e.contains(n), "error {e:?} does not contain {n:?}");
    }
    let parts: Vec<&str> = e.split(": ").collect();
    assert!(parts.windows(2).all(|w| w[0] != w[1]), "a cause is repeated: {e}");
    e
}

/// Uninterrupted run vs. the same run stopped at `stop` and resumed from its checkpoint of
/// step `resume_at` (an older one: as after a crash, the rows logged past it are replayed):
/// identical metrics, stall rows, final weights and optimizer bytes. Returns the folder that
/// holds the runs and the uninterrupted run's folder.
fn check_exact_resume(tag: &str, sets: &[&str], stop: u64, resume_at: u64, torch_dtype: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let full = launch(config(tmp.path(), &format!("{tag}_full"), sets), None, None).unwrap();
    assert!(!full.stopped_early);

    let cfg = config(tmp.path(), &format!("{tag}_split"), sets);
    let first = launch(cfg.clone(), None, Some(stop)).unwrap();
    assert!(first.stopped_early);
    assert!(checkpoint::latest(&first.run_dir).unwrap().ends_with(format!("step_{stop:07}")));
    let ck = checkpoint::list(&first.run_dir).unwrap().into_iter().find(|c| c.0 == resume_at).unwrap().1;
    let second = launch(cfg, Some(ck), None).unwrap();
    assert!(!second.stopped_early);

    let (a, b) = (&full.run_dir, &second.run_dir);
    let (ma, mb) = (metrics(a), metrics(b));
    assert_eq!(ma.len(), mb.len(), "metrics rows");
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(x, y, "metrics row differs after resume");
    }
    let (sa, sb) = (rows(&a.join("stalls.jsonl")), rows(&b.join("stalls.jsonl")));
    assert_eq!(sa.len() as u64, config(tmp.path(), "x", sets).train.max_steps);
    assert_eq!(sa, sb, "stall rows differ after resume");
    // the stalls actually count something (states and resets exercised)
    assert!(sa.iter().all(|r| r["v"]["updated"].as_u64().unwrap() > 0));
    assert!(sa.iter().any(|r| r["v"]["stalled"].as_u64().unwrap() > 0));

    let (ca, cb) = (checkpoint::latest(a).unwrap(), checkpoint::latest(b).unwrap());
    for f in ["model.safetensors", "optimizer.safetensors", "state.json", "export_check.json"] {
        assert!(read(&ca.join(f)) == read(&cb.join(f)), "{f} differs after resume");
    }
    assert_eq!(full.summary.unwrap().final_val_loss, second.summary.unwrap().final_val_loss);
    let hf: Value = serde_json::from_slice(&read(&cb.join("config.json"))).unwrap();
    assert_eq!(hf["torch_dtype"], torch_dtype);
    let check: ExportCheck = serde_json::from_slice(&read(&cb.join("export_check.json"))).unwrap();
    assert_eq!(check.dtype, torch_dtype);
    (tmp, a.clone())
}

#[test]
fn resume_is_bit_identical_f32_weights() {
    // stopped at 5, resumed from the checkpoint of step 3 (rows 4-5 replayed)
    check_exact_resume("f32", &[], 5, 3, "float32");
}

#[test]
fn resume_is_bit_identical_bf16_weights() {
    let sets = ["model.dtype=\"bf16\"", "optim.states.weight_rounding=\"stochastic\""];
    check_exact_resume("bf16", &sets, 4, 4, "bfloat16");
}

/// `model.dtype = "bf16-mixed"` (FP32 weights and update, BF16 products and activations):
/// the tiny run trains (its last training loss below its first), resumes bit-identically,
/// and its checkpoints hold FP32 weights (`float32` in config.json and the export check, whose
/// loss is the FP32 model's: the weights as exported).
#[test]
fn resume_is_bit_identical_bf16_mixed() {
    let (_tmp, run) = check_exact_resume("mixed", &["model.dtype=\"bf16-mixed\""], 5, 3, "float32");
    let losses: Vec<f64> = metrics(&run).iter().filter_map(|r| r.get("loss").and_then(Value::as_f64)).collect();
    println!("bf16-mixed training losses {losses:?}");
    assert!(losses.len() >= 2 && losses[losses.len() - 1] < losses[0], "bf16-mixed trains: {losses:?}");
    let ck = checkpoint::latest(&run).unwrap();
    let raw = read(&ck.join("model.safetensors"));
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    assert!(!st.is_empty());
    for (name, t) in st.tensors() {
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}: bf16-mixed saves its FP32 master weights");
    }
}

/// Streaming mode (a text above `data.in_memory_max_tokens`): the checkpoint of step 3 holds
/// the shuffle buffer's rows and draws, and the run resumed from it reads the same rows.
#[test]
fn resume_is_bit_identical_streaming_through_a_shuffle_buffer() {
    let sets = ["data.in_memory_max_tokens=0", "data.shuffle_buffer=64"];
    let (_tmp, full) = check_exact_resume("streaming", &sets, 5, 3, "float32");
    let state: Value = serde_json::from_slice(&read(&checkpoint::latest(&full).unwrap().join("state.json"))).unwrap();
    assert_eq!(state["data"]["order"], serde_json::json!({"kind": "buffered", "seed": 7, "buffer": 64}));
    assert!(state["data"]["draws"].as_u64().unwrap() > 0);
    let data =
        candle_core::safetensors::load(checkpoint::latest(&full).unwrap().join("data.safetensors"), &candle_core::Device::Cpu).unwrap();
    assert_eq!(data["buffer_tokens"].dims(), &[64 * 33], "64 rows of seq_len + 1 = 33 ids");
}

/// SOAP (FP8 m with L and R in its format, a refresh every 2 updates, so the run refreshes
/// its eigenbases before and after the checkpoint): exact resume, the bases saved. A config
/// whose `optim.soap.precond_format` would read the stored L and R in another format of the
/// same size (FP8 E5M2 for E4M3) is refused before anything loads, naming the key.
#[test]
fn soap_resumes_bit_identical_and_only_with_its_preconditioner_format() {
    let sets = ["optim.kind=\"soap\"", "optim.soap.precondition_frequency=2", "optim.states.m_format=\"fp8e4m3\""];
    let (tmp, full) = check_exact_resume("soap", &sets, 5, 3, "float32");
    // the older of the two kept checkpoints (step 6; from the last one there is nothing to resume)
    let ck = checkpoint::list(&full).unwrap().into_iter().next().unwrap().1;
    let state: Value = serde_json::from_slice(&read(&ck.join("state.json"))).unwrap();
    assert_eq!(state["precond"], "fp8e4m3 (pow2 scales per 32)");
    let other = [&sets[..], &["optim.soap.precond_format=\"fp8e5m2\""]].concat();
    one_line_error(
        launch(config(tmp.path(), "soap_e5m2", &other), Some(ck), None),
        &["state.json", "L and R are stored in fp8e4m3 (pow2 scales per 32)", "fp8e5m2 (pow2 scales per 32)", "optim.soap.precond_format"],
    );
}

/// Muon (its matrices' momentum dithered, in the base config's FP4 with its m resets every 2
/// updates; BF16 weights):
/// it trains (the loss falls) and resumes exactly; the checkpoint keeps m alone for a Muon
/// matrix and m and v for the AdamW tensors, and a config
/// of another rule is refused naming `optim.kind`.
#[test]
fn muon_resumes_bit_identical_and_only_as_muon() {
    let sets = ["optim.kind=\"muon\"", "optim.states.m_rounding=\"dither\"", "model.dtype=\"bf16\""];
    let (tmp, full) = check_exact_resume("muon", &sets, 5, 3, "bfloat16");
    let loss: Vec<f64> = metrics(&full).iter().filter_map(|r| r["loss"].as_f64()).collect();
    assert!(loss.len() > 2 && loss[loss.len() - 1] < loss[0], "Muon trains: losses {loss:?}");
    let ck = checkpoint::list(&full).unwrap().into_iter().next().unwrap().1;
    let opt = candle_core::safetensors::load(ck.join("optimizer.safetensors"), &candle_core::Device::Cpu).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    assert!(opt.contains_key(&format!("{q}.m.codes")) && !opt.contains_key(&format!("{q}.v.codes")), "a Muon matrix keeps m alone");
    assert!(opt.contains_key("model.embed_tokens.weight.v.codes"), "the embedding (AdamW) keeps v");
    let adamw = ["optim.states.m_rounding=\"dither\"", "model.dtype=\"bf16\""];
    one_line_error(launch(config(tmp.path(), "muon_as_adamw", &adamw), Some(ck), None), &["v.codes", "optim.kind must match"]);
}

/// The adaptive reset rule (Alg. 2) carries its state in the checkpoint: a run resumed in the
/// middle of a cycle resets at the same updates, bit for bit. With b2 = 0.9 the threshold E(j)
/// falls fast and s0 = 0.05 counts the ~half of v's entries that stay unchanged here, so the rule
/// resets within the run (checked). The optimizer saves the rule's state in its own file; a
/// checkpoint written before it did (the state in `state.json`) resumes the same.
#[test]
fn resume_is_bit_identical_with_adaptive_resets() {
    let sets = [
        "optim.states.reset=\"adaptive\"",
        "optim.states.m_reset_every=0",
        "optim.states.v_reset_every=0",
        "optim.states.v_rounding=\"nearest\"",
        "optim.states.reset_s0=0.05",
        "optim.beta2=0.9",
        "train.max_steps=24",
    ];
    let (tmp, full) = check_exact_resume("adaptive", &sets, 20, 18, "float32");
    let last = checkpoint::latest(&full).unwrap();
    let opt = candle_core::safetensors::load(last.join("optimizer.safetensors"), &candle_core::Device::Cpu).unwrap();
    let counters = opt["adaptive_reset.counters"].to_vec1::<i64>().unwrap();
    assert!(counters[0] > 1, "no adaptive reset in 24 updates: cycle_start, next, decided = {counters:?}");
    let state: Value = serde_json::from_slice(&read(&last.join("state.json"))).unwrap();
    assert_eq!((state.get("adaptive_reset"), state["reset"].as_str()), (None, Some("adaptive")));

    // the checkpoint of step 21 as an older lowbit wrote it, resumed: the same last checkpoint
    let want = read(&last.join("optimizer.safetensors"));
    let ck = checkpoint::list(&full).unwrap().into_iter().find(|c| c.0 == 21).unwrap().1;
    move_rule_state_to_state_json(&ck);
    launch(config(tmp.path(), "adaptive_full", &sets), Some(ck), None).unwrap();
    assert!(read(&checkpoint::latest(&full).unwrap().join("optimizer.safetensors")) == want);
}

/// Rewrites checkpoint `ck` as lowbit wrote it before the optimizer saved the adaptive rule's
/// state: the state in `state.json` (`adaptive_reset`, no `reset`), not in
/// `optimizer.safetensors`; the manifest rewritten.
/// Edits checkpoint `ck`'s `state.json` with `edit` and writes its manifest again: a
/// checkpoint as an older lowbit wrote it.
fn edit_state_json(ck: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let mut state: Value = serde_json::from_slice(&read(&ck.join("state.json"))).unwrap();
    edit(state.as_object_mut().unwrap());
    std::fs::write(ck.join("state.json"), serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    std::fs::remove_file(ck.join("manifest.json")).unwrap();
    lowbit_train::manifest::write(ck).unwrap();
}

fn move_rule_state_to_state_json(ck: &Path) {
    let file = ck.join("optimizer.safetensors");
    let mut opt = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    let mut take = |k: &str| opt.remove(&format!("adaptive_reset.{k}")).unwrap();
    let (counters, acc) = (take("counters").to_vec1::<i64>().unwrap(), take("acc").to_vec1::<f64>().unwrap());
    let (updates, fractions) = (take("pending_updates").to_vec1::<i64>().unwrap(), take("pending_fractions").to_vec1::<f64>().unwrap());
    let rule = lowbit_optim::states::reset::AdaptiveReset {
        cycle_start: counters[0] as u64,
        acc: acc[0],
        next: counters[1] as u64,
        decided: counters[2] as u64,
        pending: updates.iter().zip(&fractions).map(|(&u, &p)| (u as u64, p)).collect(),
    };
    candle_core::safetensors::save(&opt, &file).unwrap();
    edit_state_json(ck, |o| {
        assert_eq!(o.remove("reset"), Some("adaptive".into()));
        o.insert("adaptive_reset".into(), serde_json::to_value(&rule).unwrap());
    });
}

/// A checkpoint written before scale kinds were recorded (its `state.json` without `m_scale` /
/// `v_scale`) holds pow2 FP4 states: resumed with the default scale (now amax for FP4), it
/// continues with pow2 (said in the run's config.toml), bit for bit as the uninterrupted pow2
/// run; an explicit amax is refused, naming the way out.
#[test]
fn checkpoints_from_before_scale_kinds_resume_as_pow2() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let pow2 = ["optim.states.scale=\"pow2\""];
    let full = launch(config(d, "full", &pow2), None, None).unwrap();
    let first = launch(config(d, "old", &pow2), None, Some(3)).unwrap();
    let ck = checkpoint::latest(&first.run_dir).unwrap();
    // make it an old checkpoint: no scale kinds in state.json
    edit_state_json(&ck, |o| assert_eq!((o.remove("m_scale"), o.remove("v_scale")), (Some("pow2".into()), Some("pow2".into()))));
    // an explicit amax does not match what the checkpoint holds
    one_line_error(
        launch(config(d, "old", &["optim.states.scale=\"amax\""]), Some(ck.clone()), None),
        &["state.json", "pow2 scales", "amax", "--set optim.states.scale=\"pow2\""],
    );
    let resumed = launch(config(d, "old", &[]), Some(ck), None).unwrap();
    assert!(std::fs::read_to_string(resumed.run_dir.join("config.toml")).unwrap().contains("scale = \"pow2\""));
    assert_eq!(metrics(&full.run_dir), metrics(&resumed.run_dir));
    let (a, b) = (checkpoint::latest(&full.run_dir).unwrap(), checkpoint::latest(&resumed.run_dir).unwrap());
    assert!(read(&a.join("optimizer.safetensors")) == read(&b.join("optimizer.safetensors")));
}

/// A checkpoint written before the rows could be shuffled (its `state.json` without the data
/// order) read them in file order: resumed with today's default (`data.shuffle = true`) it
/// continues in file order (said in the run's config.toml), as the run that never stopped;
/// a new file-order checkpoint resumed shuffled is refused, naming the setting.
#[test]
fn checkpoints_from_before_shuffling_resume_in_file_order() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let file_order = ["data.shuffle=false"];
    let full = launch(config(d, "full", &file_order), None, None).unwrap();
    let first = launch(config(d, "old", &file_order), None, Some(3)).unwrap();
    let ck = checkpoint::latest(&first.run_dir).unwrap();
    one_line_error(
        launch(config(d, "old", &[]), Some(ck.clone()), None),
        &["cannot resume the training data", "file order (data.shuffle = false)", "rows permuted in memory"],
    );
    // make it an old checkpoint: no data order in state.json
    edit_state_json(&ck, |o| {
        let data = o["data"].as_object_mut().unwrap();
        for k in ["order", "row", "pass_rows", "draws"] {
            assert!(data.remove(k).is_some(), "{k}");
        }
    });
    let resumed = launch(config(d, "old", &[]), Some(ck), None).unwrap();
    assert!(std::fs::read_to_string(resumed.run_dir.join("config.toml")).unwrap().contains("shuffle = false"));
    assert_eq!(metrics(&full.run_dir), metrics(&resumed.run_dir));
}

#[test]
fn checkpoint_layout_and_retention() {
    let tmp = tempfile::tempdir().unwrap();
    let out = launch(config(tmp.path(), "layout", &["train.max_steps=7"]), None, None).unwrap();
    // every 3 steps and at the end, keep 2: 6 and 7
    let steps: Vec<u64> = checkpoint::list(&out.run_dir).unwrap().into_iter().map(|c| c.0).collect();
    assert_eq!(steps, vec![6, 7]);
    let names: Vec<String> = std::fs::read_dir(out.run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "temporary folder left: {names:?}");

    let ck = checkpoint::latest(&out.run_dir).unwrap();
    // every file of a checkpoint has the same permissions (the safetensors writer's 0600 is not kept)
    let mode = |f: &str| std::fs::metadata(ck.join(f)).unwrap().permissions();
    for f in ["model.safetensors", "optimizer.safetensors", "data.safetensors"] {
        assert_eq!(mode(f), mode("config.json"), "{f}");
    }
    // weights: HF LLaMA names with transformers' metadata
    let bytes = read(&ck.join("model.safetensors"));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().and_then(|m| m.get("format")).map(String::as_str), Some("pt"));
    let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
    names.sort();
    for want in [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    let hf: Value = serde_json::from_slice(&read(&ck.join("config.json"))).unwrap();
    assert_eq!(hf["model_type"], "llama");
    assert_eq!(hf["hidden_size"], 32);
    assert_eq!(hf["vocab_size"], 32100);
    assert_eq!(hf["torch_dtype"], "float32");
    // the run's tokenizer as it is, and the config transformers' AutoTokenizer reads (its
    // special tokens: the test below)
    assert_eq!(read(&ck.join("tokenizer.json")), read(&root().join("data/tokenizers/t5-tokenizer.json")));
    let tokenizer_config: Value = serde_json::from_slice(&read(&ck.join("tokenizer_config.json"))).unwrap();
    assert_eq!(
        (&tokenizer_config["tokenizer_class"], &tokenizer_config["model_max_length"]),
        (&"PreTrainedTokenizerFast".into(), &32.into())
    );

    // optimizer: stored bytes (U8 codes: fp4 = 1/2 byte/elem, fp8 = 1) and F32 block scales
    let obytes = read(&ck.join("optimizer.safetensors"));
    let opt = safetensors::SafeTensors::deserialize(&obytes).unwrap();
    let embed = 32100 * 32;
    let m = opt.tensor("model.embed_tokens.weight.m.codes").unwrap();
    assert_eq!((m.dtype(), m.shape()), (safetensors::Dtype::U8, &[embed / 2][..]));
    let v = opt.tensor("model.embed_tokens.weight.v.codes").unwrap();
    assert_eq!((v.dtype(), v.shape()), (safetensors::Dtype::U8, &[embed][..]));
    let s = opt.tensor("model.embed_tokens.weight.m.scales").unwrap();
    assert_eq!((s.dtype(), s.shape()), (safetensors::Dtype::F32, &[embed / 32][..]));

    let state: TrainState = lowbit_train::train_state::load_state(&ck).unwrap();
    assert_eq!(state.step, 7);
    assert!(state.tokens > 0 && state.data.row > 0, "in memory: rows of the pass taken");
    assert_eq!(state.data.order, lowbit_data::RowOrder::Permuted { seed: 7 }, "data.seed is train.seed");
    assert_eq!((state.m_format.name(), state.v_format.name(), state.block_size), ("fp4e2m1", "fp8e4m3", 32));
    let saved = RunConfig::from_toml(&String::from_utf8(read(&ck.join("config.toml"))).unwrap()).unwrap();
    assert_eq!(saved.train.max_steps, 7);

    // export_check.json: one validation micro-batch and the loss of these weights on it,
    // which is the first batch of the final evaluation
    let check: ExportCheck = serde_json::from_slice(&read(&ck.join("export_check.json"))).unwrap();
    assert_eq!(check.input_ids.len(), 2);
    assert!(check.input_ids.iter().chain(&check.targets).all(|r| r.len() == 32));
    assert_eq!(check.input_ids[0][1..], check.targets[0][..31]);
    assert!(check.loss.is_finite() && check.loss > 0.0 && check.dtype == "float32");
    // the run learned something (sanity of the test config itself)
    let s = out.summary.as_ref().unwrap();
    assert!(s.final_val_loss.unwrap() < s.initial_val_loss.unwrap(), "{s:?}");
    assert!(s.final_val_loss.is_some());
}

/// The exported config.json carries the tokenizer's special ids (transformers would assume
/// LLaMA's bos 1 / eos 2 otherwise, and `generate` from a T5-vocabulary model never stops), and
/// the tokenizer's configs name the same tokens (and the unknown piece).
#[test]
fn exported_config_json_has_the_tokenizers_special_ids() {
    let shared = common::root().join("../shared/data/tokenizers/llama2-tokenizer.json");
    let t5 = serde_json::json!({"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"});
    let mut cases = vec![(None, (Value::Null, Value::from(1), Value::from(0)), t5)];
    if shared.is_file() {
        let llama2 = serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"});
        cases.push((Some(shared), (Value::from(1), Value::from(2), Value::Null), llama2));
    } else {
        eprintln!("LLaMA-2 case skipped: {} not present (the shared data lives beside the checkout)", shared.display());
    }
    for (tokenizer, (bos, eos, pad), special) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut sets = vec!["train.max_steps=1".to_string()];
        if let Some(t) = &tokenizer {
            // the text, not the bundled T5 token shards (refused with another tokenizer)
            let r = common::root();
            sets.push(format!("data.tokenizer=\"{}\"", t.display()));
            sets.push(format!("data.train=[\"{}/data/c4-sample/en-train.*.json.gz\"]", r.display()));
            sets.push(format!("data.validation=[\"{}/data/c4-sample/en-validation.*.json.gz\"]", r.display()));
        }
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let out = launch(config(tmp.path(), "ids", &sets), None, None).unwrap();
        let ck = checkpoint::latest(&out.run_dir).unwrap();
        let hf: Value = serde_json::from_slice(&read(&ck.join("config.json"))).unwrap();
        let got = (hf["bos_token_id"].clone(), hf["eos_token_id"].clone(), hf["pad_token_id"].clone());
        assert_eq!(got, (bos, eos, pad), "{tokenizer:?}: {hf}");
        for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
            assert!(hf.get(key).is_some(), "{key} missing (null must be written): {hf}");
        }
        assert_eq!(serde_json::from_slice::<Value>(&read(&ck.join("special_tokens_map.json"))).unwrap(), special, "{tokenizer:?}");
        let tokenizer_config: Value = serde_json::from_slice(&read(&ck.join("tokenizer_config.json"))).unwrap();
        for (role, token) in special.as_object().unwrap() {
            assert_eq!(&tokenizer_config[role], token, "{tokenizer:?}: {tokenizer_config}");
        }
    }
}

/// An interrupt that arrives before the first step (during start-up or the
/// step-0 validation) acts then: a new run leaves nothing behind, a resumed one stays at its
/// checkpoint with an "interrupted" summary; the run then continues to the end.
#[test]
fn an_interrupt_before_the_first_step_writes_no_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "ctrlc", &[]);
    let interrupted = || Arc::new(AtomicBool::new(true));
    let out = run::train(Launch { interrupt: interrupted(), ..Launch::new(cfg.clone()) }, &mut Logs).unwrap();
    assert!(out.stopped_early && out.summary.is_none());
    assert!(!out.run_dir.exists(), "a new run stopped before its first step left its folder");
    let first = launch(cfg.clone(), None, Some(3)).unwrap();
    let ck = checkpoint::latest(&first.run_dir).unwrap();
    let out = run::train(Launch { interrupt: interrupted(), ..Launch::resume(cfg.clone(), ck.clone()) }, &mut Logs).unwrap();
    let summary = out.summary.unwrap();
    assert!(out.stopped_early && summary.status == RunStatus::Interrupted && summary.steps == 3);
    assert_eq!(checkpoint::latest(&out.run_dir).unwrap(), ck, "no checkpoint was written");
    let done = launch(cfg, Some(ck), None).unwrap();
    assert!(!done.stopped_early);
    assert_eq!(done.summary.unwrap().steps, 8);
}

#[test]
fn non_finite_steps_are_skipped_then_the_run_stops_with_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    // lr 1e30 without clipping: step 1's update makes the weights huge, then the loss is
    // non-finite at every step.
    let blowup = ["optim.lr=1e30", "optim.grad_clip=0", "optim.warmup_steps=0", "train.checkpoint_every=0"];
    let mut sets = blowup.to_vec();
    sets.extend(["train.max_nonfinite_steps=3", "train.max_steps=20"]);
    let cfg = config(tmp.path(), "nan", &sets);
    let run_dir = cfg.run_dir();
    let err = one_line_error(
        launch(cfg, None, None),
        &["consecutive steps with a non-finite loss", "train.max_nonfinite_steps = 3", "checkpoints/step_"],
    );
    let m = rows(&run_dir.join("metrics.jsonl"));
    let train: Vec<&Value> = m.iter().filter(|r| r["kind"] == "train").collect();
    let skipped: Vec<u64> = train.iter().filter(|r| r["skipped"] == true).map(|r| r["step"].as_u64().unwrap()).collect();
    let last = *skipped.last().unwrap();
    assert_eq!(skipped.len(), 3, "{err}");
    assert_eq!(skipped, vec![last - 2, last - 1, last], "consecutive");
    assert_eq!(train.last().unwrap()["step"].as_u64(), Some(last), "stopped at the 3rd skipped step");
    assert!(train.iter().filter(|r| r["skipped"] != true).all(|r| r["loss"].is_number()));
    let ck = checkpoint::latest(&run_dir).unwrap();
    assert!(err.contains(&ck.display().to_string()), "{err}");
    let st = lowbit_train::train_state::load_state(&ck).unwrap();
    assert_eq!((st.step, st.nonfinite_in_row), (last, 3));
    // the optimizer counts applied updates only (a skipped step is no update)
    assert_eq!(st.updates, last - 3);
    // skipped steps leave the stall counters empty
    let stalls = rows(&run_dir.join("stalls.jsonl"));
    assert_eq!(stalls.last().unwrap()["v"]["updated"].as_u64().unwrap_or(0), 0);

    // Below the limit the run reaches max_steps, but ends non-finite: an error (exit 1), with
    // its summary (NaN rows, written as null, read back) and checkpoint written.
    let mut sets = blowup.to_vec();
    sets.extend(["train.max_nonfinite_steps=100", "train.max_steps=4", "train.eval_every=0"]);
    let cfg = config(tmp.path(), "nan_ok", &sets);
    let run_dir = cfg.run_dir();
    one_line_error(launch(cfg, None, None), &["the run ended non-finite at step 4", "checkpoints/step_0000004"]);
    let summary: Value = serde_json::from_slice(&read(&run_dir.join("summary.json"))).unwrap();
    assert_eq!(summary["status"], "non_finite");
    assert!(summary["skipped_steps"].as_u64().unwrap() >= 2, "{summary}");
    assert!(checkpoint::latest(&run_dir).is_ok());
}

#[test]
fn bad_config_files_give_one_line_errors_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let base = base_toml(&d.join("runs"), "cfg");
    let nth_line = |text: &str, pat: &str| text.lines().position(|l| l.starts_with(pat)).unwrap() + 1;

    // missing file
    one_line_error(RunConfig::load(&d.join("nope.toml"), &[]), &["cannot read config file", "nope.toml"]);

    // wrong type
    let text = base.replace("micro_batch = 2", "micro_batch = \"two\"");
    let line = nth_line(&text, "micro_batch");
    one_line_error(
        load_with(d, "wrong_type.toml", &text, &[]),
        &[&format!("wrong_type.toml:{line}:"), "invalid type: string \"two\"", "[train]"],
    );

    // a key that takes a name, given a number or a boolean: the names are listed, in a file
    // and in a --set, for every such key
    let text = base.replace("seq_len = 32", "seq_len = 32\nmode = 3");
    let line = nth_line(&text, "mode = 3");
    one_line_error(load_with(d, "enum.toml", &text, &[]), &[&format!("enum.toml:{line}:"), "`data.mode` takes `truncate_pad` or `concat`"]);
    for (set, choices) in [
        ("optim.states.scale=2", "one of `default`, `amax`, `pow2`"),
        ("optim.states.v_zero=true", "`exclude` or `keep`"),
        ("optim.states.m_rounding=1.5", "one of `nearest`, `rne`, `sr`, `stochastic`"),
        ("optim.states.reset=1", "`periodic` or `adaptive`"),
        ("optim.states.bias_correction=0", "`restart` or `continue`"),
        ("optim.states.v_reset_idle=1", "`reset` or `keep`"),
        ("optim.states.weight_rounding=0", "one of `nearest`, `rne`, `sr`, `stochastic`"),
        ("model.dtype=1", "one of `f32`, `bf16`, `bf16-mixed`"),
        ("model.kernels=2", "one of `auto`, `fused`, `composed`"),
        ("model.matmul_precision=1", "`fp32` or `tf32`"),
        ("data.on_bad_line=1", "`skip` or `fail`"),
    ] {
        let key = set.split('=').next().unwrap();
        one_line_error(load_with(d, "enum_set.toml", &base, &[set]), &[&format!("--set {set}"), &format!("`{key}` takes {choices}")]);
    }

    // unknown key
    let text = base.replace("eval_every = 3", "eval_every = 3\nevall_every = 3");
    let line = nth_line(&text, "evall_every");
    one_line_error(load_with(d, "unknown.toml", &text, &[]), &[&format!("unknown.toml:{line}:"), "unknown field `evall_every`"]);

    // syntax error
    let text = base.replace("lr = 3e-3", "lr = 3e-3 x");
    let line = nth_line(&text, "lr =");
    one_line_error(load_with(d, "syntax.toml", &text, &[]), &[&format!("syntax.toml:{line}:")]);

    // unknown key in a file that `extends` a base: named in the child, with its line
    std::fs::write(d.join("base.toml"), &base).unwrap();
    let child = "extends = \"base.toml\"\n\n[optim.states]\nm_format = \"bf16\"\nm_rese_every = 5\n";
    one_line_error(load_with(d, "child.toml", child, &[]), &["child.toml:5:", "unknown field `m_rese_every`"]);
    // wrong type in the base of an `extends` chain
    std::fs::write(d.join("base_bad.toml"), base.replace("seed = 7", "seed = -7.5")).unwrap();
    let line = nth_line(&base, "seed");
    one_line_error(load_with(d, "child2.toml", "extends = \"base_bad.toml\"\n", &[]), &[&format!("base_bad.toml:{line}:"), "seed"]);
    // a missing base
    one_line_error(load_with(d, "child3.toml", "extends = \"gone.toml\"\n", &[]), &["child3.toml:1:", "gone.toml", "does not exist"]);

    // unknown key / wrong type through --set: the override is named
    std::fs::write(d.join("ok.toml"), &base).unwrap();
    let sets = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    one_line_error(RunConfig::load(&d.join("ok.toml"), &sets(&["train.bogus=1"])), &["--set train.bogus=1", "unknown field `bogus`"]);
    one_line_error(
        RunConfig::load(&d.join("ok.toml"), &sets(&["train.micro_batch=two"])),
        &["--set train.micro_batch=two", "invalid type"],
    );
    // a list given as a bare string: the error shows the TOML list syntax
    one_line_error(
        RunConfig::load(&d.join("ok.toml"), &sets(&["data.train=a/*.json.gz"])),
        &["--set data.train=a/*.json.gz", "expected a sequence", "--set 'data.train=[\"...\", \"...\"]'"],
    );

    // bad values: the key and where it was set
    let text = base.replace("lr = 3e-3", "lr = -1.0");
    let line = nth_line(&text, "lr =");
    one_line_error(load_with(d, "neg_lr.toml", &text, &[]), &[&format!("neg_lr.toml:{line}"), "optim.lr: must be a positive number"]);
    let text = base.replace("v_format = \"fp8\"", "v_format = \"fp5\"");
    let line = nth_line(&text, "v_format");
    one_line_error(load_with(d, "fmt.toml", &text, &[]), &[&format!("fmt.toml:{line}"), "optim.states.v_format"]);
    one_line_error(
        RunConfig::load(&d.join("ok.toml"), &sets(&["train.grad_accum=0"])),
        &["--set train.grad_accum=0", "train.grad_accum: must be > 0"],
    );
    // a float that is 0 in the optimizer's FP32 is refused, naming the key
    for (set, key) in [("optim.eps=1e-60", "optim.eps"), ("optim.lr=1e-50", "optim.lr")] {
        one_line_error(RunConfig::load(&d.join("ok.toml"), &sets(&[set])), &[key, "below FP32's smallest normal number"]);
    }
    // a model shorter than its sequences is refused, not silently lengthened
    let short = RunConfig::load(&d.join("ok.toml"), &sets(&["model.max_seq_len=16"])).unwrap();
    let e = short.model_config(100).unwrap_err().to_string();
    assert!(e.contains("model.max_seq_len = 16 is shorter than data.seq_len = 32"), "{e}");
    let follows = RunConfig::load(&d.join("ok.toml"), &[]).unwrap().model_config(100).unwrap();
    assert_eq!(follows.max_seq_len, 1024, "left out: the default, at least data.seq_len");
}

/// Write a shard file for the data tests.
fn shard(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

#[test]
fn bad_data_and_tokenizer_give_one_line_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let run = |name: &str, sets: &[&str]| launch(config(d, name, sets), None, None);
    let set_train = |p: &str| format!("data.train=[\"{p}\"]");

    // missing train file
    let missing = d.join("no-such-shard.json.gz").display().to_string();
    one_line_error(run("missing", &[&set_train(&missing)]), &["no-such-shard.json.gz", "does not exist"]);
    // a pattern that matches nothing
    let pat = d.join("nothing-*.json.gz").display().to_string();
    one_line_error(run("nomatch", &[&set_train(&pat)]), &["nothing-*.json.gz", "matched no file"]);

    // corrupt gzip: skipped with a warning by default (then no text is left) ...
    let mut corrupt = vec![0x1f, 0x8b, 0x08, 0x00];
    corrupt.extend_from_slice(b"this is not deflate data at all\n");
    let bad_gz = shard(d, "corrupt.json.gz", &corrupt);
    one_line_error(run("gz_skip", &[&set_train(&bad_gz)]), &["corrupt.json.gz", "no train text"]);
    // ... and an error naming the file with on_bad_line = "fail"
    one_line_error(
        run("gz_fail", &[&set_train(&bad_gz), "data.on_bad_line=\"fail\""]),
        &["corrupt.json.gz", "corrupt or truncated gzip stream"],
    );
    // a real shard cut in the middle
    let real = read(&root().join("data/c4-sample/en-validation.00000-of-00001.json.gz"));
    let cut = shard(d, "truncated.json.gz", &real[..real.len() / 3]);
    one_line_error(
        run("gz_cut", &[&format!("data.validation=[\"{cut}\"]"), "data.on_bad_line=\"fail\"", "data.val_tokens=100000000"]),
        &["truncated.json.gz", "corrupt or truncated gzip stream"],
    );

    // non-JSON lines
    let nonjson = shard(d, "nonjson.json", b"{\"text\": \"fine line\"}\nthis is not json\n");
    one_line_error(run("nonjson", &[&set_train(&nonjson), "data.on_bad_line=\"fail\""]), &["nonjson.json:2", "not JSON"]);
    one_line_error(
        run("nonjson_val", &[&format!("data.validation=[\"{nonjson}\"]"), "data.on_bad_line=\"fail\""]),
        &["nonjson.json:2", "not JSON"],
    );
    let notext = shard(d, "notext.json", b"{\"url\": \"x\"}\n");
    one_line_error(run("notext", &[&set_train(&notext), "data.on_bad_line=\"fail\""]), &["notext.json:1", "text"]);

    // empty shards
    let empty = shard(d, "empty.json", b"");
    one_line_error(run("empty", &[&set_train(&empty)]), &["empty.json", "no train text"]);
    let empty_gz = shard(d, "empty-val.json.gz", b"");
    one_line_error(run("empty_val", &[&format!("data.validation=[\"{empty_gz}\"]")]), &["empty-val.json.gz", "no validation text"]);

    // tokenizer
    let tok = d.join("missing-tokenizer.json").display().to_string();
    one_line_error(run("tok_missing", &[&format!("data.tokenizer=\"{tok}\"")]), &["missing-tokenizer.json", "not found"]);
    let bad_tok = shard(d, "bad-tokenizer.json", b"{\"not\": \"a tokenizer\"}");
    one_line_error(run("tok_bad", &[&format!("data.tokenizer=\"{bad_tok}\"")]), &["bad-tokenizer.json", "cannot load tokenizer.json"]);
    // a tokenizer file cut in the middle
    let t5 = read(&root().join("data/tokenizers/t5-tokenizer.json"));
    let cut_tok = shard(d, "cut-tokenizer.json", &t5[..t5.len() / 2]);
    one_line_error(
        run("tok_cut", &[&format!("data.tokenizer=\"{cut_tok}\"")]),
        &["cut-tokenizer.json", "cannot load tokenizer.json", "EOF"],
    );
    // a token shard cut in the middle: read document by document, it fails where the cut is
    let tokens = read(&root().join("data/c4-sample/en-validation.00000-of-00001.tokens.zst"));
    let cut_shard = shard(d, "cut.tokens.zst", &tokens[..tokens.len() / 2]);
    one_line_error(
        run("tokens_cut", &[&format!("data.validation=[\"{cut_shard}\"]"), "data.val_tokens=100000000"]),
        &["cut.tokens.zst: not a usable token shard: corrupt zstd stream"],
    );
    // a tokenizer whose vocabulary exceeds the model's
    one_line_error(run("vocab", &["model.vocab_size=1000"]), &["model.vocab_size = 1000", "32100", "t5-tokenizer.json"]);
}

/// The first `docs` documents of the bundled sample's `split` ("train", "validation") as a
/// parquet shard of FineWeb-Edu's kind (row groups of 2, so that a resume passes over some)
/// and as JSON lines, in `dir`; the
/// `--set` lines that point a run's `data.<split>` at each.
fn twin_shards(dir: &Path, split: &str, docs: usize) -> [String; 2] {
    let sample = root().join(format!("data/c4-sample/en-{split}.00000-of-00001.json.gz"));
    let texts: Vec<String> =
        lowbit_data::ShardReader::open(&sample, lowbit_data::BadInput::Fail).unwrap().take(docs).map(Result::unwrap).collect();
    let json = dir.join(format!("{split}.json"));
    std::fs::write(&json, texts.iter().map(|t| serde_json::json!({ "text": t }).to_string() + "\n").collect::<String>()).unwrap();
    let parquet = dir.join(format!("{split}.parquet"));
    parquet_file::write_fineweb_like(&parquet, &texts, 2, parquet::basic::Compression::SNAPPY);
    [json, parquet].map(|p| format!("data.{split}=[\"{}\"]", p.display()))
}

/// A run on parquet shards is the run on the same text as JSON shards, step for step; one
/// stopped and resumed mid-file, streaming through the shuffle buffer, replays exactly; and a
/// parquet file without a `text` column stops a run with a one-line error naming it.
#[test]
fn parquet_shards_train_like_their_json_and_resume_mid_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let [train_json, train_parquet] = twin_shards(d, "train", 300);
    let [val_json, val_parquet] = twin_shards(d, "validation", 40);
    let json = launch(config(d, "json", &[&train_json, &val_json]), None, None).unwrap();
    let parquet = launch(config(d, "parquet", &[&train_parquet, &val_parquet]), None, None).unwrap();
    let rows = metrics(&parquet.run_dir);
    assert!(rows.len() > 8 && rows == metrics(&json.run_dir), "the parquet run's metrics differ from the JSON run's");

    let sets = [train_parquet.as_str(), &val_parquet, "data.in_memory_max_tokens=0", "data.shuffle_buffer=64"];
    let (_runs, full) = check_exact_resume("parquet", &sets, 5, 3, "float32");
    let state: Value = serde_json::from_slice(&read(&checkpoint::latest(&full).unwrap().join("state.json"))).unwrap();
    let line = state["data"]["line"].as_u64().unwrap();
    assert!(line > 2 && line < 300, "the checkpoint stands inside the file, past its first row group: row {line}");

    let no_text = d.join("no-text.parquet");
    parquet_file::write_parquet(
        &no_text,
        &[("body", parquet_file::Values::strings(&["a document"]))],
        1,
        parquet::basic::Compression::SNAPPY,
    );
    one_line_error(
        launch(config(d, "no_text", &[&format!("data.train=[\"{}\"]", no_text.display())]), None, None),
        &["no-text.parquet: not a usable parquet shard: no column `text` (its columns: body)"],
    );
}

#[test]
fn resume_refuses_checkpoints_of_another_config() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let out = launch(config(d, "src", &["train.max_steps=2"]), None, None).unwrap();
    let ck = checkpoint::latest(&out.run_dir).unwrap();
    let config_before = read(&out.run_dir.join("config.toml"));

    // different model dims, into the same run folder: refused, and the run's files untouched
    let mut other = config(d, "src", &["model.hidden_size=64", "model.intermediate_size=128"]);
    other.run.name = "src".into();
    one_line_error(
        launch(other, Some(ck.clone()), None),
        &["state.json", "checkpoint of another model", "lm_head.weight has 1027200 elements in the checkpoint, 2054400 in the config"],
    );
    assert!(read(&out.run_dir.join("config.toml")) == config_before, "a refused resume rewrote config.toml");
    assert!(out.run_dir.join("summary.json").exists(), "a refused resume removed summary.json");
    one_line_error(
        launch(config(d, "layers", &["model.num_layers=2"]), Some(ck.clone()), None),
        &["state.json", "checkpoint of another model"],
    );
    // different state formats
    one_line_error(
        launch(config(d, "fmt", &["optim.states.v_format=\"bf16\""]), Some(ck.clone()), None),
        &["state.json", "m=fp4e2m1 v=fp8e4m3 block 32", "m=fp4e2m1 v=bf16", "optim.states"],
    );
    one_line_error(launch(config(d, "blk", &["optim.states.block_size=64"]), Some(ck.clone()), None), &["state.json", "block 64"]);
    // another data order: the rows would not continue
    one_line_error(
        launch(config(d, "order", &["data.shuffle=false"]), Some(ck.clone()), None),
        &[
            "cannot resume the training data",
            "rows permuted in memory (data.shuffle = true, data.seed = 7)",
            "file order (data.shuffle = false)",
        ],
    );

    // missing or damaged checkpoint files
    one_line_error(launch(config(d, "gone", &[]), Some(d.join("no-checkpoint")), None), &["no-checkpoint", "no such checkpoint folder"]);
    one_line_error(checkpoint::latest(&d.join("runs/none")), &["no checkpoint to resume from"]);
    let copy = d.join("damaged");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(&ck).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    let weights = read(&copy.join("model.safetensors"));
    std::fs::write(copy.join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    one_line_error(launch(config(d, "dmg", &[]), Some(copy.clone()), None), &["model.safetensors", "corrupt:"]);
    std::fs::write(copy.join("model.safetensors"), &weights).unwrap();
    std::fs::write(copy.join("state.json"), b"{ not json").unwrap();
    one_line_error(launch(config(d, "dmg", &[]), Some(copy), None), &["state.json", "corrupt:"]);
}
