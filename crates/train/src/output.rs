//! Standard output that a closed pipe does not break: `train predict ... | true` or a summary
//! printed into a pipe that has gone away must not panic (`println!` does, exit 101), and a
//! training run must still write its plots after it. Use [`outln!`](crate::outln) and
//! [`out!`](crate::out) instead of `println!` and `print!`.

use std::io::Write;

/// Write `text` to stdout; a closed pipe (or any other write error) is ignored after one
/// debug line: the output was meant for a reader that is no longer there.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        tracing::debug!("stdout not written: {e}");
    }
}

/// `println!` through [`print`].
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => { $crate::output::print(&format!("{}\n", format_args!($($t)*))) };
}

/// `print!` through [`print`].
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::output::print(&format!($($t)*)) };
}
