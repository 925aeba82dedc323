//! The integration tests' helpers: lowbit-train's (`shared`), and running the `train` binary.
#![allow(dead_code)]

#[path = "../../../train/tests/common/mod.rs"]
mod shared;
pub use shared::*;

use std::path::{Path, PathBuf};

/// The `train` binary of this build.
pub fn train_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_train"))
}

/// What a `train` invocation did.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run `train ARGS` in `cwd` and wait for it.
pub fn train(cwd: &Path, args: &[&str]) -> Ran {
    let out = std::process::Command::new(train_bin()).args(args).current_dir(cwd).output().unwrap();
    let r = Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("$ train {}\n-> {:?}\n{}{}", args.join(" "), r.code, r.stdout, r.stderr);
    r
}

/// A folder holding `c.toml`: [`base_toml`] with run folders `runs/<name>` relative to it.
pub fn cli_dir(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("c.toml"), base_toml(Path::new("runs"), name)).unwrap();
    tmp
}

