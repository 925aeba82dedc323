//! The run config: one TOML file with sections `[model]`, `[data]`, `[optim]`
//! (+ `[optim.states]`), `[train]`, `[run]`. Precedence: defaults < file (and the files it
//! `extends`) < `--set section.key=value`. Unknown keys and bad values are errors naming the
//! file, key and line; the resolved config is written to the run folder.

use anyhow::{bail, Context, Result};
use lowbit_data::DataConfig;
use lowbit_model::LlamaConfig;
use lowbit_optim::StatesConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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

/// Weight (and activation) dtype of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    /// FP32 weights (the paper's Table 2).
    #[default]
    F32,
    /// BF16 weights updated in place with `optim.states.weight_rounding` (the main table).
    Bf16,
}

/// `[model]`: a preset by name, optionally with explicit dims overriding it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// tiny, llama20m, llama60m, llama100m, llama130m, llama350m.
    pub preset: Option<String>,
    /// Weight dtype: "f32" (default) or "bf16".
    #[serde(default)]
    pub dtype: WeightDtype,
    /// Vocabulary size; default: the tokenizer's.
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_layers: Option<usize>,
    pub num_heads: Option<usize>,
    pub num_kv_heads: Option<usize>,
    pub max_seq_len: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
}

/// `[optim]`: AdamW hyper-parameters and the learning-rate schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
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
        }
    }
}

/// `[train]`: batch, length, evaluation and fault handling.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Seed of the initialisation and of the stochastic-rounding streams.
    pub seed: u64,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per optimizer step (global batch = micro_batch * grad_accum).
    pub grad_accum: usize,
    /// Optimizer steps.
    pub max_steps: u64,
    /// Evaluate validation loss every this many steps (and at the end); 0 = only at the end.
    pub eval_every: u64,
    /// "cpu" or "cuda" (also `--device`).
    pub device: String,
    /// Write a checkpoint every this many steps (and at the end); 0 = only at the end.
    pub checkpoint_every: u64,
    /// Keep this many most recent checkpoints.
    pub keep_checkpoints: usize,
    /// Stop (with a checkpoint) after this many consecutive non-finite steps.
    pub max_nonfinite_steps: u64,
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
            checkpoint_every: 0,
            keep_checkpoints: 2,
            max_nonfinite_steps: 10,
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
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection { name: "run".into(), dir: "runs".into(), stall_detail_every: 100, plots: true }
    }
}

impl RunConfig {
    /// Load `path` (following `extends`), apply `--set` overrides, validate.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let mut value = load_value(path, 0)?;
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        let cfg: RunConfig = toml::Value::try_into(value.clone()).map_err(|e| {
            anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim_end())
        })?;
        cfg.validate().with_context(|| format!("invalid config {}", path.display()))?;
        Ok(cfg)
    }

    /// Parse a config from a TOML string (no `extends`), for tests and embedded defaults.
    pub fn from_toml(text: &str) -> Result<Self> {
        let cfg: RunConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that serde cannot express.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        if t.micro_batch == 0 || t.grad_accum == 0 || t.max_steps == 0 {
            bail!("train.micro_batch, train.grad_accum and train.max_steps must be > 0");
        }
        if !["cpu", "cuda"].contains(&t.device.as_str()) {
            bail!("train.device: expected \"cpu\" or \"cuda\", got {:?}", t.device);
        }
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
        if o.eps <= 0.0 || o.weight_decay < 0.0 || o.grad_clip < 0.0 {
            bail!("optim.eps must be > 0, optim.weight_decay and optim.grad_clip >= 0");
        }
        o.states.resolve().map_err(anyhow::Error::msg)?;
        if self.data.seq_len == 0 {
            bail!("data.seq_len must be > 0");
        }
        if self.run.name.is_empty() || self.run.name.contains('/') {
            bail!("run.name: must be a non-empty folder name, got {:?}", self.run.name);
        }
        Ok(())
    }

    /// The model dims: the preset, with explicit fields overriding it.
    pub fn model_config(&self, tokenizer_vocab: usize) -> Result<LlamaConfig> {
        let m = &self.model;
        let vocab = m.vocab_size.unwrap_or(tokenizer_vocab);
        if vocab < tokenizer_vocab {
            bail!(
                "model.vocab_size = {vocab} is smaller than the tokenizer's vocabulary ({tokenizer_vocab}): \
                 token ids would be out of range"
            );
        }
        let mut c = match &m.preset {
            Some(p) => LlamaConfig::preset(p, vocab).with_context(|| {
                format!("model.preset: unknown preset {p:?} (expected one of {:?})", LlamaConfig::preset_names())
            })?,
            None => LlamaConfig {
                vocab_size: vocab,
                hidden_size: m.hidden_size.context("model: set `preset` or `hidden_size`")?,
                intermediate_size: m.intermediate_size.context("model: set `preset` or `intermediate_size`")?,
                num_layers: m.num_layers.context("model: set `preset` or `num_layers`")?,
                num_heads: m.num_heads.context("model: set `preset` or `num_heads`")?,
                num_kv_heads: m.num_kv_heads.or(m.num_heads).unwrap_or(1),
                max_seq_len: 1024,
                rms_norm_eps: 1e-6,
                rope_theta: 10000.0,
            },
        };
        macro_rules! over {
            ($($f:ident),*) => { $( if let Some(x) = m.$f { c.$f = x; } )* };
        }
        over!(hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, max_seq_len, rms_norm_eps, rope_theta);
        if m.num_kv_heads.is_none() && m.num_heads.is_some() {
            c.num_kv_heads = c.num_heads;
        }
        c.max_seq_len = c.max_seq_len.max(self.data.seq_len);
        c.validate().map_err(|e| anyhow::anyhow!("model: {e}"))?;
        Ok(c)
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
}

/// Read a TOML file into a table, merging it over its `extends` base.
fn load_value(path: &Path, depth: usize) -> Result<toml::Value> {
    if depth > 8 {
        bail!("{}: `extends` chain deeper than 8 files (a cycle?)", path.display());
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let value: toml::Value = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
    let Some(base) = value.get("extends").and_then(|b| b.as_str()) else {
        return Ok(value);
    };
    let base_path = path.parent().unwrap_or(Path::new(".")).join(base);
    let mut merged = load_value(&base_path, depth + 1)
        .with_context(|| format!("{}: extends {base:?}", path.display()))?;
    merge(&mut merged, value);
    if let Some(t) = merged.as_table_mut() {
        t.remove("extends");
    }
    Ok(merged)
}

/// Recursively overlay `top` onto `base` (tables merge, other values replace).
fn merge(base: &mut toml::Value, top: toml::Value) {
    match (base, top) {
        (toml::Value::Table(b), toml::Value::Table(t)) => {
            for (k, v) in t {
                match b.get_mut(&k) {
                    Some(bv) if bv.is_table() && v.is_table() => merge(bv, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, t) => *b = t,
    }
}

/// Apply `section.key=value` (value parsed as TOML, else taken as a string).
pub fn apply_override(root: &mut toml::Value, spec: &str) -> Result<()> {
    let (key, raw) = spec
        .split_once('=')
        .with_context(|| format!("--set {spec:?}: expected section.key=value"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("--set {spec:?}: empty key component");
    }
    let value: toml::Value = toml::from_str::<toml::Table>(&format!("x = {}", raw.trim()))
        .ok()
        .and_then(|mut t| t.remove("x"))
        .unwrap_or_else(|| toml::Value::String(raw.trim().to_string()));
    let mut node = root;
    for p in &parts[..parts.len() - 1] {
        let t = node.as_table_mut().with_context(|| format!("--set {key}: {p} is not a section"))?;
        node = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(Default::default()));
    }
    node.as_table_mut()
        .with_context(|| format!("--set {key}: parent is not a section"))?
        .insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}
