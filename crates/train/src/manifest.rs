//! `manifest.json` of a checkpoint: the size and CRC-32 of every other file in the folder,
//! written last (before the folder is renamed into place) and verified before a resume loads
//! anything, so flipped bytes in `optimizer.safetensors` are refused instead of training on
//! garbage. A refused checkpoint's error names the file and offers the newest older
//! checkpoint that passes. Checkpoints written before manifests existed load with a warning.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// File name of the manifest in a checkpoint folder.
pub const MANIFEST: &str = "manifest.json";

/// Size and checksum of one file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    /// CRC-32 (IEEE) of the contents, 8 hex digits.
    pub crc32: String,
}

/// Size and CRC-32 of the file at `path`, read in 1 MiB pieces.
fn sum(path: &Path) -> Result<FileSum> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (mut h, mut bytes, mut buf) = (crc32fast::Hasher::new(), 0u64, vec![0u8; 1 << 20]);
    loop {
        let n = f.read(&mut buf).with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileSum { bytes, crc32: format!("{:08x}", h.finalize()) })
}

/// Write `dir/manifest.json` covering every other file in `dir`.
pub fn write(dir: &Path) -> Result<()> {
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = e?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if p.is_file() && name != MANIFEST {
            files.insert(name, sum(&p)?);
        }
    }
    let p = dir.join(MANIFEST);
    std::fs::write(&p, serde_json::to_string_pretty(&files)?).with_context(|| format!("cannot write {}", p.display()))
}

/// Check every file listed in `dir/manifest.json`; an error names the first bad file.
pub fn verify(dir: &Path) -> Result<()> {
    let p = dir.join(MANIFEST);
    if !dir.is_dir() {
        return Ok(()); // reading the checkpoint reports it
    }
    if !p.exists() {
        tracing::warn!("{}: no {MANIFEST} (written before checkpoints had checksums): files not verified", dir.display());
        return Ok(());
    }
    let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    let files: BTreeMap<String, FileSum> =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: corrupt manifest: {e}", p.display()))?;
    for (name, want) in &files {
        let f = dir.join(name);
        if !f.is_file() {
            bail!("{}: missing (listed in {MANIFEST})", f.display());
        }
        let got = sum(&f)?;
        if got != *want {
            bail!(
                "{}: corrupt: {} bytes with CRC-32 {}, the manifest says {} bytes with CRC-32 {}",
                f.display(),
                got.bytes,
                got.crc32,
                want.bytes,
                want.crc32
            );
        }
    }
    Ok(())
}

/// [`verify`] checkpoint `dir` of a run; when it fails, the error also offers the newest older
/// checkpoint of the run that passes and says how to resume from it.
pub fn verify_for_resume(dir: &Path) -> Result<()> {
    let Err(e) = verify(dir) else { return Ok(()) };
    let Some(run_dir) = dir.parent().filter(|p| p.ends_with("checkpoints")).and_then(Path::parent) else {
        return Err(e); // not in a run's checkpoints/ folder: no siblings to offer
    };
    let older = crate::checkpoint::list(run_dir)?;
    let good = older.iter().rev().filter(|(_, p)| p.as_path() != dir).find(|(_, p)| verify(p).is_ok());
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
    fn a_flipped_byte_is_named_and_the_previous_good_checkpoint_offered() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("checkpoints");
        for step in [3, 6] {
            let d = ck.join(format!("step_{step:07}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("optimizer.safetensors"), [1u8, 2, 3, 4]).unwrap();
            write(&d).unwrap();
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
