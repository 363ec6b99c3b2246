//! The collective header carried in UDP. `docs/protocol.md` is the specification; this file
//! is its one implementation, used by the XDP programs and by the worker library.
//!
//! Header fields are big-endian (network byte order). Payload elements are little-endian:
//! workers and switches are little-endian machines, and this spares the switch a byte swap
//! per element.

/// Protocol version carried in every header.
pub const VERSION: u8 = 3;
/// Default UDP port the switch listens on (configurable per switch).
pub const DEFAULT_PORT: u16 = 47800;
/// Length of the collective header. Ethernet (14) + IPv4 (20) + UDP (8) + 38 = 80, so the
/// payload starts 8-byte aligned in the frame and the switch adds with aligned word loads.
pub const HEADER_LEN: usize = 38;
/// Where the job's wire id sits in the header (big-endian): a copy rewritten for another
/// point stores just these bytes.
pub const JOB_OFFSET: usize = 4;
const _: () = assert!(core::mem::offset_of!(Header, job) == JOB_OFFSET);
/// Where the member's cookie sits in the header: the switch writes each member's into its
/// copy of a result.
pub const COOKIE_OFFSET: usize = 30;
const _: () = assert!(core::mem::offset_of!(Header, cookie) == COOKIE_OFFSET);
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

impl core::str::FromStr for Op {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or(UnknownName::OP)
    }
}

impl core::fmt::Display for Op {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an op (or a data type): its message lists the valid ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownName {
    pub what: &'static str,
    pub valid: &'static str,
}

impl UnknownName {
    pub const OP: Self = Self {
        what: "op",
        valid: "sum, min, max, avg, prod, and, or, xor",
    };
    pub const DTYPE: Self = Self {
        what: "dtype",
        valid: "i32, u32, i64, f32, f16, bf16, f64",
    };
}

impl core::error::Error for UnknownName {}

impl core::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown {}: use one of {}", self.what, self.valid)
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
    F64 = 7,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::F64,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::I32),
            2 => Some(Self::U32),
            3 => Some(Self::I64),
            4 => Some(Self::F32),
            5 => Some(Self::F16),
            6 => Some(Self::Bf16),
            7 => Some(Self::F64),
            _ => None,
        }
    }

    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::F64 => 8,
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
            Self::F64 => "f64",
        }
    }

    /// Most elements of this type one segment can carry when each travels in `size()`
    /// bytes; see [`max_elements`] for a job's op.
    pub const fn max_elements(self) -> usize {
        MAX_PAYLOAD / self.size()
    }
}

impl core::str::FromStr for DType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or(UnknownName::DTYPE)
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
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
    /// The mean of i64: each element as two signed 64-bit lanes, its high 32 bits (signed)
    /// and its low 32 bits (unsigned), so the switch's wrapping sums of both are exact for
    /// any 64 members and the worker divides the 128-bit sum once.
    I64Split = 6,
    /// Block floating point of doubles: signed 64-bit mantissas scaled by 2^`exponent`.
    Bfp64 = 7,
    /// Order-preserving signed 64-bit keys of doubles (min and max): the switch takes the
    /// signed min or max, as of i64.
    Key64 = 8,
}

impl Lane {
    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I64 | Self::Bfp64 | Self::Key64 => 8,
            Self::I64Split => 16,
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
            6 => Some(Self::I64Split),
            7 => Some(Self::Bfp64),
            8 => Some(Self::Key64),
            _ => None,
        }
    }
}

/// The wire encoding of `op` over `dtype`, or `None` if the switch does not reduce it
/// (products and bitwise ops of floats).
pub const fn lane(op: Op, dtype: DType) -> Option<Lane> {
    match (op, dtype) {
        (Op::Avg, DType::I32 | DType::U32) => Some(Lane::I64),
        (Op::Avg, DType::I64) => Some(Lane::I64Split),
        (_, DType::I32) => Some(Lane::I32),
        (_, DType::U32) => Some(Lane::U32),
        (_, DType::I64) => Some(Lane::I64),
        (Op::Sum | Op::Avg, DType::F64) => Some(Lane::Bfp64),
        (Op::Min | Op::Max, DType::F64) => Some(Lane::Key64),
        (Op::Sum | Op::Avg, _) => Some(Lane::Bfp32),
        (Op::Min | Op::Max, _) => Some(Lane::Key32),
        _ => None,
    }
}

/// `enc_flags` bit: some member's segment held NaN or an infinity that the encoding cannot
/// carry; the switch keeps it sticky in the slot and returns it with the result.
pub const ENC_NONFINITE: u16 = 1 << 0;
/// `enc_flags` bit: reserved for an encoding whose sum can overflow (none now: the mean of
/// i64 travels in two lanes).
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

/// The collective header, 38 bytes, every multi-byte field big-endian. Fields are byte
/// arrays so the struct has alignment 1 and no padding; accessors convert. Build one with
/// [`Header::builder`]; the XDP programs edit headers in place with the setters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    /// Protocol version ([`VERSION`]).
    pub version: u8,
    pub kind: u8,
    pub op: u8,
    pub dtype: u8,
    job: [u8; 4],
    message: [u8; 4],
    segment: [u8; 4],
    slot: [u8; 2],
    /// The sender's member index at this aggregation point.
    pub member: u8,
    pub flags: u8,
    count: [u8; 2],
    pub status: u8,
    /// Per-packet exponent for block floating point (0 for other lanes): 16 bits, since a
    /// double's range spans about 2100 binary orders of magnitude.
    exponent: [u8; 2],
    enc_flags: [u8; 2],
    /// In a status query an inner level forwarded upward: 1 + the asking member's index at
    /// that level, echoed in the parent's reply, which the level hands back to that
    /// member. 0 otherwise.
    pub relay: u8,
    /// In a status reply: 1 when it is the answer of the level above the member's own
    /// aggregation point (to a forwarded query). 0 otherwise.
    pub above: u8,
    /// Must be zero when sent; ignored when received.
    reserved: u8,
    /// The member's cookie (`docs/protocol.md#trust-model`): in a member's contribution and
    /// status query, a random number its process drew; in every result, status reply and
    /// refusal the switch sends a member, that member's latest. A worker takes nothing that
    /// lacks its own, so a stranger who never sees the member's packets cannot forge one.
    /// Zero in hellos and between aggregation points (which check addresses instead).
    cookie: [u8; 8],
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);
const _: () = assert!(PAYLOAD_OFFSET.is_multiple_of(8));
const _: () = assert!(MAX_PAYLOAD.is_multiple_of(8));
const _: () = assert!(MAX_IP_PACKET <= 9000);
const _: () = assert!(20 + 8 + HEADER_LEN + BUFFER_PAYLOAD <= 3506);
const _: () = assert!(BUFFER_PAYLOAD.is_multiple_of(8));

/// Named-field construction of a [`Header`]: every field not set is zero, the version is
/// [`VERSION`], the status ok.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Builder(Header);

impl Builder {
    pub const fn op(mut self, op: Op) -> Self {
        self.0.op = op as u8;
        self
    }
    pub const fn dtype(mut self, dtype: DType) -> Self {
        self.0.dtype = dtype as u8;
        self
    }
    pub const fn job(mut self, job: u32) -> Self {
        self.0.job = job.to_be_bytes();
        self
    }
    pub const fn message(mut self, message: u32) -> Self {
        self.0.message = message.to_be_bytes();
        self
    }
    pub const fn segment(mut self, segment: u32) -> Self {
        self.0.segment = segment.to_be_bytes();
        self
    }
    pub const fn slot(mut self, slot: u16) -> Self {
        self.0.slot = slot.to_be_bytes();
        self
    }
    pub const fn member(mut self, member: u8) -> Self {
        self.0.member = member;
        self
    }
    /// Which of the slot's two shadow copies (0 or 1) the segment uses.
    pub const fn shadow(mut self, shadow: u8) -> Self {
        self.0.set_shadow(shadow);
        self
    }
    /// Marks the last segment of a message.
    pub const fn last(mut self, last: bool) -> Self {
        if last {
            self.0.flags |= FLAG_LAST;
        } else {
            self.0.flags &= !FLAG_LAST;
        }
        self
    }
    /// The flags byte as it is ([`FLAG_SHADOW`], [`FLAG_LAST`]).
    pub const fn flags(mut self, flags: u8) -> Self {
        self.0.flags = flags;
        self
    }
    pub const fn count(mut self, count: u16) -> Self {
        self.0.count = count.to_be_bytes();
        self
    }
    pub const fn exponent(mut self, exponent: i16) -> Self {
        self.0.exponent = exponent.to_be_bytes();
        self
    }
    pub const fn enc_flags(mut self, flags: u16) -> Self {
        self.0.enc_flags = flags.to_be_bytes();
        self
    }
    pub const fn cookie(mut self, cookie: u64) -> Self {
        self.0.cookie = cookie.to_be_bytes();
        self
    }
    pub const fn build(self) -> Header {
        self.0
    }
}

impl Header {
    /// A header of `kind`, its other fields set by name.
    pub const fn builder(kind: Kind) -> Builder {
        Builder(Header {
            version: VERSION,
            kind: kind as u8,
            op: 0,
            dtype: 0,
            job: [0; 4],
            message: [0; 4],
            segment: [0; 4],
            slot: [0; 2],
            member: 0,
            flags: 0,
            count: [0; 2],
            status: status::OK,
            exponent: [0; 2],
            enc_flags: [0; 2],
            relay: 0,
            above: 0,
            reserved: 0,
            cookie: [0; 8],
        })
    }

    /// The job id.
    #[inline(always)]
    pub const fn job(&self) -> u32 {
        u32::from_be_bytes(self.job)
    }
    /// The message id: one allreduce call of the job.
    #[inline(always)]
    pub const fn message(&self) -> u32 {
        u32::from_be_bytes(self.message)
    }
    /// The segment's index within its message.
    #[inline(always)]
    pub const fn segment(&self) -> u32 {
        u32::from_be_bytes(self.segment)
    }
    /// The slot, relative to the job's slot range.
    #[inline(always)]
    pub const fn slot(&self) -> u16 {
        u16::from_be_bytes(self.slot)
    }
    /// Elements in the packet.
    #[inline(always)]
    pub const fn count(&self) -> u16 {
        u16::from_be_bytes(self.count)
    }
    /// The block exponent (block floating point lanes).
    #[inline(always)]
    pub const fn exponent(&self) -> i16 {
        i16::from_be_bytes(self.exponent)
    }
    #[inline(always)]
    pub const fn enc_flags(&self) -> u16 {
        u16::from_be_bytes(self.enc_flags)
    }
    /// The member's cookie, as the bytes on the wire (compared as they are).
    #[inline(always)]
    pub const fn cookie(&self) -> [u8; 8] {
        self.cookie
    }
    /// Which of the slot's two shadow copies (0 or 1) the segment uses.
    #[inline(always)]
    pub const fn shadow(&self) -> usize {
        (self.flags & FLAG_SHADOW) as usize
    }
    #[inline(always)]
    pub const fn is_last(&self) -> bool {
        self.flags & FLAG_LAST != 0
    }

    #[inline(always)]
    pub const fn set_kind(&mut self, kind: Kind) {
        self.kind = kind as u8;
    }
    #[inline(always)]
    pub const fn set_job(&mut self, job: u32) {
        self.job = job.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_slot(&mut self, slot: u16) {
        self.slot = slot.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_message(&mut self, message: u32) {
        self.message = message.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_segment(&mut self, segment: u32) {
        self.segment = segment.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_count(&mut self, count: u16) {
        self.count = count.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_exponent(&mut self, exponent: i16) {
        self.exponent = exponent.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_enc_flags(&mut self, flags: u16) {
        self.enc_flags = flags.to_be_bytes();
    }
    #[inline(always)]
    pub const fn set_cookie(&mut self, cookie: [u8; 8]) {
        self.cookie = cookie;
    }
    #[inline(always)]
    pub const fn set_shadow(&mut self, shadow: u8) {
        self.flags = (self.flags & !FLAG_SHADOW) | (shadow & FLAG_SHADOW);
    }

    /// The header as it goes on the wire.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.write(&mut b);
        b
    }

    /// Writes the header as it goes on the wire into `out`.
    pub fn write(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = self.version;
        out[1] = self.kind;
        out[2] = self.op;
        out[3] = self.dtype;
        out[4..8].copy_from_slice(&self.job);
        out[8..12].copy_from_slice(&self.message);
        out[12..16].copy_from_slice(&self.segment);
        out[16..18].copy_from_slice(&self.slot);
        out[18] = self.member;
        out[19] = self.flags;
        out[20..22].copy_from_slice(&self.count);
        out[22] = self.status;
        out[23..25].copy_from_slice(&self.exponent);
        out[25..27].copy_from_slice(&self.enc_flags);
        out[27] = self.relay;
        out[28] = self.above;
        out[29] = self.reserved;
        out[30..38].copy_from_slice(&self.cookie);
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
            job: a4(4),
            message: a4(8),
            segment: a4(12),
            slot: [b[16], b[17]],
            member: b[18],
            flags: b[19],
            count: [b[20], b[21]],
            status: b[22],
            exponent: [b[23], b[24]],
            enc_flags: [b[25], b[26]],
            relay: b[27],
            above: b[28],
            reserved: b[29],
            cookie: [b[30], b[31], b[32], b[33], b[34], b[35], b[36], b[37]],
        })
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
