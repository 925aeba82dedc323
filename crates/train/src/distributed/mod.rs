//! Data-parallel training: one process per GPU (or CPU process), launched by
//! `train --gpus N` ([`launcher`]) or from outside with the torchrun/SLURM environment
//! ([`world`]); a TCP rendezvous at `MASTER_ADDR:MASTER_PORT` ([`rendezvous`]); the
//! collective operations the step needs ([`collective`]); the split of the global batch and
//! of the optimizer states over ranks ([`shard`], [`zero`]).
//!
//! The NCCL backend of [`collective::Collective`] for GPUs is not built yet (it needs a
//! multi-GPU machine to validate); a CUDA run with more than one rank is refused.

pub mod collective;
pub mod launcher;
pub mod rendezvous;
pub mod shard;
pub mod world;
pub mod zero;

use anyhow::Result;
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
