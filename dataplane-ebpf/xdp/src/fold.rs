//! The fold dispatch: `xagg_switch` (and an inner level's parent's result) stages a
//! contribution and tail-calls the fold program of its op and lane (`xagg_fold_*`, or
//! `xagg_deliver` for the parent's result), which runs it through the slot's state machine
//! and sends what comes of it: a result to every member, a partial up, a replay back.

use aya_ebpf::{
    bindings::{xdp_action, BPF_F_BROADCAST},
    helpers::{bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    macros::xdp,
    programs::XdpContext,
};
use xagg_common::{
    job::{Role, SwitchConfig},
    slot::{Fold, COPY_HAS_DATA, SLOT_WORDS},
    wire::{self, PAYLOAD_OFFSET},
    Counter, Job,
};
use xagg_ebpf::{
    inject,
    packet::Frame,
    reduce::{self, InFrame, Staged},
    slot,
};

use crate::{
    fanout::mark_own_result,
    ingress::{settle, slot_index},
    maps::{
        count_job, faults, DELIVER, FOLDS, FOLDS_STEERED, FROM_SUCCESSOR, JOBS, PORTS, SLOTS,
        STAGE, SWITCH,
    },
    upward::up,
};

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

/// A contribution from `member`, or the parent's result (`member` is [`FROM_PARENT`]):
/// checked against the job, staged and handed to the fold program of its op and lane (a
/// tail call: no return on success). A steered contribution (`STEERED`, in the cpumap's
/// program) goes to the fold programs of the cpumap's attach type.
#[inline(always)]
pub fn stage<const STEERED: bool>(
    ctx: &XdpContext,
    frame: &Frame,
    job: &Job,
    member: usize,
) -> Result<(u32, Counter), Counter> {
    let hdr = frame.header();
    // Each message carries its op and type; the round's first contribution fixes them.
    let float = wire::Float::of_flags(hdr.flags);
    let (op, lane) = match (wire::Op::from_u8(hdr.op), wire::DType::from_u8(hdr.dtype)) {
        (Some(op), Some(dtype)) => (
            op,
            wire::lane_in(op, dtype, float).ok_or(Counter::DropBadOp)?,
        ),
        _ => return Err(Counter::DropBadOp),
    };
    // The lane is part of what a round's first contribution fixes.
    let exact = matches!(lane, wire::Lane::Exact | wire::Lane::Exact128);
    let elems = hdr.count() as usize;
    if elems == 0 || elems * lane.size() > job.segment_bytes as usize {
        return Err(Counter::DropBadCount);
    }
    // The collective, and who is the segment's root: a member of the top level (a gather's
    // marked if it is a host, `ROOT_HOST`), or at a host level one of its ranks or
    // `ROOT_ELSEWHERE`, with the root at the parent in `relay`. A ring serves allreduce
    // alone. A parent's result names the root as the parent knows it: the copy keeps this
    // level's.
    let collective = wire::Collective::from_u8(hdr.collective()).ok_or(Counter::DropBadOp)?;
    let root = hdr.root();
    let from_parent = member >= wire::MAX_MEMBERS;
    let member_root =
        |r: u8| (r as usize) < wire::MAX_MEMBERS && job.members & (1u64 << (r & 63)) != 0;
    let valid = if collective == wire::Collective::Allreduce {
        root == 0 && (from_parent || hdr.relay == 0)
    } else if from_parent {
        true
    } else if job.role == Role::Root as u8 {
        member_root(root & !wire::ROOT_HOST)
    } else if job.role == Role::Inner as u8 {
        root == wire::ROOT_ELSEWHERE || member_root(root)
    } else {
        false
    };
    if !valid {
        return Err(Counter::DropBadOp);
    }
    let gather = collective.gathers();
    let data = gather && !from_parent && member == (root & !wire::ROOT_HOST) as usize;
    // Only a gather's members other than its root send without payload; from above, a
    // member that gets no data of the round (a reduce-scatter's other hosts) gets none.
    let header_only = hdr.is_header_only();
    if header_only
        && (!gather || data)
        && !(from_parent && collective != wire::Collective::Allreduce)
    {
        return Err(Counter::DropBadLength);
    }
    let words = if header_only {
        0
    } else {
        wire::payload_len(elems, lane.size()) / 8
    };
    if frame.payload_len() != words * 8 {
        return Err(Counter::DropBadLength);
    }
    let fold = if gather {
        Fold::Move
    } else {
        Fold::of(op, lane).ok_or(Counter::DropBadOp)?
    };
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
        op: hdr.op,
        masks: fold.masks(),
        dtype: hdr.dtype | if exact { wire::DTYPE_EXACT } else { 0 },
        inner: inner as u8,
        magnitude: if exact { hdr.magnitude } else { 0 },
        // Only the exact lane's fold reads it.
        headroom: if exact { headroom(members) } else { 0 },
        collective: collective as u8,
        root,
        // A parent's result: whether it moves a gather's data, and whether it is sent
        // pending.
        data: (data || (from_parent && gather)) as u8,
        pending: (from_parent && hdr.flags & wire::FLAG_PENDING != 0) as u8,
        // The root's data is in the copy once stored (`COPY_HAS_DATA`).
        flags: hdr.enc_flags() as u32 | if data { COPY_HAS_DATA } else { 0 },
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
    if STEERED {
        unsafe { FOLDS_STEERED.tail_call(ctx, program) };
    } else {
        unsafe { FOLDS.tail_call(ctx, program) };
    }
    // Only if the fold program is missing: a dataplane loaded without it.
    Err(Counter::RedirectError)
}

/// ceil(log2(n)) of the number n of members in `members` (at most 64): the bits by which
/// their sum may exceed the largest of them. A population count without loops (the BPF
/// target has no instruction for it).
#[inline(always)]
fn headroom(members: u64) -> u8 {
    let mut x = members - ((members >> 1) & 0x5555_5555_5555_5555);
    x = (x & 0x3333_3333_3333_3333) + ((x >> 2) & 0x3333_3333_3333_3333);
    x = (x + (x >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    let n = x.wrapping_mul(0x0101_0101_0101_0101) >> 56;
    (n > 1) as u8 + (n > 2) as u8 + (n > 4) as u8 + (n > 8) as u8 + (n > 16) as u8 + (n > 32) as u8
}

/// Runs fold `F` for the contribution `xagg_switch` staged: counts what came of it like
/// `xagg_switch` does.
#[inline(always)]
fn run_fold<const F: u32, const STEERED: bool>(ctx: &XdpContext) -> u32 {
    let Some(stage) = STAGE.get_ptr_mut(0) else {
        return xdp_action::XDP_DROP;
    };
    let st = unsafe { &mut *stage };
    let (row, member) = (st.row, st.member as usize);
    let r = fold_staged::<F>(ctx, st);
    let (Ok((_, c)) | Err(c)) = r;
    count_job(row, member, c);
    settle::<STEERED>(ctx, r)
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
    // A gather's data, in before every member: sent now, marked pending, so that the
    // members waiting for it do not wait for the last one to join too. Not at a host
    // level: its ranks get the data once, from above (which sends it to the root's host
    // too), as every other host's ranks do.
    let posted = F == Fold::Move as u32 && r.data != 0 && r.inner == 0;
    match outcome {
        slot::Outcome::Added if !posted => Ok((xdp_action::XDP_DROP, Counter::Contribution)),
        slot::Outcome::Added | slot::Outcome::Complete if multi => {
            store()?;
            let (frame, cfg) = result()?;
            frame.into_result(&stored);
            frame.set_pending(matches!(outcome, slot::Outcome::Added));
            frame.from_switch(cfg);
            let id = frame.header().job();
            // The devmap broadcast cannot clone a multi-buffer frame: the kernel hands it
            // to `xagg_fanout` on this port's tc ingress, which copies it to each member.
            mark_own_result(ctx, id)?;
            let counter = match outcome {
                slot::Outcome::Added => Counter::Contribution,
                _ => Counter::Complete,
            };
            Ok((xdp_action::XDP_PASS, counter))
        }
        slot::Outcome::Added | slot::Outcome::Complete => {
            if staged {
                store()?;
            }
            let (frame, cfg) = result()?;
            // Each copy is addressed to its member by `xagg_result` on the way out (and
            // cut to its header for a member that does not get the round's data).
            frame.into_result(&stored);
            let pending = matches!(outcome, slot::Outcome::Added);
            frame.set_pending(pending);
            frame.from_switch(cfg);
            let counter = if pending {
                Counter::Contribution
            } else {
                Counter::Complete
            };
            match PORTS.redirect(0, BPF_F_BROADCAST as u64) {
                Ok(action) => Ok((action, counter)),
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
        slot::Outcome::Delivered | slot::Outcome::DeliveredPending => {
            let (frame, cfg) = result()?;
            let job = JOBS.get(st.row).ok_or(Counter::RedirectError)?;
            frame.into_result(&stored);
            // The root as this level's members know it (the parent named its own).
            frame.set_root(stored.root);
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
        slot::Outcome::Replay | slot::Outcome::ReplayPending => {
            if inject(faults().drop_result) {
                return Err(Counter::InjectDropResult);
            }
            if staged {
                store()?;
            }
            // Whole, also to a member that does not get the round's data (it takes the
            // completion from it): cutting it here would leave the exact folds past the
            // verifier's budget (measured), and a replay answers a loss only.
            let (frame, cfg) = result()?;
            frame.into_result(&stored);
            if F == Fold::Move as u32 {
                frame.set_pending(matches!(outcome, slot::Outcome::ReplayPending));
            }
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

/// The fold programs, one per `Fold` or group of them for the ports (named as
/// `Fold::program` says) and one for steered contributions, of the cpumap's attach type
/// (`Fold::steered_program`).
macro_rules! fold_programs {
    ($($name:ident, $steered:ident = $fold:ident;)*) => {$(
        #[xdp(frags)]
        pub fn $name(ctx: XdpContext) -> u32 {
            run_fold::<{ Fold::$fold as u32 }, false>(&ctx)
        }

        #[xdp(frags, map = "cpumap")]
        pub fn $steered(ctx: XdpContext) -> u32 {
            run_fold::<{ Fold::$fold as u32 }, true>(&ctx)
        }
    )*};
}

fold_programs! {
    xagg_fold_sum32, xagg_cpu_sum32 = Sum32;
    xagg_fold_sum64, xagg_cpu_sum64 = Sum64;
    xagg_fold_sum_bfp, xagg_cpu_sum_bfp = SumBfp;
    xagg_fold_sum_bfp64, xagg_cpu_sum_bfp64 = SumBfp64;
    xagg_fold_sum_exact, xagg_cpu_sum_exact = SumExact;
    xagg_fold_sum_exact128, xagg_cpu_sum_exact128 = SumExact128;
    // Min and max, signed or not, and the bitwise ops: one program per group (its arm in
    // `reduce::fold` is its first fold's), told apart by the round's `Fold::masks`.
    xagg_fold_order32, xagg_cpu_order32 = MinI32;
    xagg_fold_order64, xagg_cpu_order64 = MinI64;
    xagg_fold_prod32, xagg_cpu_prod32 = Prod32;
    xagg_fold_prod64, xagg_cpu_prod64 = Prod64;
    xagg_fold_bitwise, xagg_cpu_bitwise = And;
    xagg_fold_move, xagg_cpu_move = Move;
}

/// At an inner level: stores the parent's result (checked and staged by `xagg_switch`)
/// over the partial it answers and delivers it to the members.
#[xdp(frags)]
pub fn xagg_deliver(ctx: XdpContext) -> u32 {
    run_fold::<DELIVER, false>(&ctx)
}
