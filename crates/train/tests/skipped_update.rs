//! What a skipped (non-finite) step means for resets and bias correction.
//!
//! The trainer gives the optimizer the number of *applied* updates as its step (`step.rs`,
//! `train_step`): a skipped step does not exist for the optimizer, so a reset due at it
//! happens at the next applied update and the bias-correction count restarts there too.
//! The case: FP32 states, resets every 10, constant gradient 1, step 11 skipped.

use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::{Hyper, LowbitAdamW, ParamInfo, StatesConfig};

/// Applies updates `1..=updates` to a one-element weight with gradient 1 and lr 1; returns
/// the last update's size and m after it.
fn run(steps: &[u64]) -> (f32, f32) {
    let states: StatesConfig =
        toml::from_str("m_format = \"fp32\"\nv_format = \"fp32\"\nm_reset_every = 10\nv_reset_every = 10\n").unwrap();
    let spec = states.resolve(0.999).unwrap();
    let info = ParamInfo { name: "w".into(), group: "mlp".into(), len: 1, weight_decay: false };
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let mut opt = LowbitAdamW::new(hyper, spec, 0, vec![info]);
    let mut w = [0f32];
    let mut last = 0.0;
    for &s in steps {
        let before = w[0];
        let plan = opt.moments.plan(s, 1.0, 1.0).unwrap();
        opt.step_cpu(&plan, 0, Weights::F32(&mut w), &[1.0]);
        last = before - w[0];
    }
    (last, opt.moments.tensors[0].m.decode_all()[0])
}

#[test]
fn a_reset_due_at_a_skipped_step_happens_at_the_next_update_with_a_fresh_bias_correction() {
    // Trainer steps 1..=12 with step 11 skipped: the optimizer sees updates 1..=11.
    let applied: Vec<u64> = (1..=11).collect();
    let (update, m) = run(&applied);
    assert!((update - 1.0).abs() < 1e-5, "step 12's update is {update} * lr, not lr");
    assert!((m - 0.1).abs() < 1e-6, "m after the reset and one update: {m}");
    // and trainer step 13 (update 12): m = 0.19, still lr
    let (update, m) = run(&(1..=12).collect::<Vec<_>>());
    assert!((update - 1.0).abs() < 1e-5 && (m - 0.19).abs() < 1e-6, "{update} {m}");

    // Keyed to the trainer's step (the old behaviour) the reset is lost while the
    // bias-correction count restarts: the 1.543 * lr with m = 0.686 left over.
    let mut old: Vec<u64> = (1..=10).collect();
    old.push(12);
    let (update, m) = run(&old);
    assert!((update - 1.543).abs() < 1e-3 && (m - 0.686).abs() < 1e-3, "{update} {m}");
}
