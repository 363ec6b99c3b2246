//! What the engine puts on the wire and takes off it: contributions and status queries out,
//! results (decoded into their request's buffer) and status replies in.

use std::{io, time::Duration};

use xagg_common::wire::{self, Header, Kind, ENC_NONFINITE, ENC_WITHDRAWN, HEADER_LEN};

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
            p,
            ..
        } = self;
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
            let Some(a) = window.check(&h) else { return };
            let Some(req) = active
                .iter_mut()
                .find(|r| r.message == Some(a.flight.message) && r.diagnosis.is_none())
            else {
                return;
            };
            let range = req.range(a.flight.segment);
            let r = req.r;
            let flags = h.enc_flags();
            let out = &mut req.output.bytes_mut()[range];
            if flags & ENC_NONFINITE != 0 {
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
        let range = a.range(f.segment);
        let lane_bytes = usize::from(f.count) * r.lane.size();
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let cookie = self.transport.cookie();
        let out = self.transport.reserve(slot, len)?;
        let src = a.input.as_ref().unwrap_or(&a.output).bytes();
        let enc = codec::encode(
            r.op,
            r.dtype,
            r.float,
            self.p.ranks(),
            &src[range],
            &mut out[HEADER_LEN..HEADER_LEN + lane_bytes],
        );
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
            .cookie(cookie)
            .build();
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
