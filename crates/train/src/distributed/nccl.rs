//! The NCCL backend of [`Collective`] (`nccl` feature): the step's gradients are summed on the
//! GPUs (`ncclAllReduce` on candle's stream, so it queues behind the backward and before the
//! optimizer with no host wait); the small host-side operations (stall counts, the config
//! check, checkpoint gathers) keep going through the CPU backend that the rendezvous set up.
//!
//! The communicator's unique id (128 bytes, `ncclGetUniqueId` on rank 0) reaches the other
//! ranks through that backend's broadcast: the TCP rendezvous at `MASTER_ADDR:MASTER_PORT`,
//! not a shared file.

use super::collective::Collective;
use anyhow::{anyhow, Result};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::nccl::safe::{group_end, group_start, Comm, Id, ReduceOp};
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp1, DType, InplaceOp1, Layout, Shape, Tensor};
use half::bf16;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

/// Several ranks on GPUs: NCCL for device tensors, `host` for everything else.
pub struct NcclCollective {
    host: Arc<dyn Collective>,
    comm: Mutex<SendComm>,
}

/// An NCCL communicator that may move between threads.
struct SendComm(Comm);

// SAFETY: NCCL allows a communicator to be used from any thread as long as calls on it do
// not overlap; the Mutex in `NcclCollective` serialises them.
unsafe impl Send for SendComm {}

impl NcclCollective {
    /// Creates this rank's communicator on `dev`'s stream; every rank of `host` must call
    /// it at the same point.
    ///
    /// # Errors
    /// NCCL missing or failing (named with the rank), or a peer lost during the id broadcast
    /// (the CPU backend names it).
    pub fn new(host: Arc<dyn Collective>, dev: &CudaDevice) -> Result<NcclCollective> {
        let rank = host.rank();
        let mut id = Vec::new();
        if rank == 0 {
            let fresh = Id::new().map_err(|e| anyhow!("rank 0: NCCL cannot make a unique id ({e:?})"))?;
            id = fresh.internal().iter().map(|&c| c as u8).collect();
        }
        host.broadcast(&mut id)?;
        let internal: [c_char; 128] = id
            .iter()
            .map(|&b| b as c_char)
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| anyhow!("rank {rank}: NCCL unique id of {} bytes from rank 0, expected 128", id.len()))?;
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread()?;
        let comm = Comm::from_rank(stream, rank, host.world_size(), Id::uninit(internal))
            .map_err(|e| anyhow!("rank {rank}: NCCL communicator of {} ranks: {e:?}", host.world_size()))?;
        tracing::info!(rank, world_size = host.world_size(), "NCCL communicator ready");
        Ok(NcclCollective { host, comm: Mutex::new(SendComm(comm)) })
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn world_size(&self) -> usize {
        self.host.world_size()
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        self.host.all_reduce_sum(buf)
    }
    fn sum_u64(&self, buf: &mut [u64]) -> Result<()> {
        self.host.sum_u64(buf)
    }
    fn all_gather(&self, local: &[u8], counts: &[usize]) -> Result<Vec<u8>> {
        self.host.all_gather(local, counts)
    }
    fn broadcast(&self, buf: &mut Vec<u8>) -> Result<()> {
        self.host.broadcast(buf)
    }
    /// `ncclAllReduce` (sum) of the tensor into a new buffer on the same stream. With two
    /// ranks every element is `x_0 + x_1` on both (FP32 addition commutes), so the ranks keep
    /// bit-identical weights.
    fn all_reduce_tensor(&self, t: &Tensor) -> Result<Tensor> {
        anyhow::ensure!(
            t.dtype() == DType::F32 && t.rank() == 1,
            "all_reduce_tensor takes a 1-D FP32 tensor, got {:?} {:?}",
            t.dtype(),
            t.shape()
        );
        let comm = self.comm.lock().expect("NCCL lock");
        Ok(t.apply_op1_no_bwd(&AllReduceSum(&comm.0))?)
    }
    /// One `ncclBroadcast` per view from its owner, in one NCCL group.
    fn broadcast_views(&self, owned: &[Vec<Tensor>]) -> Result<()> {
        // checked before the group: a rank failing inside it would leave the others waiting
        for v in owned.iter().flatten() {
            anyhow::ensure!(
                matches!(v.dtype(), DType::F32 | DType::BF16) && v.is_contiguous(),
                "NCCL broadcast of a {:?} view (contiguous: {}): F32 or BF16, contiguous",
                v.dtype(),
                v.is_contiguous()
            );
        }
        let comm = self.comm.lock().expect("NCCL lock");
        group_start().map_err(|e| anyhow!("ncclGroupStart: {e:?}"))?;
        let sent = owned.iter().enumerate().try_for_each(|(root, views)| {
            views.iter().filter(|v| v.elem_count() > 0).try_for_each(|v| v.inplace_op1(&BroadcastFrom { comm: &comm.0, root }))
        });
        group_end().map_err(|e| anyhow!("ncclGroupEnd: {e:?}"))?;
        Ok(sent?)
    }
}

/// `ncclAllReduce` (sum) as a candle op on CUDA storage.
struct AllReduceSum<'a>(&'a Comm);

impl CustomOp1 for AllReduceSum<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("NCCL all-reduce of a CPU tensor")
    }
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else { candle_core::bail!("NCCL all-reduce of a non-contiguous tensor") };
        let src = s.as_cuda_slice::<f32>()?.slice(start..end);
        let dev = s.device.clone();
        // SAFETY: every element is written by the all-reduce before anything reads it.
        let mut dst = unsafe { dev.alloc::<f32>(end - start)? };
        self.0.all_reduce(&src, &mut dst, &ReduceOp::Sum).map_err(|e| candle_core::Error::Msg(format!("ncclAllReduce: {e:?}")))?;
        Ok((CudaStorage::wrap_cuda_slice(dst, dev), l.shape().clone()))
    }
}

/// `ncclBroadcast` in place from rank `root`, as a candle op on (a view of) CUDA storage.
struct BroadcastFrom<'a> {
    comm: &'a Comm,
    root: usize,
}

impl InplaceOp1 for BroadcastFrom<'_> {
    fn name(&self) -> &'static str {
        "nccl-broadcast"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("NCCL broadcast of a CPU tensor")
    }
    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = l.contiguous_offsets() else { candle_core::bail!("NCCL broadcast of a non-contiguous tensor") };
        let root = self.root as i32;
        let status = match s.dtype() {
            DType::F32 => self.comm.broadcast_in_place(&mut s.as_cuda_slice_mut::<f32>()?.slice_mut(start..end), root),
            DType::BF16 => self.comm.broadcast_in_place(&mut s.as_cuda_slice_mut::<bf16>()?.slice_mut(start..end), root),
            d => candle_core::bail!("NCCL broadcast of {d:?} weights"),
        };
        status.map_err(|e| candle_core::Error::Msg(format!("ncclBroadcast from rank {root}: {e:?}")))?;
        Ok(())
    }
}
