//! The program's device policy, in one place: which device a run trains on ([`open`]), how a
//! CUDA device is opened for training (no cross-stream event tracking; the memory pool keeps
//! what a step frees), and the pool's statistics ([`memory`]).

use anyhow::{bail, Result};
#[cfg(feature = "cuda")]
use candle_core::cuda::cudarc::driver::{result, sys};
use candle_core::Device;
#[cfg(feature = "cuda")]
use candle_core::{backend::BackendDevice, CudaDevice};

/// The device named in the config: `"cpu"`, or `"cuda"` = GPU `ordinal` (a data-parallel
/// worker's `LOCAL_RANK`, else 0), opened with `open_cuda` (`cuda` feature).
///
/// # Errors
/// An unknown name, `"cuda"` in a build without the `cuda` feature, or a GPU that cannot be
/// opened (named by its ordinal).
pub fn open(name: &str, ordinal: usize) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        "cuda" => {
            use anyhow::Context;
            Ok(Device::Cuda(open_cuda(ordinal).with_context(|| format!("cannot open CUDA device {ordinal}"))?))
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => {
            let _ = ordinal;
            bail!(
                "train.device = \"cuda\": this binary is the CPU build; run on the CPU with --device cpu, or build \
                 for CUDA (cargo build --release -p lowbit-cli --features cuda, CUDA set up as docs/gpu.md \
                 says)"
            )
        }
        d => bail!("train.device: unknown device {d:?}"),
    }
}

/// Open CUDA device `ordinal` for training. Candle runs every operation on one stream, so
/// cudarc's cross-stream event tracking (an event record and a stream wait per kernel
/// argument) is pure host overhead; it is switched off before any buffer exists. The device's
/// default memory pool (which candle allocates from, stream-ordered) keeps the memory a step
/// frees instead of returning it to the driver at every synchronisation (the pool's default
/// release threshold is 0): the next step reuses those blocks without mapping pages again, as
/// PyTorch's caching allocator does. What both bought: bench/training_h200.md, "Measurements behind choices in the code".
#[cfg(feature = "cuda")]
pub fn open_cuda(ordinal: usize) -> candle_core::Result<CudaDevice> {
    let dev = CudaDevice::new(ordinal)?;
    // SAFETY: nothing has been allocated on this device yet, and candle and lowbit's kernels
    // use the device's single stream, so no cross-stream synchronisation is needed.
    unsafe { dev.disable_event_tracking() };
    let mut threshold = u64::MAX;
    pool_attribute(&dev, |pool| {
        // SAFETY: the release threshold attribute is a u64 (cuuint64_t).
        unsafe { sys::cuMemPoolSetAttribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, ptr(&mut threshold)) }
    })
    .map_err(|e| candle_core::Error::Cuda(e.into()))?;
    Ok(dev)
}

/// Memory a run on `dev` can still take, bytes, and what it is: the host's available memory on
/// the CPU ([`crate::memory::host_available`]), the GPU's free memory on CUDA
/// (`cuMemGetInfo`); `None` when it cannot be read.
pub fn available_memory(dev: &Device) -> Option<(u64, &'static str)> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let free = d.cuda_stream().context().mem_get_info().ok()?.0;
            Some((free as u64, "the GPU's free memory"))
        }
        Device::Cpu => crate::memory::host_available().map(|b| (b, "this host's available memory")),
        _ => None,
    }
}

/// Memory of the device's default (stream-ordered) pool, which candle allocates from:
/// `(in use now, high-water mark since the start)`, bytes; `None` on the CPU.
pub fn memory(dev: &Device) -> Option<(u64, u64)> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let read = |a: sys::CUmemPool_attribute| {
                let mut v = 0u64;
                // SAFETY: the pool attributes USED_MEM_* are u64 (cuuint64_t).
                pool_attribute(d, |pool| unsafe { sys::cuMemPoolGetAttribute(pool, a, ptr(&mut v)) }).ok().map(|_| v)
            };
            Some((
                read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
                read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            ))
        }
        _ => None,
    }
}

/// Call `f` on the default memory pool of `dev` with its context bound to this thread.
#[cfg(feature = "cuda")]
fn pool_attribute(dev: &CudaDevice, f: impl FnOnce(sys::CUmemoryPool) -> sys::CUresult) -> Result<(), String> {
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    // SAFETY: the context is bound to this thread.
    let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.map_err(|e| e.to_string())?;
    f(pool).result().map_err(|e| e.to_string())
}

#[cfg(feature = "cuda")]
fn ptr(v: &mut u64) -> *mut std::ffi::c_void {
    v as *mut u64 as *mut std::ffi::c_void
}
