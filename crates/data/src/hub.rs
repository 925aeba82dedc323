//! Files of Hugging Face hub repos fetched into a local folder, as `train data fetch` needs
//! them (C4's, [`crate::c4`], and FineWeb-Edu's, [`crate::fineweb_edu`]): the size of each file asked before anything is written, then each file downloaded
//! by `hf-hub` and moved under its final name only once it is complete.
//!
//! Where the bytes go: `hf-hub` downloads into its cache layout, here a staging cache inside
//! the destination folder (`<out>/.cache/huggingface/`, where the hub's Python client keeps
//! a `local_dir` download's state too): the bytes arrive in `blobs/<etag>.part`, which a later
//! call resumes with an HTTP range request from where it stopped (`hf-hub` also retries
//! within a call: [`Hub::new`]'s `retries`); the finished blob is renamed (same filesystem:
//! atomic) to `<out>/<path>` after its size is checked against the hub's. So a file under its
//! final name is always complete, and an interrupted one is only ever a `.part` in staging.
//!
//! The environment, as the hub's own clients read it ([`HubEnv::from_env`]): `HF_ENDPOINT`
//! (default `https://huggingface.co`), the token from `HF_TOKEN`, else the file
//! `HF_TOKEN_PATH`, else `$HF_HOME/token` (`HF_HOME` defaults to
//! `$XDG_CACHE_HOME/huggingface`, then `~/.cache/huggingface`; `huggingface-cli login`
//! writes it), and `HF_HUB_OFFLINE` (1/true/yes/on: no request is made).

use crate::error::{DataError, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};

pub use hf_hub::api::Progress;

/// One file of a hub repo and the local path it is fetched to.
#[derive(Debug, Clone)]
pub struct HubFile {
    /// The repo holding it (`allenai/c4`, `google-t5/t5-base`) and its kind.
    pub repo_id: String,
    pub kind: RepoType,
    /// Its path inside the repo (`en/c4-train.00000-of-01024.json.gz`).
    pub path: String,
    /// Where it goes.
    pub dest: PathBuf,
    /// Its size in bytes as the corpus's own listing gives it, where there is one
    /// ([`crate::fineweb_edu::FILE_BYTES`]): what `--dry-run` shows without asking the hub.
    /// `None`: only the hub knows ([`Hub::size`]).
    pub listed_bytes: Option<u64>,
}

impl HubFile {
    /// The repo, at its default revision (`main`).
    pub fn repo(&self) -> Repo {
        Repo::new(self.repo_id.clone(), self.kind)
    }

    /// The file is already fetched: something is under its final name, which only a complete
    /// download is ever moved to (delete it to fetch it again).
    pub fn is_present(&self) -> bool {
        self.dest.is_file()
    }
}

/// Shards that hold `tokens` tokens at `per_shard` each (at least 1; fewer shards are read
/// again from the start once used up): how many files of a corpus a run needs.
pub fn shards_for(tokens: u64, per_shard: u64) -> usize {
    tokens.div_ceil(per_shard.max(1)).max(1) as usize
}

/// How to reach the hub, read from the environment ([`HubEnv::from_env`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HubEnv {
    /// Base URL, without a trailing `/`.
    pub endpoint: String,
    /// The access token, if one is set, and where it came from (for messages).
    pub token: Option<(String, String)>,
    /// `HF_HUB_OFFLINE` is set: no request may be made.
    pub offline: bool,
}

impl HubEnv {
    /// `HF_ENDPOINT`, the token (`HF_TOKEN`, the file `HF_TOKEN_PATH`, `$HF_HOME/token`) and
    /// `HF_HUB_OFFLINE`, as the hub's Python client reads them.
    pub fn from_env() -> HubEnv {
        HubEnv::from_vars(|k| std::env::var(k).ok())
    }

    /// [`HubEnv::from_env`] over the variables `var` gives.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> HubEnv {
        let var = |k: &str| var(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()).trim_end_matches('/').to_string();
        let token = match var("HF_TOKEN") {
            Some(t) => Some((t, "HF_TOKEN".to_string())),
            None => {
                let home = var("HF_HOME").map(PathBuf::from).or_else(|| {
                    var("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
                        .map(|c| c.join("huggingface"))
                });
                let file = var("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| home.map(|h| h.join("token")));
                file.and_then(|f| {
                    let t = std::fs::read_to_string(&f).ok()?.trim().to_string();
                    (!t.is_empty()).then(|| (t, f.display().to_string()))
                })
            }
        };
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| ["1", "true", "yes", "on"].contains(&v.to_ascii_lowercase().as_str()));
        HubEnv { endpoint, token, offline }
    }
}

/// A hub client that fetches [`HubFile`]s into one destination folder.
pub struct Hub {
    api: Api,
    /// For the size requests (`hf-hub` keeps its own client private).
    agent: ureq::Agent,
    env: HubEnv,
    /// `hf-hub`'s cache for this folder: partial downloads live here.
    staging: PathBuf,
}

impl Hub {
    /// A client for `env` that stages downloads in `<out>/.cache/huggingface/` and retries a
    /// broken transfer `retries` times within a call (resuming where it stopped).
    ///
    /// # Errors
    /// [`DataError::Fetch`] when `HF_HUB_OFFLINE` is set (nothing may be requested), or the
    /// client cannot be built.
    pub fn new(env: HubEnv, out: &Path, retries: usize) -> Result<Hub> {
        if env.offline {
            return Err(fetch_err(
                "files from the hub",
                "HF_HUB_OFFLINE is set, so no request may be made: unset it where there is network access".into(),
            ));
        }
        let staging = out.join(".cache").join("huggingface");
        let api = ApiBuilder::from_cache(Cache::new(staging.clone()))
            .with_endpoint(env.endpoint.clone())
            .with_token(env.token.as_ref().map(|t| t.0.clone()))
            .with_progress(false)
            .with_retries(retries)
            .with_user_agent("lowbit", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| fetch_err("files from the hub", format!("cannot start the hub client: {e}")))?;
        // a size request that gets no answer fails instead of waiting for ever
        let agent = ureq::AgentBuilder::new()
            .try_proxy_from_env(true)
            .timeout_connect(std::time::Duration::from_secs(30))
            .timeout_read(std::time::Duration::from_secs(60))
            .build();
        Ok(Hub { api, agent, env, staging })
    }

    /// Where partial downloads are kept until they complete.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// The size of `f` on the hub, in bytes: a one-byte range request to its `resolve` URL
    /// (redirects followed), as `hf-hub` itself asks it.
    ///
    /// # Errors
    /// [`DataError::Fetch`] naming the file and the URL: not on the hub (404), a token needed
    /// or refused (401/403, saying how to set one), the hub unreachable (saying what to do
    /// offline), or an answer without a size.
    pub fn size(&self, f: &HubFile) -> Result<u64> {
        let url = self.api.repo(f.repo()).url(&f.path);
        let mut req = self.agent.get(&url).set("Range", "bytes=0-0").set("User-Agent", concat!("lowbit/", env!("CARGO_PKG_VERSION")));
        if let Some((token, _)) = &self.env.token {
            req = req.set("Authorization", &format!("Bearer {token}"));
        }
        let resp = req.call().map_err(|e| self.request_err(f, &url, e))?;
        let from_range = resp.header("Content-Range").and_then(|r| r.rsplit('/').next()).and_then(|n| n.trim().parse().ok());
        let size = match resp.status() {
            206 => from_range,
            _ => resp.header("Content-Length").and_then(|n| n.trim().parse().ok()),
        };
        size.ok_or_else(|| fetch_err(&f.path, format!("{url} answered {} without the file's size", resp.status())))
    }

    /// Download `f` (of `size` bytes, from [`Hub::size`]) to `f.dest`, resuming a partial
    /// download left by an earlier call; `progress` sees the bytes as they arrive.
    ///
    /// # Errors
    /// [`DataError::Fetch`] naming the file: the transfer failed after the retries (what
    /// arrived is kept for the next call), the download's size differs from the hub's (it is
    /// deleted), or the file cannot be moved into place.
    pub fn download(&self, f: &HubFile, size: u64, progress: impl Progress) -> Result<()> {
        let repo_cache = self.staging.join(f.repo().folder_name());
        // hf-hub links each finished blob from snapshots/; those links are left dangling by
        // the move below, and a dangling one would make hf-hub's next link to it fail
        let _ = std::fs::remove_dir_all(repo_cache.join("snapshots"));
        let pointer = self.api.repo(f.repo()).download_with_progress(&f.path, progress).map_err(|e| match e {
            ApiError::RequestError(e) => self.request_err(f, &self.api.repo(f.repo()).url(&f.path), *e),
            // nothing was downloaded: a mirror that does not answer as the hub does
            e @ (ApiError::MissingHeader(_) | ApiError::InvalidHeader(_)) => fetch_err(
                &f.path,
                format!(
                    "{e} in the answer of {}: a hub mirror (HF_ENDPOINT) must answer as huggingface.co does: \
                     an ETag and an X-Repo-Commit header, and range requests (206 with Content-Range)",
                    self.env.endpoint
                ),
            ),
            e => {
                fetch_err(&f.path, format!("{e}; run the same command again to resume (the partial file is in {})", self.staging.display()))
            }
        })?;
        let blob = std::fs::canonicalize(&pointer).map_err(|e| fetch_err(&f.path, format!("{}: {e}", pointer.display())))?;
        let got = std::fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
        if got != size {
            let _ = std::fs::remove_file(&blob);
            return Err(fetch_err(
                &f.path,
                format!("the download holds {got} bytes, the hub says {size}: deleted; run the same command again"),
            ));
        }
        if let Some(dir) = f.dest.parent() {
            std::fs::create_dir_all(dir).map_err(|e| fetch_err(&f.path, format!("cannot create {}: {e}", dir.display())))?;
        }
        std::fs::rename(&blob, &f.dest)
            .map_err(|e| fetch_err(&f.path, format!("cannot move {} to {}: {e}", blob.display(), f.dest.display())))?;
        let _ = std::fs::remove_file(&pointer);
        Ok(())
    }

    /// Remove the staging cache: call it once every file is fetched (nothing partial is left
    /// to resume).
    pub fn finish(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.staging) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(fetch_err("the staging folder", format!("cannot remove {}: {e}", self.staging.display())))
            }
            _ => {
                let _ = std::fs::remove_dir(self.staging.parent().expect("staging is <out>/.cache/huggingface"));
                Ok(())
            }
        }
    }

    /// The error of a failed request for `f`, saying what to do about it.
    fn request_err(&self, f: &HubFile, url: &str, e: ureq::Error) -> DataError {
        let token_hint = match &self.env.token {
            Some((_, from)) => format!("the token from {from} was sent"),
            None => "no token was sent: set HF_TOKEN, or log in with `huggingface-cli login` (it writes $HF_HOME/token)".into(),
        };
        let msg = match e {
            ureq::Error::Status(404, _) => format!("{url}: not found (404): {} is not in {} at {}", f.path, f.repo_id, self.env.endpoint),
            ureq::Error::Status(code @ (401 | 403), _) => format!("{url}: access refused ({code}); {token_hint}"),
            ureq::Error::Status(code, r) => format!("{url}: HTTP {code} {}", r.status_text()),
            ureq::Error::Transport(t) => match t.kind() {
                ureq::ErrorKind::Dns | ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::ProxyConnect => format!(
                    "cannot reach {} ({t}): this machine seems to be offline. Fetch on a machine that reaches the hub \
                     and copy the folder here, or set HF_ENDPOINT to a mirror you can reach; without C4, \
                     configs/tiny_cpu.toml trains on the bundled sample and scripts/link_shared_corpus.sh links the \
                     shared corpus (docs/data.md)",
                    self.env.endpoint
                ),
                _ => format!("{url}: {t}; run the same command again to resume (the partial file is in {})", self.staging.display()),
            },
        };
        fetch_err(&f.path, msg)
    }
}

fn fetch_err(file: &str, msg: String) -> DataError {
    DataError::Fetch { file: file.to_string(), msg }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(vars: &[(&str, &str)]) -> HubEnv {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HubEnv::from_vars(|k| vars.get(k).cloned())
    }

    #[test]
    fn the_environment_is_read_as_the_hub_clients_read_it() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("hf");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("token"), "hf_file\n").unwrap();
        let hf_home = home.to_str().unwrap();

        let e = env_of(&[]);
        assert_eq!((e.endpoint.as_str(), e.token.is_none(), e.offline), ("https://huggingface.co", true, false));
        let e = env_of(&[("HF_ENDPOINT", "http://127.0.0.1:9/"), ("HF_HOME", hf_home)]);
        assert_eq!(e.endpoint, "http://127.0.0.1:9");
        assert_eq!(e.token, Some(("hf_file".to_string(), home.join("token").display().to_string())));
        // HF_TOKEN wins over the file; an empty one counts as unset
        let e = env_of(&[("HF_TOKEN", "hf_env"), ("HF_HOME", hf_home)]);
        assert_eq!(e.token, Some(("hf_env".to_string(), "HF_TOKEN".to_string())));
        assert_eq!(env_of(&[("HF_TOKEN", " "), ("HF_HOME", hf_home)]).token.unwrap().0, "hf_file");
        // HF_HOME's default under XDG_CACHE_HOME, then HOME
        let xdg = tmp.path().join("xdg");
        std::fs::create_dir_all(xdg.join("huggingface")).unwrap();
        std::fs::write(xdg.join("huggingface/token"), "hf_xdg").unwrap();
        assert_eq!(env_of(&[("XDG_CACHE_HOME", xdg.to_str().unwrap())]).token.unwrap().0, "hf_xdg");
        assert!(env_of(&[("HOME", tmp.path().to_str().unwrap())]).token.is_none());
        assert_eq!(env_of(&[("HF_TOKEN_PATH", home.join("token").to_str().unwrap())]).token.unwrap().0, "hf_file");
        for v in ["1", "true", "YES", "on"] {
            assert!(env_of(&[("HF_HUB_OFFLINE", v)]).offline, "{v}");
        }
        assert!(!env_of(&[("HF_HUB_OFFLINE", "0")]).offline);
    }

    #[test]
    fn offline_refuses_before_any_request() {
        let env = HubEnv { offline: true, ..env_of(&[]) };
        let e = Hub::new(env, Path::new("out"), 0).err().unwrap().to_string();
        assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
    }
}
