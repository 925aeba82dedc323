//! Token embedding lookup with a deterministic backward: rows are grouped by token id on the
//! host and each id's gradient row is summed in position order (no atomics, unlike candle's
//! `index_add`, which also runs serially over the positions).

use super::{args, alloc, cpu_unsupported, cuda_device, grid, launch, storage_ptr, tensor_ptr, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `w[ids[r], :]` for every id: `w` `[V, H]` (BF16 or F32), `ids` u32 (any shape, values
/// `< V`: the caller checks) → `[ids.len(), H]`. Differentiable in `w`; the backward reads
/// the ids to the host once (the last op of the backward, so the wait costs nothing).
pub fn embedding(w: &Tensor, ids: &Tensor) -> Result<Tensor> {
    w.contiguous()?.apply_op2(&ids.flatten_all()?.contiguous()?, Embedding)
}

pub(crate) struct Embedding;

/// Positions grouped by id: `(order, offsets, unique)`, positions ascending within an id.
fn group_by_id(ids: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&i| ids[i as usize]); // stable: positions stay ascending per id
    let (mut offsets, mut unique) = (Vec::new(), Vec::new());
    for (k, &i) in order.iter().enumerate() {
        if unique.last() != Some(&ids[i as usize]) {
            unique.push(ids[i as usize]);
            offsets.push(k as u32);
        }
    }
    offsets.push(order.len() as u32);
    (order, offsets, unique)
}

impl CustomOp2 for Embedding {
    fn name(&self) -> &'static str {
        "lowbit-fused-embedding"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }

    fn cuda_fwd(&self, ws: &CudaStorage, wl: &Layout, is: &CudaStorage, il: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = ws.device().clone();
        let (_, h) = wl.shape().dims2()?;
        let rows = il.shape().elem_count();
        let (w, ids) = (storage_ptr(ws, wl, "embedding weight")?, storage_ptr(is, il, "ids")?);
        let (out, y) = alloc(&dev, ws.dtype(), rows * h)?;
        let (r, hh) = (rows as i32, h as i32);
        launch(&dev, "embedding_fwd", ws.dtype(), grid((rows * h).div_ceil(THREADS as usize), 0), &args![w, ids, y, r, hh])?;
        Ok((out, Shape::from((rows, h))))
    }

    fn bwd(&self, w: &Tensor, ids: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dev = cuda_device(w)?;
        let (v, h) = w.dims2()?;
        let dy = dy.contiguous()?;
        let (order, offsets, unique) = group_by_id(&ids.to_vec1::<u32>()?);
        let device = w.device();
        let order = Tensor::from_vec(order, offsets[offsets.len() - 1] as usize, device)?;
        let n_unique = unique.len();
        let offsets = Tensor::from_vec(offsets, n_unique + 1, device)?;
        let unique = Tensor::from_vec(unique, n_unique, device)?;
        let dw = Tensor::zeros((v, h), w.dtype(), device)?;
        let (g, o, off, u, out) = (
            tensor_ptr(&dy, "dy")?,
            tensor_ptr(&order, "order")?,
            tensor_ptr(&offsets, "offsets")?,
            tensor_ptr(&unique, "unique")?,
            tensor_ptr(&dw, "dw")?,
        );
        let hh = h as i32;
        let cfg = LaunchConfig { grid_dim: (n_unique.max(1) as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        if n_unique > 0 {
            launch(&dev, "embedding_bwd", w.dtype(), cfg, &args![g, o, off, u, out, hh])?;
        }
        Ok((Some(dw), None))
    }
}
