//! Which calls of the drop-ins go to the switch, by size: `XAGG_ROUTE`, as rank 0 has it
//! (every rank must decide alike, so rank 0's is shared at the job's start). A call's size
//! is its element count times the element's size — its type signature, the same on every
//! rank of a legal call whatever handles the ranks pass.
//!
//! The value is `all`, `none`, or byte ranges served by the switch, `LO-HI` (HI excluded)
//! with either end left open, suffixes `KiB`, `MiB`, `GiB`: `0-16KiB,32MiB-`. Unset (or
//! `auto`), [`Route::measured`] picks by the job's ranks and the other way (Open MPI or
//! Gloo) from the bench's figures.

use std::fmt;

/// Byte ranges `[lo, hi)` whose calls go to the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    ranges: Vec<(u64, u64)>,
}

/// The way a call not taken by the switch goes, against which the defaults were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Other {
    /// The MPI library's: Open MPI's own allreduce.
    OpenMpi,
    /// The PyTorch backend's: Gloo's.
    Gloo,
}

/// The defaults, from the bench on the 2-core VM (docs/bench.md, "Which calls take the
/// switch"): the switch wherever its path, as the drop-ins take it (results on UDP
/// sockets), took at most 0.9x the other's time, the boundary at the geometric middle
/// between two measured sizes. Against Open MPI: 4 KiB 0.59x (2 ranks), 0.45x (4), 0.30x
/// (8); 64 KiB 1.39x, 1.37x, 0.81x; 1 MiB and up 1.24-2.99x. Against Gloo, whose small
/// calls are slow here: 4 KiB to 1 MiB at most 0.64x at every size of job; 16 MiB and up
/// 1.36-2.11x.
const BELOW_OPEN_MPI: u64 = 16 << 10;
const BELOW_OPEN_MPI_FROM_8: u64 = 256 << 10;
const BELOW_GLOO: u64 = 4 << 20;

impl Route {
    /// Every call to the switch.
    pub fn all() -> Self {
        Self {
            ranges: vec![(0, u64::MAX)],
        }
    }

    /// The default for a job of `ranks` whose other way is `other`, from the bench's
    /// figures (see [`BELOW_OPEN_MPI`]).
    pub fn measured(ranks: usize, other: Other) -> Self {
        let below = match other {
            Other::OpenMpi if ranks >= 8 => BELOW_OPEN_MPI_FROM_8,
            Other::OpenMpi => BELOW_OPEN_MPI,
            Other::Gloo => BELOW_GLOO,
        };
        Self {
            ranges: vec![(0, below)],
        }
    }

    /// `XAGG_ROUTE`'s value for a job of `ranks` whose other way is `other` (`None`,
    /// empty or `auto`: measured).
    pub fn parse(value: Option<&str>, ranks: usize, other: Other) -> Result<Self, String> {
        let v = value.map(str::trim).unwrap_or("");
        match v {
            "" | "auto" => return Ok(Self::measured(ranks, other)),
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
        let r = Route::parse(Some("0-16KiB, 32MiB-"), 2, Other::OpenMpi).unwrap();
        assert!(r.takes(0) && r.takes(16383) && !r.takes(16384));
        assert!(!r.takes((32 << 20) - 1) && r.takes(32 << 20) && r.takes(u64::MAX - 1));
        assert_eq!(r.to_string(), "0-16KiB,32MiB-");
        assert_eq!(
            Route::parse(Some(&r.to_string()), 2, Other::OpenMpi).unwrap(),
            r
        );
        assert!(Route::parse(Some("all"), 2, Other::OpenMpi)
            .unwrap()
            .takes(1 << 40));
        assert!(!Route::parse(Some("none"), 2, Other::OpenMpi)
            .unwrap()
            .takes(4));
    }

    #[test]
    fn the_default_follows_the_other_way_and_the_jobs_ranks() {
        for value in [None, Some("auto")] {
            let mpi = |ranks| Route::parse(value, ranks, Other::OpenMpi).unwrap();
            let (two, four, eight) = (mpi(2), mpi(4), mpi(8));
            assert!(two.takes(4096) && !two.takes(16 << 10) && !two.takes(64 << 20));
            assert!(four.takes(4096) && !four.takes(64 << 10) && !four.takes(64 << 20));
            assert!(eight.takes(64 << 10) && !eight.takes(256 << 10) && !eight.takes(64 << 20));
            for ranks in [2, 4, 8] {
                let gloo = Route::parse(value, ranks, Other::Gloo).unwrap();
                assert!(gloo.takes(1 << 20) && !gloo.takes(4 << 20) && !gloo.takes(64 << 20));
            }
        }
    }

    #[test]
    fn a_bad_value_says_what_to_write() {
        for v in ["16KiB", "5-5", "1-x", "9999999999999GiB-"] {
            let e = Route::parse(Some(v), 2, Other::OpenMpi).unwrap_err();
            assert!(
                e.contains("XAGG_ROUTE") && e.contains("0-16KiB,32MiB-"),
                "{e}"
            );
        }
    }
}
