//! Data-parallel training: one process per GPU (or CPU process), launched by
//! `train --gpus N` (the `train` binary's launcher) or from outside with the torchrun/SLURM environment
//! ([`world`]); a TCP rendezvous at `MASTER_ADDR:MASTER_PORT` ([`rendezvous`]); the
//! collective operations the step needs ([`collective`]); the split of the global batch and
//! of the optimizer states over ranks ([`shard`], [`zero`]).
//!
//! Several ranks on GPUs sum their gradients through NCCL ([`nccl`], `nccl` feature) and,
//! with `train.zero = 1`, step their shards of the states on the GPU ([`zero_gpu`]).

pub mod collective;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rendezvous;
pub mod shard;
pub mod world;
pub mod zero;
#[cfg(feature = "cuda")]
pub mod zero_gpu;

use crate::optimizer::Optimizer;
use anyhow::Result;
use candle_core::Device;
use lowbit_optim::{LowbitAdamW, StatesSpec};
use collective::{Collective, Solo, TcpCollective};
use std::sync::Arc;
use world::World;

/// Joins the job described by `world`: a single process gets [`Solo`]; several meet at the
/// rendezvous and talk through the CPU backend ([`TcpCollective`]).
///
/// # Errors
/// Those of [`rendezvous::rendezvous`].
pub fn connect(world: &World) -> Result<Arc<dyn Collective>> {
    if world.world_size == 1 {
        return Ok(Arc::new(Solo));
    }
    tracing::info!(rank = world.rank, world_size = world.world_size, master = ?world.master, "rendezvous");
    let (_, links) = rendezvous::rendezvous(world, &[])?;
    Ok(Arc::new(TcpCollective::new(world.rank, world.world_size, links, world.timeout)?))
}

/// The collective a rank trains with on `dev`: `host` itself for one rank or on the CPU; for
/// several ranks on GPUs, NCCL for the gradients ([`nccl::NcclCollective`]) beside `host`.
///
/// # Errors
/// Several ranks on a GPU in a build without the `nccl` feature, or NCCL failing.
pub fn for_device(host: Arc<dyn Collective>, dev: &Device) -> Result<Arc<dyn Collective>> {
    if host.world_size() == 1 {
        return Ok(host);
    }
    match dev {
        Device::Cpu => Ok(host),
        #[cfg(feature = "nccl")]
        Device::Cuda(d) => Ok(Arc::new(nccl::NcclCollective::new(host, d)?)),
        _ => anyhow::bail!("{}", no_nccl_message(host.world_size())),
    }
}

/// Why several ranks cannot train on GPUs in this build (`None` when they can).
pub fn gpu_ranks_refused(world_size: usize) -> Option<String> {
    (!cfg!(feature = "nccl")).then(|| no_nccl_message(world_size))
}

fn no_nccl_message(world_size: usize) -> String {
    format!(
        "{world_size} ranks on GPUs need NCCL: this build has none (build with `--features cuda,nccl`, as \
         scripts/build_cuda.sh does), or train on the CPU (--device cpu)"
    )
}

/// The ZeRO-1 optimizer of this rank (`train.zero = 1`) for tensors of `lens` elements, and
/// the bytes of the states it holds: on the CPU [`zero::ShardedAdamW`] (ranges cut on scale
/// blocks, [`shard::granule`]); on a GPU [`zero_gpu::DeviceShardedAdamW`] (ranges also
/// starting at multiples of 4 elements, the fused kernel's vector width).
///
/// # Errors
/// Those of the optimizers' constructors.
pub fn sharded_optimizer(
    whole: &LowbitAdamW,
    lens: &[usize],
    spec: &StatesSpec,
    comm: Arc<dyn Collective>,
    dev: &Device,
) -> Result<(Box<dyn Optimizer>, usize)> {
    let world = comm.world_size();
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            // block sizes are multiples of 4 (StatesConfig::resolve); unscaled states cut anywhere
            let granule = shard::granule(spec).map(|g| g.max(4));
            let opt = zero_gpu::DeviceShardedAdamW::new(whole, shard::zero_ranges(lens, granule, world), comm, dev)?;
            let bytes = opt.local_state_bytes();
            Ok((Box::new(opt), bytes))
        }
        _ => {
            let opt = zero::ShardedAdamW::new(whole, shard::zero_ranges(lens, shard::granule(spec), world), comm)?;
            let bytes = opt.local_state_bytes();
            Ok((Box::new(opt), bytes))
        }
    }
}
