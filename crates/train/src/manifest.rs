//! `manifest.json` of a checkpoint: the size and CRC-32 of every other file in the folder,
//! written last (before the folder is renamed into place) and verified before a resume loads
//! anything, so flipped bytes in `optimizer.safetensors` are refused instead of training on
//! garbage. A refused checkpoint's error names the file (a resume also offers the newest older
//! checkpoint that passes: `checkpoint::verify_for_resume`). A checkpoint without its
//! manifest (written before manifests existed, or the file lost) is refused unless the user
//! says to load it unverified (`train --resume RUN --trust-checkpoint`).

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

/// Check every file listed in `dir/manifest.json`; an error names the first bad file, or the
/// missing manifest (a checkpoint without one is not trusted unless the user says so).
pub fn verify(dir: &Path) -> Result<()> {
    let p = dir.join(MANIFEST);
    if !dir.is_dir() {
        return Ok(()); // reading the checkpoint reports it
    }
    if !p.exists() {
        bail!(
            "{}: no {MANIFEST}, so its files cannot be checked (a checkpoint written before checkpoints had \
             checksums, or its manifest was deleted)",
            dir.display()
        );
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
