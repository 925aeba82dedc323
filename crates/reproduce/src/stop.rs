//! A runner stopped by SIGINT or SIGTERM stops its runs first: the signal is passed to each
//! run still going (which then stops as a stopped run does: a checkpoint, exit 130 / 143), each
//! is waited for, and the runner then ends by the same signal. (A runner killed outright, by
//! SIGKILL, cannot: its runs get SIGTERM from the kernel instead, `pool.rs`.)
//!
//! The signals are caught through `signal-hook`, whose hooks stay once registered: while no
//! [`CatchStopSignals`] lives they run the signals' default action (the process ends by it).

use signal_hook::consts::{SIGINT, SIGTERM};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The stop signal received while caught (SIGINT or SIGTERM), 0 for none.
static RECEIVED: AtomicUsize = AtomicUsize::new(0);
/// Whether no [`CatchStopSignals`] lives: SIGINT and SIGTERM then take their default action.
static RELEASED: AtomicBool = AtomicBool::new(true);

/// Register the hooks of SIGINT and SIGTERM, once: the default action while [`RELEASED`], else
/// the signal stored in [`RECEIVED`].
fn register_hooks() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    let register = || {
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_conditional_default(sig, &RELEASED).map_err(|e| e.to_string())?;
            signal_hook::flag::register_usize(sig, &RECEIVED, sig as usize).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    REGISTERED.get_or_init(register).clone().map_err(|e| anyhow::anyhow!("cannot catch SIGINT and SIGTERM: {e}"))
}

/// SIGINT and SIGTERM are caught while this lives ([`stop_runs_if_signalled`] acts on them);
/// dropped, their default actions are back, and one caught meanwhile ends the process by it.
pub struct CatchStopSignals(());

impl CatchStopSignals {
    /// Catch SIGINT and SIGTERM from now on.
    ///
    /// # Errors
    /// The signals cannot be caught.
    pub fn new() -> anyhow::Result<Self> {
        register_hooks()?;
        RELEASED.store(false, Ordering::SeqCst);
        Ok(CatchStopSignals(()))
    }
}

impl Drop for CatchStopSignals {
    fn drop(&mut self) {
        RELEASED.store(true, Ordering::SeqCst);
        let sig = RECEIVED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            end_by(sig as i32);
        }
    }
}

/// End this process by signal `sig`, SIGINT or SIGTERM (exit status 130 / 143 in a shell):
/// their default action, which `signal-hook` runs without returning.
fn end_by(sig: i32) -> ! {
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    unreachable!("the default action of signal {sig} ends the process")
}

/// After SIGINT or SIGTERM ([`CatchStopSignals`]): pass it to every child in `runs`, wait
/// for each, then end this process by the same signal (exit status 130 / 143 in a shell).
/// Returns at once when no signal came.
pub fn stop_runs_if_signalled<'a>(runs: impl Iterator<Item = &'a mut Child>) {
    let sig = RECEIVED.load(Ordering::SeqCst) as i32;
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
    end_by(sig)
}
