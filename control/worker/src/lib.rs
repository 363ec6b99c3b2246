//! The worker library: allreduce of a buffer through an aggregation switch. What an MPI
//! interposer or a Python module links: no daemon, no loader, no async runtime; AF_XDP
//! receive behind the `afxdp` feature.
//!
//! The buffer is cut into segments of the job's length and sent through the window
//! ([`window`]: segments in flight, shadow copies, retransmission) over the transport
//! ([`transport`]: UDP with GSO/GRO, or AF_XDP receive). A contribution whose result does
//! not come back in time is sent again; the switch never adds it twice and answers it with
//! the stored result if the slot already finished.
//!
//! ```no_run
//! # use xagg_worker::*;
//! # fn main() -> Result<(), AllreduceError> {
//! let shape = xagg_common::JobShape::full(4, 128).expect("a valid shape");
//! let p = WorkerParams::new(
//!     "10.77.0.1:47800".parse().unwrap(),
//!     "10.77.0.11:47801".parse().unwrap(),
//!     1, // job
//!     0, // member index
//!     shape,
//! );
//! let mut worker = Worker::new(p)?;
//! let mut grads = vec![1i32; 1 << 20];
//! worker.allreduce(&mut grads)?;
//! # Ok(()) }
//! ```

pub mod codec;
pub mod data;
mod error;
mod params;
pub mod report;
pub mod transport;
pub mod window;
#[cfg(feature = "afxdp")]
pub mod xsk;

use std::{
    io,
    time::{Duration, Instant},
};

pub use error::{AllreduceError, Missing};
pub use params::WorkerParams;
pub use report::Report;
use transport::Transport;
use window::{InFlight, Window};
use xagg_common::{
    job::members_of,
    slot::ShadowState,
    wire::{self, DType, Header, Kind, Lane, Op, ENC_NONFINITE, ENC_OVERFLOW, HEADER_LEN},
};

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

/// What a message reduces: its op and data type, and the lane they travel in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub op: Op,
    pub dtype: DType,
    pub lane: Lane,
}

impl Reduction {
    /// `op` over `dtype`, if the switch reduces it.
    pub fn new(op: Op, dtype: DType) -> Result<Self, AllreduceError> {
        let lane = wire::lane(op, dtype).ok_or_else(|| {
            AllreduceError::Invalid(format!(
                "{op} over {dtype} is not supported (floats take sum, min, max, avg)"
            ))
        })?;
        Ok(Self { op, dtype, lane })
    }
}

pub struct Worker {
    p: WorkerParams,
    /// What the current message reduces (each message carries its own).
    reduction: Reduction,
    transport: Transport,
    window: Window,
    next_message: u32,
    rng: u64,
    /// Whether the window knows which shadow copy each slot uses next ([`Worker::sync`]).
    synced: bool,
}

impl Worker {
    pub fn new(p: WorkerParams) -> Result<Self, AllreduceError> {
        p.lane()?;
        check_mtu(&p)?;
        Ok(Self {
            transport: Transport::new(&p)?,
            window: Window::new(p.job, p.shape.slots(), p.timeout, p.max_timeout),
            next_message: p.first_message.unwrap_or(0),
            synced: false,
            rng: 0x9e37_79b9_7f4a_7c15 ^ (p.member as u64) << 17 ^ p.job as u64,
            reduction: Reduction::new(p.op, p.dtype)?,
            p,
        })
    }

    pub fn params(&self) -> &WorkerParams {
        &self.p
    }

    /// Learns from the switch which shadow copy each of the job's slots takes next, so a
    /// job continued by a new process (`first_message` after an earlier process's last)
    /// keeps every stored result someone may still ask for. The first allreduce does it
    /// when it has not been done; calling it before the clock of a measurement starts
    /// keeps its round trip out of the figures.
    ///
    /// Per slot the worker asks for both copies. A copy holding a round of its own first
    /// message was started by the other members: it joins that copy. Otherwise the next
    /// round takes the copy that does not hold the newest round (copy 0 when both are
    /// empty, as on a new job): exactly what a process that had run the earlier messages
    /// would use, since every earlier message's rounds are complete before any member
    /// sends a later one.
    pub fn sync(&mut self) -> Result<(), AllreduceError> {
        if self.synced {
            return Ok(());
        }
        let slots = self.p.shape.slots();
        // Per slot and copy: (state, message, segment) as the switch answered.
        let mut copies: Vec<[Option<(u8, u32, u32)>; 2]> = vec![[None; 2]; slots];
        let start = Instant::now();
        let mut next_send = start;
        self.transport.set_wait(Duration::from_millis(5))?;
        let job = self.p.job;
        while copies.iter().any(|c| c.iter().any(Option::is_none)) {
            let now = Instant::now();
            if now.duration_since(start) > self.p.give_up {
                return Err(AllreduceError::NoSwitch {
                    job,
                    switch: self.p.switch,
                    waited: now.duration_since(start),
                });
            }
            if now >= next_send {
                for (slot, c) in copies.iter().enumerate() {
                    for shadow in [0u8, 1] {
                        if c[usize::from(shadow)].is_none() {
                            self.query(self.next_message, 0, slot, shadow)?;
                        }
                    }
                }
                next_send = now + self.window.rto();
            }
            let mut refusal = None;
            let got = self.receive_status(&mut |h, _| {
                if wire::status::is_refusal(h.status) {
                    refusal = Some((h.status, h.slot()));
                } else if let Some(c) = copies.get_mut(usize::from(h.slot())) {
                    c[h.shadow()] = Some((h.status, h.message(), h.segment()));
                }
            });
            if let Some((code, slot)) = refusal {
                return Err(self.refused(code, slot));
            }
            match got {
                Err(e)
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(e.into())
                }
                _ => {}
            }
        }
        let copies: Vec<[(u8, u32, u32); 2]> = copies
            .iter()
            .map(|c| c.map(|x| x.expect("every copy answered")))
            .collect();
        if self.p.first_message.is_none() {
            self.next_message = next_message(&copies);
        }
        for (slot, held) in copies.iter().enumerate() {
            self.window
                .set_next_shadow(slot, next_shadow(*held, self.next_message));
        }
        self.synced = true;
        Ok(())
    }

    /// Waits once for what comes in, handing each status reply of the job (its header and
    /// payload) to `f`.
    fn receive_status(&mut self, f: &mut impl FnMut(&Header, &[u8])) -> io::Result<()> {
        let job = self.p.job;
        self.transport
            .receive(false, Duration::ZERO, &mut |d: &[u8]| {
                let Ok(p) = wire::decode(d) else { return };
                if p.header.kind == Kind::StatusReply as u8 && p.header.job() == job {
                    f(&p.header, p.payload);
                }
            })
    }

    /// Why the switch refused this member, from a status reply's refusal `code`.
    fn refused(&self, code: u8, slot: u16) -> AllreduceError {
        let (job, member) = (self.p.job, self.p.member);
        let reason = match code {
            wire::status::REFUSED_UNKNOWN_JOB => {
                format!("it has no job {job}: add the job first, or check --job")
            }
            wire::status::REFUSED_NOT_MEMBER => format!(
                "this is not member {member} of the job as registered: the member index, the switch port this host is behind, or its MAC, IPv4 address or UDP port ({}) differ from the job's; compare --member and --bind with `xagg job list --json`",
                self.p.bind
            ),
            wire::status::REFUSED_SLOT_RANGE => format!(
                "slot {slot} is outside the job's slots: this worker's --slots ({}) is more than the job has",
                self.p.shape.slots()
            ),
            c => format!("refusal {c:#x}"),
        };
        AllreduceError::Refused { job, reason }
    }

    /// Asks the switch for the state of `shadow` of `slot` (the round given is the one the
    /// worker has in mind; the reply carries the copy's own).
    fn query(
        &mut self,
        message: u32,
        segment: u32,
        slot: usize,
        shadow: u8,
    ) -> Result<(), AllreduceError> {
        let h = Header::builder(Kind::StatusQuery)
            .op(self.reduction.op)
            .dtype(self.reduction.dtype)
            .job(self.p.job)
            .message(message)
            .segment(segment)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(shadow)
            .build();
        let mut q = [0u8; HEADER_LEN + wire::STATUS_PAYLOAD];
        let n = wire::finish(&h, wire::STATUS_PAYLOAD, &mut q).expect("room for a query");
        self.transport.send_now(&q[..n])?;
        Ok(())
    }

    /// Allreduce of `buf` in place with the job's op (`WorkerParams::op`).
    pub fn allreduce<T: Element>(&mut self, buf: &mut [T]) -> Result<Report, AllreduceError> {
        self.allreduce_op(self.p.op, buf)
    }

    /// Allreduce of `buf` in place with `op`: every message carries its own op and type,
    /// so one job reduces any pair the switch supports.
    pub fn allreduce_op<T: Element>(
        &mut self,
        op: Op,
        buf: &mut [T],
    ) -> Result<Report, AllreduceError> {
        // Little-endian host: the buffer's bytes are already the wire's element encoding.
        const _: () = assert!(cfg!(target_endian = "little"));
        // Safety: `Element` types are plain data without padding, valid for any bytes the
        // reduction writes back (sealed: only the types above).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                buf.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(buf),
            )
        };
        self.allreduce_bytes_as(op, T::DTYPE, bytes)
    }

    /// Allreduce of a buffer of little-endian elements of the job's data type, with the
    /// job's op.
    pub fn allreduce_bytes(&mut self, buf: &mut [u8]) -> Result<Report, AllreduceError> {
        self.allreduce_bytes_as(self.p.op, self.p.dtype, buf)
    }

    /// Allreduce of a buffer of little-endian elements of `dtype`, with `op`.
    pub fn allreduce_bytes_as(
        &mut self,
        op: Op,
        dtype: DType,
        buf: &mut [u8],
    ) -> Result<Report, AllreduceError> {
        let reduction = Reduction::new(op, dtype)?;
        let size = dtype.size();
        if !buf.len().is_multiple_of(size) {
            return Err(AllreduceError::Invalid(format!(
                "buffer of {} bytes is not a whole number of {dtype} elements",
                buf.len(),
            )));
        }
        // A segment carries as many lanes of this message's type as fit the job's bytes.
        let elements = self.p.shape.segment_bytes() / reduction.lane.size();
        if elements == 0 {
            return Err(AllreduceError::Invalid(format!(
                "the job's segments of {} bytes hold no {}-byte lane of {op} over {dtype}",
                self.p.shape.segment_bytes(),
                reduction.lane.size()
            )));
        }
        if !buf.is_empty() {
            self.sync()?;
        }
        let start = Instant::now();
        let message = self.next_message;
        self.next_message = self.next_message.wrapping_add(1);
        self.reduction = reduction;
        let segment_bytes = elements * size;
        let segments = self.window.begin(message, buf.len(), segment_bytes);
        let mut report = Report {
            bytes: buf.len(),
            segments,
            ..Report::default()
        };
        if segments == 0 {
            return Ok(report);
        }
        let (refused, lost_sends) = (self.transport.refused(), self.transport.lost_sends());
        let width = self.window.width();
        let mut order: Vec<usize> = (0..width).collect();
        if self.p.reorder {
            for i in (1..order.len()).rev() {
                self.rng = data::mix(self.rng);
                order.swap(i, (self.rng % (i as u64 + 1)) as usize);
            }
            report.reordered = order
                .iter()
                .enumerate()
                .filter(|(i, &s)| order[..*i].iter().any(|&e| e > s))
                .count() as u64;
        }
        for slot in order {
            self.send_next(buf, slot, slot)?;
        }
        let mut done = 0;
        let (mut nonfinite, mut overflow) = (Vec::new(), Vec::new());
        let mut answered = Vec::with_capacity(64);
        let spin = if segments <= width {
            self.p.spin
        } else {
            Duration::ZERO
        };
        let mut last_progress = Instant::now();
        let mut next_check = Instant::now() + self.window.rto();
        self.transport
            .set_wait(self.window.rto() / 4 + Duration::from_micros(100))?;
        self.transport.flush()?;
        while done < segments {
            // Results already queued are taken without blocking; once none is left, the
            // segments they freed go out as one burst, and only then does the worker wait.
            let (r, members, window) = (self.reduction, self.p.shape.members(), &self.window);
            let mut take = |d: &[u8]| {
                if let Some(a) = accept(r, members, window, d, buf) {
                    answered.push(a);
                }
            };
            let got = if self.transport.queued() {
                match self.transport.receive(true, spin, &mut take) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.transport.flush()?;
                        self.transport.receive(false, spin, &mut take)
                    }
                    r => r,
                }
            } else {
                self.transport.receive(false, spin, &mut take)
            };
            match got {
                Ok(()) => {
                    for (a, flags) in answered.drain(..) {
                        let Some(f) = self.window.take(&a) else {
                            continue;
                        };
                        if flags & ENC_NONFINITE != 0 {
                            nonfinite.push(f.segment as u32);
                        }
                        if flags & ENC_OVERFLOW != 0 {
                            overflow.push(f.segment as u32);
                        }
                        done += 1;
                        last_progress = Instant::now();
                        if let Some(next) = self.window.next_on(f.segment) {
                            self.send_next(buf, a.slot, next)?;
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
            next_check = now + self.window.rto() / 4;
            if now.duration_since(last_progress) > self.p.give_up {
                let missing = self.diagnose();
                return Err(AllreduceError::Timeout {
                    job: self.p.job,
                    message,
                    waited: now.duration_since(last_progress),
                    missing,
                });
            }
            for (slot, mut f) in self.window.due(now) {
                self.send(buf, slot, &f)?;
                f.sent = Instant::now();
                self.window.sent(slot, f);
                report.retransmissions += 1;
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        report.refused = self.transport.refused() - refused;
        report.lost_sends = self.transport.lost_sends() - lost_sends;
        report.goodput_gbps = buf.len() as f64 * 8.0 / report.seconds / 1e9;
        if !nonfinite.is_empty() {
            nonfinite.sort();
            return Err(AllreduceError::NonFinite {
                job: self.p.job,
                message,
                segments: nonfinite,
            });
        }
        if !overflow.is_empty() {
            overflow.sort();
            return Err(AllreduceError::Overflow {
                job: self.p.job,
                message,
                segments: overflow,
            });
        }
        Ok(report)
    }

    /// Sends `segment` on `slot`'s next shadow copy and records it in flight.
    fn send_next(&mut self, buf: &[u8], slot: usize, segment: usize) -> Result<(), AllreduceError> {
        let f = InFlight {
            segment,
            shadow: self.window.next_shadow(slot),
            sent: Instant::now(),
            rto: self.window.rto(),
            retransmitted: false,
        };
        self.send(buf, slot, &f)?;
        self.window.sent(slot, f);
        Ok(())
    }

    /// Encodes the contribution `f` on `slot` in place into the transport's send buffer.
    fn send(&mut self, buf: &[u8], slot: usize, f: &InFlight) -> Result<(), AllreduceError> {
        let range = self.window.range(f.segment);
        let r = self.reduction;
        let count = range.len() / r.dtype.size();
        let lane_bytes = count * r.lane.size();
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let out = self.transport.reserve(len)?;
        let enc = codec::encode(
            r.op,
            r.dtype,
            &buf[range],
            &mut out[HEADER_LEN..HEADER_LEN + lane_bytes],
        );
        let h = Header::builder(Kind::Contribution)
            .op(r.op)
            .dtype(r.dtype)
            .job(self.p.job)
            .message(self.window.message())
            .segment(f.segment as u32)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(f.shadow)
            .last(self.window.is_last(f.segment))
            .count(count as u16)
            .exponent(enc.exponent)
            .enc_flags(enc.flags)
            .build();
        wire::finish(&h, lane_bytes, out).expect("reserved the packet's length");
        self.transport.commit(len)?;
        Ok(())
    }

    /// Asks the switch, for each segment still in flight, which members its slot waits for.
    fn diagnose(&mut self) -> Vec<Missing> {
        let mut missing: Vec<Missing> = Vec::new();
        let message = self.window.message();
        let in_flight: Vec<(usize, InFlight)> =
            self.window.in_flight().map(|(s, f)| (s, *f)).collect();
        for (slot, f) in in_flight {
            let _ = self.query(message, f.segment as u32, slot, f.shadow);
            missing.push(Missing {
                slot,
                segment: f.segment as u32,
                members: None,
                answered: false,
            });
        }
        let _ = self.transport.set_wait(Duration::from_millis(20));
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline && missing.iter().any(|m| !m.answered) {
            let _ = self.receive_status(&mut |h, payload| {
                let Some(m) = missing.iter_mut().find(|m| m.slot == usize::from(h.slot())) else {
                    return;
                };
                m.answered = true;
                if h.message() == message && h.segment() == m.segment {
                    let seen = u64::from_le_bytes(payload[..8].try_into().unwrap());
                    let all = u64::from_le_bytes(payload[8..16].try_into().unwrap());
                    m.members = Some(members_of(all & !seen).collect());
                }
            });
        }
        missing
    }
}

/// Whether the link of the worker's address carries the job's full segments: one IPv4
/// packet each (skipped when no interface here holds the address).
fn check_mtu(p: &WorkerParams) -> Result<(), AllreduceError> {
    let Ok(Some(iface)) = xagg_sys::iface::holding(*p.bind.ip()) else {
        return Ok(());
    };
    let Ok(mtu) = xagg_sys::iface::mtu(&iface) else {
        return Ok(());
    };
    let packet = |payload: usize| 20 + 8 + HEADER_LEN + wire::payload_len(payload, 1);
    let need = packet(p.shape.segment_bytes());
    if mtu < need {
        return Err(AllreduceError::Invalid(format!(
            "the job's segments of {} bytes make {need}-byte packets, but {iface} has an MTU of {mtu}: at most {} bytes of segment fit; raise the MTU or use a job with shorter segments",
            p.shape.segment_bytes(),
            mtu.saturating_sub(packet(0)) & !7
        )));
    }
    Ok(())
}

/// Whether round `(message, segment)` `a` comes after `b`, in the switch's serial-number
/// order (ids may wrap).
fn newer(a: (u32, u32), b: (u32, u32)) -> bool {
    let dm = a.0.wrapping_sub(b.0) as i32;
    dm > 0 || (dm == 0 && (a.1.wrapping_sub(b.1) as i32) > 0)
}

/// The message a new process of a job takes up, from what every slot's copies hold as
/// (state, message, segment): the newest message if some round of it is still filling
/// (the others are in it and wait for this member), else the one after it; 0 on a job
/// that never ran.
fn next_message(copies: &[[(u8, u32, u32); 2]]) -> u32 {
    let held = copies
        .iter()
        .flatten()
        .filter(|c| c.0 != ShadowState::Empty as u8);
    let newest = held
        .clone()
        .map(|c| c.1)
        .reduce(|a, b| if newer((b, 0), (a, 0)) { b } else { a });
    let Some(newest) = newest else {
        return 0;
    };
    let in_progress = held
        .filter(|c| c.1 == newest)
        .any(|c| c.0 == ShadowState::Filling as u8);
    if in_progress {
        newest
    } else {
        newest.wrapping_add(1)
    }
}

/// The copy a slot's next round takes, given what its two copies hold as (state, message,
/// segment) and the worker's first message: see [`Worker::sync`].
fn next_shadow(copies: [(u8, u32, u32); 2], message: u32) -> u8 {
    let held = |c: (u8, u32, u32)| c.0 != ShadowState::Empty as u8;
    if let Some(i) = (0..2).find(|&i| held(copies[i]) && copies[i].1 == message) {
        return i as u8;
    }
    match (held(copies[0]), held(copies[1])) {
        (false, false) => 0,
        (true, false) => 1,
        (false, true) => 0,
        (true, true) => {
            if newer((copies[0].1, copies[0].2), (copies[1].1, copies[1].2)) {
                1
            } else {
                0
            }
        }
    }
}

/// Checks a received datagram against the window and decodes its result into `buf`;
/// returns what it answered and the result's encoding flags.
fn accept(
    r: Reduction,
    members: usize,
    window: &Window,
    d: &[u8],
    buf: &mut [u8],
) -> Option<(window::Answered, u16)> {
    let packet = wire::decode(d).ok()?;
    let h = packet.header;
    let a = window.check(&h, r.op as u8, r.dtype as u8, r.dtype.size())?;
    let range = window.range(a.flight.segment);
    let flags = h.enc_flags();
    if flags & ENC_NONFINITE != 0 {
        codec::fill_nan(r.dtype, &mut buf[range]);
    } else {
        debug_assert_eq!(
            packet.payload.len(),
            range.len() / r.dtype.size() * r.lane.size()
        );
        codec::decode(
            r.op,
            r.dtype,
            members as u32,
            packet.payload,
            h.exponent,
            &mut buf[range],
        );
    }
    Some((a, flags))
}

/// Parses sizes like `64MiB`, `4KiB`, `1GB`, `4096`: binary units (K, KiB, M, MiB, G,
/// GiB) and decimal ones (KB, kB, MB, GB).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| {
        format!("`{s}` is not a size: use a number with an optional unit, e.g. 64MiB")
    })?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}`: use B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each message carries its op and type; what the switch cannot reduce, or what the
    /// job's segments cannot hold, is refused before anything is sent.
    #[test]
    fn messages_are_checked_before_anything_is_sent() {
        // Segments of 4 bytes: one i32 lane, no i64 one.
        let shape = xagg_common::JobShape::new(2, 4, 4).unwrap();
        let p = WorkerParams::new(
            "127.0.0.1:9".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            1,
            0,
            shape,
        );
        let mut w = Worker::new(p.clone()).unwrap();
        let e = w
            .allreduce_op(Op::Xor, &mut [1.0f32; 4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("xor over f32 is not supported"), "{e}");
        let e = w.allreduce(&mut [1i64; 4]).unwrap_err().to_string();
        assert!(e.contains("hold no 8-byte lane"), "{e}");
        let e = w.allreduce_bytes(&mut [0u8; 6]).unwrap_err().to_string();
        assert!(e.contains("not a whole number of i32"), "{e}");
        // An empty buffer needs no switch.
        assert_eq!(w.allreduce::<f32>(&mut []).unwrap().segments, 0);
        // Member indices and the job's own op/type pair are checked when it starts.
        let bad = WorkerParams {
            member: 2,
            ..p.clone()
        };
        assert!(Worker::new(bad).is_err());
        let bad = WorkerParams {
            op: Op::Xor,
            dtype: DType::F32,
            ..p
        };
        assert!(Worker::new(bad).is_err());
    }

    #[test]
    fn the_next_shadow_copy_follows_the_newest_round() {
        let (empty, done) = (ShadowState::Empty as u8, ShadowState::Done as u8);
        let filling = ShadowState::Filling as u8;
        // A new job: copy 0.
        assert_eq!(next_shadow([(empty, 0, 0), (empty, 0, 0)], 0), 0);
        // One round so far, on copy 0: copy 1 next.
        assert_eq!(next_shadow([(done, 4, 3), (empty, 0, 0)], 5), 1);
        // The newest round decides, by message then segment, ids wrapping.
        assert_eq!(next_shadow([(done, 4, 3), (done, 4, 7)], 5), 0);
        assert_eq!(next_shadow([(done, 4, 11), (done, 4, 7)], 5), 1);
        assert_eq!(next_shadow([(done, 0, 0), (done, u32::MAX, 9)], 1), 1);
        // Others already started this message's round on copy 1: join it.
        assert_eq!(next_shadow([(done, 4, 11), (filling, 5, 3)], 5), 1);
    }

    #[test]
    fn a_new_process_takes_up_the_jobs_next_message() {
        let (e, f, d) = (
            ShadowState::Empty as u8,
            ShadowState::Filling as u8,
            ShadowState::Done as u8,
        );
        assert_eq!(next_message(&[[(e, 0, 0), (e, 0, 0)]]), 0);
        // Message 4 done everywhere: 5 next.
        assert_eq!(
            next_message(&[[(d, 4, 0), (d, 3, 2)], [(d, 4, 1), (e, 0, 0)]]),
            5
        );
        // Message 5 under way on one slot: take it up.
        assert_eq!(
            next_message(&[[(d, 4, 0), (f, 5, 0)], [(d, 4, 1), (e, 0, 0)]]),
            5
        );
        // Ids wrap.
        assert_eq!(next_message(&[[(d, u32::MAX, 0), (d, 0, 1)]]), 1);
    }

    #[test]
    fn every_size_spelling() {
        let k = 1usize << 10;
        for (s, want) in [
            ("4096", 4096),
            ("7B", 7),
            ("4K", 4 * k),
            ("4k", 4 * k),
            ("4KiB", 4 * k),
            ("64M", 64 << 20),
            ("64MiB", 64 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("1KB", 1000),
            ("1kB", 1000),
            ("2MB", 2_000_000),
            ("1GB", 1_000_000_000),
            (" 16 MiB ", 16 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
