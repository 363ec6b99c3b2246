//! What the engine puts on the wire and takes off it: contributions and status queries out,
//! results (decoded into their request's buffer) and status replies in.

use std::{io, time::Duration};

use xagg_common::wire::{
    self, Header, Kind, ENC_NONFINITE, ENC_OVERFLOW, ENC_WITHDRAWN, HEADER_LEN,
};

use super::Engine;
use crate::{codec, window::InFlight};

impl Engine {
    /// Hands what comes in to the window (results, decoded into their request's buffer
    /// at once) or to the status replies.
    pub(super) fn receive(&mut self, nonblocking: bool, spin: Duration) -> io::Result<()> {
        let Self {
            transport,
            window,
            active,
            answered,
            replies,
            early,
            ahead,
            next_message,
            p,
            ..
        } = self;
        let next_message = *next_message;
        let (job, ranks) = (p.job, p.ranks() as u32);
        transport.receive(nonblocking, spin, &mut |d: &[u8]| {
            let Ok(packet) = wire::decode(d) else { return };
            let h = packet.header;
            if h.job() != job {
                return;
            }
            if h.kind == Kind::StatusReply as u8 {
                let mut payload = [0u8; wire::STATUS_PAYLOAD];
                payload.copy_from_slice(packet.payload);
                replies.push((h, payload));
                return;
            }
            let Some(a) = window.check(&h) else {
                take_early(active, early, ahead, next_message, &h, packet.payload);
                return;
            };
            let Some(req) = active
                .iter_mut()
                .find(|r| r.message == Some(a.flight.message) && r.diagnosis.is_none())
            else {
                return;
            };
            let flags = h.enc_flags();
            // Only what this member gets of the call is written: a copy carrying data it
            // does not get (a replay, whole to everyone) is a completion like any other.
            let destination = req.layout.destination(a.flight.segment);
            let data = !h.is_header_only();
            if let Some(range) = destination.clone().filter(|_| data) {
                let r = req.r;
                let out = &mut req.output.bytes_mut()[range];
                if req.layout.collective.gathers() {
                    out.copy_from_slice(&packet.payload[..out.len()]);
                } else if flags & (ENC_NONFINITE | ENC_OVERFLOW) != 0 {
                    // Flagged: no number the lanes hold is the sum.
                    codec::fill_nan(r.dtype, out);
                } else {
                    debug_assert_eq!(
                        packet.payload.len(),
                        out.len() / r.dtype.size() * r.lane.size()
                    );
                    codec::decode(
                        (r.op, r.dtype, r.float),
                        ranks,
                        packet.payload,
                        h.exponent(),
                        out,
                    );
                }
            }
            if h.flags & wire::FLAG_PENDING != 0 {
                // A gather's data, sent before its round was complete: the round ends here
                // only if its completion came first (both are sent at once, from two
                // CPUs, and either may arrive first).
                if data && window.data_came(&a) {
                    answered.push((a, flags));
                }
                return;
            }
            if destination.is_some() && !data && !a.flight.has_data {
                // Complete, its data (sent pending) not here yet: on its way, or lost and
                // asked for again, with room for it, when the contribution is due.
                window.completion_came(&a);
                return;
            }
            answered.push((a, flags));
        })
    }

    /// Encodes the contribution `f` of request `i` on `slot` in place into the
    /// transport's send buffer; `withdraw`: marked as given up on (`ENC_WITHDRAWN`).
    pub(super) fn send(
        &mut self,
        i: usize,
        slot: usize,
        f: &InFlight,
        withdraw: bool,
    ) -> io::Result<()> {
        let a = &self.active[i];
        let r = a.r;
        let source = a.layout.source(f.segment);
        let sends = source.is_some();
        let (root, relay, beside) = self
            .p
            .wire_root(a.layout.collective, a.layout.root_of(f.segment));
        // A gather's member without the data sends its header, or, sent again while the
        // data has not come, room for the switch to put it in; behind a host level, also
        // a rank beside the root on its host (`WorkerParams::wire_root`).
        let room = !sends && ((f.retransmitted && !f.has_data) || beside);
        let lane_bytes = if sends || room {
            usize::from(f.count) * r.lane.size()
        } else {
            0
        };
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let cookie = self.transport.cookie();
        let out = self.transport.reserve(slot, len)?;
        let src = a.input.as_ref().unwrap_or(&a.output).bytes();
        let body = &mut out[HEADER_LEN..HEADER_LEN + lane_bytes];
        let enc = match source {
            Some(range) if a.layout.collective.gathers() => {
                body[..range.len()].copy_from_slice(&src[range.clone()]);
                body[range.len()..].fill(0);
                codec::Encoded::default()
            }
            Some(range) => codec::encode(r.op, r.dtype, r.float, self.p.ranks(), &src[range], body),
            None => {
                body.fill(0);
                codec::Encoded::default()
            }
        };
        let header_only = if !sends && !room {
            wire::FLAG_HEADER_ONLY
        } else {
            0
        };
        let h = Header::builder(Kind::Contribution)
            .op(r.op)
            .dtype(r.dtype)
            .job(self.p.job)
            .message(f.message)
            .segment(f.segment as u32)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(f.shadow)
            .last(f.segment + 1 == a.segments)
            .count(f.count)
            .exponent(enc.exponent)
            .enc_flags(enc.flags | if withdraw { ENC_WITHDRAWN } else { 0 })
            .magnitude(enc.magnitude)
            .float(r.float)
            .collective(a.layout.collective, root)
            .cookie(cookie)
            .build();
        let mut h = h;
        h.flags |= header_only;
        h.relay = relay;
        wire::finish(&h, lane_bytes, out).expect("reserved the packet's length");
        self.transport.commit(len)
    }

    /// Asks the switch for the state of `shadow` of `slot` (the round given is the one the
    /// worker has in mind; the reply carries the copy's own).
    pub(super) fn query(
        &mut self,
        message: u32,
        segment: u32,
        slot: usize,
        shadow: u8,
    ) -> io::Result<()> {
        self.query_as(message, segment, slot, shadow, false)
    }

    /// [`Self::query`], `forward`: an aggregation point waiting on its parent for the
    /// round may pass the query up, and the level above answers.
    pub(super) fn query_as(
        &mut self,
        message: u32,
        segment: u32,
        slot: usize,
        shadow: u8,
        forward: bool,
    ) -> io::Result<()> {
        let mut h = Header::builder(Kind::StatusQuery)
            .op(self.p.op)
            .dtype(self.p.dtype)
            .job(self.p.job)
            .message(message)
            .segment(segment)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(shadow)
            .cookie(self.transport.cookie())
            .build();
        if forward {
            h.flags |= wire::FLAG_FORWARD;
        }
        let mut q = [0u8; HEADER_LEN + wire::STATUS_PAYLOAD];
        let n = wire::finish(&h, wire::STATUS_PAYLOAD, &mut q).expect("room for a query");
        self.transport.send_now(&q[..n])
    }
}

/// A gather's data, sent pending, for a round of a request that this member has not sent
/// yet (its slot still holds an earlier round, or the request is not yet submitted here or
/// has no message id yet: members are at different points of their calls): taken into the
/// output now, or kept in `ahead` until the request starts, and the round, once sent,
/// waits for its completion alone. Without this a member behind the others would get every
/// such round's completion without its data, and ask for the data again a timeout later.
fn take_early(
    active: &mut std::collections::VecDeque<super::Active>,
    early: &mut std::collections::HashSet<(u32, usize)>,
    ahead: &mut std::collections::VecDeque<(Header, Vec<u8>)>,
    next_message: u32,
    h: &Header,
    payload: &[u8],
) {
    if h.kind != Kind::Result as u8 || h.flags & wire::FLAG_PENDING == 0 || h.is_header_only() {
        return;
    }
    if let Some(req) = active.iter_mut().find(|r| r.message == Some(h.message())) {
        take_into(req, early, h, payload);
    } else if !xagg_common::Round::first(h.message())
        .is_before(xagg_common::Round::first(next_message))
    {
        // For a message this member has not started: kept, a bounded number (the oldest
        // go first), until it does.
        if ahead.len() >= AHEAD {
            ahead.pop_front();
        }
        ahead.push_back((*h, payload.to_vec()));
    }
}

/// Pending data kept for messages not started yet, at most.
pub(super) const AHEAD: usize = 256;

/// Takes a gather's pending data for `req`'s round into its output, noting the round in
/// `early`.
pub(super) fn take_into(
    req: &mut super::Active,
    early: &mut std::collections::HashSet<(u32, usize)>,
    h: &Header,
    payload: &[u8],
) {
    let segment = h.segment() as usize;
    if !req.layout.collective.gathers() || segment >= req.segments {
        return;
    }
    let Some(range) = req.layout.destination(segment) else {
        return;
    };
    if usize::from(h.count()) != range.len().div_ceil(req.r.dtype.size())
        || payload.len() < range.len()
    {
        return;
    }
    req.output.bytes_mut()[range.clone()].copy_from_slice(&payload[..range.len()]);
    early.insert((h.message(), segment));
}
