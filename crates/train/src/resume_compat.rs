//! Resuming from a checkpoint ([`Resume`]), also from checkpoints that older lowbit versions
//! wrote: what they did not record is adopted as they ran (scale kinds, data order; a missing
//! `v_zero`, reset rule or scale kind reads as it behaved), what the config would change is
//! refused or warned about (another model, other states or reset rule, another random-bit
//! scheme or global batch), then the checkpoint's tensors and state are loaded.

use crate::checkpoint;
use crate::components::ModelWeights;
use crate::config::RunConfig;
use crate::train_state::{load_state, records_data_order, TrainState};
use anyhow::{bail, Result};
use lowbit_optim::{LowbitOptimizer, ScaleChoice, ScaleKind, StateFormat, VZero};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A checkpoint to resume from: its folder and its `state.json`.
pub struct Resume {
    pub dir: PathBuf,
    pub saved: TrainState,
}

impl Resume {
    /// Reads the state of the checkpoint in `dir` ([`load_state`]).
    ///
    /// # Errors
    /// No such folder, or an unreadable or corrupt `state.json`.
    pub fn read(dir: &Path) -> Result<Resume> {
        Ok(Resume { dir: dir.to_path_buf(), saved: load_state(dir)? })
    }

    /// Sets in `cfg` what an older checkpoint ran with but did not record: pow2 scales
    /// (`adopt_unrecorded_scale_kind`) and file order (`adopt_unrecorded_data_order`).
    ///
    /// # Errors
    /// `cfg`'s states do not resolve, or `state.json` cannot be read again.
    pub fn adopt_unrecorded(&self, cfg: &mut RunConfig) -> Result<()> {
        adopt_unrecorded_scale_kind(cfg, &self.dir, &self.saved)?;
        adopt_unrecorded_data_order(cfg, &self.dir)
    }

    /// Checks the checkpoint against `now` (the state a new run of `cfg` starts from,
    /// [`TrainState::at_start`]), loads its weights into `weights` and its states into `opt`,
    /// warns (on the `leader` rank) when the global batch changes, and returns the state the
    /// run goes on from: the checkpoint's, with this launch's settings.
    ///
    /// # Errors
    /// A checkpoint the config cannot resume (`check_compatible`), or its tensors failing to
    /// load.
    pub fn restore(
        self,
        now: TrainState,
        cfg: &RunConfig,
        weights: &candle_nn::VarMap,
        opt: &mut LowbitOptimizer,
        leader: bool,
    ) -> Result<TrainState> {
        let (dir, saved) = (self.dir, self.saved);
        check_compatible(&dir, &saved, &now)?;
        if saved.adaptive_reset.is_some() {
            // written before the optimizer saved the rule's state itself: state.json has it
            opt.moments_mut().adaptive = saved.adaptive_reset.clone();
        }
        checkpoint::load(&dir, &mut [&mut ModelWeights(weights), opt])?;
        if saved.global_batch != 0 && saved.global_batch != now.global_batch && leader {
            tracing::warn!(
                "--resume {}: the global batch changes from {} sequences per step to {} (train.micro_batch {} x \
                 train.grad_accum {}); set them back to keep it",
                dir.display(),
                saved.global_batch,
                now.global_batch,
                cfg.train.micro_batch,
                cfg.train.grad_accum
            );
        }
        let state = TrainState {
            rng: now.rng,
            v_zero: now.v_zero,
            reset: now.reset,
            adaptive_reset: None,
            m_scale: now.m_scale,
            v_scale: now.v_scale,
            ranks: now.ranks,
            global_batch: now.global_batch,
            ..saved
        };
        tracing::info!("resumed from {} at step {}", dir.display(), state.step);
        Ok(state)
    }
}

/// A checkpoint written before scale kinds were recorded holds `pow2` FP8/FP4 states: with
/// `optim.states.scale = "default"` (whose FP4 kind is now `amax`), resume it with `pow2`, said
/// once and written to the run's `config.toml` (an explicit kind is left to the checkpoint
/// check, which refuses a mismatch).
fn adopt_unrecorded_scale_kind(cfg: &mut RunConfig, dir: &Path, saved: &TrainState) -> Result<()> {
    let states = &cfg.optim.states;
    if saved.m_scale.is_some() || saved.v_scale.is_some() || states.scale != ScaleChoice::Default {
        return Ok(());
    }
    let spec = states.resolve(cfg.optim.beta2).map_err(anyhow::Error::msg)?;
    let minifloat_amax = |f: StateFormat, k| f.minifloat().is_some() && k == ScaleKind::Amax;
    if minifloat_amax(spec.m_format, spec.m_scale) || minifloat_amax(spec.v_format, spec.v_scale) {
        tracing::info!(
            "{}: written before scale kinds were recorded, its fp8/fp4 states have pow2 scales: resuming with \
             optim.states.scale = \"pow2\"",
            dir.join("state.json").display()
        );
        cfg.optim.states.scale = ScaleChoice::Pow2;
    }
    Ok(())
}

/// A checkpoint written before the training rows could be shuffled read them in file order:
/// its run resumes in file order (`data.shuffle = false`, said in the log and in the run's
/// config.toml), as it ran.
fn adopt_unrecorded_data_order(cfg: &mut RunConfig, dir: &Path) -> Result<()> {
    if cfg.data.shuffle && !records_data_order(dir)? {
        tracing::info!(
            "{}: written before the training rows could be shuffled, its run read them in file order: resuming with \
             data.shuffle = false",
            dir.join("state.json").display()
        );
        cfg.data.shuffle = false;
    }
    Ok(())
}

/// A scale kind as `state.json` and the messages name it (`""` for none).
fn scale_name(kind: Option<ScaleKind>) -> &'static str {
    kind.map_or("", ScaleKind::as_str)
}

/// Refuses a checkpoint `saved` (in `dir`) that the run `now` cannot continue: another model,
/// other states (formats, block size, `v_zero`, scale kinds, per-tensor states) or another
/// reset rule; warns when its random-bit scheme is not this build's.
fn check_compatible(dir: &Path, saved: &TrainState, now: &TrainState) -> Result<()> {
    let file = dir.join("state.json");
    if saved.rng != now.rng {
        tracing::warn!(
            "{}: written with random-bit scheme {:?}, this build uses {:?}: the run continues, but its \
             stochastic-rounding draws differ from an uninterrupted run of the older build",
            file.display(),
            saved.rng,
            now.rng
        );
    }
    if saved.params != now.params {
        bail!(
            "{}: checkpoint of another model: {} (resume with the [model] settings it was trained with)",
            file.display(),
            params_diff(saved, now)
        );
    }
    // (scale kinds: a checkpoint without them was written with pow2 ones)
    for (key, format, saved_kind, kind, now_format) in
        [("m", saved.m_format, saved.m_scale, now.m_scale, now.m_format), ("v", saved.v_format, saved.v_scale, now.v_scale, now.v_format)]
    {
        let saved_kind = saved_kind.or(kind.map(|_| ScaleKind::Pow2));
        if saved_kind != kind && format == now_format {
            let (saved_kind, kind) = (scale_name(saved_kind), scale_name(kind));
            bail!(
                "{}: checkpoint {key} states ({}) have {saved_kind} scales, the config asks for {kind} (resume with --set \
                 optim.states.scale=\"{saved_kind}\")",
                file.display(),
                format.name()
            );
        }
    }
    if saved.reset_rule() != now.reset_rule() {
        bail!(
            "{}: the checkpoint's states reset by the {} rule, the config asks for the {} one (optim.states.reset \
             must match to resume: the bias correction counts from the last reset)",
            file.display(),
            saved.reset_rule().as_str(),
            now.reset_rule().as_str()
        );
    }
    check_tensor_states(&file, saved, now)?;
    // (v_zero: a checkpoint without it was written as "keep")
    let (saved_v_zero, v_zero) = (saved.v_zero.unwrap_or(VZero::Keep), now.v_zero.unwrap_or(VZero::Keep));
    if (saved.m_format, saved.v_format, saved.block_size, saved_v_zero) != (now.m_format, now.v_format, now.block_size, v_zero) {
        bail!(
            "{}: checkpoint states are m={} v={} block {} v_zero {}, the config asks for m={} v={} block {} \
             v_zero {} (optim.states.m_format / v_format / block_size / v_zero must match to resume)",
            file.display(),
            saved.m_format.name(),
            saved.v_format.name(),
            saved.block_size,
            saved_v_zero.as_str(),
            now.m_format.name(),
            now.v_format.name(),
            now.block_size,
            v_zero.as_str()
        );
    }
    Ok(())
}

/// Refuses a checkpoint `saved` (its `state.json` is `file`) whose per-tensor states
/// (`optim.states.groups.*`, `min_quantized_numel`) or SOAP preconditioner storage differ from
/// the run `now`'s.
fn check_tensor_states(file: &Path, saved: &TrainState, now: &TrainState) -> Result<()> {
    if saved.tensor_states != now.tensor_states {
        let names: BTreeSet<&String> = saved.tensor_states.keys().chain(now.tensor_states.keys()).collect();
        let first = names.into_iter().find(|n| saved.tensor_states.get(*n) != now.tensor_states.get(*n)).expect("the maps differ");
        let says = |m: &BTreeMap<String, String>| m.get(first).cloned().unwrap_or_else(|| "[optim.states]'s".into());
        bail!(
            "{}: {first} has states {} in the checkpoint, the config gives it {} (optim.states.groups.* and \
             optim.states.min_quantized_numel must match to resume)",
            file.display(),
            says(&saved.tensor_states),
            says(&now.tensor_states)
        );
    }
    // (a checkpoint of the other optimizer is refused by its arrays, `load_state_dict`)
    if let (Some(saved_precond), Some(precond)) = (&saved.precond, &now.precond) {
        if saved_precond != precond {
            bail!(
                "{}: the checkpoint's SOAP preconditioners L and R are stored in {saved_precond}, the config asks for \
                 {precond} (optim.soap.precond_format must match to resume: the stored codes are read in the config's format)",
                file.display()
            );
        }
    }
    Ok(())
}

/// How the parameter lists of `saved` and `now` differ: the count, or the first tensor that
/// differs in name or size.
fn params_diff(saved: &TrainState, now: &TrainState) -> String {
    let first = saved.params.iter().zip(&now.params).find(|(a, b)| a != b);
    match first {
        _ if saved.params.len() != now.params.len() => {
            format!("the checkpoint has {} parameter tensors, the config {} (model.num_layers?)", saved.params.len(), now.params.len())
        }
        Some(((sn, sl), (nn, nl))) if sn == nn => format!("{sn} has {sl} elements in the checkpoint, {nl} in the config"),
        Some(((sn, _), (nn, _))) => format!("the checkpoint has {sn} where the config has {nn}"),
        None => "parameter lists differ".into(),
    }
}
