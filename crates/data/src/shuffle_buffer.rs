//! Streaming mode's shuffle buffer, the algorithm of HF datasets' `IterableDataset.shuffle`
//! (and of tf.data's `shuffle`): the first `capacity` rows fill the buffer; then each new row
//! takes the place of one drawn uniformly from the buffer, and the drawn row is the output.
//!
//! The k-th draw picks slot `below(key, k, capacity)` ([`crate::order`]), so the buffer's
//! randomness is a count. A position inside the stream is then the reader's position after
//! the last row that went in, the count of draws, and the buffer's rows; the rows are not
//! copied at each batch but rebuilt when asked ([`ShuffleBuffer::before`]): each output row
//! records the slot it came from, and putting the rows drawn since a batch back into their
//! slots, newest first, gives the buffer as it was at that batch.

use crate::batch::Row;
use crate::error::{DataError, Result};
use crate::order::{below, key, Purpose};

/// The buffer's rows (ids and count of real tokens) and its draws.
pub(crate) struct ShuffleBuffer {
    key: u64,
    capacity: usize,
    draws: u64,
    slots: Vec<(Vec<u32>, usize)>,
}

impl ShuffleBuffer {
    /// An empty buffer of `capacity` rows (at least 1) drawing with `seed`.
    pub fn new(seed: u64, capacity: usize) -> Self {
        Self { key: key(seed, Purpose::Buffer, 0), capacity: capacity.max(1), draws: 0, slots: Vec::with_capacity(capacity) }
    }

    /// The buffer of a saved position: `draws` made, `tokens` `[rows, width]` and `valid`
    /// per row as [`ShuffleBuffer::before`] gave them.
    ///
    /// # Errors
    /// [`DataError::Resume`] when the rows do not fit the capacity or the row width (a
    /// position saved without its buffer, or with another `seq_len` or buffer size).
    pub fn restore(seed: u64, capacity: usize, draws: u64, tokens: &[u32], valid: &[u32], width: usize) -> Result<Self> {
        let mut b = Self::new(seed, capacity);
        let full = draws > 0;
        let rows = valid.len();
        if tokens.len() != rows * width || rows > b.capacity || (full && rows != b.capacity) {
            return Err(DataError::Resume(format!(
                "the position holds {rows} buffered rows of {} tokens after {draws} draws, the config wants a buffer \
                 of {} rows (data.shuffle_buffer) of {width} tokens (data.seq_len + 1): set them back to continue this \
                 run (a batch's position has no buffer: resume from TrainStream::position())",
                tokens.len().checked_div(rows).unwrap_or(0),
                b.capacity
            )));
        }
        b.draws = draws;
        b.slots = tokens.chunks_exact(width).zip(valid).map(|(t, &v)| (t.to_vec(), v as usize)).collect();
        Ok(b)
    }

    /// Takes `row` in; once the buffer is full, returns the row drawn to make room, which
    /// carries `row`'s stream position (the reader's, after the newest row in), the draw
    /// count and its slot.
    pub fn push(&mut self, mut row: Row) -> Option<Row> {
        if self.slots.len() < self.capacity {
            self.slots.push((row.tokens, row.valid));
            return None;
        }
        let slot = below(self.key, self.draws, self.capacity as u64) as usize;
        self.draws += 1;
        let (tokens, valid) = std::mem::replace(&mut self.slots[slot], (row.tokens, row.valid));
        row.tokens = tokens;
        row.valid = valid;
        row.draws = self.draws;
        row.slot = slot;
        Some(row)
    }

    /// The buffer's rows before the draws that gave `later` (rows output since the moment
    /// asked for, oldest first), flattened `[rows, width]`, with each row's real tokens.
    pub fn before<'a>(&self, later: impl DoubleEndedIterator<Item = &'a Row>) -> (Vec<u32>, Vec<u32>) {
        let mut slots: Vec<(&[u32], usize)> = self.slots.iter().map(|(t, v)| (&t[..], *v)).collect();
        for r in later.rev() {
            slots[r.slot] = (&r.tokens[..], r.valid);
        }
        (slots.iter().flat_map(|(t, _)| t.iter().copied()).collect(), slots.iter().map(|&(_, v)| v as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u32) -> Row {
        Row::new(vec![id, id], 2, 0, 0, id as u64, 0)
    }

    #[test]
    fn every_row_comes_out_once_and_the_buffer_rebuilds_exactly() {
        let mut b = ShuffleBuffer::new(7, 16);
        let mut out = Vec::new();
        for id in 0..1000 {
            if let Some(r) = b.push(row(id)) {
                assert_eq!(r.line, id as u64, "the output carries the newest row's position");
                out.push(r);
            }
        }
        assert_eq!(out.len(), 1000 - 16);
        let mut seen: Vec<u32> = out.iter().map(|r| r.tokens[0]).chain(b.slots.iter().map(|(t, _)| t[0])).collect();
        assert_ne!(seen[..100], (0..100).collect::<Vec<_>>()[..], "shuffled");
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>(), "every row once");
        // the buffer as it was after output 500, rebuilt from the rows output since
        let (tokens, valid) = b.before(out[500..].iter());
        let mut again = ShuffleBuffer::restore(7, 16, out[499].draws, &tokens, &valid, 2).unwrap();
        let replay: Vec<u32> = (out[499].line as u32 + 1..1000).filter_map(|id| again.push(row(id))).map(|r| r.tokens[0]).collect();
        assert_eq!(replay, out[500..].iter().map(|r| r.tokens[0]).collect::<Vec<_>>());
    }

    #[test]
    fn a_position_without_its_buffer_is_refused() {
        let e = ShuffleBuffer::restore(7, 16, 5, &[], &[], 2).err().unwrap().to_string();
        assert!(e.contains("0 buffered rows") && e.contains("TrainStream::position()"), "{e}");
    }
}
