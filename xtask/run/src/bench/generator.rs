//! The capacity measurement's traffic: every member's contributions from one generator,
//! from the member's own address, as UDP GSO bursts or whole frames through AF_XDP.

use std::{
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
};

use anyhow::Result;
use xagg_common::wire::{self, DType, Header, Kind, Op, FLAG_SHADOW};
use xagg_lab::{
    lab::{self, Lab},
    testrun::contribution,
};

use super::capacity::SLOTS;
use crate::xsk_send::XskSender;

/// Rounds per GSO burst of one member.
const BURST: u32 = 16;

/// How the generator sends: UDP GSO bursts (as the workers do), or whole frames through
/// AF_XDP.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SendWith {
    Gso,
    AfXdp,
}

impl SendWith {
    pub fn name(self) -> &'static str {
        match self {
            SendWith::Gso => "udp-gso",
            SendWith::AfXdp => "af-xdp",
        }
    }
}

/// Every member's socket, and where the generator is in the job's rounds.
pub(super) struct Generator {
    /// Each member's UDP socket; it also takes (and never reads) the results.
    pub(super) sockets: Vec<UdpSocket>,
    /// Each member's AF_XDP socket, where the send path is measured.
    xsks: Vec<XskSender>,
    pub(super) with: SendWith,
    job: u32,
    pub(super) elements: usize,
    /// One burst of datagrams: the payloads written once, each header rewritten per round
    /// (building every datagram afresh cost the generator more CPU than the switch).
    buf: Vec<u8>,
    /// Bytes of one datagram.
    len: usize,
    /// The next round (a segment of message 0, then of the next messages).
    round: u64,
    /// Rounds per GSO burst of one member.
    pub(super) burst: u32,
}

impl Generator {
    pub(super) fn new(lab: &Lab, job: u32, elements: usize, afxdp: bool) -> Result<Self> {
        let switch = SocketAddrV4::new(lab::SWITCH_IP, wire::DEFAULT_PORT);
        let sockets = (0..lab.workers)
            .map(|i| {
                lab::in_netns(&lab.worker_ns(i), || {
                    let s =
                        UdpSocket::bind(SocketAddrV4::new(lab::worker_ip(i), lab::WORKER_PORT))?;
                    s.connect(switch)?;
                    Ok(s)
                })
            })
            .collect::<Result<_>>()?;
        let mut g = Self {
            sockets,
            xsks: Vec::new(),
            with: SendWith::Gso,
            job,
            elements,
            buf: Vec::new(),
            len: 0,
            round: 0,
            // As many rounds as one 64 KiB GSO super-packet holds.
            burst: BURST.min(64_000 / (wire::PAYLOAD_OFFSET - 42 + elements * 4) as u32),
        };
        let values: Vec<i32> = (0..elements as i32).collect();
        let one = contribution(g.header(0, 0), &values);
        g.len = one.len();
        g.buf = one.repeat(g.burst as usize);
        if afxdp {
            // Frames as the member's kernel would send them: to the switch's MAC (br0's) and
            // address.
            let switch_mac =
                lab::in_netns(&lab.switch_ns(), || Ok(xagg_linux::iface::mac("br0")?))?;
            for i in 0..lab.workers {
                let src = xagg_common::job::MemberAddr {
                    ifindex: 0,
                    ip: lab::worker_ip(i).octets(),
                    mac: lab.worker_mac(i)?,
                    port: lab::WORKER_PORT.to_be_bytes(),
                };
                let mut frame = xagg_lab::testrun::frame(&src, wire::DEFAULT_PORT, &one);
                frame[..6].copy_from_slice(&switch_mac);
                frame[30..34].copy_from_slice(&lab::SWITCH_IP.octets());
                frame[24..26].fill(0);
                let sum = xagg_lab::testrun::ipv4_checksum(&frame[14..34]);
                frame[24..26].copy_from_slice(&sum.to_be_bytes());
                let x = lab::in_netns(&lab.worker_ns(i), || {
                    XskSender::new("eth0", &frame, 8 * g.burst as usize)
                })?;
                g.xsks.push(x);
            }
        }
        Ok(g)
    }

    /// The header of member `m`'s contribution to round `r`: segment `r mod 2^16` of
    /// message `r / 2^16`, its slot and shadow copy as the workers' schedule takes them in
    /// turn.
    fn header(&self, m: usize, r: u64) -> Header {
        let slot = (r % SLOTS as u64) as u16;
        let shadow = (r / SLOTS as u64) % 2 == 1;
        Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(self.job)
            .message((r >> 16) as u32)
            .segment((r & 0xffff) as u32)
            .slot(slot)
            .member(m as u8)
            .flags(if shadow { FLAG_SHADOW } else { 0 })
            .count(self.elements as u16)
            .build()
    }

    /// Sends [`BURST`] rounds from every member; the contributions sent.
    pub(super) fn burst(&mut self) -> Result<u64> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
        let mut sent = 0;
        for m in 0..self.sockets.len() {
            if self.with == SendWith::AfXdp {
                let headers: Vec<Header> = (0..self.burst as u64)
                    .map(|k| self.header(m, self.round + k))
                    .collect();
                // The UDP payload starts after Ethernet, IPv4 and UDP headers.
                let at = wire::PAYLOAD_OFFSET - wire::HEADER_LEN;
                self.xsks[m].send(headers.len(), |k, frame| {
                    headers[k].write(
                        (&mut frame[at..at + wire::HEADER_LEN])
                            .try_into()
                            .expect("a header's bytes"),
                    )
                })?;
                sent += self.burst as u64;
                continue;
            }
            for k in 0..self.burst as usize {
                let h = self.header(m, self.round + k as u64);
                let at = k * self.len;
                h.write((&mut self.buf[at..at + wire::HEADER_LEN]).try_into()?);
            }
            let size = self.len as u16;
            let iov = [std::io::IoSlice::new(&self.buf)];
            let cmsg = [ControlMessage::UdpGsoSegments(&size)];
            match sendmsg::<SockaddrIn>(
                self.sockets[m].as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::empty(),
                None,
            ) {
                // ENOBUFS/EAGAIN: the interface's queue was full for a moment; the
                // contributions it did not take count as lost.
                Ok(_) | Err(nix::errno::Errno::ENOBUFS | nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(e.into()),
            }
            sent += self.burst as u64;
        }
        self.round += self.burst as u64;
        Ok(sent)
    }
}
