//! The collective header carried in UDP. `docs/protocol.md` is the specification; this file
//! is its one implementation, used by the XDP programs and by the worker library.
//!
//! Header fields are big-endian (network byte order). Payload elements are little-endian:
//! workers and switches are little-endian machines, and this spares the switch a byte swap
//! per element.

mod collective;
mod header;
mod reduction;

pub use collective::{Collective, ROOT_ELSEWHERE, ROOT_HOST};
pub use header::{Builder, Header};
pub use reduction::{
    lane, lane_in, max_elements, max_elements_in, DType, Float, Lane, Op, UnknownName,
    ENC_NONFINITE, ENC_OVERFLOW, ENC_WITHDRAWN,
};

/// Protocol version carried in every header.
pub const VERSION: u8 = 5;
/// Default UDP port the switch listens on (configurable per switch).
pub const DEFAULT_PORT: u16 = 47800;
/// Length of the collective header. Ethernet (14) + IPv4 (20) + UDP (8) + 38 = 80, so the
/// payload starts 8-byte aligned in the frame and the switch adds with aligned word loads.
pub const HEADER_LEN: usize = 38;
/// Where the job's wire id sits in the header (big-endian): a copy rewritten for another
/// point stores just these bytes.
pub const JOB_OFFSET: usize = 4;
/// Where the member's cookie sits in the header: the switch writes each member's into its
/// copy of a result.
pub const COOKIE_OFFSET: usize = 30;
/// Bytes in front of the payload in a frame without IPv4 options.
pub const PAYLOAD_OFFSET: usize = 14 + 20 + 8 + HEADER_LEN;
/// Largest payload: what a 9000-byte MTU carries (the largest a real Ethernet network
/// carries without IP fragments, which the switch drops), rounded down to 8. On veth a
/// frame past 3520 bytes is multi-buffer: its payload past the first buffer is reached by
/// copies.
pub const MAX_PAYLOAD: usize = 8928;
/// Largest payload one single-buffer XDP frame carries on veth (an IPv4 packet of at most
/// 3506 bytes, the MTU a program without the frags flag allows on its peer), rounded
/// down to 8: the longest segment that takes the switch's direct path there.
pub const BUFFER_PAYLOAD: usize = 3440;
/// Largest IPv4 packet (the MTU) a full segment needs.
pub const MAX_IP_PACKET: usize = ip_packet_len(MAX_PAYLOAD);

/// Bytes of the IPv4 packet (no options) carrying a segment of `payload` bytes: the MTU a
/// link needs for it.
pub const fn ip_packet_len(payload: usize) -> usize {
    20 + 8 + HEADER_LEN + payload_len(payload, 1)
}

/// Most segment bytes a link of `mtu` carries in one IPv4 packet (whole 8-byte words), at
/// most [`MAX_PAYLOAD`] (the slots' size).
pub const fn payload_for_mtu(mtu: usize) -> usize {
    let room = mtu.saturating_sub(ip_packet_len(0)) & !7;
    if room < MAX_PAYLOAD {
        room
    } else {
        MAX_PAYLOAD
    }
}
/// Members one aggregation point can wait for: one bit each in a 64-bit bitmap.
pub const MAX_MEMBERS: usize = 64;

/// Flag bit: which of the slot's two shadow copies this packet belongs to.
pub const FLAG_SHADOW: u8 = 1 << 0;
/// Flag bit: the last segment of a message (it may be short).
pub const FLAG_LAST: u8 = 1 << 1;
/// Flag bit of a status query: an inner level waiting on its parent for the round may
/// forward the query upward, so the member learns what the level above waits for.
pub const FLAG_FORWARD: u8 = 1 << 2;
/// Flag bit of a ring host's result that came from its successor (an answer to a re-sent
/// partial: the pass round the ring was lost before it): the host passes it back to its
/// predecessor, which may lack it too, rather than on.
pub const FLAG_BACKWARD: u8 = 1 << 3;
/// Flag bit of a contribution, partial or result whose float sum travels in the exact lane
/// ([`Lane::Exact`]): the message's float mode, the same on every rank.
pub const FLAG_EXACT: u8 = 1 << 4;
/// Flag bit of a contribution or result without payload: `count` still says how many
/// elements the round has. A member that does not send a round's data (all-gather,
/// broadcast) contributes one; a member that does not get a round's data (reduce-scatter,
/// reduce, or a gather's root) is answered with one.
pub const FLAG_HEADER_ONLY: u8 = 1 << 5;
/// Flag bit of a gather round's result sent when its data arrived but some member is not
/// in yet: the data, not the round's completion (a header-only result without it follows,
/// or the data again once complete). A member may not reuse the slot on it.
pub const FLAG_PENDING: u8 = 1 << 6;
/// The bit a slot adds to the data type it keeps for a round in the exact lane, so that a
/// contribution of the same type in the other lane is refused like one of another type.
pub const DTYPE_EXACT: u8 = 0x80;

/// Packet kinds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A member's contribution to one segment, worker -> aggregation point.
    Contribution = 1,
    /// The reduced segment, aggregation point -> members.
    Result = 2,
    /// Ask for a shadow copy's state (a worker's sync before its first allreduce, and
    /// loss diagnostics).
    StatusQuery = 3,
    /// Answer to a status query: the copy's state, or why the query is refused.
    StatusReply = 4,
    /// A joining member, from its own data socket to the collective port: the switch
    /// records the port it came in on and its source MAC, IPv4 address and UDP port under
    /// the hello's token (the header's job and message fields, [`hello_token`]), for the
    /// daemon to make them the member's. Nothing in it is trusted beyond that.
    Hello = 5,
}

impl Kind {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Contribution),
            2 => Some(Self::Result),
            3 => Some(Self::StatusQuery),
            4 => Some(Self::StatusReply),
            5 => Some(Self::Hello),
            _ => None,
        }
    }
}

/// Payload bytes on the wire for `count` elements of `size` bytes: padded with zeros to a
/// multiple of 8, so the switch works in whole 64-bit words.
pub const fn payload_len(count: usize, size: usize) -> usize {
    (count * size + 7) & !7
}

/// Finishes a collective packet (the UDP payload) in `out` whose `payload_bytes` of
/// payload the caller already wrote at `out[HEADER_LEN..]`: writes the header in front and
/// zero padding to a multiple of 8 behind. Returns the packet's length, or `None` if `out`
/// is too small. This is how the worker encodes in place into its send buffer.
pub fn finish(h: &Header, payload_bytes: usize, out: &mut [u8]) -> Option<usize> {
    let len = HEADER_LEN + payload_len(payload_bytes, 1);
    if out.len() < len {
        return None;
    }
    let (head, rest) = out.split_at_mut(HEADER_LEN);
    h.write(head.try_into().expect("split at HEADER_LEN"));
    rest[payload_bytes..len - HEADER_LEN].fill(0);
    Some(len)
}

/// Writes a collective packet (the UDP payload) into `out`: the header, the payload bytes
/// and zero padding to a multiple of 8. Returns its length, or `None` if `out` is too
/// small.
pub fn encode(h: &Header, payload: &[u8], out: &mut [u8]) -> Option<usize> {
    let body = out.get_mut(HEADER_LEN..HEADER_LEN + payload.len())?;
    body.copy_from_slice(payload);
    finish(h, payload.len(), out)
}

/// Payload bytes of a status query or reply: the members already in a shadow copy and
/// all the job's members, two little-endian u64.
pub const STATUS_PAYLOAD: usize = 16;

/// Why a datagram is not a well-formed collective packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header.
    Short,
    Version(u8),
    Kind(u8),
    Op(u8),
    DType(u8),
    /// Element count of zero.
    Count,
    /// A collective this version does not know.
    Collective(u8),
    /// Length does not match the element count (or, for status packets, 16 bytes).
    Length,
}

/// A decoded collective packet: its header and its payload without padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

/// The 64-bit token a hello carries in its header's job (high half) and message (low
/// half) fields.
pub const fn hello_token(h: &Header) -> u64 {
    ((h.job() as u64) << 32) | h.message() as u64
}

/// A hello with `token` (its payload: [`STATUS_PAYLOAD`] zero bytes).
pub fn hello(token: u64) -> Header {
    Header::builder(Kind::Hello)
        .job((token >> 32) as u32)
        .message(token as u32)
        .build()
}

/// Decodes and checks a UDP payload: the user-space counterpart of the switch's parser.
pub fn decode(d: &[u8]) -> Result<Packet<'_>, DecodeError> {
    let header = Header::from_bytes(d).ok_or(DecodeError::Short)?;
    if header.version != VERSION {
        return Err(DecodeError::Version(header.version));
    }
    let kind = Kind::from_u8(header.kind).ok_or(DecodeError::Kind(header.kind))?;
    let body = &d[HEADER_LEN..];
    if matches!(kind, Kind::StatusQuery | Kind::StatusReply | Kind::Hello) {
        if body.len() != STATUS_PAYLOAD {
            return Err(DecodeError::Length);
        }
        return Ok(Packet {
            header,
            payload: body,
        });
    }
    let op = Op::from_u8(header.op).ok_or(DecodeError::Op(header.op))?;
    let dtype = DType::from_u8(header.dtype).ok_or(DecodeError::DType(header.dtype))?;
    let size = match lane_in(op, dtype, Float::of_flags(header.flags)) {
        Some(l) => l.size(),
        None => return Err(DecodeError::Op(header.op)),
    };
    let count = header.count() as usize;
    if count == 0 {
        return Err(DecodeError::Count);
    }
    if Collective::from_u8(header.collective()).is_none() {
        return Err(DecodeError::Collective(header.collective()));
    }
    if header.is_header_only() {
        if !body.is_empty() {
            return Err(DecodeError::Length);
        }
        return Ok(Packet {
            header,
            payload: body,
        });
    }
    if body.len() != payload_len(count, size) {
        return Err(DecodeError::Length);
    }
    Ok(Packet {
        header,
        payload: &body[..count * size],
    })
}

/// The header's `status`: 0 in results; a copy's state or a refusal in status replies
/// (`docs/protocol.md`, Status values).
pub mod status {
    pub const OK: u8 = 0;
    /// A status reply refusing the query, so a worker learns why the switch does not take
    /// it: the sender is not that member of the job — the switch has no such job (0x81
    /// said so before header version 3: a stranger learnt which job ids exist), or the
    /// member index, the port it came in on or its source addresses differ from the job's.
    pub const REFUSED_NOT_MEMBER: u8 = 0x82;
    /// The slot is outside the job's slots.
    pub const REFUSED_SLOT_RANGE: u8 = 0x83;
    /// Whether a status reply's `status` refuses the query.
    pub const fn is_refusal(s: u8) -> bool {
        s & 0x80 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h = Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(7)
            .message(0x0102_0304)
            .segment(9)
            .slot(3)
            .member(2)
            .shadow(1)
            .count(256)
            .build();
        let b = h.to_bytes();
        assert_eq!(Header::from_bytes(&b), Some(h));
        assert_eq!(&b[4..8], &[0, 0, 0, 7]);
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[12..16], &[0, 0, 0, 9]);
        assert_eq!(&b[16..18], &[0, 3]);
        assert_eq!(
            (h.job(), h.message(), h.segment(), h.slot()),
            (7, 0x0102_0304, 9, 3)
        );
        assert_eq!(h.count(), 256);
        assert_eq!(h.shadow(), 1);
        let e = Header::builder(Kind::Result)
            .exponent(-1100)
            .enc_flags(ENC_NONFINITE)
            .build();
        let b = e.to_bytes();
        assert_eq!(&b[23..27], &[0xfb, 0xb4, 0, 1]);
        assert_eq!(Header::from_bytes(&b).unwrap().exponent(), -1100);
        assert!(!h.is_last());
        assert_eq!(Header::from_bytes(&b[..29]), None);
    }

    #[test]
    fn decode_checks_lengths() {
        let h = Header::builder(Kind::Result)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(1)
            .message(2)
            .segment(3)
            .slot(4)
            .count(3)
            .build();
        let mut buf = [0xffu8; 64];
        let n = encode(&h, &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0], &mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 16);
        assert_eq!(&buf[HEADER_LEN + 12..n], &[0; 4], "padding is zeroed");
        let p = decode(&buf[..n]).unwrap();
        assert_eq!((p.header, p.payload.len()), (h, 12));
        assert_eq!(decode(&buf[..n - 1]), Err(DecodeError::Length));
        assert_eq!(decode(&buf[..n + 8]), Err(DecodeError::Length));
        assert_eq!(decode(&buf[..10]), Err(DecodeError::Short));
        buf[0] = 1;
        assert_eq!(decode(&buf[..n]), Err(DecodeError::Version(1)));
    }

    #[test]
    fn names() {
        for op in Op::ALL {
            assert_eq!(op.name().parse(), Ok(op));
            assert!(UnknownName::OP.valid.contains(op.name()));
        }
        for t in DType::ALL {
            assert_eq!(t.name().parse(), Ok(t));
            assert!(UnknownName::DTYPE.valid.contains(t.name()));
        }
        assert_eq!("mean".parse::<Op>(), Err(UnknownName::OP));
    }

    #[test]
    fn padding() {
        assert_eq!(payload_len(1, 4), 8);
        assert_eq!(payload_len(2, 4), 8);
        assert_eq!(payload_len(3, 4), 16);
        assert_eq!(payload_len(860, 4), BUFFER_PAYLOAD);
        assert_eq!(payload_len(2232, 4), MAX_PAYLOAD);
        assert_eq!(DType::I32.max_elements(), 2232);
        assert_eq!(payload_for_mtu(9000), MAX_PAYLOAD);
        assert_eq!(payload_for_mtu(65535), MAX_PAYLOAD);
        assert_eq!(payload_for_mtu(1500), 1432);
        assert_eq!(payload_for_mtu(ip_packet_len(1432) + 7), 1432);
        assert_eq!(payload_for_mtu(40), 0);
    }
}
