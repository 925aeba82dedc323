//! SIGINT (Ctrl-C) and SIGTERM (what schedulers such as Slurm send before a kill): the first
//! one sets the run's interrupt flag, so the loop finishes its step, writes a checkpoint and
//! stops; the binary then exits with `128 + signal` (130, 143), the shell's convention for
//! "ended by this signal".
//!
//! One stop per job however many copies of the signal arrive: a scheduler that signals every
//! process of a job (Slurm's time limit, `scancel`, systemd's `KillMode=control-group`) reaches
//! a `--gpus N` worker directly and again through the supervisor's forward, within
//! milliseconds. A signal within [`COPY_WINDOW_MS`] of the first is such a copy and is ignored;
//! one after it (a second Ctrl-C by the user) kills the process at once, without a checkpoint
//! (it dies by the signal: a supervisor counts that as a failure).
//!
//! The handler only does async-signal-safe things: atomic loads and stores, `clock_gettime(2)`,
//! `write(2)`, `signal(2)` and `raise(3)`.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Signals within this many milliseconds of the first are copies of it (one stop).
pub const COPY_WINDOW_MS: u64 = 1000;

/// The first signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// When the first signal arrived: CLOCK_MONOTONIC in milliseconds, plus 1 (0 = none yet).
static FIRST_AT_MS: AtomicU64 = AtomicU64::new(0);
/// The interrupt flag of the run, set by the handler.
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// CLOCK_MONOTONIC in milliseconds (async-signal-safe).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime is async-signal-safe and writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

extern "C" fn on_signal(sig: libc::c_int) {
    let now = monotonic_ms() + 1;
    if let Err(first) = FIRST_AT_MS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
        if now.saturating_sub(first) < COPY_WINDOW_MS {
            return; // a copy of the first (the scheduler's and the supervisor's): one stop
        }
        // abort: die by the signal (no checkpoint), so that a supervisor or scheduler sees a
        // process killed by it, not the 130 / 143 of a stop with a checkpoint
        // SAFETY: signal(2) and raise(3) are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    RECEIVED.store(sig, Ordering::SeqCst);
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
    let msg: &[u8] = b"\ninterrupt: finishing this step, writing a checkpoint (signal again, a second or more later, to abort)\n";
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

/// The signal that stopped the run (SIGINT or SIGTERM), if this process received one.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
