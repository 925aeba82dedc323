//! Standard output that a closed pipe does not break: `train predict ... | head -0` or a
//! summary printed into a pipe that has gone away must not panic (`println!` does, exit 101),
//! and a training run must still write its plots after it.

use std::io::Write;

/// Print `text` and a newline to stdout; a closed pipe (or any other write error) is ignored
/// after one debug line: the output was meant for a reader that is no longer there.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|_| out.flush()) {
        tracing::debug!("stdout not written: {e}");
    }
}
