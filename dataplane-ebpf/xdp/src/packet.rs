//! Parsing and rewriting of collective frames: Ethernet / IPv4 / UDP / collective header.
//! Each bounds check sits next to the read it guards.

use aya_ebpf::programs::XdpContext;
use network_types::{eth::EthHdr, ip::Ipv4Hdr, udp::UdpHdr};
use xagg_common::{
    job::{MemberAddr, SwitchConfig},
    wire::{Header, Kind, HEADER_LEN, PAYLOAD_OFFSET},
    Counter,
};

use crate::slot::{Status, Stored};

const ETH_P_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
const IP_OFF: usize = EthHdr::LEN;
const UDP_OFF: usize = IP_OFF + Ipv4Hdr::LEN;
const HDR_OFF: usize = UDP_OFF + UdpHdr::LEN;
/// Payload of a status query and its reply: the shadow copy's member bitmap and the job's.
pub const STATUS_LEN: usize = 16;

/// A frame addressed to the switch's collective port, checked up to the end of the
/// collective header.
pub struct Frame {
    data: usize,
    udp_len: usize,
}

impl Frame {
    /// `Ok(None)`: not for us, pass it on. `Err`: addressed to the collective port but
    /// malformed, drop it.
    #[inline(always)]
    pub fn collective(ctx: &XdpContext, cfg: &SwitchConfig) -> Result<Option<Self>, Counter> {
        let data = ctx.data();
        let end = ctx.data_end();
        if data + HDR_OFF > end {
            return Ok(None);
        }
        let eth = unsafe { &*(data as *const EthHdr) };
        if eth.ether_type != ETH_P_IPV4.to_be() {
            return Ok(None);
        }
        let ip = unsafe { &*((data + IP_OFF) as *const Ipv4Hdr) };
        if ip.proto != IPPROTO_UDP || ip.dst_addr != cfg.ip {
            return Ok(None);
        }
        // With options the UDP header is elsewhere; a collective sender never uses them.
        if ip.vihl != 0x45 {
            return Err(Counter::DropBadIp);
        }
        let udp = unsafe { &*((data + UDP_OFF) as *const UdpHdr) };
        if udp.dst != cfg.port {
            return Ok(None);
        }
        // A fragment (MF set or an offset) carries only part of a segment.
        if ip.frags[0] & 0x3f != 0 || ip.frags[1] != 0 {
            return Err(Counter::DropBadIp);
        }
        if data + PAYLOAD_OFFSET > end {
            return Err(Counter::DropTruncated);
        }
        let udp_len = u16::from_be_bytes(udp.len) as usize;
        if udp_len < UdpHdr::LEN + HEADER_LEN || data + UDP_OFF + udp_len > end {
            return Err(Counter::DropTruncated);
        }
        Ok(Some(Self { data, udp_len }))
    }

    #[inline(always)]
    pub fn header(&self) -> &Header {
        unsafe { &*((self.data + HDR_OFF) as *const Header) }
    }

    /// Payload bytes after the collective header, per the UDP length.
    #[inline(always)]
    pub fn payload_len(&self) -> usize {
        self.udp_len - UdpHdr::LEN - HEADER_LEN
    }

    /// Whether the frame's source addresses are the member's.
    #[inline(always)]
    pub fn from(&self, m: &MemberAddr) -> bool {
        let eth = unsafe { &*(self.data as *const EthHdr) };
        let ip = unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) };
        let udp = unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) };
        eth.src_addr == m.mac && ip.src_addr == m.ip && udp.src == m.port
    }

    /// Turns the completing contribution (whose payload now holds the result) into the
    /// result: it comes from the switch, so each member's copy passes the receiver's
    /// martian check — the completing member's own copy included. The egress program fills
    /// in each copy's destination.
    #[inline(always)]
    pub fn make_result(&self, cfg: &SwitchConfig, stored: &Stored) {
        self.result_header(stored);
        let ip = unsafe { &mut *((self.data + IP_OFF) as *mut Ipv4Hdr) };
        ip.src_addr = cfg.ip;
        let udp = unsafe { &mut *((self.data + UDP_OFF) as *mut UdpHdr) };
        udp.src = cfg.port;
    }

    /// Marks the frame a result and gives it the stored block exponent and flags.
    #[inline(always)]
    pub fn result_header(&self, stored: &Stored) {
        let hdr = unsafe { &mut *((self.data + HDR_OFF) as *mut Header) };
        hdr.set_kind(Kind::Result);
        hdr.exponent = stored.exponent as i8;
        hdr.set_enc_flags(stored.flags as u16);
    }

    /// Turns a retransmitted contribution (whose payload now holds the stored result) into
    /// the result for its sender alone, sent back out of the port it came in on.
    #[inline(always)]
    pub fn make_reply(&self, cfg: &SwitchConfig) {
        let eth = unsafe { &*(self.data as *const EthHdr) };
        let ip = unsafe { &*((self.data + IP_OFF) as *const Ipv4Hdr) };
        let udp = unsafe { &*((self.data + UDP_OFF) as *const UdpHdr) };
        let sender = MemberAddr {
            ifindex: 0,
            ip: ip.src_addr,
            mac: eth.src_addr,
            port: udp.src,
        };
        let hdr = unsafe { &mut *((self.data + HDR_OFF) as *mut Header) };
        hdr.set_kind(Kind::Result);
        address_to(self.data, &sender, cfg);
    }
}

impl Frame {
    /// Turns a status query into its reply, back to the sender: the header carries the
    /// copy's round (message, segment, `count`) and state (`status`), the payload the
    /// members already in (`seen`) and all the job's members, little-endian.
    #[inline(always)]
    pub fn make_status_reply(
        &self,
        ctx: &XdpContext,
        cfg: &SwitchConfig,
        st: &Status,
        members: u64,
    ) {
        let p = ctx.data() + PAYLOAD_OFFSET;
        if p + STATUS_LEN > ctx.data_end() {
            return;
        }
        unsafe {
            *(p as *mut [u8; 8]) = st.seen.to_le_bytes();
            *((p + 8) as *mut [u8; 8]) = members.to_le_bytes();
        }
        let hdr = unsafe { &mut *((self.data + HDR_OFF) as *mut Header) };
        hdr.set_message(st.message);
        hdr.set_segment(st.segment);
        hdr.set_count(st.count as u16);
        hdr.status = st.state as u8;
        self.make_reply(cfg);
        let hdr = unsafe { &mut *((self.data + HDR_OFF) as *mut Header) };
        hdr.set_kind(Kind::StatusReply);
    }
}

/// The UDP destination port (network order) of an unfragmented IPv4/UDP frame without
/// IP options; `None` for anything else.
#[inline(always)]
pub fn udp_dst_port(ctx: &XdpContext) -> Option<[u8; 2]> {
    let data = ctx.data();
    if data + HDR_OFF > ctx.data_end() {
        return None;
    }
    let eth = unsafe { &*(data as *const EthHdr) };
    let ip = unsafe { &*((data + IP_OFF) as *const Ipv4Hdr) };
    if eth.ether_type != ETH_P_IPV4.to_be()
        || ip.proto != IPPROTO_UDP
        || ip.vihl != 0x45
        || ip.frags[0] & 0x3f != 0
        || ip.frags[1] != 0
    {
        return None;
    }
    Some(unsafe { &*((data + UDP_OFF) as *const UdpHdr) }.dst)
}

/// Addresses a result frame (at least `PAYLOAD_OFFSET` bytes long, checked by the caller)
/// from the switch to `m`, with a fresh IPv4 checksum and no UDP checksum.
#[inline(always)]
pub fn address_to(data: usize, m: &MemberAddr, cfg: &SwitchConfig) {
    let eth = unsafe { &mut *(data as *mut EthHdr) };
    eth.dst_addr = m.mac;
    eth.src_addr = cfg.mac;
    let ip = unsafe { &mut *((data + IP_OFF) as *mut Ipv4Hdr) };
    ip.src_addr = cfg.ip;
    ip.dst_addr = m.ip;
    ip.check = [0, 0];
    ip.check = ipv4_checksum(data + IP_OFF).to_be_bytes();
    let udp = unsafe { &mut *((data + UDP_OFF) as *mut UdpHdr) };
    udp.src = cfg.port;
    udp.dst = m.port;
    // Zero means "no checksum" in IPv4; recomputing it over the payload would cost as much
    // as the aggregation itself.
    udp.check = [0, 0];
}

/// Internet checksum of a 20-byte IPv4 header whose checksum field is zero.
#[inline(always)]
fn ipv4_checksum(ip: usize) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < Ipv4Hdr::LEN {
        let b = unsafe { *((ip + i) as *const [u8; 2]) };
        sum += u16::from_be_bytes(b) as u32;
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
