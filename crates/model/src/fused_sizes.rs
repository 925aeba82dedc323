//! What the fused CUDA ops ([`crate::fused`]) decide on the host from sizes alone: the
//! padding of matrix extents, the LM head's chunks of rows, the embedding backward's grouping
//! of positions by token id, and the tensor-core attention's launch geometry. Compiled in
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

/// Positions grouped by id: `(order, offsets, unique)`: `order` the positions sorted by id
/// (stable: positions ascend within an id), `unique` the distinct ids ascending, and id
/// `unique[k]`'s positions at `order[offsets[k]..offsets[k + 1]]` (`offsets` has one more
/// entry than `unique`; its last is `ids.len()`).
pub(crate) fn group_by_id(ids: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
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

/// The tensor-core attention's geometry (`kernels/model/flash_attention.cu`): rows per tile
/// (`BR` there) and warps per block (`NW`).
pub(crate) const FLASH_TILE: usize = 64;
pub(crate) const FLASH_WARPS: usize = 4;

/// Whether the tensor-core kernels take an attention of `dims` = (B, heads, T, d) in BF16
/// (`bf16`) whose buffers are 16-byte aligned (`aligned16`: the kernels move 8 elements per
/// load): `d` 64 or 128, B · heads within a grid's y extent (65535), and the largest stride,
/// heads · T · d elements per batch entry, within `i32` (the kernels' stride arguments;
/// offsets are computed in 64 bits). Everything else runs the cuBLAS composition.
pub(crate) fn flash_supports(bf16: bool, (b, h, t, d): (usize, usize, usize, usize), aligned16: bool) -> bool {
    bf16 && (d == 64 || d == 128) && aligned16 && b * h <= 65535 && h * t * d <= i32::MAX as usize
}

/// The tensor-core attention's passes, for their shared-memory sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FlashPass {
    Forward,
    KeyValueGrads,
    QueryGrads,
}

/// Dynamic shared memory of `pass` at head dim `d`, in bytes: the formulas `fwd_smem`,
/// `bwd_kv_smem`, `bwd_q_smem` of the kernel file (BF16 tiles of [`FLASH_TILE`] rows with row
/// stride `d + 8`: three in the forward, four in each backward pass, which for dK/dV also
/// keeps the query tile's FP32 log-sum-exp and delta). The score tiles live in registers.
pub(crate) fn flash_smem(pass: FlashPass, d: usize) -> usize {
    let tile = FLASH_TILE * (d + 8) * 2;
    match pass {
        FlashPass::Forward => 3 * tile,
        FlashPass::KeyValueGrads => 4 * tile + 2 * FLASH_TILE * 4,
        FlashPass::QueryGrads => 4 * tile,
    }
}

/// Rows per block of the backward's delta pass (`delta_rows_per_block` in the kernel file):
/// `d / 8` lanes per row, [`FLASH_WARPS`] warps.
pub(crate) fn flash_delta_rows_per_block(d: usize) -> usize {
    FLASH_WARPS * 32 / (d / 8)
}

/// Element strides (batch entry, head, position) of q/k `[B, heads, T, d]` and of
/// v/o `[B, T, heads · d]`, as kernel arguments.
pub(crate) fn flash_strides((_, h, t, d): (usize, usize, usize, usize)) -> [i32; 6] {
    [(h * t * d) as i32, (t * d) as i32, d as i32, (t * h * d) as i32, d as i32, (h * d) as i32]
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(group_by_id(&[5, 2, 5, 0, 2, 5]), (vec![3, 1, 4, 0, 2, 5], vec![0, 1, 3, 6], vec![0, 2, 5]));
        assert_eq!(group_by_id(&[]), (vec![], vec![0], vec![]));
        let mut state = 12345u64;
        let ids: Vec<u32> = (0..1000)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % 97) as u32
            })
            .collect();
        let (order, offsets, unique) = group_by_id(&ids);
        assert_eq!(offsets.len(), unique.len() + 1);
        assert!(unique.windows(2).all(|w| w[0] < w[1]));
        for (k, &id) in unique.iter().enumerate() {
            let expected: Vec<u32> = (0..ids.len() as u32).filter(|&p| ids[p as usize] == id).collect();
            assert_eq!(order[offsets[k] as usize..offsets[k + 1] as usize], expected[..], "id {id}");
        }
        assert_eq!(*offsets.last().unwrap() as usize, ids.len());
    }

    /// The shared memory of each pass (the kernel file's formulas) fits the H200's 227 KiB
    /// per block; the forward at d = 64 fits the 48 KiB a kernel gets without opting in.
    #[test]
    fn attention_shared_memory_fits_a_block() {
        assert_eq!(flash_smem(FlashPass::Forward, 64), 3 * 64 * 72 * 2);
        assert_eq!(flash_smem(FlashPass::KeyValueGrads, 128), 4 * 64 * 136 * 2 + 512);
        assert_eq!(flash_smem(FlashPass::QueryGrads, 128), 4 * 64 * 136 * 2);
        for pass in [FlashPass::Forward, FlashPass::KeyValueGrads, FlashPass::QueryGrads] {
            assert!(flash_smem(pass, 128) <= 227 * 1024, "{pass:?}");
        }
        assert!(flash_smem(FlashPass::Forward, 64) <= 48 * 1024);
        assert_eq!([64, 128].map(flash_delta_rows_per_block), [16, 8]);
    }

    /// The tensor-core kernels take BF16 at d 64 and 128 with aligned buffers, within the
    /// grid's and the stride arguments' ranges; everything else goes to the composition.
    #[test]
    fn attention_sizes_beyond_the_kernels_fall_back() {
        let ok = (128, 10, 256, 64);
        assert!(flash_supports(true, ok, true));
        assert!(flash_supports(true, (1, 1, 2048, 128), true));
        assert!(!flash_supports(false, ok, true), "FP32");
        assert!(!flash_supports(true, ok, false), "unaligned");
        assert!(!flash_supports(true, (2, 2, 40, 32), true), "d = 32");
        assert!(flash_supports(true, (65535, 1, 16, 64), true));
        assert!(!flash_supports(true, (65536, 1, 16, 64), true), "B x heads > 65535");
        assert!(!flash_supports(true, (1, 64, 1 << 19, 64), true), "heads x T x d > i32");
        assert_eq!(flash_strides((2, 10, 256, 64)), [163840, 16384, 64, 163840, 64, 640]);
    }
}
