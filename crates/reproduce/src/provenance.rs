//! Where a run was made, as its record keeps it: the card (`nvidia-smi`'s name of the GPU the
//! run had, or `cpu`), the binary (the git commit `train --version` prints) and the UTC date.
//! Runs of one comparison belong on one card: a card moves a final loss by more than some of
//! the effects studied (reproduce/departures.md), so reports show each run's card and mark
//! seed pairs made on two.

use std::process::Command;
use std::time::SystemTime;

/// The card of a run: `nvidia-smi`'s name of GPU `gpu` (a `CUDA_VISIBLE_DEVICES` entry: an
/// index or UUID), `cpu` for a run without one; `None` when `nvidia-smi` cannot say.
pub fn card(gpu: Option<&str>) -> Option<String> {
    let Some(g) = gpu else { return Some("cpu".into()) };
    let out = Command::new("nvidia-smi").args(["--query-gpu=name", "--format=csv,noheader", "-i", g]).output().ok()?;
    let name = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string();
    (out.status.success() && !name.is_empty()).then_some(name)
}

/// A card's short name in reports: the model number of an NVIDIA data-centre card (`H100`
/// from `NVIDIA H100 80GB HBM3`), else the name as recorded (`cpu`).
pub fn short_card(name: &str) -> String {
    name.split_whitespace()
        .find(|w| w.len() >= 3 && w.starts_with(['A', 'B', 'H', 'L', 'V']) && w[1..].chars().all(|c| c.is_ascii_digit()))
        .unwrap_or(name)
        .to_string()
}

/// The UTC date of `t` as `YYYY-MM-DD` (the proleptic Gregorian calendar; days from the civil
/// calendar algorithm of H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
pub fn utc_date(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_and_card_names() {
        let at = |s: u64| utc_date(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(951_782_400), "2000-02-29"); // a leap day of a century leap year
        assert_eq!(at(1_796_601_600), "2026-12-07");
        assert_eq!(short_card("NVIDIA H100 80GB HBM3"), "H100");
        assert_eq!(short_card("NVIDIA H200"), "H200");
        assert_eq!(short_card("cpu"), "cpu");
        assert_eq!(card(None).as_deref(), Some("cpu"));
    }
}
