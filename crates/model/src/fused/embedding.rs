//! Token embedding lookup (reference: `index_select` of the rows) with a deterministic
//! backward: positions are grouped by token id on the host ([`Grouping`]) and each id's
//! gradient row is summed in a fixed order (no atomics, unlike candle's `index_add`): eight
//! interleaved sums over its positions (the 1st, 9th, ...; the 2nd, 10th, ...), added in
//! turn, so that a frequent token's thousands of rows are read eight at a time.

use super::{alloc, args, cuda_device, grid, launch, tensor_ptr, wrap, BLOCK_THREADS};
use crate::fused_sizes::group_by_id;
use candle_core::cuda::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

/// `w[ids[r], :]` for every id: `w` `[V, H]` contiguous (BF16 or F32), `ids` u32 `[N]`
/// contiguous (values `< V`: the caller checks) → `[N, H]`.
pub fn forward(w: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(w)?;
    let (_, h) = w.dims2()?;
    let rows = ids.dims1()?;
    if ids.dtype() != DType::U32 {
        candle_core::bail!("embedding: ids must be u32, not {:?}", ids.dtype());
    }
    let (wp, ip) = (tensor_ptr(w, "embedding weight")?, tensor_ptr(ids, "ids")?);
    let (out, y) = alloc(&dev, w.dtype(), rows * h)?;
    let (r, hh) = (rows as i32, h as i32);
    launch(&dev, "embedding_fwd", w.dtype(), grid((rows * h).div_ceil(BLOCK_THREADS as usize), 0), &args![wp, ip, y, r, hh])?;
    Ok(wrap(out, (rows, h)))
}

/// Positions grouped by token id, on the device: the input of [`backward`]. Made on the
/// host from the ids ([`Grouping::new`], or [`HostGrouping::new`] then
/// [`HostGrouping::upload`]), so a training pass can make it while the device runs the
/// forward and the backward need not wait for an id read.
pub struct Grouping {
    /// Positions sorted by id (ascending positions within an id), `[N]` u32.
    order: Tensor,
    /// Where each distinct id's positions start in `order`, and the end: `[ids + 1]` u32.
    offsets: Tensor,
    /// The distinct ids, ascending: `[ids]` u32.
    unique: Tensor,
}

impl Grouping {
    /// The grouping of `ids` (host values), uploaded to `device`. Errors: an id not below
    /// `vocab` (the table's rows), which the backward would write past the table.
    pub fn new(ids: &[u32], vocab: usize, device: &candle_core::Device) -> Result<Self> {
        HostGrouping::new(ids, vocab)?.upload(device)
    }
}

/// A [`Grouping`] still on the host: made without the device (on any thread: the training
/// pass makes it on a second core while the first launches the layers), then uploaded.
pub struct HostGrouping {
    order: Vec<u32>,
    offsets: Vec<u32>,
    unique: Vec<u32>,
}

impl HostGrouping {
    /// The grouping of `ids`. Errors: an id not below `vocab` (the table's rows), which the
    /// backward would write past the table.
    pub fn new(ids: &[u32], vocab: usize) -> Result<Self> {
        if let Some(&max) = ids.iter().max() {
            if max as usize >= vocab {
                candle_core::bail!("embedding: input id {max} is not below the vocabulary size {vocab}");
            }
        }
        let (order, offsets, unique) = group_by_id(ids, vocab);
        Ok(HostGrouping { order, offsets, unique })
    }

    /// The grouping on `device` (three host-to-device copies).
    pub fn upload(self, device: &candle_core::Device) -> Result<Grouping> {
        let (n, n_unique) = (self.order.len(), self.unique.len());
        Ok(Grouping {
            order: Tensor::from_vec(self.order, n, device)?,
            offsets: Tensor::from_vec(self.offsets, n_unique + 1, device)?,
            unique: Tensor::from_vec(self.unique, n_unique, device)?,
        })
    }
}

/// The gradient of the table `w` (`[V, H]`, its dtype) from the output's gradient `dy`
/// `[N, H]` of [`forward`] with the ids that `grouping` grouped; rows of ids that do not
/// occur are 0. Each id's rows are summed in the fixed order of the module docs (no atomics).
/// Each element of `dy` is read once; wider tables than 1024 walk a token's positions once
/// per 1024 columns.
pub fn backward(w: &Tensor, grouping: &Grouping, dy: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(w)?;
    let (v, h) = w.dims2()?;
    let dy = dy.contiguous()?;
    if dy.dims() != [grouping.order.dims1()?, h] || dy.dtype() != w.dtype() {
        candle_core::bail!(
            "embedding backward: gradient {:?} for {} ids and table {:?}",
            dy.shape(),
            grouping.order.elem_count(),
            w.shape()
        );
    }
    let n_unique = grouping.unique.elem_count();
    let dw = Tensor::zeros((v, h), w.dtype(), w.device())?;
    let (g, o, off, u, out) = (
        tensor_ptr(&dy, "dy")?,
        tensor_ptr(&grouping.order, "order")?,
        tensor_ptr(&grouping.offsets, "offsets")?,
        tensor_ptr(&grouping.unique, "unique")?,
        tensor_ptr(&dw, "dw")?,
    );
    let hh = h as i32;
    let cfg = LaunchConfig { grid_dim: (n_unique.max(1) as u32, 1, 1), block_dim: (BLOCK_THREADS, 1, 1), shared_mem_bytes: 0 };
    if n_unique > 0 {
        launch(&dev, "embedding_bwd", w.dtype(), cfg, &args![g, o, off, u, out, hh])?;
    }
    Ok(dw)
}
