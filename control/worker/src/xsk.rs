//! A worker's AF_XDP receive path: results go from the NIC (or veth) straight into
//! buffers the worker posted beforehand, without socket buffers or the UDP stack.
//!
//! The worker attaches `xagg_host` to its interface, registers its UDP port in the
//! program's `XSK_PORTS` and its socket in `XSKS`; the program redirects datagrams for that
//! port into the socket and passes everything else to the kernel. Sending stays on the UDP
//! socket (GSO is the faster send path). Dropping the receiver detaches the program.
//!
//! One socket is bound to receive queue 0 (veth has one queue). On a NIC with several,
//! `xagg_host` passes results that arrive on other queues to the kernel, and the worker
//! reads them from its UDP socket: correct, but at socket speed; steer the port to queue 0
//! (`ethtool -N <if> flow-type udp4 dst-port <port> action 0`) or use one queue
//! (`ethtool -L <if> combined 1`). On veth AF_XDP runs in copy mode: the kernel copies
//! each frame into a posted buffer.

use std::{ffi::CString, num::NonZeroU32, os::fd::BorrowedFd};

use aya::{
    maps::{HashMap, XskMap},
    Ebpf,
};
use xagg_linux::{pages::Pages, XdpObject};
use xdpilone::{DeviceQueue, IfInfo, RingRx, Socket, SocketConfig, Umem, UmemConfig, User};

use crate::Error;

/// Posted buffers: enough for every slot's result at once, with room to spare.
const FRAMES: u32 = 2048;
const FRAME_SIZE: u32 = 4096;
/// Frames taken from the receive ring at once.
const BATCH: u32 = 64;
/// Ethernet + IPv4 (no options, as `xagg_host` checks) + UDP.
const UDP_PAYLOAD_OFFSET: usize = 14 + 20 + 8;
/// Bind flag: take multi-buffer frames, one descriptor per buffer (`XDP_USE_SG`).
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: more buffers of the same frame follow (`XDP_PKT_CONTD`).
const XDP_PKT_CONTD: u32 = 1 << 0;

pub struct XskReceiver {
    /// The only source results are taken from: the aggregation point's IPv4 address and
    /// UDP port, as they appear in the frame.
    from: ([u8; 4], [u8; 2]),
    /// This member's cookie, which every datagram taken must carry.
    cookie: [u8; 8],
    /// Frames from any other source, or without the cookie, dropped before their payload
    /// was read.
    pub refused: u64,
    /// Chunks taken from the receive ring and not yet back in the fill ring.
    unposted: Vec<u64>,
    /// The buffers so far of a multi-buffer frame (a segment past one 4 KiB chunk), joined.
    frame: Vec<u8>,
    // Fields drop in this order: the program first (no more redirects), then the rings
    // and sockets, the memory last.
    _ebpf: Ebpf,
    rx: RingRx,
    fq: DeviceQueue,
    _user: User,
    _sock: Socket,
    _umem: Umem,
    area: Pages,
}

// Safety: the receiver owns its socket, rings and memory outright (no other handle to them
// exists in the process), so moving it to another thread moves all of it; the worker
// uses it from one thread at a time, under its engine's lock.
unsafe impl Send for XskReceiver {}

fn err(what: &'static str) -> impl FnOnce(xdpilone::Errno) -> Error {
    move |errno| Error::Xsk { what, errno }
}

impl XskReceiver {
    /// Receives the datagrams sent from `from` with `cookie` to UDP `port` on interface
    /// `iface` (in the calling thread's network namespace) from now on.
    pub fn new(
        iface: &str,
        port: u16,
        from: std::net::SocketAddrV4,
        cookie: [u8; 8],
        object: XdpObject,
    ) -> Result<Self, Error> {
        let (mut ebpf, _) = crate::host_end::load(object, iface)?;
        {
            let map = ebpf.map_mut("XSK_PORTS").ok_or(Error::NoMap("XSK_PORTS"))?;
            let mut ports: HashMap<_, [u8; 2], u32> = HashMap::try_from(map).map_err(Error::Map)?;
            ports.insert(port.to_be_bytes(), 0, 0).map_err(Error::Map)?;
        }

        let area = Pages::map((FRAMES * FRAME_SIZE) as usize).map_err(Error::Buffers)?;
        let config = UmemConfig {
            fill_size: FRAMES,
            complete_size: FRAMES,
            frame_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
        };
        // Safety: the area is page aligned, FRAMES * FRAME_SIZE long, and outlives the Umem.
        let umem = unsafe { Umem::new(config, area.as_non_null()) }
            .map_err(err("registering AF_XDP buffers"))?;
        let mut info = IfInfo::invalid();
        let name = CString::new(iface).map_err(Error::InterfaceName)?;
        info.from_name(&name).map_err(err("AF_XDP interface"))?;
        info.set_queue(0);
        let sock = Socket::with_shared(&info, &umem).map_err(err("creating an AF_XDP socket"))?;
        let mut fq = umem.fq_cq(&sock).map_err(err("AF_XDP fill ring"))?;
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: NonZeroU32::new(FRAMES),
                    tx_size: None,
                    // Results past one chunk (multi-buffer frames) come as several
                    // descriptors; without the flag the kernel drops them.
                    bind_flags: XDP_USE_SG,
                },
            )
            .map_err(err("AF_XDP receive ring"))?;
        let rx = user
            .map_rx()
            .map_err(err("mapping the AF_XDP receive ring"))?;
        umem.bind(&user)
            .map_err(err("binding the AF_XDP socket to queue 0"))?;
        {
            let mut fill = fq.fill(FRAMES);
            let n = fill.insert((0..FRAMES).map(|i| u64::from(i * FRAME_SIZE)));
            fill.commit();
            if n != FRAMES {
                return Err(Error::Posted {
                    posted: n,
                    frames: FRAMES,
                });
            }
        }
        let map = ebpf.map_mut("XSKS").ok_or(Error::NoMap("XSKS"))?;
        let mut xsks = XskMap::try_from(map).map_err(Error::Map)?;
        // Safety: the socket outlives this call; the map holds its own reference.
        let fd = unsafe { BorrowedFd::borrow_raw(rx.as_raw_fd()) };
        xsks.set(0, fd, 0).map_err(Error::Map)?;
        Ok(Self {
            from: (from.ip().octets(), from.port().to_be_bytes()),
            cookie,
            refused: 0,
            unposted: Vec::with_capacity(BATCH as usize),
            frame: Vec::with_capacity(xagg_common::wire::MAX_IP_PACKET + 14),
            _ebpf: ebpf,
            rx,
            fq,
            _user: user,
            _sock: sock,
            _umem: umem,
            area,
        })
    }

    /// The socket's descriptor, to wait for frames with poll(2).
    pub fn fd(&self) -> BorrowedFd<'_> {
        // Safety: the socket lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.rx.as_raw_fd()) }
    }

    /// Whether frames wait in the receive ring.
    pub fn ready(&self) -> bool {
        self.rx.available() > 0
    }

    /// Hands the UDP payload of each frame that came in (up to a batch) from the expected
    /// source to `f`, in place, then posts the buffers again; returns how many frames
    /// there were.
    pub fn drain(&mut self, f: &mut impl FnMut(&[u8])) -> usize {
        if self.rx.available() == 0 {
            return 0;
        }
        let mut ring = self.rx.receive(BATCH);
        let mut n = 0;
        while let Some(desc) = ring.read() {
            let (addr, len) = (desc.addr as usize, desc.len as usize);
            self.unposted.push(desc.addr);
            n += 1;
            if addr + len > self.area.size() {
                continue;
            }
            // Safety: the kernel handed this chunk to us; it is ours until posted again.
            let part = unsafe { std::slice::from_raw_parts(self.area.base().add(addr), len) };
            let more = desc.options & XDP_PKT_CONTD != 0;
            let frame = if more || !self.frame.is_empty() {
                // A buffer of a multi-buffer frame: joined until its last one.
                self.frame.extend_from_slice(part);
                if more {
                    continue;
                }
                &self.frame[..]
            } else {
                part
            };
            // IPv4 without options (xagg_host steers no other): the source address at
            // 26..30, the source port at 34..36.
            if frame.len() >= UDP_PAYLOAD_OFFSET {
                let d = &frame[UDP_PAYLOAD_OFFSET..];
                if frame[26..30] == self.from.0
                    && frame[34..36] == self.from.1
                    && crate::transport::carries_cookie(d, &self.cookie)
                {
                    f(d);
                } else {
                    self.refused += 1;
                }
            }
            self.frame.clear();
        }
        ring.release();
        drop(ring);
        self.post();
        n
    }

    /// Posts the chunks taken back to the fill ring (any address inside a chunk names the
    /// chunk). The ring has room for every chunk, but the kernel publishes how far it has
    /// read the ring in batches, so a reservation can see less room than the chunks just
    /// taken (measured: 18 of 36, with 2030 entries shown unread): whatever does not fit is
    /// kept and posted with the next batch. A chunk dropped instead is lost for good; once
    /// enough are, the kernel drops every frame (ENOMEM) and the job crawls on
    /// retransmissions.
    fn post(&mut self) {
        while !self.unposted.is_empty() {
            let mut fill = self.fq.fill(self.unposted.len() as u32);
            let k = fill.insert(self.unposted.iter().copied()) as usize;
            fill.commit();
            if k == 0 {
                // No room shown yet: the rest go in with the next batch.
                break;
            }
            self.unposted.drain(..k);
        }
    }
}
