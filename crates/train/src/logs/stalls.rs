//! Rows of `stalls.jsonl`: per step, the global stalled fractions of m, v and BF16 weights
//! under both estimators (`lowbit_optim::stalls`: stalled / updated, and the paper's unchanged
//! / all entries), per tensor group, the theory prediction for v, the zero gradients, the
//! updates with v = 0 and m != 0 (in total and per group), and
//! (every `stall_detail_every` steps) per tensor.

use lowbit_optim::{theory, Counter, StallCounts, StatesSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Stalled fractions of one aggregate under both estimators (null where nothing was updated,
/// or in rows written before the paper's estimator was counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fractions {
    pub m: Option<f64>,
    pub v: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<f64>,
    /// The paper's estimator: unchanged / all entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m_unchanged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v_unchanged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_unchanged: Option<f64>,
    /// A count, not a fraction: elements updated with v = 0 and m != 0, each moved by
    /// lr * m^ / eps (`lowbit_optim::StallCounts::zero_v`); a mean of it over steps (`train
    /// stalls`) is fractional. Null in rows written before it was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_v: Option<f64>,
}

impl Fractions {
    pub fn of(c: &StallCounts) -> Self {
        Fractions {
            m: c.m.fraction(),
            v: c.v.fraction(),
            w: c.w.fraction(),
            m_unchanged: c.m.unchanged_fraction(),
            v_unchanged: c.v.unchanged_fraction(),
            w_unchanged: c.w.unchanged_fraction(),
            zero_v: Some(c.zero_v as f64),
        }
    }
}

/// Theory prediction of the v stalled fraction for the run's format, b2 and rounding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Theory {
    pub v: Option<f64>,
}

impl Theory {
    pub fn for_spec(spec: &StatesSpec, beta2: f64) -> Self {
        Theory { v: spec.v_format.fraction_bits().map(|b| theory::p_stall(b, beta2, spec.v_rounding)) }
    }
}

/// One line of `stalls.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallRow {
    pub step: u64,
    /// Global counts.
    pub m: Counter,
    pub v: Counter,
    pub w: Counter,
    /// Elements whose gradient was exactly 0 (after clipping); 0 in rows written before it
    /// was counted.
    #[serde(default)]
    pub zero_grad: u64,
    /// Elements updated with v = 0 and m != 0 (`lowbit_optim::StallCounts::zero_v`); 0 in
    /// rows written before it was counted.
    #[serde(default)]
    pub zero_v: u64,
    /// Global fractions.
    pub frac: Fractions,
    /// Per group (embed, attn, mlp, norm, head).
    pub groups: BTreeMap<String, Fractions>,
    pub theory: Theory,
    /// Per tensor, at the detail interval only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<BTreeMap<String, Fractions>>,
}

impl StallRow {
    /// Aggregate per-tensor counts (`names[i]`, `groups[i]`, `counts[i]`).
    pub fn build(step: u64, names: &[String], groups: &[String], counts: &[StallCounts], theory: Theory, detail: bool) -> Self {
        let total: StallCounts = counts.iter().copied().sum();
        let mut per_group: BTreeMap<String, StallCounts> = BTreeMap::new();
        for (g, c) in groups.iter().zip(counts) {
            *per_group.entry(g.clone()).or_default() += *c;
        }
        let tensors = detail.then(|| names.iter().zip(counts).map(|(n, c)| (n.clone(), Fractions::of(c))).collect());
        StallRow {
            step,
            m: total.m,
            v: total.v,
            w: total.w,
            zero_grad: total.zero_grad,
            zero_v: total.zero_v,
            frac: Fractions::of(&total),
            groups: per_group.iter().map(|(g, c)| (g.clone(), Fractions::of(c))).collect(),
            theory,
            tensors,
        }
    }
}
