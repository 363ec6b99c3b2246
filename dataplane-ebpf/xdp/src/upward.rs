//! An inner level (a host reducing its ranks, a lower switch, a ring host) and its
//! parent: partials go up the uplink, and what comes down it — the parent's result, the
//! answer to a status query forwarded up — is taken only from the parent.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use xagg_common::{
    job::{Role, SwitchConfig},
    wire, Counter, Job,
};
use xagg_ebpf::packet::Frame;

use crate::{
    fold::stage,
    maps::{cookie_of, count_job, job_of, FROM_PARENT, FROM_SUCCESSOR, PARENTS},
};

/// A result entering an inner level: its job's parent's, for a round that sent its
/// partial — only from the uplink and the parent's addresses, so nobody below (or
/// elsewhere) can hand the members a result of their own.
#[inline(always)]
pub fn parent_result(ctx: &XdpContext, frame: &Frame) -> Result<(u32, Counter), Counter> {
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
    let r = stage::<false>(ctx, frame, job, from);
    let (Ok((_, c)) | Err(c)) = r;
    count_job(job.index as u32, from, c);
    r
}

/// The parent's answer to a status query this level forwarded: handed to the member that
/// asked, as its own job's — only from the parent, on the uplink.
#[inline(always)]
pub fn relay_status(
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

/// Sends the frame (a partial, addressed) out of the job's uplink: back out of the port it
/// came in on, or redirected to the uplink.
#[inline(always)]
pub fn up(ctx: &XdpContext, job: &Job) -> Result<u32, Counter> {
    let uplink = job.parent.ifindex;
    if uplink == ctx.ingress_ifindex() as u32 {
        return Ok(xdp_action::XDP_TX);
    }
    match unsafe { aya_ebpf::helpers::bpf_redirect(uplink, 0) } as u32 {
        xdp_action::XDP_REDIRECT => Ok(xdp_action::XDP_REDIRECT),
        _ => Err(Counter::RedirectError),
    }
}
