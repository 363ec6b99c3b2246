//! Every map of the switch's object, named as user space finds it, and the small lookups
//! over them.

use aya_ebpf::{
    btf_maps::{Array, CpuMap, DevMap, HashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
};
use xagg_common::{
    counter::{job_row, member_row, JOB_ROW, MEMBER_AGAIN, MEMBER_NEW},
    job::{
        job_generation, job_index, EgressKey, Faults, Hello, MemberAddr, Steer, SwitchConfig,
        MAX_CPUS, MAX_HELLOS, MAX_JOBS,
    },
    slot::{Fold, MAX_SLOTS},
    wire, Counter, Job,
};
use xagg_ebpf::slot;

use crate::fold::Stage;

/// Ports a switch can have: entries of the broadcast devmap.
pub const MAX_PORTS: usize = 64;

/// Jobs by the dense index of their id (`job_index`), written by the control plane; an
/// entry without members is free.
#[btf_map]
pub static JOBS: Array<Job, MAX_JOBS> = Array::new();

/// The job wire id `id` names: its index's entry, if that is of the id's generation.
#[inline(always)]
pub fn job_of(id: u32) -> Option<&'static Job> {
    let job = JOBS.get(job_index(id))?;
    (job.members != 0 && job.generation == job_generation(id)).then_some(job)
}

/// Jobs at an inner level by their wire id at the parent: the local wire id of the job a
/// parent's result belongs to, written by the control plane.
#[btf_map]
pub static PARENTS: HashMap<u32, u32, MAX_JOBS> = HashMap::new();

/// Which member of a job is reached through a port, for the egress program.
#[btf_map]
pub static EGRESS: HashMap<EgressKey, u32, { MAX_JOBS * 8 }> = HashMap::new();

/// Joining members' hellos by token: the port each came in on, its source addresses and
/// when, taken (deleted) by the daemon, which also sweeps the ones nobody claimed. Nothing
/// is evicted: each port has a share (`HELLO_COUNTS`).
#[btf_map]
pub static HELLOS: HashMap<u64, Hello, MAX_HELLOS> = HashMap::new();

/// Hellos recorded per port (by interface index), counted here alone (atomic adds); the
/// port's waiting ones are these less its `HELLO_RELEASED`, against `HELLOS_PER_PORT`.
#[btf_map]
pub static HELLO_COUNTS: HashMap<u32, u32, 256> = HashMap::new();

/// Hellos per port the daemon took (a join) or swept, counted by the daemon alone: each
/// side writes only its own count, so neither loses the other's.
#[btf_map]
pub static HELLO_RELEASED: HashMap<u32, u32, 256> = HashMap::new();

/// Each member's cookie (`wire::Header::cookie`) by job index and member index, as its
/// latest contribution or status query carried it (admitted: from the member's port and
/// addresses): written into the member's copy of every result.
#[btf_map]
pub static COOKIES: Array<[u8; 8], { MAX_JOBS * wire::MAX_MEMBERS }> = Array::new();

/// Where member `member`'s cookie of the job with index `row` is in `COOKIES`.
#[inline(always)]
pub fn cookie_index(row: u32, member: usize) -> u32 {
    row * wire::MAX_MEMBERS as u32 + member as u32
}

/// Member `member`'s latest cookie for the job with index `row` (zeros if none yet).
#[inline(always)]
pub fn cookie_of(row: u32, member: usize) -> [u8; 8] {
    COOKIES
        .get(cookie_index(row, member))
        .copied()
        .unwrap_or_default()
}

/// The aggregation slots of all jobs; each job owns a contiguous range.
#[btf_map]
pub static SLOTS: Array<slot::Slot, { MAX_SLOTS as usize }> = Array::new();

// The kernel's slot and its user-space image (`SlotImage`) must agree on every byte.
const _: () = assert!(core::mem::size_of::<slot::Slot>() == xagg_common::slot::SLOT_SIZE);

/// Switch-wide settings (one entry).
#[btf_map]
pub static SWITCH: Array<SwitchConfig, 1> = Array::new();

/// Every switch port, each with `xagg_result` as its egress program: results are
/// broadcast to all of them, and the egress program drops copies on ports without a
/// member of the job.
#[btf_map]
pub static PORTS: DevMap<MAX_PORTS> = DevMap::new();

/// The contribution in hand-over to its fold program ([`Stage`]).
#[btf_map]
pub static STAGE: PerCpuArray<Stage, 1> = PerCpuArray::new();

/// The fold programs, by `Fold`, and `xagg_deliver` at [`DELIVER`].
#[btf_map]
pub static FOLDS: ProgramArray<{ Fold::COUNT + 1 }> = ProgramArray::new();

/// Where contributions are folded ([`Steer`]; one entry, zero CPUs: where they came in).
#[btf_map]
pub static STEER: Array<Steer, 1> = Array::new();

/// The CPUs contributions are steered to, by CPU number, each entry running
/// `xagg_switch_steered` on its CPU.
#[btf_map]
pub static CPUS: CpuMap<MAX_CPUS> = CpuMap::new();

/// The fold programs of steered contributions (`xagg_cpu_*`, of the cpumap's attach type,
/// which the ports' `FOLDS` cannot hold), by `Fold`.
#[btf_map]
pub static FOLDS_STEERED: ProgramArray<{ Fold::COUNT }> = ProgramArray::new();

/// `xagg_deliver`'s entry in `FOLDS`.
pub const DELIVER: u32 = xagg_common::slot::DELIVER;

/// Fault injection (one entry; zero = off).
#[btf_map]
pub static FAULTS: Array<Faults, 1> = Array::new();

#[btf_map]
pub static COUNTERS: PerCpuArray<u64, { Counter::COUNT }> = PerCpuArray::new();

/// The first sender of each drop reason (by counter) since the daemon last looked: it
/// logs them, rate-limited, and deletes them.
#[btf_map]
pub static DROPS: Array<MemberAddr, { Counter::COUNT }> = Array::new();

/// Counters per job (a row per job index) and per member: what the switch did
/// with the packets of each job it knows.
#[btf_map]
pub static JOB_COUNTERS: PerCpuArray<u64, { MAX_JOBS * JOB_ROW }> = PerCpuArray::new();

/// The map layout these programs were built with (`xagg_common::LAYOUT_VERSION`), written
/// and pinned by the daemon; no program reads it.
#[btf_map]
pub static LAYOUT: Array<u32, 1> = Array::new();

/// Counts `c` for `job`, and a contribution's outcome for `member` ([`FROM_PARENT`] for
/// the parent's results, which have no member row).
#[inline(always)]
pub fn count_job(row: u32, member: usize, c: Counter) {
    if let Some(p) = JOB_COUNTERS.get_ptr_mut(job_row(row, c)) {
        unsafe { *p += 1 };
    }
    if member >= wire::MAX_MEMBERS {
        return;
    }
    let k = match c {
        Counter::Contribution | Counter::Complete => MEMBER_NEW,
        Counter::DropDuplicate | Counter::ResultReplay => MEMBER_AGAIN,
        _ => return,
    };
    if let Some(p) = JOB_COUNTERS.get_ptr_mut(member_row(row, member, k)) {
        unsafe { *p += 1 };
    }
}

/// The "member" a parent's result counts as: none.
pub const FROM_PARENT: usize = wire::MAX_MEMBERS;
/// The same for a ring host's result from its successor (passed back, not on).
pub const FROM_SUCCESSOR: usize = wire::MAX_MEMBERS + 1;

#[inline(always)]
pub fn count(c: Counter) {
    if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
        // Per-CPU entry: no other CPU writes it.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn faults() -> Faults {
    FAULTS.get(0).copied().unwrap_or_default()
}
