//! The program's entry points and what became of the calls made through each: the
//! end-of-run summary's table, which the tests read for exact counts.
//!
//! An entry is the outermost wrapped call the program made (a Fortran spelling calls the
//! C entry point, and counts as Fortran); a nonblocking allreduce counts under the call
//! that handed its completion to the program (`MPI_Iallreduce by MPI_Waitall`). A process
//! that loaded mpi4py has its entries marked so (mpi4py calls the C entry points).

use std::{cell::Cell, collections::BTreeMap};

thread_local! {
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The entry point the program is in, set for the duration of its wrapper (an outer one
/// already set stays).
pub struct Entered {
    set: bool,
}

pub fn enter(name: &'static str) -> Entered {
    CURRENT.with(|c| {
        if c.get().is_some() {
            Entered { set: false }
        } else {
            c.set(Some(name));
            Entered { set: true }
        }
    })
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.set {
            CURRENT.with(|c| c.set(None));
        }
    }
}

/// The entry point the program is in now.
pub fn current() -> &'static str {
    CURRENT.with(|c| c.get()).unwrap_or("MPI_Finalize")
}

/// How a call was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Through the switch.
    Switch,
    /// Through the switch, some of its result taken from peers.
    Recovered,
    /// By Open MPI for its size (`XAGG_ROUTE`).
    Routed,
    /// By Open MPI, the switch's result flagged (NaN, infinity, overflow).
    Flagged,
    /// By Open MPI after the switch failed.
    Fallback,
    /// Handed to Open MPI unchanged (a type, op or communicator the switch does not take).
    Passed,
}

const WAYS: [(Way, &str); 6] = [
    (Way::Switch, "switch"),
    (Way::Recovered, "recovered from peers"),
    (Way::Routed, "routed by size"),
    (Way::Flagged, "flagged and redone"),
    (Way::Fallback, "fallback"),
    (Way::Passed, "passed"),
];

/// Calls per entry point and way.
#[derive(Default)]
pub struct Table {
    counts: BTreeMap<String, [u64; 6]>,
}

impl Table {
    /// Counts a call made through `entry`.
    pub fn count(&mut self, entry: &str, way: Way) {
        let mut name = entry.to_string();
        if mpi4py() {
            name.push_str(" (mpi4py)");
        }
        let i = WAYS.iter().position(|(w, _)| *w == way).expect("a way");
        self.counts.entry(name).or_default()[i] += 1;
    }

    /// One line per entry point: `NAME: N switch, N recovered from peers, ...`.
    pub fn lines(&self) -> Vec<String> {
        self.counts
            .iter()
            .map(|(name, c)| {
                let ways: Vec<String> = WAYS
                    .iter()
                    .zip(c)
                    .map(|((_, w), n)| format!("{n} {w}"))
                    .collect();
                format!("{name}: {}", ways.join(", "))
            })
            .collect()
    }
}

/// Whether this process loaded mpi4py (its calls come through the C entry points).
fn mpi4py() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("/mpi4py/"))
    })
}
