//! Checkpoints: `runs/<name>/checkpoints/step_NNNNNNN/` holding one safetensors file per
//! [`Saves`] component (the model's weights, the optimizer's states, the data position's
//! pending tokens: `crate::components`), each naming its tensors and restoring itself from them
//! as torchtitan's `Stateful`; the small files the caller gives (`state.json`: the trainer's
//! state, `crate::train_state`; `config.json`, `config.toml`, `export_check.json`); and
//! `manifest.json` ([`crate::manifest`]): size and CRC-32 of every other file, checked on
//! resume. This module only writes, lists, prunes, verifies and reads the files; it knows no
//! component's tensors or fields.
//!
//! A checkpoint is written into `step_N.tmp/` and renamed when complete, so a kill never
//! leaves a half checkpoint; only the newest `keep` are kept.

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
/// names its tensors (torchtitan's `Stateful`, its saving half: a borrowed view of states
/// saves, the owner restores, [`Stateful`]).
pub trait Saves {
    /// Its file in the checkpoint folder (`model.safetensors`).
    fn file(&self) -> &'static str;
    /// Whether a checkpoint without the file is refused (else the component keeps its state:
    /// a file added to the format later).
    fn required(&self) -> bool {
        true
    }
    /// Its tensors by name (on the CPU).
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>>;
}

/// A part of the training state that a checkpoint holds ([`Saves`]) and that restores itself
/// from the tensors of its file.
pub trait Stateful: Saves {
    /// Restore from the tensors of its file.
    ///
    /// # Errors
    /// A missing tensor, or one of the wrong shape or kind (the caller adds the file's name).
    fn load_state_dict(&mut self, tensors: HashMap<String, Tensor>) -> Result<()>;
}

/// Save a checkpoint of `state.step` into `run_dir`: one safetensors file per component, the
/// small files `(name, bytes)` (`config.json`, `state.json`, ...), then the manifest; returns
/// its folder. Keeps the newest `keep` checkpoints.
pub fn save(run_dir: &Path, step: u64, keep: usize, components: &[&dyn Saves], files: &[(&str, Vec<u8>)]) -> Result<PathBuf> {
    let dir = step_dir(run_dir, step);
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    // a write that fails (a full disk) leaves no partial checkpoint behind, only the error
    if let Err(e) = write_into(&tmp, components, files) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir).with_context(|| format!("cannot finalise {}", dir.display()))?;
    prune(run_dir, keep)?;
    Ok(dir)
}

/// The checkpoint's files into the folder `tmp`: the small files, one safetensors file per
/// component, then the manifest.
fn write_into(tmp: &Path, components: &[&dyn Saves], files: &[(&str, Vec<u8>)]) -> Result<()> {
    for (name, bytes) in files {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))?;
    }
    // the safetensors writer creates its files readable by the owner only; give them the
    // permissions of a file created here (the umask's: the folder's without execute bits), so
    // others who can read the run can load it
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        let dir_mode = std::fs::metadata(tmp).with_context(|| format!("cannot read {}", tmp.display()))?.permissions().mode();
        std::fs::Permissions::from_mode(dir_mode & 0o666)
    };
    for c in components {
        let p = tmp.join(c.file());
        write_tensors(&c.state_dict().with_context(|| format!("{}: the tensors to write", p.display()))?, &p)?;
        std::fs::set_permissions(&p, mode.clone()).with_context(|| format!("cannot set the permissions of {}", p.display()))?;
    }
    crate::manifest::write(tmp)
}

/// Tensors as safetensors with `{"format": "pt"}` metadata (what `transformers` writes and
/// expects), in name order.
fn write_tensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    // (the I/O error itself, not safetensors' wrapper, whose message repeats it)
    safetensors::tensor::serialize_to_file(sorted.iter().map(|(k, t)| (k.as_str(), t)), Some(metadata), path)
        .map_err(|e| match e {
            safetensors::SafeTensorError::IoError(io) => anyhow::Error::from(io),
            other => anyhow::Error::from(other),
        })
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
    list(run_dir)?.pop().map(|(_, p)| p).with_context(|| {
        format!(
            "{}: no checkpoint to resume from (the run stopped before its first checkpoint; start it \
                 again with --overwrite)",
            run_dir.join("checkpoints").display()
        )
    })
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

    /// A checkpoint whose manifest.json is gone is refused (naming it and the
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
