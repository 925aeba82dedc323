//! Rows of `stalls.jsonl`: per step, the global stalled fractions of m, v, BF16 weights and
//! (SOAP only) the preconditioners L and R under both estimators (`lowbit_optim::states::stalls`:
//! stalled / updated, and the paper's unchanged / all entries), per tensor group, the theory prediction for v, the zero gradients, the
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
    /// SOAP's preconditioner EMAs L and R together (`lowbit_optim::StallCounts::precond`);
    /// `None` (and left out of the row) when none was written back: AdamW, or an aggregate of
    /// vectors and matrices without a preconditioner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precond: Option<f64>,
    /// The paper's estimator: unchanged / all entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m_unchanged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v_unchanged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_unchanged: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precond_unchanged: Option<f64>,
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
            precond: c.precond.fraction(),
            m_unchanged: c.m.unchanged_fraction(),
            v_unchanged: c.v.unchanged_fraction(),
            w_unchanged: c.w.unchanged_fraction(),
            precond_unchanged: c.precond.unchanged_fraction(),
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
    /// SOAP's preconditioners L and R (`lowbit_optim::StallCounts::precond`); left out of the
    /// row when nothing was counted, so an AdamW run's rows are what they were before SOAP.
    #[serde(default, skip_serializing_if = "Counter::is_empty")]
    pub precond: Counter,
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
            precond: total.precond,
            frac: Fractions::of(&total),
            groups: per_group.iter().map(|(g, c)| (g.clone(), Fractions::of(c))).collect(),
            theory,
            tensors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(updated: u64, stalled: u64, unchanged: u64, elements: u64) -> Counter {
        Counter { updated, stalled, unchanged, elements }
    }

    /// A SOAP row: two tensors of one group, the first with a preconditioner (L and R together:
    /// 40 updated, 30 stalled, 50 unchanged of 64), the second a vector without one. The
    /// preconditioners' fractions are exact, per group and global, and their counter is in the
    /// JSON; the vector's own fractions have none.
    #[test]
    fn a_soap_row_gives_the_preconditioners_fractions() {
        let with = StallCounts { m: counter(8, 2, 2, 8), v: counter(8, 6, 6, 8), precond: counter(40, 30, 50, 64), ..Default::default() };
        let vector = StallCounts { m: counter(4, 1, 1, 4), v: counter(4, 4, 4, 4), ..Default::default() };
        let names = ["w".to_string(), "norm".to_string()];
        let groups = ["mlp".to_string(), "mlp".to_string()];
        let row = StallRow::build(7, &names, &groups, &[with, vector], Theory { v: None }, true);
        assert_eq!(row.precond, counter(40, 30, 50, 64));
        assert_eq!((row.frac.precond, row.frac.precond_unchanged), (Some(0.75), Some(0.78125)));
        assert_eq!(row.groups["mlp"].precond, Some(0.75));
        assert_eq!((row.frac.m, row.frac.v), (Some(0.25), Some(10.0 / 12.0)));
        let tensors = row.tensors.as_ref().unwrap();
        assert_eq!((tensors["norm"].precond, tensors["norm"].precond_unchanged), (None, None));
        let json = serde_json::to_string(&row).unwrap();
        assert!(json.contains(r#""precond":{"updated":40,"stalled":30,"unchanged":50,"elements":64}"#), "{json}");
        assert!(json.contains(r#""precond":0.75"#) && json.contains(r#""precond_unchanged":0.78125"#), "{json}");
        let back: StallRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back, row);
    }

    /// An AdamW row (no preconditioner counted) has no precond key anywhere: its JSON is the
    /// row as written before SOAP, byte for byte.
    #[test]
    fn an_adamw_row_has_no_precond_key() {
        let c = StallCounts { m: counter(4, 1, 1, 4), v: counter(4, 3, 3, 4), zero_grad: 2, ..Default::default() };
        let row = StallRow::build(3, &["w".to_string()], &["attn".to_string()], &[c], Theory { v: Some(0.5) }, false);
        assert_eq!((row.frac.precond, row.frac.precond_unchanged), (None, None));
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(
            json,
            r#"{"step":3,"m":{"updated":4,"stalled":1,"unchanged":1,"elements":4},"v":{"updated":4,"stalled":3,"unchanged":3,"elements":4},"w":{"updated":0,"stalled":0,"unchanged":0,"elements":0},"zero_grad":2,"zero_v":0,"frac":{"m":0.25,"v":0.75,"m_unchanged":0.25,"v_unchanged":0.75,"zero_v":0.0},"groups":{"attn":{"m":0.25,"v":0.75,"m_unchanged":0.25,"v_unchanged":0.75,"zero_v":0.0}},"theory":{"v":0.5}}"#
        );
    }
}
