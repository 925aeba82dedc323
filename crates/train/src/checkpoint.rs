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
//! leaves a half checkpoint; only the newest `keep` are kept. Each tensor file belongs to a
//! [`Stateful`] component (the model's weights, the optimizer, the data position's carry:
//! `crate::components`) that names its tensors and restores itself from them, as torchtitan's
//! `Stateful`; this module only writes and reads the files.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use lowbit_data::DataPosition;
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
    /// `optim.states.reset` the states were written with (`periodic` / `adaptive`; empty in
    /// checkpoints written before it was recorded: see [`TrainState::reset_rule`]).
    #[serde(default)]
    pub reset: String,
    /// The adaptive reset rule's state in checkpoints written before the optimizer saved it
    /// itself (`optimizer.safetensors`, `adaptive_reset.*`); read, never written.
    #[serde(default, skip_serializing)]
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
    /// Sequences per optimizer step of the run's last launch (`micro_batch x grad_accum`; in
    /// checkpoints written before the global batch stopped depending on the rank count, also
    /// `x ranks`), to warn when a resume changes it; 0 (unknown) in older checkpoints.
    #[serde(default)]
    pub global_batch: u64,
}

fn one_rank() -> u64 {
    1
}

impl TrainState {
    /// The reset rule of the states (`periodic` / `adaptive`), also for checkpoints written
    /// before it was recorded (adaptive when their `state.json` holds the rule's state).
    pub fn reset_rule(&self) -> &str {
        match (self.reset.as_str(), &self.adaptive_reset) {
            ("", Some(_)) => "adaptive",
            ("", None) => "periodic",
            (rule, _) => rule,
        }
    }

    /// `state.json`: everything but the data position's carry, which the data position saves
    /// in its own file (`crate::components`).
    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut small = self.clone();
        small.data.carry = Vec::new();
        Ok(serde_json::to_vec_pretty(&small)?)
    }
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

/// The folder of the checkpoint of `step` in a run folder.
pub fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step:07}"))
}

/// A part of the training state that a checkpoint holds in its own safetensors file: it
/// names its tensors and restores itself from them (torchtitan's `Stateful`).
pub trait Stateful {
    /// Its file in the checkpoint folder (`model.safetensors`).
    fn file(&self) -> &'static str;
    /// Whether a checkpoint without the file is refused (else the component keeps its state:
    /// a file added to the format later).
    fn required(&self) -> bool {
        true
    }
    /// Its tensors by name (on the CPU).
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restore from the tensors of its file.
    ///
    /// # Errors
    /// A missing tensor, or one of the wrong shape or kind (the caller adds the file's name).
    fn load_state_dict(&mut self, tensors: HashMap<String, Tensor>) -> Result<()>;
}

/// Save a checkpoint of `state.step` into `run_dir`: one safetensors file per component, the
/// small files `(name, bytes)` (`config.json`, `state.json`, ...), then the manifest; returns
/// its folder. Keeps the newest `keep` checkpoints.
pub fn save(run_dir: &Path, step: u64, keep: usize, components: &[&dyn Stateful], files: &[(&str, Vec<u8>)]) -> Result<PathBuf> {
    let dir = step_dir(run_dir, step);
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    for (name, bytes) in files {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))?;
    }
    // the safetensors writer creates its files readable by the owner only; give them the
    // permissions of a file created here (the umask's: the folder's without execute bits), so
    // others who can read the run can load it
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        let dir_mode = std::fs::metadata(&tmp).with_context(|| format!("cannot read {}", tmp.display()))?.permissions().mode();
        std::fs::Permissions::from_mode(dir_mode & 0o666)
    };
    for c in components {
        let p = tmp.join(c.file());
        write_tensors(&c.state_dict().with_context(|| format!("{}: the tensors to write", p.display()))?, &p)?;
        std::fs::set_permissions(&p, mode.clone()).with_context(|| format!("cannot set the permissions of {}", p.display()))?;
    }
    crate::manifest::write(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot finalise {}", dir.display()))?;
    prune(run_dir, keep)?;
    Ok(dir)
}

/// Tensors as safetensors with `{"format": "pt"}` metadata (what `transformers` writes and
/// expects), in name order.
fn write_tensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::tensor::serialize_to_file(sorted.iter().map(|(k, t)| (k.as_str(), t)), Some(metadata), path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Restore `components` from checkpoint `dir`; errors name the file and the tensor.
pub fn load(dir: &Path, components: &mut [&mut dyn Stateful]) -> Result<()> {
    for c in components.iter_mut() {
        let p = dir.join(c.file());
        if !p.exists() && !c.required() {
            continue;
        }
        let tensors = candle_core::safetensors::load(&p, &Device::Cpu).with_context(|| format!("{}: cannot read", p.display()))?;
        c.load_state_dict(tensors).with_context(|| p.display().to_string())?;
    }
    Ok(())
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

/// Read `state.json` of a checkpoint, with the data position's carry (`data.safetensors`).
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
    load(dir, &mut [&mut state.data])?;
    Ok(state)
}

/// [`crate::manifest::verify`] checkpoint `dir` of a run; when it fails, the error also offers
/// the newest older checkpoint of the run that passes and says how to resume from it. A
/// checkpoint without `manifest.json` fails too, unless `trust_unverified` (`train
/// --trust-checkpoint`): then it loads with a warning that its files are not verified.
pub fn verify_for_resume(dir: &Path, trust_unverified: bool) -> Result<()> {
    let no_manifest = dir.is_dir() && !dir.join(crate::manifest::MANIFEST).exists();
    if no_manifest && trust_unverified {
        tracing::warn!("{}: no manifest.json; resuming with its files unverified (--trust-checkpoint)", dir.display());
        return Ok(());
    }
    let Err(e) = crate::manifest::verify(dir) else { return Ok(()) };
    let e = match no_manifest {
        true => anyhow::anyhow!("{e:#}; pass --trust-checkpoint to resume from it unverified"),
        false => e,
    };
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
            reset: "periodic".into(),
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
        assert_eq!((st.step, st.updates, st.data.carry.clone(), st.ranks, st.global_batch), (9, 9, vec![5, 6], 1, 0));
        assert_eq!((st.m_scale.as_str(), st.v_scale.as_str(), st.reset_rule()), ("", "", "periodic"), "pow2 and periodic");
    }

    /// `run/checkpoints/step_0000003` and `step_0000006`, each with its manifest; returns the
    /// checkpoints folder and the newest.
    fn two_verified_checkpoints(run: &Path) -> (PathBuf, PathBuf) {
        let ck = run.join("checkpoints");
        for step in [3, 6] {
            let d = ck.join(format!("step_{step:07}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("optimizer.safetensors"), [1u8, 2, 3, 4]).unwrap();
            crate::manifest::write(&d).unwrap();
        }
        let newest = ck.join("step_0000006");
        (ck, newest)
    }

    #[test]
    fn a_flipped_byte_is_named_and_the_previous_good_checkpoint_offered() {
        let tmp = tempfile::tempdir().unwrap();
        let (ck, newest) = two_verified_checkpoints(tmp.path());
        verify_for_resume(&newest, false).unwrap();
        std::fs::write(newest.join("optimizer.safetensors"), [1u8, 2, 3, 5]).unwrap();
        let e = verify_for_resume(&newest, false).unwrap_err().to_string();
        let opt = newest.join("optimizer.safetensors");
        assert!(e.starts_with(&format!("{}: corrupt: 4 bytes with CRC-32", opt.display())), "{e}");
        assert!(e.contains(&format!("previous checkpoint {} (step 3) passes", ck.join("step_0000003").display())), "{e}");
        assert!(e.contains("continue from step 3"), "{e}");
    }

    /// Issue 33 (8b): a checkpoint whose manifest.json is gone is refused (naming it and the
    /// previous verified checkpoint) unless the user says it is unverified.
    #[test]
    fn a_checkpoint_without_its_manifest_is_refused_unless_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let (ck, newest) = two_verified_checkpoints(tmp.path());
        std::fs::remove_file(newest.join("manifest.json")).unwrap();
        let e = verify_for_resume(&newest, false).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: no manifest.json, so its files cannot be checked", newest.display())), "{e}");
        assert!(e.contains("pass --trust-checkpoint to resume from it unverified"), "{e}");
        assert!(e.contains(&format!("previous checkpoint {} (step 3) passes", ck.join("step_0000003").display())), "{e}");
        verify_for_resume(&newest, true).unwrap();
    }
}
