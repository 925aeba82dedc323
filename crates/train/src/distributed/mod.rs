//! Data-parallel training: one process per GPU (or CPU process), launched by
//! `train --gpus N` (the `train` binary's launcher) or from outside with the torchrun/SLURM environment
//! ([`world`]); a TCP rendezvous at `MASTER_ADDR:MASTER_PORT` ([`rendezvous`]); the
//! collective operations the step needs ([`collective`]); what the ranks agree on before they
//! train ([`agreement`]); the split of the global batch and of the optimizer states over ranks
//! ([`shard`], [`zero`]).
//!
//! Several ranks on GPUs sum their gradients through NCCL (`nccl`, `nccl` feature) and,
//! with `train.zero = 1`, step their shards of the states on the GPU ([`zero`]).

pub mod agreement;
pub mod collective;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rendezvous;
pub mod shard;
pub mod world;
pub mod zero;

use anyhow::Result;
use candle_core::Device;
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
/// several ranks on GPUs, NCCL for the gradients (`nccl::NcclCollective`) beside `host`.
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
