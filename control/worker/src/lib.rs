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
    wire::{self, DType, Header, Kind, Lane, ENC_NONFINITE, ENC_OVERFLOW, HEADER_LEN},
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

pub struct Worker {
    p: WorkerParams,
    lane: Lane,
    transport: Transport,
    window: Window,
    next_message: u32,
    rng: u64,
}

impl Worker {
    pub fn new(p: WorkerParams) -> Result<Self, AllreduceError> {
        let lane = p.lane()?;
        Ok(Self {
            transport: Transport::new(&p)?,
            window: Window::new(p.job, p.shape.slots(), p.timeout, p.max_timeout),
            next_message: p.first_message,
            rng: 0x9e37_79b9_7f4a_7c15 ^ (p.member as u64) << 17 ^ p.job as u64,
            lane,
            p,
        })
    }

    pub fn params(&self) -> &WorkerParams {
        &self.p
    }

    /// Allreduce of `buf` in place; `T` must be the job's data type.
    pub fn allreduce<T: Element>(&mut self, buf: &mut [T]) -> Result<Report, AllreduceError> {
        if T::DTYPE != self.p.dtype {
            return Err(AllreduceError::Invalid(format!(
                "a buffer of {} for a job of {}",
                T::DTYPE,
                self.p.dtype
            )));
        }
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
        self.allreduce_bytes(bytes)
    }

    /// Allreduce of a buffer of little-endian elements of the job's data type.
    pub fn allreduce_bytes(&mut self, buf: &mut [u8]) -> Result<Report, AllreduceError> {
        let size = self.p.dtype.size();
        if !buf.len().is_multiple_of(size) {
            return Err(AllreduceError::Invalid(format!(
                "buffer of {} bytes is not a whole number of {} elements",
                buf.len(),
                self.p.dtype
            )));
        }
        let start = Instant::now();
        let message = self.next_message;
        self.next_message = self.next_message.wrapping_add(1);
        let segment_bytes = self.p.segment_elements() * size;
        let segments = self.window.begin(message, buf.len(), segment_bytes);
        let mut report = Report {
            bytes: buf.len(),
            segments,
            ..Report::default()
        };
        if segments == 0 {
            return Ok(report);
        }
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
            let (p, lane, window) = (&self.p, self.lane, &self.window);
            let mut take = |d: &[u8]| {
                if let Some(a) = accept(p, lane, window, d, buf) {
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
        let count = range.len() / self.p.dtype.size();
        let lane_bytes = count * self.lane.size();
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let out = self.transport.reserve(len)?;
        let enc = codec::encode(
            self.p.op,
            self.p.dtype,
            &buf[range],
            &mut out[HEADER_LEN..HEADER_LEN + lane_bytes],
        );
        let h = Header::builder(Kind::Contribution)
            .op(self.p.op)
            .dtype(self.p.dtype)
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
        for (slot, f) in self.window.in_flight() {
            let h = Header::builder(Kind::StatusQuery)
                .op(self.p.op)
                .dtype(self.p.dtype)
                .job(self.p.job)
                .message(message)
                .segment(f.segment as u32)
                .slot(slot as u16)
                .member(self.p.member)
                .shadow(f.shadow)
                .build();
            let mut q = [0u8; HEADER_LEN + wire::STATUS_PAYLOAD];
            let n = wire::finish(&h, wire::STATUS_PAYLOAD, &mut q).expect("room for a query");
            let _ = self.transport.send_now(&q[..n]);
            missing.push(Missing {
                slot,
                segment: f.segment as u32,
                members: None,
            });
        }
        let _ = self.transport.set_wait(Duration::from_millis(20));
        let deadline = Instant::now() + Duration::from_millis(300);
        let job = self.p.job;
        while Instant::now() < deadline && missing.iter().any(|m| m.members.is_none()) {
            let _ = self
                .transport
                .receive(false, Duration::ZERO, &mut |d: &[u8]| {
                    let Ok(p) = wire::decode(d) else { return };
                    let h = p.header;
                    if h.kind != Kind::StatusReply as u8 || h.job() != job {
                        return;
                    }
                    let Some(m) = missing.iter_mut().find(|m| m.slot == usize::from(h.slot()))
                    else {
                        return;
                    };
                    if h.message() == message && h.segment() == m.segment {
                        let seen = u64::from_le_bytes(p.payload[..8].try_into().unwrap());
                        let all = u64::from_le_bytes(p.payload[8..16].try_into().unwrap());
                        m.members = Some(members_of(all & !seen).collect());
                    }
                });
        }
        missing
    }
}

/// Checks a received datagram against the window and decodes its result into `buf`;
/// returns what it answered and the result's encoding flags.
fn accept(
    p: &WorkerParams,
    lane: Lane,
    window: &Window,
    d: &[u8],
    buf: &mut [u8],
) -> Option<(window::Answered, u16)> {
    let packet = wire::decode(d).ok()?;
    let h = packet.header;
    let a = window.check(&h, p.op as u8, p.dtype as u8, p.dtype.size())?;
    let range = window.range(a.flight.segment);
    let flags = h.enc_flags();
    if flags & ENC_NONFINITE != 0 {
        codec::fill_nan(p.dtype, &mut buf[range]);
    } else {
        debug_assert_eq!(
            packet.payload.len(),
            range.len() / p.dtype.size() * lane.size()
        );
        codec::decode(
            p.op,
            p.dtype,
            p.shape.members() as u32,
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

    /// A buffer of another type than the job's is refused before anything is sent.
    #[test]
    fn typed_buffers_match_the_job() {
        let shape = xagg_common::JobShape::full(2, 4).unwrap();
        let p = WorkerParams::new(
            "127.0.0.1:9".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            1,
            0,
            shape,
        );
        let mut w = Worker::new(p.clone()).unwrap();
        let e = w.allreduce(&mut [1.0f32; 4]).unwrap_err().to_string();
        assert!(e.contains("a buffer of f32 for a job of i32"), "{e}");
        let e = w
            .allreduce(&mut [half::f16::ONE; 4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("f16"), "{e}");
        // An empty buffer needs no switch.
        assert_eq!(w.allreduce::<i32>(&mut []).unwrap().segments, 0);
        // Member indices and op/type pairs are checked against the job.
        let bad = WorkerParams {
            member: 2,
            ..p.clone()
        };
        assert!(Worker::new(bad).is_err());
        let bad = WorkerParams {
            op: wire::Op::Xor,
            dtype: DType::F32,
            ..p
        };
        assert!(Worker::new(bad).is_err());
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
