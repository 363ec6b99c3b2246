//! Which calls of the drop-ins go to the switch, by size: `XAGG_ROUTE`, as rank 0 has it
//! (every rank must decide alike, so rank 0's is shared at the job's start). A call's size
//! is its element count times the element's size — its type signature, the same on every
//! rank of a legal call whatever handles the ranks pass.
//!
//! The value is `all`, `none`, or byte ranges served by the switch, `LO-HI` (HI excluded)
//! with either end left open, suffixes `KiB`, `MiB`, `GiB`: `0-16KiB,32MiB-`. Unset (or
//! `auto`), [`Route::measured`] picks by the job's ranks from the bench's figures.

use std::fmt;

/// Byte ranges `[lo, hi)` whose calls go to the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    ranges: Vec<(u64, u64)>,
}

/// Below this the drop-ins' switch path took at most 0.9x Open MPI's time in the bench on
/// the 2-core VM (docs/bench.md, "Which calls take the switch"; the switch's runs receiving
/// on UDP sockets, as the drop-ins' ranks do; 4 KiB: 0.58x at 2 ranks, 0.43x at 4, 0.31x at
/// 8), and above it nowhere (64 KiB to 16 MiB: 1.1-2.3x; 64 MiB: 2.01x at 2 ranks, 1.25x at
/// 4, 1.31x at 8). An earlier table, from switch runs receiving with AF_XDP, had 64 MiB at
/// 0.75-0.86x with 4 ranks or more; the drop-ins do not receive that way, and on a machine
/// where every rank has a core Open MPI's TCP was 2-3.7x faster from 1 MiB up.
const SMALL: u64 = 16 << 10;

impl Route {
    /// Every call to the switch.
    pub fn all() -> Self {
        Self {
            ranges: vec![(0, u64::MAX)],
        }
    }

    /// The default for a job of `ranks`, from the bench's figures (see [`SMALL`]): the
    /// same at every size of job today, kept per job size for a machine whose figures
    /// differ by it.
    pub fn measured(_ranks: usize) -> Self {
        Self {
            ranges: vec![(0, SMALL)],
        }
    }

    /// `XAGG_ROUTE`'s value for a job of `ranks` (`None`, empty or `auto`: measured).
    pub fn parse(value: Option<&str>, ranks: usize) -> Result<Self, String> {
        let v = value.map(str::trim).unwrap_or("");
        match v {
            "" | "auto" => return Ok(Self::measured(ranks)),
            "all" => return Ok(Self::all()),
            "none" => return Ok(Self { ranges: Vec::new() }),
            _ => {}
        }
        let bad = |why: String| {
            format!("XAGG_ROUTE={v}: {why}; give all, none, auto, or byte ranges served by the switch such as 0-16KiB,32MiB-")
        };
        let mut ranges = Vec::new();
        for part in v.split(',') {
            let (lo, hi) = part
                .split_once('-')
                .ok_or_else(|| bad(format!("{part:?} is not a range LO-HI")))?;
            let lo = if lo.trim().is_empty() {
                0
            } else {
                bytes(lo).map_err(bad)?
            };
            let hi = if hi.trim().is_empty() {
                u64::MAX
            } else {
                bytes(hi).map_err(bad)?
            };
            if lo >= hi {
                return Err(bad(format!("{part:?} is empty")));
            }
            ranges.push((lo, hi));
        }
        Ok(Self { ranges })
    }

    /// Whether a call of `bytes` goes to the switch.
    pub fn takes(&self, bytes: u64) -> bool {
        self.ranges
            .iter()
            .any(|&(lo, hi)| lo <= bytes && bytes < hi)
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ranges.is_empty() {
            return write!(f, "none");
        }
        let parts: Vec<String> = self
            .ranges
            .iter()
            .map(|&(lo, hi)| {
                let end = if hi == u64::MAX {
                    String::new()
                } else {
                    size(hi)
                };
                format!("{}-{end}", size(lo))
            })
            .collect();
        write!(f, "{}", parts.join(","))
    }
}

/// `123`, `16KiB`, `32MiB`, `1GiB`.
fn bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, scale) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suffix, scale)| s.strip_suffix(suffix).map(|d| (d, *scale)))
        .unwrap_or((s, 1));
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or with KiB, MiB, GiB)"))
}

/// A size written the way [`bytes`] reads it.
fn size(b: u64) -> String {
    for (suffix, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if b >= scale && b.is_multiple_of(scale) {
            return format!("{}{suffix}", b / scale);
        }
    }
    b.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_take_their_sizes_and_read_back_as_written() {
        let r = Route::parse(Some("0-16KiB, 32MiB-"), 2).unwrap();
        assert!(r.takes(0) && r.takes(16383) && !r.takes(16384));
        assert!(!r.takes((32 << 20) - 1) && r.takes(32 << 20) && r.takes(u64::MAX - 1));
        assert_eq!(r.to_string(), "0-16KiB,32MiB-");
        assert_eq!(Route::parse(Some(&r.to_string()), 2).unwrap(), r);
        assert!(Route::parse(Some("all"), 2).unwrap().takes(1 << 40));
        assert!(!Route::parse(Some("none"), 2).unwrap().takes(4));
    }

    #[test]
    fn the_default_takes_small_calls_at_every_size_of_job() {
        for ranks in [2, 4, 8, 64] {
            for r in [Route::parse(None, ranks), Route::parse(Some("auto"), ranks)] {
                let r = r.unwrap();
                assert!(r.takes(4096) && r.takes((16 << 10) - 1), "{r}");
                assert!(!r.takes(16 << 10) && !r.takes(64 << 20), "{r}");
            }
        }
    }

    #[test]
    fn a_bad_value_says_what_to_write() {
        for v in ["16KiB", "5-5", "1-x", "9999999999999GiB-"] {
            let e = Route::parse(Some(v), 2).unwrap_err();
            assert!(
                e.contains("XAGG_ROUTE") && e.contains("0-16KiB,32MiB-"),
                "{e}"
            );
        }
    }
}
