//! Standard output and error that a closed pipe does not break: `train predict ... | true`, a
//! summary printed into a pipe that has gone away, or `train ... 2>&1 | head` must not panic
//! (`println!` and `eprintln!` do, exit 101), and a training run must still write its
//! checkpoint and plots after it. Use [`outln!`](crate::outln), [`out!`](crate::out) and
//! [`errln!`](crate::errln) instead of `println!`, `print!` and `eprintln!`.

use std::io::Write;

/// Write `text` to stdout; a closed pipe (or any other write error) is ignored after one
/// debug line: the output was meant for a reader that is no longer there.
pub fn print(text: &str) {
    write_or_ignore(std::io::stdout().lock(), text, "stdout");
}

/// Write `text` to stdout and return the error: for a loop that prints until its reader goes
/// away (`train stalls --follow | head -1`) and should stop then.
pub fn try_print(text: &str) -> std::io::Result<()> {
    write_flushed(std::io::stdout().lock(), text)
}

/// `x` with `digits` decimals, `-` when there is none (a fraction not measured yet, a loss
/// not computed): the one formatter of optional numbers in text output ([`fixed_or`] with
/// `-`).
pub fn fixed(x: Option<f64>, digits: usize) -> String {
    fixed_or(x, digits, "-")
}

/// [`fixed`] with `none` for a missing number (the reports' markdown cells use `—`).
pub fn fixed_or(x: Option<f64>, digits: usize, none: &str) -> String {
    x.map_or(none.into(), |v| format!("{v:.digits$}"))
}

/// Write `text` to stderr; errors are ignored as in [`fn@print`].
pub fn eprint(text: &str) {
    write_or_ignore(std::io::stderr().lock(), text, "stderr");
}

fn write_or_ignore(w: impl Write, text: &str, what: &str) {
    if let Err(e) = write_flushed(w, text) {
        tracing::debug!("{what} not written: {e}");
    }
}

fn write_flushed(mut w: impl Write, text: &str) -> std::io::Result<()> {
    w.write_all(text.as_bytes()).and_then(|_| w.flush())
}

/// `println!` through [`fn@print`].
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => { $crate::output::print(&format!("{}\n", format_args!($($t)*))) };
}

/// `print!` through [`fn@print`].
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::output::print(&format!($($t)*)) };
}

/// `eprintln!` through [`fn@eprint`].
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => { $crate::output::eprint(&format!("{}\n", format_args!($($t)*))) };
}
