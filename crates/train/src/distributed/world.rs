//! Which process of a data-parallel job this is: rank, world size, local rank and the
//! rendezvous address, read from the environment that torchrun and SLURM-style launchers set
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), or set by
//! `train --gpus N` for its workers (the `train` binary's launcher).

use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Environment variable: seconds to wait for the rendezvous and for any peer in a
/// collective before failing with an error naming the rank (default [`DEFAULT_TIMEOUT`]).
pub const TIMEOUT_VAR: &str = "LOWBIT_DIST_TIMEOUT_S";

/// Default wait for the rendezvous and for a peer in a collective: 300 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest [`TIMEOUT_VAR`] taken: a week (a longer wait is a hang, and seconds beyond
/// ~1.8e19 do not fit a `Duration`).
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// One process of a data-parallel job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    /// This process's rank, `0 .. world_size`; rank 0 writes the run folder.
    pub rank: usize,
    /// Number of processes (one per GPU).
    pub world_size: usize,
    /// Rank on this host (selects the GPU), `<= rank`.
    pub local_rank: usize,
    /// Rank 0's rendezvous address, `host:port` (`None` for a single process).
    pub master: Option<String>,
    /// Wait for the rendezvous and for a peer in a collective.
    pub timeout: Duration,
}

impl World {
    /// A single process (no rendezvous).
    pub fn single() -> World {
        World { rank: 0, world_size: 1, local_rank: 0, master: None, timeout: DEFAULT_TIMEOUT }
    }

    /// Whether this process writes the run folder, logs metrics and shows progress (rank 0).
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// From the process environment; see [`World::from_vars`].
    pub fn from_env() -> Result<World> {
        World::from_vars(|k| std::env::var(k).ok())
    }

    /// From variables looked up with `var`: without `WORLD_SIZE` and `RANK` a single
    /// process; otherwise `RANK` and `WORLD_SIZE` (and, when `WORLD_SIZE > 1`,
    /// `MASTER_ADDR` and `MASTER_PORT`) are required; `LOCAL_RANK` defaults to `RANK`.
    ///
    /// # Errors
    /// A missing, non-numeric or inconsistent variable (`RANK >= WORLD_SIZE`, `WORLD_SIZE =
    /// 0`, `LOCAL_RANK > RANK`, port 0), naming the variable and its value.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<World> {
        let timeout = match var(TIMEOUT_VAR) {
            None => DEFAULT_TIMEOUT,
            Some(s) => match s.trim().parse::<f64>() {
                Ok(t) if t > 0.0 && t <= MAX_TIMEOUT_S => Duration::from_secs_f64(t),
                _ => bail!("{TIMEOUT_VAR}={s:?}: expected a number of seconds in (0, {MAX_TIMEOUT_S}] (a week)"),
            },
        };
        let (rank, size) = (var("RANK"), var("WORLD_SIZE"));
        if rank.is_none() && size.is_none() {
            return Ok(World { timeout, ..World::single() });
        }
        let number = |k: &str, v: Option<String>| -> Result<usize> {
            let v = v.with_context(|| {
                format!("{k} is not set (a data-parallel launch sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)")
            })?;
            v.trim().parse().with_context(|| format!("{k}={v:?}: expected a non-negative integer"))
        };
        let world_size = number("WORLD_SIZE", size)?;
        let rank = number("RANK", rank)?;
        if world_size == 0 {
            bail!("WORLD_SIZE=0: expected at least 1 process");
        }
        if rank >= world_size {
            bail!("RANK={rank} is not below WORLD_SIZE={world_size} (ranks are 0 .. WORLD_SIZE-1)");
        }
        let local_rank = match var("LOCAL_RANK") {
            None => rank,
            v => number("LOCAL_RANK", v)?,
        };
        if local_rank > rank {
            bail!("LOCAL_RANK={local_rank} is above RANK={rank} (a host's ranks are a subset of the job's)");
        }
        let master = if world_size > 1 {
            let addr = var("MASTER_ADDR")
                .filter(|a| !a.trim().is_empty())
                .context("MASTER_ADDR is not set: WORLD_SIZE > 1 needs rank 0's host name or address for the rendezvous")?;
            let port = number("MASTER_PORT", var("MASTER_PORT"))?;
            if port == 0 || port > u16::MAX as usize {
                bail!("MASTER_PORT={port}: expected a TCP port, 1 .. 65535");
            }
            Some(format!("{}:{port}", addr.trim()))
        } else {
            None
        };
        Ok(World { rank, world_size, local_rank, master, timeout })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world(vars: &[(&str, &str)]) -> Result<World> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        World::from_vars(|k| m.get(k).cloned())
    }

    fn err(vars: &[(&str, &str)]) -> String {
        format!("{:#}", world(vars).unwrap_err())
    }

    const FULL: [(&str, &str); 5] =
        [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")];

    #[test]
    fn reads_a_torchrun_environment() {
        let w = world(&FULL).unwrap();
        assert_eq!((w.rank, w.world_size, w.local_rank), (3, 8, 1));
        assert_eq!(w.master.as_deref(), Some("node0:29500"));
        assert_eq!(w.timeout, DEFAULT_TIMEOUT);
        assert!(!w.is_leader());
        // nothing set: one process; LOCAL_RANK defaults to RANK; a timeout override
        assert_eq!(world(&[]).unwrap(), World::single());
        let w = world(&[("RANK", "0"), ("WORLD_SIZE", "1"), (TIMEOUT_VAR, "2.5")]).unwrap();
        assert_eq!((w.rank, w.world_size, w.local_rank, w.master), (0, 1, 0, None));
        assert_eq!(w.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let with = |k: &str, v: &str| -> Vec<(&str, String)> {
            FULL.iter().map(|&(a, b)| (a, if a == k { v.to_string() } else { b.to_string() })).collect()
        };
        let err_with = |k: &str, v: &str| {
            let vars = with(k, v);
            let refs: Vec<(&str, &str)> = vars.iter().map(|(a, b)| (*a, b.as_str())).collect();
            err(&refs)
        };
        assert!(err_with("RANK", "8").contains("RANK=8 is not below WORLD_SIZE=8"));
        assert!(err_with("RANK", "x").contains("RANK=\"x\": expected a non-negative integer"));
        assert!(err_with("WORLD_SIZE", "0").contains("WORLD_SIZE=0"));
        assert!(err_with("LOCAL_RANK", "4").contains("LOCAL_RANK=4 is above RANK=3"));
        assert!(err_with("MASTER_PORT", "70000").contains("MASTER_PORT=70000"));
        assert!(err_with("MASTER_ADDR", " ").contains("MASTER_ADDR is not set"));
        assert!(err(&[("RANK", "0")]).contains("WORLD_SIZE is not set"));
        assert!(err(&[("WORLD_SIZE", "2")]).contains("RANK is not set"));
        assert!(err(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).contains("MASTER_PORT is not set"));
        assert!(err(&[(TIMEOUT_VAR, "-1")]).contains(TIMEOUT_VAR));
        // seconds that do not fit a Duration are refused, not a panic
        for huge in ["1e20", "inf", "nan", "604801"] {
            assert!(err(&[(TIMEOUT_VAR, huge)]).contains("expected a number of seconds in (0, 604800]"), "{huge}");
        }
    }
}
