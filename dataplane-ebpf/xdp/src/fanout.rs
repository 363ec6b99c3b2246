//! Fan-out of multi-buffer results, which the devmap broadcast cannot clone:
//! `xagg_switch` marks such a result as its own in the frame's metadata and passes it to
//! the kernel, and `xagg_fanout` on the port's tc ingress copies it to every member.

use aya_ebpf::{
    bindings::__sk_buff,
    cty::c_void,
    helpers::{
        bpf_clone_redirect, bpf_loop, bpf_skb_change_tail, bpf_skb_load_bytes, bpf_skb_store_bytes,
        bpf_xdp_adjust_meta,
    },
    macros::classifier,
    programs::{TcContext, XdpContext},
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr, udp::UdpHdr};
use xagg_common::{
    job::SwitchConfig,
    wire::{self, Kind, HEADER_LEN, PAYLOAD_OFFSET},
    Counter, Job, OWN_RESULT,
};
use xagg_ebpf::{
    inject,
    packet::{self, Udp4},
    reduce::bit_length,
    TC_ACT_OK, TC_ACT_SHOT,
};

use crate::{
    egress::ring_next,
    maps::{cookie_of, count, faults, job_of, SWITCH},
};

/// What `xagg_fanout` finds in front of a result of the switch's own: [`OWN_RESULT`] and
/// the job's wire id. A frame from the wire carries no metadata, so nothing else that
/// reaches tc ingress (a frame the bridge merely passes on) can look like one.
#[repr(C)]
#[derive(Clone, Copy)]
struct OwnResult {
    mark: u32,
    job: u32,
}

/// Marks the frame, in its metadata, as the switch's own multi-buffer result of job `job`
/// for `xagg_fanout`. Last thing before the frame is passed on: the helper invalidates every
/// packet pointer.
#[inline(always)]
pub fn mark_own_result(ctx: &XdpContext, job: u32) -> Result<(), Counter> {
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

/// Cuts the result in `ctx` to its headers, and its headers' copy at `heads` (written
/// over the frame's before each copy leaves) to match: the IPv4 and UDP lengths, and the
/// header marked `FLAG_HEADER_ONLY`. The IPv4 checksum is the addressing's.
#[inline(always)]
fn cut_to_header(ctx: &TcContext, heads: usize) -> bool {
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, PAYLOAD_OFFSET as u32, 0) } != 0 {
        return false;
    }
    let ip = unsafe { &mut *((heads + EthHdr::LEN) as *mut Ipv4Hdr) };
    ip.tot_len = ((Ipv4Hdr::LEN + UdpHdr::LEN + HEADER_LEN) as u16).to_be_bytes();
    let udp = unsafe { &mut *((heads + EthHdr::LEN + Ipv4Hdr::LEN) as *mut UdpHdr) };
    udp.len = ((UdpHdr::LEN + HEADER_LEN) as u16).to_be_bytes();
    unsafe { &mut *((heads + packet::HEADERS_LEN) as *mut xagg_common::Header) }.flags |=
        wire::FLAG_HEADER_ONLY;
    true
}

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
    // Who gets the data: for allreduce every member; for the other collectives either the
    // root alone (reduce-scatter, reduce: its copy first, then the frame is cut to its
    // headers for the others) or everyone but the root (a gather: the root's copy, cut,
    // last; none at all for a pending result, whose data the root sent). So one loop over
    // the members but the root, which the kernel runs (`copy_to_member`).
    let collective =
        wire::Collective::from_u8(hdr.collective()).unwrap_or(wire::Collective::Allreduce);
    // A root byte that names no member here (`ROOT_ELSEWHERE`, a host marked `ROOT_HOST`):
    // a gather's data goes to every member, a reduce-scatter's to none.
    let root_byte = hdr.root();
    let root = (root_byte as usize) & (wire::MAX_MEMBERS - 1);
    let pending = hdr.flags & wire::FLAG_PENDING != 0;
    let named = (root_byte as usize) < wire::MAX_MEMBERS && job.members & (1u64 << root) != 0;
    let alone = collective != wire::Collective::Allreduce && named;
    let skb = ctx.skb.skb;
    let send = |m: usize| send_copy(skb, job, cfg, at, m, drop_result);
    let scatter = matches!(
        collective,
        wire::Collective::ReduceScatter | wire::Collective::Reduce
    );
    if alone && scatter {
        send(root);
    }
    if scatter && !cut_to_header(ctx, at) {
        return Err(Counter::DropTruncated);
    }
    let others = if alone { !(1u64 << root) } else { u64::MAX };
    let mut copies = Copies {
        skb,
        job,
        cfg,
        at,
        to: job.members & others,
        drop_result: drop_result as u64,
    };
    // Up to the highest member the copies go to.
    let turns = bit_length(copies.to) as u32;
    unsafe {
        bpf_loop(
            turns,
            copy_to_member as *mut c_void,
            &mut copies as *mut Copies as *mut c_void,
            0,
        )
    };
    if alone && !scatter && !pending {
        if !cut_to_header(ctx, at) {
            return Err(Counter::DropTruncated);
        }
        send(root);
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

/// One member's copy of the result in `skb`: the headers at `at` addressed to member `m` of
/// `job`, with its cookie, written over the frame's (a copy shares the data, so each write
/// unshares the headers), and the copy sent out of the member's port.
#[inline(always)]
fn send_copy(
    skb: *mut __sk_buff,
    job: &Job,
    cfg: &SwitchConfig,
    at: usize,
    m: usize,
    drop_result: u32,
) {
    if inject(drop_result) {
        count(Counter::InjectDropResult);
    } else if let Some(addr) = job.member.get(m) {
        packet::address_to(at, addr, cfg);
        unsafe { &mut *((at + packet::HEADERS_LEN) as *mut xagg_common::Header) }
            .set_cookie(cookie_of(job.index as u32, m));
        let len = PAYLOAD_OFFSET as u32;
        let stored = unsafe { bpf_skb_store_bytes(skb as *mut _, 0, at as *const _, len, 0) } == 0;
        if stored && unsafe { bpf_clone_redirect(skb, addr.ifindex, 0) } == 0 {
            count(Counter::ResultCopy);
        } else {
            count(Counter::RedirectError);
        }
    }
}

/// What each turn of the loop over the members needs, on the program's stack.
#[repr(C)]
struct Copies {
    skb: *mut __sk_buff,
    job: *const Job,
    cfg: *const SwitchConfig,
    /// The headers' copy (`heads` in `try_fanout`).
    at: usize,
    /// The members that get a copy.
    to: u64,
    drop_result: u64,
}

/// A turn of the loop over the members (`bpf_loop`'s callback): member `index`'s copy, if
/// it gets one. A loop the kernel runs is verified once, not once per member: unrolled over
/// 64 members it took the verifier 0.7 M of its 1 M instructions.
extern "C" fn copy_to_member(index: u32, ctx: *mut c_void) -> i64 {
    let c = unsafe { &*(ctx as *const Copies) };
    let m = index as usize & (wire::MAX_MEMBERS - 1);
    if c.to & (1u64 << m) != 0 {
        let (job, cfg) = unsafe { (&*c.job, &*c.cfg) };
        send_copy(c.skb, job, cfg, c.at, m, c.drop_result as u32);
    }
    0
}
