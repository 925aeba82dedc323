//! What a report's runs were, said from their resolved config (not from the scale's name): the
//! model and its size, the data and its order, the tokens per step and steps, the optimizer's
//! schedule, validation and device. Why each scale has its shape is prose for readers, in
//! docs/reproduce.md ("Scales").

use super::scale::Scale;
use lowbit_train::config::{RunConfig, WeightDtype};

/// One paragraph describing the runs of `cfg` (any of the report's runs: the setting is the
/// same for every cell but its states) at `scale`, with the model's parameter count and the
/// passes over the training text where a record gives them.
pub fn describe(scale: Scale, cfg: &RunConfig, params: Option<usize>, passes: Option<f64>) -> String {
    let model = match &cfg.model.preset {
        Some(p) => format!("`{p}` model"),
        None => "a model of explicit dimensions".into(),
    };
    let size = params.map_or(String::new(), |p| format!(" ({:.1}M parameters)", p as f64 / 1e6));
    let weights = match cfg.model.dtype {
        WeightDtype::Bf16 => "BF16 weights and activations",
        WeightDtype::Bf16Mixed => "FP32 master weights, BF16 matrix products and activations (bf16-mixed)",
        WeightDtype::F32 => "FP32 weights and activations",
    };
    let d = &cfg.data;
    let order = if d.shuffle { "rows shuffled" } else { "rows in file order" };
    let t = &cfg.train;
    let seqs = t.micro_batch * t.grad_accum;
    let per_step = seqs * d.seq_len;
    let tokens = per_step as f64 * t.max_steps as f64;
    let passes = passes.map_or(String::new(), |p| format!(", {p:.2} passes over the training text"));
    let o = &cfg.optim;
    let eval = if t.eval_every == 0 { "at the end".to_string() } else { format!("every {} steps", t.eval_every) };
    format!(
        "**Setting** (from the runs' resolved config, scale `{}`; why this shape: docs/reproduce.md, \"Scales\"): \
         {model}{size}, {weights}; training data {} ({order}), validation {}; sequence length {}, {seqs} sequences \
         = {per_step} tokens per step, {} steps ({:.1}M tokens{passes}); AdamW (b1 {}, b2 {}, eps {:e}), linear \
         warmup {} steps then cosine to {}% of peak lr {:e}, gradient clip {}; validation {eval} on {} tokens; device \
         {}. Reset periods of the resetting cells: the paper's (FP32/BF16 {}, FP8 {}, FP4 {} steps) unless an \
         override below says otherwise.",
        scale.as_str(),
        files(&d.train),
        files(&d.validation),
        d.seq_len,
        t.max_steps,
        tokens / 1e6,
        o.beta1,
        o.beta2,
        o.eps,
        o.warmup_steps,
        (o.min_lr_ratio * 100.0).round(),
        o.lr,
        o.grad_clip,
        d.val_tokens,
        t.device,
        super::reset_period(scale, super::Fmt::Bf16),
        super::reset_period(scale, super::Fmt::Fp8),
        super::reset_period(scale, super::Fmt::Fp4),
    )
}

/// A list of shard patterns as the report names them: `` `a` + `b` ``.
fn files(list: &[String]) -> String {
    list.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(" + ")
}
