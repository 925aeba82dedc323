//! The trainer's state, the part of a checkpoint that is not tensors (`state.json`,
//! [`TrainState`]): step, optimizer updates, tokens, data position and non-finite streak, with
//! what the states and the model were made with (formats, block size, scale kinds, reset rule,
//! random-bit scheme, parameter names, ranks, global batch), so that a resume with another
//! config is refused or warned about. Older checkpoints' `state.json` files still read: each
//! field added later has the default that the older runs behaved as ([`load_state`]).

use crate::checkpoint::load;
use anyhow::{bail, Context, Result};
use lowbit_data::DataPosition;
use lowbit_optim::{HostStates, ResetRule, ScaleKind, StateFormat, VZero};
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
    /// m/v formats and block size of the stored states, to refuse a mismatched config (by
    /// name: `fp8e4m3`, `e8m3`, ...).
    #[serde(with = "by_name::m_format")]
    pub m_format: StateFormat,
    #[serde(with = "by_name::v_format")]
    pub v_format: StateFormat,
    pub block_size: usize,
    /// `optim.states.v_zero` the states were written with (`exclude` / `keep`; `None` in
    /// checkpoints written before it was recorded, which behaved as `keep`).
    #[serde(default, with = "by_name::blank_is_none")]
    pub v_zero: Option<VZero>,
    /// Scale kinds of fp8/fp4 m and v states (`amax` / `pow2`; `None`, written `""`, for other
    /// formats, and in checkpoints written before scale kinds existed, whose fp8/fp4 states are
    /// `pow2`).
    #[serde(default, with = "by_name::blank_is_none")]
    pub m_scale: Option<ScaleKind>,
    #[serde(default, with = "by_name::blank_is_none")]
    pub v_scale: Option<ScaleKind>,
    /// `optim.states.reset` the states were written with (`periodic` / `adaptive`; `None` in
    /// checkpoints written before it was recorded: see [`TrainState::reset_rule`]).
    #[serde(default, with = "by_name::blank_is_none")]
    pub reset: Option<ResetRule>,
    /// The adaptive reset rule's state in checkpoints written before the optimizer saved it
    /// itself (`optimizer.safetensors`, `adaptive_reset.*`); read, never written.
    #[serde(default, skip_serializing)]
    pub adaptive_reset: Option<lowbit_optim::states::reset::AdaptiveReset>,
    /// Model parameter names and element counts, to refuse a checkpoint of another model.
    pub params: Vec<(String, usize)>,
    /// Random-bit scheme of the run (`lowbit_optim::states::rng::SCHEME`; empty in checkpoints
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
    /// How SOAP's preconditioners L and R are stored (`lowbit_optim::SoapStates::precond_storage`:
    /// format and scales), to refuse a config whose `optim.soap.precond_format` would read their
    /// codes in another format; `None` for AdamW, and in checkpoints written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precond: Option<String>,
}

fn one_rank() -> u64 {
    1
}

impl TrainState {
    /// The state of a run at its start: step 0, with what the optimizer's states `opt` are
    /// made of (its `[optim.states]`, each tensor's name and size, the tensors with states of
    /// their own), `ranks` data-parallel ranks and a global batch of `global_batch` sequences.
    pub fn at_start(opt: HostStates<'_>, ranks: usize, global_batch: usize) -> TrainState {
        let spec = opt.moments.spec;
        // (a scale kind is recorded for fp8/fp4 states only)
        let scale = |format: StateFormat, kind| format.minifloat().is_some().then_some(kind);
        TrainState {
            step: 0,
            tokens: 0,
            data: DataPosition::default(),
            nonfinite_in_row: 0,
            updates: 0,
            m_format: spec.m_format,
            v_format: spec.v_format,
            block_size: spec.block_size,
            v_zero: Some(spec.v_zero),
            m_scale: scale(spec.m_format, spec.m_scale),
            v_scale: scale(spec.v_format, spec.v_scale),
            reset: Some(spec.reset),
            adaptive_reset: None,
            params: opt.moments.tensors.iter().map(|t| (t.info.name.clone(), t.info.len)).collect(),
            rng: lowbit_optim::states::rng::SCHEME.into(),
            ranks: ranks as u64,
            global_batch: global_batch as u64,
            tensor_states: opt
                .moments
                .tensors
                .iter()
                .filter(|t| t.spec != spec)
                .map(|t| (t.info.name.clone(), t.spec.describe()))
                .collect(),
            precond: opt.precond.and_then(|s| s.precond_storage()),
        }
    }

    /// The reset rule of the states, also for checkpoints written before it was recorded
    /// (adaptive when their `state.json` holds the rule's state).
    pub fn reset_rule(&self) -> ResetRule {
        match (self.reset, &self.adaptive_reset) {
            (Some(rule), _) => rule,
            (None, Some(_)) => ResetRule::Adaptive,
            (None, None) => ResetRule::Periodic,
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

/// The optimizer's settings in `state.json` by their names, as the file has always held them.
mod by_name {
    /// `m_format` by name (`fp8e4m3`, `e8m3`, ...).
    pub mod m_format {
        use lowbit_optim::StateFormat;
        pub fn serialize<S: serde::Serializer>(f: &StateFormat, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(f.name())
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<StateFormat, D::Error> {
            super::format(d, false)
        }
    }

    /// `v_format` by name (`fp4ue2m2`, ...).
    pub mod v_format {
        use lowbit_optim::StateFormat;
        pub fn serialize<S: serde::Serializer>(f: &StateFormat, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(f.name())
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<StateFormat, D::Error> {
            super::format(d, true)
        }
    }

    /// A state format by its name ([`lowbit_optim::StateFormat::parse`]).
    fn format<'de, D: serde::Deserializer<'de>>(d: D, for_v: bool) -> Result<lowbit_optim::StateFormat, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        lowbit_optim::StateFormat::parse(&name, for_v).map_err(serde::de::Error::custom)
    }

    /// An optional setting by its name, `""` for none (the empty string the file held before
    /// the field was typed, for a setting not recorded or without meaning for the format).
    pub mod blank_is_none {
        use serde::de::{DeserializeOwned, IntoDeserializer};
        use serde::{Deserialize, Serialize};

        pub fn serialize<T: Serialize, S: serde::Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(v) => v.serialize(s),
                None => s.serialize_str(""),
            }
        }

        pub fn deserialize<'de, T: DeserializeOwned, D: serde::Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
            let name = String::deserialize(d)?;
            if name.is_empty() {
                return Ok(None);
            }
            T::deserialize(name.as_str().into_deserializer()).map(Some)
        }
    }
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
            m_format: StateFormat::Fp8E4M3,
            v_format: StateFormat::Fp8E4M3,
            block_size: 128,
            v_zero: Some(VZero::Exclude),
            m_scale: Some(ScaleKind::Amax),
            v_scale: Some(ScaleKind::Amax),
            reset: Some(ResetRule::Periodic),
            adaptive_reset: None,
            params: vec![("w".into(), 3)],
            rng: lowbit_optim::states::rng::SCHEME.into(),
            ranks: 2,
            global_batch: 16,
            tensor_states: Default::default(),
            precond: None,
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
        assert_eq!((st.m_scale, st.v_scale, st.reset_rule()), (None, None, ResetRule::Periodic), "pow2 and periodic");
        assert!(!records_data_order(tmp.path()).unwrap() && st.data.order == lowbit_data::RowOrder::FileOrder, "file order");
    }
}
