//! The rendezvous of a data-parallel job over TCP at `MASTER_ADDR:MASTER_PORT`: rank 0
//! listens, every other rank connects and says who it is, and when all `WORLD_SIZE - 1` have
//! arrived rank 0 sends each of them one opaque blob (for NCCL: the 128-byte unique id of
//! the communicator; the CPU collective sends nothing). No shared files, so it works across
//! nodes. The connections stay open: the CPU collective ([`super::collective::TcpCollective`])
//! runs over them.
//!
//! Wire format (all integers little-endian): hello = `b"LOWBITRV"`, rank `u32`, world size
//! `u32`; then frames of `u64` length + bytes ([`send_frame`], [`recv_frame`]).

use super::world::World;
use anyhow::{bail, Context, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"LOWBITRV";

/// Open connections after a rendezvous, with the peer rank of each: on rank 0, ranks
/// `1 .. world_size` in order; on every other rank, rank 0 alone.
pub struct Links {
    pub peers: Vec<(usize, TcpStream)>,
}

/// Rendezvous of `world` (a no-op returning `blob` for a single process): rank 0 listens on
/// every interface at `MASTER_PORT` and sends `blob` to every rank; other ranks connect to
/// `MASTER_ADDR:MASTER_PORT` and receive it (their `blob` is ignored). Returns the blob and
/// the open connections.
///
/// # Errors
/// The port cannot be bound; not all ranks arrive within `world.timeout` (naming those that
/// did not); rank 0 cannot be reached or does not answer in time; a peer with another world
/// size or a rank that arrived twice.
pub fn rendezvous(world: &World, blob: &[u8]) -> Result<(Vec<u8>, Links)> {
    let Some(master) = world.master.as_deref() else {
        return Ok((blob.to_vec(), Links { peers: Vec::new() }));
    };
    if world.rank == 0 {
        let port = master.rsplit(':').next().unwrap_or_default();
        let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
            .with_context(|| format!("rank 0 cannot listen on port {port} (MASTER_PORT) for the rendezvous"))?;
        Ok((blob.to_vec(), serve(listener, world.world_size, blob, world.timeout)?))
    } else {
        let (blob, stream) = join(master, world.rank, world.world_size, world.timeout)?;
        Ok((blob, Links { peers: vec![(0, stream)] }))
    }
}

/// Rank 0's side: accepts ranks `1 .. world_size` on `listener` within `timeout`, then
/// sends each `blob`.
///
/// # Errors
/// See [`rendezvous`]; a connection that does not start with the hello is dropped with a
/// warning (a port scanner, a stale worker of another job).
pub fn serve(listener: TcpListener, world_size: usize, blob: &[u8], timeout: Duration) -> Result<Links> {
    let deadline = Instant::now() + timeout;
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let mut arrived: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    while arrived.iter().skip(1).any(Option::is_none) {
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> = (1..world_size).filter(|&r| arrived[r].is_none()).map(|r| r.to_string()).collect();
            bail!(
                "rendezvous at {addr}: rank(s) {} of WORLD_SIZE={world_size} did not arrive within {:.0} s \
                 (not launched, wrong MASTER_ADDR/MASTER_PORT, or crashed before connecting)",
                missing.join(", "),
                timeout.as_secs_f64()
            );
        }
        let mut stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(e).context("rendezvous: accept failed"),
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
        let mut hello = [0u8; 16];
        if stream.read_exact(&mut hello).is_err() || &hello[..8] != MAGIC {
            tracing::warn!("rendezvous at {addr}: dropped a connection that is not a lowbit rank");
            continue;
        }
        let rank = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
        let size = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
        if size != world_size {
            bail!("rendezvous: rank {rank} has WORLD_SIZE={size}, rank 0 has WORLD_SIZE={world_size}");
        }
        if rank == 0 || rank >= world_size || arrived[rank].is_some() {
            bail!("rendezvous: rank {rank} arrived twice or is out of range (two jobs on one MASTER_PORT?)");
        }
        arrived[rank] = Some(stream);
    }
    let mut peers = Vec::with_capacity(world_size - 1);
    for (rank, s) in arrived.into_iter().enumerate().skip(1) {
        let mut s = s.expect("all arrived");
        s.set_nodelay(true)?;
        send_frame(&mut s, blob).with_context(|| format!("rendezvous: cannot send to rank {rank}"))?;
        peers.push((rank, s));
    }
    Ok(Links { peers })
}

/// Rank `rank`'s side: connects to rank 0 at `master` (retrying until `timeout`, as rank 0
/// may start later), says hello and waits for the blob.
///
/// # Errors
/// See [`rendezvous`].
pub fn join(master: &str, rank: usize, world_size: usize, timeout: Duration) -> Result<(Vec<u8>, TcpStream)> {
    let deadline = Instant::now() + timeout;
    let mut last_err = String::from("no address");
    let mut stream = loop {
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "rank {rank}: could not reach rank 0 at {master} (MASTER_ADDR:MASTER_PORT) within {:.0} s: {last_err}",
                timeout.as_secs_f64()
            );
        }
        let addrs = master.to_socket_addrs().with_context(|| format!("rank {rank}: MASTER_ADDR:MASTER_PORT = {master}"))?;
        let mut connected = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, (deadline - now).min(Duration::from_secs(5))) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last_err = e.to_string(),
            }
        }
        match connected {
            Some(s) => break s,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stream.set_nodelay(true)?;
    let mut hello = MAGIC.to_vec();
    hello.extend((rank as u32).to_le_bytes());
    hello.extend((world_size as u32).to_le_bytes());
    stream.write_all(&hello).with_context(|| format!("rank {rank}: cannot send the hello to rank 0 at {master}"))?;
    stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))?;
    let blob = recv_frame(&mut stream).with_context(|| {
        format!(
            "rank {rank}: no answer from rank 0 at {master} within {:.0} s (the other ranks did not all arrive?)",
            timeout.as_secs_f64()
        )
    })?;
    Ok((blob, stream))
}

/// Writes one frame: `u64` length, then the bytes.
pub fn send_frame(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(&(bytes.len() as u64).to_le_bytes())?;
    s.write_all(bytes)
}

/// Reads one frame written by [`send_frame`]; a closed connection is `UnexpectedEof`, a
/// read timeout `WouldBlock` or `TimedOut`.
pub fn recv_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; u64::from_le_bytes(len) as usize];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank0_broadcasts_the_blob_to_every_rank() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let blob: Vec<u8> = (0..128u8).collect(); // the size of an NCCL unique id
        let t = Duration::from_secs(20);
        // ranks connect in reverse order, before and after rank 0 starts listening
        let joins: Vec<_> = (1..4)
            .rev()
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || join(&addr, r, 4, t).unwrap().0)
            })
            .collect();
        let links = serve(listener, 4, &blob, t).unwrap();
        assert_eq!(links.peers.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        for j in joins {
            assert_eq!(j.join().unwrap(), blob);
        }
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = Duration::from_millis(600);
        let a = addr.clone();
        let one = std::thread::spawn(move || join(&a, 1, 3, t));
        let started = Instant::now();
        let e = format!("{:#}", serve(listener, 3, b"id", t).err().unwrap());
        assert!(e.contains("rank(s) 2 of WORLD_SIZE=3 did not arrive within 1 s"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // rank 1 got no blob: rank 0 gave up
        let e = format!("{:#}", one.join().unwrap().err().unwrap());
        assert!(e.contains("rank 1: no answer from rank 0"), "{e}");
        // nobody listening: the joining rank names the address
        let e = format!("{:#}", join(&addr, 2, 3, Duration::from_millis(300)).err().unwrap());
        assert!(e.contains(&format!("rank 2: could not reach rank 0 at {addr}")), "{e}");
    }

    #[test]
    fn a_rank_with_another_world_size_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = Duration::from_secs(10);
        let _j = std::thread::spawn(move || join(&addr, 1, 4, t));
        let e = format!("{:#}", serve(listener, 2, b"", t).err().unwrap());
        assert!(e.contains("rank 1 has WORLD_SIZE=4, rank 0 has WORLD_SIZE=2"), "{e}");
    }
}
