//! `train stalls RUN`: the latest and running-mean stalled fractions per group (or tensor)
//! for m, v, BF16 weights and (a SOAP run's only) the preconditioners L and R, next to the theory prediction for v and the difference, under
//! lowbit's estimator (stalled / updated) or the paper's (`--estimator paper`: unchanged / all
//! entries); beside v, `v=0 moves`: the mean count per step of elements updated with v = 0 and
//! m != 0, each moved by lr * m^ / eps (`lowbit_optim::StallCounts::zero_v`; `-` in runs from
//! before it was counted).
//! `--follow` redraws while the run writes (on a terminal in place; into a file or a pipe one
//! table after the other, separated by a blank line); a partly written last line is ignored.

use anyhow::Result;
use lowbit_optim::{OptimizerKind, ScaleChoice};
use lowbit_train::config::RunConfig;
use lowbit_train::logs::metrics::read_rows;
use lowbit_train::logs::stalls::{Fractions, StallRow};
use lowbit_train::logs::summary::mean;
use lowbit_train::output::fixed;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Which estimator of the stalled fraction (`lowbit_optim::states::stalls`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Estimator {
    /// lowbit's: stalled / elements with a non-zero FP32 update.
    #[default]
    Updated,
    /// The paper's (arXiv:2603.16731v1, Alg. 2): entries whose stored code is unchanged / all
    /// entries, zero gradients included.
    Paper,
}

impl Estimator {
    /// The (m, v, w, preconditioners) fractions of this estimator.
    pub fn of(self, f: &Fractions) -> [Option<f64>; 4] {
        match self {
            Estimator::Updated => [f.m, f.v, f.w, f.precond],
            Estimator::Paper => [f.m_unchanged, f.v_unchanged, f.w_unchanged, f.precond_unchanged],
        }
    }
}

/// Command-line arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct StallsArgs {
    /// Run folder (holding stalls.jsonl).
    pub run: PathBuf,
    /// Keep redrawing while the run is in progress: waits for a run that is starting, stops when
    /// it ends (summary.json), when no live process holds its folder (killed), or when the
    /// output's reader has gone.
    #[arg(long)]
    pub follow: bool,
    /// Rows per tensor group or per tensor (per-tensor rows come every run.stall_detail_every steps).
    #[arg(long, value_enum, default_value = "group")]
    pub by: By,
    /// Show one state only.
    #[arg(long, value_enum)]
    pub state: Option<State>,
    /// Which stalled fraction: `updated` (stalled / elements with a non-zero update) or
    /// `paper` (unchanged / all entries, the paper's Alg. 2). JSON output has both.
    #[arg(long, value_enum, default_value = "updated")]
    pub estimator: Estimator,
    /// Steps in the running mean (0 = the whole run).
    #[arg(long, default_value_t = 100)]
    pub window: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds between redraws with --follow, 0.1 to 3600.
    #[arg(long, default_value_t = 2.0, value_parser = redraw_interval)]
    pub interval: f64,
}

/// `--interval`: seconds in [0.1, 3600] (`inf`, `nan` or 1e20 would not fit a sleep).
fn redraw_interval(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if (0.1..=3600.0).contains(&t) => Ok(t),
        _ => Err(format!("{s:?}: expected seconds between 0.1 and 3600")),
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Group,
    Tensor,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    M,
    V,
    W,
    /// SOAP's preconditioners L and R (a column only for runs that have them).
    Precond,
}

/// One table line: latest and mean stalled fraction of m, v, w (and SOAP's preconditioners).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Line {
    pub name: String,
    pub latest: Fractions,
    pub mean: Fractions,
}

/// The whole table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Table {
    pub step: u64,
    pub rows_read: usize,
    /// `--window` as given (0 = the whole run).
    pub window: usize,
    /// Steps in the window (fewer than `window` early in a run).
    pub window_steps: usize,
    /// Rows the means are taken over: every step of the window by group; with `--by tensor`
    /// only the per-tensor rows in it (one every `run.stall_detail_every` steps).
    pub averaged: usize,
    pub theory_v: Option<f64>,
    pub lines: Vec<Line>,
}

fn mean_fractions<'a>(fs: impl Iterator<Item = &'a Fractions> + Clone) -> Fractions {
    let m = |pick: fn(&Fractions) -> Option<f64>| mean(fs.clone().map(pick));
    Fractions {
        m: m(|f| f.m),
        v: m(|f| f.v),
        w: m(|f| f.w),
        precond: m(|f| f.precond),
        m_unchanged: m(|f| f.m_unchanged),
        v_unchanged: m(|f| f.v_unchanged),
        w_unchanged: m(|f| f.w_unchanged),
        precond_unchanged: m(|f| f.precond_unchanged),
        zero_v: m(|f| f.zero_v),
    }
}

/// Build the table from parsed rows.
pub fn table(rows: &[StallRow], by: By, window: usize) -> Table {
    let recent = if window == 0 { rows } else { &rows[rows.len().saturating_sub(window)..] };
    let pick = |r: &StallRow| -> Option<BTreeMap<String, Fractions>> {
        match by {
            By::Group => {
                let mut g = r.groups.clone();
                g.insert("all".into(), r.frac.clone());
                Some(g)
            }
            By::Tensor => r.tensors.clone(),
        }
    };
    let detailed: Vec<BTreeMap<String, Fractions>> = recent.iter().filter_map(pick).collect();
    let latest = detailed.last().cloned().unwrap_or_default();
    let mut lines: Vec<Line> = latest
        .iter()
        .map(|(name, f)| Line { name: name.clone(), latest: f.clone(), mean: mean_fractions(detailed.iter().filter_map(|d| d.get(name))) })
        .collect();
    // "all" last, as a total line
    if let Some(i) = lines.iter().position(|l| l.name == "all") {
        let all = lines.remove(i);
        lines.push(all);
    }
    Table {
        step: rows.last().map_or(0, |r| r.step),
        rows_read: rows.len(),
        window,
        window_steps: recent.len(),
        averaged: detailed.len(),
        theory_v: rows.last().and_then(|r| r.theory.v),
        lines,
    }
}

/// Render as text; `state` limits the columns, `estimator` picks the fractions. The
/// preconditioners' columns appear only when some line has a fraction of them (a SOAP run).
pub fn render(t: &Table, state: Option<State>, estimator: Estimator, header: &str) -> String {
    let soap = t.lines.iter().any(|l| [&l.latest, &l.mean].iter().any(|f| f.precond.is_some() || f.precond_unchanged.is_some()));
    let show = |s: State| state.is_none_or(|x| x == s) && (s != State::Precond || soap);
    let width = t.lines.iter().map(|l| l.name.len()).max().unwrap_or(5).max(5);
    let steps = if t.window == 0 || t.window_steps < t.window {
        format!("all {} steps", t.window_steps)
    } else {
        format!("the last {} steps", t.window_steps)
    };
    let over = if t.averaged == t.window_steps { steps } else { format!("the {} per-tensor rows of {steps}", t.averaged) };
    let what = match estimator {
        Estimator::Updated => "stalled / updated elements",
        Estimator::Paper => "the paper's estimator: unchanged / all entries",
    };
    let mut out = format!("{header}step {} ({} rows; mean over {over}; {what})\n", t.step, t.rows_read);
    let mut head = format!("{:<width$}", "name");
    if show(State::M) {
        head += "  m latest  m mean";
    }
    if show(State::V) {
        head += "  v latest  v mean  theory    diff  v=0 moves";
    }
    if show(State::W) {
        head += "  w latest  w mean";
    }
    if show(State::Precond) {
        head += "  precond latest  precond mean";
    }
    out += &head;
    out.push('\n');
    for l in &t.lines {
        let ([lm, lv, lw, lp], [mm, mv, mw, mp]) = (estimator.of(&l.latest), estimator.of(&l.mean));
        let mut s = format!("{:<width$}", l.name);
        if show(State::M) {
            s += &format!("  {:>8}  {:>6}", fixed(lm, 3), fixed(mm, 3));
        }
        if show(State::V) {
            // (a group without v, Muon's matrices, has no v theory either)
            let theory = mv.and(t.theory_v);
            let diff = mv.zip(theory).map(|(a, b)| format!("{:+.3}", a - b)).unwrap_or("-".into());
            s += &format!(
                "  {:>8}  {:>6}  {:>6}  {:>6}  {:>9}",
                fixed(lv, 3),
                fixed(mv, 3),
                fixed(theory, 3),
                diff,
                fixed(mv.and(l.mean.zero_v), 1)
            );
        }
        if show(State::W) {
            s += &format!("  {:>8}  {:>6}", fixed(lw, 3), fixed(mw, 3));
        }
        if show(State::Precond) {
            s += &format!("  {:>14}  {:>12}", fixed(lp, 3), fixed(mp, 3));
        }
        out += &s;
        out.push('\n');
    }
    out
}

/// The table's first line: the run's optimizer (when SOAP or Muon), states and b2, from its
/// `config.toml` (empty when that cannot be read as a run config).
fn describe(run: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(run.join("config.toml")) else { return String::new() };
    let Ok(cfg) = toml::from_str::<RunConfig>(&text) else { return String::new() };
    let st = &cfg.optim.states;
    let scale = match st.scale {
        ScaleChoice::Default => "",
        ScaleChoice::Amax => ", amax scales",
        ScaleChoice::Pow2 => ", pow2 scales",
    };
    let soap = match cfg.optim.kind {
        OptimizerKind::Soap => {
            let lr = cfg.optim.soap.precond_format.map_or("m's format".to_string(), |f| f.name().to_string());
            format!("SOAP (L and R in {lr}, refresh every {} updates), ", cfg.optim.soap.precondition_frequency)
        }
        OptimizerKind::Muon => {
            let mu = &cfg.optim.muon;
            format!("Muon (momentum {}{}, m only on its matrices), ", mu.momentum, if mu.nesterov { " Nesterov" } else { "" })
        }
        OptimizerKind::Adamw => String::new(),
    };
    format!(
        "{}: {soap}m {} ({}), v {} ({}){scale}, b2 {}\n",
        run.display(),
        st.m_format,
        st.m_rounding.as_str(),
        st.v_format,
        st.v_rounding.as_str(),
        cfg.optim.beta2
    )
}

/// Where a followed run stands: writing, ended (its `summary.json`), or gone without one.
enum Standing {
    Live,
    /// `status` and `steps` from `summary.json`.
    Ended(String, Option<u64>),
    /// No summary and no live process holds the folder's lock: killed or crashed.
    Gone,
}

fn standing(run: &Path) -> Standing {
    match std::fs::read(run.join("summary.json")) {
        Ok(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            Standing::Ended(v["status"].as_str().unwrap_or("ended").to_string(), v["steps"].as_u64())
        }
        Err(_) if lowbit_train::run_folder::live_holder(run).is_some() => Standing::Live,
        Err(_) => Standing::Gone,
    }
}

/// The last line of a `--follow` that stops: how the run ended, and how to go on.
fn end_line(run: &Path, status: &str, steps: Option<u64>) -> String {
    let at = steps.map_or(String::new(), |s| format!(" at step {s}"));
    match status {
        "finished" => "run finished".into(),
        "interrupted" => format!("run interrupted{at}; resume with: train --resume {}", run.display()),
        other => format!("run ended ({other}){at}"),
    }
}

/// `train stalls`. With `--follow`: waits for a folder without `stalls.jsonl` yet (a run
/// starting), redraws while it runs, and stops when it ends (saying how: finished,
/// interrupted, non-finite), when no live process holds its folder any more (killed or
/// crashed), or when the reader of the output has gone (`| head -1`).
pub fn run(a: &StallsArgs) -> Result<()> {
    let path = a.run.join("stalls.jsonl");
    let terminal = std::io::stdout().is_terminal();
    let mut first = true;
    let mut waited = false;
    loop {
        let now = standing(&a.run);
        if !path.is_file() {
            if !a.follow {
                anyhow::bail!("{}: no stalls.jsonl (not a run folder, or its run has not written a step yet)", a.run.display());
            }
            // the run may be starting: it loads data and model before it claims the folder
            if !std::mem::replace(&mut waited, true) {
                lowbit_train::errln!("{}: no stalls.jsonl yet; waiting for the run to start (Ctrl-C to stop)", a.run.display());
            }
            std::thread::sleep(std::time::Duration::from_secs_f64(a.interval));
            continue;
        }
        let rows: Vec<StallRow> = read_rows(&path)?;
        if a.state == Some(State::Precond) && !rows.is_empty() && rows.iter().all(|r| r.precond.is_empty()) {
            anyhow::bail!(
                "{}: --state precond: this run has no preconditioner counts (an AdamW run; SOAP's runs have them)",
                a.run.display()
            );
        }
        let t = table(&rows, a.by, a.window);
        let mut text = String::new();
        if a.json {
            text = format!("{}\n", serde_json::to_string(&t)?);
        } else {
            if a.follow && terminal {
                text += "\x1b[2J\x1b[H"; // clear screen, cursor home
            } else if a.follow && !first {
                text += "\n"; // into a file or a pipe: one table after the other
            }
            text += &render(&t, a.state, a.estimator, &describe(&a.run));
            if a.by == By::Tensor && t.lines.is_empty() {
                text += "(no per-tensor rows yet: they are written every run.stall_detail_every steps)\n";
            }
        }
        let end = match (&now, a.follow) {
            (_, false) | (Standing::Live, true) => None,
            (Standing::Ended(status, steps), true) => Some(end_line(&a.run, status, *steps)),
            (Standing::Gone, true) => Some(format!(
                "the run is not running (no live process holds {}) and wrote no summary.json: it was killed or \
                 crashed; resume with: train --resume {}",
                a.run.join("train.lock").display(),
                a.run.display()
            )),
        };
        if let Some(line) = &end {
            text += &format!("{line}\n");
        }
        if lowbit_train::output::try_print(&text).is_err() || end.is_some() || !a.follow {
            return Ok(()); // done, or the reader has gone
        }
        first = false;
        std::thread::sleep(std::time::Duration::from_secs_f64(a.interval));
    }
}
