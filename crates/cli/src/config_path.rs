//! Where `--config NAME` points: a path to an existing file is taken as it is; a bare name
//! (no folder in it) that is not a file in the working directory is looked up under
//! `configs/` (and its sub-folders), with or without `.toml`, so the product card's
//! `train --config llama100m_fp8_sr_reset.toml` works from the repository root. When nothing
//! matches, the error lists the nearest config names, or, when no name is similar, the
//! configs at the top of the folder.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The folder bare config names are looked up in (relative to the working directory).
pub const CONFIG_DIR: &str = "configs";

/// Resolve `--config` against the working directory, then against `configs_dir`.
pub fn resolve(given: &Path, configs_dir: &Path) -> Result<PathBuf> {
    if given.is_file() {
        return Ok(given.to_path_buf());
    }
    if given.exists() && !given.is_dir() {
        bail!("--config {}: not a regular file (a device, a pipe or a process substitution): give a config file", given.display());
    }
    if given.is_dir() {
        let inside: Vec<String> = toml_files(given).iter().take(3).map(|p| p.display().to_string()).collect();
        let hint = if inside.is_empty() { String::new() } else { format!(" (it holds {})", inside.join(", ")) };
        bail!("--config {}: is a folder; give a config file{hint}", given.display());
    }
    let bare = given.components().count() == 1;
    let all = toml_files(configs_dir);
    if bare {
        let name = given.to_string_lossy();
        let stem = name.strip_suffix(".toml").unwrap_or(&name);
        let hits: Vec<&PathBuf> = all.iter().filter(|p| p.file_stem().is_some_and(|s| s.to_string_lossy() == stem)).collect();
        match hits.as_slice() {
            [one] => return Ok(one.to_path_buf()),
            [] => {}
            many => bail!(
                "--config {}: several configs have this name ({}); give the path",
                given.display(),
                many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    let wanted = given.file_stem().map_or(String::new(), |s| s.to_string_lossy().into_owned());
    let mut near: Vec<(f64, &PathBuf)> =
        all.iter().map(|p| (strsim::jaro_winkler(&wanted, &p.file_stem().unwrap_or_default().to_string_lossy()), p)).collect();
    near.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    let names: Vec<String> = near.iter().filter(|(score, _)| *score >= SIMILAR).take(3).map(|(_, p)| p.display().to_string()).collect();
    let looked = if bare { format!(" nor under {}/", configs_dir.display()) } else { String::new() };
    if !names.is_empty() {
        bail!("--config {}: no such file{looked}; nearest: {}", given.display(), names.join(", "))
    }
    // no similar name: the configs at the top of the folder (the starting points), not
    // arbitrary deep ones
    let top: Vec<String> = all.iter().filter(|p| p.parent() == Some(configs_dir)).map(|p| p.display().to_string()).collect();
    if top.is_empty() {
        bail!("--config {}: no such file{looked}", given.display());
    }
    bail!(
        "--config {}: no such file{looked}, and no config has a similar name; in {}/: {} ({} configs in all, with its sub-folders)",
        given.display(),
        configs_dir.display(),
        top.join(", "),
        all.len()
    )
}

/// Jaro-Winkler similarity of file stems from which a config counts as a near miss (a typo
/// or a shortened name: `llama100m_fp8_sr_rest` to `llama100m_fp8_sr_reset` 0.98, `tiny` to
/// `tiny_cpu` 0.9); unrelated names score around 0.4-0.6.
const SIMILAR: f64 = 0.75;

/// Every `.toml` file under `dir`, sorted (none when `dir` does not exist).
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_resolve_under_configs_and_misses_list_the_nearest() {
        let tmp = tempfile::tempdir().unwrap();
        let c = tmp.path().join("configs");
        std::fs::create_dir_all(c.join("paper")).unwrap();
        for f in ["tiny_cpu.toml", "llama100m_fp8_sr_reset.toml", "paper/llama100m_fp8_sr.toml"] {
            std::fs::write(c.join(f), "").unwrap();
        }
        let r = |s: &str| resolve(Path::new(s), &c);
        assert_eq!(r("llama100m_fp8_sr_reset.toml").unwrap(), c.join("llama100m_fp8_sr_reset.toml"));
        assert_eq!(r("tiny_cpu").unwrap(), c.join("tiny_cpu.toml"));
        assert_eq!(r("llama100m_fp8_sr").unwrap(), c.join("paper/llama100m_fp8_sr.toml"));
        let e = r("llama100m_fp8_sr_rest.toml").unwrap_err().to_string();
        assert!(e.starts_with("--config llama100m_fp8_sr_rest.toml: no such file nor under"), "{e}");
        assert!(e.contains(&format!("nearest: {}", c.join("llama100m_fp8_sr_reset.toml").display())), "{e}");
        // a folder is named as one, with the configs it holds
        let e = r(c.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("is a folder; give a config file (it holds ") && e.contains("tiny_cpu.toml"), "{e}");
        let e = r("elsewhere/tiny.toml").unwrap_err().to_string();
        assert!(e.starts_with("--config elsewhere/tiny.toml: no such file; nearest: "), "{e}");
        // no similar name: the top-level configs, not the nearest of unrelated ones
        let e = r("does_not_exist.toml").unwrap_err().to_string();
        let top = format!("{}, {}", c.join("llama100m_fp8_sr_reset.toml").display(), c.join("tiny_cpu.toml").display());
        assert!(e.contains(&format!("no config has a similar name; in {}/: {top} (3 configs in all", c.display())), "{e}");
        assert!(!e.contains("paper"), "{e}");
        // a path that exists but is no file (a device, a pipe): named as such, not "no such file"
        let e = r("/dev/null").unwrap_err().to_string();
        assert!(e.starts_with("--config /dev/null: not a regular file"), "{e}");
    }
}
