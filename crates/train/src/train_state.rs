//! The trainer's state, the part of a checkpoint that is not tensors (`state.json`,
//! [`TrainState`]): step, optimizer updates, tokens, data position and non-finite streak, with
//! what the states and the model were made with (formats, block size, scale kinds, reset rule,
//! random-bit scheme, parameter names, ranks, global batch), so that a resume with another
//! config is refused or warned about. Older checkpoints' `state.json` files still read: each
//! field added later has the default that the older runs behaved as ([`load_state`]).

use crate::checkpoint::load;
use anyhow::{bail, Context, Result};
use lowbit_data::DataPosition;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Everything besides tensors that a resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Last completed optimizer step.
    pub step: u64,
    /// Training tokens consumed through `step`.
    pub tokens: u64,
    /// Data stream position after the last batch of `step`.
    pub data: DataPosition,
    /// Consecutive non-finite steps at `step`.
    pub nonfinite_in_row: u64,
    /// Optimizer updates applied through `step` (`step` minus the skipped steps): the
    /// optimizer's own step count, which drives its resets and bias correction (see
    /// [`crate::step::train_step`]). Read as `step` from checkpoints written before it was recorded.
    #[serde(default)]
    pub updates: u64,
    /// m/v formats and block size of the stored states, to refuse a mismatched config.
    pub m_format: String,
    pub v_format: String,
    pub block_size: usize,
    /// `optim.states.v_zero` the states were written with (`exclude` / `keep`; empty in
    /// checkpoints written before it was recorded, which behaved as `keep`).
    #[serde(default)]
    pub v_zero: String,
    /// Scale kinds of fp8/fp4 m and v states (`amax` / `pow2`; empty for other formats, and in
    /// checkpoints written before scale kinds existed, whose fp8/fp4 states are `pow2`).
    #[serde(default)]
    pub m_scale: String,
    #[serde(default)]
    pub v_scale: String,
    /// `optim.states.reset` the states were written with (`periodic` / `adaptive`; empty in
    /// checkpoints written before it was recorded: see [`TrainState::reset_rule`]).
    #[serde(default)]
    pub reset: String,
    /// The adaptive reset rule's state in checkpoints written before the optimizer saved it
    /// itself (`optimizer.safetensors`, `adaptive_reset.*`); read, never written.
    #[serde(default, skip_serializing)]
    pub adaptive_reset: Option<lowbit_optim::reset::AdaptiveReset>,
    /// Model parameter names and element counts, to refuse a checkpoint of another model.
    pub params: Vec<(String, usize)>,
    /// Random-bit scheme of the run (`lowbit_optim::rng::SCHEME`; empty in checkpoints
    /// written before it was recorded).
    #[serde(default)]
    pub rng: String,
    /// Data-parallel ranks of the run's last launch; 1 in checkpoints written before it was
    /// recorded.
    #[serde(default = "one_rank")]
    pub ranks: u64,
    /// Sequences per optimizer step of the run's last launch (`micro_batch x grad_accum`; in
    /// checkpoints written before the global batch stopped depending on the rank count, also
    /// `x ranks`), to warn when a resume changes it; 0 (unknown) in older checkpoints.
    #[serde(default)]
    pub global_batch: u64,
    /// The states of the tensors whose states differ from `[optim.states]`'s
    /// (`[optim.states.groups.*]`, `optim.states.min_quantized_numel`): tensor name ->
    /// `lowbit_optim::StatesSpec::describe`; empty when every tensor has `[optim.states]`'s
    /// (and in checkpoints written before per-group states existed).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tensor_states: std::collections::BTreeMap<String, String>,
}

fn one_rank() -> u64 {
    1
}

impl TrainState {
    /// The reset rule of the states (`periodic` / `adaptive`), also for checkpoints written
    /// before it was recorded (adaptive when their `state.json` holds the rule's state).
    pub fn reset_rule(&self) -> &str {
        match (self.reset.as_str(), &self.adaptive_reset) {
            ("", Some(_)) => "adaptive",
            ("", None) => "periodic",
            (rule, _) => rule,
        }
    }

    /// `state.json`: everything but the data position's carry and shuffle buffer, which the
    /// data position saves in its own file (`crate::components`).
    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut small = self.clone();
        small.data.carry = Vec::new();
        small.data.buffer_tokens = Vec::new();
        small.data.buffer_valid = Vec::new();
        Ok(serde_json::to_vec_pretty(&small)?)
    }
}

/// Read `state.json` of a checkpoint, with the data position's carry and shuffle buffer
/// (`data.safetensors`).
pub fn load_state(dir: &Path) -> Result<TrainState> {
    if !dir.is_dir() {
        bail!("{}: no such checkpoint folder", dir.display());
    }
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p)
        .with_context(|| format!("{}: cannot read the checkpoint state (not a checkpoint folder?)", p.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: corrupt checkpoint state: {e}", p.display()))?;
    if let Some(step) = v.get("step").cloned() {
        if let Some(o) = v.as_object_mut() {
            o.entry("updates").or_insert(step);
        }
    }
    let mut state: TrainState = serde_json::from_value(v).map_err(|e| anyhow::anyhow!("{}: corrupt checkpoint state: {e}", p.display()))?;
    load(dir, &mut [&mut state.data])?;
    Ok(state)
}

/// Whether the checkpoint's `state.json` records the data's row order (`data.order`): false
/// for checkpoints written before the training rows could be shuffled, which read them in file
/// order (and load as such: [`lowbit_data::RowOrder`]'s default).
///
/// # Errors
/// An unreadable or corrupt `state.json`.
pub fn records_data_order(dir: &Path) -> Result<bool> {
    let p = dir.join("state.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("{}: cannot read the checkpoint state", p.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: corrupt checkpoint state: {e}", p.display()))?;
    Ok(v.get("data").and_then(|d| d.get("order")).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_without_rng_scheme_still_loads() {
        // state.json written before the random-bit scheme was recorded: `rng` reads as ""
        // (the trainer then warns that SR draws differ) instead of refusing the checkpoint.
        let mut v = serde_json::to_value(TrainState {
            step: 7,
            tokens: 70,
            data: DataPosition::default(),
            nonfinite_in_row: 0,
            updates: 7,
            m_format: "fp8e4m3".into(),
            v_format: "fp8e4m3".into(),
            block_size: 128,
            v_zero: "exclude".into(),
            m_scale: "amax".into(),
            v_scale: "amax".into(),
            reset: "periodic".into(),
            adaptive_reset: None,
            params: vec![("w".into(), 3)],
            rng: lowbit_optim::rng::SCHEME.into(),
            ranks: 2,
            global_batch: 16,
            tensor_states: Default::default(),
        })
        .unwrap();
        v.as_object_mut().unwrap().remove("rng");
        let old: TrainState = serde_json::from_value(v).unwrap();
        assert_eq!((old.step, old.rng.as_str()), (7, ""));
    }

    #[test]
    fn state_without_updates_reads_them_as_the_step() {
        let tmp = tempfile::tempdir().unwrap();
        let text = r#"{"step": 9, "tokens": 90, "data": {"epoch": 0, "shard": 0, "line": 4, "carry": [5, 6]},
            "nonfinite_in_row": 0, "m_format": "fp8e4m3", "v_format": "fp8e4m3", "block_size": 128,
            "params": [["w", 3]], "rng": "x"}"#;
        std::fs::write(tmp.path().join("state.json"), text).unwrap();
        let st = load_state(tmp.path()).unwrap();
        assert_eq!((st.step, st.updates, st.data.carry.clone(), st.ranks, st.global_batch), (9, 9, vec![5, 6], 1, 0));
        assert_eq!((st.m_scale.as_str(), st.v_scale.as_str(), st.reset_rule()), ("", "", "periodic"), "pow2 and periodic");
        assert!(!records_data_order(tmp.path()).unwrap() && st.data.order == lowbit_data::RowOrder::FileOrder, "file order");
    }
}
