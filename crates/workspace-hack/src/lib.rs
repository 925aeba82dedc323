//! No code. Its manifest turns on, for every lowbit crate that depends on it, the features
//! that the `train` build gives the shared dependencies, so that `cargo run`, `cargo test` and
//! `cargo test -p <crate>` reuse one build of them (see `Cargo.toml`).
