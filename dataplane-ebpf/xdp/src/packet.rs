//! Parsing and rewriting of frames: one parser of Ethernet / IPv4 / UDP over `(data,
//! data_end)` for every program (XDP and tc alike), and the rewrites that turn a
//! contribution into a result or a status reply. Each bounds check sits next to the reads
//! it guards; no other file reads packet bytes at fixed offsets.

use aya_ebpf::{helpers::bpf_xdp_adjust_tail, programs::XdpContext};
use network_types::{eth::EthHdr, ip::Ipv4Hdr, udp::UdpHdr};
use xagg_common::{
    counter::MAX_TAGS,
    job::{Job, MemberAddr, SwitchConfig},
    wire::{
        Header, Kind, FLAG_BACKWARD, FLAG_HEADER_ONLY, FLAG_PENDING, HEADER_LEN, MAX_IP_PACKET,
        MAX_PAYLOAD, PAYLOAD_OFFSET,
    },
    Counter,
};

use crate::slot::{Status, Stored};

const ETH_P_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
const IP_OFF: usize = EthHdr::LEN;
const UDP_OFF: usize = IP_OFF + Ipv4Hdr::LEN;
const HDR_OFF: usize = UDP_OFF + UdpHdr::LEN;
const _: () = assert!(HDR_OFF + HEADER_LEN == PAYLOAD_OFFSET);
/// Ethernet, IPv4 (without options) and UDP headers: what addressing a frame rewrites.
pub const HEADERS_LEN: usize = HDR_OFF;
/// Payload of a status query and its reply: the shadow copy's member bitmap and the job's.
pub const STATUS_LEN: usize = 16;

/// Who sent the frame at `data..end`, as far as it shows: its source MAC, and its source
/// IPv4 address and UDP port when it is a plain IPv4/UDP datagram (zeros otherwise).
#[inline(always)]
pub fn source(data: usize, end: usize, ifindex: u32) -> MemberAddr {
    let mut a = MemberAddr {
        ifindex,
        ip: [0; 4],
        mac: [0; 6],
        port: [0; 2],
    };
    if data + EthHdr::LEN <= end {
        a.mac = unsafe { &*(data as *const EthHdr) }.src_addr;
    }
    if let Some(f) = Udp4::parse(data, end) {
        a.ip = f.ip().src_addr;
        if f.plain() {
            a.port = f.udp().src;
        }
    }
    a
}

/// An IPv4/UDP frame, checked to hold Ethernet, a 20-byte IPv4 header and a UDP header.
/// With IPv4 options the UDP header is elsewhere: [`Udp4::plain`] says whether the one
/// here is real.
pub struct Udp4 {
    data: usize,
    end: usize,
}

impl Udp4 {
    /// The frame at `data..end`, if it is IPv4 carrying UDP; `None` for anything else.
    #[inline(always)]
    pub fn parse(data: usize, end: usize) -> Option<Self> {
        if data + HDR_OFF > end {
            return None;
        }
        let f = Self { data, end };
        (f.eth().ether_type == ETH_P_IPV4.to_be() && f.ip().proto == IPPROTO_UDP).then_some(f)
    }

    #[inline(always)]
    pub fn eth(&self) -> &EthHdr {
        unsafe { &*(self.data as *const EthHdr) }
    }

    #[inline(always)]
    pub fn ip(&self) -> &Ipv4Hdr {
        unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) }
    }

    /// The UDP header, where it is when the IPv4 header has no options.
    #[inline(always)]
    pub fn udp(&self) -> &UdpHdr {
        unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) }
    }

    /// Whether the IPv4 header has no options: the UDP header is at its usual place.
    #[inline(always)]
    pub fn plain(&self) -> bool {
        self.ip().vihl == 0x45
    }

    /// The fragment offset: not zero for every fragment but the first, which alone
    /// carries the UDP header.
    #[inline(always)]
    pub fn fragment_offset(&self) -> u16 {
        u16::from_be_bytes(self.ip().frags) & 0x1fff
    }

    /// Whether more fragments follow (the first of a fragmented datagram, or a middle one).
    #[inline(always)]
    pub fn more_fragments(&self) -> bool {
        self.ip().frags[0] & 0x20 != 0
    }

    /// The UDP destination port behind the IPv4 header and its options, if the frame
    /// holds it.
    #[inline(always)]
    pub fn dst_port(&self) -> Option<[u8; 2]> {
        // IHL is 4 bits: the offset stays within 14 + 60 bytes, which the verifier can see.
        let at = self.data + IP_OFF + ((self.ip().vihl & 0x0f) as usize) * 4;
        if at + 4 > self.end {
            return None;
        }
        Some(unsafe { *((at + 2) as *const [u8; 2]) })
    }

    /// Whether the IPv4 header (without options) adds up to its checksum.
    #[inline(always)]
    pub fn ip_checksum_ok(&self) -> bool {
        checksum_fold(self.data + IP_OFF) == 0xffff
    }

    /// The frame's start, checked to hold Ethernet, IPv4 and UDP headers.
    #[inline(always)]
    pub fn data(&self) -> usize {
        self.data
    }

    /// Names job `id` in the header (checked present), for a copy going to a point that
    /// numbers the job so.
    #[inline(always)]
    pub fn set_job(&self, id: u32) {
        if self.data + PAYLOAD_OFFSET <= self.end {
            unsafe { &mut *((self.data + HDR_OFF) as *mut Header) }.set_job(id);
        }
    }

    /// Writes `cookie` in the header (checked present): the member's, for its copy of a
    /// result; zeros for a copy to another aggregation point.
    #[inline(always)]
    pub fn set_cookie(&self, cookie: [u8; 8]) {
        if self.data + PAYLOAD_OFFSET <= self.end {
            unsafe { &mut *((self.data + HDR_OFF) as *mut Header) }.set_cookie(cookie);
        }
    }

    /// The collective header, if the frame is long enough to hold one after the UDP header.
    #[inline(always)]
    pub fn header(&self) -> Option<&Header> {
        if self.data + PAYLOAD_OFFSET > self.end {
            return None;
        }
        Some(unsafe { &*((self.data + HDR_OFF) as *const Header) })
    }
}

/// A frame addressed to the switch's collective port, checked up to the end of the
/// collective header and against its UDP length.
pub struct Frame {
    data: usize,
    udp_len: usize,
    /// Whether the datagram goes on past the frame's first buffer (reached only by copies).
    multi: bool,
}

impl Frame {
    /// `Ok(None)`: not for us, pass it on. `Err`: addressed to the collective port but
    /// malformed, drop it. Only a datagram to the collective port is judged: the port is
    /// read first, behind any IPv4 options, and every fragment but a first one passes.
    #[inline(always)]
    pub fn collective(
        data: usize,
        end: usize,
        frame_len: impl FnOnce() -> usize,
        cfg: &SwitchConfig,
    ) -> Result<Option<Self>, Counter> {
        let Some(udp4) = Udp4::parse(data, end) else {
            return Ok(None);
        };
        if udp4.ip().dst_addr != cfg.ip || udp4.fragment_offset() != 0 {
            return Ok(None);
        }
        if !udp4.dst_port().is_some_and(|p| cfg.takes_port(p)) {
            return Ok(None);
        }
        // Ours. `frame_len` counts every buffer of a multi-buffer frame (asked only for our
        // datagrams); the headers are always in the first.
        let total = frame_len();
        if total > IP_OFF + MAX_IP_PACKET {
            return Err(Counter::DropOversize);
        }
        // A collective sender never uses IPv4 options or fragments.
        if !udp4.plain() || udp4.more_fragments() {
            return Err(Counter::DropBadIp);
        }
        if !udp4.ip_checksum_ok() {
            return Err(Counter::DropBadChecksum);
        }
        if udp4.header().is_none() {
            return Err(Counter::DropTruncated);
        }
        // The frame, the IPv4 total length and the UDP length must agree: a shorter frame
        // was truncated, a longer one padded.
        let ip_len = u16::from_be_bytes(udp4.ip().tot_len) as usize;
        if IP_OFF + ip_len > total {
            return Err(Counter::DropTruncated);
        }
        let udp_len = u16::from_be_bytes(udp4.udp().len) as usize;
        if IP_OFF + ip_len != total || udp_len != ip_len - Ipv4Hdr::LEN {
            return Err(Counter::DropBadLength);
        }
        if udp_len < UdpHdr::LEN + HEADER_LEN {
            return Err(Counter::DropTruncated);
        }
        Ok(Some(Self {
            data,
            udp_len,
            multi: total > end - data,
        }))
    }

    /// The frame [`Frame::collective`] accepted, found again after a tail call (`None` only
    /// if it is not that frame).
    #[inline(always)]
    pub fn again(data: usize, end: usize, multi: bool) -> Option<Self> {
        let f = Udp4::parse(data, end)?;
        f.header()?;
        let udp_len = u16::from_be_bytes(f.udp().len) as usize;
        Some(Self {
            data,
            udp_len,
            multi,
        })
    }

    /// Whether the payload goes on past the frame's first buffer.
    #[inline(always)]
    pub fn multi(&self) -> bool {
        self.multi
    }

    #[inline(always)]
    pub fn header(&self) -> &Header {
        unsafe { &*((self.data + HDR_OFF) as *const Header) }
    }

    #[inline(always)]
    #[expect(
        clippy::mut_from_ref,
        reason = "the header lives in the packet, not in the view"
    )]
    fn header_mut(&self) -> &mut Header {
        unsafe { &mut *((self.data + HDR_OFF) as *mut Header) }
    }

    /// Payload bytes after the collective header, per the UDP length.
    #[inline(always)]
    pub fn payload_len(&self) -> usize {
        self.udp_len - UdpHdr::LEN - HEADER_LEN
    }

    /// The port it came in on and its source addresses, as a member's are recorded.
    #[inline(always)]
    pub fn sender(&self, ifindex: u32) -> MemberAddr {
        let eth = unsafe { &*(self.data as *const EthHdr) };
        let ip = unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) };
        let udp = unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) };
        MemberAddr {
            ifindex,
            ip: ip.src_addr,
            mac: eth.src_addr,
            port: udp.src,
        }
    }

    /// Whether the frame's source addresses are the member's.
    #[inline(always)]
    pub fn from(&self, m: &MemberAddr) -> bool {
        let eth = unsafe { &*(self.data as *const EthHdr) };
        let ip = unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) };
        let udp = unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) };
        eth.src_addr == m.mac && ip.src_addr == m.ip && udp.src == m.port
    }

    /// Turns the contribution whose payload now holds its round's result into that
    /// result: the kind, the stored block exponent and flags. Its addresses are written
    /// once: from the switch, to each member by `xagg_result` for a broadcast, or back to
    /// the sender by [`Frame::to_sender`].
    #[inline(always)]
    pub fn into_result(&self, stored: &Stored) {
        let hdr = self.header_mut();
        hdr.set_kind(Kind::Result);
        hdr.set_exponent(stored.exponent as i16);
        hdr.set_enc_flags(stored.flags as u16);
        hdr.magnitude = stored.magnitude;
    }

    /// Turns the contribution whose payload now holds its round's partial (at an inner
    /// level) into this aggregation point's contribution to the parent: the job's wire id
    /// and member index there, the stored block exponent and flags, from this point to the
    /// parent. Slot, shadow bit, message, segment and count pass through unchanged.
    #[inline(always)]
    pub fn into_partial(&self, job: &Job, stored: &Stored, cfg: &SwitchConfig) {
        let hdr = self.header_mut();
        hdr.set_job(job.parent_job);
        hdr.member = job.parent_member;
        // The segment's root as the parent knows it, which the ranks named in `relay`
        // (0 for allreduce: checked there).
        hdr.set_root(hdr.relay);
        hdr.relay = 0;
        hdr.set_exponent(stored.exponent as i16);
        hdr.set_enc_flags(stored.flags as u16);
        hdr.magnitude = stored.magnitude;
        // The completing member's cookie is its own: it does not leave the level.
        hdr.set_cookie([0; 8]);
        from_switch(self.data, cfg);
        address_to(self.data, &job.parent, cfg);
    }

    /// Turns member `asker`'s status query, for a round this inner level waits on its
    /// parent for, into this level's query to the parent: the parent's job id and this
    /// level's member index there, the asker remembered in `relay`.
    #[inline(always)]
    pub fn into_forwarded_query(&self, job: &Job, asker: u8, cfg: &SwitchConfig) {
        let hdr = self.header_mut();
        hdr.set_job(job.parent_job);
        hdr.member = job.parent_member;
        hdr.relay = asker + 1;
        // The asker's cookie stays here: its answer gets it back on the way down.
        hdr.set_cookie([0; 8]);
        from_switch(self.data, cfg);
        address_to(self.data, &job.parent, cfg);
    }

    /// Turns the parent's reply to a forwarded query into member `asker`'s answer: its
    /// job's id here (`job`), marked as the level above's, with the asker's `cookie`, from
    /// this level to `to`.
    #[inline(always)]
    pub fn into_relayed_reply(
        &self,
        job: u32,
        asker: u8,
        cookie: [u8; 8],
        to: &MemberAddr,
        cfg: &SwitchConfig,
    ) {
        let hdr = self.header_mut();
        hdr.set_job(job);
        hdr.member = asker;
        hdr.relay = 0;
        hdr.above = 1;
        hdr.set_cookie(cookie);
        from_switch(self.data, cfg);
        address_to(self.data, to, cfg);
    }

    /// Names job `id` in the header: the id of the point the frame goes to.
    #[inline(always)]
    pub fn set_job(&self, id: u32) {
        self.header_mut().set_job(id);
    }

    /// Names the segment's root as the point the frame goes to knows it.
    #[inline(always)]
    pub fn set_root(&self, root: u8) {
        self.header_mut().set_root(root);
    }

    /// Marks a ring result as passed back along the chain (`FLAG_BACKWARD`), or not.
    #[inline(always)]
    pub fn set_backward(&self, back: bool) {
        let hdr = self.header_mut();
        hdr.flags &= !FLAG_BACKWARD;
        if back {
            hdr.flags |= FLAG_BACKWARD;
        }
    }

    /// Marks a gather's data sent before its round completes (`FLAG_PENDING`), or not.
    #[inline(always)]
    pub fn set_pending(&self, pending: bool) {
        let hdr = self.header_mut();
        hdr.flags &= !FLAG_PENDING;
        if pending {
            hdr.flags |= FLAG_PENDING;
        }
    }

    /// Makes the packet come from the switch (see [`from_switch`]); its link addresses and
    /// destination are written per copy by `xagg_result`.
    #[inline(always)]
    pub fn from_switch(&self, cfg: &SwitchConfig) {
        from_switch(self.data, cfg);
    }

    /// Turns a status query the switch does not take into a reply carrying why (`code`, a
    /// `wire::status` refusal).
    #[inline(always)]
    pub fn into_refusal(&self, code: u8) {
        let hdr = self.header_mut();
        hdr.set_kind(Kind::StatusReply);
        hdr.status = code;
    }

    /// Turns a status query into its reply: the header carries the copy's round (message,
    /// segment, `count`) and state (`status`) and the job's slot count (so a member with
    /// another window learns it before its first round), the payload the members already
    /// in (`seen`) and all the job's members, little-endian. `false` if the frame is too
    /// short (the caller checked the UDP length: it is not).
    #[inline(always)]
    pub fn into_status_reply(&self, ctx: &XdpContext, st: &Status, job: &Job) -> bool {
        // Derived again so the verifier sees this write checked against data_end.
        let p = ctx.data() + PAYLOAD_OFFSET;
        if p + STATUS_LEN > ctx.data_end() {
            return false;
        }
        unsafe {
            *(p as *mut [u8; 8]) = st.seen.to_le_bytes();
            *((p + 8) as *mut [u8; 8]) = job.members.to_le_bytes();
        }
        let hdr = self.header_mut();
        hdr.set_kind(Kind::StatusReply);
        hdr.set_message(st.message);
        hdr.set_segment(st.segment);
        hdr.set_count(st.count as u16);
        hdr.status = st.state as u8;
        hdr.set_enc_flags(st.flags as u16);
        hdr.set_job_slots(job.slot_count as u16);
        true
    }

    /// Readdresses the frame from the switch back to the member that sent it (the caller
    /// checked its source addresses are the member's), to go out of the port it came in on.
    #[inline(always)]
    pub fn to_sender(&self, cfg: &SwitchConfig) {
        let eth = unsafe { &*(self.data as *const EthHdr) };
        let ip = unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) };
        let udp = unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) };
        let sender = MemberAddr {
            ifindex: 0,
            ip: ip.src_addr,
            mac: eth.src_addr,
            port: udp.src,
        };
        from_switch(self.data, cfg);
        address_to(self.data, &sender, cfg);
    }
}

/// Cuts the collective frame in `ctx` (its headers checked) to its headers: `payload`
/// bytes off its end, the IPv4 and UDP lengths set to match and the header marked
/// `FLAG_HEADER_ONLY`. The IPv4 checksum is left to the addressing that follows
/// ([`address_to`]). What a member that does not get a round's data is sent.
#[inline(always)]
pub fn header_only(ctx: &XdpContext, payload: usize) -> Result<Frame, Counter> {
    if payload > MAX_PAYLOAD {
        return Err(Counter::DropBadLength);
    }
    if payload != 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, -(payload as i32)) } != 0 {
        return Err(Counter::DropTruncated);
    }
    let frame = Frame::again(ctx.data(), ctx.data_end(), false).ok_or(Counter::DropTruncated)?;
    let ip = unsafe { &mut *((frame.data + IP_OFF) as *mut Ipv4Hdr) };
    ip.tot_len = ((Ipv4Hdr::LEN + UdpHdr::LEN + HEADER_LEN) as u16).to_be_bytes();
    let udp = unsafe { &mut *((frame.data + UDP_OFF) as *mut UdpHdr) };
    udp.len = ((UdpHdr::LEN + HEADER_LEN) as u16).to_be_bytes();
    frame.header_mut().flags |= FLAG_HEADER_ONLY;
    Ok(Frame {
        udp_len: UdpHdr::LEN + HEADER_LEN,
        ..frame
    })
}

/// Makes the IPv4 packet at `data` (checked to hold Ethernet, IPv4 and UDP headers) come
/// from the switch: its IPv4 address and collective port. The receivers' martian check
/// needs it (the completing member's own copy included).
#[inline(always)]
pub fn from_switch(data: usize, cfg: &SwitchConfig) {
    unsafe { &mut *((data + IP_OFF) as *mut Ipv4Hdr) }.src_addr = cfg.ip;
    unsafe { &mut *((data + UDP_OFF) as *mut UdpHdr) }.src = cfg.port;
}

/// Addresses the frame at `data` (checked to hold Ethernet, IPv4 and UDP headers, and
/// already [`from_switch`]) to `m` on the link from the switch's MAC, with a fresh IPv4
/// checksum and no UDP checksum.
#[inline(always)]
pub fn address_to(data: usize, m: &MemberAddr, cfg: &SwitchConfig) {
    let eth = unsafe { &mut *(data as *mut EthHdr) };
    eth.dst_addr = m.mac;
    eth.src_addr = cfg.mac;
    let ip = unsafe { &mut *((data + IP_OFF) as *mut Ipv4Hdr) };
    ip.dst_addr = m.ip;
    ip.check = [0, 0];
    ip.check = ipv4_checksum(data + IP_OFF).to_be_bytes();
    let udp = unsafe { &mut *((data + UDP_OFF) as *mut UdpHdr) };
    udp.dst = m.port;
    // Zero means "no checksum" in IPv4; recomputing it over the payload would cost as much
    // as the aggregation itself.
    udp.check = [0, 0];
}

/// The ones' complement sum of the 20-byte IPv4 header at `ip`, folded to 16 bits: 0xffff
/// for a header with a valid checksum.
#[inline(always)]
fn checksum_fold(ip: usize) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < Ipv4Hdr::LEN {
        let b = unsafe { *((ip + i) as *const [u8; 2]) };
        sum += u16::from_be_bytes(b) as u32;
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Internet checksum of a 20-byte IPv4 header whose checksum field is zero.
#[inline(always)]
fn ipv4_checksum(ip: usize) -> u16 {
    !checksum_fold(ip)
}

/// Why a frame entering a switch port must go no further, if it must not:
/// - it claims to come from the switch — its MAC as the Ethernet source, or its IPv4
///   address as the source of an IPv4 packet or the sender of an ARP message — untagged or
///   behind up to [`MAX_TAGS`] VLAN tags (802.1Q, 802.1ad and the older 0x9100 outer tag;
///   Linux takes a priority tag, VLAN 0, as untagged). The switch sends from those itself,
///   and never into its own ports, so such a frame is forged: a result or refusal with the
///   switch as its source, or ARP poisoning for its address (`DropSpoofedSource`);
/// - it is tagged and addressed to the collective port (or is a later fragment to the
///   switch's address, whose port does not show): members send untagged, and the
///   collective programs read untagged frames only (`DropTagged`);
/// - it has more tags than the switch reads, so where it comes from does not show
///   (`DropTagged`).
#[inline(always)]
pub fn screen(data: usize, end: usize, cfg: &SwitchConfig) -> Option<Counter> {
    const ETH_P_ARP: u16 = 0x0806;
    const ETH_P_8021Q: u16 = 0x8100;
    const ETH_P_8021AD: u16 = 0x88a8;
    const ETH_P_QINQ: u16 = 0x9100;
    if data + EthHdr::LEN > end {
        return None;
    }
    if unsafe { &*(data as *const EthHdr) }.src_addr == cfg.mac {
        return Some(Counter::DropSpoofedSource);
    }
    // The EtherType after the addresses, and after each tag (4 bytes: the type, then the
    // tag's priority and VLAN id).
    let mut at = data + 12;
    let mut tags = 0;
    let mut ether_type = 0;
    while tags <= MAX_TAGS {
        if at + 2 > end {
            return None;
        }
        ether_type = u16::from_be_bytes(unsafe { *(at as *const [u8; 2]) });
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD && ether_type != ETH_P_QINQ {
            break;
        }
        at += 4;
        tags += 1;
    }
    if tags > MAX_TAGS {
        return Some(Counter::DropTagged);
    }
    let l3 = at + 2;
    if ether_type == ETH_P_ARP {
        // The sender's protocol address: 8 bytes of ARP, then the sender's MAC.
        let spa = l3 + 8 + 6;
        if spa + 4 <= end && unsafe { *(spa as *const [u8; 4]) } == cfg.ip {
            return Some(Counter::DropSpoofedSource);
        }
        return None;
    }
    if ether_type != ETH_P_IPV4 || l3 + Ipv4Hdr::LEN > end {
        return None;
    }
    let ip = unsafe { &*(l3 as *const Ipv4Hdr) };
    if ip.src_addr == cfg.ip {
        return Some(Counter::DropSpoofedSource);
    }
    if tags == 0 || ip.dst_addr != cfg.ip || ip.proto != IPPROTO_UDP {
        return None;
    }
    if u16::from_be_bytes(ip.frags) & 0x1fff != 0 {
        return Some(Counter::DropTagged);
    }
    // IHL is 4 bits: the port sits within 60 + 4 bytes of the IPv4 header.
    let port = l3 + ((ip.vihl & 0x0f) as usize) * 4 + 2;
    if port + 2 > end || cfg.takes_port(unsafe { *(port as *const [u8; 2]) }) {
        return Some(Counter::DropTagged);
    }
    None
}
