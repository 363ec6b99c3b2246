//! Loading, attaching, pinning and adopting the XDP dataplane, and the map operations the
//! daemon performs on it. The dataplane's maps are the single source of truth: a restarted
//! daemon adopts the pinned maps and knows every job from them.

use std::path::{Path, PathBuf};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray},
    Ebpf,
};
use xagg_common::{
    job::{EgressKey, Faults, Hello, MemberAddr, SwitchConfig},
    slot::SlotImage,
    Job,
};

mod hellos;
mod jobs;
mod load;
mod observe;

pub use load::load_folds;
pub use xagg_linux::pins::unpin;

pub(crate) use crate::{Error, Result};

/// Every map the daemon pins. `LAYOUT` holds [`LAYOUT_VERSION`]; dataplanes pinned before
/// it existed have layout 1.
pub(crate) const MAP_NAMES: [&str; 18] = [
    "JOBS",
    "EGRESS",
    "SLOTS",
    "SWITCH",
    "PORTS",
    "COUNTERS",
    "FAULTS",
    "LAYOUT",
    "HELLOS",
    "HELLO_COUNTS",
    "HELLO_RELEASED",
    "JOB_COUNTERS",
    "DROPS",
    "FOLDS",
    "PARENTS",
    "STEER",
    "CPUS",
    "FOLDS_STEERED",
];

pub struct Dataplane {
    jobs: Array<MapData, Job>,
    egress: HashMap<MapData, EgressKey, u32>,
    slots: Array<MapData, SlotImage>,
    switch: Array<MapData, SwitchConfig>,
    faults: Array<MapData, Faults>,
    counters: PerCpuArray<MapData, u64>,
    /// The first sender of each drop reason since the daemon last took them.
    drops: Array<MapData, MemberAddr>,
    /// Per-job and per-member counters, a row per job index.
    job_counters: PerCpuArray<MapData, u64>,
    /// Joining members' hellos by token (the switch program fills it, each port up to its
    /// share).
    hellos: HashMap<MapData, u64, Hello>,
    /// Hellos waiting per port, which the sweep recounts.
    /// Hellos per port the daemon took or swept (the switch subtracts them from its count).
    hello_released: HashMap<MapData, u32, u32>,
    /// Inner-level jobs by their id at the parent: where the parent's results go.
    parents: HashMap<MapData, u32, u32>,
    /// The pin directory, when the dataplane outlives the daemon.
    pin: Option<PathBuf>,
    /// Links of an unpinned dataplane (XDP, and the fan-out's tc ingress): dropping them
    /// detaches the programs.
    _links: Vec<aya::programs::xdp::XdpLink>,
    _fanout_links: Vec<aya::programs::tc::SchedClassifierLink>,
    /// The fold programs' tables (the ports', the steered contributions'): their entries
    /// live as long as a descriptor of them (or their pins), and so do the cpumap's.
    _folds: Vec<ProgramArray<MapData>>,
    _cpus: Option<aya::maps::CpuMap<MapData>>,
    /// The CPUs contributions are steered to (`switch.steer_cpus`), as the `STEER` map has
    /// them.
    pub steer: Vec<usize>,
    _ebpf: Option<Ebpf>,
    /// Whether the maps came from an earlier daemon's pins.
    pub adopted: bool,
    /// The switch's ports, in devmap order: a job's members must be behind them.
    ports: Vec<String>,
}

pub(crate) fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |source| Error::Map { name, source }
}

pub(crate) fn pin_err(
    path: &Path,
) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> Error + '_ {
    move |source| Error::Pin {
        path: path.to_owned(),
        source,
    }
}
