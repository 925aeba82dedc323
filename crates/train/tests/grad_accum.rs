//! Gradient accumulation weights micro-batches by target tokens: a step's loss and gradient
//! are the mean over all of its targets, whatever the split into micro-batches.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use lowbit_data::{load_tokenizer, DataConfig, DataPosition, SeqMode, TrainStream};
use lowbit_model::{init_params, Llama, LlamaConfig};
use lowbit_optim::{GradScale, HostStates, OptimError, Optimizer, StallCounts};
use lowbit_train::model::ParamSet;
use lowbit_train::step::{train_step, StepContext, StepReport};

mod common;

/// Keeps the gradients it is given (times the host's clip factor, as the optimizer would
/// use them; the CPU step decides the clip on the host).
struct Recorder {
    grads: Vec<Vec<f32>>,
}

impl Optimizer for Recorder {
    fn step(&mut self, _step: u64, _lr: f64, scale: GradScale, _params: &[Var], grads: &[Tensor]) -> Result<(), OptimError> {
        let GradScale::Host(grad_scale) = scale else { return Err(OptimError::State("a CPU step clips on the host".into())) };
        self.grads = grads
            .iter()
            .map(|g| Ok(g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?.iter().map(|x| x * grad_scale).collect()))
            .collect::<Result<_, OptimError>>()?;
        Ok(())
    }

    fn measured_counts(&mut self, _step: u64) -> Result<Vec<StallCounts>, OptimError> {
        Err(OptimError::State("the recorder keeps no stall counts".into()))
    }

    fn observe(&mut self, _step: u64, _total: &StallCounts) {}

    fn states(&mut self) -> Result<HostStates<'_>, OptimError> {
        Err(OptimError::State("the recorder keeps no states".into()))
    }
}

const SEQ_LEN: usize = 64;

/// 8 one-word documents (one target each in `truncate_pad`) then 8 long ones, one shard.
fn shard(dir: &std::path::Path) -> std::path::PathBuf {
    let long = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. ".repeat(12);
    let mut lines = Vec::new();
    for i in 0..16 {
        let text = if i < 8 { "Hello".to_string() } else { format!("{i} {long}") };
        lines.push(serde_json::json!({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com/"}).to_string());
    }
    let path = dir.join("docs.json");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// One step over the shard's 16 documents as `micro_batch` x `grad_accum`, no clipping:
/// the step's output and the gradient handed to the optimizer.
fn one_step(mode: SeqMode, micro_batch: usize, grad_accum: usize) -> Result<(StepReport, Vec<Vec<f32>>)> {
    let (out, grads) = step_with(mode, micro_batch, grad_accum, 0.0, false)?;
    assert!(out.updated);
    Ok((out, grads))
}

/// [`one_step`] with the global norm clipped to `grad_clip` (0: none) and, with `poison`, the
/// embedding's weights NaN (a non-finite loss): the step's output and the gradients times the
/// factor the optimizer was given (none when it was not called).
fn step_with(mode: SeqMode, micro_batch: usize, grad_accum: usize, grad_clip: f64, poison: bool) -> Result<(StepReport, Vec<Vec<f32>>)> {
    let dir = tempfile::tempdir()?;
    let path = shard(dir.path());
    let tok_path = common::root().join("data/tokenizers/t5-tokenizer.json");
    let cfg = DataConfig {
        train: vec![path.display().to_string()],
        validation: vec![path.display().to_string()],
        tokenizer: tok_path.display().to_string(),
        seq_len: SEQ_LEN,
        mode,
        ..DataConfig::default()
    };
    let tok = load_tokenizer(&cfg.tokenizer, false)?;
    let mcfg = LlamaConfig {
        vocab_size: tok.vocab_size(),
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 1,
        num_heads: 2,
        num_kv_heads: 2,
        max_seq_len: SEQ_LEN,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
    };
    let dev = Device::Cpu;
    let varmap = init_params(&mcfg, 3, DType::F32, &dev)?;
    let model = Llama::new(&mcfg, candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let params = ParamSet::from_varmap(&varmap);
    if poison {
        let embed = params.names.iter().position(|n| n.contains("embed_tokens")).expect("an embedding");
        let v = &params.vars[embed];
        v.set(&v.as_tensor().affine(0.0, f64::NAN)?)?;
    }
    let mut opt = Recorder { grads: Vec::new() };
    let mut stream = TrainStream::new(&cfg, &tok, DataPosition::default())?;
    let mut ctx = StepContext {
        model: &model,
        params: &params,
        opt: &mut opt,
        stream: &mut stream,
        device: &dev,
        micro_batch,
        grad_accum,
        grad_clip,
        comm: &lowbit_train::distributed::collective::Solo,
    };
    let out = train_step(&mut ctx, 1, 1, 1e-3, None)?;
    Ok((out, opt.grads))
}

/// Largest elementwise difference over the largest magnitude of `a`.
fn relative_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let (mut diff, mut scale) = (0f32, 0f32);
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        diff = diff.max((x - y).abs());
        scale = scale.max(x.abs());
    }
    diff / scale
}

/// The 8 x 2 and 16 x 1 splits of the same documents give the same step.
fn splits_agree(mode: SeqMode) -> Result<()> {
    let (split, g_split) = one_step(mode, 8, 2)?;
    let (whole, g_whole) = one_step(mode, 16, 1)?;
    eprintln!(
        "{mode:?}: 8x2 loss {} norm {} | 16x1 loss {} norm {} | tokens {} {}",
        split.loss, split.grad_norm, whole.loss, whole.grad_norm, split.tokens, whole.tokens
    );
    assert_eq!(split.tokens, whole.tokens);
    assert_eq!(g_split.len(), g_whole.len());
    assert!((split.loss - whole.loss).abs() < 1e-5 * whole.loss, "loss {} vs {}", split.loss, whole.loss);
    let norm_err = (split.grad_norm - whole.grad_norm).abs() / whole.grad_norm;
    assert!(norm_err < 1e-5, "grad norm {} vs {}", split.grad_norm, whole.grad_norm);
    let err = relative_difference(&g_whole, &g_split);
    assert!(err < 1e-5, "gradients differ by {err} of the largest element");
    Ok(())
}

#[test]
fn truncate_pad_splits_give_the_same_gradient() -> Result<()> {
    splits_agree(SeqMode::TruncatePad)
}

#[test]
fn concat_splits_give_the_same_gradient() -> Result<()> {
    splits_agree(SeqMode::Concat)
}

/// The clip and the skip through `train_step` (`clip_and_update`'s host path): with
/// `grad_clip` a quarter of the norm the optimizer applies gradients of norm `grad_clip` and
/// the report keeps the unclipped norm; a non-finite loss skips the update (the optimizer is
/// not called) and says so.
#[test]
fn the_step_clips_to_grad_clip_and_skips_a_non_finite_step() -> Result<()> {
    let (free, _) = step_with(SeqMode::TruncatePad, 16, 1, 0.0, false)?;
    let clip = free.grad_norm as f64 / 4.0;
    let (out, grads) = step_with(SeqMode::TruncatePad, 16, 1, clip, false)?;
    assert!(out.updated);
    assert_eq!(out.grad_norm, free.grad_norm, "the report's norm is before clipping");
    let applied = grads.iter().flatten().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    assert!((applied - clip).abs() < 1e-5 * clip, "applied norm {applied} vs grad_clip {clip}");
    let (out, grads) = step_with(SeqMode::TruncatePad, 16, 1, 1.0, true)?;
    assert!(!out.updated && !out.loss.is_finite(), "loss {} updated {}", out.loss, out.updated);
    assert!(grads.is_empty(), "the optimizer was called on a non-finite step");
    Ok(())
}
