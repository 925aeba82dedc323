//! Checkpoints: `runs/<name>/checkpoints/step_NNNNNNN/` holding
//! * `model.safetensors` + `config.json`: weights under HF LLaMA names (loads with
//!   `transformers.LlamaForCausalLM.from_pretrained`);
//! * `optimizer.safetensors`: each state's stored low-precision bytes (`<param>.m.codes`,
//!   U8) and block scales (`<param>.m.scales`, F32), never dequantized;
//! * `state.json`: step, tokens, data position, and the optimizer settings it was made with;
//! * `config.toml`: the resolved run config.
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
    /// m/v formats and block size of the stored states, to refuse a mismatched config.
    pub m_format: String,
    pub v_format: String,
    pub block_size: usize,
    /// Model parameter names and element counts, to refuse a checkpoint of another model.
    pub params: Vec<(String, usize)>,
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename to {}", path.display()))?;
    Ok(())
}

fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:07}"))
}

/// Save a checkpoint; returns its folder.
pub fn save(
    run_dir: &Path,
    model: &candle_nn::VarMap,
    hf_config: &serde_json::Value,
    opt: &LowbitAdamW,
    state: &TrainState,
    config_toml: &str,
    keep: usize,
) -> Result<PathBuf> {
    let dir = step_dir(run_dir, state.step);
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    model.save(tmp.join("model.safetensors")).context("saving model weights")?;
    std::fs::write(tmp.join("config.json"), serde_json::to_string_pretty(hf_config)?)?;
    candle_core::safetensors::save(&optimizer_tensors(opt)?, tmp.join("optimizer.safetensors"))
        .context("saving optimizer states")?;
    std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(state)?)?;
    std::fs::write(tmp.join("config.toml"), config_toml)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot finalise {}", dir.display()))?;
    prune(run_dir, keep)?;
    Ok(dir)
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
        .with_context(|| format!("{}: no checkpoint to resume from", run_dir.join("checkpoints").display()))
}

/// Read `state.json` of a checkpoint.
pub fn load_state(dir: &Path) -> Result<TrainState> {
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: corrupt checkpoint state", p.display()))
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
