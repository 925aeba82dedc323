//! Checkpoints: `runs/<name>/checkpoints/step_NNNNNNN/` holding
//! * `model.safetensors` + `config.json`: weights under HF LLaMA names (loads with
//!   `transformers.LlamaForCausalLM.from_pretrained`);
//! * `optimizer.safetensors`: each state's stored low-precision bytes (`<param>.m.codes`,
//!   U8) and block scales (`<param>.m.scales`, F32), never dequantized;
//! * `state.json`: step, tokens, data position, the optimizer settings and random-bit scheme
//!   it was made with;
//! * `data.safetensors`: the data position's pending tokens (`carry`, U32), kept out of
//!   `state.json` (a JSON list of them is tens of MB after one long document);
//! * `manifest.json` ([`crate::manifest`]): size and CRC-32 of every other file, checked on resume;
//! * `config.toml`: the resolved run config;
//! * `export_check.json` ([`ExportCheck`]): the first validation micro-batch and this
//!   model's loss on it, so `scripts/check_hf_export.py DIR DIR/export_check.json` can check
//!   that `transformers` computes the same loss from the exported weights.
//!
//! A checkpoint is written into `step_N.tmp/` and renamed when complete, so a kill never
//! leaves a half checkpoint; only the newest `keep` are kept. Each component saves its own
//! state; this module only arranges the files.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use lowbit_data::DataPosition;
use lowbit_optim::LowbitAdamW;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Everything besides tensors that a resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Last completed optimizer step.
    pub step: u64,
    /// Training tokens consumed through `step`.
    pub tokens: u64,
    /// Data stream position after the last batch of `step`.
    pub data: DataPosition,
    /// Consecutive non-finite steps at `step`.
    pub nonfinite_in_row: u64,
    /// Optimizer updates applied through `step` (`step` minus the skipped steps): the
    /// optimizer's own step count, which drives its resets and bias correction (see
    /// [`crate::step::train_step`]). Read as `step` from checkpoints written before it was recorded.
    #[serde(default)]
    pub updates: u64,
    /// m/v formats and block size of the stored states, to refuse a mismatched config.
    pub m_format: String,
    pub v_format: String,
    pub block_size: usize,
    /// `optim.states.v_zero` the states were written with (`exclude` / `keep`; empty in
    /// checkpoints written before it was recorded, which behaved as `keep`).
    #[serde(default)]
    pub v_zero: String,
    /// Scale kinds of fp8/fp4 m and v states (`amax` / `pow2`; empty for other formats, and in
    /// checkpoints written before scale kinds existed, whose fp8/fp4 states are `pow2`).
    #[serde(default)]
    pub m_scale: String,
    #[serde(default)]
    pub v_scale: String,
    /// The adaptive reset rule's state (`optim.states.reset = "adaptive"`), else absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_reset: Option<lowbit_optim::reset::AdaptiveReset>,
    /// Model parameter names and element counts, to refuse a checkpoint of another model.
    pub params: Vec<(String, usize)>,
    /// Random-bit scheme of the run (`lowbit_optim::rng::SCHEME`; empty in checkpoints
    /// written before it was recorded).
    #[serde(default)]
    pub rng: String,
    /// Data-parallel ranks of the run's last launch; 1 in checkpoints written before it was
    /// recorded.
    #[serde(default = "one_rank")]
    pub ranks: u64,
    /// Sequences per optimizer step of the run's last launch (`micro_batch x grad_accum x
    /// ranks`), to warn when a resume changes it; 0 (unknown) in older checkpoints.
    #[serde(default)]
    pub global_batch: u64,
}

fn one_rank() -> u64 {
    1
}

/// File name of the [`ExportCheck`] in a checkpoint folder.
pub const EXPORT_CHECK: &str = "export_check.json";

/// One token micro-batch and the loss this model gives on it (`export_check.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportCheck {
    /// `[rows][seq_len]` input token ids.
    pub input_ids: Vec<Vec<u32>>,
    /// `[rows][seq_len]` next-token targets.
    pub targets: Vec<Vec<u32>>,
    /// `[rows][seq_len]` 1.0 where the target counts in the loss.
    pub mask: Vec<Vec<f32>>,
    /// Mean masked cross-entropy (nats/token) of the saved weights on this batch.
    pub loss: f64,
    /// Weight dtype of the model that computed `loss` ("float32" or "bfloat16").
    pub dtype: String,
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename to {}", path.display()))?;
    Ok(())
}

/// File of the data position's pending tokens in a checkpoint folder, and its tensor name.
const DATA_FILE: &str = "data.safetensors";
const CARRY: &str = "carry";

/// The folder of the checkpoint of `step` in a run folder.
pub fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:07}"))
}

/// Save a checkpoint, with extra files `(name, bytes)` written into the folder before it is
/// renamed; returns its folder.
#[allow(clippy::too_many_arguments)]
pub fn save(
    run_dir: &Path,
    model: &candle_nn::VarMap,
    hf_config: &serde_json::Value,
    opt: &LowbitAdamW,
    state: &TrainState,
    config_toml: &str,
    keep: usize,
    extra: &[(&str, Vec<u8>)],
) -> Result<PathBuf> {
    let dir = step_dir(run_dir, state.step);
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))
    };
    save_weights(model, &tmp.join("model.safetensors"))?;
    write("config.json", serde_json::to_string_pretty(hf_config)?.as_bytes())?;
    candle_core::safetensors::save(&optimizer_tensors(opt)?, tmp.join("optimizer.safetensors"))
        .with_context(|| format!("cannot write {}", tmp.join("optimizer.safetensors").display()))?;
    let mut small = state.clone();
    let carry = std::mem::take(&mut small.data.carry);
    write("state.json", serde_json::to_string_pretty(&small)?.as_bytes())?;
    let n = carry.len();
    candle_core::safetensors::save(&HashMap::from([(CARRY.to_string(), Tensor::from_vec(carry, n, &Device::Cpu)?)]), tmp.join(DATA_FILE))
        .with_context(|| format!("cannot write {}", tmp.join(DATA_FILE).display()))?;
    write("config.toml", config_toml.as_bytes())?;
    // the safetensors writer creates its files readable by the owner only; give them the
    // permissions of the other files (the umask's), so others who can read the run can load it
    let mode = std::fs::metadata(tmp.join("config.toml"))?.permissions();
    for name in ["model.safetensors", "optimizer.safetensors", DATA_FILE] {
        std::fs::set_permissions(tmp.join(name), mode.clone()).with_context(|| format!("cannot set the permissions of {name}"))?;
    }
    for (name, bytes) in extra {
        write(name, bytes)?;
    }
    crate::manifest::write(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot finalise {}", dir.display()))?;
    prune(run_dir, keep)?;
    Ok(dir)
}

/// The model's variables as safetensors with `{"format": "pt"}` metadata (what
/// `transformers` writes and expects), tensors in name order.
fn save_weights(model: &candle_nn::VarMap, path: &Path) -> Result<()> {
    let data = model.data().lock().unwrap();
    let mut tensors: Vec<(String, Tensor)> =
        data.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect();
    drop(data);
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::tensor::serialize_to_file(tensors.iter().map(|(k, t)| (k.as_str(), t)), Some(metadata), path)
        .with_context(|| format!("cannot write model weights {}", path.display()))
}

fn optimizer_tensors(opt: &LowbitAdamW) -> Result<HashMap<String, Tensor>> {
    let mut map = HashMap::new();
    for t in &opt.tensors {
        for (kind, s) in [("m", &t.m), ("v", &t.v)] {
            let codes = s.code_bytes();
            let n = codes.len();
            map.insert(format!("{}.{kind}.codes", t.info.name), Tensor::from_vec(codes, n, &Device::Cpu)?);
            if !s.scales.is_empty() {
                let n = s.scales.len();
                map.insert(
                    format!("{}.{kind}.scales", t.info.name),
                    Tensor::from_vec(s.scales.clone(), n, &Device::Cpu)?,
                );
            }
        }
    }
    Ok(map)
}

/// Checkpoint folders of a run, oldest first.
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = run_dir.join("checkpoints");
    if !dir.exists() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(s) = name.strip_prefix("step_").and_then(|s| s.parse::<u64>().ok()) {
            out.push((s, p));
        }
    }
    out.sort();
    Ok(out)
}

fn prune(run_dir: &Path, keep: usize) -> Result<()> {
    let all = list(run_dir)?;
    for (_, p) in all.iter().take(all.len().saturating_sub(keep.max(1))) {
        std::fs::remove_dir_all(p)?;
    }
    Ok(())
}

/// The newest complete checkpoint of a run.
pub fn latest(run_dir: &Path) -> Result<PathBuf> {
    list(run_dir)?
        .pop()
        .map(|(_, p)| p)
        .with_context(|| {
            format!(
                "{}: no checkpoint to resume from (the run stopped before its first checkpoint; start it \
                 again with --overwrite)",
                run_dir.join("checkpoints").display()
            )
        })
}

/// Read `state.json` of a checkpoint.
pub fn load_state(dir: &Path) -> Result<TrainState> {
    if !dir.is_dir() {
        bail!("{}: no such checkpoint folder", dir.display());
    }
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p)
        .with_context(|| format!("{}: cannot read the checkpoint state (not a checkpoint folder?)", p.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: corrupt checkpoint state: {e}", p.display()))?;
    if let Some(step) = v.get("step").cloned() {
        if let Some(o) = v.as_object_mut() {
            o.entry("updates").or_insert(step);
        }
    }
    let mut state: TrainState =
        serde_json::from_value(v).map_err(|e| anyhow::anyhow!("{}: corrupt checkpoint state: {e}", p.display()))?;
    let dp = dir.join(DATA_FILE);
    if dp.exists() {
        let t = candle_core::safetensors::load(&dp, &Device::Cpu).with_context(|| format!("{}: cannot read", dp.display()))?;
        let carry = t.get(CARRY).with_context(|| format!("{}: missing tensor {CARRY}", dp.display()))?;
        state.data.carry = carry.to_vec1::<u32>().with_context(|| format!("{}: {CARRY}", dp.display()))?;
    }
    Ok(state)
}

/// Load weights into `model` (every variable must be present with its shape) and the
/// optimizer's stored bytes into `opt`; errors name the file and the tensor.
pub fn load_tensors(dir: &Path, model: &mut candle_nn::VarMap, opt: &mut LowbitAdamW) -> Result<()> {
    let mp = dir.join("model.safetensors");
    let weights = candle_core::safetensors::load(&mp, &Device::Cpu)
        .with_context(|| format!("{}: cannot read weights", mp.display()))?;
    {
        let data = model.data().lock().unwrap();
        for (name, var) in data.iter() {
            let t = weights
                .get(name)
                .with_context(|| format!("{}: missing tensor {name} (checkpoint of another model?)", mp.display()))?;
            if t.dims() != var.dims() {
                bail!("{}: tensor {name} has shape {:?}, the model wants {:?}", mp.display(), t.dims(), var.dims());
            }
            if t.dtype() != var.dtype() {
                tracing::warn!(
                    "{}: {name} is {:?}, the model is {:?}: converted (the resume is not bit-exact)",
                    mp.display(),
                    t.dtype(),
                    var.dtype()
                );
            }
            var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
    }
    let op = dir.join("optimizer.safetensors");
    let states = candle_core::safetensors::load(&op, &Device::Cpu)
        .with_context(|| format!("{}: cannot read optimizer states", op.display()))?;
    for t in &mut opt.tensors {
        for (kind, s) in [("m", &mut t.m), ("v", &mut t.v)] {
            let key = format!("{}.{kind}.codes", t.info.name);
            let codes = states.get(&key).with_context(|| format!("{}: missing {key}", op.display()))?;
            s.set_code_bytes(&codes.to_vec1::<u8>()?).map_err(|e| anyhow::anyhow!("{}: {key}: {e}", op.display()))?;
            if !s.scales.is_empty() {
                let key = format!("{}.{kind}.scales", t.info.name);
                let sc = states.get(&key).with_context(|| format!("{}: missing {key}", op.display()))?.to_vec1::<f32>()?;
                if sc.len() != s.scales.len() {
                    bail!("{}: {key} has {} scales, expected {}", op.display(), sc.len(), s.scales.len());
                }
                s.scales = sc;
            }
        }
    }
    Ok(())
}

/// [`crate::manifest::verify`] checkpoint `dir` of a run; when it fails, the error also offers
/// the newest older checkpoint of the run that passes and says how to resume from it.
pub fn verify_for_resume(dir: &Path) -> Result<()> {
    let Err(e) = crate::manifest::verify(dir) else { return Ok(()) };
    let Some(run_dir) = dir.parent().filter(|p| p.ends_with("checkpoints")).and_then(Path::parent) else {
        return Err(e); // not in a run's checkpoints/ folder: no siblings to offer
    };
    let older = list(run_dir)?;
    let good = older.iter().rev().filter(|(_, p)| p.as_path() != dir).find(|(_, p)| crate::manifest::verify(p).is_ok());
    match good {
        Some((step, p)) => bail!(
            "{e:#}. The previous checkpoint {} (step {step}) passes its checks: move the corrupt one aside \
             (mv {} {}.corrupt) and resume again to continue from step {step}",
            p.display(),
            dir.display(),
            dir.display()
        ),
        None => bail!("{e:#}. No older checkpoint of {} passes its checks", run_dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_without_rng_scheme_still_loads() {
        // state.json written before the random-bit scheme was recorded: `rng` reads as ""
        // (the trainer then warns that SR draws differ) instead of refusing the checkpoint.
        let mut v = serde_json::to_value(TrainState {
            step: 7,
            tokens: 70,
            data: DataPosition::default(),
            nonfinite_in_row: 0,
            updates: 7,
            m_format: "fp8e4m3".into(),
            v_format: "fp8e4m3".into(),
            block_size: 128,
            v_zero: "exclude".into(),
            m_scale: "amax".into(),
            v_scale: "amax".into(),
            adaptive_reset: None,
            params: vec![("w".into(), 3)],
            rng: lowbit_optim::rng::SCHEME.into(),
            ranks: 2,
            global_batch: 16,
        })
        .unwrap();
        v.as_object_mut().unwrap().remove("rng");
        let old: TrainState = serde_json::from_value(v).unwrap();
        assert_eq!((old.step, old.rng.as_str()), (7, ""));
    }

    #[test]
    fn state_without_updates_reads_them_as_the_step() {
        let tmp = tempfile::tempdir().unwrap();
        let text = r#"{"step": 9, "tokens": 90, "data": {"epoch": 0, "shard": 0, "line": 4, "carry": [5, 6]},
            "nonfinite_in_row": 0, "m_format": "fp8e4m3", "v_format": "fp8e4m3", "block_size": 128,
            "params": [["w", 3]], "rng": "x"}"#;
        std::fs::write(tmp.path().join("state.json"), text).unwrap();
        let st = load_state(tmp.path()).unwrap();
        assert_eq!((st.step, st.updates, st.data.carry, st.ranks, st.global_batch), (9, 9, vec![5, 6], 1, 0));
        assert_eq!((st.m_scale.as_str(), st.v_scale.as_str(), st.adaptive_reset), ("", "", None), "pow2 and periodic");
    }

    #[test]
    fn a_flipped_byte_is_named_and_the_previous_good_checkpoint_offered() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("checkpoints");
        for step in [3, 6] {
            let d = ck.join(format!("step_{step:07}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("optimizer.safetensors"), [1u8, 2, 3, 4]).unwrap();
            crate::manifest::write(&d).unwrap();
        }
        let newest = ck.join("step_0000006");
        verify_for_resume(&newest).unwrap();
        std::fs::write(newest.join("optimizer.safetensors"), [1u8, 2, 3, 5]).unwrap();
        let e = verify_for_resume(&newest).unwrap_err().to_string();
        let opt = newest.join("optimizer.safetensors");
        assert!(e.starts_with(&format!("{}: corrupt: 4 bytes with CRC-32", opt.display())), "{e}");
        assert!(e.contains(&format!("previous checkpoint {} (step 3) passes", ck.join("step_0000003").display())), "{e}");
        assert!(e.contains("continue from step 3"), "{e}");
    }
}
