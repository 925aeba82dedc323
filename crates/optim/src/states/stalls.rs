//! Stall counting (docs/numerics.md, "Stalling").
//!
//! An element of a state *stalls* at a step when its FP32 update is non-zero (the new FP32
//! value differs from the decoded stored one) but its stored representation is unchanged
//! after the write-back: the update was rounded away. The stored representation is the stored
//! bits for unscaled formats (FP32, BF16, e8mK) and the stored code for scaled ones (FP8, FP4,
//! int8): with an `amax` scale the decoded value of an unchanged code moves whenever the
//! block's scale moves, so comparing decoded values would read almost no stalls.
//!
//! Two estimators of the stalled fraction:
//! * lowbit's: stalled / updated (elements with a non-zero FP32 update);
//! * the paper's (arXiv:2603.16731v1, Def. 3.1 and Alg. 2): unchanged / all elements, where
//!   *unchanged* counts every element whose stored representation did not change, zero
//!   gradients included.

use serde::{Deserialize, Serialize};
use std::ops::AddAssign;

/// Element counts of one state kind at one step.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// Elements whose FP32 update was non-zero.
    pub updated: u64,
    /// Of those, elements whose stored representation did not change.
    pub stalled: u64,
    /// Elements whose stored representation did not change, updated or not (the paper's
    /// estimator's numerator; 0 in rows written before it was counted).
    #[serde(default)]
    pub unchanged: u64,
    /// Elements written back (the paper's estimator's denominator).
    #[serde(default)]
    pub elements: u64,
}

impl Counter {
    /// Count one element: `changed` = FP32 update non-zero, `same` = stored representation
    /// unchanged.
    #[inline(always)]
    pub fn add(&mut self, changed: bool, same: bool) {
        self.updated += changed as u64;
        self.stalled += (changed && same) as u64;
        self.unchanged += same as u64;
        self.elements += 1;
    }

    /// lowbit's estimator: stalled / updated, `None` when nothing was updated.
    pub fn fraction(&self) -> Option<f64> {
        (self.updated > 0).then(|| self.stalled as f64 / self.updated as f64)
    }

    /// Nothing counted (no element written back).
    pub fn is_empty(&self) -> bool {
        *self == Counter::default()
    }

    /// The paper's estimator (Alg. 2): unchanged / all elements, `None` without elements.
    pub fn unchanged_fraction(&self) -> Option<f64> {
        (self.elements > 0).then(|| self.unchanged as f64 / self.elements as f64)
    }
}

impl AddAssign for Counter {
    fn add_assign(&mut self, o: Counter) {
        self.updated += o.updated;
        self.stalled += o.stalled;
        self.unchanged += o.unchanged;
        self.elements += o.elements;
    }
}

/// Counters of one tensor (or group, or the whole model) at one step.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallCounts {
    /// First moment.
    pub m: Counter,
    /// Second moment.
    pub v: Counter,
    /// BF16 weights (zero counts for FP32 weights, which are written back exactly).
    pub w: Counter,
    /// Elements whose gradient (times the step's gradient factor) was exactly 0. After a
    /// reset of v without one of m these move by lr * m / eps at the first update.
    pub zero_grad: u64,
    /// Elements updated with v = 0 and m != 0 (the FP32 moments of the update, after a reset
    /// or a stored v that decoded to 0, with a zero gradient): each moved by lr * m^ / eps
    /// (bias-corrected m), the blow-up of a v rounded or reset to 0 (Li et al. 2023, "Memory
    /// Efficient Optimizers with 4-bit States", the zero-point problem). 0 in rows written
    /// before it was counted.
    #[serde(default)]
    pub zero_v: u64,
    /// SOAP's preconditioner EMAs L and R together (`optim.kind = "soap"`; [`crate::rules::soap`]):
    /// all zero under AdamW, and then left out of serialized rows.
    #[serde(default, skip_serializing_if = "Counter::is_empty")]
    pub precond: Counter,
}

impl AddAssign for StallCounts {
    fn add_assign(&mut self, o: StallCounts) {
        self.m += o.m;
        self.v += o.v;
        self.w += o.w;
        self.zero_grad += o.zero_grad;
        self.zero_v += o.zero_v;
        self.precond += o.precond;
    }
}

impl StallCounts {
    /// Number of words of [`Self::to_words`].
    pub const WORDS: usize = 18;

    /// Every count as one flat array (m, v, w: updated, stalled, unchanged, elements; then the
    /// zero gradients and the zero-v moves; then SOAP's preconditioners as m's), e.g. to sum
    /// them over ranks.
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        let (m, v, w) = (&self.m, &self.v, &self.w);
        [
            m.updated,
            m.stalled,
            m.unchanged,
            m.elements,
            v.updated,
            v.stalled,
            v.unchanged,
            v.elements,
            w.updated,
            w.stalled,
            w.unchanged,
            w.elements,
            self.zero_grad,
            self.zero_v,
            self.precond.updated,
            self.precond.stalled,
            self.precond.unchanged,
            self.precond.elements,
        ]
    }

    /// The inverse of [`Self::to_words`].
    pub fn from_words(x: &[u64; Self::WORDS]) -> Self {
        let kind = |a: &[u64]| Counter { updated: a[0], stalled: a[1], unchanged: a[2], elements: a[3] };
        StallCounts { m: kind(&x[0..4]), v: kind(&x[4..8]), w: kind(&x[8..12]), zero_grad: x[12], zero_v: x[13], precond: kind(&x[14..18]) }
    }
}

impl std::iter::Sum for StallCounts {
    fn sum<I: Iterator<Item = StallCounts>>(it: I) -> Self {
        let mut s = StallCounts::default();
        for x in it {
            s += x;
        }
        s
    }
}
