//! The worker library: allreduce of a buffer through an aggregation switch.
//!
//! The buffer is cut into segments of the job's length; segment `k` of a message goes to
//! slot `k % slots`, and at most `slots` segments are in flight: a slot is reused only
//! after its result came back. Each use of a slot flips its epoch (the slot version), so
//! the switch keeps the previous result while a slower member may still ask for it.
//! A contribution whose result does not come back in time is sent again; the switch
//! never adds it twice and answers it with the stored result if the slot already finished.

use std::{
    io,
    net::{SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use xagg_common::wire::{
    self, DType, Header, Kind, Op, ENC_NONFINITE, ENC_OVERFLOW, FLAG_EPOCH, FLAG_LAST, HEADER_LEN,
};

use std::os::fd::AsRawFd;

use crate::codec;

/// Largest GSO burst: one 64 KiB UDP super-packet.
const GSO_MAX_BYTES: usize = 65_000;
/// The kernel's limit of segments per GSO send (UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;

/// Element types a buffer may hold: plain little-endian data of a wire data type.
pub trait Element: Copy + Send + Sync + 'static + private::Sealed {
    const DTYPE: DType;
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl private::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(i32 => I32, u32 => U32, i64 => I64, f32 => F32, half::f16 => F16, half::bf16 => Bf16);

#[derive(Clone, Debug)]
pub struct WorkerParams {
    /// The switch's address and collective UDP port.
    pub switch: SocketAddrV4,
    /// This member's own address and UDP port, as registered in the job.
    pub bind: SocketAddrV4,
    pub job: u32,
    pub member: u8,
    pub op: Op,
    pub dtype: DType,
    /// Elements per segment (the job's segment length).
    pub segment: usize,
    /// Members of the job (the divisor of `avg`).
    pub members: u32,
    /// The job's slots: segments in flight.
    pub slots: usize,
    /// First retransmission timeout; adapted to the measured round trip.
    pub timeout: Duration,
    /// Upper bound of the retransmission timeout.
    pub max_timeout: Duration,
    /// Fail when no result arrived for this long.
    pub give_up: Duration,
    /// Test option: send segments out of order (each burst of sends is shuffled).
    pub reorder: bool,
    /// Send bursts of segments with UDP GSO (one system call for up to 18 full segments)
    /// instead of one datagram per call.
    pub gso: bool,
    /// Receive with UDP GRO: results that arrive together are read with one call.
    pub gro: bool,
    /// Receive results with AF_XDP (`xagg_host` steers them into posted buffers) instead of
    /// the UDP socket. The worker attaches `xagg_host` to the interface holding its
    /// address, which must carry no other XDP program.
    pub afxdp: bool,
    /// How long a worker whose whole message is in flight at once (one round trip) polls
    /// for its results, yielding the CPU in between, before it sleeps: waking a sleeping
    /// process costs tens of µs, more than a small allreduce's round trip. Larger messages
    /// always sleep (polling would take CPU the switch path needs).
    pub spin: Duration,
    /// Message id of the first allreduce; later ones count up. Every member of a job must
    /// use the same ids, and a job's ids must grow (ids wrap by serial-number arithmetic).
    pub first_mid: u32,
}

impl WorkerParams {
    pub fn new(switch: SocketAddrV4, bind: SocketAddrV4, job: u32, member: u8) -> Self {
        Self {
            switch,
            bind,
            job,
            member,
            op: Op::Sum,
            dtype: DType::I32,
            segment: DType::I32.max_elements(),
            members: 0,
            slots: 64,
            timeout: Duration::from_millis(20),
            max_timeout: Duration::from_millis(500),
            give_up: Duration::from_secs(10),
            reorder: false,
            gso: true,
            gro: true,
            afxdp: false,
            spin: Duration::from_micros(100),
            first_mid: 0,
        }
    }
}

/// What one allreduce did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub bytes: usize,
    pub seconds: f64,
    pub goodput_gbps: f64,
    pub segments: usize,
    pub retransmissions: u64,
    /// Contributions sent after one with a higher sequence id (with `reorder`).
    pub reordered: u64,
}

fn fmt_segments(s: &[u32]) -> String {
    let mut v: Vec<String> = s.iter().take(8).map(u32::to_string).collect();
    if s.len() > 8 {
        v.push("...".into());
    }
    v.join(", ")
}

/// A segment whose result never came, and what the switch said about its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub slot: usize,
    pub sid: u32,
    /// Members the switch still waits for in this round; `None` if the switch did not
    /// answer, or holds another round in the slot (then nobody's contribution arrived, or
    /// the switch lost the job).
    pub members: Option<Vec<u8>>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.members {
            Some(m) => write!(
                f,
                "slot {} sid {} waits for members {:?}",
                self.slot, self.sid, m
            ),
            None => write!(
                f,
                "slot {} sid {}: no contribution of this round at the switch",
                self.slot, self.sid
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AllreduceError {
    #[error("allreduce of job {job} message {mid} failed: no result for {waited:?}; {} segments missing: {}", missing.len(), fmt_missing(missing))]
    Timeout {
        job: u32,
        mid: u32,
        waited: Duration,
        missing: Vec<Missing>,
    },
    #[error("allreduce of job {job} message {mid}: NaN or infinity in the input of {} segments (sid {}); their elements are NaN in the result", segments.len(), fmt_segments(segments))]
    NonFinite {
        job: u32,
        mid: u32,
        segments: Vec<u32>,
    },
    #[error("allreduce of job {job} message {mid}: the 64-bit sum overflowed in {} segments (sid {}), so their mean is wrong", segments.len(), fmt_segments(segments))]
    Overflow {
        job: u32,
        mid: u32,
        segments: Vec<u32>,
    },
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Invalid(String),
}

fn fmt_missing(m: &[Missing]) -> String {
    let mut s: Vec<String> = m.iter().take(8).map(|x| x.to_string()).collect();
    if m.len() > 8 {
        s.push("...".into());
    }
    s.join(", ")
}

struct InFlight {
    seg: usize,
    epoch: u8,
    sent: Instant,
    rto: Duration,
    retransmitted: bool,
}

pub struct Worker {
    sock: UdpSocket,
    /// Where results come in.
    inbox: Inbox,
    p: WorkerParams,
    next_mid: u32,
    /// Uses of each slot so far: its next epoch.
    uses: Vec<u32>,
    srtt: Option<Duration>,
    rng: u64,
    /// Contributions waiting to go out as one GSO burst.
    burst: Burst,
}

impl Worker {
    pub fn new(p: WorkerParams) -> Result<Self, AllreduceError> {
        if wire::lane(p.op, p.dtype).is_none() {
            return Err(AllreduceError::Invalid(format!(
                "{} over {} is not supported (floats take sum, min, max, avg)",
                p.op.name(),
                p.dtype.name()
            )));
        }
        let max = wire::max_elements(p.op, p.dtype);
        if p.segment == 0 || p.segment > max {
            return Err(AllreduceError::Invalid(format!(
                "segment of {} elements: choose 1..={max} for {} over {}",
                p.segment,
                p.op.name(),
                p.dtype.name()
            )));
        }
        if p.op == Op::Avg && p.members == 0 {
            return Err(AllreduceError::Invalid(
                "avg needs the job's member count".into(),
            ));
        }
        if p.slots == 0 {
            return Err(AllreduceError::Invalid("slots must be at least 1".into()));
        }
        let sock = UdpSocket::bind(p.bind)?;
        // Room for every slot's result at once, so a burst is never dropped at the socket.
        let want = (p.slots * (wire::MAX_IP_PACKET + 512) * 2).max(4 << 20);
        let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &want)
            .or_else(|_| {
                nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &want)
            });
        let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::SndBufForce, &want);
        if p.gro {
            // Results that arrive together are read together.
            let _ = nix::sys::socket::setsockopt(
                &sock,
                nix::sys::socket::sockopt::UdpGroSegment,
                &true,
            );
        }
        let inbox = if p.afxdp {
            let ip = *p.bind.ip();
            let iface = crate::iface::holding(ip)
                .map_err(|e| AllreduceError::Invalid(format!("{e:#}")))?
                .ok_or_else(|| {
                    AllreduceError::Invalid(format!(
                        "AF_XDP receive: no interface holds {ip} in this network namespace"
                    ))
                })?;
            Inbox::Xsk {
                xsk: Box::new(
                    crate::xsk::XskReceiver::new(&iface, p.bind.port())
                        .map_err(|e| AllreduceError::Invalid(format!("{e:#}")))?,
                ),
                rx: vec![0; 65536],
                wait: Duration::from_millis(10),
            }
        } else {
            Inbox::Socket(vec![0; 65536])
        };
        Ok(Self {
            sock,
            inbox,
            next_mid: p.first_mid,
            uses: vec![0; p.slots],
            srtt: None,
            burst: Burst::new(),
            rng: 0x9e37_79b9_7f4a_7c15 ^ (p.member as u64) << 17 ^ p.job as u64,
            p,
        })
    }

    pub fn params(&self) -> &WorkerParams {
        &self.p
    }

    /// Allreduce of `buf` in place.
    pub fn allreduce_i32(&mut self, buf: &mut [i32]) -> Result<Report, AllreduceError> {
        if self.p.dtype.size() != 4 {
            return Err(AllreduceError::Invalid(format!(
                "an i32 buffer for a job of {}",
                self.p.dtype.name()
            )));
        }
        // Little-endian host: the buffer's bytes are already the wire's element encoding.
        const _: () = assert!(cfg!(target_endian = "little"));
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len() * 4) };
        self.allreduce_bytes(bytes)
    }

    /// Allreduce of a buffer of little-endian elements of the job's data type.
    pub fn allreduce_bytes(&mut self, buf: &mut [u8]) -> Result<Report, AllreduceError> {
        let size = self.p.dtype.size();
        if !buf.len().is_multiple_of(size) {
            return Err(AllreduceError::Invalid(format!(
                "buffer of {} bytes is not a whole number of {} elements",
                buf.len(),
                self.p.dtype.name()
            )));
        }
        let start = Instant::now();
        let elems = buf.len() / size;
        let seg_bytes = self.p.segment * size;
        let nseg = elems.div_ceil(self.p.segment);
        let mid = self.next_mid;
        self.next_mid = self.next_mid.wrapping_add(1);
        let mut report = Report {
            bytes: buf.len(),
            segments: nseg,
            ..Report::default()
        };
        if nseg == 0 {
            return Ok(report);
        }
        let window = self.p.slots.min(nseg);
        let mut flight: Vec<Option<InFlight>> = (0..window).map(|_| None).collect();
        let mut order: Vec<usize> = (0..window).collect();
        if self.p.reorder {
            for i in (1..order.len()).rev() {
                self.rng = crate::data::mix(self.rng);
                order.swap(i, (self.rng % (i as u64 + 1)) as usize);
            }
            report.reordered = order
                .iter()
                .enumerate()
                .filter(|(i, &s)| order[..*i].iter().any(|&e| e > s))
                .count() as u64;
        }
        for slot in order {
            flight[slot] = Some(self.send(buf, mid, slot, slot, nseg, seg_bytes)?);
        }
        let mut done = 0;
        let (mut nonfinite, mut overflow) = (Vec::new(), Vec::new());
        let mut accepted: Vec<(usize, usize, u16)> = Vec::with_capacity(64);
        let spin = if nseg <= window {
            self.p.spin
        } else {
            Duration::ZERO
        };
        let mut last_progress = Instant::now();
        let mut next_check = Instant::now() + self.rto();
        self.set_wait(self.rto() / 4 + Duration::from_micros(100))?;
        self.burst.flush(&self.sock, self.p.switch)?;
        while done < nseg {
            // Results already queued are taken without blocking; once none is left, the
            // segments they freed go out as one burst, and only then does the worker wait.
            let p = &self.p;
            let mut take = |d: &[u8]| {
                if let Some(a) = accept(p, d, mid, &flight, buf, seg_bytes) {
                    accepted.push(a);
                }
            };
            let got = if self.burst.n > 0 {
                match receive(&mut self.inbox, &self.sock, true, spin, &mut take) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.burst.flush(&self.sock, p.switch)?;
                        receive(&mut self.inbox, &self.sock, false, spin, &mut take)
                    }
                    r => r,
                }
            } else {
                receive(&mut self.inbox, &self.sock, false, spin, &mut take)
            };
            match got {
                Ok(()) => {
                    for (slot, seg, flags) in accepted.drain(..) {
                        // One batch may hold the same result twice (a reply to a
                        // retransmission and the broadcast): the second finds the slot
                        // already moved on to a later segment.
                        if flight[slot].as_ref().is_none_or(|f| f.seg != seg) {
                            continue;
                        }
                        let f = flight[slot].take().expect("checked above");
                        if flags & ENC_NONFINITE != 0 {
                            nonfinite.push(f.seg as u32);
                        }
                        if flags & ENC_OVERFLOW != 0 {
                            overflow.push(f.seg as u32);
                        }
                        if !f.retransmitted {
                            self.sample_rtt(f.sent.elapsed());
                        }
                        done += 1;
                        last_progress = Instant::now();
                        let next = f.seg + window;
                        if next < nseg {
                            flight[slot] = Some(self.send(buf, mid, slot, next, nseg, seg_bytes)?);
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
            let now = Instant::now();
            if now < next_check {
                continue;
            }
            next_check = now + self.rto() / 4;
            if now.duration_since(last_progress) > self.p.give_up {
                let missing = self.diagnose(mid, &flight);
                return Err(AllreduceError::Timeout {
                    job: self.p.job,
                    mid,
                    waited: now.duration_since(last_progress),
                    missing,
                });
            }
            for (slot, entry) in flight.iter_mut().enumerate() {
                let due = matches!(entry, Some(f) if now.duration_since(f.sent) >= f.rto);
                if due {
                    let f = entry.take().unwrap();
                    let mut again =
                        self.send_epoch(buf, mid, slot, f.seg, nseg, seg_bytes, f.epoch)?;
                    again.rto = (f.rto * 2).min(self.p.max_timeout);
                    again.retransmitted = true;
                    *entry = Some(again);
                    report.retransmissions += 1;
                }
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        report.goodput_gbps = buf.len() as f64 * 8.0 / report.seconds / 1e9;
        if !nonfinite.is_empty() {
            nonfinite.sort();
            return Err(AllreduceError::NonFinite {
                job: self.p.job,
                mid,
                segments: nonfinite,
            });
        }
        if !overflow.is_empty() {
            overflow.sort();
            return Err(AllreduceError::Overflow {
                job: self.p.job,
                mid,
                segments: overflow,
            });
        }
        Ok(report)
    }

    /// How long a blocking receive waits.
    fn set_wait(&mut self, wait: Duration) -> io::Result<()> {
        match &mut self.inbox {
            Inbox::Xsk { wait: w, .. } => {
                *w = wait;
                Ok(())
            }
            Inbox::Socket(_) => self.sock.set_read_timeout(Some(wait)),
        }
    }

    /// Where the next datagram of `len` bytes is to be encoded in `burst.data`.
    fn reserve(&mut self, len: usize) -> io::Result<usize> {
        if !self.p.gso {
            return Ok(0);
        }
        self.burst.reserve(len, &self.sock, self.p.switch)
    }

    /// Queues the datagram just encoded at `reserve(len)` (without GSO: sends it).
    fn commit(&mut self, len: usize) -> io::Result<()> {
        if !self.p.gso {
            self.sock.send_to(&self.burst.data[..len], self.p.switch)?;
        } else {
            self.burst.commit(len);
        }
        Ok(())
    }

    /// Asks the switch, for each segment still in flight, which members its slot waits for.
    fn diagnose(&mut self, mid: u32, flight: &[Option<InFlight>]) -> Vec<Missing> {
        let mut missing: Vec<Missing> = Vec::new();
        for (slot, f) in flight.iter().enumerate() {
            let Some(f) = f else { continue };
            let flags = if f.epoch == 1 { FLAG_EPOCH } else { 0 };
            let h = Header::new(
                Kind::StatusQuery,
                self.p.op,
                self.p.dtype,
                self.p.job,
                mid,
                f.seg as u32,
                slot as u16,
                self.p.member,
                flags,
                0,
            );
            let mut q = [0u8; HEADER_LEN + 16];
            q[..HEADER_LEN].copy_from_slice(&h.to_bytes());
            let _ = self.sock.send_to(&q, self.p.switch);
            missing.push(Missing {
                slot,
                sid: f.seg as u32,
                members: None,
            });
        }
        let _ = self.set_wait(Duration::from_millis(20));
        let deadline = Instant::now() + Duration::from_millis(300);
        let job = self.p.job;
        while Instant::now() < deadline && missing.iter().any(|m| m.members.is_none()) {
            let _ = receive(
                &mut self.inbox,
                &self.sock,
                false,
                Duration::ZERO,
                &mut |d: &[u8]| {
                    let Ok(p) = wire::decode(d) else { return };
                    let h = p.header;
                    if h.kind != Kind::StatusReply as u8 || h.jid() != job {
                        return;
                    }
                    let Some(m) = missing.iter_mut().find(|m| m.slot == h.seg() as usize) else {
                        return;
                    };
                    if h.mid() == mid && h.sid() == m.sid {
                        let seen = u64::from_le_bytes(p.payload[..8].try_into().unwrap());
                        let all = u64::from_le_bytes(p.payload[8..16].try_into().unwrap());
                        m.members = Some(crate::dataplane::members_of(all & !seen));
                    }
                },
            );
        }
        missing
    }

    fn rto(&self) -> Duration {
        match self.srtt {
            None => self.p.timeout,
            // The floor absorbs scheduling delays when workers outnumber cores.
            Some(s) => (s * 4).clamp(Duration::from_millis(10), self.p.max_timeout),
        }
    }

    fn sample_rtt(&mut self, rtt: Duration) {
        self.srtt = Some(match self.srtt {
            None => rtt,
            Some(s) => (s * 7 + rtt) / 8,
        });
    }

    /// Sends segment `seg` on `slot` with the slot's next epoch.
    fn send(
        &mut self,
        buf: &[u8],
        mid: u32,
        slot: usize,
        seg: usize,
        nseg: usize,
        seg_bytes: usize,
    ) -> Result<InFlight, AllreduceError> {
        let epoch = (self.uses[slot] & 1) as u8;
        self.uses[slot] = self.uses[slot].wrapping_add(1);
        self.send_epoch(buf, mid, slot, seg, nseg, seg_bytes, epoch)
    }

    #[expect(clippy::too_many_arguments, reason = "the segment's coordinates")]
    fn send_epoch(
        &mut self,
        buf: &[u8],
        mid: u32,
        slot: usize,
        seg: usize,
        nseg: usize,
        seg_bytes: usize,
        epoch: u8,
    ) -> Result<InFlight, AllreduceError> {
        let size = self.p.dtype.size();
        let lo = seg * seg_bytes;
        let hi = (lo + seg_bytes).min(buf.len());
        let count = (hi - lo) / size;
        let mut flags = if epoch == 1 { FLAG_EPOCH } else { 0 };
        if seg + 1 == nseg {
            flags |= FLAG_LAST;
        }
        let mut h = Header::new(
            Kind::Contribution,
            self.p.op,
            self.p.dtype,
            self.p.job,
            mid,
            seg as u32,
            slot as u16,
            self.p.member,
            flags,
            count as u16,
        );
        let lane = wire::lane(self.p.op, self.p.dtype).expect("checked in new");
        let lane_bytes = count * lane.size();
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let at = self.reserve(len)?;
        let out = &mut self.burst.data[at..at + len];
        let enc = codec::encode(
            self.p.op,
            self.p.dtype,
            &buf[lo..hi],
            &mut out[HEADER_LEN..HEADER_LEN + lane_bytes],
        );
        h.exponent = enc.exponent;
        h.enc_flags = enc.flags.to_be_bytes();
        out[HEADER_LEN + lane_bytes..].fill(0);
        out[..HEADER_LEN].copy_from_slice(&h.to_bytes());
        self.commit(len)?;
        Ok(InFlight {
            seg,
            epoch,
            sent: Instant::now(),
            rto: self.rto(),
            retransmitted: false,
        })
    }
}

/// Checks a received datagram against the segments in flight and writes its result
/// into `buf`; returns the slot, the segment it completed and the encoding flags.
fn accept(
    w: &WorkerParams,
    d: &[u8],
    mid: u32,
    flight: &[Option<InFlight>],
    buf: &mut [u8],
    seg_bytes: usize,
) -> Option<(usize, usize, u16)> {
    let p = wire::decode(d).ok()?;
    let h = p.header;
    if h.kind != Kind::Result as u8 || h.jid() != w.job || h.mid() != mid {
        return None;
    }
    let slot = h.seg() as usize;
    let f = flight.get(slot)?.as_ref()?;
    if f.seg as u32 != h.sid() || h.epoch() as u8 != f.epoch || h.dtype != w.dtype as u8 {
        return None;
    }
    let lo = f.seg * seg_bytes;
    let hi = (lo + seg_bytes).min(buf.len());
    if h.count() as usize * w.dtype.size() != hi - lo || h.op != w.op as u8 {
        return None;
    }
    let flags = h.enc_flags();
    if flags & ENC_NONFINITE != 0 {
        codec::fill_nan(w.dtype, &mut buf[lo..hi]);
    } else {
        codec::decode(
            w.op,
            w.dtype,
            w.members,
            p.payload,
            h.exponent,
            &mut buf[lo..hi],
        );
    }
    Some((slot, f.seg, flags))
}

/// Where results come in: the UDP socket (with its receive buffer), or AF_XDP and, for
/// results the host program passed on (another receive queue), the UDP socket.
enum Inbox {
    Socket(Vec<u8>),
    Xsk {
        xsk: Box<crate::xsk::XskReceiver>,
        rx: Vec<u8>,
        /// How long a blocking receive waits.
        wait: Duration,
    },
}

/// Hands each datagram that came in to `f`: from the socket one datagram, or with UDP GRO
/// several of the same length coalesced; from AF_XDP a batch of frames, in place.
/// Waits (polling for `spin` first, then the socket's read timeout or the inbox's `wait`)
/// unless `nonblocking`.
fn receive(
    inbox: &mut Inbox,
    sock: &UdpSocket,
    nonblocking: bool,
    spin: Duration,
    f: &mut impl FnMut(&[u8]),
) -> io::Result<()> {
    if !nonblocking && !spin.is_zero() {
        let until = Instant::now() + spin;
        loop {
            match receive(inbox, sock, true, Duration::ZERO, f) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
    }
    let (xsk, rx, wait) = match inbox {
        Inbox::Socket(rx) => return receive_socket(sock, rx, nonblocking, f),
        Inbox::Xsk { xsk, rx, wait } => (xsk, rx, *wait),
    };
    loop {
        if xsk.drain(f) > 0 {
            return Ok(());
        }
        match receive_socket(sock, rx, true, f) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        if nonblocking {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut fds = [xsk.fd(), sock.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        match unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) } {
            0 => return Err(io::ErrorKind::TimedOut.into()),
            r if r < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            _ => {}
        }
    }
}

/// [`receive`] from the UDP socket.
fn receive_socket(
    sock: &UdpSocket,
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
    let mut iov = [std::io::IoSliceMut::new(rx)];
    let msg = recvmsg::<SockaddrIn>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), flags)
        .map_err(io::Error::from)?;
    let n = msg.bytes;
    let mut stride = n;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::UdpGroSegments(s) = c {
            stride = s as usize;
        }
    }
    for d in rx[..n].chunks(stride.max(1)) {
        f(d);
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
    /// them, else at the start, the queued ones sent first.
    fn reserve(&mut self, len: usize, sock: &UdpSocket, to: SocketAddrV4) -> io::Result<usize> {
        // GSO cuts the burst into datagrams of the first one's length: a shorter one may
        // only come last, and the whole burst must fit one 64 KiB super-packet.
        let fits = self.n == 0
            || (!self.closed
                && len <= self.stride
                && self.len + len <= GSO_MAX_BYTES
                && self.n < GSO_MAX_SEGMENTS);
        if !fits {
            self.flush(sock, to)?;
        }
        Ok(self.len)
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

    /// Sends what is queued: one datagram, or one GSO super-packet.
    fn flush(&mut self, sock: &UdpSocket, to: SocketAddrV4) -> io::Result<()> {
        match self.n {
            0 => return Ok(()),
            1 => {
                sock.send_to(&self.data[..self.len], to)?;
            }
            _ => {
                use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
                let stride = self.stride as u16;
                let cmsg = [ControlMessage::UdpGsoSegments(&stride)];
                let iov = [std::io::IoSlice::new(&self.data[..self.len])];
                sendmsg(
                    sock.as_raw_fd(),
                    &iov,
                    &cmsg,
                    MsgFlags::empty(),
                    Some(&SockaddrIn::from(to)),
                )
                .map_err(io::Error::from)?;
            }
        }
        self.len = 0;
        self.n = 0;
        self.closed = false;
        Ok(())
    }
}
