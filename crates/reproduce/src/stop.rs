//! A runner stopped by SIGINT or SIGTERM stops its runs first: the signal is passed to each
//! run still going (which then stops as a stopped run does: a checkpoint, exit 130 / 143), each
//! is waited for, and the runner then ends by the same signal. (A runner killed outright, by
//! SIGKILL, cannot: its runs get SIGTERM from the kernel instead, `pool.rs`.)

use std::process::Child;
use std::sync::atomic::{AtomicI32, Ordering};

/// The stop signal received (SIGINT or SIGTERM), 0 for none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// SIGINT and SIGTERM are caught while this lives ([`stop_runs_if_signalled`] acts on them);
/// dropped, their default actions are back, and one caught meanwhile ends the process by it.
pub struct CatchStopSignals(());

impl CatchStopSignals {
    /// Catch SIGINT and SIGTERM from now on.
    pub fn new() -> Self {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe
            unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
        CatchStopSignals(())
    }
}

impl Default for CatchStopSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CatchStopSignals {
    fn drop(&mut self) {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: restoring a signal's default action
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        let sig = RECEIVED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // SAFETY: raising a signal whose default action ends the process
            unsafe { libc::raise(sig) };
        }
    }
}

/// After SIGINT or SIGTERM ([`CatchStopSignals`]): pass it to every child in `runs`, wait
/// for each, then end this process by the same signal (exit status 130 / 143 in a shell).
/// Returns at once when no signal came.
pub fn stop_runs_if_signalled<'a>(runs: impl Iterator<Item = &'a mut Child>) {
    let sig = RECEIVED.load(Ordering::SeqCst);
    if sig == 0 {
        return;
    }
    let mut runs: Vec<&mut Child> = runs.collect();
    lowbit_train::errln!(
        "reproduce: stopping {} run(s) on signal {sig}: each writes a checkpoint; the same command again goes on",
        runs.len()
    );
    for c in &runs {
        // SAFETY: a signal to a child of this process, not yet waited for (its id is its own)
        unsafe { libc::kill(c.id() as libc::pid_t, sig) };
    }
    for c in &mut runs {
        let _ = c.wait();
    }
    // SAFETY: restoring the default action and raising the signal ends the process by it
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}
