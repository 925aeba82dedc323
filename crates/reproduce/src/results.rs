//! The results file of a table at a scale, `<out>/<table>-<scale>-results.json`: one record
//! per finished run (states kind, cell, seed) with its final numbers and a fingerprint of its
//! resolved config. Run folders do not outlive a device command; this file does (it is
//! written under the command's output folder after every finished run, copied back and
//! committed beside the reports), so a table fills in over several commands and the reports
//! are rendered from it.

use super::paper::{cell_short, Cell, Table};
use super::scale::Scale;
use super::states::{States, SHARED};
use super::stats::{Results, RunResult};
use anyhow::{bail, Context, Result};
use lowbit_train::config::RunConfig;
use lowbit_train::logs::summary::Summary;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The results file's name: `<table>-<scale>-results.json`.
pub fn results_name(table: Table, scale: Scale) -> String {
    format!("{}-{}-results.json", table.as_str(), scale.as_str())
}

/// The folder of the records under a reproduce folder (`reproduce/records`): every results
/// file and the device logs, apart from the reports rendered from them.
pub const RECORDS: &str = "records";

/// Where the results file of `table` at `scale` lives under the reproduce folder `root`:
/// `<root>/records/<table>-<scale>-results.json`, an ablation's under
/// `<root>/records/ablations/<name>/`.
pub fn results_path(root: &Path, table: Table, scale: Scale, ablation: Option<&str>) -> PathBuf {
    let dir = root.join(RECORDS);
    let dir = match ablation {
        Some(name) => dir.join("ablations").join(name),
        None => dir,
    };
    dir.join(results_name(table, scale))
}

/// Fingerprint of a run's resolved config: CRC-32 (hex) of its TOML with `run.dir` cleared,
/// so that the same run made under another `--runs` folder (another machine) matches.
pub fn fingerprint(cfg: &RunConfig) -> String {
    let mut c = cfg.clone();
    c.run.dir = String::new();
    format!("{:08x}", crc32fast::hash(c.to_toml().as_bytes()))
}

/// Which run a record is: states kind ([`super::States::tag`]: `paper`, `blockwise`, `theory` or
/// `shared`), cell ([`cell_short`]) and seed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunKey {
    /// `paper`, `blockwise`, `theory` or `shared`.
    pub states: String,
    /// The cell's short name (`fp8_sr_reset`).
    pub cell: String,
    /// `train.seed` of the run.
    pub seed: usize,
}

/// One finished run in the results file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// `paper`, `blockwise`, `theory` or `shared` (FP32/BF16 cells of `paper` and
    /// `blockwise`, the same under both).
    pub states: String,
    /// The cell's short name (`fp8_sr_reset`).
    pub cell: String,
    pub seed: usize,
    /// [`fingerprint`] of the run's resolved config.
    pub fingerprint: String,
    /// Validation loss at step 0 and at the end (nats/token).
    pub initial_val_loss: Option<f64>,
    pub final_val_loss: Option<f64>,
    /// Mean stalled fractions over the second half of the run.
    pub mean_stall_m: Option<f64>,
    pub mean_stall_v: Option<f64>,
    pub mean_stall_w: Option<f64>,
    /// The same under the paper's estimator (unchanged / all entries; absent in records made
    /// before it was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_unchanged_m: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_unchanged_v: Option<f64>,
    /// Mean stalled fraction (stalled / updated) of SOAP's preconditioners L and R over the
    /// second half; absent for AdamW runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_stall_precond: Option<f64>,
    /// The theory's stalled fraction of v (`lowbit_optim::theory`) for the run's v format.
    pub theory_stall_v: Option<f64>,
    /// Final validation loss not finite or above the initial one.
    pub diverged: bool,
    /// Steps and training tokens of the run, parameters of its model.
    pub steps: u64,
    pub tokens: u64,
    pub params: usize,
    /// The run's setting: peak learning rate, target tokens per optimizer step, passes over
    /// the training text (absent in records made before they were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passes: Option<f64>,
    /// Mean per step over the second half of the updates made with v = 0 and m != 0 (each
    /// moved by lr * m^ / eps; absent in records made before it was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_zero_v: Option<f64>,
    /// Where the run was made ([`crate::provenance`]): the card (`nvidia-smi`'s name, or
    /// `cpu`), the binary's git commit and the UTC date it finished (`YYYY-MM-DD`). Records made
    /// before they were kept have them from the device logs (`records/README.md`), or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
}

impl Record {
    /// The record of a run of peak learning rate `lr` from its `summary.json`.
    pub fn from_summary(key: RunKey, fingerprint: String, lr: f64, s: &Summary) -> Record {
        let diverged = match (s.final_val_loss, s.initial_val_loss) {
            (Some(f), Some(i)) => !f.is_finite() || f > i,
            (Some(f), None) => !f.is_finite(),
            (None, _) => false,
        };
        Record {
            states: key.states,
            cell: key.cell,
            seed: key.seed,
            fingerprint,
            initial_val_loss: s.initial_val_loss,
            final_val_loss: s.final_val_loss,
            mean_stall_m: s.mean_stall_m,
            mean_stall_v: s.mean_stall_v,
            mean_stall_w: s.mean_stall_w,
            mean_unchanged_m: s.mean_unchanged_m,
            mean_unchanged_v: s.mean_unchanged_v,
            mean_stall_precond: s.mean_stall_precond,
            theory_stall_v: s.theory_stall_v,
            diverged,
            steps: s.steps,
            tokens: s.tokens,
            params: s.params,
            lr: Some(lr),
            tokens_per_step: (s.steps > 0).then(|| s.tokens / s.steps),
            passes: s.epochs,
            mean_zero_v: s.mean_zero_v,
            card: None,
            binary: None,
            date: None,
        }
    }
    /// The record's key.
    pub fn key(&self) -> RunKey {
        RunKey { states: self.states.clone(), cell: self.cell.clone(), seed: self.seed }
    }
    /// The numbers a report uses.
    pub fn result(&self) -> RunResult {
        RunResult {
            val_loss: self.final_val_loss,
            stall_m: self.mean_stall_m,
            stall_v: self.mean_stall_v,
            stall_w: self.mean_stall_w,
            unchanged_m: self.mean_unchanged_m,
            unchanged_v: self.mean_unchanged_v,
            stall_precond: self.mean_stall_precond,
            theory_v: self.theory_stall_v,
            diverged: self.diverged,
        }
    }
}

/// The most seconds a command's `wall_s` is believed (a year): a larger, negative or
/// non-finite value gives no run length ([`CommandLog::run_seconds`]).
pub const MAX_WALL_S: f64 = 365.0 * 24.0 * 3600.0;

/// One command that added runs to the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandLog {
    /// The command line (`train reproduce ...`).
    pub command: String,
    /// Runs it finished, and its seconds.
    pub runs: usize,
    pub wall_s: f64,
    /// Runs at once, and GPUs they were spread over (0: CPU).
    pub jobs: usize,
    pub gpus: usize,
    /// The states kinds of the runs it finished (`paper`, `blockwise`, `theory`, `shared`), so
    /// that each report lists only the commands that made its runs. Empty in files written
    /// before the field existed: such a command is listed in every report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<String>,
}

impl CommandLog {
    /// Whether this command made runs of the report of states kind `kind` (its own runs, or
    /// for `paper` and `blockwise` the [`SHARED`] FP32/BF16 runs); a command of unknown kinds
    /// counts.
    pub fn made_runs_of(&self, kind: States) -> bool {
        self.states.is_empty() || self.states.iter().any(|s| s == kind.as_str() || (kind != States::Theory && s == SHARED))
    }

    /// Seconds one of its runs took, modelling the command as waves of `jobs` runs at once:
    /// `wall_s / ceil(runs / jobs)` (start-up of the command included); `None` for a command
    /// that finished no run, or whose `wall_s` is not a number of seconds in
    /// `0..=`[`MAX_WALL_S`] (a hand-edited or corrupt file: the length is then unknown).
    pub fn run_seconds(&self) -> Option<f64> {
        let plausible = self.wall_s.is_finite() && (0.0..=MAX_WALL_S).contains(&self.wall_s);
        (self.runs > 0 && plausible).then(|| self.wall_s / self.runs.div_ceil(self.jobs.max(1)) as f64)
    }
}

/// A planned run as the results file sees it: its key and config fingerprint.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The run's key in the file.
    pub key: RunKey,
    /// The cell (the key's `cell`, typed).
    pub cell: Cell,
    /// [`fingerprint`] of the run's resolved config.
    pub fingerprint: String,
}

/// The results file: finished runs of one table at one scale, and the commands that made them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultsFile {
    /// `--table` and `--scale` of the runs (checked on load).
    pub table: String,
    pub scale: String,
    /// The commands that added runs, oldest first.
    pub commands: Vec<CommandLog>,
    /// Sorted by key.
    pub runs: Vec<Record>,
}

impl ResultsFile {
    /// An empty file for a table and scale.
    pub fn new(table: Table, scale: Scale) -> Self {
        ResultsFile { table: table.as_str().into(), scale: scale.as_str().into(), commands: vec![], runs: vec![] }
    }

    /// Seconds a run takes with `jobs` at once, as the newest command of the file that ran
    /// that many at once measured it ([`CommandLog::run_seconds`]); `None` when none did.
    pub fn expected_run_seconds(&self, jobs: usize) -> Option<f64> {
        self.commands.iter().rev().find(|c| c.jobs == jobs).and_then(CommandLog::run_seconds)
    }

    /// Read `path`, or an empty file when it does not exist; an error names the file when it
    /// does not parse or holds another table or scale.
    pub fn load(path: &Path, table: Table, scale: Scale) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::new(table, scale)),
            Err(e) => return Err(e).with_context(|| format!("cannot read results file {}", path.display())),
        };
        let f: ResultsFile = serde_json::from_str(&text).with_context(|| format!("results file {} does not parse", path.display()))?;
        if (f.table.as_str(), f.scale.as_str()) != (table.as_str(), scale.as_str()) {
            bail!(
                "results file {} holds table {} at scale {}, not {} at {}",
                path.display(),
                f.table,
                f.scale,
                table.as_str(),
                scale.as_str()
            );
        }
        Ok(f)
    }

    /// Write the file (through a temporary file and a rename, so a command stopped at its
    /// time limit leaves the previous complete file), creating its folder.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        let text = serde_json::to_string_pretty(self).expect("results serialise") + "\n";
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write results file {}", path.display()))
    }

    /// Add or replace (same key) a run's record.
    pub fn upsert(&mut self, r: Record) {
        match self.runs.binary_search_by(|x| x.key().cmp(&r.key())) {
            Ok(i) => self.runs[i] = r,
            Err(i) => self.runs.insert(i, r),
        }
    }

    /// Merge another file of the same table and scale into this one: its records replace
    /// those of the same key, its commands are added (each once).
    pub fn merge(&mut self, other: ResultsFile) {
        for c in other.commands {
            if !self.commands.contains(&c) {
                self.commands.push(c);
            }
        }
        for r in other.runs {
            self.upsert(r);
        }
    }

    /// The record of a planned run, if the file holds it with the same fingerprint.
    pub fn find(&self, p: &Planned) -> Option<&Record> {
        self.runs.iter().find(|r| r.key() == p.key && r.fingerprint == p.fingerprint)
    }

    /// Seeds with at least one record.
    pub fn seeds(&self) -> Vec<usize> {
        let mut s: Vec<usize> = self.runs.iter().map(|r| r.seed).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The results of the planned runs found in the file (same key and fingerprint), by cell
    /// and seed.
    pub fn results(&self, plan: &[Planned]) -> Results {
        let mut out = Results::new();
        for p in plan {
            let Some(r) = self.find(p) else { continue };
            let slot = out.entry(p.cell).or_default();
            if slot.len() <= p.key.seed {
                slot.resize(p.key.seed + 1, None);
            }
            slot[p.key.seed] = Some(r.result());
        }
        out
    }
}

/// The key of a run of `table`'s `cell` with states kind label `states` and `seed`.
pub fn run_key(states: &str, table: Table, cell: Cell, seed: usize) -> RunKey {
    RunKey { states: states.into(), cell: cell_short(table, &cell), seed }
}
