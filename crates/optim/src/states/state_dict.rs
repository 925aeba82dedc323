//! The optimizer's states as named arrays (PyTorch's `state_dict`): what a checkpoint stores,
//! each state's stored codes and block scales as they are, never dequantized, and the adaptive
//! reset rule's state. The trainer's checkpoint writes them to a file without knowing what
//! they hold.

use crate::error::OptimError;
use crate::states::moments::Moments;
use crate::states::precond::SoapStates;
use crate::states::quant::QuantState;
use crate::states::reset::AdaptiveReset;

/// One stored array of [`HostStates::state_dict`].
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// Stored codes, `[bytes]` (packed: FP4 two per byte; FP32/BF16 states their words'
    /// little-endian bytes).
    U8(Vec<u8>),
    /// Block scales, `[blocks]` (one per tensor with `block_size = 0`).
    F32(Vec<f32>),
    /// Update numbers of the adaptive reset rule.
    I64(Vec<i64>),
    /// Accumulated excess and measured fractions of the adaptive reset rule.
    F64(Vec<f64>),
}

impl Array {
    /// The element type's name (`U8`, `F32`, `I64`, `F64`), for errors.
    pub fn dtype(&self) -> &'static str {
        match self {
            Array::U8(_) => "U8",
            Array::F32(_) => "F32",
            Array::I64(_) => "I64",
            Array::F64(_) => "F64",
        }
    }
}

/// Prefix of the adaptive reset rule's arrays (`adaptive_reset.counters`,
/// `adaptive_reset.acc`, `adaptive_reset.pending_updates`, `adaptive_reset.pending_fractions`).
const ADAPTIVE: &str = "adaptive_reset";

/// The adaptive rule's state as arrays: `counters` = [cycle_start, next, decided], `acc` =
/// [A], and the pending measurements' updates and fractions.
fn adaptive_arrays(a: &AdaptiveReset) -> Vec<(String, Array)> {
    let int = |u: u64| i64::try_from(u).unwrap_or(i64::MAX);
    vec![
        (format!("{ADAPTIVE}.counters"), Array::I64(vec![int(a.cycle_start), int(a.next), int(a.decided)])),
        (format!("{ADAPTIVE}.acc"), Array::F64(vec![a.acc])),
        (format!("{ADAPTIVE}.pending_updates"), Array::I64(a.pending.iter().map(|&(u, _)| int(u)).collect())),
        (format!("{ADAPTIVE}.pending_fractions"), Array::F64(a.pending.iter().map(|&(_, p)| p).collect())),
    ]
}

/// The adaptive rule's state from its arrays, `None` when all four are absent; some but not
/// all of them is an error.
fn adaptive_from(get: &mut dyn FnMut(&str) -> Option<Array>) -> Result<Option<AdaptiveReset>, OptimError> {
    let key = |k: &str| format!("{ADAPTIVE}.{k}");
    let Some(counters) = get(&key("counters")) else {
        if let Some(k) = ["acc", "pending_updates", "pending_fractions"].into_iter().find(|k| get(&key(k)).is_some()) {
            return Err(OptimError::State(format!("{} without {}: the adaptive rule's state is incomplete", key(k), key("counters"))));
        }
        return Ok(None);
    };
    let bad = |k: &str, want: &str| OptimError::State(format!("{}: missing or not {want}", key(k)));
    let uint = |k: &str, v: i64| u64::try_from(v).map_err(|_| OptimError::State(format!("{}: negative update {v}", key(k))));
    let Array::I64(c) = counters else { return Err(bad("counters", "3 I64 values")) };
    let [cycle_start, next, decided] = c[..] else { return Err(bad("counters", "3 I64 values")) };
    let Some(Array::F64(acc)) = get(&key("acc")) else { return Err(bad("acc", "one F64 value")) };
    let [acc] = acc[..] else { return Err(bad("acc", "one F64 value")) };
    let Some(Array::I64(updates)) = get(&key("pending_updates")) else { return Err(bad("pending_updates", "I64 values")) };
    let Some(Array::F64(fractions)) = get(&key("pending_fractions")) else { return Err(bad("pending_fractions", "F64 values")) };
    if updates.len() != fractions.len() {
        return Err(OptimError::State(format!("{}: {} updates for {} fractions", key("pending_updates"), updates.len(), fractions.len())));
    }
    let pending = updates.iter().zip(&fractions).map(|(&u, &p)| Ok((uint("pending_updates", u)?, p))).collect::<Result<_, OptimError>>()?;
    Ok(Some(AdaptiveReset {
        cycle_start: uint("counters", cycle_start)?,
        acc,
        next: uint("counters", next)?,
        decided: uint("counters", decided)?,
        pending,
    }))
}

/// Every state of an optimizer on the host, borrowed: the moments, and the preconditioners of
/// a rule that keeps them (SOAP). What a checkpoint saves ([`Self::state_dict`]) and the
/// trainer's reports read.
#[derive(Debug, Clone, Copy)]
pub struct HostStates<'a> {
    pub moments: &'a Moments,
    /// SOAP's preconditioners; `None` for AdamW.
    pub precond: Option<&'a SoapStates>,
}

impl HostStates<'_> {
    /// Every state's arrays by name, in tensor order: `<param>.m.codes`, `<param>.v.codes` (U8;
    /// no v for a Muon matrix) and, for scaled formats, `<param>.m.scales`, `<param>.v.scales`
    /// (F32); then SOAP's
    /// (`<param>.soap_l.*`, `<param>.soap_r.*`, the bases `<param>.soap_q_l`, `<param>.soap_q_r`);
    /// then, with the adaptive reset rule, its state (`adaptive_reset.*`).
    pub fn state_dict(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        let save = |out: &mut Vec<(String, Array)>, key: String, s: &QuantState| {
            out.push((format!("{key}.codes"), Array::U8(s.code_bytes())));
            if !s.scales.is_empty() {
                out.push((format!("{key}.scales"), Array::F32(s.scales.clone())));
            }
        };
        let tensors = &self.moments.tensors;
        for t in tensors {
            save(&mut out, format!("{}.m", t.info.name), &t.m);
            if t.momentum.is_none() {
                save(&mut out, format!("{}.v", t.info.name), &t.v); // (a Muon matrix keeps no v)
            }
        }
        for (t, p) in self.precond.iter().flat_map(|soap| tensors.iter().zip(&soap.tensors)) {
            for (side, s, q) in [("l", &p.l, &p.q_l), ("r", &p.r, &p.q_r)] {
                if let Some(s) = s {
                    save(&mut out, format!("{}.soap_{side}", t.info.name), s);
                }
                if !q.is_empty() {
                    out.push((format!("{}.soap_q_{side}", t.info.name), Array::F32(q.clone())));
                }
            }
        }
        out.extend(self.moments.adaptive.iter().flat_map(adaptive_arrays));
        out
    }

    /// Bytes of all the states (codes + scales; with SOAP its preconditioners and FP32 bases
    /// too).
    pub fn state_bytes(&self) -> usize {
        self.moments.state_bytes() + self.precond.map_or(0, SoapStates::bytes)
    }
}

/// Restore every state of `moments` and (SOAP) `precond` from `get` (an array of
/// [`HostStates::state_dict`] by name). Without the adaptive rule's arrays the rule keeps the
/// state it has (checkpoints written before the rule's state moved here kept it in the
/// trainer's `state.json`, which the trainer gives the rule first).
///
/// # Errors
/// A missing array, one of the other kind, or one whose length does not fit the state
/// (another model, format or block size), naming it; SOAP's arrays in a checkpoint of the
/// other optimizer or of another preconditioned side; the adaptive rule's state for an
/// optimizer with periodic resets.
pub fn load_state_dict(
    moments: &mut Moments,
    precond: Option<&mut SoapStates>,
    get: &mut dyn FnMut(&str) -> Option<Array>,
) -> Result<(), OptimError> {
    for t in &mut moments.tensors {
        load_state(get, &format!("{}.m", t.info.name), &mut t.m, "")?;
        let v = format!("{}.v", t.info.name);
        if t.momentum.is_none() {
            let why = ": the checkpoint keeps no v for this tensor (a Muon checkpoint's matrices keep none, or it is \
                       truncated), the config asks for AdamW or SOAP (optim.kind must match to resume)";
            load_state(get, &v, &mut t.v, why)?;
        } else if get(&format!("{v}.codes")).is_some() {
            return Err(OptimError::State(format!(
                "{v}.codes: the checkpoint holds a v for this matrix (AdamW's or SOAP's), the config asks for Muon \
                 (optim.kind must match to resume)"
            )));
        }
    }
    let names: Vec<String> = moments.tensors.iter().map(|t| t.info.name.clone()).collect();
    check_precond_arrays(&names, precond.as_deref(), get)?;
    if let Some(soap) = precond {
        load_precond(&names, soap, get)?;
    }
    match (adaptive_from(get)?, &mut moments.adaptive) {
        (Some(saved), Some(rule)) => *rule = saved,
        (Some(_), None) => {
            return Err(OptimError::State(format!(
                "{ADAPTIVE}.*: states reset by the adaptive rule, the config asks for periodic resets \
                 (optim.states.reset must match to resume: the bias correction counts from the last reset)"
            )))
        }
        (None, _) => {}
    }
    Ok(())
}

/// SOAP's arrays must be exactly the ones this config's states have: a checkpoint of the
/// other optimizer, or of another `optim.soap.max_precond_dim` (a side preconditioned in one
/// and not the other), is refused, never half read.
///
/// # Errors
/// [`OptimError::State`] naming the first array that does not fit, and why.
fn check_precond_arrays(
    names: &[String],
    precond: Option<&SoapStates>,
    get: &mut dyn FnMut(&str) -> Option<Array>,
) -> Result<(), OptimError> {
    let sides = |i: usize| match precond {
        Some(soap) => [soap.tensors[i].l.is_some(), soap.tensors[i].r.is_some()],
        None => [false, false],
    };
    for (i, name) in names.iter().enumerate() {
        for (k, side) in ["l", "r"].into_iter().enumerate() {
            let key = format!("{name}.soap_{side}.codes");
            let want = sides(i)[k];
            let why = match (precond.is_some(), get(&key).is_some(), want) {
                (false, true, _) => "the checkpoint holds SOAP's states, the config asks for AdamW (optim.kind must match to resume)",
                (true, false, true) if (0..names.len()).all(|j| {
                    ["l", "r"].iter().all(|s| get(&format!("{}.soap_{s}.codes", names[j])).is_none())
                }) =>
                {
                    "the checkpoint holds AdamW's states, the config asks for SOAP (optim.kind must match to resume)"
                }
                (true, true, false) | (true, false, true) => {
                    "this side is preconditioned in one of the checkpoint and the config only (optim.soap.max_precond_dim must match to resume)"
                }
                _ => continue,
            };
            return Err(OptimError::State(format!("{key}: {why}")));
        }
    }
    Ok(())
}

/// Restore SOAP's preconditioners and bases of the tensors `names` (tensor order).
///
/// # Errors
/// A missing or misfitting array, naming it.
fn load_precond(names: &[String], soap: &mut SoapStates, get: &mut dyn FnMut(&str) -> Option<Array>) -> Result<(), OptimError> {
    for (name, p) in names.iter().zip(soap.tensors.iter_mut()) {
        for (side, s, q, n) in [("l", &mut p.l, &mut p.q_l, p.rows), ("r", &mut p.r, &mut p.q_r, p.cols)] {
            let Some(s) = s else { continue };
            load_state(get, &format!("{name}.soap_{side}"), s, "")?;
            let key = format!("{name}.soap_q_{side}");
            *q = match get(&key) {
                None => vec![],
                Some(Array::F32(b)) if b.len() == n * n => b,
                Some(other) => {
                    return Err(OptimError::State(format!(
                        "{key}: {} of {} values, expected F32 {n} x {n}",
                        other.dtype(),
                        array_len(&other)
                    )))
                }
            };
        }
    }
    Ok(())
}

/// Elements of an array (for errors).
fn array_len(a: &Array) -> usize {
    match a {
        Array::U8(v) => v.len(),
        Array::F32(v) => v.len(),
        Array::I64(v) => v.len(),
        Array::F64(v) => v.len(),
    }
}

/// Restore the state `s` from `<key>.codes` and (scaled formats) `<key>.scales`; a missing
/// `<key>.codes` is reported with `why_missing` appended (empty: nothing to add).
fn load_state(get: &mut dyn FnMut(&str) -> Option<Array>, key: &str, s: &mut QuantState, why_missing: &str) -> Result<(), OptimError> {
    let missing = |key: &str| OptimError::State(format!("missing {key}"));
    let codes = format!("{key}.codes");
    match get(&codes).ok_or_else(|| OptimError::State(format!("missing {codes}{why_missing}")))? {
        Array::U8(c) => s.set_code_bytes(&c).map_err(|e| OptimError::State(format!("{codes}: {e}")))?,
        other => return Err(OptimError::State(format!("{codes}: {}, expected U8 codes", other.dtype()))),
    }
    if !s.scales.is_empty() {
        let key = format!("{key}.scales");
        let scales = match get(&key).ok_or_else(|| missing(&key))? {
            Array::F32(scales) => scales,
            other => return Err(OptimError::State(format!("{key}: {}, expected F32 scales", other.dtype()))),
        };
        if scales.len() != s.scales.len() {
            return Err(OptimError::State(format!("{key} has {} scales, expected {}", scales.len(), s.scales.len())));
        }
        s.scales = scales;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::config::{ResetRule, StatesConfig};
    use crate::states::moments::{Hyper, ParamInfo};
    use std::collections::HashMap;

    fn optimizer(reset: ResetRule) -> Moments {
        let states = StatesConfig { reset, ..Default::default() };
        let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.0 };
        let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: 4, weight_decay: true };
        Moments::new(hyper, states.resolve(0.999).unwrap(), 0, vec![info])
    }

    fn arrays(m: &Moments) -> Vec<(String, Array)> {
        HostStates { moments: m, precond: None }.state_dict()
    }

    /// The adaptive rule's state goes through the state dict exactly; a periodic optimizer
    /// refuses it; without its arrays the rule keeps the state it was given.
    #[test]
    fn adaptive_rule_state_round_trips() {
        let mut a = optimizer(ResetRule::Adaptive);
        let rule = AdaptiveReset { cycle_start: 12, acc: 0.1 + 0.2, next: 15, decided: 24, pending: vec![(16, 0.75), (15, 1.0 / 3.0)] };
        a.adaptive = Some(rule.clone());
        let saved: HashMap<String, Array> = arrays(&a).into_iter().collect();
        assert_eq!(saved.keys().filter(|k| k.starts_with("adaptive_reset.")).count(), 4);
        let mut get = |k: &str| saved.get(k).cloned();
        let mut b = optimizer(ResetRule::Adaptive);
        load_state_dict(&mut b, None, &mut get).unwrap();
        assert_eq!(b.adaptive, Some(rule.clone()));

        let e = load_state_dict(&mut optimizer(ResetRule::Periodic), None, &mut get).unwrap_err().to_string();
        assert!(e.contains("adaptive rule") && e.contains("optim.states.reset"), "{e}");

        let mut without = |k: &str| if k.starts_with("adaptive_reset.") { None } else { saved.get(k).cloned() };
        let mut c = optimizer(ResetRule::Adaptive);
        c.adaptive = Some(rule.clone());
        load_state_dict(&mut c, None, &mut without).unwrap();
        assert_eq!(c.adaptive, Some(rule));
        assert!(arrays(&optimizer(ResetRule::Periodic)).iter().all(|(k, _)| !k.starts_with("adaptive_reset.")));
        // Some of the rule's arrays but not its counters: refused, not read as "no state".
        let mut partial = |k: &str| if k == "adaptive_reset.counters" { None } else { saved.get(k).cloned() };
        let err = load_state_dict(&mut optimizer(ResetRule::Adaptive), None, &mut partial).unwrap_err();
        assert!(err.to_string().contains("adaptive_reset.acc without adaptive_reset.counters"), "{err}");
    }
}
