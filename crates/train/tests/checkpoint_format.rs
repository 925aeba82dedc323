//! Checkpoints written by an older lowbit still resume: `tests/fixtures/checkpoint_3ef565f/`
//! was written by commit 3ef565f (before the checkpoint's components saved themselves), from
//! the small deterministic training state [`fixture`] (two tensors, FP8 m / FP4 v with
//! stochastic rounding, 3 CPU steps, a data carry). Today's code must read back exactly that
//! state, and what it writes must read back the same.

use candle_core::{Device, Tensor, Var};
use lowbit_data::DataPosition;
use lowbit_optim::rules::adamw::step::Weights;
use lowbit_optim::{Hyper, LowbitAdamW, LowbitOptimizer, ParamInfo, Rounding, ScaleKind, StatesConfig};
use lowbit_train::checkpoint::{self, Saves};
use lowbit_train::components::ModelWeights;
use lowbit_train::train_state::{load_state, TrainState};
use std::path::{Path, PathBuf};

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint_3ef565f")
}

/// The weights of a VarMap by name.
fn weights(vm: &candle_nn::VarMap) -> Vec<(String, Vec<f32>)> {
    let mut v: Vec<(String, Vec<f32>)> =
        vm.data().lock().unwrap().iter().map(|(k, t)| (k.clone(), t.as_tensor().flatten_all().unwrap().to_vec1().unwrap())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A VarMap with the fixture's names and shapes, zeros, and an optimizer with fresh states.
fn blank() -> (candle_nn::VarMap, LowbitAdamW) {
    let (vm, opt, _) = fixture_with_steps(0);
    for (_, var) in vm.data().lock().unwrap().iter() {
        var.set(&var.as_tensor().zeros_like().unwrap()).unwrap();
    }
    (vm, opt)
}

/// The training state of the fixture after 3 steps.
fn fixture() -> (candle_nn::VarMap, LowbitAdamW, TrainState) {
    fixture_with_steps(3)
}

/// The fixture's update `step` of `weights` (one per tensor) with its deterministic gradients.
fn cpu_step(opt: &mut LowbitAdamW, weights: &mut [Vec<f32>], step: u64) {
    let plan = opt.moments.plan(step, 1e-3, 1.0).unwrap();
    for (idx, w) in weights.iter_mut().enumerate() {
        let g: Vec<f32> = (0..w.len()).map(|k| (((k as u64 * 7919 + step * 104_729) % 1000) as f32 / 500.0 - 1.0) * 1e-2).collect();
        opt.step_cpu(&plan, idx, Weights::F32(w), &g);
    }
}

fn fixture_with_steps(steps: u64) -> (candle_nn::VarMap, LowbitAdamW, TrainState) {
    let shapes: [(&str, &[usize]); 2] = [("model.layers.0.mlp.up_proj.weight", &[24, 16]), ("model.norm.weight", &[16])];
    let s = StatesConfig {
        m_format: "fp8".into(),
        v_format: "fp4".into(),
        block_size: 128,
        m_rounding: Rounding::Stochastic,
        v_rounding: Rounding::Stochastic,
        ..Default::default()
    };
    let spec = s.resolve(0.999).unwrap();
    let infos: Vec<ParamInfo> = shapes
        .iter()
        .map(|(n, d)| ParamInfo {
            name: n.to_string(),
            group: if n.contains("mlp") { "mlp" } else { "norm" }.into(),
            len: d.iter().product(),
            weight_decay: d.len() >= 2,
        })
        .collect();
    let hyper = Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-6, weight_decay: 0.1 };
    let mut opt = LowbitAdamW::new(hyper, spec, 11, infos.clone());
    let mut weights: Vec<Vec<f32>> = infos.iter().map(|i| (0..i.len).map(|k| ((k * 37 % 101) as f32 - 50.0) * 1e-3).collect()).collect();
    for step in 1..=steps {
        cpu_step(&mut opt, &mut weights, step);
    }
    let varmap = candle_nn::VarMap::new();
    {
        let mut data = varmap.data().lock().unwrap();
        for ((n, d), w) in shapes.iter().zip(&weights) {
            data.insert(n.to_string(), Var::from_tensor(&Tensor::from_vec(w.clone(), *d, &Device::Cpu).unwrap()).unwrap());
        }
    }
    let state = TrainState {
        step: 3,
        tokens: 3 * 64,
        data: DataPosition { carry: vec![5, 6, 7], ..DataPosition::default() },
        nonfinite_in_row: 0,
        updates: 3,
        m_format: spec.m_format,
        v_format: spec.v_format,
        block_size: spec.block_size,
        v_zero: Some(spec.v_zero),
        m_scale: Some(ScaleKind::Pow2),
        v_scale: Some(ScaleKind::Amax),
        reset: None, // (not recorded by 3ef565f: periodic)
        adaptive_reset: None,
        params: infos.iter().map(|i| (i.name.clone(), i.len)).collect(),
        rng: lowbit_optim::states::rng::SCHEME.into(),
        ranks: 1,
        global_batch: 2,
        tensor_states: Default::default(),
        precond: None,
    };
    (varmap, opt, state)
}

/// The checkpoint `dir` loaded into `vm` and `opt` (the optimizer as the trainer restores it,
/// [`LowbitOptimizer`]).
fn loaded(dir: &std::path::Path, vm: &candle_nn::VarMap, opt: LowbitAdamW) -> LowbitAdamW {
    let mut host = LowbitOptimizer::AdamW(opt);
    checkpoint::load(dir, &mut [&mut ModelWeights(vm), &mut host]).unwrap();
    let LowbitOptimizer::AdamW(opt) = host else { unreachable!("AdamW stays AdamW") };
    opt
}

#[test]
fn a_checkpoint_from_an_older_lowbit_resumes_exactly() {
    let dir = committed();
    lowbit_train::manifest::verify(&dir).unwrap();
    let (want_vm, want_opt, want_state) = fixture();
    assert_eq!(load_state(&dir).unwrap(), want_state, "state.json and the data carry");
    let (vm, opt) = blank();
    assert_ne!(weights(&vm), weights(&want_vm));
    let mut opt = loaded(&dir, &vm, opt);
    assert_eq!(weights(&vm), weights(&want_vm), "weights");
    for (got, want) in opt.moments.tensors.iter().zip(&want_opt.moments.tensors) {
        assert_eq!((&got.m, &got.v), (&want.m, &want.v), "{}: stored states", want.info.name);
    }
    assert!(want_opt.moments.tensors[0].v.scales.iter().any(|&s| s > 0.0), "the fixture's states are not empty");
    // and training goes on from it: step 4 from the loaded states is step 4 of a run that
    // never stopped (weights and stored states, bit for bit)
    let mut w: Vec<Vec<f32>> = weights(&vm).into_iter().map(|(_, w)| w).collect();
    cpu_step(&mut opt, &mut w, 4);
    let (straight_vm, straight_opt, _) = fixture_with_steps(4);
    let straight: Vec<Vec<f32>> = weights(&straight_vm).into_iter().map(|(_, w)| w).collect();
    assert_eq!(w, straight, "weights after a step from the loaded checkpoint");
    for (got, want) in opt.moments.tensors.iter().zip(&straight_opt.moments.tensors) {
        assert_eq!((&got.m, &got.v), (&want.m, &want.v), "{}: states after a step from the loaded checkpoint", want.info.name);
    }
}

/// What today's code writes reads back the same, and a checkpoint of another model is refused
/// naming the file and the tensor.
#[test]
fn checkpoints_round_trip_and_name_what_does_not_fit() {
    let (vm, opt, state) = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let files = [("state.json", state.to_json().unwrap()), ("config.toml", b"# test\n".to_vec())];
    let opt = LowbitOptimizer::AdamW(opt);
    let components: [&dyn Saves; 3] = [&ModelWeights(&vm), &opt, &state.data];
    let dir = checkpoint::save(tmp.path(), state.step, 1, &components, &files).unwrap();
    assert_eq!(load_state(&dir).unwrap(), state);
    let (vm2, opt2) = blank();
    let opt2 = loaded(&dir, &vm2, opt2);
    assert_eq!(weights(&vm2), weights(&vm));
    assert_eq!(opt2.moments.tensors[0].m, opt.moments().tensors[0].m);
    // another model: a tensor the checkpoint lacks
    let other = candle_nn::VarMap::new();
    other.data().lock().unwrap().insert("lm_head.weight".into(), Var::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap());
    let e = format!("{:#}", checkpoint::load(&dir, &mut [&mut ModelWeights(&other)]).unwrap_err());
    assert!(e.contains("model.safetensors") && e.contains("missing tensor lm_head.weight"), "{e}");
}

/// `state.json` reads and writes byte for byte as it did before its settings were typed:
/// `tests/fixtures/state_json_37976cb/` was written by commit 37976cb (string fields), with an
/// int8 m (no scale kind: `""`) and an fp4 v (`amax`), and with precision-only m and bf16 v.
#[test]
fn state_json_reads_and_writes_as_before_its_settings_were_typed() {
    use lowbit_optim::{ResetRule, StateFormat, VZero};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state_json_37976cb");
    let read = |name: &str| -> (String, TrainState) {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let state = serde_json::from_str(&text).unwrap();
        (text, state)
    };
    let (text, state) = read("int8_fp4ue2m2.json");
    assert_eq!((state.m_format, state.v_format), (StateFormat::Int8, StateFormat::Fp4UE2M2));
    assert_eq!(
        (state.m_scale, state.v_scale, state.v_zero, state.reset),
        (None, Some(ScaleKind::Amax), Some(VZero::Exclude), Some(ResetRule::Adaptive))
    );
    assert_eq!(String::from_utf8(state.to_json().unwrap()).unwrap(), text);
    let (text, state) = read("e8m3_bf16.json");
    assert_eq!((state.m_format, state.v_format, state.v_zero), (StateFormat::E8m(3), StateFormat::Bf16, Some(VZero::Keep)));
    assert_eq!(String::from_utf8(state.to_json().unwrap()).unwrap(), text);
}
