//! Which calls of the drop-ins go to the switch, by size: `XAGG_ROUTE`, as rank 0 has it
//! (every rank must decide alike, so rank 0's is shared at the job's start). A call's size
//! is its element count times the element's size — its type signature, the same on every
//! rank of a legal call whatever handles the ranks pass.
//!
//! The value is `all`, `none`, or byte ranges served by the switch, `LO-HI` (HI excluded)
//! with either end left open, suffixes `KiB`, `MiB`, `GiB`: `0-16KiB,32MiB-`. Unset (or
//! `auto`), [`Route::Measured`] picks by the collective, the job's ranks and the other way
//! (Open MPI or Gloo) from the bench's figures, and for an allreduce by the element type
//! and the job's float mode too, where those were measured apart.

use std::fmt;

use xagg_common::wire::{Collective, DType, Float};

/// Which calls go to the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Byte ranges `[lo, hi)` whose calls go to the switch, whatever the collective
    /// (`XAGG_ROUTE`'s ranges, `all` or `none`).
    Ranges(Vec<(u64, u64)>),
    /// The bench's figures for a job of `ranks` whose other way is `other` and whose
    /// float sums travel as `float`, per collective.
    Measured {
        ranks: usize,
        other: Other,
        float: Float,
    },
}

/// The way a call not taken by the switch goes, against which the defaults were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Other {
    /// The MPI library's: Open MPI's own collectives.
    OpenMpi,
    /// The PyTorch backend's: Gloo's.
    Gloo,
}

/// Byte ranges for jobs of 2–3, 4–7, and 8 or more ranks.
type Tiers = [&'static [(u64, u64)]; 3];

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const OPEN: u64 = u64::MAX;

/// The defaults, from the bench on the 2-core VM (docs/bench.md, "Which calls take the
/// switch"): the switch wherever its path, as the drop-ins take it (results on UDP
/// sockets), took at most 0.9x the other's time, the boundary at the geometric middle
/// between two measured sizes (4 KiB, 64 KiB, 1 MiB, 16 MiB; the allreduce's also 64
/// MiB). Per collective, for jobs of 2–3, 4–7 and 8 or more ranks.
///
/// Allreduce against Open MPI: 4 KiB 0.59x (2 ranks), 0.45x (4), 0.30x (8); 64 KiB 1.39x,
/// 1.37x, 0.81x; 1 MiB and up 1.24–2.99x. The other collectives (`cargo xtask bench
/// --collectives --mpi-on-switch`, docs/bench.md "The collectives"): see there, the
/// table of the MPI library against Open MPI.
const AGAINST_OPEN_MPI: [(Collective, Tiers); 5] = [
    (
        Collective::Allreduce,
        [&[(0, 16 * KIB)], &[(0, 16 * KIB)], &[(0, 256 * KIB)]],
    ),
    (
        Collective::ReduceScatter,
        [&[], &[(0, 16 * KIB), (256 * KIB, OPEN)], &[(0, 4 * MIB)]],
    ),
    (
        Collective::AllGather,
        [&[], &[(0, 16 * KIB)], &[(0, 256 * KIB)]],
    ),
    (Collective::Broadcast, [&[], &[], &[(16 * KIB, 4 * MIB)]]),
    (
        Collective::Reduce,
        [&[(0, 16 * KIB)], &[(0, 256 * KIB)], &[(0, 4 * MIB)]],
    ),
];

/// Against Gloo (the PyTorch backend's calls through the switch against Gloo's same call on
/// the same lab, `XAGG_ROUTE=all cargo xtask bench --collectives`, medians of four rounds
/// over two benches; docs/bench.md, "The collectives"), by the same rule. Gloo's small
/// calls are slow here: the allreduce from 4 KiB to 1 MiB took at most 0.64x Gloo's time
/// at every size of job, from 16 MiB 1.36–2.11x. Torch 1.13's Gloo has no reduce-scatter:
/// against a program's stand-in (Gloo's allreduce, the block kept) the switch's took
/// 0.16–0.76x at every size. Broadcasts took 1.08–1.52x Gloo's from 64 KiB, and at 4 KiB
/// 0.79x / 1.31x / 0.86x with 2 / 4 / 8 ranks.
const AGAINST_GLOO: [(Collective, Tiers); 5] = [
    (Collective::Allreduce, [&[(0, 4 * MIB)]; 3]),
    (Collective::ReduceScatter, [&[(0, OPEN)]; 3]),
    (Collective::AllGather, [&[(0, 4 * MIB)]; 3]),
    (
        Collective::Broadcast,
        [&[(0, 16 * KIB)], &[], &[(0, 16 * KIB)]],
    ),
    (
        Collective::Reduce,
        [&[(0, OPEN)], &[(0, 4 * MIB)], &[(0, 4 * MIB)]],
    ),
];

/// Reductions whose element type, in a float mode, was measured apart from int32's
/// (`XAGG_ROUTE=all cargo xtask bench --dtype T`, the drop-ins' own calls against the
/// other way's; docs/bench.md "Which calls take the switch"), by the same rule.
///
/// Against Gloo, in the backend's default fast mode (medians of two rounds): Gloo 1.13
/// sums float16 slowly; the switch carries it in 32-bit lanes: through the switch it took
/// 0.28–0.73x Gloo's time at every size from 256 KiB with 4 ranks, 0.21–0.87x with 8, and
/// with 2 ranks 0.39–0.60x up to 1 MiB, 0.79–0.94x from 4 MiB (the boundary kept at
/// int32's 4 MiB there). float32 and float64 measured close to int32's boundary (below 4
/// MiB 0.17–0.66x but at 256 KiB with 2 ranks, 1.33x and 1.02x; from 4 MiB 0.84–1.56x),
/// and bfloat16 (which the backend widens to float32 for Gloo) 0.83–1.11x from 4 MiB,
/// neither way ahead by the rule's margin at every size of job: they take int32's.
///
/// Against Open MPI, in the MPI library's default exact mode (twice the bytes of
/// float32 and float64 on the wire; medians of three rounds, then four at 4 and 16 KiB):
/// with 2 ranks float32 and float64 took 1.14x and 1.28x Open MPI's time at 4 KiB and
/// 2.6–4.2x from 16 KiB; with 4 ranks 0.85–0.86x at 4 KiB, 3.9–5.4x from 64 KiB; with 8
/// ranks 0.43–0.45x at 4 KiB, 0.70–0.83x at 16 KiB, 1.66–2.61x from 64 KiB (int32's
/// default sent 8 ranks' calls to the switch up to 256 KiB).
///
/// The MPI library's reduce-scatters and reduces of float64 in the exact mode (`cargo
/// xtask bench --collectives --mpi-on-switch --no-torch --dtype float64`, medians of two
/// rounds): a reduce-scatter took 2.14x Open MPI's time at 4 KiB with 2 ranks and
/// 1.79–2.46x from 64 KiB, 0.80x at 4 KiB with 4 ranks and 1.79–2.22x from 64 KiB, 0.52x at
/// 4 KiB with 8 and 1.38–1.69x from 64 KiB; a reduce 0.64x, 0.68x and 0.43x at 4 KiB with
/// 2, 4 and 8 ranks, and 1.26–3.08x from 64 KiB (int32's sent them to the switch up to 4
/// MiB with 8 ranks). float32, twice its bytes as well, takes float64's.
const TYPED: [(Other, Collective, &[DType], Float, Tiers); 4] = [
    (
        Other::Gloo,
        Collective::Allreduce,
        &[DType::F16],
        Float::Fast,
        [&[(0, 4 * MIB)], &[(0, OPEN)], &[(0, OPEN)]],
    ),
    (
        Other::OpenMpi,
        Collective::Allreduce,
        EXACT_FLOATS,
        Float::Exact,
        [&[], &[(0, 16 * KIB)], &[(0, 32 * KIB)]],
    ),
    (
        Other::OpenMpi,
        Collective::ReduceScatter,
        EXACT_FLOATS,
        Float::Exact,
        [&[], &[(0, 16 * KIB)], &[(0, 16 * KIB)]],
    ),
    (
        Other::OpenMpi,
        Collective::Reduce,
        EXACT_FLOATS,
        Float::Exact,
        [&[(0, 16 * KIB)]; 3],
    ),
];

/// The MPI library's float types, twice their bytes on the wire in the exact mode.
const EXACT_FLOATS: &[DType] = &[DType::F32, DType::F64];

impl Route {
    /// Every call to the switch.
    pub fn all() -> Self {
        Self::Ranges(vec![(0, OPEN)])
    }

    /// `XAGG_ROUTE`'s value for a job of `ranks` whose other way is `other` and whose
    /// float sums travel as `float` (`None`, empty or `auto`: measured).
    pub fn parse(
        value: Option<&str>,
        ranks: usize,
        other: Other,
        float: Float,
    ) -> Result<Self, String> {
        let v = value.map(str::trim).unwrap_or("");
        match v {
            "" | "auto" => {
                return Ok(Self::Measured {
                    ranks,
                    other,
                    float,
                })
            }
            "all" => return Ok(Self::all()),
            "none" => return Ok(Self::Ranges(Vec::new())),
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
                OPEN
            } else {
                bytes(hi).map_err(bad)?
            };
            if lo >= hi {
                return Err(bad(format!("{part:?} is empty")));
            }
            ranges.push((lo, hi));
        }
        Ok(Self::Ranges(ranges))
    }

    /// The byte ranges whose `collective` calls over `dtype` (where it matters: the
    /// reductions' elements) go to the switch.
    fn ranges(&self, collective: Collective, dtype: Option<DType>) -> &[(u64, u64)] {
        match self {
            Self::Ranges(r) => r,
            Self::Measured {
                ranks,
                other,
                float,
            } => {
                let tier = match ranks {
                    0..=3 => 0,
                    4..=7 => 1,
                    _ => 2,
                };
                let typed = TYPED.iter().find(|(o, c, types, f, _)| {
                    o == other
                        && *c == collective
                        && dtype.is_some_and(|t| types.contains(&t))
                        && f == float
                });
                if let Some((.., tiers)) = typed {
                    return tiers[tier];
                }
                let table = match other {
                    Other::OpenMpi => &AGAINST_OPEN_MPI,
                    Other::Gloo => &AGAINST_GLOO,
                };
                table
                    .iter()
                    .find(|(c, _)| *c == collective)
                    .map_or(&[], |(_, tiers)| tiers[tier])
            }
        }
    }

    /// Whether a `collective` call of `bytes` goes to the switch; `dtype`, the elements'
    /// type where known (a reduction's route may depend on it, [`TYPED`]).
    pub fn takes(&self, collective: Collective, dtype: Option<DType>, bytes: u64) -> bool {
        self.ranges(collective, dtype)
            .iter()
            .any(|&(lo, hi)| lo <= bytes && bytes < hi)
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ranges(r) => write!(f, "{}", written(r)),
            Self::Measured {
                ranks,
                other,
                float,
            } => {
                let each: Vec<String> = AGAINST_OPEN_MPI
                    .iter()
                    .map(|(c, _)| {
                        let typed: String = TYPED
                            .iter()
                            .filter(|(o, tc, _, f, _)| o == other && tc == c && f == float)
                            .flat_map(|(_, _, types, ..)| types.iter())
                            .map(|t| format!(", {t} {}", written(self.ranges(*c, Some(*t)))))
                            .collect();
                        format!("{} {}{typed}", c.name(), written(self.ranges(*c, None)))
                    })
                    .collect();
                write!(f, "auto for {ranks} ranks: {}", each.join("; "))
            }
        }
    }
}

/// Ranges as `XAGG_ROUTE` takes them (`none` for no range).
fn written(ranges: &[(u64, u64)]) -> String {
    if ranges.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = ranges
        .iter()
        .map(|&(lo, hi)| {
            let end = if hi == OPEN { String::new() } else { size(hi) };
            format!("{}-{end}", size(lo))
        })
        .collect();
    parts.join(",")
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
        let r = Route::parse(Some("0-16KiB, 32MiB-"), 2, Other::OpenMpi, Float::Exact).unwrap();
        let takes = |b| r.takes(Collective::Allreduce, None, b);
        assert!(takes(0) && takes(16383) && !takes(16384));
        assert!(!takes((32 << 20) - 1) && takes(32 << 20) && takes(u64::MAX - 1));
        // A set route is every collective's.
        assert!(
            r.takes(Collective::Broadcast, None, 4096)
                && !r.takes(Collective::Reduce, None, 1 << 20)
        );
        assert_eq!(r.to_string(), "0-16KiB,32MiB-");
        assert_eq!(
            Route::parse(Some(&r.to_string()), 2, Other::OpenMpi, Float::Exact).unwrap(),
            r
        );
        assert!(Route::parse(Some("all"), 2, Other::OpenMpi, Float::Exact)
            .unwrap()
            .takes(Collective::Broadcast, None, 1 << 40));
        assert!(!Route::parse(Some("none"), 2, Other::OpenMpi, Float::Exact)
            .unwrap()
            .takes(Collective::Allreduce, None, 4));
    }

    #[test]
    fn the_default_follows_the_collective_the_other_way_and_the_jobs_ranks() {
        for value in [None, Some("auto")] {
            let mpi = |ranks| Route::parse(value, ranks, Other::OpenMpi, Float::Exact).unwrap();
            let (two, four, eight) = (mpi(2), mpi(4), mpi(8));
            let ar = Collective::Allreduce;
            assert!(
                two.takes(ar, None, 4096)
                    && !two.takes(ar, None, 16 << 10)
                    && !two.takes(ar, None, 64 << 20)
            );
            assert!(
                four.takes(ar, None, 4096)
                    && !four.takes(ar, None, 64 << 10)
                    && !four.takes(ar, None, 64 << 20)
            );
            assert!(eight.takes(ar, None, 64 << 10) && !eight.takes(ar, None, 256 << 10));
            // Small broadcasts are Open MPI's at every size of job; two ranks' gathers too.
            let bc = Collective::Broadcast;
            assert!(
                !two.takes(bc, None, 4096)
                    && !four.takes(bc, None, 4096)
                    && !eight.takes(bc, None, 4096)
            );
            assert!(!four.takes(bc, None, 1 << 20) && eight.takes(bc, None, 64 << 10));
            assert!(!two.takes(Collective::AllGather, None, 4096));
            assert!(two.takes(Collective::Reduce, None, 4096));
            for ranks in [2, 4, 8] {
                let gloo = Route::parse(value, ranks, Other::Gloo, Float::Fast).unwrap();
                assert!(
                    gloo.takes(ar, None, 1 << 20)
                        && !gloo.takes(ar, None, 4 << 20)
                        && !gloo.takes(ar, None, 64 << 20)
                );
                // Gloo 1.13 has no reduce-scatter; large broadcasts are Gloo's.
                assert!(gloo.takes(Collective::ReduceScatter, None, 64 << 20));
                assert!(!gloo.takes(bc, None, 64 << 10));
            }
            let gloo = |ranks| Route::parse(value, ranks, Other::Gloo, Float::Fast).unwrap();
            assert!(gloo(2).takes(bc, None, 4096) && !gloo(4).takes(bc, None, 4096));
            assert!(gloo(2).takes(Collective::Reduce, None, 16 << 20));
            assert!(!gloo(4).takes(Collective::Reduce, None, 16 << 20));
        }
        assert_eq!(
            Route::parse(None, 2, Other::OpenMpi, Float::Exact).unwrap().to_string(),
            "auto for 2 ranks: allreduce 0-16KiB, f32 none, f64 none; reduce_scatter none, f32 none, f64 none; all_gather none; broadcast none; reduce 0-16KiB, f32 0-16KiB, f64 0-16KiB"
        );
    }

    #[test]
    fn against_gloo_a_float16_allreduce_has_a_route_of_its_own() {
        let ar = Collective::Allreduce;
        for ranks in [2, 4, 8] {
            let gloo = Route::parse(None, ranks, Other::Gloo, Float::Fast).unwrap();
            let mpi = Route::parse(None, ranks, Other::OpenMpi, Float::Exact).unwrap();
            let f16 = Some(DType::F16);
            // Every size through the switch from 4 ranks; at 2 as int32's.
            assert_eq!(gloo.takes(ar, f16, 64 << 20), ranks >= 4, "{ranks} ranks");
            assert!(gloo.takes(ar, f16, 1 << 20));
            // Not against Open MPI, nor for the collectives that only move bytes.
            assert_eq!(mpi.takes(ar, f16, 64 << 20), mpi.takes(ar, None, 64 << 20));
            let ag = Collective::AllGather;
            assert_eq!(
                gloo.takes(ag, f16, 64 << 20),
                gloo.takes(ag, None, 64 << 20)
            );
            for t in [DType::I32, DType::I64, DType::F32, DType::F64, DType::Bf16] {
                assert_eq!(
                    gloo.takes(ar, Some(t), 64 << 20),
                    gloo.takes(ar, None, 64 << 20)
                );
            }
            // A set route is every type's.
            let set = Route::parse(Some("0-1MiB"), ranks, Other::Gloo, Float::Fast).unwrap();
            assert!(!set.takes(ar, Some(DType::F16), 4 << 20));
        }
        assert_eq!(
            Route::parse(None, 4, Other::Gloo, Float::Fast).unwrap().to_string(),
            "auto for 4 ranks: allreduce 0-4MiB, f16 0-; reduce_scatter 0-; all_gather 0-4MiB; broadcast none; reduce 0-4MiB"
        );
    }

    #[test]
    fn against_open_mpi_exact_float_reductions_have_a_route_of_their_own() {
        let ar = Collective::Allreduce;
        for (ranks, below) in [(2, 0), (3, 0), (4, 16 << 10), (8, 32 << 10), (64, 32 << 10)] {
            let exact = Route::parse(None, ranks, Other::OpenMpi, Float::Exact).unwrap();
            let fast = Route::parse(None, ranks, Other::OpenMpi, Float::Fast).unwrap();
            for t in [DType::F32, DType::F64] {
                for bytes in [4 << 10, (16 << 10) - 4, 16 << 10, 64 << 10, 1 << 20] {
                    assert_eq!(
                        exact.takes(ar, Some(t), bytes),
                        bytes < below,
                        "{ranks} ranks, {t}, {bytes} bytes"
                    );
                    // The fast mode's lanes are the type's own bytes: int32's route.
                    assert_eq!(fast.takes(ar, Some(t), bytes), fast.takes(ar, None, bytes));
                }
            }
            // Reduce-scatters and reduces below 16 KiB but with 2 or 3 ranks' reduce-scatters.
            for t in [DType::F32, DType::F64] {
                let (rs, rd) = (Collective::ReduceScatter, Collective::Reduce);
                assert_eq!(exact.takes(rs, Some(t), 4 << 10), ranks >= 4, "{ranks}");
                assert!(!exact.takes(rs, Some(t), 16 << 10) && !exact.takes(rs, Some(t), 4 << 20));
                assert!(exact.takes(rd, Some(t), 4 << 10) && !exact.takes(rd, Some(t), 16 << 10));
                assert!(!exact.takes(rd, Some(t), 1 << 20));
                assert_eq!(
                    fast.takes(rd, Some(t), 1 << 20),
                    fast.takes(rd, None, 1 << 20)
                );
            }
            // Integers, and the collectives that only move bytes, as before.
            assert_eq!(
                exact.takes(ar, Some(DType::I32), 64 << 10),
                exact.takes(ar, None, 64 << 10)
            );
            let bc = Collective::Broadcast;
            assert_eq!(
                exact.takes(bc, Some(DType::F64), 64 << 10),
                exact.takes(bc, None, 64 << 10)
            );
        }
        assert_eq!(
            Route::parse(None, 8, Other::OpenMpi, Float::Exact).unwrap().to_string(),
            "auto for 8 ranks: allreduce 0-256KiB, f32 0-32KiB, f64 0-32KiB; reduce_scatter 0-4MiB, f32 0-16KiB, f64 0-16KiB; all_gather 0-256KiB; broadcast 16KiB-4MiB; reduce 0-4MiB, f32 0-16KiB, f64 0-16KiB"
        );
    }

    #[test]
    fn a_bad_value_says_what_to_write() {
        for v in ["16KiB", "5-5", "1-x", "9999999999999GiB-"] {
            let e = Route::parse(Some(v), 2, Other::OpenMpi, Float::Exact).unwrap_err();
            assert!(
                e.contains("XAGG_ROUTE") && e.contains("0-16KiB,32MiB-"),
                "{e}"
            );
        }
    }
}
