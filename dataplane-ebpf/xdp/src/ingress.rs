//! Ingress, `xagg_switch` on every switch port: takes the collective protocol's frames
//! addressed to the switch, admits a contribution or status query only from its job's
//! member (its port and addresses), records joining members' hellos, answers status
//! queries, and stages each contribution for its fold program. Everything else passes to
//! the kernel (the bridge) untouched. With `switch.steer_cpus` set, a contribution is not
//! staged where it came in but handed through the `CPUS` cpumap to its slot's CPU, where
//! `xagg_switch_steered` takes it through the same checks again and stages it there.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use xagg_common::{
    job::{Hello, Role, SwitchConfig, HELLOS_PER_PORT, MAX_STEER},
    slot::ShadowState,
    wire::{self, Kind},
    Counter, Job,
};
use xagg_ebpf::{
    inject,
    packet::{self, Frame},
    slot,
};

use crate::{
    fold::stage,
    maps::{
        cookie_index, count, count_job, faults, job_of, COOKIES, CPUS, DROPS, HELLOS, HELLO_COUNTS,
        HELLO_RELEASED, SLOTS, STEER, SWITCH,
    },
    upward::{parent_result, relay_status, up},
};

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
    settle::<false>(&ctx, try_switch::<false>(&ctx))
}

/// A contribution steered to its slot's CPU, run there by the `CPUS` cpumap: checked as on
/// a port (nothing is taken on trust from the CPU that steered it) and folded.
#[xdp(frags, map = "cpumap")]
pub fn xagg_switch_steered(ctx: XdpContext) -> u32 {
    settle::<true>(&ctx, try_switch::<true>(&ctx))
}

/// Counts what came of a packet and returns its action: a dropped one with its first
/// sender kept. A cpumap program (`STEERED`) cannot send a frame back out of its port
/// (`XDP_TX`): it redirects it there instead.
#[inline(always)]
pub fn settle<const STEERED: bool>(ctx: &XdpContext, r: Result<(u32, Counter), Counter>) -> u32 {
    let r = match r {
        Ok((xdp_action::XDP_TX, c)) if STEERED => {
            match unsafe { aya_ebpf::helpers::bpf_redirect(ctx.ingress_ifindex() as u32, 0) } as u32
            {
                xdp_action::XDP_REDIRECT => Ok((xdp_action::XDP_REDIRECT, c)),
                _ => Err(Counter::RedirectError),
            }
        }
        r => r,
    };
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
fn try_switch<const STEERED: bool>(ctx: &XdpContext) -> Result<(u32, Counter), Counter> {
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
    // Only contributions are steered; leaving every other kind out of the cpumap's program
    // also keeps it from naming the ports' `FOLDS` (a program array takes programs of one
    // attach type, the first to use it).
    if STEERED && hdr.kind != Kind::Contribution as u8 {
        return Err(Counter::DropBadKind);
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
    if !STEERED && !query && inject(faults().drop_contribution) {
        return Err(Counter::InjectDropContribution);
    }
    let (job, member) = match admit(ctx, &frame) {
        Ok(admitted) => admitted,
        // A query is answered with the reason, so its worker learns why it is refused.
        Err(c) if query => return refuse(ctx, &frame, cfg, c),
        Err(c) => return Err(c),
    };
    let r = if query {
        status_query(ctx, &frame, cfg, job, member)
    } else if STEERED {
        stage::<true>(ctx, &frame, job, member)
    } else {
        match steer(job, hdr) {
            Ok(Some(action)) => Ok((action, Counter::Steered)),
            Ok(None) => stage::<false>(ctx, &frame, job, member),
            Err(c) => Err(c),
        }
    };
    let (Ok((_, c)) | Err(c)) = r;
    count_job(job.index as u32, member, c);
    r
}

/// Hands an admitted contribution to its slot's CPU, if the switch steers
/// ([`xagg_common::job::Steer`]): the action that does, or `None` to fold it here.
#[inline(always)]
fn steer(job: &Job, hdr: &xagg_common::Header) -> Result<Option<u32>, Counter> {
    let Some(s) = STEER.get(0) else {
        return Ok(None);
    };
    if s.count == 0 {
        return Ok(None);
    }
    let index = slot_index(job, hdr)?;
    let cpu = s.cpu[(index % s.count) as usize % MAX_STEER];
    match CPUS.redirect(cpu, 0) {
        Ok(action) => Ok(Some(action)),
        Err(_) => Err(Counter::RedirectError),
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
    let recorded = HELLO_COUNTS
        .get_ptr_mut(port)
        .ok_or(Counter::DropHelloQuota)?;
    let released = unsafe { HELLO_RELEASED.get(port) }.map_or(0, |r| *r);
    let waiting = || unsafe { core::ptr::read_volatile(recorded) }.wrapping_sub(released);
    if waiting() >= HELLOS_PER_PORT {
        return Err(Counter::DropHelloQuota);
    }
    let hello = Hello {
        addr: frame.sender(port),
        seen_ns: unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() },
    };
    if HELLOS.insert(token, hello, noexist).is_ok() {
        // Counted once recorded, by an atomic add (whose value the BPF target cannot
        // return), then checked again: of CPUs recording one port's hellos at once, those
        // past its share take theirs back, so it never holds more.
        use core::intrinsics::{atomic_xadd, AtomicOrdering::SeqCst};
        unsafe { atomic_xadd::<u32, u32, { SeqCst }>(recorded, 1) };
        if waiting() > HELLOS_PER_PORT {
            let _ = HELLOS.remove(token);
            // An add of -1: there is no atomic subtract either.
            unsafe { atomic_xadd::<u32, u32, { SeqCst }>(recorded, u32::MAX) };
            return Err(Counter::DropHelloQuota);
        }
    }
    Ok((xdp_action::XDP_DROP, Counter::Hello))
}

/// Answers a status query the switch does not take with the reason, to its sender alone;
/// the reason is counted as the drop it is. A job the switch does not have is refused as
/// "not a member", so a stranger learns no job ids.
#[inline(always)]
fn refuse(
    ctx: &XdpContext,
    frame: &Frame,
    cfg: &SwitchConfig,
    c: Counter,
) -> Result<(u32, Counter), Counter> {
    let code = match c {
        Counter::DropUnknownJob | Counter::DropNotMember => wire::status::REFUSED_NOT_MEMBER,
        Counter::DropSlotRange => wire::status::REFUSED_SLOT_RANGE,
        _ => return Err(c),
    };
    // Answered, yet a drop: its sender kept for the daemon's log as a dropped one's is
    // (before the answer takes the sender's addresses).
    note_drop(ctx, c);
    frame.into_refusal(code);
    frame.to_sender(cfg);
    Ok((xdp_action::XDP_TX, c))
}

/// The `SLOTS` index of the job's slot a packet names, in the job's range.
#[inline(always)]
pub fn slot_index(job: &Job, hdr: &xagg_common::Header) -> Result<u32, Counter> {
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
        Err(c) => return refuse(ctx, frame, cfg, c),
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
    if !frame.into_status_reply(ctx, &st, job) {
        return Err(Counter::DropTruncated);
    }
    frame.to_sender(cfg);
    Ok((xdp_action::XDP_TX, Counter::StatusReply))
}
