//! How a worker's packets leave and arrive: contributions go out on a UDP socket, in GSO
//! bursts encoded in place; results come in on the same socket (read with GRO), or from
//! AF_XDP buffers that `xagg_host` fills (`xsk`, feature `afxdp`) with the socket
//! as the fallback for what the host program passes on. The worker's loop sees only this
//! interface: reserve room, commit a datagram, flush, and receive.
//!
//! Datagrams are taken only from the aggregation point's address and port, and only with
//! this member's cookie (a random number each transport draws, sent in every contribution
//! and query and written by the switch into everything it sends this member): anyone on
//! the segment can send a worker a packet that reads as a result, with the switch's
//! addresses too. A send refused for a moment
//! (a local packet filter, full buffers) is a lost packet, retransmitted like any other;
//! only a lasting failure (no route, the interface gone) ends the request.

use std::{
    io,
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use nix::sys::socket::{setsockopt, sockopt};
use xagg_common::wire::{COOKIE_OFFSET, MAX_IP_PACKET};

use crate::{AllreduceError, WorkerParams};

/// Largest GSO burst: one 64 KiB UDP super-packet.
const GSO_MAX_BYTES: usize = 65_000;
/// The kernel's limit of segments per GSO send (UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;

pub struct Transport {
    sock: UdpSocket,
    /// The aggregation point: where queries go and the only source results are taken
    /// from; contributions go to it and the collective ports after it, one burst each.
    to: SocketAddrV4,
    gso: bool,
    /// One burst per collective port, by offset from `to`'s.
    bursts: Vec<Burst>,
    /// The burst of the datagram being reserved and committed.
    lane: usize,
    inbox: Inbox,
    /// This member's cookie.
    cookie: [u8; 8],
    /// Datagrams from any other source, or without the cookie, dropped.
    refused: u64,
    /// Sends the host refused for a moment (each one a lost burst or datagram).
    lost_sends: u64,
}

/// Whether a send error is a passing refusal of this one packet, to be treated as its
/// loss: a local packet filter (EPERM), full buffers (ENOBUFS, EAGAIN), an ICMP error
/// reported for an earlier datagram (ECONNREFUSED).
fn transient(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EPERM | Errno::ENOBUFS | Errno::EAGAIN | Errno::ECONNREFUSED)
    )
}

/// A send's result with passing refusals counted in `lost` as lost packets.
fn lost_or(r: io::Result<()>, lost: &mut u64) -> io::Result<()> {
    match r {
        Err(e) if transient(&e) => {
            *lost += 1;
            Ok(())
        }
        r => r,
    }
}

/// Where results come in: the UDP socket (with its receive buffer), or AF_XDP and, for
/// results the host program passed on (another receive queue), the UDP socket.
enum Inbox {
    Socket(Vec<u8>),
    #[cfg(feature = "afxdp")]
    Xsk {
        xsk: Box<crate::xsk::XskReceiver>,
        rx: Vec<u8>,
        /// How long a blocking receive waits.
        wait: Duration,
    },
}

impl Transport {
    pub fn new(p: &WorkerParams) -> Result<Self, AllreduceError> {
        Self::with_socket(crate::error::bind_udp(p.bind)?, p)
    }

    /// The transport over a socket already bound to `p.bind` (the one a join's hellos
    /// came from).
    pub fn with_socket(sock: UdpSocket, p: &WorkerParams) -> Result<Self, AllreduceError> {
        // Room for every slot's result at once, so a burst is never dropped at the socket.
        let want = (p.shape.slots() * (MAX_IP_PACKET + 512) * 2).max(4 << 20);
        let _ = setsockopt(&sock, sockopt::RcvBufForce, &want)
            .or_else(|_| setsockopt(&sock, sockopt::RcvBuf, &want));
        let _ = setsockopt(&sock, sockopt::SndBufForce, &want);
        ignore_path_mtu(&sock)?;
        if p.gro {
            // Results that arrive together are read together.
            let _ = setsockopt(&sock, sockopt::UdpGroSegment, &true);
        }
        let mut cookie = [0u8; 8];
        getrandom::fill(&mut cookie)
            .map_err(|e| AllreduceError::Invalid(format!("drawing the member's cookie: {e}")))?;
        let inbox = if let Some(object) = p.afxdp {
            Self::xsk_inbox(p, cookie, object)?
        } else {
            Inbox::Socket(vec![0; 65536])
        };
        Ok(Self {
            sock,
            to: p.switch,
            gso: p.gso,
            bursts: (0..p.switch_ports.max(1)).map(|_| Burst::new()).collect(),
            lane: 0,
            inbox,
            cookie,
            refused: 0,
            lost_sends: 0,
        })
    }

    #[cfg(feature = "afxdp")]
    fn xsk_inbox(
        p: &WorkerParams,
        cookie: [u8; 8],
        object: xagg_linux::XdpObject,
    ) -> Result<Inbox, AllreduceError> {
        let ip = *p.bind.ip();
        let failed = |e: crate::Error| AllreduceError::AfXdp(e.into());
        let iface = xagg_linux::iface::holding(ip)
            .map_err(|e| failed(e.into()))?
            .ok_or_else(|| failed(crate::Error::NoInterface { ip }))?;
        Ok(Inbox::Xsk {
            xsk: Box::new(
                crate::xsk::XskReceiver::new(&iface, p.bind.port(), p.switch, cookie, object)
                    .map_err(failed)?,
            ),
            rx: vec![0; 65536],
            wait: Duration::from_millis(10),
        })
    }

    #[cfg(not(feature = "afxdp"))]
    fn xsk_inbox(
        _: &WorkerParams,
        _: [u8; 8],
        _: xagg_linux::XdpObject,
    ) -> Result<Inbox, AllreduceError> {
        Err(AllreduceError::AfXdp(crate::Error::NoAfXdp.into()))
    }

    /// Room for slot `slot`'s next datagram of `len` bytes, to be encoded in place and then
    /// [`Self::commit`]ted. Sends what is queued for its port first if the datagram cannot
    /// join it.
    pub fn reserve(&mut self, slot: usize, len: usize) -> io::Result<&mut [u8]> {
        self.lane = slot % self.bursts.len();
        let to = self.lane_to(self.lane);
        let burst = &mut self.bursts[self.lane];
        let at = if self.gso {
            let (at, sent) = burst.reserve(len, &self.sock, to);
            lost_or(sent, &mut self.lost_sends)?;
            at
        } else {
            0
        };
        Ok(&mut burst.data[at..at + len])
    }

    /// Queues the datagram just encoded in [`Self::reserve`]'s room (without GSO: sends it).
    pub fn commit(&mut self, len: usize) -> io::Result<()> {
        let to = self.lane_to(self.lane);
        let burst = &mut self.bursts[self.lane];
        if self.gso {
            burst.commit(len);
            Ok(())
        } else {
            let sent = self.sock.send_to(&burst.data[..len], to).map(drop);
            lost_or(sent, &mut self.lost_sends)
        }
    }

    /// The collective port `lane` places after the aggregation point's.
    fn lane_to(&self, lane: usize) -> SocketAddrV4 {
        SocketAddrV4::new(*self.to.ip(), self.to.port().wrapping_add(lane as u16))
    }

    /// Whether datagrams wait to be sent.
    pub fn queued(&self) -> bool {
        self.bursts.iter().any(|b| b.n > 0)
    }

    /// Sends what is queued.
    pub fn flush(&mut self) -> io::Result<()> {
        for lane in 0..self.bursts.len() {
            let to = self.lane_to(lane);
            let sent = self.bursts[lane].flush(&self.sock, to);
            lost_or(sent, &mut self.lost_sends)?;
        }
        Ok(())
    }

    /// Sends one datagram at once, past the queue (status queries).
    pub fn send_now(&mut self, d: &[u8]) -> io::Result<()> {
        let sent = self.sock.send_to(d, self.to).map(drop);
        lost_or(sent, &mut self.lost_sends)
    }

    /// This member's cookie, for the header of every packet it sends.
    pub fn cookie(&self) -> u64 {
        u64::from_be_bytes(self.cookie)
    }

    /// Datagrams dropped because they came from elsewhere than the aggregation point, or
    /// lacked this member's cookie.
    pub fn refused(&self) -> u64 {
        self.refused
            + match &self.inbox {
                Inbox::Socket(_) => 0,
                #[cfg(feature = "afxdp")]
                Inbox::Xsk { xsk, .. } => xsk.refused,
            }
    }

    /// Sends the host refused for a moment, each counted as a lost packet.
    pub fn lost_sends(&self) -> u64 {
        self.lost_sends
    }

    /// The descriptors results come in on, for waiting on several workers at once.
    pub fn fds(&self) -> Vec<std::os::fd::RawFd> {
        let sock = self.sock.as_raw_fd();
        match &self.inbox {
            #[cfg(feature = "afxdp")]
            Inbox::Xsk { xsk, .. } => vec![sock, xsk.fd().as_raw_fd()],
            Inbox::Socket(_) => vec![sock],
        }
    }

    /// Whether frames wait in the AF_XDP receive ring; always true for the socket, which
    /// only a system call can tell.
    fn ready(&self) -> bool {
        match &self.inbox {
            #[cfg(feature = "afxdp")]
            Inbox::Xsk { xsk, .. } => xsk.ready(),
            Inbox::Socket(_) => true,
        }
    }

    /// How long a blocking [`Self::receive`] waits.
    pub fn set_wait(&mut self, wait: Duration) -> io::Result<()> {
        match &mut self.inbox {
            #[cfg(feature = "afxdp")]
            Inbox::Xsk { wait: w, .. } => {
                *w = wait;
                Ok(())
            }
            Inbox::Socket(_) => self.sock.set_read_timeout(Some(wait)),
        }
    }

    /// Hands each datagram that came in to `f`: from the socket one datagram, or with UDP
    /// GRO several of the same length coalesced; from AF_XDP a batch of frames, in place.
    /// Waits (polling for `spin` first, then up to the wait set) unless `nonblocking`;
    /// `WouldBlock` or `TimedOut` when nothing came.
    pub fn receive(
        &mut self,
        nonblocking: bool,
        spin: Duration,
        f: &mut impl FnMut(&[u8]),
    ) -> io::Result<()> {
        if !nonblocking && !spin.is_zero() {
            let until = Instant::now() + spin;
            let mut turn = 0u32;
            loop {
                // With AF_XDP most turns only look at the receive ring (a memory read):
                // asking the socket, which only stray datagrams reach, is a system call.
                let look = turn.is_multiple_of(16) || self.ready();
                turn = turn.wrapping_add(1);
                if look {
                    match self.receive(true, Duration::ZERO, f) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        r => return r,
                    }
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let from = (self.to, &self.cookie);
        let refused = &mut self.refused;
        match &mut self.inbox {
            Inbox::Socket(rx) => receive_socket(&self.sock, from, refused, rx, nonblocking, f),
            #[cfg(feature = "afxdp")]
            Inbox::Xsk { xsk, rx, wait } => loop {
                if xsk.drain(f) > 0 {
                    return Ok(());
                }
                match receive_socket(&self.sock, from, refused, rx, true, f) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return r,
                }
                if nonblocking {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                use std::os::fd::AsFd;
                let mut fds = [
                    PollFd::new(xsk.fd(), PollFlags::POLLIN),
                    PollFd::new(self.sock.as_fd(), PollFlags::POLLIN),
                ];
                let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
                match poll(
                    &mut fds,
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                ) {
                    Ok(0) => return Err(io::ErrorKind::TimedOut.into()),
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            },
        }
    }
}

/// Sends by the interface's MTU, never by a path MTU learnt from ICMP. Anyone on the
/// network can send a member an ICMP "fragmentation needed" quoting its flow to the switch
/// (nothing in it is secret): the kernel then lowers the path MTU to the switch for 10
/// minutes, and every full segment's send fails (EMSGSIZE) — a stranger stopping a job
/// with one packet. Segments are sized for the interfaces at the join, and the switch
/// forwards nothing on, so a path MTU has nothing to tell.
fn ignore_path_mtu(sock: &UdpSocket) -> Result<(), AllreduceError> {
    use std::os::fd::AsRawFd;
    let mode: libc::c_int = libc::IP_PMTUDISC_INTERFACE;
    // Safety: an int option on a socket this function borrows.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&mode as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(AllreduceError::Invalid(format!(
            "setting the member's socket to ignore path MTUs (IP_MTU_DISCOVER): {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Whether datagram `d` carries this member's `cookie`, compared in constant time (how much
/// of a guess matched does not show in how long the answer takes).
pub(crate) fn carries_cookie(d: &[u8], cookie: &[u8; 8]) -> bool {
    use subtle::ConstantTimeEq;
    d.get(COOKIE_OFFSET..COOKIE_OFFSET + 8)
        .is_some_and(|p| bool::from(p.ct_eq(cookie)))
}

/// [`Transport::receive`] from the UDP socket: what came from `from`'s address with its
/// cookie, counting in `refused` everything else.
fn receive_socket(
    sock: &UdpSocket,
    (from, cookie): (SocketAddrV4, &[u8; 8]),
    refused: &mut u64,
    rx: &mut [u8],
    nonblocking: bool,
    f: &mut impl FnMut(&[u8]),
) -> io::Result<()> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrIn};
    let flags = if nonblocking {
        MsgFlags::MSG_DONTWAIT
    } else {
        MsgFlags::empty()
    };
    let mut cmsg = nix::cmsg_space!(i32);
    let mut iov = [io::IoSliceMut::new(rx)];
    let msg = recvmsg::<SockaddrIn>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), flags)
        .map_err(io::Error::from)?;
    let n = msg.bytes;
    if msg.address.map(SocketAddrV4::from) != Some(from) {
        *refused += 1;
        return Ok(());
    }
    let mut stride = n;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::UdpGroSegments(s) = c {
            stride = s as usize;
        }
    }
    for d in rx[..n].chunks(stride.max(1)) {
        if carries_cookie(d, cookie) {
            f(d);
        } else {
            *refused += 1;
        }
    }
    Ok(())
}

/// Datagrams waiting to be sent as one GSO burst (`data[..len]`, `n` of them): all `stride`
/// bytes long but the last. Contributions are encoded in place.
struct Burst {
    data: Vec<u8>,
    len: usize,
    n: usize,
    stride: usize,
    /// The last datagram is shorter than `stride`: no other may follow it.
    closed: bool,
}

impl Burst {
    fn new() -> Self {
        Self {
            data: vec![0; GSO_MAX_BYTES],
            len: 0,
            n: 0,
            stride: 0,
            closed: false,
        }
    }

    /// Where the next datagram of `len` bytes goes: after the queued ones if it may join
    /// them, else at the start, the queued ones sent first (with the send's result).
    fn reserve(
        &mut self,
        len: usize,
        sock: &UdpSocket,
        to: SocketAddrV4,
    ) -> (usize, io::Result<()>) {
        // GSO cuts the burst into datagrams of the first one's length: a shorter one may
        // only come last, and the whole burst must fit one 64 KiB super-packet.
        let fits = self.n == 0
            || (!self.closed
                && len <= self.stride
                && self.len + len <= GSO_MAX_BYTES
                && self.n < GSO_MAX_SEGMENTS);
        let sent = if fits { Ok(()) } else { self.flush(sock, to) };
        (self.len, sent)
    }

    /// Queues the `len` bytes just written at `reserve(len)`.
    fn commit(&mut self, len: usize) {
        if self.n == 0 {
            self.stride = len;
        }
        self.len += len;
        self.n += 1;
        self.closed = len < self.stride;
    }

    /// Sends what is queued: one datagram, or one GSO super-packet. The queue is empty
    /// afterwards, sent or not.
    fn flush(&mut self, sock: &UdpSocket, to: SocketAddrV4) -> io::Result<()> {
        let sent = match self.n {
            0 => return Ok(()),
            1 => sock.send_to(&self.data[..self.len], to).map(drop),
            _ => {
                use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
                let stride = self.stride as u16;
                let cmsg = [ControlMessage::UdpGsoSegments(&stride)];
                let iov = [io::IoSlice::new(&self.data[..self.len])];
                sendmsg(
                    sock.as_raw_fd(),
                    &iov,
                    &cmsg,
                    MsgFlags::empty(),
                    Some(&SockaddrIn::from(to)),
                )
                .map(drop)
                .map_err(io::Error::from)
            }
        };
        self.len = 0;
        self.n = 0;
        self.closed = false;
        sent
    }
}
