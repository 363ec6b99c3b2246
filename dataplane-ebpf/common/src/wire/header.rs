//! The collective header's layout, its builder and its accessors.

use super::*;

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
    /// In a status reply: the copy's state or a refusal ([`status`]). In a contribution
    /// or result: the message's [`Collective`] (0, allreduce, in a status query).
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
    /// aggregation point (to a forwarded query). In a contribution or result: the
    /// segment's root, the member that owns its block or is the collective's root
    /// ([`Collective`]; 0 for allreduce). 0 otherwise.
    pub above: u8,
    /// In a packet of the exact float lane ([`Lane::Exact`]): every mantissa's magnitude is
    /// below 2^`magnitude` (0: all of them zero), so an aggregation point knows from the
    /// header alone whether the aligned sum fits its 64-bit lanes. Zero otherwise.
    pub magnitude: u8,
    /// The member's cookie (`docs/protocol.md#trust-model`): in a member's contribution and
    /// status query, a random number its process drew; in every result, status reply and
    /// refusal the switch sends a member, that member's latest. A worker takes nothing that
    /// lacks its own, so a stranger who never sees the member's packets cannot forge one.
    /// Zero in hellos and between aggregation points (which check addresses instead).
    cookie: [u8; 8],
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_LEN);
const _: () = assert!(core::mem::offset_of!(Header, job) == JOB_OFFSET);
const _: () = assert!(core::mem::offset_of!(Header, cookie) == COOKIE_OFFSET);
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
    /// Marks a message whose float sums travel in the exact lane ([`FLAG_EXACT`]).
    pub const fn float(mut self, float: Float) -> Self {
        self.0.flags = (self.0.flags & !FLAG_EXACT) | float.flags();
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
    pub const fn magnitude(mut self, magnitude: u8) -> Self {
        self.0.magnitude = magnitude;
        self
    }
    /// The message's collective and the segment's root (contributions and results).
    pub const fn collective(mut self, c: Collective, root: u8) -> Self {
        self.0.status = c as u8;
        self.0.above = root;
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
            magnitude: 0,
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
    /// In a status reply (bytes 23–24, the exponent's): the job's slot count where it was
    /// answered; 0 from a point that does not say.
    #[inline(always)]
    pub const fn job_slots(&self) -> u16 {
        u16::from_be_bytes(self.exponent)
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
    /// Whether the packet carries no payload ([`FLAG_HEADER_ONLY`]).
    #[inline(always)]
    pub const fn is_header_only(&self) -> bool {
        self.flags & FLAG_HEADER_ONLY != 0
    }
    /// A contribution's or result's collective, as the byte on the wire ([`Collective`]).
    #[inline(always)]
    pub const fn collective(&self) -> u8 {
        self.status
    }
    /// A contribution's or result's root member ([`Collective`]).
    #[inline(always)]
    pub const fn root(&self) -> u8 {
        self.above
    }

    /// Names the segment's root as the level the packet goes to knows it.
    #[inline(always)]
    pub const fn set_root(&mut self, root: u8) {
        self.above = root;
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
    pub const fn set_job_slots(&mut self, slots: u16) {
        self.exponent = slots.to_be_bytes();
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
        out[29] = self.magnitude;
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
            magnitude: b[29],
            cookie: [b[30], b[31], b[32], b[33], b[34], b[35], b[36], b[37]],
        })
    }
}
