//! The documentation's commands, run: every command a reader would type from `README.md` and
//! `docs/*.md` either runs here, on the CPU with this build's `train`, or says why it cannot
//! (every runnable command runs in CI).
//!
//! The convention (also in `docs/README.md`, "Commands in these pages"): a command sits in a
//! fenced block whose info string is `sh` followed by one tag.
//!
//! | info string | what the test does |
//! |---|---|
//! | `sh runnable` | runs every line, in order, and fails naming the page, line and command when one exits non-zero |
//! | `sh long` | nothing: minutes or more on 2 CPU cores (the full CPU job, the test suite, a reproduction) |
//! | `sh gpu` | nothing: needs a CUDA GPU or the CUDA build |
//! | `sh network` | nothing: needs the Hugging Face hub |
//! | `sh external` | nothing: needs software outside the workspace (TensorBoard, PyTorch, the shared corpus) or changes the machine outside the repository (`cargo install`) |
//!
//! Tags may be combined (`sh gpu network`), except `runnable`, which stands alone. A `sh` block
//! without a tag, a command-looking line in a fenced block without a language, and an indented
//! (unfenced) `train` or `cargo` line are errors, so that no command escapes both the test and
//! the reason. Output and synopses go in `text` blocks, which are not run.
//!
//! How a runnable line runs: `bash -o pipefail -c LINE` (a line ending in `\` continues on the
//! next; blank lines and `#` comments are skipped; `! train ...` is a command that must fail),
//! with `train` on `PATH` as this build's binary, in a scratch folder per page that looks like
//! the repository root to the command: copies of `configs/` and `reproduce/`, and the bundled
//! sample (`data/c4-sample`, `data/tokenizers`). So `runs/` is scratch, nothing in the checkout
//! is written, and a page's later lines see what its earlier ones made (`train stalls
//! runs/tiny_cpu` after a run). Runnable commands must be cheap on 2 CPU cores: the bundled
//! sample with a few steps (`--set train.max_steps=2 --set train.micro_batch=2 --set
//! data.val_tokens=256`), `--print-config`, `predict`, `stalls`, reports from committed results.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{root, train_bin};

/// The tags of a `sh` block that say why its commands are not run.
const NOT_RUN: [&str; 4] = ["long", "gpu", "network", "external"];

/// At least this many runnable commands (so the test cannot pass by finding none).
const MIN_COMMANDS: usize = 70;

/// A runnable command that takes longer than this is stopped and fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// One runnable command: where it is written and its text.
#[derive(Debug)]
struct Runnable {
    line: usize,
    text: String,
}

/// README.md and docs/*.md, relative to the repository root, README first.
fn pages(root: &Path) -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/{n}"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    std::iter::once("README.md".to_string()).chain(docs).collect()
}

/// Whether a line in a block without a language looks like a command a reader would run.
fn looks_like_command(line: &str) -> bool {
    let t = line.trim_start();
    ["train ", "cargo ", "scripts/", "python3 ", "tensorboard ", "./", ".ci/", "$ "].iter().any(|p| t.starts_with(p))
}

/// The runnable commands of page `name` (text `text`), or what breaks the convention, each
/// error as `name:line: what`.
fn parse(name: &str, text: &str) -> Result<Vec<Runnable>, Vec<String>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    // the open fence: its marker (```` ``` ```` or `~~~`, as long as written), language, tags,
    // line
    let mut open: Option<(String, String, Vec<String>, usize)> = None;
    let mut pending: Option<Runnable> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        match &open {
            None => {
                let fence: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
                if indent < 4 && fence.len() >= 3 && fence.chars().all(|c| c == fence.chars().next().unwrap()) {
                    let mut words = t[fence.len()..].split_whitespace().map(String::from);
                    let lang = words.next().unwrap_or_default();
                    let tags: Vec<String> = words.collect();
                    if ["bash", "shell", "console", "zsh"].contains(&lang.as_str()) {
                        errors.push(format!("{name}:{n}: commands go in ```sh blocks (with a tag), not ```{lang}"));
                    }
                    if lang == "sh" {
                        let runnable = tags.iter().any(|t| t == "runnable");
                        if tags.is_empty() {
                            errors.push(format!(
                                "{name}:{n}: a ```sh block needs a tag: `runnable` (the test runs it) or why it cannot run \
                                 ({NOT_RUN:?})"
                            ));
                        } else if runnable && tags.len() > 1 {
                            errors.push(format!("{name}:{n}: `runnable` stands alone, got {tags:?}"));
                        }
                        for t in tags.iter().filter(|t| *t != "runnable" && !NOT_RUN.contains(&t.as_str())) {
                            errors.push(format!("{name}:{n}: unknown tag `{t}` (runnable, or one of {NOT_RUN:?})"));
                        }
                    }
                    open = Some((fence, lang, tags, n));
                } else if indent >= 4 && (t.starts_with("train ") || t.starts_with("cargo ")) {
                    errors.push(format!("{name}:{n}: an indented command: put it in a fenced ```sh block with a tag"));
                }
            }
            Some((fence, lang, tags, _)) => {
                if t.starts_with(fence.as_str()) && t[fence.len()..].trim().is_empty() {
                    if let Some(p) = pending.take() {
                        errors.push(format!("{name}:{}: the block ends inside a continued line", p.line));
                    }
                    open = None;
                    continue;
                }
                if lang.is_empty() && looks_like_command(line) {
                    errors.push(format!("{name}:{n}: a command in a fenced block without a language: use ```sh with a tag"));
                }
                if !(lang == "sh" && tags.len() == 1 && tags[0] == "runnable") {
                    continue;
                }
                let (start, mut cmd) = match pending.take() {
                    Some(p) => (p.line, p.text + " "),
                    None if t.is_empty() || t.starts_with('#') => continue,
                    None => (n, String::new()),
                };
                match t.strip_suffix('\\') {
                    Some(head) => {
                        cmd.push_str(head.trim_end());
                        pending = Some(Runnable { line: start, text: cmd });
                    }
                    None => {
                        cmd.push_str(t);
                        out.push(Runnable { line: start, text: cmd });
                    }
                }
            }
        }
    }
    if let Some((_, _, _, n)) = open {
        errors.push(format!("{name}:{n}: a fenced block that is never closed"));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Copy the folder `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Run `cmd` with bash in `cwd` with `bin` first on PATH, its output into `log`; its exit
/// status (None: killed, or past [`COMMAND_TIMEOUT`]) and the seconds it took.
fn run_line(cmd: &str, cwd: &Path, bin: &Path, log: &Path) -> (Option<i32>, f64) {
    use std::os::unix::process::CommandExt;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let file = std::fs::File::create(log).unwrap();
    let t0 = Instant::now();
    let mut child = Command::new("bash")
        .args(["-o", "pipefail", "-c", cmd])
        .current_dir(cwd)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        // its own process group, so that a command past its time is stopped with whatever it
        // started (`train --gpus N` workers, `&` jobs)
        .process_group(0)
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > COMMAND_TIMEOUT {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            return (None, t0.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_runnable_command_in_the_readme_and_docs_runs() {
    let root = root();
    let t_all = Instant::now();
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        match parse(&page, &text) {
            Ok(cmds) => found.push((page, cmds)),
            Err(e) => errors.extend(e),
        }
    }
    assert!(errors.is_empty(), "the pages break the convention of tests/docs_commands.rs:\n{}", errors.join("\n"));
    let total: usize = found.iter().map(|(_, c)| c.len()).sum();
    eprintln!("{total} runnable commands in {} pages", found.len());
    assert!(
        total >= MIN_COMMANDS,
        "only {total} runnable commands in README.md and docs/*.md, expected at least {MIN_COMMANDS}: were blocks untagged or \
         pages removed?"
    );

    // the scratch: `train` on PATH, the bundled sample once, one folder per page
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(train_bin(), bin.join("train")).unwrap();
    let data = tmp.path().join("data");
    for d in ["c4-sample", "tokenizers"] {
        copy_dir(&root.join("data").join(d), &data.join(d));
    }
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut failures = Vec::new();
    for (page, cmds) in found.iter().filter(|(_, c)| !c.is_empty()) {
        let dir = tmp.path().join("pages").join(page.replace('/', "_"));
        copy_dir(&root.join("configs"), &dir.join("configs"));
        copy_dir(&root.join("reproduce"), &dir.join("reproduce"));
        std::os::unix::fs::symlink(&data, dir.join("data")).unwrap();
        for c in cmds {
            let log = logs.join(format!("{}-{}.log", page.replace('/', "_"), c.line));
            let (code, secs) = run_line(&c.text, &dir, &bin, &log);
            eprintln!("{page}:{}: {:?} in {secs:.1} s: {}", c.line, code, c.text);
            if code != Some(0) {
                let out = std::fs::read_to_string(&log).unwrap_or_default();
                let how = match code {
                    Some(c) => format!("exited with status {c}"),
                    None if secs > COMMAND_TIMEOUT.as_secs_f64() => format!("ran past {} s and was stopped", COMMAND_TIMEOUT.as_secs()),
                    None => "was killed by a signal".to_string(),
                };
                failures.push(format!("{page}:{}: `{}` {how}; its output ends:\n{}", c.line, c.text, tail(&out, 30)));
            }
        }
    }
    eprintln!("ran {total} commands in {:.1} s", t_all.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {total} documented commands failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// Every relative link of README.md and docs/*.md names a file or folder of the repository.
#[test]
fn links_between_the_pages_resolve() {
    let root = root();
    let mut broken = Vec::new();
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        let base = root.join(&page).parent().unwrap().to_path_buf();
        let mut in_code = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = rest[..end].split('#').next().unwrap_or("");
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                if !base.join(target).exists() {
                    broken.push(format!("{page}:{}: {target}", i + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn the_convention_is_enforced() {
    let ok =
        "```sh runnable\ntrain predict --format bf16 \\\n  --json\n# a comment\n\ntrain --help\n```\n```sh gpu network\ntrain x\n```\n";
    let cmds = parse("p.md", ok).unwrap();
    let got: Vec<(usize, &str)> = cmds.iter().map(|c| (c.line, c.text.as_str())).collect();
    assert_eq!(got, [(2, "train predict --format bf16 --json"), (6, "train --help")]);
    for (bad, what) in [
        ("```sh\ntrain --help\n```\n", "needs a tag"),
        ("```sh runnable gpu\ntrain --help\n```\n", "stands alone"),
        ("```sh later\ntrain --help\n```\n", "unknown tag"),
        ("```\ntrain --help\n```\n", "without a language"),
        ("```bash runnable\ntrain --help\n```\n", "```sh"),
        ("text\n\n    train --help\n", "indented"),
        ("```sh runnable\ntrain --help\n", "never closed"),
    ] {
        let e = parse("p.md", bad).unwrap_err().join("\n");
        assert!(e.contains(what) && e.starts_with("p.md:"), "{bad:?}: {e}");
    }
}

/// The run folder of each `train --config C [--set K=V ...]` line of `text`'s ```sh blocks
/// tagged `tag` (`cargo run ... -- --config C` too), from the repository's configs.
fn run_dirs(root: &Path, text: &str, tag: &str) -> Vec<(String, std::path::PathBuf)> {
    let mut inside = false;
    let mut dirs = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            inside = !inside && t.trim_start_matches('`').split_whitespace().eq(["sh", tag]);
            continue;
        }
        let words: Vec<&str> = t.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| *w == "--config") else { continue };
        if !inside || words.first() == Some(&"!") {
            continue;
        }
        let sets: Vec<String> = words.windows(2).filter(|w| w[0] == "--set").map(|w| w[1].to_string()).collect();
        let cfg = lowbit_train::config::RunConfig::load(&root.join(words[at + 1]), &sets).unwrap();
        dirs.push((t.to_string(), cfg.run_dir()));
    }
    dirs
}

/// The README's runnable runs keep off the run folders of its `sh long` runs: a reader who ran
/// the first command (`runs/tiny_cpu`) can run the rest in order (the two-step run took the
/// same folder and was refused). Here the long commands are not run, so this is checked from
/// the configs.
#[test]
fn readme_runs_keep_off_the_long_runs_folders() {
    let root = root();
    let text = std::fs::read_to_string(root.join("README.md")).unwrap();
    let long = run_dirs(&root, &text, "long");
    assert!(!long.is_empty(), "the README's first run is a `sh long` block");
    for (line, dir) in run_dirs(&root, &text, "runnable") {
        for (first, taken) in &long {
            assert_ne!(&dir, taken, "README.md: `{line}` runs in the folder of `{first}`");
        }
    }
}
