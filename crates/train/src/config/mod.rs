//! The run config: one TOML file with sections `[model]`, `[data]`, `[optim]`
//! (+ `[optim.states]`), `[train]`, `[run]`. Precedence: defaults < file (and the files it
//! `extends`) < `--set section.key=value`. Unknown keys and bad values are errors naming the
//! file, key and line; the resolved config is written to the run folder.

use anyhow::{bail, Context, Result};
use lowbit_data::DataConfig;
use lowbit_model::LlamaConfig;
use lowbit_optim::{MuonConfig, OptimizerKind, SoapConfig, StatesConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod load;
mod model;
pub use load::apply_override;
use load::{find_key_line, key_of_message, load_value, locate_merged, located, with_choices};
pub use model::{KernelChoice, MatmulPrecision, ModelSection, WeightDtype};

/// The whole run configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Path of a base config whose values this file overrides (relative to this file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    pub model: ModelSection,
    pub data: DataConfig,
    #[serde(default)]
    pub optim: OptimSection,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub run: RunSection,
}

/// `[optim]`: the optimizer, its hyper-parameters and the learning-rate schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
    /// `adamw` (default), `soap` (SOAP with the same state formats, `[optim.soap]`) or `muon`
    /// (Muon for the attention and MLP matrices, its momentum in m's format, `[optim.muon]`;
    /// AdamW for the rest); left out of the resolved config when `adamw`.
    #[serde(skip_serializing_if = "OptimizerKind::is_adamw")]
    pub kind: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay on matrices (not on norm gains).
    pub weight_decay: f64,
    /// Linear warmup steps from 0 to `lr`.
    pub warmup_steps: u64,
    /// Cosine decay ends at `min_lr_ratio * lr` at `train.max_steps`.
    pub min_lr_ratio: f64,
    /// Clip the global gradient norm to this value (0 = off).
    pub grad_clip: f64,
    /// Low-precision state settings.
    pub states: StatesConfig,
    /// SOAP's settings (`optim.kind = "soap"`; left out of the resolved config at their
    /// defaults).
    #[serde(skip_serializing_if = "SoapConfig::is_default")]
    pub soap: SoapConfig,
    /// Muon's settings (`optim.kind = "muon"`; left out of the resolved config at their
    /// defaults).
    #[serde(skip_serializing_if = "MuonConfig::is_default")]
    pub muon: MuonConfig,
}

impl Default for OptimSection {
    fn default() -> Self {
        OptimSection {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 100,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
            states: StatesConfig::default(),
            kind: OptimizerKind::Adamw,
            soap: SoapConfig::default(),
            muon: MuonConfig::default(),
        }
    }
}

/// The first key (by name) of a config section whose value is not its default, if any (a key
/// the section leaves out at its default, such as `optim.soap.precond_format`, counts when set).
fn changed_key<T: Serialize + Default>(section: &T) -> Option<String> {
    let table = |t: &T| match toml::Value::try_from(t) {
        Ok(toml::Value::Table(m)) => m,
        _ => toml::map::Map::new(),
    };
    let (now, default) = (table(section), table(&T::default()));
    now.keys().chain(default.keys()).find(|k| now.get(*k) != default.get(*k)).cloned()
}

/// The largest `train.grad_accum` (a million micro-batches per step): a larger one is refused
/// at validation (it aborted in an allocation after the run folder was claimed).
pub const MAX_GRAD_ACCUM: usize = 1_000_000;

/// `[train]`: batch, length, evaluation and fault handling.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Seed of the initialisation and of the stochastic-rounding streams.
    pub seed: u64,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per optimizer step, over all ranks: the global batch is `micro_batch *
    /// grad_accum` sequences whatever the rank count (the paper's 512 on 1 GPU or 8), and
    /// each of W ranks accumulates `grad_accum / W` ([`TrainSection::accum_per_rank`]).
    pub grad_accum: usize,
    /// Optimizer steps.
    pub max_steps: u64,
    /// Evaluate validation loss every this many steps (and at the end); 0 = only at the end.
    pub eval_every: u64,
    /// "cpu" or "cuda" (also `--device`).
    pub device: String,
    /// Write a checkpoint every this many steps (default 500), and always at the end and on
    /// Ctrl-C or SIGTERM; 0 = only then.
    pub checkpoint_every: u64,
    /// Keep this many most recent checkpoints (at least 1; older ones are deleted).
    pub keep_checkpoints: usize,
    /// Stop (with a checkpoint) after this many consecutive non-finite steps (0 acts as 1:
    /// stop at the first).
    pub max_nonfinite_steps: u64,
    /// ZeRO stage with several ranks (`train --gpus N`): 0 = every rank keeps all optimizer
    /// states; 1 = each rank keeps and updates the states of its shard of every tensor, then
    /// the weights are all-gathered (same updates bit for bit). Left out of the resolved TOML
    /// when 0, so that a single-process run's config (and its fingerprint in a reproduction's
    /// results file) reads as it did before data parallelism existed.
    #[serde(skip_serializing_if = "is_zero")]
    pub zero: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

impl TrainSection {
    /// Whether the loop validates after step `step` (besides the last).
    pub fn validates_at(&self, step: u64) -> bool {
        self.eval_every > 0 && step.is_multiple_of(self.eval_every)
    }

    /// Micro-batches each of `ranks` data-parallel ranks accumulates per optimizer step:
    /// `grad_accum / ranks`, so that the global batch (`micro_batch * grad_accum` sequences)
    /// does not depend on the rank count.
    ///
    /// # Errors
    /// `ranks` does not divide `grad_accum`: the message gives both numbers and the settings
    /// that keep the global batch.
    pub fn accum_per_rank(&self, ranks: usize) -> Result<usize> {
        let (mb, ga) = (self.micro_batch, self.grad_accum);
        if ranks > 0 && ga.is_multiple_of(ranks) {
            return Ok(ga / ranks);
        }
        let global = mb.saturating_mul(ga);
        let keep = match ranks > 0 && global.is_multiple_of(ranks) {
            true => format!("e.g. --set train.micro_batch={} --set train.grad_accum={ranks} (the same global batch)", global / ranks),
            false => format!("the global batch of {global} is not a multiple of {ranks}: change it or the rank count"),
        };
        bail!(
            "train.grad_accum = {ga} cannot be split over {ranks} ranks (the global batch is train.micro_batch {mb} x \
             train.grad_accum {ga} = {global} sequences per step, and each rank accumulates grad_accum / ranks \
             micro-batches): use a rank count that divides {ga}, or {keep}"
        )
    }

    /// Whether the loop checkpoints after step `step` (besides the last and a stop).
    pub fn checkpoints_at(&self, step: u64) -> bool {
        self.checkpoint_every > 0 && step.is_multiple_of(self.checkpoint_every)
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            seed: 0,
            micro_batch: 8,
            grad_accum: 1,
            max_steps: 1000,
            eval_every: 0,
            device: "cpu".into(),
            checkpoint_every: 500,
            keep_checkpoints: 2,
            max_nonfinite_steps: 10,
            zero: 0,
        }
    }
}

/// `[run]`: where outputs go and how detailed the stall log is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Run name: outputs in `<dir>/<name>/`.
    pub name: String,
    /// Parent folder of run folders.
    pub dir: String,
    /// Write per-tensor stall detail every this many steps (0 = never).
    pub stall_detail_every: u64,
    /// Write plots at the end of the run.
    pub plots: bool,
    /// Write the curves as TensorBoard scalars too, in `<run>/tensorboard/` (on by default;
    /// [`crate::logs::tensorboard`]). Left out of the resolved TOML when on, so that configs
    /// (and reproduction fingerprints) read as before the key existed.
    #[serde(skip_serializing_if = "is_true")]
    pub tensorboard: bool,
}

fn is_true(v: &bool) -> bool {
    *v
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection { name: "run".into(), dir: "runs".into(), stall_detail_every: 100, plots: true, tensorboard: true }
    }
}

impl RunConfig {
    /// Load `path` (following `extends`), apply `--set` overrides, validate.
    ///
    /// Errors are one line naming the file and line (`file:line:col: what is wrong
    /// (in [section] `line text`)`), or the `--set` override that caused them.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let mut files = Vec::new();
        let mut value = load_value(path, 0, &mut files)?;
        let direct = files.len() == 1 && overrides.is_empty();
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        let parsed = if direct {
            // One file, no overrides: parse the text itself so errors carry the line.
            let (p, text) = &files[0];
            toml::from_str(text).map_err(|e| located(p, text, &e))
        } else {
            RunConfig::deserialize(value.clone()).map_err(|e| locate_merged::<RunConfig>(&files, overrides, &e))
        };
        let cfg: RunConfig = parsed.map_err(|e| with_choices::<RunConfig>(e, &value))?;
        cfg.validate().map_err(|e| {
            let msg = format!("{e:#}");
            match key_of_message(&msg).and_then(|k| find_key_line(&files, overrides, &k)) {
                Some(loc) => anyhow::anyhow!("invalid config {loc}: {msg}"),
                None => anyhow::anyhow!("invalid config {}: {msg}", path.display()),
            }
        })?;
        Ok(cfg)
    }

    /// Parse a config from a TOML string (no `extends`), for tests and embedded defaults.
    pub fn from_toml(text: &str) -> Result<Self> {
        let cfg: RunConfig = toml::from_str(text).map_err(|e| located(Path::new("<config>"), text, &e))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that serde cannot express.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        for (k, v) in [
            ("train.micro_batch", t.micro_batch as u64),
            ("train.grad_accum", t.grad_accum as u64),
            ("train.max_steps", t.max_steps),
            ("train.keep_checkpoints", t.keep_checkpoints as u64),
        ] {
            if v == 0 {
                bail!("{k}: must be > 0");
            }
        }
        if t.grad_accum > MAX_GRAD_ACCUM {
            bail!("train.grad_accum: must be in 1..={MAX_GRAD_ACCUM} (micro-batches per optimizer step), got {}", t.grad_accum);
        }
        if t.zero > 1 {
            bail!("train.zero: expected 0 (no sharding) or 1 (optimizer states sharded over ranks), got {}", t.zero);
        }
        if !["cpu", "cuda"].contains(&t.device.as_str()) {
            bail!("train.device: expected \"cpu\" or \"cuda\", got {:?}", t.device);
        }
        self.check_optim()?;
        for (k, v) in [("model.rms_norm_eps", self.model.rms_norm_eps), ("model.rope_theta", self.model.rope_theta)] {
            if v.is_some_and(|v| !(v > 0.0 && v.is_finite())) {
                bail!("{k}: must be a positive number, got {}", v.unwrap_or_default());
            }
        }
        for (k, v) in [("data.seq_len", self.data.seq_len), ("data.val_tokens", self.data.val_tokens)] {
            if v == 0 {
                bail!("{k}: must be > 0");
            }
        }
        lowbit_data::check_shuffle_buffer(self.data.shuffle_buffer).map_err(anyhow::Error::msg)?;
        if self.run.dir.is_empty() {
            bail!("run.dir: must name a folder (\".\" for the working directory), got \"\"");
        }
        let n = &self.run.name;
        if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\\']) {
            bail!("run.name: must be a folder name inside run.dir (no `/`, `\\`, `.` or `..`), got {n:?}");
        }
        if n.trim().is_empty() || n.trim() != n || n.chars().any(char::is_control) {
            bail!("run.name: must be a folder name without control characters (a newline, a tab) or leading or trailing blanks, got {n:?}");
        }
        Ok(())
    }

    /// `[optim]`'s ranges (and its states' and SOAP's settings, [`lowbit_optim::StatesConfig::resolve`],
    /// [`SoapConfig::validate`]); SOAP's settings are refused without `optim.kind = "soap"`.
    fn check_optim(&self) -> Result<()> {
        let o = &self.optim;
        if !(o.lr > 0.0 && o.lr.is_finite()) {
            bail!("optim.lr: must be a positive number, got {}", o.lr);
        }
        for (k, b) in [("optim.beta1", o.beta1), ("optim.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&b) {
                bail!("{k}: must be in [0, 1), got {b}");
            }
        }
        if !(0.0..=1.0).contains(&o.min_lr_ratio) {
            bail!("optim.min_lr_ratio: must be in [0, 1], got {}", o.min_lr_ratio);
        }
        if !(o.eps > 0.0 && o.eps.is_finite()) {
            bail!("optim.eps: must be a positive number, got {}", o.eps);
        }
        // the optimizer computes in FP32: a value that rounds to 0 or a subnormal there is not
        // the one configured (eps = 1e-60 is 0, and v = 0 then divides by zero)
        for (k, v) in [("optim.lr", o.lr), ("optim.eps", o.eps)] {
            if (v as f32) < f32::MIN_POSITIVE {
                bail!("{k}: {v} is below FP32's smallest normal number {:e} (the optimizer computes in FP32)", f32::MIN_POSITIVE);
            }
        }
        for (k, v) in [("optim.weight_decay", o.weight_decay), ("optim.grad_clip", o.grad_clip)] {
            if !(v >= 0.0 && v.is_finite()) {
                bail!("{k}: must be a number >= 0, got {v}");
            }
        }
        o.states.resolve(o.beta2).map_err(anyhow::Error::msg)?;
        if o.kind == OptimizerKind::Soap {
            o.soap.validate().map_err(anyhow::Error::msg)?;
            self.check_soap()?;
        }
        if o.kind == OptimizerKind::Muon {
            o.muon.validate().map_err(anyhow::Error::msg)?;
            self.check_muon()?;
        }
        // a rule's own section set for another rule
        for (rule, name, key) in [(OptimizerKind::Soap, "SOAP", changed_key(&o.soap)), (OptimizerKind::Muon, "Muon", changed_key(&o.muon))]
        {
            if let Some(key) = key.filter(|_| o.kind != rule) {
                let kind = rule.as_str();
                bail!(
                    "optim.{kind}.{key}: {name}'s setting, read only with optim.kind = \"{kind}\" (optim.kind is \"{}\"): set optim.kind or remove it",
                    o.kind.as_str()
                );
            }
        }
        Ok(())
    }

    /// The settings Muon does not take (`optim.kind = "muon"`): sharded states (Newton-Schulz
    /// needs each whole matrix), stochastically rounded BF16 weights (the Muon matrices'
    /// weights round to nearest), and the resets that read v (the adaptive rule, `"auto"`
    /// periods for the matrices' m).
    fn check_muon(&self) -> Result<()> {
        let s = &self.optim.states;
        if self.train.zero != 0 {
            bail!("train.zero: Muon orthogonalises whole matrices, its states are not sharded; optim.kind = \"muon\" needs train.zero = 0, got {}", self.train.zero);
        }
        if self.model.dtype == WeightDtype::Bf16 && s.weight_rounding != lowbit_optim::Rounding::Nearest {
            bail!(
                "optim.states.weight_rounding = \"{}\": Muon's matrices round their BF16 weights to nearest; with optim.kind = \"muon\" and BF16 weights it must be \"nearest\"",
                s.weight_rounding.as_str()
            );
        }
        if s.reset == lowbit_optim::ResetRule::Adaptive {
            bail!("optim.states.reset = \"adaptive\": the rule watches v's stalls, and Muon's matrices keep no v; with optim.kind = \"muon\" use periodic resets (m_reset_every)");
        }
        for g in ["attn", "mlp"] {
            let (key, every) = match s.groups.get(g).and_then(|c| c.m_reset_every) {
                Some(e) => (format!("groups.{g}.m_reset_every"), e),
                None => ("m_reset_every".to_string(), s.m_reset_every),
            };
            if every == lowbit_optim::ResetEvery::Auto {
                bail!("optim.states.{key} = \"auto\": K* follows from v's format and b2, and Muon's attention and MLP matrices keep no v; with optim.kind = \"muon\" give their m a period in updates");
            }
        }
        Ok(())
    }

    /// The settings SOAP does not take (`optim.kind = "soap"`): AdamW's simulated-stalling
    /// probe, a v reset that keeps idle elements, dithered states and sharded states.
    fn check_soap(&self) -> Result<()> {
        let s = &self.optim.states;
        let dither = |r: Option<lowbit_optim::Rounding>| r == Some(lowbit_optim::Rounding::Dither);
        let groups = s
            .groups
            .iter()
            .flat_map(|(g, c)| [(format!("groups.{g}.m_rounding"), c.m_rounding), (format!("groups.{g}.v_rounding"), c.v_rounding)]);
        let keys =
            [("m_rounding".to_string(), Some(s.m_rounding)), ("v_rounding".to_string(), Some(s.v_rounding))].into_iter().chain(groups);
        if let Some((key, _)) = keys.into_iter().find(|(_, r)| dither(*r)) {
            bail!("optim.states.{key} = \"dither\": dither is AdamW's for now (SOAP's refresh rotates the stored moments); use \"stochastic\" with optim.kind = \"soap\"");
        }
        for (k, p) in [("m_skip_prob", s.m_skip_prob), ("v_skip_prob", s.v_skip_prob)] {
            if p != 0.0 {
                bail!("optim.states.{k}: simulated stalling is AdamW's probe; with optim.kind = \"soap\" it must be 0, got {p}");
            }
        }
        if s.v_reset_idle != lowbit_optim::VResetIdle::Reset
            || s.groups.values().any(|g| g.v_reset_idle.is_some_and(|v| v != lowbit_optim::VResetIdle::Reset))
        {
            bail!("optim.states.v_reset_idle: SOAP resets every element of v (\"reset\"); \"keep\" is AdamW's");
        }
        if self.train.zero != 0 {
            bail!("train.zero: SOAP's states are not sharded; optim.kind = \"soap\" needs train.zero = 0, got {}", self.train.zero);
        }
        Ok(())
    }

    /// The `[data]` section with `data.seed` resolved: `train.seed` when it is not given.
    pub fn data_config(&self) -> DataConfig {
        let mut d = self.data.clone();
        d.seed.get_or_insert(self.train.seed);
        d
    }

    /// Point the run at folder `dir` (`run.dir` = its parent, `run.name` = its name): a resumed
    /// run writes into the folder it was resumed from.
    pub fn set_run_dir(&mut self, dir: &Path) -> Result<()> {
        let name = dir.file_name().with_context(|| format!("{}: not a run folder name", dir.display()))?;
        self.run.name = name.to_string_lossy().into_owned();
        self.run.dir = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_string_lossy().into_owned(),
            _ => ".".into(),
        };
        self.validate()
    }

    /// The value of `run.dir` set by `--set run.dir=...`, if any (for `--resume latest`
    /// without a config file).
    pub fn run_dir_override(overrides: &[String]) -> Result<Option<String>> {
        let mut v = toml::Value::Table(Default::default());
        for o in overrides.iter().filter(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == "run.dir")) {
            apply_override(&mut v, o)?;
        }
        Ok(v.get("run").and_then(|r| r.get("dir")).and_then(|d| d.as_str()).map(String::from))
    }

    /// The model dims ([`ModelSection::resolve`] with `data.seq_len`).
    ///
    /// # Errors
    /// Those of [`ModelSection::resolve`].
    pub fn model_config(&self, tokenizer_vocab: usize) -> Result<LlamaConfig> {
        self.model.resolve(tokenizer_vocab, self.data.seq_len)
    }

    /// Run folder `<run.dir>/<run.name>`.
    pub fn run_dir(&self) -> PathBuf {
        Path::new(&self.run.dir).join(&self.run.name)
    }

    /// The resolved config as TOML.
    pub fn to_toml(&self) -> String {
        let mut c = self.clone();
        c.extends = None;
        toml::to_string_pretty(&c).expect("config serialises")
    }

    /// The settings that differ from `old`, as `section.key: old -> new` (sorted by key; a key
    /// left out of one side's resolved config at its default shows as `(default)`), e.g. to
    /// tell a resumed run which of its saved settings a `--set` or `--config` changed.
    pub fn changes_from(&self, old: &RunConfig) -> Vec<String> {
        fn flat(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
            match v {
                toml::Value::Table(t) => t.iter().for_each(|(k, v)| flat(&format!("{prefix}{k}."), v, out)),
                v => {
                    out.insert(prefix.trim_end_matches('.').to_string(), v.to_string());
                }
            }
        }
        let table = |c: &RunConfig| {
            let mut out = BTreeMap::new();
            flat("", &toml::Value::try_from(c).expect("config serialises"), &mut out);
            out
        };
        let (was, now) = (table(old), table(self));
        let keys: std::collections::BTreeSet<&String> = was.keys().chain(now.keys()).collect();
        // (a key at its default is left out of a resolved config: e.g. optim.kind = "adamw")
        let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(default)".into());
        keys.into_iter()
            .filter(|k| was.get(*k) != now.get(*k))
            .map(|k| format!("{k}: {} -> {}", show(was.get(k)), show(now.get(k))))
            .collect()
    }
}
