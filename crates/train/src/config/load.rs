//! The layered-TOML engine under [`super::RunConfig::load`]: a file and the files it
//! `extends` merged in order, `--set section.key=value` overrides on top, and errors that name
//! the file, line and column (or the `--set` that caused them).

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Read a TOML file into a table, merging it over its `extends` base. `files` collects
/// every file read with its text, the top file first.
pub(super) fn load_value(path: &Path, depth: usize, files: &mut Vec<(PathBuf, String)>) -> Result<toml::Value> {
    if depth > 8 {
        bail!("{}: `extends` chain deeper than 8 files (a cycle?)", path.display());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
    let value: toml::Value = toml::from_str(&text).map_err(|e| located(path, &text, &e))?;
    files.push((path.to_path_buf(), text));
    let Some(base) = value.get("extends") else {
        return Ok(value);
    };
    let Some(base) = base.as_str() else {
        let (p, text) = files.last().expect("pushed");
        let at = find_key_in(text, "extends").map_or(String::new(), |l| format!(":{l}"));
        bail!("{}{at}: `extends` must be a string (path of the base config)", p.display());
    };
    let base_path = path.parent().unwrap_or(Path::new(".")).join(base);
    if !base_path.is_file() {
        let at = find_key_in(&files.last().expect("pushed").1, "extends").map_or(String::new(), |l| format!(":{l}"));
        let what = if base_path.is_dir() {
            "is a folder, not a config file"
        } else if base_path.exists() {
            "is not a regular file (a device or a pipe)"
        } else {
            "does not exist"
        };
        bail!("{}{at}: extends {base:?}, but {} {what}", path.display(), base_path.display());
    }
    let mut merged = load_value(&base_path, depth + 1, files)?;
    merge(&mut merged, value);
    if let Some(t) = merged.as_table_mut() {
        t.remove("extends");
    }
    Ok(merged)
}

/// A TOML error in `text` (the contents of `path`) as one line:
/// `path:line:col: message (in [section] `line text`)`.
pub(super) fn located(path: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let msg = one_line(e.message());
    let Some(span) = e.span() else {
        return anyhow::anyhow!("{}: {msg}", path.display());
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..start].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("").trim();
    let section = text[..line_start].lines().rev().map(str::trim).find(|l| l.starts_with('[')).map(|h| format!("{h} ")).unwrap_or_default();
    if line.is_empty() {
        anyhow::anyhow!("{}:{line_no}:{col}: {msg}", path.display())
    } else {
        anyhow::anyhow!("{}:{line_no}:{col}: {msg} (in {section}`{line}`)", path.display())
    }
}

fn one_line(s: &str) -> String {
    s.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// Locate an error of the merged config (files of an `extends` chain plus `--set`
/// overrides): the override that set the offending key, or the file and line holding it.
pub(super) fn locate_merged<T: DeserializeOwned>(files: &[(PathBuf, String)], overrides: &[String], e: &toml::de::Error) -> anyhow::Error {
    let msg = one_line(e.message());
    // The key path: toml's Display ends with "in `a.b`" for errors without a position,
    // and an unknown field is named in the message.
    let shown = e.to_string();
    let mut key =
        shown.lines().rev().find_map(|l| l.trim().strip_prefix("in `").and_then(|k| k.strip_suffix('`'))).unwrap_or("").to_string();
    if let Some(field) = msg.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
        if !key.ends_with(field) {
            key = if key.is_empty() { field.to_string() } else { format!("{key}.{field}") };
        }
    }
    if !key.is_empty() {
        for o in overrides.iter().rev() {
            let k = o.split_once('=').map_or(o.as_str(), |(k, _)| k).trim();
            if k == key || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}.")) {
                let hint = if msg.contains("expected a sequence") {
                    format!("; --set values are TOML, a list is written --set '{key}=[\"...\", \"...\"]'")
                } else {
                    String::new()
                };
                return anyhow::anyhow!("--set {o}: {msg} (key `{key}`){hint}");
            }
        }
    }
    // A file whose own text gives the same error (ignoring sections only its base has).
    for (p, text) in files {
        if let Err(fe) = toml::from_str::<T>(text) {
            if fe.message() == e.message() && fe.span().is_some() {
                return located(p, text, &fe);
            }
        }
    }
    if let Some(loc) = (!key.is_empty()).then(|| find_key_line(files, overrides, &key)).flatten() {
        return anyhow::anyhow!("{loc}: {msg} (key `{key}`)");
    }
    let top = files.first().map_or(String::new(), |f| f.0.display().to_string());
    if key.is_empty() {
        anyhow::anyhow!("{top} (with its `extends` bases and --set overrides): {msg}")
    } else {
        anyhow::anyhow!("{top} (with its `extends` bases and --set overrides): {msg} (key `{key}`)")
    }
}

/// An error about a key that takes one of a list of names (an enum, such as
/// `optim.states.scale`) given a number or a boolean reads, from toml, "wanted string or
/// table" or "invalid type: unit variant, expected string only", which names no choice. Such
/// an error gets the key's choices appended: the config `value` is read again with a name
/// that is none of them there, and serde's "unknown variant ..., expected one of ..." gives
/// them. Other errors pass unchanged.
pub(super) fn with_choices<T: DeserializeOwned>(e: anyhow::Error, value: &toml::Value) -> anyhow::Error {
    let msg = e.to_string();
    if !(msg.contains("wanted string or table") || msg.contains("expected string only")) {
        return e;
    }
    let Err(keyed) = T::deserialize(value.clone()) else { return e };
    let shown = keyed.to_string();
    let Some(key) = shown.lines().rev().find_map(|l| l.trim().strip_prefix("in `").and_then(|k| k.strip_suffix('`'))) else {
        return e;
    };
    let mut probe = value.clone();
    if apply_override(&mut probe, &format!("{key}=\"\u{1}\"")).is_err() {
        return e;
    }
    // serde: "unknown variant `x`, expected `a` or `b`" / "expected one of `a`, `b`, `c`"
    match T::deserialize(probe) {
        Err(p) if p.message().starts_with("unknown variant") => match p.message().split_once(", expected ") {
            Some((_, choices)) => {
                // "<origin>: invalid type: ... (key `k`)" -> "<origin>: `k` takes one of ..., not <given>"
                let given = key.split('.').try_fold(value, |v, k| v.get(k)).map_or_else(String::new, |v| format!(", not {v}"));
                match msg.split_once(": invalid type") {
                    Some((origin, _)) => anyhow::anyhow!("{origin}: `{key}` takes {}{given}", choices.trim()),
                    None => anyhow::anyhow!("{msg}; `{key}` takes {}", choices.trim()),
                }
            }
            None => e,
        },
        _ => e,
    }
}

/// `section.key` at the start of a validation message such as "optim.lr: must be ...".
pub(super) fn key_of_message(msg: &str) -> Option<String> {
    let first = msg.split([':', ' ', ',']).next()?;
    (first.contains('.') && first.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')).then(|| first.to_string())
}

/// Where a dotted key was set last: `--set KEY=..` or `file:line` (top file first).
pub(super) fn find_key_line(files: &[(PathBuf, String)], overrides: &[String], key: &str) -> Option<String> {
    for o in overrides.iter().rev() {
        if o.split_once('=').is_some_and(|(k, _)| k.trim() == key) {
            return Some(format!("(--set {o})"));
        }
    }
    files.iter().find_map(|(p, text)| find_key_in(text, key).map(|l| format!("{}:{l}", p.display())))
}

/// 1-based line of a dotted key in a TOML text (simple scan of `[table]` headers and
/// `key = value` lines; enough for run configs).
fn find_key_in(text: &str, key: &str) -> Option<usize> {
    let unquote = |s: &str| s.split('.').map(|p| p.trim().trim_matches('"').trim_matches('\'').to_string()).collect::<Vec<_>>().join(".");
    let mut table = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if let Some(h) = line.strip_prefix('[') {
            let h = h.trim_start_matches('[');
            let h = h.split(']').next().unwrap_or("");
            table = unquote(h);
            if table == key {
                return Some(i + 1);
            }
            continue;
        }
        let Some((k, _)) = line.split_once('=') else { continue };
        let k = unquote(k);
        let full = if table.is_empty() { k } else { format!("{table}.{k}") };
        if full == key {
            return Some(i + 1);
        }
    }
    None
}

/// Recursively overlay `top` onto `base` (tables merge, other values replace).
fn merge(base: &mut toml::Value, top: toml::Value) {
    match (base, top) {
        (toml::Value::Table(b), toml::Value::Table(t)) => {
            for (k, v) in t {
                match b.get_mut(&k) {
                    Some(bv) if bv.is_table() && v.is_table() => merge(bv, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, t) => *b = t,
    }
}

/// Whether `raw` is written as a number (sign, digits with `_`, a fraction, an exponent): one
/// TOML cannot hold is refused rather than taken as a string.
fn looks_numeric(raw: &str) -> bool {
    let body = raw.strip_prefix(['+', '-']).unwrap_or(raw);
    let (mantissa, exp) = match body.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (body, None),
    };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '_');
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => digits(a) && digits(b),
        None => digits(mantissa),
    };
    mantissa_ok && exp.is_none_or(digits)
}

/// Apply `section.key=value` (value parsed as TOML, else taken as a string; a number TOML
/// cannot hold is refused).
pub fn apply_override(root: &mut toml::Value, spec: &str) -> Result<()> {
    let (key, raw) = spec.split_once('=').with_context(|| format!("--set {spec:?}: expected section.key=value"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("--set {spec:?}: empty key component");
    }
    let parsed = toml::from_str::<toml::Table>(&format!("x = {}", raw.trim())).ok().and_then(|mut t| t.remove("x"));
    if parsed.is_none() && looks_numeric(raw.trim()) {
        bail!(
            "--set {key}={}: a number outside TOML's range (integers -9223372036854775808 ..= 9223372036854775807, \
             floats up to ~1.8e308)",
            raw.trim()
        );
    }
    let value = parsed.unwrap_or_else(|| toml::Value::String(raw.trim().to_string()));
    let mut node = root;
    for p in &parts[..parts.len() - 1] {
        let t = node.as_table_mut().with_context(|| format!("--set {key}: {p} is not a section"))?;
        node = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(Default::default()));
    }
    node.as_table_mut().with_context(|| format!("--set {key}: parent is not a section"))?.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--set` with a number TOML cannot hold (past i64, past f64) is refused naming it and
    /// the range, where it was taken as a string and refused as "invalid type: string"; numbers
    /// in range and words stay as they were.
    #[test]
    fn numbers_outside_tomls_range_are_refused() {
        let mut root = toml::Value::Table(Default::default());
        for big in ["18446744073709551615", "1e309", "-9223372036854775809", "1_000_000_000_000_000_000_000"] {
            let e = apply_override(&mut root, &format!("train.grad_accum={big}")).unwrap_err().to_string();
            assert!(e.contains(&format!("--set train.grad_accum={big}: a number outside TOML's range")), "{e}");
        }
        apply_override(&mut root, "train.grad_accum=9223372036854775807").unwrap();
        assert_eq!(root["train"]["grad_accum"].as_integer(), Some(i64::MAX));
        apply_override(&mut root, "optim.lr=6e-3").unwrap();
        assert_eq!(root["optim"]["lr"].as_float(), Some(6e-3));
        apply_override(&mut root, "run.name=e309").unwrap();
        assert_eq!(root["run"]["name"].as_str(), Some("e309"), "a word is a string");
        assert!(looks_numeric("1.5e-3") && looks_numeric("-12") && !looks_numeric("1.") && !looks_numeric("fp8") && !looks_numeric(""));
    }

    /// A name-valued key given a number says which names it takes and what it got, without
    /// serde's "invalid type: unit variant, expected string only" first.
    #[test]
    fn a_wrong_type_for_a_named_choice_lists_the_choices() {
        let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tiny_cpu.toml");
        let e = format!("{:#}", crate::config::RunConfig::load(&tiny, &["optim.states.scale=2".into()]).unwrap_err());
        assert!(e.contains("`optim.states.scale` takes one of `default`, `amax`, `pow2`, not 2"), "{e}");
        assert!(!e.contains("invalid type"), "{e}");
    }

    /// `extends` naming a folder or a device says so, where it said "does not exist".
    #[test]
    fn extends_a_folder_or_a_device_says_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        for (base, what) in
            [(".", "is a folder, not a config file"), ("/dev/null", "is not a regular file"), ("gone.toml", "does not exist")]
        {
            let c = dir.path().join("c.toml");
            std::fs::write(&c, format!("extends = {base:?}\n[model]\npreset = \"tiny\"\n[data]\n")).unwrap();
            let e = format!("{:#}", crate::config::RunConfig::load(&c, &[]).unwrap_err());
            assert!(e.contains(what), "{base}: {e}");
        }
    }

    /// A run name with a newline, a tab or only blanks is refused naming the key.
    #[test]
    fn run_names_with_control_characters_or_blanks_are_refused() {
        let tiny = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tiny_cpu.toml");
        for bad in ["\"a\\nb\"", "\" \"", "\"x\\t\"", "\" lead\""] {
            let e = format!("{:#}", crate::config::RunConfig::load(&tiny, &[format!("run.name={bad}")]).unwrap_err());
            assert!(e.contains("run.name: must be a folder name without control characters"), "{bad}: {e}");
        }
        crate::config::RunConfig::load(&tiny, &["run.name=\"ok_name-2\"".into()]).unwrap();
    }
}
