//! The collective header carried in UDP. `docs/protocol.md` is the specification; this file
//! is its one implementation, used by the XDP programs and by the worker library.
//!
//! Header fields are big-endian (network byte order). Payload elements are little-endian:
//! workers and switches are little-endian machines, and this spares the switch a byte swap
//! per element.

/// Protocol version carried in every header.
pub const VERSION: u8 = 1;
/// Default UDP port the switch listens on (configurable per switch).
pub const DEFAULT_PORT: u16 = 47800;
/// Length of the collective header. Ethernet (14) + IPv4 (20) + UDP (8) + 30 = 72, so the
/// payload starts 8-byte aligned in the frame and the switch adds with aligned word loads.
pub const HEADER_LEN: usize = 30;
/// Bytes in front of the payload in a frame without IPv4 options.
pub const PAYLOAD_OFFSET: usize = 14 + 20 + 8 + HEADER_LEN;
/// Largest payload: what one single-buffer XDP frame carries on veth (an IPv4 packet of at
/// most 3506 bytes, the MTU a non-frags XDP program allows on its peer), rounded down to 8.
pub const MAX_PAYLOAD: usize = 3448;
/// Largest IPv4 packet (the MTU) a full segment needs.
pub const MAX_IP_PACKET: usize = 20 + 8 + HEADER_LEN + MAX_PAYLOAD;
/// Members one aggregation point can wait for: one bit each in a 64-bit bitmap.
pub const MAX_MEMBERS: usize = 64;

/// Flag bit: which of the slot's two versions (shadow copies) this packet belongs to.
pub const FLAG_EPOCH: u8 = 1 << 0;
/// Flag bit: the last segment of a message (it may be short).
pub const FLAG_LAST: u8 = 1 << 1;

/// Packet kinds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A member's contribution to one segment, worker -> aggregation point.
    Contribution = 1,
    /// The reduced segment, aggregation point -> members.
    Result = 2,
    /// Ask for a slot's state (reserved for loss diagnostics).
    StatusQuery = 3,
    /// Answer to a status query (reserved).
    StatusReply = 4,
}

impl Kind {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Contribution),
            2 => Some(Self::Result),
            3 => Some(Self::StatusQuery),
            4 => Some(Self::StatusReply),
            _ => None,
        }
    }
}

/// Reduction operations. Only the ones the dataplane implements are accepted by the
/// control plane when a job is created.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum = 1,
    Min = 2,
    Max = 3,
    Avg = 4,
    Prod = 5,
    And = 6,
    Or = 7,
    Xor = 8,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::Sum,
        Op::Min,
        Op::Max,
        Op::Avg,
        Op::Prod,
        Op::And,
        Op::Or,
        Op::Xor,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Sum),
            2 => Some(Self::Min),
            3 => Some(Self::Max),
            4 => Some(Self::Avg),
            5 => Some(Self::Prod),
            6 => Some(Self::And),
            7 => Some(Self::Or),
            8 => Some(Self::Xor),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
            Self::Prod => "prod",
            Self::And => "and",
            Self::Or => "or",
            Self::Xor => "xor",
        }
    }
}

/// Element data types on the wire.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    I32 = 1,
    U32 = 2,
    I64 = 3,
    F32 = 4,
    F16 = 5,
    Bf16 = 6,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F32,
        DType::F16,
        DType::Bf16,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::I32),
            2 => Some(Self::U32),
            3 => Some(Self::I64),
            4 => Some(Self::F32),
            5 => Some(Self::F16),
            6 => Some(Self::Bf16),
            _ => None,
        }
    }

    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 => 8,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::I64 => "i64",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// Most elements of this type one segment can carry when each travels in `size()`
    /// bytes; see [`max_elements`] for a job's op.
    pub const fn max_elements(self) -> usize {
        MAX_PAYLOAD / self.size()
    }
}

/// How elements of a job travel and are reduced: the wire encoding chosen by the job's op
/// and data type. The switch works on lanes only; the worker library converts.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Signed 32-bit integers.
    I32 = 1,
    /// Unsigned 32-bit integers.
    U32 = 2,
    /// Signed 64-bit integers (also the widened sums of `avg` over i32 and u32).
    I64 = 3,
    /// Block floating point: signed 32-bit mantissas scaled by 2^`exponent` of the packet;
    /// the switch aligns blocks to the larger exponent before adding.
    Bfp32 = 4,
    /// Order-preserving unsigned 32-bit keys of floats (min and max).
    Key32 = 5,
}

impl Lane {
    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I64 => 8,
            _ => 4,
        }
    }

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::I32),
            2 => Some(Self::U32),
            3 => Some(Self::I64),
            4 => Some(Self::Bfp32),
            5 => Some(Self::Key32),
            _ => None,
        }
    }
}

/// The wire encoding of `op` over `dtype`, or `None` if the switch does not reduce it
/// (products and bitwise ops of floats).
pub const fn lane(op: Op, dtype: DType) -> Option<Lane> {
    match (op, dtype) {
        (Op::Avg, DType::I32 | DType::U32) => Some(Lane::I64),
        (_, DType::I32) => Some(Lane::I32),
        (_, DType::U32) => Some(Lane::U32),
        (_, DType::I64) => Some(Lane::I64),
        (Op::Sum | Op::Avg, _) => Some(Lane::Bfp32),
        (Op::Min | Op::Max, _) => Some(Lane::Key32),
        _ => None,
    }
}

/// `enc_flags` bit: some member's segment held NaN or an infinity that the encoding cannot
/// carry; the switch keeps it sticky in the slot and returns it with the result.
pub const ENC_NONFINITE: u16 = 1 << 0;
/// `enc_flags` bit: a signed 64-bit sum overflowed (`avg` over i64 reports it).
pub const ENC_OVERFLOW: u16 = 1 << 1;

/// Most elements one segment of `op` over `dtype` carries.
pub const fn max_elements(op: Op, dtype: DType) -> usize {
    match lane(op, dtype) {
        Some(l) => MAX_PAYLOAD / l.size(),
        None => 0,
    }
}

/// Payload bytes on the wire for `count` elements of `size` bytes: padded with zeros to a
/// multiple of 8, so the switch works in whole 64-bit words.
pub const fn payload_len(count: usize, size: usize) -> usize {
    (count * size + 7) & !7
}

/// Writes a collective packet (the UDP payload) into `out`: the header, the payload bytes
/// (`count` little-endian elements) and zero padding to a multiple of 8. Returns its
/// length, or `None` if `out` is too small.
pub fn encode(h: &Header, payload: &[u8], out: &mut [u8]) -> Option<usize> {
    let len = HEADER_LEN + ((payload.len() + 7) & !7);
    if out.len() < len {
        return None;
    }
    out[..HEADER_LEN].copy_from_slice(&h.to_bytes());
    out[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    out[HEADER_LEN + payload.len()..len].fill(0);
    Some(len)
}

/// Payload bytes of a status query or reply: the members already in a slot version and
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
    /// Length does not match the element count (or, for status packets, 16 bytes).
    Length,
}

/// A decoded collective packet: its header and its payload without padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

/// Decodes and checks a UDP payload: the user-space counterpart of the switch's parser.
pub fn decode(d: &[u8]) -> Result<Packet<'_>, DecodeError> {
    let header = Header::from_bytes(d).ok_or(DecodeError::Short)?;
    if header.version != VERSION {
        return Err(DecodeError::Version(header.version));
    }
    let kind = Kind::from_u8(header.kind).ok_or(DecodeError::Kind(header.kind))?;
    let body = &d[HEADER_LEN..];
    if matches!(kind, Kind::StatusQuery | Kind::StatusReply) {
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
    let size = match lane(op, dtype) {
        Some(l) => l.size(),
        None => return Err(DecodeError::Op(header.op)),
    };
    let count = header.count() as usize;
    if count == 0 {
        return Err(DecodeError::Count);
    }
    if body.len() != payload_len(count, size) {
        return Err(DecodeError::Length);
    }
    Ok(Packet {
        header,
        payload: &body[..count * size],
    })
}

/// Execution status carried in results (seed 000's "execution status").
pub mod status {
    pub const OK: u8 = 0;
}

/// The collective header, 30 bytes, every multi-byte field big-endian. Fields are byte
/// arrays so the struct has alignment 1 and no padding; accessors convert.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    pub version: u8,
    pub kind: u8,
    pub op: u8,
    pub dtype: u8,
    pub jid: [u8; 4],
    pub mid: [u8; 4],
    pub sid: [u8; 4],
    pub seg: [u8; 2],
    pub member: u8,
    pub flags: u8,
    pub count: [u8; 2],
    pub status: u8,
    /// Per-packet exponent for block floating point (reserved, 0 for integer types).
    pub exponent: i8,
    /// Flags of the float encodings (reserved, 0).
    pub enc_flags: [u8; 2],
    /// Must be zero when sent; ignored when received.
    pub reserved: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);
const _: () = assert!(PAYLOAD_OFFSET.is_multiple_of(8));
const _: () = assert!(MAX_PAYLOAD.is_multiple_of(8));
const _: () = assert!(MAX_IP_PACKET <= 3506);

impl Header {
    #[expect(clippy::too_many_arguments, reason = "one argument per header field")]
    pub const fn new(
        kind: Kind,
        op: Op,
        dtype: DType,
        jid: u32,
        mid: u32,
        sid: u32,
        seg: u16,
        member: u8,
        flags: u8,
        count: u16,
    ) -> Self {
        Self {
            version: VERSION,
            kind: kind as u8,
            op: op as u8,
            dtype: dtype as u8,
            jid: jid.to_be_bytes(),
            mid: mid.to_be_bytes(),
            sid: sid.to_be_bytes(),
            seg: seg.to_be_bytes(),
            member,
            flags,
            count: count.to_be_bytes(),
            status: status::OK,
            exponent: 0,
            enc_flags: [0; 2],
            reserved: [0; 4],
        }
    }

    #[inline(always)]
    pub const fn jid(&self) -> u32 {
        u32::from_be_bytes(self.jid)
    }
    #[inline(always)]
    pub const fn mid(&self) -> u32 {
        u32::from_be_bytes(self.mid)
    }
    #[inline(always)]
    pub const fn sid(&self) -> u32 {
        u32::from_be_bytes(self.sid)
    }
    #[inline(always)]
    pub const fn seg(&self) -> u16 {
        u16::from_be_bytes(self.seg)
    }
    #[inline(always)]
    pub const fn count(&self) -> u16 {
        u16::from_be_bytes(self.count)
    }
    #[inline(always)]
    pub const fn enc_flags(&self) -> u16 {
        u16::from_be_bytes(self.enc_flags)
    }
    #[inline(always)]
    pub const fn epoch(&self) -> usize {
        (self.flags & FLAG_EPOCH) as usize
    }

    /// The header as it goes on the wire.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.version;
        b[1] = self.kind;
        b[2] = self.op;
        b[3] = self.dtype;
        b[4..8].copy_from_slice(&self.jid);
        b[8..12].copy_from_slice(&self.mid);
        b[12..16].copy_from_slice(&self.sid);
        b[16..18].copy_from_slice(&self.seg);
        b[18] = self.member;
        b[19] = self.flags;
        b[20..22].copy_from_slice(&self.count);
        b[22] = self.status;
        b[23] = self.exponent as u8;
        b[24..26].copy_from_slice(&self.enc_flags);
        b[26..30].copy_from_slice(&self.reserved);
        b
    }

    /// Reads a header from the start of `b`; `None` if `b` is shorter than a header.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_LEN {
            return None;
        }
        let a4 = |o: usize| [b[o], b[o + 1], b[o + 2], b[o + 3]];
        Some(Self {
            version: b[0],
            kind: b[1],
            op: b[2],
            dtype: b[3],
            jid: a4(4),
            mid: a4(8),
            sid: a4(12),
            seg: [b[16], b[17]],
            member: b[18],
            flags: b[19],
            count: [b[20], b[21]],
            status: b[22],
            exponent: b[23] as i8,
            enc_flags: [b[24], b[25]],
            reserved: a4(26),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h = Header::new(
            Kind::Contribution,
            Op::Sum,
            DType::I32,
            7,
            0x0102_0304,
            9,
            3,
            2,
            FLAG_EPOCH,
            256,
        );
        let b = h.to_bytes();
        assert_eq!(Header::from_bytes(&b), Some(h));
        assert_eq!(&b[4..8], &[0, 0, 0, 7]);
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(h.count(), 256);
        assert_eq!(h.epoch(), 1);
        assert_eq!(Header::from_bytes(&b[..29]), None);
    }

    #[test]
    fn decode_checks_lengths() {
        let h = Header::new(Kind::Result, Op::Sum, DType::I32, 1, 2, 3, 4, 0, 0, 3);
        let mut buf = [0u8; 64];
        let n = encode(&h, &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0], &mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 16);
        let p = decode(&buf[..n]).unwrap();
        assert_eq!((p.header, p.payload.len()), (h, 12));
        assert_eq!(decode(&buf[..n - 1]), Err(DecodeError::Length));
        assert_eq!(decode(&buf[..n + 8]), Err(DecodeError::Length));
        assert_eq!(decode(&buf[..10]), Err(DecodeError::Short));
        buf[0] = 2;
        assert_eq!(decode(&buf[..n]), Err(DecodeError::Version(2)));
    }

    #[test]
    fn padding() {
        assert_eq!(payload_len(1, 4), 8);
        assert_eq!(payload_len(2, 4), 8);
        assert_eq!(payload_len(3, 4), 16);
        assert_eq!(payload_len(862, 4), MAX_PAYLOAD);
        assert_eq!(DType::I32.max_elements(), 862);
    }
}
