//! SIGINT (Ctrl-C) and SIGTERM (what schedulers such as Slurm send before a kill): the first
//! one sets the run's interrupt flag, so the loop finishes its step, writes a checkpoint and
//! stops; the binary then exits with `128 + signal` (130, 143), the shell's convention for
//! "ended by this signal".
//!
//! One stop per job however many copies of the signal arrive: a scheduler that signals every
//! process of a job (Slurm's time limit, `scancel`, systemd's `KillMode=control-group`) reaches
//! a `--gpus N` worker directly and again through the supervisor's forward, within
//! milliseconds. A signal within [`COPY_WINDOW`] of the first is such a copy and is ignored;
//! one after it (a second Ctrl-C by the user) kills the process at once, without a checkpoint
//! (it dies by the signal: a supervisor counts that as a failure).
//!
//! `signal-hook` catches the signals and hands them to a thread of their own, where they are
//! handled as ordinary code (no async-signal-safety rules to keep).

use anyhow::Context;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Signals within this long of the first are copies of it (one stop).
pub const COPY_WINDOW: Duration = Duration::from_secs(1);

/// The first signal received (0 = none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Catch SIGINT and SIGTERM from now on: the first sets `flag`, a copy within [`COPY_WINDOW`]
/// is ignored, a later one ends the process by the signal.
///
/// # Errors
/// A second call, or the signals cannot be caught or their thread started.
pub fn install(flag: Arc<AtomicBool>) -> anyhow::Result<()> {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    anyhow::ensure!(!INSTALLED.swap(true, Ordering::SeqCst), "signal handlers installed twice");
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("cannot catch SIGINT and SIGTERM")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first = None;
            for sig in signals.forever() {
                on_signal(sig, &mut first, &flag);
            }
        })
        .context("cannot start the thread that handles SIGINT and SIGTERM")?;
    Ok(())
}

/// Signal `sig` arrived; the first arrived at `first` (`None`: this is it). The first sets
/// `flag` and says what happens; a copy within [`COPY_WINDOW`] of it is ignored; a later one
/// ends the process by the signal, so that a supervisor or scheduler sees a process killed by
/// it, not the 130 / 143 of a stop with a checkpoint.
fn on_signal(sig: i32, first: &mut Option<Instant>, flag: &AtomicBool) {
    match first {
        None => {
            *first = Some(Instant::now());
            RECEIVED.store(sig, Ordering::SeqCst);
            flag.store(true, Ordering::SeqCst);
            lowbit_train::errln!("\ninterrupt: finishing this step, writing a checkpoint (signal again, a second or more later, to abort)");
        }
        Some(t) if t.elapsed() < COPY_WINDOW => {} // the scheduler's and the supervisor's copies: one stop
        Some(_) => {
            // the default action of SIGINT and SIGTERM, which ends the process (no return)
            let _ = signal_hook::low_level::emulate_default_handler(sig);
        }
    }
}

/// The signal that stopped the run (SIGINT or SIGTERM), if this process received one.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
