//! Build script: the git commit `train --version` prints (`LOWBIT_GIT_COMMIT`), the short hash
//! of HEAD when the crate is built inside a git checkout (also by `cargo install --path
//! crates/cli`), else "unknown commit" (a source archive). Re-run when HEAD moves.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).map_or_else(|| "unknown commit".to_string(), |c| format!("commit {c}"));
    println!("cargo:rustc-env=LOWBIT_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // HEAD (in the checkout's git dir), the branch it names and packed-refs (where `git gc`
        // moves refs), both in the common git dir (a linked worktree's refs live there, not in
        // its own git dir); only files that exist: cargo re-runs a build script on every build
        // while a watched path is missing
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]).unwrap_or_else(|| dir.clone());
        let branch = git(&["symbolic-ref", "-q", "HEAD"]);
        let watched = [format!("{dir}/HEAD"), format!("{common}/{}", branch.as_deref().unwrap_or("HEAD")), format!("{common}/packed-refs")];
        for path in watched {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
