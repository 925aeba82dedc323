//! Collective operations between the ranks of a data-parallel job, behind one trait: the CPU
//! backends here, the NCCL one (GPU buffers, `nccl` feature: `nccl.rs`; checked on one GPU by
//! `tests/nccl_one_rank.rs`, two ranks exchanging data not yet run) beside them.
//!
//! - [`Solo`]: one process; every operation is the identity.
//! - [`TcpCollective`]: the CPU backend over the rendezvous's TCP connections, a star
//!   through rank 0: every rank sends its buffer to rank 0, rank 0 combines them in rank order
//!   and sends the result back. Slow (two copies through one host per operation), but exact
//!   and deterministic: every rank gets the same bits, and an f32 sum is
//!   `((x_0 + x_1) + x_2) + ...`, the same whatever the timing.

use super::rendezvous::{recv_frame, send_frame, Links};
use anyhow::{bail, Result};
use candle_core::Tensor;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// What the trainer needs from the other ranks. Every rank must call the same operations in
/// the same order (as with NCCL); each call blocks until all ranks made it.
pub trait Collective: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Element-wise sum of `buf` over all ranks, in place (same length on every rank); every
    /// rank gets the same bits.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Exact element-wise integer sum of `buf` over all ranks, in place (stall counts).
    fn sum_u64(&self, buf: &mut [u64]) -> Result<()>;

    /// Every rank's `local` bytes concatenated in rank order; `counts[r]` is rank `r`'s byte
    /// count (known to every rank, e.g. from the shard arithmetic).
    fn all_gather(&self, local: &[u8], counts: &[usize]) -> Result<Vec<u8>>;

    /// Rank 0's `buf` on every rank (replaces `buf` elsewhere).
    fn broadcast(&self, buf: &mut Vec<u8>) -> Result<()>;

    /// Element-wise sum over all ranks of a 1-D FP32 tensor (the step's gradients and loss,
    /// flattened into one buffer), as a new tensor on the same device. The default goes
    /// through the host ([`Collective::all_reduce_sum`]); the NCCL backend sums on the GPUs.
    fn all_reduce_tensor(&self, t: &Tensor) -> Result<Tensor> {
        let mut host = t.to_vec1::<f32>()?;
        self.all_reduce_sum(&mut host)?;
        Ok(Tensor::from_vec(host, t.elem_count(), t.device())?)
    }

    /// `owned[q]`: views (contiguous ranges of weight tensors, the same on every rank) that
    /// rank `q` updated; afterwards every rank holds rank `q`'s values in them, in place
    /// (ZeRO-1's weight all-gather on GPUs). Only the NCCL backend has it (the CPU ZeRO-1
    /// gathers bytes with [`Collective::all_gather`]).
    fn broadcast_views(&self, owned: &[Vec<Tensor>]) -> Result<()> {
        let _ = owned;
        bail!("an in-place broadcast of device tensors needs the NCCL backend")
    }
}

/// A single process: nothing to exchange.
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn sum_u64(&self, _buf: &mut [u64]) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, local: &[u8], counts: &[usize]) -> Result<Vec<u8>> {
        check_count(0, local.len(), counts)?;
        Ok(local.to_vec())
    }
    fn broadcast(&self, _buf: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
}

/// The CPU backend: a star through rank 0 over the rendezvous's connections.
pub struct TcpCollective {
    rank: usize,
    world_size: usize,
    /// The peers' connections (rank 0: all others, in rank order; others: rank 0).
    links: Mutex<Vec<(usize, TcpStream)>>,
    timeout: Duration,
}

impl TcpCollective {
    /// Over the connections of a finished rendezvous; a peer that sends nothing for `timeout`
    /// (hung), or takes nothing for as long while this rank sends (stopped: a SIGSTOPped
    /// process leaves its socket buffers full), or closes its connection (exited) makes the
    /// operation fail naming it.
    pub fn new(rank: usize, world_size: usize, links: Links, timeout: Duration) -> Result<TcpCollective> {
        for (_, s) in &links.peers {
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
        }
        Ok(TcpCollective { rank, world_size, links: Mutex::new(links.peers), timeout })
    }

    /// Rank 0: every rank's bytes in rank order (`None` on the others, which send theirs).
    fn gather(&self, local: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        let mut links = self.links.lock().expect("collective lock");
        if self.rank != 0 {
            let (peer, s) = &mut links[0];
            send_frame(s, local).map_err(|e| self.send_error(*peer, e))?;
            return Ok(None);
        }
        let mut all = vec![local.to_vec()];
        for (peer, s) in links.iter_mut() {
            all.push(recv_frame(s).map_err(|e| self.io_error(*peer, e))?);
        }
        Ok(Some(all))
    }

    /// Rank 0 sends `result` to every rank; the others receive it.
    fn scatter(&self, result: Option<Vec<u8>>) -> Result<Vec<u8>> {
        let mut links = self.links.lock().expect("collective lock");
        match result {
            Some(r) => {
                for (peer, s) in links.iter_mut() {
                    send_frame(s, &r).map_err(|e| self.send_error(*peer, e))?;
                }
                Ok(r)
            }
            None => {
                let (peer, s) = &mut links[0];
                recv_frame(s).map_err(|e| self.io_error(*peer, e))
            }
        }
    }

    /// A failed receive from `peer`: a timeout means it sent nothing (stopped or hung), another
    /// error that it is gone.
    fn io_error(&self, peer: usize, e: std::io::Error) -> anyhow::Error {
        self.link_error(peer, e, "sent")
    }

    /// A failed send to `peer`: a timeout means it took nothing (stopped or hung: its socket
    /// buffers are full), another error that it is gone.
    fn send_error(&self, peer: usize, e: std::io::Error) -> anyhow::Error {
        self.link_error(peer, e, "took")
    }

    fn link_error(&self, peer: usize, e: std::io::Error, verb: &str) -> anyhow::Error {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => anyhow::anyhow!(
                "rank {}: rank {peer} {verb} nothing for {:.0} s (stopped or hung? the wait is LOWBIT_DIST_TIMEOUT_S)",
                self.rank,
                self.timeout.as_secs_f64()
            ),
            _ => anyhow::anyhow!("rank {}: lost rank {peer} ({e}): it exited or crashed", self.rank),
        }
    }

    /// Gather fixed-width values at rank 0, combine them there with `combine(acc, part)` in
    /// rank order, and hand the result to every rank.
    fn reduce(&self, local: Vec<u8>, combine: impl Fn(&mut [u8], &[u8])) -> Result<Vec<u8>> {
        let result = self.gather(&local)?.map(|parts| {
            let mut acc = parts[0].clone();
            for (r, p) in parts.iter().enumerate().skip(1) {
                if p.len() != acc.len() {
                    return Err(anyhow::anyhow!("rank {r} sent {} bytes to a reduction of {} bytes", p.len(), acc.len()));
                }
                combine(&mut acc, p);
            }
            Ok(acc)
        });
        self.scatter(result.transpose()?)
    }
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let local = buf.iter().flat_map(|x| x.to_le_bytes()).collect();
        let sum = self.reduce(local, |acc, p| {
            for (a, b) in acc.chunks_exact_mut(4).zip(p.chunks_exact(4)) {
                let s = f32::from_le_bytes(a.try_into().unwrap()) + f32::from_le_bytes(b.try_into().unwrap());
                a.copy_from_slice(&s.to_le_bytes());
            }
        })?;
        for (x, b) in buf.iter_mut().zip(sum.chunks_exact(4)) {
            *x = f32::from_le_bytes(b.try_into().unwrap());
        }
        Ok(())
    }

    fn sum_u64(&self, buf: &mut [u64]) -> Result<()> {
        let local = buf.iter().flat_map(|x| x.to_le_bytes()).collect();
        let sum = self.reduce(local, |acc, p| {
            for (a, b) in acc.chunks_exact_mut(8).zip(p.chunks_exact(8)) {
                let s = u64::from_le_bytes(a.try_into().unwrap()) + u64::from_le_bytes(b.try_into().unwrap());
                a.copy_from_slice(&s.to_le_bytes());
            }
        })?;
        for (x, b) in buf.iter_mut().zip(sum.chunks_exact(8)) {
            *x = u64::from_le_bytes(b.try_into().unwrap());
        }
        Ok(())
    }

    fn all_gather(&self, local: &[u8], counts: &[usize]) -> Result<Vec<u8>> {
        check_count(self.rank, local.len(), counts)?;
        let joined = match self.gather(local)? {
            Some(parts) => {
                for (r, p) in parts.iter().enumerate() {
                    check_count(r, p.len(), counts)?;
                }
                Some(parts.concat())
            }
            None => None,
        };
        self.scatter(joined)
    }

    fn broadcast(&self, buf: &mut Vec<u8>) -> Result<()> {
        let out = self.scatter((self.rank == 0).then(|| buf.clone()))?;
        *buf = out;
        Ok(())
    }
}

fn check_count(rank: usize, len: usize, counts: &[usize]) -> Result<()> {
    if counts.get(rank) != Some(&len) {
        bail!("all_gather: rank {rank} holds {len} bytes, the counts say {:?}", counts.get(rank));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::rendezvous::{join, serve};
    use super::*;
    use std::net::TcpListener;

    /// `n` connected ranks in threads, each running `f(collective)`; results in rank order.
    pub(crate) fn with_ranks<T: Send + 'static>(
        n: usize,
        timeout: Duration,
        f: impl Fn(TcpCollective) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut handles = Vec::new();
        for r in 1..n {
            let (addr, f) = (addr.clone(), f.clone());
            handles.push(std::thread::spawn(move || {
                let (_, s) = join(&addr, r, n, timeout).unwrap();
                f(TcpCollective::new(r, n, Links { peers: vec![(0, s)] }, timeout).unwrap())
            }));
        }
        let f0 = f.clone();
        let h0 = std::thread::spawn(move || {
            let links = serve(listener, n, b"", timeout).unwrap();
            f0(TcpCollective::new(0, n, links, timeout).unwrap())
        });
        std::iter::once(h0).chain(handles).map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn three_ranks_reduce_gather_and_broadcast() {
        let out = with_ranks(3, Duration::from_secs(20), |c| {
            let r = c.rank();
            // values whose f32 sum depends on the order: rank order is ((a + b) + c)
            let mut x = vec![[1e8f32, 1.0, -1e8][r], r as f32 + 0.5];
            c.all_reduce_sum(&mut x).unwrap();
            let mut n = vec![u64::MAX / 4, r as u64];
            c.sum_u64(&mut n).unwrap();
            let counts = [2, 0, 3];
            let local = vec![r as u8 + 10; counts[r]];
            let g = c.all_gather(&local, &counts).unwrap();
            let mut b = if r == 0 { b"config".to_vec() } else { Vec::new() };
            c.broadcast(&mut b).unwrap();
            (x, n, g, b)
        });
        let expect_sum = (1e8f32 + 1.0) + -1e8; // = 0: 1.0 is lost in rank order
        for (x, n, g, b) in out {
            assert_eq!(x[0].to_bits(), expect_sum.to_bits());
            assert_eq!(x[1], 0.5 + 1.5 + 2.5);
            assert_eq!(n, vec![3 * (u64::MAX / 4), 3]);
            assert_eq!(g, vec![10, 10, 12, 12, 12]);
            assert_eq!(b, b"config");
        }
    }

    #[test]
    fn a_rank_that_exits_is_named() {
        let out = with_ranks(2, Duration::from_secs(20), |c| {
            if c.rank() == 1 {
                return String::new(); // drops its connection without taking part
            }
            format!("{:#}", c.all_reduce_sum(&mut [1.0]).unwrap_err())
        });
        assert!(out[0].contains("rank 0: lost rank 1"), "{}", out[0]);
    }

    #[test]
    fn a_hung_rank_is_named_after_the_timeout() {
        let out = with_ranks(2, Duration::from_millis(600), |c| {
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_secs(2)); // alive but silent
                return String::new();
            }
            format!("{:#}", c.sum_u64(&mut [1]).unwrap_err())
        });
        assert!(out[0].contains("rank 1 sent nothing for 1 s"), "{}", out[0]);
    }
}
