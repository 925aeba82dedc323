//! SIGINT (Ctrl-C) and SIGTERM (what schedulers such as Slurm send before a kill): the first
//! one sets the run's interrupt flag, so the loop finishes its step, writes a checkpoint and
//! stops; a second one exits at once. The binary then exits with `128 + signal` (130, 143),
//! the shell's convention for "ended by this signal".
//!
//! The handler only does async-signal-safe things: atomic stores, `write(2)` and `_exit(2)`.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

/// The first signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// The interrupt flag of the run, set by the handler.
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

extern "C" fn on_signal(sig: libc::c_int) {
    if RECEIVED.swap(sig, Ordering::SeqCst) != 0 {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(128 + sig) };
    }
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
    let msg: &[u8] = b"\ninterrupt: finishing this step, writing a checkpoint (signal again to abort)\n";
    // SAFETY: write(2) on stderr with a valid buffer is async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Install the handler for SIGINT and SIGTERM; it sets `flag`.
pub fn install(flag: Arc<AtomicBool>) -> anyhow::Result<()> {
    anyhow::ensure!(FLAG.set(flag).is_ok(), "signal handlers installed twice");
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only touches atomics and async-signal-safe calls.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            anyhow::bail!("cannot install the handler of signal {sig}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The exit status for the signal that stopped the run (130 for SIGINT, 143 for SIGTERM), if any.
pub fn exit_status() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(128 + sig),
    }
}
