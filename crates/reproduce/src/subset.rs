//! Which part of a table one command runs: `--cells` (cells or whole formats) and the seeds
//! (`--seeds N` for 0..N, `--seed-list` for explicit seeds and ranges), so that a table too
//! big for one device command fills in over several.

use super::paper::{cell_short, cells, Cell, Fmt, Table};
use anyhow::{bail, Context, Result};

/// The cells named by `--cells`, in the table's order. Each item is a cell's short name
/// (`fp8_sr`, `fp4_sr_reset`, `fp32_plain`, `soap_fp8_reset`: [`cell_short`]) or a format
/// (`fp4`: all of its cells in the table). Empty: every cell.
pub fn select_cells(table: Table, items: &[String]) -> Result<Vec<Cell>> {
    let all = cells(table);
    if items.is_empty() {
        return Ok(all);
    }
    let mut chosen = Vec::new();
    for item in items.iter().map(|s| s.trim()) {
        let hits: Vec<Cell> = match Fmt::ALL.iter().find(|f| f.as_str() == item) {
            Some(&f) => all.iter().copied().filter(|c| c.0 == f).collect(),
            None => all.iter().copied().filter(|c| cell_short(table, c) == item).collect(),
        };
        if hits.is_empty() {
            let names: Vec<String> = all.iter().map(|c| cell_short(table, c)).collect();
            // only the formats this table has cells of
            let formats: Vec<&str> = Fmt::ALL.iter().filter(|f| all.iter().any(|c| c.0 == **f)).map(|f| f.as_str()).collect();
            bail!(
                "--cells: {item:?} is not a cell of the {} table nor one of its formats; expected a format ({}) or one of: {}",
                table.as_str(),
                formats.join(", "),
                names.join(", ")
            );
        }
        chosen.extend(hits);
    }
    Ok(all.into_iter().filter(|c| chosen.contains(c)).collect())
}

/// Parse `--seed-list`: comma-separated seeds and inclusive ranges (`1`, `2,3`, `0-2`,
/// `0-1,4`), returned sorted without repeats.
pub fn parse_seed_list(s: &str) -> Result<Vec<usize>> {
    let num = |t: &str| t.trim().parse::<usize>().with_context(|| format!("--seed-list {s:?}: {t:?} is not a seed (a whole number >= 0)"));
    let mut seeds = Vec::new();
    for item in s.split(',') {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    bail!("--seed-list {s:?}: range {item:?} runs backwards (write it low-high)");
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(num(item)?),
        }
    }
    seeds.sort_unstable();
    seeds.dedup();
    Ok(seeds)
}

/// The seeds of a command: `--seed-list` when given, else `--seeds N` (0..N), else the
/// scale's default count.
pub fn seeds_to_run(count: Option<usize>, list: Option<&str>, default_count: usize) -> Result<Vec<usize>> {
    match (count, list) {
        (Some(_), Some(_)) => bail!("--seeds (a count) and --seed-list (explicit seeds) exclude each other"),
        (_, Some(l)) => parse_seed_list(l),
        (Some(0), None) => bail!("--seeds 0: give at least one seed"),
        (n, None) => Ok((0..n.unwrap_or(default_count)).collect()),
    }
}
