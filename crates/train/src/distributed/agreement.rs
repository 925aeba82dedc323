//! What every rank of a job must agree on before it trains: the same resolved config
//! ([`same_config_as_rank0`]) and the same way at a fork ([`any_rank`]: a rank that went on
//! while another stopped would wait in a collective).

use super::collective::Collective;
use anyhow::Result;

/// Whether `flag` is true on any rank of `comm` (every rank must call it).
///
/// # Errors
/// The sum over the ranks failing.
pub fn any_rank(comm: &dyn Collective, flag: bool) -> Result<bool> {
    let mut n = [u64::from(flag)];
    comm.sum_u64(&mut n)?;
    Ok(n[0] > 0)
}

/// Every rank must run rank 0's resolved config (a multi-node launch could give a node
/// another file): rank 0 broadcasts its `config.toml`, the others compare, and every rank
/// learns each one's first difference, so that all of them (rank 0 too, which the user reads
/// first) fail with the same message naming the ranks and the lines.
///
/// # Errors
/// The ranks' configs differ, or a collective fails.
pub fn same_config_as_rank0(comm: &dyn Collective, config_toml: &str) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world == 1 {
        return Ok(());
    }
    let mut theirs = config_toml.as_bytes().to_vec();
    comm.broadcast(&mut theirs)?;
    let diff = match theirs == config_toml.as_bytes() {
        true => String::new(),
        false => {
            let theirs = String::from_utf8_lossy(&theirs);
            let first = config_toml.lines().zip(theirs.lines()).find(|(a, b)| a != b);
            let (mine, zero) = first.unwrap_or(("(length)", "(length)"));
            format!("rank {rank} has {mine:?} where rank 0 has {zero:?}")
        }
    };
    let mut lens = vec![0u64; world];
    lens[rank] = diff.len() as u64;
    comm.sum_u64(&mut lens)?;
    if lens.iter().all(|&n| n == 0) {
        return Ok(());
    }
    let counts: Vec<usize> = lens.iter().map(|&n| n as usize).collect();
    let all = comm.all_gather(diff.as_bytes(), &counts)?;
    let mut diffs = Vec::new();
    let mut at = 0;
    for n in counts {
        if n > 0 {
            diffs.push(String::from_utf8_lossy(&all[at..at + n]).into_owned());
        }
        at += n;
    }
    anyhow::bail!("the ranks resolved different configs (every rank needs the same --config and --set): {}", diffs.join("; "))
}
