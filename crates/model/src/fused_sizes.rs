//! What the fused CUDA ops ([`crate::fused`]) decide on the host from sizes alone: the
//! padding of matrix extents, the LM head's chunks of rows, the embedding backward's grouping
//! of positions by token id, and the attention kernels' launch geometry. Compiled in
//! every build, so CPU tests (below) check it; the CUDA ops call it.

/// A matrix extent padded to a multiple of 8 elements. cuBLAS picks its Hopper kernels only
/// when every extent and row stride is (16 bytes in BF16); LLaMA-100M's 1708-wide MLP and
/// the T5 vocabulary's 32100 logits otherwise run Ampere kernels for 2-element alignment
/// at about a third of the speed. The fused ops pad with zero rows and columns of the
/// weights, so the padding of every product is exactly 0.
pub(crate) fn aligned(cols: usize) -> usize {
    cols.div_ceil(8) * 8
}

/// The chunks `(first row, rows)` that cover `n` rows `chunk` at a time, in order (the last
/// one shorter); none for `n = 0`. `chunk > 0`.
pub(crate) fn row_chunks(n: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(chunk).map(move |r0| (r0, chunk.min(n - r0)))
}

/// Largest logits row, in bytes, that the cross-entropy backward keeps in shared memory
/// (`cross_entropy_bwd_staged`, `kernels/model/cross_entropy.cuh`): it then reads the row from
/// global memory once instead of twice. 112 KiB leaves room for two blocks per SM on Hopper
/// (228 KiB of shared memory per SM, 227 KiB per block); the launcher lowers it to what the
/// device allows one block ([`ce_stage_limit`]).
pub(crate) const CE_STAGED_MAX_BYTES: usize = 112 * 1024;

/// The staging limit for a device whose blocks may opt in to `optin` bytes of shared memory
/// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`): [`CE_STAGED_MAX_BYTES`], or less
/// 1 KiB for the kernel's static shared memory where the device allows less (Ada and
/// Ampere consumer parts: 99 KiB).
pub(crate) fn ce_stage_limit(optin: usize) -> usize {
    CE_STAGED_MAX_BYTES.min(optin.saturating_sub(1024))
}

/// The dynamic shared memory (bytes) of the cross-entropy backward for rows of `v` elements of
/// `elt` bytes: the row's size rounded up to 16 bytes, or `None` above `limit`
/// ([`ce_stage_limit`]: the unstaged kernel). On Hopper the T5 vocabulary's BF16 rows
/// (32,100 x 2 B) are staged, its FP32 rows (125 KiB) are not.
pub(crate) fn ce_staged_bytes(v: usize, elt: usize, limit: usize) -> Option<usize> {
    let bytes = (v * elt).div_ceil(16) * 16;
    (bytes <= limit).then_some(bytes)
}

/// Positions grouped by id: `(order, offsets, unique)`: `order` the positions sorted by id
/// (stable: positions ascend within an id), `unique` the distinct ids ascending, and id
/// `unique[k]`'s positions at `order[offsets[k]..offsets[k + 1]]` (`offsets` has one more
/// entry than `unique`; its last is `ids.len()`). A counting sort over the `bins` possible ids
/// (the vocabulary): O(ids + bins) host work, ~0.15 ms for a 32,768-token step, where the
/// comparison sort it replaced took ~1 ms and kept the GPU idle in LLaMA-20M's step
/// (bench/training_h100.md, "The profile after"). Panics on an id not below `bins` (callers
/// check first).
pub(crate) fn group_by_id(ids: &[u32], bins: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    debug_assert!(ids.len() <= u32::MAX as usize, "positions are u32");
    // per id: its count, then the next free slot of its positions in `order`
    let mut next = vec![0u32; bins];
    for &id in ids {
        next[id as usize] += 1;
    }
    let (mut offsets, mut unique) = (Vec::new(), Vec::new());
    let mut start = 0u32;
    for (id, slot) in next.iter_mut().enumerate() {
        let count = *slot;
        if count > 0 {
            unique.push(id as u32);
            offsets.push(start);
        }
        *slot = start;
        start += count;
    }
    offsets.push(start);
    let mut order = vec![0u32; ids.len()];
    for (position, &id) in ids.iter().enumerate() {
        let slot = &mut next[id as usize];
        order[*slot as usize] = position as u32;
        *slot += 1;
    }
    (order, offsets, unique)
}

/// Threads per block of the kernels of `kernels/model/ops.cu` (`BLOCK_THREADS`, `common.cuh`).
pub(crate) const BLOCK_THREADS: u32 = 256;
/// Warps per block of the row kernels, one row per warp (`WARPS`, `common.cuh`): a launch over
/// `rows` rows takes `rows.div_ceil(ROW_WARPS)` blocks.
pub(crate) const ROW_WARPS: usize = 8;
/// Elements of a row per chunk of the RMSNorm backward: 32 lanes x `NORM_LANE_ELEMENTS`
/// (`rmsnorm.cuh`); a row of `h` takes the kernel for `h.div_ceil(NORM_CHUNK)` chunks per lane.
pub(crate) const NORM_CHUNK: usize = 32 * 8;
/// Rows per tile of the attention kernels (`BR` in both kernel files).
pub(crate) const FLASH_TILE: usize = 64;
/// Row padding (elements) of the BF16 attention kernel's tiles (`LDH_PAD`, `flash_attention.cu`).
pub(crate) const FLASH_BF16_PAD: usize = 8;
/// Row padding of the FP32 attention kernel's tiles (`LD_PAD`) and of its score tile
/// (`LP_PAD`), `flash_attention_f32.cu`.
pub(crate) const FLASH_F32_PAD: usize = 4;
pub(crate) const FLASH_F32_SCORE_PAD: usize = 16;
/// Threads per block of both attention kernels (`NW * 32` in `flash_attention.cu`, `NT` in
/// `flash_attention_f32.cu`).
pub(crate) const FLASH_THREADS: usize = 128;

/// The two families of attention kernels: BF16 on tensor cores
/// (`kernels/model/flash_attention.cu`: 4 warps per block, BF16 tiles with row stride
/// `d + 8`, the score tiles in registers) and FP32 on CUDA cores
/// (`kernels/model/flash_attention_f32.cu`: 128 threads per block, FP32 tiles with row stride
/// `d + 4`, the score tile also in shared memory with row stride `64 + 16`, dQ summed from
/// per-tile partials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlashKernels {
    TensorCoreBf16,
    CudaCoreF32,
}

/// The attention's passes, for their shared-memory sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FlashPass {
    Forward,
    KeyValueGrads,
    /// dQ: a third pass over the tiles (tensor cores), or the sum of the dK/dV pass's
    /// partials (CUDA cores, no shared memory).
    QueryGrads,
}

impl FlashKernels {
    /// The kernels for `dtype` (BF16 or F32), if any.
    pub(crate) fn of(dtype: candle_core::DType) -> Option<Self> {
        match dtype {
            candle_core::DType::BF16 => Some(Self::TensorCoreBf16),
            candle_core::DType::F32 => Some(Self::CudaCoreF32),
            _ => None,
        }
    }

    /// Threads per block ([`FLASH_THREADS`] for both).
    pub(crate) fn threads(self) -> usize {
        FLASH_THREADS
    }

    /// Elements per 16-byte access.
    fn per16(self) -> usize {
        match self {
            Self::TensorCoreBf16 => 8,
            Self::CudaCoreF32 => 4,
        }
    }

    /// Dynamic shared memory of `pass` at head dim `d`, in bytes: the kernel files'
    /// `fwd_smem`, `bwd_kv_smem`, `bwd_q_smem`. Tensor cores: BF16 tiles of [`FLASH_TILE`]
    /// rows with row stride `d + 8`, three in the forward, four in each backward pass (dK/dV
    /// also keeps the query tile's FP32 log-sum-exp and delta). CUDA cores: FP32 tiles with
    /// row stride `d + 4` and one `[64, 64 + 16]` FP32 score tile, three tiles in the
    /// forward, four in dK/dV (with log-sum-exp and delta); the dQ sum needs none.
    pub(crate) fn smem(self, pass: FlashPass, d: usize) -> usize {
        let stats = 2 * FLASH_TILE * 4;
        match self {
            Self::TensorCoreBf16 => {
                let tile = FLASH_TILE * (d + FLASH_BF16_PAD) * 2;
                match pass {
                    FlashPass::Forward => 3 * tile,
                    FlashPass::KeyValueGrads => 4 * tile + stats,
                    FlashPass::QueryGrads => 4 * tile,
                }
            }
            Self::CudaCoreF32 => {
                let (tile, scores) = (FLASH_TILE * (d + FLASH_F32_PAD) * 4, FLASH_TILE * (FLASH_TILE + FLASH_F32_SCORE_PAD) * 4);
                match pass {
                    FlashPass::Forward => 3 * tile + scores,
                    FlashPass::KeyValueGrads => 4 * tile + scores + stats,
                    FlashPass::QueryGrads => 0,
                }
            }
        }
    }

    /// Rows per block of the backward's delta pass (`delta_rows_per_block` in
    /// `kernels/model/flash_delta.cuh`, shared by both kernel files): one 16-byte access
    /// per lane, `d` / (elements per access) lanes per row.
    pub(crate) fn delta_rows_per_block(self, d: usize) -> usize {
        self.threads() / (d / self.per16())
    }
}

/// Whether attention kernels take an attention of `dims` = (B, heads, T, d) with `kernels`
/// (none: the dtype has no kernels) whose buffers are 16-byte aligned (`aligned16`: the
/// kernels move 16 bytes per access): `d` 64 or 128, B · heads within a grid's y extent
/// (65535), and the largest stride, heads · T · d elements per batch entry, within `i32` (the
/// kernels' stride arguments; offsets are computed in 64 bits). Everything else runs the
/// cuBLAS composition.
pub(crate) fn flash_supports(kernels: Option<FlashKernels>, (b, h, t, d): (usize, usize, usize, usize), aligned16: bool) -> bool {
    kernels.is_some() && crate::kernels::FLASH_HEAD_DIMS.contains(&d) && aligned16 && b * h <= 65535 && h * t * d <= i32::MAX as usize
}

/// Elements of the FP32 backward's dQ partials (`dq_part` in `flash_attention_f32.cu`):
/// `[B · heads, n, n · 64, d]` with n = ⌈T / 64⌉ tiles, key tile kt's partial for query row q
/// at `[bh][kt][q]` (only kt ≤ q / 64 is written and read): about T² · d / 64 elements, as
/// many as one FP32 `[T, T]` matrix per head at d = 64.
pub(crate) fn flash_dq_partials((b, h, t, d): (usize, usize, usize, usize)) -> usize {
    let n = t.div_ceil(FLASH_TILE);
    b * h * n * n * FLASH_TILE * d
}

/// Element strides (batch entry, head, position) of q/k `[B, heads, T, d]` and of
/// v/o `[B, T, heads · d]`, as kernel arguments.
pub(crate) fn flash_strides((_, h, t, d): (usize, usize, usize, usize)) -> [i32; 6] {
    [(h * t * d) as i32, (t * d) as i32, d as i32, (t * h * d) as i32, d as i32, (h * d) as i32]
}

#[cfg(test)]
mod tests {
    use super::*;

    include!("../../../kernels/header_values.rs");

    /// The launch constants shared with the kernel files, read from those files (no nvcc):
    /// a change on one side alone fails here.
    #[test]
    fn launch_constants_match_the_kernel_files() {
        let common = include_str!("../../../kernels/model/common.cuh");
        let rmsnorm = include_str!("../../../kernels/model/rmsnorm.cuh");
        let flash = include_str!("../../../kernels/model/flash_attention.cu");
        let flash_f32 = include_str!("../../../kernels/model/flash_attention_f32.cu");
        assert_eq!(header_value(common, "BLOCK_THREADS"), i64::from(BLOCK_THREADS));
        assert_eq!(header_value(common, "WARPS"), ROW_WARPS as i64);
        assert_eq!(header_value(rmsnorm, "FUSED_MAX_HIDDEN"), crate::kernels::FUSED_MAX_HIDDEN as i64);
        assert_eq!(header_value(rmsnorm, "NORM_LANE_ELEMENTS") * 32, NORM_CHUNK as i64);
        assert_eq!(header_value(flash, "BR"), FLASH_TILE as i64);
        assert_eq!(header_value(flash_f32, "BR"), FLASH_TILE as i64);
        assert_eq!(header_value(flash, "NW") * 32, FLASH_THREADS as i64);
        assert_eq!(header_value(flash_f32, "NT"), FLASH_THREADS as i64);
        assert_eq!(header_value(flash, "LDH_PAD"), FLASH_BF16_PAD as i64);
        assert_eq!(header_value(flash_f32, "LD_PAD"), FLASH_F32_PAD as i64);
        assert_eq!(header_value(flash_f32, "LP_PAD"), FLASH_F32_SCORE_PAD as i64);
    }

    #[test]
    fn cross_entropy_stages_rows_up_to_112_kib() {
        let hopper = ce_stage_limit(227 * 1024);
        assert_eq!(hopper, 112 * 1024);
        assert_eq!(ce_staged_bytes(32100, 2, hopper), Some(64_208), "T5's vocabulary, BF16");
        assert_eq!(ce_staged_bytes(32100, 4, hopper), None, "T5's vocabulary, FP32: 128,400 B");
        assert_eq!(ce_staged_bytes(301, 4, hopper), Some(1_216), "rounded up to 16 bytes");
        assert_eq!(ce_staged_bytes(57_344, 2, hopper), Some(114_688));
        assert_eq!(ce_staged_bytes(57_345, 2, hopper), None);
        let ada = ce_stage_limit(99 * 1024);
        assert_eq!(ada, 98 * 1024);
        assert_eq!(ce_staged_bytes(50_304, 2, ada), None, "a 50,304 vocabulary: 100,608 B");
        assert_eq!(ce_staged_bytes(32100, 2, ada), Some(64_208));
    }

    #[test]
    fn extents_pad_to_multiples_of_8() {
        assert_eq!([1708, 32100, 64, 1, 0].map(aligned), [1712, 32104, 64, 8, 0]);
    }

    /// The LM head's chunks cover every row once, in order, 4096 at a time.
    #[test]
    fn row_chunks_cover_the_rows_in_order() {
        assert_eq!(row_chunks(4100, 4096).collect::<Vec<_>>(), [(0, 4096), (4096, 4)]);
        assert_eq!(row_chunks(8192, 4096).collect::<Vec<_>>(), [(0, 4096), (4096, 4096)]);
        assert_eq!(row_chunks(0, 4096).count(), 0);
        for n in [1, 7, 4095, 4097, 32768] {
            let mut next = 0;
            for (r0, rows) in row_chunks(n, 4096) {
                assert_eq!(r0, next);
                assert!(rows > 0 && rows <= 4096);
                next += rows;
            }
            assert_eq!(next, n);
        }
    }

    /// The grouping is the stable sort of positions by id: checked against a direct scan on
    /// repeated, absent and unordered ids, and on seeded random ids.
    #[test]
    fn grouping_by_id_keeps_positions_ascending_within_an_id() {
        assert_eq!(group_by_id(&[5, 2, 5, 0, 2, 5], 6), (vec![3, 1, 4, 0, 2, 5], vec![0, 1, 3, 6], vec![0, 2, 5]));
        assert_eq!(group_by_id(&[], 10), (vec![], vec![0], vec![]));
        // a vocabulary far past the ids that occur, the last id at its end
        assert_eq!(group_by_id(&[31999, 3, 3], 32000), (vec![1, 2, 0], vec![0, 2, 3], vec![3, 31999]));
        let mut state = 12345u64;
        let ids: Vec<u32> = (0..1000)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % 97) as u32
            })
            .collect();
        let (order, offsets, unique) = group_by_id(&ids, 97);
        assert_eq!(offsets.len(), unique.len() + 1);
        assert!(unique.windows(2).all(|w| w[0] < w[1]));
        for (k, &id) in unique.iter().enumerate() {
            let expected: Vec<u32> = (0..ids.len() as u32).filter(|&p| ids[p as usize] == id).collect();
            assert_eq!(order[offsets[k] as usize..offsets[k + 1] as usize], expected[..], "id {id}");
        }
        assert_eq!(*offsets.last().unwrap() as usize, ids.len());
    }

    /// The shared memory of each pass (the kernel files' formulas) fits the H200's 227 KiB
    /// per block; the BF16 forward at d = 64 fits the 48 KiB a kernel gets without opting in;
    /// three FP32 forward blocks and two dK/dV blocks at d = 64 fit one SM's shared memory
    /// (as many as their registers allow).
    #[test]
    fn attention_shared_memory_fits_a_block() {
        use FlashKernels::*;
        assert_eq!(TensorCoreBf16.smem(FlashPass::Forward, 64), 3 * 64 * 72 * 2);
        assert_eq!(TensorCoreBf16.smem(FlashPass::KeyValueGrads, 128), 4 * 64 * 136 * 2 + 512);
        assert_eq!(TensorCoreBf16.smem(FlashPass::QueryGrads, 128), 4 * 64 * 136 * 2);
        assert_eq!(CudaCoreF32.smem(FlashPass::Forward, 64), (3 * 64 * 68 + 64 * 80) * 4);
        assert_eq!(CudaCoreF32.smem(FlashPass::KeyValueGrads, 128), (4 * 64 * 132 + 64 * 80 + 128) * 4);
        assert_eq!(CudaCoreF32.smem(FlashPass::QueryGrads, 64), 0);
        for kernels in [TensorCoreBf16, CudaCoreF32] {
            for pass in [FlashPass::Forward, FlashPass::KeyValueGrads, FlashPass::QueryGrads] {
                assert!(kernels.smem(pass, 128) <= 227 * 1024, "{kernels:?} {pass:?}");
            }
        }
        assert!(TensorCoreBf16.smem(FlashPass::Forward, 64) <= 48 * 1024);
        // 228 KiB per SM, of which 1 KiB per block is the driver's
        assert!(3 * (CudaCoreF32.smem(FlashPass::Forward, 64) + 1024) <= 228 * 1024);
        assert!(2 * (CudaCoreF32.smem(FlashPass::KeyValueGrads, 64) + 1024) <= 228 * 1024);
        assert_eq!([64, 128].map(|d| TensorCoreBf16.delta_rows_per_block(d)), [16, 8]);
        assert_eq!([64, 128].map(|d| CudaCoreF32.delta_rows_per_block(d)), [8, 4]);
        assert_eq!(flash_dq_partials((128, 10, 256, 64)), 1280 * 4 * 256 * 64);
        assert_eq!(flash_dq_partials((2, 3, 19, 64)), 6 * 64 * 64);
    }

    /// The kernels take BF16 and FP32 at d 64 and 128 with aligned buffers, within the grid's
    /// and the stride arguments' ranges; everything else goes to the composition.
    #[test]
    fn attention_sizes_beyond_the_kernels_fall_back() {
        use candle_core::DType;
        let ok = (128, 10, 256, 64);
        let bf16 = FlashKernels::of(DType::BF16);
        assert!(flash_supports(bf16, ok, true));
        assert!(flash_supports(bf16, (1, 1, 2048, 128), true));
        assert!(flash_supports(FlashKernels::of(DType::F32), ok, true));
        assert!(!flash_supports(FlashKernels::of(DType::F16), ok, true), "F16");
        assert!(!flash_supports(bf16, ok, false), "unaligned");
        assert!(!flash_supports(bf16, (2, 2, 40, 32), true), "d = 32");
        assert!(flash_supports(bf16, (65535, 1, 16, 64), true));
        assert!(!flash_supports(bf16, (65536, 1, 16, 64), true), "B x heads > 65535");
        assert!(!flash_supports(bf16, (1, 64, 1 << 19, 64), true), "heads x T x d > i32");
        assert_eq!(flash_strides((2, 10, 256, 64)), [163840, 16384, 64, 163840, 64, 640]);
    }
}
