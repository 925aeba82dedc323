//! The optimizer a run trains with: the update rule and its states for the model's parameters
//! as `[optim]` says ([`states`]), and the optimizer that steps them on the run's device, whole or as this
//! rank's ZeRO-1 shard ([`for_run`]), with their sizes ([`RunSizes`]).

use crate::config::RunConfig;
use crate::distributed::collective::Collective;
use crate::distributed::zero::Zero1;
use crate::logs::summary::StateGroup;
use crate::model::{param_infos, ParamSet};
use anyhow::Result;
use candle_core::Device;
use lowbit_optim::{Hyper, LowbitAdamW, LowbitMuon, LowbitOptimizer, LowbitSoap, Moments, Optimizer, OptimizerKind, StatesPlan};
use std::sync::Arc;

/// Fresh optimizer states for `params`: each tensor's as `plan` gives them, `[optim]`'s
/// hyper-parameters, `train.seed`'s random streams, simulated stalling (if any) after the
/// learning rate's warmup (`optim.warmup_steps`, as the schedule cuts it); with
/// `optim.kind = "soap"` SOAP's preconditioners for the parameters' shapes; with
/// `optim.kind = "muon"` Muon's momentum alone for the attention and MLP matrices.
///
/// # Errors
/// A parameter outside the LLaMA layout ([`param_infos`]), or a group of `plan` the model does
/// not have.
pub fn states(cfg: &RunConfig, plan: StatesPlan, params: &ParamSet) -> Result<LowbitOptimizer> {
    let infos = param_infos(params)?;
    plan.check_groups(infos.iter().map(|i| i.group.as_str())).map_err(anyhow::Error::msg)?;
    let o = &cfg.optim;
    let hyper = Hyper { beta1: o.beta1, beta2: o.beta2, eps: o.eps, weight_decay: o.weight_decay };
    let mut moments = Moments::new(hyper, plan, cfg.train.seed, infos);
    moments.skip_after = o.warmup_steps.min(cfg.train.max_steps.saturating_sub(1));
    let dims: Vec<Vec<usize>> = params.vars.iter().map(|v| v.dims().to_vec()).collect();
    Ok(match o.kind {
        OptimizerKind::Adamw => LowbitOptimizer::AdamW(LowbitAdamW::from_moments(moments)),
        OptimizerKind::Soap => LowbitOptimizer::Soap(LowbitSoap::new(moments, o.soap, &dims)),
        OptimizerKind::Muon => LowbitOptimizer::Muon(LowbitMuon::new(moments, o.muon, &dims)),
    })
}

/// The sizes of a run's model and optimizer states (for its summary).
#[derive(Debug, Clone)]
pub struct RunSizes {
    /// Parameters of the model.
    pub n_params: usize,
    /// Bytes of all optimizer states (codes + scales).
    pub state_bytes: usize,
    /// Optimizer state bytes this rank holds (its shard with `train.zero = 1`).
    pub rank_state_bytes: usize,
    /// Which tensors got which states (`summary.json`'s `state_groups`).
    pub state_groups: Vec<StateGroup>,
}

/// The optimizer of the states `host` on `dev` (`train.zero = 1`: this rank's shard of them,
/// the ranks of `comm` holding the others), with the sizes of the states and of the model's
/// `n_params` parameters.
///
/// # Errors
/// The device's optimizer refusing the states ([`lowbit_optim::for_device`], [`Zero1::new`]).
pub fn for_run(
    host: LowbitOptimizer,
    n_params: usize,
    cfg: &RunConfig,
    comm: &Arc<dyn Collective>,
    dev: &Device,
) -> Result<(Box<dyn Optimizer>, RunSizes)> {
    let state_bytes = host.states().state_bytes();
    let mut sizes = RunSizes { n_params, state_bytes, rank_state_bytes: state_bytes, state_groups: StateGroup::of(host.states()) };
    if cfg.train.zero == 0 {
        return Ok((lowbit_optim::for_device(host, dev)?, sizes));
    }
    let opt = Zero1::new(&host, comm.clone(), dev)?;
    sizes.rank_state_bytes = opt.local_state_bytes();
    tracing::info!(
        "train.zero = 1: rank {} of {} holds {} bytes of optimizer states",
        comm.rank(),
        comm.world_size(),
        sizes.rank_state_bytes
    );
    Ok((Box::new(opt), sizes))
}
