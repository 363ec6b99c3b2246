//! The XDP programs of the aggregation switch.
//!
//! - `xagg_switch`, on every switch port: takes contributions addressed to the switch,
//!   checks them against their job and hands each to the fold program of its op and lane.
//!   Everything else passes to the kernel (the bridge) untouched.
//! - `xagg_fold_*`, one per op and lane (`Fold`), reached by a tail call: aggregate the
//!   contribution in its slot and deliver a finished result — a single-buffer one
//!   broadcast through the devmap, a multi-buffer one passed to `xagg_fanout`.
//!   At an inner level (a host, a lower switch) a complete segment is a partial: it goes
//!   to the parent as this point's contribution, and the parent's result, taken only from
//!   the uplink, is stored and delivered to the members like a result of its own.
//! - `xagg_result`, the devmap egress program: addresses each broadcast copy to the
//!   member behind the port it leaves through.
//! - `xagg_fanout`, tc ingress on every switch port: sends a copy of each multi-buffer
//!   result to every member (the devmap broadcast cannot clone one).
//! - `xagg_host`, on a worker's interface: steers results into the worker's AF_XDP
//!   socket when it has one, and lets everything else in (a frame redirected into a veth
//!   is dropped unless the peer end runs an XDP program).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomics on bpfel need core::intrinsics")]

mod packet;
mod reduce;
mod slot;

use aya_ebpf::{
    bindings::{xdp_action, BPF_F_BROADCAST},
    btf_maps::{Array, DevMap, HashMap, PerCpuArray, ProgramArray, XskMap},
    helpers::{
        bpf_get_prandom_u32, bpf_skb_load_bytes, bpf_skb_store_bytes, bpf_xdp_adjust_meta,
        bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};
use xagg_common::{
    counter::{job_row, member_row, JOB_ROW, MEMBER_AGAIN, MEMBER_NEW},
    job::{
        job_generation, job_index, EgressKey, Faults, Hello, Impair, MemberAddr, Role,
        SwitchConfig, EGRESS_SUCCESSOR, HELLOS_PER_PORT, MAX_HELLOS, MAX_JOBS,
    },
    slot::{Fold, ShadowState, MAX_SLOTS, SLOT_WORDS},
    wire::{self, Kind, PAYLOAD_OFFSET},
    Counter, Job,
};

use crate::{
    packet::{Frame, Udp4},
    reduce::{InFrame, Staged},
};

/// Ports a switch can have: entries of the broadcast devmap.
const MAX_PORTS: usize = 64;

/// Jobs by the dense index of their id (`job_index`), written by the control plane; an
/// entry without members is free.
#[btf_map]
static JOBS: Array<Job, MAX_JOBS> = Array::new();

/// The job wire id `id` names: its index's entry, if that is of the id's generation.
#[inline(always)]
fn job_of(id: u32) -> Option<&'static Job> {
    let job = JOBS.get(job_index(id))?;
    (job.members != 0 && job.generation == job_generation(id)).then_some(job)
}

/// Jobs at an inner level by their wire id at the parent: the local wire id of the job a
/// parent's result belongs to, written by the control plane.
#[btf_map]
static PARENTS: HashMap<u32, u32, MAX_JOBS> = HashMap::new();

/// Which member of a job is reached through a port, for the egress program.
#[btf_map]
static EGRESS: HashMap<EgressKey, u32, { MAX_JOBS * 8 }> = HashMap::new();

/// Joining members' hellos by token: the port each came in on, its source addresses and
/// when, taken (deleted) by the daemon, which also sweeps the ones nobody claimed. Nothing
/// is evicted: each port has a share (`HELLO_COUNTS`).
#[btf_map]
static HELLOS: HashMap<u64, Hello, MAX_HELLOS> = HashMap::new();

/// Hellos waiting per port (by interface index), against `HELLOS_PER_PORT`: counted up
/// here, recounted by the daemon's sweep.
#[btf_map]
static HELLO_COUNTS: HashMap<u32, u32, 256> = HashMap::new();

/// Each member's cookie (`wire::Header::cookie`) by job index and member index, as its
/// latest contribution or status query carried it (admitted: from the member's port and
/// addresses): written into the member's copy of every result.
#[btf_map]
static COOKIES: Array<[u8; 8], { MAX_JOBS * wire::MAX_MEMBERS }> = Array::new();

/// Where member `member`'s cookie of the job with index `row` is in `COOKIES`.
#[inline(always)]
fn cookie_index(row: u32, member: usize) -> u32 {
    row * wire::MAX_MEMBERS as u32 + member as u32
}

/// Member `member`'s latest cookie for the job with index `row` (zeros if none yet).
#[inline(always)]
fn cookie_of(row: u32, member: usize) -> [u8; 8] {
    COOKIES
        .get(cookie_index(row, member))
        .copied()
        .unwrap_or_default()
}

/// The aggregation slots of all jobs; each job owns a contiguous range.
#[btf_map]
static SLOTS: Array<slot::Slot, { MAX_SLOTS as usize }> = Array::new();

// The kernel's slot and its user-space image (`SlotImage`) must agree on every byte.
const _: () = assert!(core::mem::size_of::<slot::Slot>() == xagg_common::slot::SLOT_SIZE);

/// Switch-wide settings (one entry).
#[btf_map]
static SWITCH: Array<SwitchConfig, 1> = Array::new();

/// Every switch port, each with `xagg_result` as its egress program: results are
/// broadcast to all of them, and the egress program drops copies on ports without a
/// member of the job.
#[btf_map]
static PORTS: DevMap<MAX_PORTS> = DevMap::new();

/// A contribution handed from `xagg_switch` to its fold program, with (for a multi-buffer
/// frame, or a payload longer than the direct path's loops) its payload copied out:
/// helpers cannot run under the slot's lock, and the payload past the first buffer is
/// reachable only through one. Nothing else runs on the CPU between the two programs
/// (XDP runs with bottom halves off), so one entry per CPU is enough.
#[repr(C)]
pub struct Stage {
    round: slot::Round,
    /// The job's counter row (`Job::index`), the member's index, the slot (`SLOTS` index)
    /// and shadow copy.
    row: u32,
    member: u32,
    slot: u32,
    shadow: u32,
    /// Whether the payload is staged in `data` rather than read in the frame. Decided
    /// here, not derived from the word count in the fold program: there the verifier would
    /// carry the count's range into every loop and run past its budget (measured).
    staged: u32,
    /// Whether the frame is multi-buffer.
    multi: u32,
    data: [u64; SLOT_WORDS],
}

#[btf_map]
static STAGE: PerCpuArray<Stage, 1> = PerCpuArray::new();

/// The fold programs, by `Fold`, and `xagg_deliver` at [`DELIVER`].
#[btf_map]
static FOLDS: ProgramArray<{ Fold::COUNT + 1 }> = ProgramArray::new();

/// `xagg_deliver`'s entry in `FOLDS`.
const DELIVER: u32 = xagg_common::slot::DELIVER;

/// Fault injection (one entry; zero = off).
#[btf_map]
static FAULTS: Array<Faults, 1> = Array::new();

#[btf_map]
static COUNTERS: PerCpuArray<u64, { Counter::COUNT }> = PerCpuArray::new();

/// The first sender of each drop reason (by counter) since the daemon last looked: it
/// logs them, rate-limited, and deletes them.
#[btf_map]
static DROPS: Array<MemberAddr, { Counter::COUNT }> = Array::new();

/// Counters per job (a row per job index) and per member: what the switch did
/// with the packets of each job it knows.
#[btf_map]
static JOB_COUNTERS: PerCpuArray<u64, { MAX_JOBS * JOB_ROW }> = PerCpuArray::new();

/// The map layout these programs were built with (`xagg_common::LAYOUT_VERSION`), written
/// and pinned by the daemon; no program reads it.
#[btf_map]
static LAYOUT: Array<u32, 1> = Array::new();

/// Counts `c` for `job`, and a contribution's outcome for `member` ([`FROM_PARENT`] for
/// the parent's results, which have no member row).
#[inline(always)]
fn count_job(row: u32, member: usize, c: Counter) {
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
const FROM_PARENT: usize = wire::MAX_MEMBERS;
/// The same for a ring host's result from its successor (passed back, not on).
const FROM_SUCCESSOR: usize = wire::MAX_MEMBERS + 1;

#[inline(always)]
fn count(c: Counter) {
    if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
        // Per-CPU entry: no other CPU writes it.
        unsafe { *p += 1 };
    }
}

/// Whether fault injection picks this packet, with probability `threshold` / 2^32.
#[inline(always)]
fn inject(threshold: u32) -> bool {
    threshold != 0 && unsafe { bpf_get_prandom_u32() } < threshold
}

#[inline(always)]
fn faults() -> Faults {
    FAULTS.get(0).copied().unwrap_or_default()
}

/// The frame's length over all its buffers (`data_end - data` covers the first only).
#[inline(always)]
fn frame_len(ctx: &XdpContext) -> usize {
    unsafe { aya_ebpf::helpers::bpf_xdp_get_buff_len(ctx.ctx) as usize }
}

/// Frags-aware, so a switch port (and its peer) may carry frames of any MTU: other
/// traffic passes whatever its size; a multi-buffer datagram to the collective port is
/// dropped as `drop_oversize`.
#[xdp(frags)]
pub fn xagg_switch(ctx: XdpContext) -> u32 {
    settle(&ctx, try_switch(&ctx))
}

/// Counts what came of a packet and returns its action: a dropped one with its first
/// sender kept.
#[inline(always)]
fn settle(ctx: &XdpContext, r: Result<(u32, Counter), Counter>) -> u32 {
    match r {
        Ok((action, c)) => {
            count(c);
            action
        }
        Err(c) => {
            count(c);
            note_drop(ctx, c);
            xdp_action::XDP_DROP
        }
    }
}

/// Keeps the first sender of each drop reason until the daemon has logged it.
#[inline(always)]
fn note_drop(ctx: &XdpContext, c: Counter) {
    if matches!(
        c,
        Counter::InjectDropContribution | Counter::InjectDropResult
    ) {
        return;
    }
    // An entry with an interface is a sender kept already (a packet always came in on
    // one): the common case costs one array lookup. Two CPUs may both write an empty one;
    // either sender is a first one.
    let Some(kept) = DROPS.get_ptr_mut(c as u32) else {
        return;
    };
    if unsafe { (*kept).ifindex } != 0 {
        return;
    }
    unsafe { *kept = packet::source(ctx.data(), ctx.data_end(), ctx.ingress_ifindex() as u32) };
}

#[inline(always)]
fn try_switch(ctx: &XdpContext) -> Result<(u32, Counter), Counter> {
    let Some(cfg) = SWITCH.get(0) else {
        return Ok((xdp_action::XDP_PASS, Counter::Pass));
    };
    if let Some(c) = packet::screen(ctx.data(), ctx.data_end(), cfg) {
        return Err(c);
    }
    let Some(frame) = Frame::collective(ctx.data(), ctx.data_end(), || frame_len(ctx), cfg)? else {
        return Ok((xdp_action::XDP_PASS, Counter::Pass));
    };
    let hdr = frame.header();
    if hdr.version != wire::VERSION {
        return Err(Counter::DropBadVersion);
    }
    if hdr.kind == Kind::Hello as u8 {
        return hello(ctx, &frame);
    }
    if hdr.kind == Kind::Result as u8 {
        return parent_result(ctx, &frame);
    }
    if hdr.kind == Kind::StatusReply as u8 {
        return relay_status(ctx, &frame, cfg);
    }
    let query = hdr.kind == Kind::StatusQuery as u8;
    if hdr.kind != Kind::Contribution as u8 && !query {
        return Err(Counter::DropBadKind);
    }
    if !query && inject(faults().drop_contribution) {
        return Err(Counter::InjectDropContribution);
    }
    let (job, member) = match admit(ctx, &frame) {
        Ok(admitted) => admitted,
        // A query is answered with the reason, so its worker learns why it is refused.
        Err(c) if query => return refuse(&frame, cfg, c),
        Err(c) => return Err(c),
    };
    let r = if query {
        status_query(ctx, &frame, cfg, job, member)
    } else {
        stage(ctx, &frame, job, member)
    };
    let (Ok((_, c)) | Err(c)) = r;
    count_job(job.index as u32, member, c);
    r
}

/// A result entering an inner level: its job's parent's, for a round that sent its
/// partial — only from the uplink and the parent's addresses, so nobody below (or
/// elsewhere) can hand the members a result of their own.
#[inline(always)]
fn parent_result(ctx: &XdpContext, frame: &Frame) -> Result<(u32, Counter), Counter> {
    let hdr = frame.header();
    let local = unsafe { PARENTS.get(hdr.job()) }.ok_or(Counter::DropNotParent)?;
    let job = job_of(*local).ok_or(Counter::DropNotParent)?;
    // A ring host takes results from either neighbour: its predecessor passes them on,
    // its successor answers a re-sent partial with one.
    let neighbour = job.role == Role::Ring as u8
        && job
            .member
            .get(job.predecessor as usize)
            .is_some_and(|p| p.ifindex == ctx.ingress_ifindex() as u32 && frame.from(p));
    let parent = (job.role == Role::Inner as u8 || job.role == Role::Ring as u8)
        && job.parent.ifindex == ctx.ingress_ifindex() as u32
        && frame.from(&job.parent);
    if job.upstream_job() != hdr.job() || !(parent || neighbour) {
        return Err(Counter::DropNotParent);
    }
    let from = if job.role == Role::Ring as u8 && parent && !neighbour {
        FROM_SUCCESSOR
    } else {
        FROM_PARENT
    };
    let r = stage(ctx, frame, job, from);
    let (Ok((_, c)) | Err(c)) = r;
    count_job(job.index as u32, from, c);
    r
}

/// The parent's answer to a status query this level forwarded: handed to the member that
/// asked, as its own job's — only from the parent, on the uplink.
#[inline(always)]
fn relay_status(
    ctx: &XdpContext,
    frame: &Frame,
    cfg: &SwitchConfig,
) -> Result<(u32, Counter), Counter> {
    let hdr = frame.header();
    let local = *unsafe { PARENTS.get(hdr.job()) }.ok_or(Counter::DropNotParent)?;
    let job = job_of(local).ok_or(Counter::DropNotParent)?;
    if job.role != Role::Inner as u8
        || job.parent.ifindex != ctx.ingress_ifindex() as u32
        || !frame.from(&job.parent)
    {
        return Err(Counter::DropNotParent);
    }
    let asker = (hdr.relay as usize).wrapping_sub(1);
    if asker >= wire::MAX_MEMBERS || job.members & (1u64 << asker) == 0 {
        return Err(Counter::DropNotMember);
    }
    let to = job.member.get(asker).ok_or(Counter::DropNotMember)?;
    let cookie = cookie_of(job.index as u32, asker);
    frame.into_relayed_reply(local, asker as u8, cookie, to, cfg);
    match unsafe { aya_ebpf::helpers::bpf_redirect(to.ifindex, 0) } as u32 {
        xdp_action::XDP_REDIRECT => Ok((xdp_action::XDP_REDIRECT, Counter::StatusRelay)),
        _ => Err(Counter::RedirectError),
    }
}

/// The job and member a packet is from, if it is: the header only claims who sent it, so
/// the port it came in on and its source addresses must be the member's.
#[inline(always)]
fn admit(ctx: &XdpContext, frame: &Frame) -> Result<(&'static Job, usize), Counter> {
    let hdr = frame.header();
    let job = job_of(hdr.job()).ok_or(Counter::DropUnknownJob)?;
    let member = hdr.member as usize;
    // A ring host's predecessor is in the member table without a bit in `members`.
    let predecessor = job.role == Role::Ring as u8 && member == job.predecessor as usize;
    if member >= wire::MAX_MEMBERS || (job.members & (1u64 << member) == 0 && !predecessor) {
        return Err(Counter::DropNotMember);
    }
    let addr = &job.member[member];
    if addr.ifindex != ctx.ingress_ifindex() as u32 || !frame.from(addr) {
        return Err(Counter::DropNotMember);
    }
    // The member's cookie, kept for its copies of results; written only when it changes
    // (a new process), so members' CPUs do not contend for the line.
    if let Some(p) = COOKIES.get_ptr_mut(cookie_index(job.index as u32, member)) {
        let cookie = hdr.cookie();
        if unsafe { *p } != cookie {
            unsafe { *p = cookie };
        }
    }
    Ok((job, member))
}

/// Records a joining member's hello: exactly what [`admit`] will check of its packets.
#[inline(always)]
fn hello(ctx: &XdpContext, frame: &Frame) -> Result<(u32, Counter), Counter> {
    if frame.payload_len() != packet::STATUS_LEN {
        return Err(Counter::DropBadLength);
    }
    let token = wire::hello_token(frame.header());
    let port = ctx.ingress_ifindex() as u32;
    if unsafe { HELLOS.get(token) }.is_some() {
        // Recorded already: the first hello of a token wins, so someone who saw it on the
        // wire cannot take the member's place by sending the same token from elsewhere.
        return Ok((xdp_action::XDP_DROP, Counter::Hello));
    }
    let noexist = aya_ebpf::bindings::BPF_NOEXIST as u64;
    if unsafe { HELLO_COUNTS.get(port) }.is_none() {
        let _ = HELLO_COUNTS.insert(port, 0, noexist);
    }
    let waiting = HELLO_COUNTS
        .get_ptr_mut(port)
        .ok_or(Counter::DropHelloQuota)?;
    if unsafe { *waiting } >= HELLOS_PER_PORT {
        return Err(Counter::DropHelloQuota);
    }
    let hello = Hello {
        addr: frame.sender(port),
        seen_ns: unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() },
    };
    if HELLOS.insert(token, hello, noexist).is_ok() {
        // Not atomic: two CPUs may count one; the daemon's sweep recounts.
        unsafe { *waiting += 1 };
    }
    Ok((xdp_action::XDP_DROP, Counter::Hello))
}

/// Answers a status query the switch does not take with the reason, to its sender alone;
/// the reason is counted as the drop it is. A job the switch does not have is refused as
/// "not a member", so a stranger learns no job ids.
#[inline(always)]
fn refuse(frame: &Frame, cfg: &SwitchConfig, c: Counter) -> Result<(u32, Counter), Counter> {
    let code = match c {
        Counter::DropUnknownJob | Counter::DropNotMember => wire::status::REFUSED_NOT_MEMBER,
        Counter::DropSlotRange => wire::status::REFUSED_SLOT_RANGE,
        _ => return Err(c),
    };
    frame.into_refusal(code);
    frame.to_sender(cfg);
    Ok((xdp_action::XDP_TX, c))
}

/// The `SLOTS` index of the job's slot a packet names, in the job's range.
#[inline(always)]
fn slot_index(job: &Job, hdr: &xagg_common::Header) -> Result<u32, Counter> {
    let index = hdr.slot() as u32;
    if index >= job.slot_count {
        return Err(Counter::DropSlotRange);
    }
    Ok(job.slot_base + index)
}

/// The job's slot a packet names.
#[inline(always)]
fn slot_of(job: &Job, hdr: &xagg_common::Header) -> Result<*mut slot::Slot, Counter> {
    SLOTS
        .get_ptr_mut(slot_index(job, hdr)?)
        .ok_or(Counter::DropSlotRange)
}

/// A member asks for a shadow copy's state: the reply goes back to it alone.
#[inline(always)]
fn status_query(
    ctx: &XdpContext,
    frame: &Frame,
    cfg: &SwitchConfig,
    job: &Job,
    member: usize,
) -> Result<(u32, Counter), Counter> {
    let slot = match slot_of(job, frame.header()) {
        Ok(slot) => slot,
        Err(c) => return refuse(frame, cfg, c),
    };
    if frame.payload_len() != packet::STATUS_LEN {
        return Err(Counter::DropBadLength);
    }
    let st = unsafe { slot::status(slot, frame.header().shadow()) };
    let hdr = frame.header();
    // Waiting on the parent: the member may ask what the level above waits for (once: a
    // query forwarded already is answered where it arrives).
    if job.role == Role::Inner as u8
        && st.state == ShadowState::PartialSent as u32
        && hdr.flags & wire::FLAG_FORWARD != 0
        && hdr.relay == 0
    {
        frame.into_forwarded_query(job, member as u8, cfg);
        return Ok((up(ctx, job)?, Counter::StatusForward));
    }
    if !frame.into_status_reply(ctx, &st, job.members) {
        return Err(Counter::DropTruncated);
    }
    frame.to_sender(cfg);
    Ok((xdp_action::XDP_TX, Counter::StatusReply))
}

/// A contribution from `member`, or the parent's result (`member` is [`FROM_PARENT`]):
/// checked against the job, staged and handed to the fold program of its op and lane (a
/// tail call: no return on success).
#[inline(always)]
fn stage(
    ctx: &XdpContext,
    frame: &Frame,
    job: &Job,
    member: usize,
) -> Result<(u32, Counter), Counter> {
    let hdr = frame.header();
    // Each message carries its op and type; the round's first contribution fixes them.
    let (op, lane) = match (wire::Op::from_u8(hdr.op), wire::DType::from_u8(hdr.dtype)) {
        (Some(op), Some(dtype)) => (op, wire::lane(op, dtype).ok_or(Counter::DropBadOp)?),
        _ => return Err(Counter::DropBadOp),
    };
    let elems = hdr.count() as usize;
    if elems == 0 || elems * lane.size() > job.segment_bytes as usize {
        return Err(Counter::DropBadCount);
    }
    let words = wire::payload_len(elems, lane.size()) / 8;
    if frame.payload_len() != words * 8 {
        return Err(Counter::DropBadLength);
    }
    let fold = Fold::of(op, lane).ok_or(Counter::DropBadOp)?;
    let index = slot_index(job, hdr)?;
    // Who the round waits for, and whether its sum is a partial for the next hop.
    let (members, inner) = if job.role == Role::Ring as u8 {
        let (start, end) = job.ring_chain(hdr.segment());
        let first = job.ring_position == start;
        if first && member == job.predecessor as usize {
            // The chain starts here: nothing comes from the predecessor.
            return Err(Counter::DropNotMember);
        }
        let from_predecessor = if first {
            0
        } else {
            1u64 << (job.predecessor & 63)
        };
        (job.members | from_predecessor, job.ring_position != end)
    } else {
        (job.members, job.role == Role::Inner as u8)
    };
    let stage = STAGE.get_ptr_mut(0).ok_or(Counter::RedirectError)?;
    let st = unsafe { &mut *stage };
    st.round = slot::Round {
        message: hdr.message(),
        segment: hdr.segment(),
        bit: if member < wire::MAX_MEMBERS {
            1u64 << member
        } else {
            0
        },
        members,
        elems: elems as u32,
        words,
        exponent: hdr.exponent() as i32,
        flags: hdr.enc_flags() as u32,
        op: hdr.op,
        dtype: hdr.dtype,
        inner: inner as u8,
        _pad: [0; 5],
    };
    st.row = job.index as u32;
    st.member = member as u32;
    st.slot = index;
    st.shadow = hdr.shadow() as u32;
    st.multi = frame.multi() as u32;
    st.staged = (frame.multi() || words > reduce::BUFFER_WORDS) as u32;
    let program = if member >= wire::MAX_MEMBERS {
        DELIVER
    } else {
        fold as u32
    };
    unsafe { FOLDS.tail_call(ctx, program) };
    // Only if the fold program is missing: a dataplane loaded without it.
    Err(Counter::RedirectError)
}

/// Runs fold `F` for the contribution `xagg_switch` staged: counts what came of it like
/// `xagg_switch` does.
#[inline(always)]
fn run_fold<const F: u32>(ctx: &XdpContext) -> u32 {
    let Some(stage) = STAGE.get_ptr_mut(0) else {
        return xdp_action::XDP_DROP;
    };
    let st = unsafe { &mut *stage };
    let (row, member) = (st.row, st.member as usize);
    let r = fold_staged::<F>(ctx, st);
    let (Ok((_, c)) | Err(c)) = r;
    count_job(row, member, c);
    settle(ctx, r)
}

/// A member's contribution, checked by `xagg_switch`, handed to the slot's state machine
/// with fold `F`; a completing one becomes the result and is delivered to every member.
#[inline(always)]
fn fold_staged<const F: u32>(ctx: &XdpContext, st: &mut Stage) -> Result<(u32, Counter), Counter> {
    let slot = SLOTS.get_ptr_mut(st.slot).ok_or(Counter::DropSlotRange)?;
    let r = st.round;
    let shadow = st.shadow as usize;
    let (multi, staged) = (st.multi != 0, st.staged != 0);
    let bytes = r.words * 8;
    let (outcome, stored) = if staged {
        if bytes == 0 || bytes > SLOT_WORDS * 8 {
            return Err(Counter::DropBadLength);
        }
        // Copied out before the lock: no helper may run under it.
        let data = st.data.as_mut_ptr() as *mut core::ffi::c_void;
        if unsafe { bpf_xdp_load_bytes(ctx.ctx, PAYLOAD_OFFSET as u32, data, bytes as u32) } < 0 {
            return Err(Counter::DropTruncated);
        }
        let src = Staged(&raw mut st.data);
        if F == DELIVER {
            unsafe { slot::deliver(slot, shadow, &r, &src) }
        } else {
            unsafe { slot::accept::<F, _>(slot, shadow, &r, &src) }
        }
    } else {
        // Packet pointers derived here, so the verifier sees every payload access checked
        // against data_end inside the loops.
        let src = InFrame {
            payload: ctx.data() + PAYLOAD_OFFSET,
            end: ctx.data_end(),
        };
        if F == DELIVER {
            unsafe { slot::deliver(slot, shadow, &r, &src) }
        } else {
            unsafe { slot::accept::<F, _>(slot, shadow, &r, &src) }
        }
    };
    // A result in the staging buffer goes back into the frame, after the lock.
    let data = st.data.as_mut_ptr() as *mut core::ffi::c_void;
    let store = || {
        // Checked again next to the call: the verifier needs the bound here.
        if bytes == 0 || bytes > SLOT_WORDS * 8 {
            return Err(Counter::DropBadLength);
        }
        match unsafe { bpf_xdp_store_bytes(ctx.ctx, PAYLOAD_OFFSET as u32, data, bytes as u32) } {
            0 => Ok(()),
            _ => Err(Counter::DropTruncated),
        }
    };
    // The frame and the switch's addresses, needed only to send a result.
    let result = || -> Result<(Frame, &SwitchConfig), Counter> {
        let frame =
            Frame::again(ctx.data(), ctx.data_end(), multi).ok_or(Counter::DropTruncated)?;
        Ok((frame, SWITCH.get(0).ok_or(Counter::RedirectError)?))
    };
    match outcome {
        slot::Outcome::Added => Ok((xdp_action::XDP_DROP, Counter::Contribution)),
        slot::Outcome::Complete if multi => {
            store()?;
            let (frame, cfg) = result()?;
            frame.into_result(&stored);
            frame.from_switch(cfg);
            let id = frame.header().job();
            // The devmap broadcast cannot clone a multi-buffer frame: the kernel hands it
            // to `xagg_fanout` on this port's tc ingress, which copies it to each member.
            mark_own_result(ctx, id)?;
            Ok((xdp_action::XDP_PASS, Counter::Complete))
        }
        slot::Outcome::Complete => {
            if staged {
                store()?;
            }
            let (frame, cfg) = result()?;
            // Each copy is addressed to its member by `xagg_result` on the way out.
            frame.into_result(&stored);
            frame.from_switch(cfg);
            match PORTS.redirect(0, BPF_F_BROADCAST as u64) {
                Ok(action) => Ok((action, Counter::Complete)),
                Err(_) => Err(Counter::RedirectError),
            }
        }
        slot::Outcome::Partial | slot::Outcome::PartialAgain => {
            if staged {
                store()?;
            }
            let (frame, cfg) = result()?;
            let job = JOBS.get(st.row).ok_or(Counter::RedirectError)?;
            frame.into_partial(job, &stored, cfg);
            let counter = match outcome {
                slot::Outcome::Partial => Counter::Partial,
                _ => Counter::PartialResend,
            };
            Ok((up(ctx, job)?, counter))
        }
        slot::Outcome::Delivered => {
            let (frame, cfg) = result()?;
            let job = JOBS.get(st.row).ok_or(Counter::RedirectError)?;
            frame.into_result(&stored);
            // The parent (or a ring neighbour) named the job by its own id: members and
            // the egress program know it by this level's.
            frame.set_job(job.wire_id());
            frame.from_switch(cfg);
            // From a ring host's successor: the copy on the uplink goes back, not on.
            frame.set_backward(st.member as usize == FROM_SUCCESSOR);
            if multi {
                // To `xagg_fanout` on the uplink's tc ingress, as a result of our own.
                mark_own_result(ctx, job.wire_id())?;
                return Ok((xdp_action::XDP_PASS, Counter::ParentResult));
            }
            match PORTS.redirect(0, BPF_F_BROADCAST as u64) {
                Ok(action) => Ok((action, Counter::ParentResult)),
                Err(_) => Err(Counter::RedirectError),
            }
        }
        slot::Outcome::Unawaited => Err(Counter::DropUnawaitedResult),
        slot::Outcome::Replay => {
            if inject(faults().drop_result) {
                return Err(Counter::InjectDropResult);
            }
            if staged {
                store()?;
            }
            let (frame, cfg) = result()?;
            frame.into_result(&stored);
            // A ring predecessor's resent partial: answered in its own job id.
            let job = JOBS.get(st.row).ok_or(Counter::RedirectError)?;
            if job.role == Role::Ring as u8 && st.member == u32::from(job.predecessor) {
                frame.set_job(job.predecessor_job);
            }
            frame.to_sender(cfg);
            Ok((xdp_action::XDP_TX, Counter::ResultReplay))
        }
        slot::Outcome::Reclaimed => Ok((xdp_action::XDP_DROP, Counter::SlotReclaimed)),
        slot::Outcome::Duplicate => Err(Counter::DropDuplicate),
        slot::Outcome::Stale => Err(Counter::DropStale),
        slot::Outcome::Mismatch => Err(Counter::DropBadCount),
        slot::Outcome::OpMismatch => Err(Counter::DropBadOp),
    }
}

/// What `xagg_fanout` finds in front of a result of the switch's own: [`OWN_RESULT`] and
/// the job's wire id. A frame from the wire carries no metadata, so nothing else that
/// reaches tc ingress (a frame the bridge merely passes on) can look like one.
#[repr(C)]
#[derive(Clone, Copy)]
struct OwnResult {
    mark: u32,
    job: u32,
}

const OWN_RESULT: u32 = 0x7861_7272;

/// Marks the frame, in its metadata, as the switch's own multi-buffer result of job `job`
/// for `xagg_fanout`. Last thing before the frame is passed on: the helper invalidates every
/// packet pointer.
#[inline(always)]
fn mark_own_result(ctx: &XdpContext, job: u32) -> Result<(), Counter> {
    const LEN: usize = core::mem::size_of::<OwnResult>();
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -(LEN as i32)) } != 0 {
        // A driver without XDP metadata: the members recover the result as a replay.
        return Err(Counter::RedirectError);
    }
    let meta = ctx.metadata();
    if meta + LEN > ctx.data() {
        return Err(Counter::RedirectError);
    }
    unsafe {
        *(meta as *mut OwnResult) = OwnResult {
            mark: OWN_RESULT,
            job,
        }
    };
    Ok(())
}

/// Sends the frame (a partial, addressed) out of the job's uplink: back out of the port it
/// came in on, or redirected to the uplink.
#[inline(always)]
fn up(ctx: &XdpContext, job: &Job) -> Result<u32, Counter> {
    let uplink = job.parent.ifindex;
    if uplink == ctx.ingress_ifindex() as u32 {
        return Ok(xdp_action::XDP_TX);
    }
    match unsafe { aya_ebpf::helpers::bpf_redirect(uplink, 0) } as u32 {
        xdp_action::XDP_REDIRECT => Ok(xdp_action::XDP_REDIRECT),
        _ => Err(Counter::RedirectError),
    }
}

/// The fold programs, one per `Fold`, each named as `Fold::program` says.
macro_rules! fold_programs {
    ($($name:ident = $fold:ident),* $(,)?) => {$(
        #[xdp(frags)]
        pub fn $name(ctx: XdpContext) -> u32 {
            run_fold::<{ Fold::$fold as u32 }>(&ctx)
        }
    )*};
}

fold_programs!(
    xagg_fold_sum32 = Sum32,
    xagg_fold_sum64 = Sum64,
    xagg_fold_sum_bfp = SumBfp,
    xagg_fold_sum_bfp64 = SumBfp64,
    xagg_fold_min_i32 = MinI32,
    xagg_fold_min_u32 = MinU32,
    xagg_fold_min_i64 = MinI64,
    xagg_fold_max_i32 = MaxI32,
    xagg_fold_max_u32 = MaxU32,
    xagg_fold_max_i64 = MaxI64,
    xagg_fold_prod32 = Prod32,
    xagg_fold_prod64 = Prod64,
    xagg_fold_and = And,
    xagg_fold_or = Or,
    xagg_fold_xor = Xor,
);

/// At an inner level: stores the parent's result (checked and staged by `xagg_switch`)
/// over the partial it answers and delivers it to the members.
#[xdp(frags)]
pub fn xagg_deliver(ctx: XdpContext) -> u32 {
    run_fold::<DELIVER>(&ctx)
}

/// Devmap egress program: one run per broadcast copy, after it has been cloned for its
/// port. Addresses the copy to the job's member behind that port.
// Frags-aware like `xagg_switch`: the kernel refuses a devmap program whose flag differs
// from its owner's.
#[xdp(frags, map = "devmap")]
pub fn xagg_result(ctx: XdpContext) -> u32 {
    match try_result(&ctx) {
        Ok(action) => action,
        Err(c) => {
            count(c);
            xdp_action::XDP_DROP
        }
    }
}

#[inline(always)]
fn try_result(ctx: &XdpContext) -> Result<u32, Counter> {
    let Some(cfg) = SWITCH.get(0) else {
        return Ok(xdp_action::XDP_PASS);
    };
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()).filter(Udp4::plain) else {
        return Ok(xdp_action::XDP_PASS);
    };
    let Some(hdr) = frame.header() else {
        return Ok(xdp_action::XDP_PASS);
    };
    if hdr.kind != Kind::Result as u8 {
        return Ok(xdp_action::XDP_PASS);
    }
    let jid = hdr.job();
    if inject(faults().drop_result) {
        return Err(Counter::InjectDropResult);
    }
    let egress = unsafe { (*ctx.ctx).egress_ifindex };
    let key = EgressKey {
        job: jid,
        ifindex: egress,
    };
    let member = *unsafe { EGRESS.get(key) }.ok_or(Counter::EgressNoMember)?;
    let job = job_of(jid).ok_or(Counter::EgressNoMember)?;
    let addr = if member == EGRESS_SUCCESSOR {
        // A ring host's uplink: the result goes on round the ring (back, if it came from
        // the successor), or no further. Its neighbour checks addresses, not cookies.
        let (addr, id) = ring_next(job, hdr).ok_or(Counter::EgressNoMember)?;
        frame.set_job(id);
        frame.set_cookie([0; 8]);
        addr
    } else {
        let addr = job
            .member
            .get(member as usize)
            .ok_or(Counter::EgressNoMember)?;
        frame.set_cookie(cookie_of(job.index as u32, member as usize));
        addr
    };
    packet::address_to(frame.data(), addr, cfg);
    count(Counter::ResultCopy);
    Ok(xdp_action::XDP_PASS)
}

/// Where a ring host's result goes next on the uplink, if anywhere, and the job's id
/// there: on to the successor, or (one that came from the successor) back to the
/// predecessor.
#[inline(always)]
fn ring_next<'a>(job: &'a Job, hdr: &xagg_common::Header) -> Option<(&'a MemberAddr, u32)> {
    if job.role != Role::Ring as u8 {
        return None;
    }
    if hdr.flags & wire::FLAG_BACKWARD != 0 {
        if !job.ring_passes_back(hdr.segment()) {
            return None;
        }
        return Some((
            job.member.get(job.predecessor as usize)?,
            job.predecessor_job,
        ));
    }
    job.ring_forwards(hdr.segment())
        .then_some((&job.parent, job.parent_job))
}

/// tc ingress on every switch port: a multi-buffer result `xagg_switch` passed to the kernel,
/// marked as its own in the frame's metadata (`mark_own_result`), is copied to every member
/// of its job, each copy addressed to its member, with its cookie, and sent out of the
/// member's port; the original goes no further. A result claiming the switch's address
/// without the mark is forged (it got past `xagg_switch` some way it does not read) and is
/// dropped. Everything else passes.
#[classifier]
pub fn xagg_fanout(ctx: TcContext) -> i32 {
    match try_fanout(&ctx) {
        Ok(action) => action,
        Err(c) => {
            count(c);
            TC_ACT_SHOT
        }
    }
}

const TC_ACT_OK: i32 = 0;
const TC_ACT_SHOT: i32 = 2;

/// The job `xagg_switch` marked the frame in `ctx` as its own result of, if it did.
#[inline(always)]
fn own_result(ctx: &TcContext) -> Option<u32> {
    const LEN: usize = core::mem::size_of::<OwnResult>();
    let skb = ctx.skb.skb;
    let (meta, data) = unsafe { ((*skb).data_meta as usize, (*skb).data as usize) };
    if meta + LEN > data {
        return None;
    }
    let own = unsafe { *(meta as *const OwnResult) };
    (own.mark == OWN_RESULT).then_some(own.job)
}

#[inline(always)]
fn try_fanout(ctx: &TcContext) -> Result<i32, Counter> {
    let Some(cfg) = SWITCH.get(0) else {
        return Ok(TC_ACT_OK);
    };
    let own = own_result(ctx);
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()).filter(Udp4::plain) else {
        return Ok(TC_ACT_OK);
    };
    if frame.ip().src_addr != cfg.ip || frame.udp().src != cfg.port {
        return Ok(TC_ACT_OK);
    }
    let Some(hdr) = frame.header() else {
        return Ok(TC_ACT_OK);
    };
    if hdr.kind != Kind::Result as u8 {
        return Ok(TC_ACT_OK);
    }
    if own != Some(hdr.job()) {
        return Err(Counter::DropSpoofedSource);
    }
    let job = job_of(hdr.job()).ok_or(Counter::EgressNoMember)?;
    // Read now: storing into the packet invalidates pointers into it.
    let next = ring_next(job, hdr).map(|(a, id)| (*a, id));
    // The headers up to the payload, readdressed here for each member and written over the
    // frame's own before its copy leaves: a copy shares the data, so each write unshares
    // the headers. Words, so zeroing it takes a few stores rather than a byte loop.
    let mut heads = [0u64; PAYLOAD_OFFSET / 8];
    let at = heads.as_mut_ptr() as usize;
    let len = PAYLOAD_OFFSET as u32;
    if unsafe { bpf_skb_load_bytes(ctx.skb.skb as *const _, 0, at as *mut _, len) } != 0 {
        return Err(Counter::DropTruncated);
    }
    let header = at + packet::HEADERS_LEN;
    let drop_result = faults().drop_result;
    let mut m = 0;
    while m < wire::MAX_MEMBERS {
        if job.members & (1u64 << m) != 0 {
            if inject(drop_result) {
                count(Counter::InjectDropResult);
            } else if let Some(addr) = job.member.get(m) {
                packet::address_to(at, addr, cfg);
                unsafe { &mut *(header as *mut xagg_common::Header) }
                    .set_cookie(cookie_of(job.index as u32, m));
                let stored =
                    unsafe { bpf_skb_store_bytes(ctx.skb.skb, 0, at as *const _, len, 0) } == 0;
                if stored && ctx.clone_redirect(addr.ifindex, 0).is_ok() {
                    count(Counter::ResultCopy);
                } else {
                    count(Counter::RedirectError);
                }
            }
        }
        m += 1;
    }
    // A ring host passes the result on to its successor, in the neighbour's id of the job;
    // the neighbour checks addresses, not cookies.
    if let Some((next, id)) = next {
        if inject(drop_result) {
            count(Counter::InjectDropResult);
            return Ok(TC_ACT_SHOT);
        }
        packet::address_to(at, &next, cfg);
        let h = unsafe { &mut *(header as *mut xagg_common::Header) };
        h.set_job(id);
        h.set_cookie([0; 8]);
        let stored = unsafe { bpf_skb_store_bytes(ctx.skb.skb, 0, at as *const _, len, 0) } == 0;
        if stored && ctx.clone_redirect(next.ifindex, 0).is_ok() {
            count(Counter::ResultCopy);
        } else {
            count(Counter::RedirectError);
        }
    }
    Ok(TC_ACT_SHOT)
}

/// A measuring stick for the bench, never attached: the accumulate path's add alone — the
/// same word-wide, unrolled sum of the frame's payload into the same map value (the last
/// slot's first copy) — without parsing, job lookup, lock or counters; for a frame of kind Result,
/// the complete path's add, which also writes the sum into the frame. The switch's
/// per-packet cost is judged against it.
#[xdp]
pub fn xagg_floor(ctx: XdpContext) -> u32 {
    let payload = ctx.data() + wire::PAYLOAD_OFFSET;
    let end = ctx.data_end();
    let (Some(slot), true) = (SLOTS.get_ptr_mut(MAX_SLOTS - 1), payload <= end) else {
        return xdp_action::XDP_ABORTED;
    };
    // The word count from the header and checked against the frame, as the switch does.
    let hdr = unsafe { &*((payload - wire::HEADER_LEN) as *const xagg_common::Header) };
    let words = wire::payload_len(hdr.count() as usize, 4) / 8;
    if payload + words * 8 != end {
        return xdp_action::XDP_ABORTED;
    }
    let write = hdr.kind == Kind::Result as u8;
    reduce::sum_32(
        unsafe { &mut (*slot).shadow[0] },
        &InFrame { payload, end },
        words,
        write,
    );
    xdp_action::XDP_DROP
}

/// AF_XDP sockets of the workers on this interface, by receive queue.
#[btf_map]
static XSKS: XskMap<64> = XskMap::new();

/// UDP ports (network order) whose datagrams go to the receive queue's AF_XDP socket:
/// the ports of workers that receive results with AF_XDP.
#[btf_map]
static XSK_PORTS: HashMap<[u8; 2], u32, 64> = HashMap::new();

/// On a worker's interface: datagrams to a port in `XSK_PORTS` go straight to the
/// worker's AF_XDP socket (no socket buffer, no UDP stack); everything else, and
/// everything while no socket is registered, passes to the kernel.
///
/// Frags-aware, so the interface may carry frames of any MTU; the worker's socket takes
/// multi-buffer frames too (bound with `XDP_USE_SG`: one descriptor per buffer).
#[xdp(frags)]
pub fn xagg_host(ctx: XdpContext) -> u32 {
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()) else {
        return xdp_action::XDP_PASS;
    };
    if !frame.plain()
        || frame.fragment_offset() != 0
        || frame.more_fragments()
        || unsafe { XSK_PORTS.get(frame.udp().dst) }.is_none()
    {
        return xdp_action::XDP_PASS;
    }
    let queue = unsafe { (*ctx.ctx).rx_queue_index };
    XSKS.redirect(queue, xdp_action::XDP_PASS as u64)
        .unwrap_or_else(|fallback| fallback)
}

/// Impairment settings of `xagg_impair` (one entry).
#[btf_map]
static IMPAIR: Array<Impair, 1> = Array::new();

/// `xagg_impair`'s counters: 0 dropped, 1 duplicated.
#[btf_map]
static IMPAIR_COUNTERS: PerCpuArray<u64, 2> = PerCpuArray::new();

/// Marks the copies `xagg_impair` makes, so they pass it untouched the second time.
const IMPAIR_MARK: u32 = 0x7861_6767;

/// tc egress program on a worker's interface, for tests and demos: drops and duplicates a
/// fraction of the contributions the worker sends (these kernels have no netem).
#[classifier]
pub fn xagg_impair(ctx: TcContext) -> i32 {
    let Some(cfg) = IMPAIR.get(0) else {
        return TC_ACT_OK;
    };
    let skb = ctx.skb.skb;
    let mark = unsafe { (*skb).mark };
    if mark == IMPAIR_MARK {
        return TC_ACT_OK;
    }
    // IPv4 without options, UDP, to the collective port.
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()) else {
        return TC_ACT_OK;
    };
    if !frame.plain() || frame.udp().dst != cfg.port {
        return TC_ACT_OK;
    }
    if inject(cfg.drop) {
        impair_count(0);
        return TC_ACT_SHOT;
    }
    if inject(cfg.duplicate) {
        ctx.set_mark(IMPAIR_MARK);
        let ifindex = unsafe { (*skb).ifindex };
        if ctx.clone_redirect(ifindex, 0).is_ok() {
            impair_count(1);
        }
        ctx.set_mark(mark);
    }
    TC_ACT_OK
}

#[inline(always)]
fn impair_count(i: u32) {
    if let Some(p) = IMPAIR_COUNTERS.get_ptr_mut(i) {
        unsafe { *p += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
