//! A Hugging Face hub on 127.0.0.1 for the fetch tests: a real HTTP server (`tiny_http`) that
//! serves files in the hub's URL layout and answers as the hub does, so `hf-hub` and
//! `train data fetch` run unchanged against it (`HF_ENDPOINT`):
//!
//! - `GET /<repo>/resolve/main/<path>` (`/datasets/<id>/...` for datasets): a dataset file is
//!   stored in LFS on the hub, so the answer is a 302 to a CDN URL (here `/cdn/<path>` on the
//!   same server) with `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`; a model file
//!   (`tokenizer.json`) is answered directly, with `ETag` and `X-Repo-Commit`. Unknown
//!   paths: 404.
//! - `GET /cdn/<path>`: the bytes, honouring `Range: bytes=a-b` / `bytes=a-` (206 with
//!   `Content-Range`).
//! - [`HubServer::drop_once`]: the next full download of that path is redirected to a raw
//!   socket that sends the headers and half the body, then closes the connection (a CDN
//!   connection dropped mid-file; `tiny_http` cannot close a connection mid-response).
//!
//! Every request is logged (path, `Range`, `Authorization`). The server stops when dropped.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One request the server saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub url: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

pub struct HubServer {
    /// `http://127.0.0.1:PORT` (the `HF_ENDPOINT`).
    pub url: String,
    server: Arc<tiny_http::Server>,
    log: Arc<Mutex<Vec<Seen>>>,
    drop_next: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl HubServer {
    /// Serve `files`: URL path under the endpoint (`datasets/allenai/c4/resolve/main/en/x`)
    /// -> bytes.
    pub fn start(files: HashMap<String, Vec<u8>>) -> HubServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!("http://{}", server.server_addr().to_ip().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let drop_next: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let thread = {
            let (server, log, drop_next, base) = (server.clone(), log.clone(), drop_next.clone(), url.clone());
            std::thread::spawn(move || {
                for rq in server.incoming_requests() {
                    let header = |name: &'static str| rq.headers().iter().find(|h| h.field.equiv(name)).map(|h| h.value.to_string());
                    let seen = Seen { url: rq.url().to_string(), range: header("Range"), auth: header("Authorization") };
                    log.lock().unwrap().push(seen.clone());
                    let path = seen.url.trim_start_matches('/').to_string();
                    let response = if let Some(key) = path.strip_prefix("cdn/") {
                        match files.get(key) {
                            Some(bytes) => ranged(bytes, seen.range.as_deref()),
                            None => not_found(),
                        }
                    } else {
                        match files.get(&path) {
                            None => not_found(),
                            Some(bytes) if path.starts_with("datasets/") => {
                                let full_download = seen.range.as_deref() == Some("bytes=0-");
                                let cdn = match drop_next.lock().unwrap().take_if(|p| *p == path && full_download) {
                                    Some(_) => dropping_cdn(bytes.clone()),
                                    None => base.clone(),
                                };
                                tiny_http::Response::empty(302)
                                    .with_header(h("Location", &format!("{cdn}/cdn/{path}")))
                                    .with_header(h("X-Repo-Commit", COMMIT))
                                    .with_header(h("X-Linked-Etag", &format!("\"{}\"", etag(bytes))))
                                    .with_header(h("X-Linked-Size", &bytes.len().to_string()))
                                    .boxed()
                            }
                            Some(bytes) => {
                                let mut r = ranged(bytes, seen.range.as_deref());
                                r.add_header(h("ETag", &format!("\"{}\"", etag(bytes))));
                                r.add_header(h("X-Repo-Commit", COMMIT));
                                r
                            }
                        }
                    };
                    let _ = rq.respond(response);
                }
            })
        };
        HubServer { url, server, log, drop_next, thread: Some(thread) }
    }

    /// The requests so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    /// Drop the connection of the next full download of `path` (a key of the served files)
    /// after half its bytes.
    pub fn drop_once(&self, path: &str) {
        *self.drop_next.lock().unwrap() = Some(path.to_string());
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn h(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap()
}

/// A stand-in for the hub's etag (the sha256 of an LFS file): distinct per content.
fn etag(bytes: &[u8]) -> String {
    let mut x: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        x = (x ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{x:016x}{:08x}", bytes.len())
}

fn not_found() -> tiny_http::ResponseBox {
    tiny_http::Response::from_string("Entry not found").with_status_code(404).boxed()
}

/// The bytes of `range` (`bytes=a-b` or `bytes=a-`): 206 with `Content-Range`, or all of them.
fn ranged(bytes: &[u8], range: Option<&str>) -> tiny_http::ResponseBox {
    let n = bytes.len();
    let Some((a, b)) = range.and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) else {
        return tiny_http::Response::from_data(bytes.to_vec()).with_chunked_threshold(usize::MAX).boxed();
    };
    let start: usize = a.parse().unwrap();
    let end: usize = if b.is_empty() { n - 1 } else { b.parse::<usize>().unwrap().min(n - 1) };
    tiny_http::Response::from_data(bytes[start..=end].to_vec())
        .with_status_code(206)
        .with_header(h("Content-Range", &format!("bytes {start}-{end}/{n}")))
        .with_chunked_threshold(usize::MAX)
        .boxed()
}

/// A one-connection CDN that answers a full download with all the headers and half the body,
/// then closes the connection. Returns its base URL.
fn dropping_cdn(bytes: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let n = bytes.len();
        let _ = write!(s, "HTTP/1.1 206 Partial Content\r\nContent-Length: {n}\r\nContent-Range: bytes 0-{}/{n}\r\n\r\n", n - 1);
        let _ = s.write_all(&bytes[..n / 2]);
        let _ = s.flush();
        // dropping the socket closes the connection with half the body sent
    });
    url
}
