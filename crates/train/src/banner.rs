//! What a run is about to do, said once when it starts ([`banner`]): the model, the states
//! (by group when they differ) and their bytes, the batch, the device, the weight decay, the
//! data and its passes, and the closed-form stall prediction.

use crate::config::RunConfig;
use crate::logs::stalls::Theory;
use crate::logs::summary::StateGroup;
use crate::model::TrainModel;
use crate::setting_warnings::passes_planned;
use lowbit_data::TrainStream;
use lowbit_model::LlamaConfig;
use lowbit_optim::{LowbitOptimizer, ParamInfo};

/// The banner of a run of `cfg` on `world` ranks: model `model` of dims `mcfg`, the optimizer
/// states of `opt`, the training stream `stream`, the stall prediction `theory`.
pub fn banner(
    cfg: &RunConfig,
    mcfg: &LlamaConfig,
    model: &TrainModel,
    opt: &LowbitOptimizer,
    stream: &TrainStream,
    theory: &Theory,
    world: usize,
) -> String {
    let states = opt.states();
    let (spec, n_params, state_bytes) = (&states.moments.spec, model.params.num_params(), states.state_bytes());
    let mut banner = format!(
        "model {} params ({} layers, hidden {}, {}, {:?} kernels) | states m={} v={} ({} / {}): {} bytes = {:.3} bytes/param | batch {} x {} tokens{} | device {}\nstates: {}",
        n_params,
        mcfg.num_layers,
        mcfg.hidden_size,
        precision(model),
        model.llama.kernels(),
        spec.m_format.name(),
        spec.v_format.name(),
        spec.m_rounding.as_str(),
        spec.v_rounding.as_str(),
        state_bytes,
        state_bytes as f64 / n_params as f64,
        cfg.train.micro_batch.saturating_mul(cfg.train.grad_accum),
        cfg.data.seq_len,
        match world {
            1 => String::new(),
            w => format!(" ({w} ranks x micro-batch {} x {} accumulated)", cfg.train.micro_batch, cfg.train.grad_accum / w),
        },
        cfg.train.device,
        spec.describe(),
    );
    if let LowbitOptimizer::Soap(soap) = opt {
        let c = &soap.config;
        banner += &format!(
            "\noptimizer: SOAP ({}; refresh every {} updates, preconditioner EMA {}, sides up to {} preconditioned; FP32 eigenbases)",
            match (c.precond_format, soap.precond.precond_storage()) {
                (Some(_), Some(lr)) => format!("m and v in these states, L and R in {lr}"),
                _ => "m, v, L, R in these states".into(),
            },
            c.precondition_frequency,
            c.shampoo_beta,
            c.max_precond_dim
        );
    }
    if let LowbitOptimizer::Muon(muon) = opt {
        let c = &muon.config;
        let matrices: Vec<_> = muon.moments.tensors.iter().filter(|t| t.momentum.is_some()).collect();
        banner += &format!(
            "\noptimizer: Muon for {} attention and MLP matrices ({} params: their momentum alone, in m's format; momentum {}{}, \
             {} Newton-Schulz steps, update RMS {} x lr), AdamW for the other tensors",
            matrices.len(),
            matrices.iter().map(|t| t.info.len).sum::<usize>(),
            c.momentum,
            if c.nesterov { " Nesterov" } else { "" },
            c.ns_steps,
            c.update_rms
        );
    }
    let state_groups = StateGroup::of(states);
    if state_groups.len() > 1 {
        banner += &state_groups.iter().map(|g| format!("\n{}", g.line())).collect::<String>();
    }
    let infos: Vec<ParamInfo> = states.moments.tensors.iter().map(|t| t.info.clone()).collect();
    banner += &format!("\n{}", weight_decay_line(&infos, cfg.optim.weight_decay));
    banner += &format!(
        "\ndata: {} | {} target tokens per pass{}; {} steps make {:.2} passes",
        stream.order().describe(),
        stream.pass_size().tokens,
        if stream.pass_size().exact { "" } else { " (estimated from the shards' size)" },
        cfg.train.max_steps,
        passes_planned(cfg, stream.pass_size())
    );
    if let Some(p) = theory.v {
        banner += &format!("\ntheory: v stalled fraction {p:.3} for {} at b2 = {}", spec.v_format.name(), cfg.optim.beta2);
    }
    banner
}

/// The banner's weights and compute: `F32 weights` (or BF16), or for mixed precision
/// (`model.dtype = "bf16-mixed"`) `F32 weights, BF16 compute`.
fn precision(model: &TrainModel) -> String {
    match (model.dtype, model.compute_dtype) {
        (w, c) if w == c => format!("{w:?} weights"),
        (w, c) => format!("{w:?} weights, {c:?} compute"),
    }
}

/// The banner's weight-decay line: which tensors take it.
fn weight_decay_line(infos: &[ParamInfo], weight_decay: f64) -> String {
    let (decayed, kept): (Vec<&ParamInfo>, Vec<&ParamInfo>) = infos.iter().partition(|i| i.weight_decay);
    let count = |v: &[&ParamInfo]| v.iter().map(|i| i.len).sum::<usize>();
    format!(
        "weight decay {weight_decay} on {} matrices ({} parameters), none on {} vectors ({} parameters: norm gains)",
        decayed.len(),
        count(&decayed),
        kept.len(),
        count(&kept)
    )
}
