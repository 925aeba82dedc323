//! Muon's momentum step on one matrix, per element in FP32: the CPU reference that the fused
//! kernel's momentum-only mode (`kernels/optim/adamw.cu`, `StepArgs::momentum_only`) matches
//! bit for bit. With b = [`crate::states::moments::Momentum::beta`] (the plan's `beta1`):
//! ```text
//! m_old = decode(m)                          (0 right after a reset; dither read back)
//! g = grad * grad_scale
//! m = b * m_old + (1 - b) * g                (AdamW's m with b1 = b: no FMA)
//! u = (1 - b) * g + b * m   (Nesterov)  or  u = m
//! m = encode(m)                              (nearest, stochastic or dither; stalls counted)
//! ```
//! u, from the unrounded m as AdamW's update is, is what Muon orthogonalises
//! ([`crate::rules::muon::orthogonalize`]).

use crate::rules::adamw::step::{write_back, Skip};
use crate::rules::step_plan::TensorPlan;
use crate::states::moments::TensorState;
use crate::states::stalls::StallCounts;

/// The momentum step of Muon tensor `t` (its whole matrix: Muon does not shard) under its part
/// `p` of the update's plan, from the FP32 gradient `g`: m updated in place, returns the update
/// u to orthogonalise and the counts (m's, and the zero gradients; v and the weights are
/// counted elsewhere or not at all).
///
/// # Panics
/// A tensor without [`TensorState::momentum`], or `g` not m's length.
pub fn momentum_step(t: &mut TensorState, p: &TensorPlan, g: &[f32]) -> (Vec<f32>, StallCounts) {
    let mo = t.momentum.expect("a Muon tensor");
    assert_eq!(g.len(), t.m.len, "{}: gradient length", t.info.name);
    let (h, k) = (&p.scalars, &p.keys);
    if h.reset_m {
        t.m.set_zero();
    }
    let (mut m, mut u) = (vec![0f32; g.len()], vec![0f32; g.len()]);
    let mut zero_grad = 0;
    {
        let read = t.m.reader(t.first, k.m_read);
        for (l, &grad) in g.iter().enumerate() {
            let gs = grad * h.grad_scale;
            zero_grad += u64::from(gs == 0.0);
            m[l] = h.beta1 * read.get(l) + h.one_minus_beta1 * gs;
            u[l] = if mo.nesterov { h.one_minus_beta1 * gs + h.beta1 * m[l] } else { m[l] };
        }
    }
    let skip = Skip { key: k.skip, threshold: h.skip_m, shift: 0 };
    let m_count = write_back(&mut t.m, &m, p.roundings.m, k.m, k.m_read, t.first, skip);
    (u, StallCounts { m: m_count, zero_grad, ..Default::default() })
}
