//! Stall counting (DESIGN.md, "Stalling").
//!
//! An element of a state *stalls* at a step when its FP32 update is non-zero (the new FP32
//! value differs from the stored one) but the stored, decoded value is bit-identical after
//! the write-back: the update was rounded away. Stalled fraction = stalled / updated.

use serde::{Deserialize, Serialize};
use std::ops::AddAssign;

/// Updated and stalled element counts of one state kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// Elements whose FP32 update was non-zero.
    pub updated: u64,
    /// Of those, elements whose stored value did not change.
    pub stalled: u64,
}

impl Counter {
    /// Count one element: `changed` = FP32 update non-zero, `same` = stored bits unchanged.
    #[inline(always)]
    pub fn add(&mut self, changed: bool, same: bool) {
        self.updated += changed as u64;
        self.stalled += (changed && same) as u64;
    }

    /// stalled / updated, `None` when nothing was updated.
    pub fn fraction(&self) -> Option<f64> {
        (self.updated > 0).then(|| self.stalled as f64 / self.updated as f64)
    }
}

impl AddAssign for Counter {
    fn add_assign(&mut self, o: Counter) {
        self.updated += o.updated;
        self.stalled += o.stalled;
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
}

impl AddAssign for StallCounts {
    fn add_assign(&mut self, o: StallCounts) {
        self.m += o.m;
        self.v += o.v;
        self.w += o.w;
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
