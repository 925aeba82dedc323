//! Who does what in a data-parallel step: each rank's rows of the global batch, and each
//! rank's element range of every parameter tensor under ZeRO stage 1.
//!
//! **Batch.** Every rank reads the same global data order (one [`lowbit_data::TrainStream`]
//! per rank, all at the same position). Each micro-step reads `micro_batch * world_size`
//! rows and rank `r` takes the contiguous block `r * micro_batch .. (r + 1) * micro_batch`
//! ([`rank_rows`]), and each rank accumulates `grad_accum / world_size` micro-steps. So a step
//! consumes `micro_batch * grad_accum` rows (the config's global batch), the same rows in the
//! same order whatever the split (1 rank x 4 micro-batches and 2 ranks x 2 see identical
//! tokens per step), and the stream position after a step is the global one: a
//! checkpoint resumes on any number of ranks. Every rank also counts the targets of the whole
//! global step, so each micro-batch's loss weight `n_i / N` uses the global `N` without any
//! exchange. The cost: each rank tokenizes the whole global batch (cheap next to a GPU step
//! at a few ranks; a shared token cache would remove it at many).
//!
//! **ZeRO-1.** Rank `r` owns a contiguous element range of each tensor and keeps and
//! updates only those elements' states ([`zero_ranges`]). Ranges are cut on multiples of a
//! granule ([`granule`]) so that every scale block of a block-scaled state lies in one rank
//! (its scale is a function of the whole block). The RNG counters stay whole-tensor element
//! indices (`TensorState::first`), so a sharded step rounds bit for bit like the unsharded one.

use lowbit_data::Batch;
use lowbit_optim::StatesSpec;
use std::ops::Range;

/// Rank `rank`'s rows of a global micro-batch of `micro_batch * world_size` rows.
pub fn rank_rows(rank: usize, micro_batch: usize) -> Range<usize> {
    rank * micro_batch..(rank + 1) * micro_batch
}

/// Rows `rows` of `batch` as a batch of their own; the position stays the global batch's
/// (the stream position after all of its rows).
///
/// # Panics
/// If `rows` is outside `batch`.
pub fn take_rows(batch: &Batch, rows: Range<usize>) -> Batch {
    assert!(rows.end <= batch.rows, "rows {rows:?} of a batch of {}", batch.rows);
    let span = rows.start * batch.seq_len..rows.end * batch.seq_len;
    Batch {
        rows: rows.len(),
        seq_len: batch.seq_len,
        input: batch.input[span.clone()].to_vec(),
        target: batch.target[span.clone()].to_vec(),
        mask: batch.mask[span].to_vec(),
        position: batch.position.clone(),
    }
}

/// Elements per shard unit for the states `spec`: `Some(block_size)` when m or v is block
/// scaled with blocks (a shard boundary inside a block would split its scale), `Some(1)`
/// for unscaled states (any cut is exact: the RNG and BF16's shared 64-bit draws are keyed by
/// the whole-tensor index), `None` when a scaled state has one scale per tensor
/// (`block_size = 0`): whole tensors only.
pub fn granule(spec: &StatesSpec) -> Option<usize> {
    let scaled = spec.m_format.is_scaled() || spec.v_format.is_scaled();
    match (scaled, spec.block_size) {
        (false, _) => Some(1),
        (true, 0) => None,
        (true, b) => Some(b),
    }
}

/// The shard unit of an optimizer whose tensors have the settings `specs` (per-group
/// formats): the least common multiple of their [`granule`]s, `None` (whole tensors) when any
/// state has one scale per tensor.
pub fn common_granule<'a>(specs: impl IntoIterator<Item = &'a StatesSpec>) -> Option<usize> {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    specs.into_iter().try_fold(1, |acc, s| granule(s).map(|g| acc / gcd(acc, g) * g))
}

/// ZeRO-1 ownership: `out[r][t]` is the element range of tensor `t` (of `lens[t]` elements)
/// that rank `r` of `world_size` updates. Each tensor's `ceil(len / granule)` units are split
/// into `world_size` consecutive runs whose sizes differ by at most one unit (so the
/// ranges tile the tensor in rank order); with `granule = None` (whole tensors) tensor `t`
/// goes to rank `t % world_size`. Ranges may be empty (a tensor of fewer units than ranks).
pub fn zero_ranges(lens: &[usize], granule: Option<usize>, world_size: usize) -> Vec<Vec<Range<usize>>> {
    let mut out = vec![Vec::with_capacity(lens.len()); world_size];
    for (t, &len) in lens.iter().enumerate() {
        for (r, ranges) in out.iter_mut().enumerate() {
            ranges.push(match granule {
                None if r == t % world_size => 0..len,
                None => {
                    let at = if r < t % world_size { 0 } else { len };
                    at..at
                }
                Some(g) => {
                    let units = len.div_ceil(g);
                    let cut = |k: usize| (units * k / world_size * g).min(len);
                    cut(r)..cut(r + 1)
                }
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lowbit_data::DataPosition;
    use lowbit_optim::StatesConfig;

    #[test]
    fn ranks_take_contiguous_blocks_of_the_global_micro_batch() {
        let b = Batch {
            rows: 4,
            seq_len: 2,
            input: (0..8).collect(),
            target: (10..18).collect(),
            mask: vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0],
            position: DataPosition { line: 9, ..Default::default() },
        };
        assert_eq!(rank_rows(1, 2), 2..4);
        let r1 = take_rows(&b, rank_rows(1, 2));
        assert_eq!((r1.rows, r1.input, r1.target, r1.mask), (2, vec![4, 5, 6, 7], vec![14, 15, 16, 17], vec![1.0, 1.0, 0.0, 0.0]));
        assert_eq!(r1.position.line, 9, "the position stays global");
        let r0 = take_rows(&b, rank_rows(0, 2));
        assert_eq!(r0.input, vec![0, 1, 2, 3]);
    }

    #[test]
    fn zero_ranges_tile_each_tensor_on_block_boundaries() {
        let lens = [1000, 128, 100, 4096, 0];
        for w in 1..=5 {
            let ranges = zero_ranges(&lens, Some(128), w);
            assert_eq!(ranges.len(), w);
            for (t, &len) in lens.iter().enumerate() {
                let mut at = 0;
                let mut sizes = Vec::new();
                for r in ranges.iter() {
                    assert_eq!(r[t].start, at, "tensor {t}, {w} ranks: ranges tile in rank order");
                    assert!(r[t].start % 128 == 0 && (r[t].end % 128 == 0 || r[t].end == len));
                    sizes.push(r[t].len().div_ceil(128));
                    at = r[t].end;
                }
                assert_eq!(at, len);
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "balanced: {sizes:?}");
            }
        }
        // 2 ranks: 1000 elements = 8 blocks -> 4 + 4 (the last one partial)
        let r = zero_ranges(&lens, Some(128), 2);
        assert_eq!((r[0][0].clone(), r[1][0].clone()), (0..512, 512..1000));
        assert_eq!((r[0][1].clone(), r[1][1].clone()), (0..0, 0..128));
        // whole tensors, round-robin
        let r = zero_ranges(&[10, 20, 30], None, 2);
        assert_eq!(r[0], vec![0..10, 0..0, 0..30]);
        assert_eq!(r[1], vec![10..10, 0..20, 30..30]);
    }

    #[test]
    fn granule_follows_the_state_formats() {
        let spec = |m: &str, v: &str, block| {
            StatesConfig { m_format: m.into(), v_format: v.into(), block_size: block, ..Default::default() }.resolve(0.999).unwrap()
        };
        assert_eq!(granule(&spec("bf16", "bf16", 128)), Some(1));
        assert_eq!(granule(&spec("bf16", "fp8", 2048)), Some(2048));
        assert_eq!(granule(&spec("fp4", "fp4", 0)), None);
        assert_eq!(common_granule(&[spec("bf16", "bf16", 128), spec("fp8", "fp8", 96), spec("fp4", "fp8", 128)]), Some(384));
        assert_eq!(common_granule(&[spec("fp8", "fp8", 128), spec("fp4", "fp4", 0)]), None);
    }
}
