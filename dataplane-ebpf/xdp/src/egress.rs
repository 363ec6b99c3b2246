//! Egress, `xagg_result` on every switch port as the devmap's program: addresses each
//! broadcast copy of a result to the member behind the port it leaves through, or (a ring
//! host's uplink) to the ring's next host.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use network_types::udp::UdpHdr;
use xagg_common::{
    job::{EgressKey, MemberAddr, Role, EGRESS_SUCCESSOR},
    wire::{self, Kind},
    Counter, Job,
};
use xagg_ebpf::{
    inject,
    packet::{self, Udp4},
};

use crate::maps::{cookie_of, count, faults, job_of, EGRESS, SWITCH};

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
    // A member that does not get the round's data (`Collective::delivers_to`): its copy
    // is cut to the header (the completion), or, a gather's pending data to its root, not
    // sent at all.
    let collective = wire::Collective::from_u8(hdr.collective());
    let frame = if collective.is_some_and(|c| !c.delivers_to(member as u8, hdr.root())) {
        if hdr.flags & wire::FLAG_PENDING != 0 {
            return Ok(xdp_action::XDP_DROP);
        }
        if !hdr.is_header_only() {
            let payload = (u16::from_be_bytes(frame.udp().len) as usize)
                .saturating_sub(UdpHdr::LEN + wire::HEADER_LEN);
            packet::header_only(ctx, payload)?;
        }
        Udp4::parse(ctx.data(), ctx.data_end()).ok_or(Counter::DropTruncated)?
    } else {
        frame
    };
    let Some(hdr) = frame.header() else {
        return Err(Counter::DropTruncated);
    };
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
pub fn ring_next<'a>(job: &'a Job, hdr: &xagg_common::Header) -> Option<(&'a MemberAddr, u32)> {
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
