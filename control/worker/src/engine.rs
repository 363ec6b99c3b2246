//! The worker's engine: what makes the requests of one member of a job progress. It
//! learns the job's state from the switch first (which message comes next, which shadow
//! copy each slot takes), schedules the rounds of every request in flight onto the slots,
//! takes results in, sends again what is due, and ends each request with its completion.
//!
//! **The schedule.** Segment `i` of message `k` goes to slot `(k + i) mod W` (W = the job's
//! slots), and each slot takes its rounds in (message, segment) order: all of message `k`'s
//! segments on it, then message `k + 1`'s. So requests pipeline — a slot the last message
//! left free takes the next message's segment at once — and every member derives the same
//! sequence of rounds per slot from the messages' sizes alone, which is why all members
//! must submit a job's requests in the same order with the same lengths and types.
//!
//! The engine runs only inside the library's calls ([`crate::request`]), under its
//! worker's lock.

use std::{
    collections::VecDeque,
    io,
    os::fd::RawFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, TryLockError,
    },
    time::{Duration, Instant},
};

use xagg_common::{
    job::members_of,
    slot::ShadowState,
    wire::{self, Header, Kind, ENC_NONFINITE, ENC_OVERFLOW, HEADER_LEN},
};

use crate::{
    codec, data,
    request::{lock, Buffer, Completion, Shared},
    transport::Transport,
    window::{Answered, InFlight, Window},
    AllreduceError, Missing, Reduction, Report, WorkerParams,
};

/// How long a request's diagnosis waits for the switch's status replies.
const DIAGNOSIS: Duration = Duration::from_millis(300);
/// A pause between two calls into the library longer than this does not count towards a
/// request's give-up time: nobody was making progress.
const IDLE_GAP: Duration = Duration::from_millis(50);

/// A request handed to the worker and not yet taken up by the engine.
pub(crate) struct Pending {
    pub r: Reduction,
    pub input: Option<Buffer>,
    pub output: Buffer,
    pub shared: Arc<Shared>,
}

/// What a worker shares between its handles: its parameters, the engine behind a lock,
/// and the requests submitted since the engine last ran.
pub(crate) struct WorkerInner {
    pub p: WorkerParams,
    engine: Mutex<Engine>,
    inbox: Mutex<Vec<Pending>>,
    /// How long one blocking step waits (nanoseconds), from the engine's timeout.
    step_ns: AtomicU64,
    fds: Vec<RawFd>,
    /// The job this worker joined over the network, to leave it.
    pub membership: Option<crate::join::Membership>,
}

impl WorkerInner {
    pub fn new(p: WorkerParams, transport: Transport) -> Self {
        let fds = transport.fds();
        let engine = Engine::new(p.clone(), transport);
        Self {
            step_ns: AtomicU64::new(engine.step_wait().as_nanos() as u64),
            engine: Mutex::new(engine),
            inbox: Mutex::new(Vec::new()),
            fds,
            p,
            membership: None,
        }
    }

    /// Hands a request to the engine: taken up at once unless another thread is inside
    /// the engine, else at that thread's next step.
    pub fn enqueue(&self, pending: Pending) {
        lock(&self.inbox).push(pending);
        // Its first rounds go out now; what comes back is taken by whoever waits.
        let mut e = match self.engine.try_lock() {
            Ok(e) => e,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let pending = std::mem::take(&mut *lock(&self.inbox));
        e.admit(pending);
        e.send_queued();
    }

    /// One step of the engine, waiting up to `wait` for something to come in; false if
    /// another thread holds the engine (it is making progress for everyone).
    pub fn progress(&self, wait: Duration) -> bool {
        let mut e = match self.engine.try_lock() {
            Ok(e) => e,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let pending = std::mem::take(&mut *lock(&self.inbox));
        e.admit(pending);
        e.step(wait);
        self.step_ns
            .store(e.step_wait().as_nanos() as u64, Ordering::Relaxed);
        true
    }

    /// How long one blocking step should wait: long enough to sleep, short enough for the
    /// retransmission timers.
    pub fn step(&self) -> Duration {
        Duration::from_nanos(self.step_ns.load(Ordering::Relaxed))
    }

    /// Runs `f` on the engine, waiting for the lock.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut lock(&self.engine))
    }
}

/// Waits until one of the workers' sockets has something to read, or `d` passed.
pub(crate) fn wait_readable(workers: &[Arc<WorkerInner>], d: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    let fds: Vec<RawFd> = workers.iter().flat_map(|w| w.fds.iter().copied()).collect();
    // Safety: each worker's transport, which owns these descriptors, outlives the call
    // (the workers are held by the caller).
    let mut polled: Vec<PollFd> = fds
        .iter()
        .map(|&fd| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, PollFlags::POLLIN))
        .collect();
    let ms = d.as_millis().clamp(1, 1000) as u16;
    let _ = poll(&mut polled, PollTimeout::from(ms));
}

/// What the engine knows of the job's state at the switch.
enum Sync {
    /// Nothing yet: the first request starts the queries.
    Unknown,
    /// Asked; per slot and copy, (state, message, segment) as the switch answered.
    Asking {
        copies: Vec<[Option<(u8, u32, u32)>; 2]>,
        started: Instant,
        next_send: Instant,
    },
    Known,
}

/// A request the engine works on.
struct Active {
    shared: Arc<Shared>,
    r: Reduction,
    input: Option<Buffer>,
    output: Buffer,
    /// Its message id, from when the engine knows the job's next one.
    message: Option<u32>,
    /// Buffer bytes of a full segment, and the number of segments.
    segment_bytes: usize,
    segments: usize,
    /// Segments sent at least once, the highest sent so far, segments answered, and
    /// segments in flight now.
    sent: usize,
    highest_sent: Option<usize>,
    done: usize,
    in_flight: usize,
    nonfinite: Vec<u32>,
    overflow: Vec<u32>,
    report: Report,
    started: Option<Instant>,
    last_progress: Instant,
    /// Refused and lost datagrams of the worker when the request started.
    refused0: u64,
    lost0: u64,
    /// Set when it gave up and asks the switch why.
    diagnosis: Option<Diagnosis>,
}

struct Diagnosis {
    until: Instant,
    waited: Duration,
    missing: Vec<Missing>,
    refusal: Option<(u8, u16)>,
}

impl Active {
    fn range(&self, segment: usize) -> std::ops::Range<usize> {
        let lo = segment * self.segment_bytes;
        lo..(lo + self.segment_bytes).min(self.output.len())
    }

    /// Whether it is still sending and taking results.
    fn running(&self) -> bool {
        self.message.is_some() && self.diagnosis.is_none()
    }
}

pub(crate) struct Engine {
    p: WorkerParams,
    transport: Transport,
    window: Window,
    sync: Sync,
    /// Why the last attempt to learn the job's state failed (for [`Engine::sync`]).
    sync_error: Option<AllreduceError>,
    next_message: u32,
    /// Requests by message id (those still waiting for one last).
    active: VecDeque<Active>,
    /// Per slot: its next round is not before this (message, segment).
    cursor: Vec<(u32, usize)>,
    rng: u64,
    wait_set: Duration,
    next_check: Instant,
    last_step: Instant,
    answered: Vec<(Answered, u16)>,
    replies: Vec<(Header, [u8; wire::STATUS_PAYLOAD])>,
}

impl Engine {
    fn new(p: WorkerParams, transport: Transport) -> Self {
        let now = Instant::now();
        Self {
            window: Window::new(
                p.job,
                p.shape.slots(),
                p.timeout,
                (p.min_timeout, p.max_timeout),
            ),
            cursor: vec![(0, 0); p.shape.slots()],
            next_message: p.first_message.unwrap_or(0),
            rng: 0x9e37_79b9_7f4a_7c15 ^ (p.member as u64) << 17 ^ p.job as u64,
            sync: Sync::Unknown,
            sync_error: None,
            active: VecDeque::new(),
            wait_set: Duration::ZERO,
            next_check: now,
            last_step: now,
            answered: Vec::with_capacity(64),
            replies: Vec::new(),
            transport,
            p,
        }
    }

    fn step_wait(&self) -> Duration {
        self.window.rto() / 4 + Duration::from_micros(100)
    }

    /// Whether the engine knows the job's state at the switch.
    pub fn synced(&self) -> bool {
        matches!(self.sync, Sync::Known)
    }

    /// Starts learning the job's state if nobody did; takes the error of an attempt that
    /// failed.
    pub fn sync(&mut self) -> Option<Result<(), AllreduceError>> {
        if let Some(e) = self.sync_error.take() {
            return Some(Err(e));
        }
        match self.sync {
            Sync::Known => Some(Ok(())),
            Sync::Unknown => {
                self.start_sync();
                None
            }
            Sync::Asking { .. } => None,
        }
    }

    /// Takes up submitted requests: each gets the job's next message id once the engine
    /// knows it, and its first rounds go out on the slots it finds free.
    fn admit(&mut self, pending: Vec<Pending>) {
        for q in pending {
            let len = q.output.len();
            let elements = self.p.shape.segment_bytes() / q.r.lane.size();
            let segment_bytes = elements * q.r.dtype.size();
            let mut a = Active {
                shared: q.shared,
                r: q.r,
                input: q.input,
                output: q.output,
                message: None,
                segment_bytes,
                segments: len.div_ceil(segment_bytes),
                sent: 0,
                highest_sent: None,
                done: 0,
                in_flight: 0,
                nonfinite: Vec::new(),
                overflow: Vec::new(),
                report: Report {
                    bytes: len,
                    segments: len.div_ceil(segment_bytes),
                    path: self.p.path,
                    why: self.p.path_why.clone(),
                    ..Report::default()
                },
                started: None,
                last_progress: Instant::now(),
                refused0: 0,
                lost0: 0,
                diagnosis: None,
            };
            if a.segments == 0 {
                // Nothing to send: no message id taken (every member skips it alike).
                deliver(a, Ok(()), &self.transport);
                continue;
            }
            if self.synced() {
                self.start(&mut a);
                let first = slots_of(a.message.expect("started"), a.segments, self.window.slots());
                self.active.push_back(a);
                self.fill(first);
            } else {
                self.active.push_back(a);
            }
        }
        if matches!(self.sync, Sync::Unknown) && !self.active.is_empty() {
            self.start_sync();
        }
    }

    /// Gives `a` the next message id and starts its clocks.
    fn start(&mut self, a: &mut Active) {
        a.message = Some(self.next_message);
        self.next_message = self.next_message.wrapping_add(1);
        let now = Instant::now();
        a.started = Some(now);
        a.last_progress = now;
        a.refused0 = self.transport.refused();
        a.lost0 = self.transport.lost_sends();
    }

    /// Sends what was queued (a request's first rounds, the first queries of a sync).
    fn send_queued(&mut self) {
        let r = self.ask_switch().and_then(|()| self.transport.flush());
        if let Err(e) = r {
            self.fail_all(AllreduceError::Io(e));
        }
        self.last_step = Instant::now();
    }

    /// One step: asks the switch what is due, takes in what came (waiting up to `wait`),
    /// ends requests that completed, failed or were cancelled, and sends again what is due.
    fn step(&mut self, wait: Duration) {
        let now = Instant::now();
        // Time nobody spent in the library does not count against a request.
        let gap = now.duration_since(self.last_step);
        if gap > IDLE_GAP {
            for a in &mut self.active {
                a.last_progress += gap;
            }
            if let Sync::Asking { started, .. } = &mut self.sync {
                *started += gap;
            }
        }
        self.cancel_requested();
        if let Err(e) = self.exchange(wait) {
            self.fail_all(AllreduceError::Io(e));
        }
        self.last_step = Instant::now();
    }

    fn exchange(&mut self, wait: Duration) -> io::Result<()> {
        self.ask_switch()?;
        // Results already queued are taken without blocking; once none is left, the
        // rounds they freed go out as one burst, and only then does the worker wait.
        // Waiting on results polls before it sleeps, whether the whole message is in
        // flight or the window is full: a result frees a slot for the next round, and waking
        // from sleep for each burst of results left a 1 MiB message (more segments than the
        // window) slower than both 64 KiB and 16 MiB ones.
        let spin = if self.active.is_empty() {
            Duration::ZERO
        } else {
            self.p.spin
        };
        let mut took = false;
        // Results already queued are drained without blocking while sends wait to go out
        // (they join one burst); otherwise the blocking receive below polls first anyway.
        let drain = if wait.is_zero() || self.transport.queued() {
            64
        } else {
            0
        };
        for _ in 0..drain {
            match self.receive(true, Duration::ZERO) {
                Ok(()) => {
                    took = true;
                    self.take_replies()?;
                    self.take_results()?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.transport.flush()?;
        if !took && !wait.is_zero() {
            if wait != self.wait_set {
                self.transport.set_wait(wait)?;
                self.wait_set = wait;
            }
            match self.receive(false, spin.min(wait)) {
                Ok(()) => {
                    self.take_replies()?;
                    self.take_results()?;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        if now >= self.next_check {
            self.next_check = now + self.window.rto() / 4;
            self.check_requests(now)?;
            for (slot, mut f) in self.window.due(now) {
                let Some(i) = self.index_of(f.message) else {
                    continue;
                };
                self.send(i, slot, &f)?;
                f.sent = Instant::now();
                self.window.sent(slot, f);
                self.active[i].report.retransmissions += 1;
            }
        }
        self.transport.flush()
    }

    /// Hands what comes in to the window (results, decoded into their request's buffer
    /// at once) or to the status replies.
    fn receive(&mut self, nonblocking: bool, spin: Duration) -> io::Result<()> {
        let Self {
            transport,
            window,
            active,
            answered,
            replies,
            p,
            ..
        } = self;
        let (job, ranks) = (p.job, p.ranks() as u32);
        transport.receive(nonblocking, spin, &mut |d: &[u8]| {
            let Ok(packet) = wire::decode(d) else { return };
            let h = packet.header;
            if h.job() != job {
                return;
            }
            if h.kind == Kind::StatusReply as u8 {
                let mut payload = [0u8; wire::STATUS_PAYLOAD];
                payload.copy_from_slice(packet.payload);
                replies.push((h, payload));
                return;
            }
            let Some(a) = window.check(&h) else { return };
            let Some(req) = active
                .iter_mut()
                .find(|r| r.message == Some(a.flight.message) && r.diagnosis.is_none())
            else {
                return;
            };
            let range = req.range(a.flight.segment);
            let r = req.r;
            let flags = h.enc_flags();
            let out = &mut req.output.bytes_mut()[range];
            if flags & ENC_NONFINITE != 0 {
                codec::fill_nan(r.dtype, out);
            } else {
                debug_assert_eq!(
                    packet.payload.len(),
                    out.len() / r.dtype.size() * r.lane.size()
                );
                codec::decode(r.op, r.dtype, ranks, packet.payload, h.exponent(), out);
            }
            answered.push((a, flags));
        })
    }

    /// Counts the results taken, ends the requests they complete, and gives each freed
    /// slot its next round.
    fn take_results(&mut self) -> io::Result<()> {
        let answered = std::mem::take(&mut self.answered);
        for (a, flags) in &answered {
            let Some(f) = self.window.take(a) else {
                continue;
            };
            if let Some(i) = self.index_of(f.message) {
                let req = &mut self.active[i];
                req.in_flight -= 1;
                req.done += 1;
                req.last_progress = Instant::now();
                if flags & ENC_NONFINITE != 0 {
                    req.nonfinite.push(f.segment as u32);
                }
                if flags & ENC_OVERFLOW != 0 {
                    req.overflow.push(f.segment as u32);
                }
                if req.done == req.segments {
                    self.end(i, Ok(()));
                }
            }
            self.fill_slot(a.slot)?;
        }
        self.answered = answered;
        self.answered.clear();
        Ok(())
    }

    /// The index in `active` of the request of `message`, if it is running.
    fn index_of(&self, message: u32) -> Option<usize> {
        self.active
            .iter()
            .position(|a| a.message == Some(message) && a.diagnosis.is_none())
    }

    /// The next round slot `slot` takes: the first running request, in message order, with
    /// a segment on the slot not before the slot's cursor.
    fn next_round(&self, slot: usize) -> Option<(usize, usize)> {
        let w = self.window.slots();
        let (cm, cs) = self.cursor[slot];
        for (i, a) in self.active.iter().enumerate() {
            let Some(k) = a.message else { break };
            if !a.running() || (k.wrapping_sub(cm) as i32) < 0 {
                continue;
            }
            let first = (slot + w - k as usize % w) % w;
            let segment = if k == cm { first.max(cs) } else { first };
            if segment < a.segments {
                return Some((i, segment));
            }
        }
        None
    }

    /// Sends the next round of each free slot of `slots`.
    fn fill(&mut self, slots: impl IntoIterator<Item = usize>) {
        let mut slots: Vec<usize> = slots.into_iter().collect();
        if self.p.reorder {
            for i in (1..slots.len()).rev() {
                self.rng = data::mix(self.rng);
                slots.swap(i, (self.rng % (i as u64 + 1)) as usize);
            }
        }
        for slot in slots {
            if let Err(e) = self.fill_slot(slot) {
                self.fail_all(AllreduceError::Io(e));
                return;
            }
        }
    }

    fn fill_slot(&mut self, slot: usize) -> io::Result<()> {
        if self.window.busy(slot) {
            return Ok(());
        }
        let Some((i, segment)) = self.next_round(slot) else {
            return Ok(());
        };
        let a = &self.active[i];
        let message = a.message.expect("running");
        let count = a.range(segment).len() / a.r.dtype.size();
        let f = InFlight {
            message,
            segment,
            shadow: self.window.next_shadow(slot),
            count: count as u16,
            op: a.r.op as u8,
            dtype: a.r.dtype as u8,
            sent: Instant::now(),
            rto: self.window.rto(),
            retransmitted: false,
        };
        self.cursor[slot] = (message, segment + self.window.slots());
        let a = &mut self.active[i];
        a.sent += 1;
        a.in_flight += 1;
        if a.highest_sent.is_some_and(|h| h > segment) {
            a.report.reordered += 1;
        }
        a.highest_sent = a.highest_sent.max(Some(segment));
        a.last_progress = a.last_progress.max(f.sent);
        self.send(i, slot, &f)?;
        self.window.sent(slot, f);
        Ok(())
    }

    /// Encodes the contribution `f` of request `i` on `slot` in place into the
    /// transport's send buffer.
    fn send(&mut self, i: usize, slot: usize, f: &InFlight) -> io::Result<()> {
        let a = &self.active[i];
        let r = a.r;
        let range = a.range(f.segment);
        let lane_bytes = usize::from(f.count) * r.lane.size();
        let len = HEADER_LEN + wire::payload_len(lane_bytes, 1);
        let cookie = self.transport.cookie();
        let out = self.transport.reserve(len)?;
        let src = a.input.as_ref().unwrap_or(&a.output).bytes();
        let enc = codec::encode(
            r.op,
            r.dtype,
            self.p.ranks(),
            &src[range],
            &mut out[HEADER_LEN..HEADER_LEN + lane_bytes],
        );
        let h = Header::builder(Kind::Contribution)
            .op(r.op)
            .dtype(r.dtype)
            .job(self.p.job)
            .message(f.message)
            .segment(f.segment as u32)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(f.shadow)
            .last(f.segment + 1 == a.segments)
            .count(f.count)
            .exponent(enc.exponent)
            .enc_flags(enc.flags)
            .cookie(cookie)
            .build();
        wire::finish(&h, lane_bytes, out).expect("reserved the packet's length");
        self.transport.commit(len)
    }

    /// Asks the switch for the state of `shadow` of `slot` (the round given is the one the
    /// worker has in mind; the reply carries the copy's own).
    fn query(&mut self, message: u32, segment: u32, slot: usize, shadow: u8) -> io::Result<()> {
        self.query_as(message, segment, slot, shadow, false)
    }

    /// [`Self::query`], `forward`: an aggregation point waiting on its parent for the
    /// round may pass the query up, and the level above answers.
    fn query_as(
        &mut self,
        message: u32,
        segment: u32,
        slot: usize,
        shadow: u8,
        forward: bool,
    ) -> io::Result<()> {
        let mut h = Header::builder(Kind::StatusQuery)
            .op(self.p.op)
            .dtype(self.p.dtype)
            .job(self.p.job)
            .message(message)
            .segment(segment)
            .slot(slot as u16)
            .member(self.p.member)
            .shadow(shadow)
            .cookie(self.transport.cookie())
            .build();
        if forward {
            h.flags |= wire::FLAG_FORWARD;
        }
        let mut q = [0u8; HEADER_LEN + wire::STATUS_PAYLOAD];
        let n = wire::finish(&h, wire::STATUS_PAYLOAD, &mut q).expect("room for a query");
        self.transport.send_now(&q[..n])
    }

    /// Starts learning from the switch which shadow copy each of the job's slots takes
    /// next, so a job continued by a new process keeps every stored result someone may
    /// still ask for, and (unless `first_message` is set) which message comes next.
    ///
    /// Per slot the worker asks for both copies. A copy holding a round of its own first
    /// message was started by the other members: it joins that copy. Otherwise the next
    /// round takes the copy that does not hold the newest round (copy 0 when both are
    /// empty, as on a new job): exactly what a process that had run the earlier messages
    /// would use, since a slot's rounds run in (message, segment) order.
    fn start_sync(&mut self) {
        let now = Instant::now();
        self.sync = Sync::Asking {
            copies: vec![[None; 2]; self.p.shape.slots()],
            started: now,
            next_send: now,
        };
    }

    /// Sends the queries of a sync in progress that are due, and gives up on a switch that
    /// never answered.
    fn ask_switch(&mut self) -> io::Result<()> {
        let Sync::Asking {
            copies,
            started,
            next_send,
        } = &mut self.sync
        else {
            return Ok(());
        };
        let now = Instant::now();
        if now.duration_since(*started) > self.p.give_up {
            let e = AllreduceError::NoSwitch {
                job: self.p.job,
                switch: self.p.switch,
                waited: now.duration_since(*started),
            };
            self.sync = Sync::Unknown;
            self.fail_sync(e);
            return Ok(());
        }
        if now < *next_send {
            return Ok(());
        }
        *next_send = now + self.window.rto();
        let unanswered: Vec<(usize, u8)> = copies
            .iter()
            .enumerate()
            .flat_map(|(slot, c)| {
                (0..2u8)
                    .filter(|&s| c[usize::from(s)].is_none())
                    .map(move |s| (slot, s))
            })
            .collect();
        let message = self.next_message;
        for (slot, shadow) in unanswered {
            self.query(message, 0, slot, shadow)?;
        }
        Ok(())
    }

    /// Takes the status replies in: answers to a sync, or to diagnoses.
    fn take_replies(&mut self) -> io::Result<()> {
        let replies = std::mem::take(&mut self.replies);
        for (h, payload) in &replies {
            if matches!(self.sync, Sync::Asking { .. }) && wire::status::is_refusal(h.status) {
                let e = self.refused(h.status, h.slot());
                self.sync = Sync::Unknown;
                self.fail_sync(e);
                continue;
            }
            if let Sync::Asking { copies, .. } = &mut self.sync {
                if let Some(c) = copies.get_mut(usize::from(h.slot())) {
                    c[h.shadow()] = Some((h.status, h.message(), h.segment()));
                }
                continue;
            }
            self.diagnosis_reply(h, payload);
        }
        self.replies = replies;
        self.replies.clear();
        if let Sync::Asking { copies, .. } = &self.sync {
            if copies.iter().all(|c| c.iter().all(Option::is_some)) {
                let copies: Vec<[(u8, u32, u32); 2]> = copies
                    .iter()
                    .map(|c| c.map(|x| x.expect("every copy answered")))
                    .collect();
                self.synced_to(&copies);
            }
        }
        Ok(())
    }

    /// Takes up the job's state as learned: the next message, each slot's next copy; the
    /// requests waiting for it start.
    fn synced_to(&mut self, copies: &[[(u8, u32, u32); 2]]) {
        if self.p.first_message.is_none() {
            self.next_message = next_message(copies);
        }
        for (slot, held) in copies.iter().enumerate() {
            self.window
                .set_next_shadow(slot, next_shadow(*held, self.next_message));
            self.cursor[slot] = (self.next_message, 0);
        }
        self.sync = Sync::Known;
        let mut waiting: Vec<Active> = self.active.drain(..).collect();
        for a in &mut waiting {
            self.start(a);
        }
        self.active.extend(waiting);
        self.fill(0..self.window.slots());
    }

    /// Ends every request waiting for the job's state with `e`, and keeps it for
    /// [`Self::sync`].
    fn fail_sync(&mut self, e: AllreduceError) {
        while let Some(a) = self.active.pop_front() {
            deliver(a, Err(e.clone()), &self.transport);
        }
        self.sync_error = Some(e);
    }

    /// Ends every request with `e` (the socket failed).
    fn fail_all(&mut self, e: AllreduceError) {
        for slot in 0..self.window.slots() {
            self.window.remove(slot);
        }
        while let Some(a) = self.active.pop_front() {
            deliver(a, Err(e.clone()), &self.transport);
        }
        if !self.synced() {
            self.sync = Sync::Unknown;
        }
    }

    /// Ends the requests whose cancellation was asked for: at the first step after.
    fn cancel_requested(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let a = &self.active[i];
            if !a.shared.cancel.load(Ordering::Relaxed) {
                i += 1;
                continue;
            }
            let e = AllreduceError::Cancelled {
                job: self.p.job,
                message: a.message,
            };
            let freed = self.withdraw(i);
            self.end(i, Err(e));
            self.fill(freed);
        }
    }

    /// Starts the diagnosis of requests without progress for the give-up time, and ends
    /// those whose diagnosis is complete.
    fn check_requests(&mut self, now: Instant) -> io::Result<()> {
        let mut i = 0;
        while i < self.active.len() {
            let a = &self.active[i];
            if let Some(d) = &a.diagnosis {
                let answered = d.missing.iter().all(Missing::complete);
                if now >= d.until || answered || d.refusal.is_some() {
                    let e = self.diagnosed(i);
                    self.end(i, Err(e));
                    continue;
                }
            } else if a.running()
                && a.in_flight > 0
                && now.duration_since(a.last_progress) > self.p.give_up
            {
                let waited = now.duration_since(a.last_progress);
                self.diagnose(i, waited)?;
            }
            i += 1;
        }
        Ok(())
    }

    /// Takes request `i`'s rounds out of flight; returns the slots freed.
    fn withdraw(&mut self, i: usize) -> Vec<usize> {
        let message = self.active[i].message;
        let slots: Vec<usize> = self
            .window
            .in_flight()
            .filter(|(_, f)| Some(f.message) == message)
            .map(|(s, _)| s)
            .collect();
        for &s in &slots {
            self.window.remove(s);
        }
        self.active[i].in_flight = 0;
        slots
    }

    /// Gives request `i` up: asks the switch, for each of its rounds in flight, which
    /// members the slot waits for; the answers end it ([`Self::diagnosed`]). Its slots
    /// go on with the next requests.
    fn diagnose(&mut self, i: usize, waited: Duration) -> io::Result<()> {
        let message = self.active[i].message.expect("running");
        let flights: Vec<(usize, InFlight)> = self
            .window
            .in_flight()
            .filter(|(_, f)| f.message == message)
            .map(|(s, f)| (s, *f))
            .collect();
        let freed = self.withdraw(i);
        let mut missing = Vec::new();
        for (slot, f) in flights {
            // Asked twice: what this rank's aggregation point waits for, and (where that
            // is the level above) what the level above waits for.
            self.query(message, f.segment as u32, slot, f.shadow)?;
            self.query_as(message, f.segment as u32, slot, f.shadow, true)?;
            missing.push(Missing {
                slot,
                segment: f.segment as u32,
                members: None,
                answered: false,
                above: false,
                above_members: None,
            });
        }
        self.active[i].diagnosis = Some(Diagnosis {
            until: Instant::now() + DIAGNOSIS,
            waited,
            missing,
            refusal: None,
        });
        self.fill(freed);
        Ok(())
    }

    /// A status reply to a diagnosis: which members the slot waits for.
    fn diagnosis_reply(&mut self, h: &Header, payload: &[u8; wire::STATUS_PAYLOAD]) {
        let slot = usize::from(h.slot());
        // The diagnosis asking for this round, else any asking about the slot; the level
        // above's answer goes to the round whatever came first.
        let above = h.above != 0;
        let find = |exact: bool| {
            self.active.iter().enumerate().find_map(|(i, a)| {
                let message = a.message?;
                let at = a.diagnosis.as_ref()?.missing.iter().position(|m| {
                    m.slot == slot
                        && (if above {
                            m.above_members.is_none()
                        } else {
                            !m.answered
                        })
                        && (!exact || (h.message() == message && h.segment() == m.segment))
                })?;
                Some((i, at))
            })
        };
        let Some((i, at)) = find(true).or_else(|| find(false)) else {
            return;
        };
        let a = &mut self.active[i];
        let message = a.message.expect("running");
        let d = a.diagnosis.as_mut().expect("diagnosing");
        if wire::status::is_refusal(h.status) {
            // The level above refusing this level's query says nothing of this rank's.
            if !above {
                d.refusal = Some((h.status, h.slot()));
            }
            return;
        }
        let m = &mut d.missing[at];
        if above {
            if h.message() == message && h.segment() == m.segment {
                let seen = u64::from_le_bytes(payload[..8].try_into().unwrap());
                let all = u64::from_le_bytes(payload[8..16].try_into().unwrap());
                m.above_members = Some(members_of(all & !seen).collect());
            }
            return;
        }
        m.answered = true;
        if h.message() == message && h.segment() == m.segment {
            let seen = u64::from_le_bytes(payload[..8].try_into().unwrap());
            let all = u64::from_le_bytes(payload[8..16].try_into().unwrap());
            m.members = Some(members_of(all & !seen).collect());
            m.above = h.status == ShadowState::PartialSent as u8;
        }
    }

    /// The error a diagnosed request ends with: refused, no switch (no reply at all), or
    /// timed out with what the switch said per slot.
    fn diagnosed(&mut self, i: usize) -> AllreduceError {
        let a = &mut self.active[i];
        let d = a.diagnosis.take().expect("diagnosed");
        let message = a.message.expect("running");
        if let Some((code, slot)) = d.refusal {
            return self.refused(code, slot);
        }
        if !d.missing.is_empty() && d.missing.iter().all(|m| !m.answered) {
            return AllreduceError::NoSwitch {
                job: self.p.job,
                switch: self.p.switch,
                waited: d.waited,
            };
        }
        AllreduceError::Timeout {
            job: self.p.job,
            message,
            waited: d.waited,
            missing: d.missing,
        }
    }

    /// Why the switch refused this member, from a status reply's refusal `code`.
    fn refused(&self, code: u8, slot: u16) -> AllreduceError {
        let (job, member) = (self.p.job, self.p.member);
        let reason = match code {
            // The switch does not tell a stranger whether a job exists: this covers both.
            wire::status::REFUSED_NOT_MEMBER => format!(
                "this is not member {member} of job {job} as the switch holds it: the switch has no job {job}, or the member index, the switch port this host is behind, or its MAC, IPv4 address or UDP port ({}) differ from the job's; compare --job, --member and --bind with `xagg job list --json`",
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

    /// Ends request `i`: `Ok` means all its results came (it may still have flagged
    /// segments).
    fn end(&mut self, i: usize, status: Result<(), AllreduceError>) {
        let a = self.active.remove(i).expect("an active request");
        deliver(a, status, &self.transport);
    }
}

/// The slots the first rounds of a message of `segments` segments go to.
fn slots_of(message: u32, segments: usize, w: usize) -> impl Iterator<Item = usize> {
    let base = message as usize % w;
    (0..segments.min(w)).map(move |i| (base + i) % w)
}

/// Hands request `a`'s completion to its handle or queue, with the report or the error:
/// flagged segments turn a complete request into `NonFinite` or `Overflow`.
fn deliver(mut a: Active, status: Result<(), AllreduceError>, transport: &Transport) {
    let (job, message) = (a.shared.job, a.message);
    let status = status.and_then(|()| {
        let rep = &mut a.report;
        if let Some(t) = a.started {
            rep.seconds = t.elapsed().as_secs_f64();
            rep.goodput_gbps = rep.bytes as f64 * 8.0 / rep.seconds / 1e9;
        }
        rep.refused = transport.refused() - a.refused0;
        rep.lost_sends = transport.lost_sends() - a.lost0;
        let message = message.unwrap_or(0);
        if !a.nonfinite.is_empty() {
            a.nonfinite.sort();
            return Err(AllreduceError::NonFinite {
                job,
                message,
                segments: std::mem::take(&mut a.nonfinite),
            });
        }
        if !a.overflow.is_empty() {
            a.overflow.sort();
            return Err(AllreduceError::Overflow {
                job,
                message,
                segments: std::mem::take(&mut a.overflow),
            });
        }
        Ok(std::mem::take(rep))
    });
    let shared = a.shared.clone();
    shared.complete(Completion {
        id: shared.id,
        job,
        message,
        status,
        buffer: a.output,
        input: a.input,
    });
}

/// Whether round `(message, segment)` `a` comes after `b`, in the switch's serial-number
/// order (ids may wrap).
fn newer(a: (u32, u32), b: (u32, u32)) -> bool {
    let dm = a.0.wrapping_sub(b.0) as i32;
    dm > 0 || (dm == 0 && (a.1.wrapping_sub(b.1) as i32) > 0)
}

/// Whether a copy in state `state` holds a round still under way: filling, or (at an inner
/// level) complete there and waiting for its parent's result.
fn open(state: u8) -> bool {
    state == ShadowState::Filling as u8 || state == ShadowState::PartialSent as u8
}

/// The message a new process of a job takes up, from what every slot's copies hold as
/// (state, message, segment): the oldest message with a round still filling (the others
/// are in it and wait for this member), but never past the one after the newest message
/// with a completed round — members ahead, with requests pipelined, may already have
/// rounds of later messages filling, and the replies may show those before the oldest;
/// 0 on a job that never ran. A filling round whose slot's other copy holds a newer round
/// was abandoned (its members gave up and went on) and does not count.
fn next_message(copies: &[[(u8, u32, u32); 2]]) -> u32 {
    let held = |c: &(u8, u32, u32)| c.0 != ShadowState::Empty as u8;
    let oldest = |a: u32, b: u32| if newer((a, 0), (b, 0)) { b } else { a };
    let newest_done = copies
        .iter()
        .flatten()
        .filter(|c| c.0 == ShadowState::Done as u8)
        .map(|c| c.1)
        .reduce(|a, b| if newer((b, 0), (a, 0)) { b } else { a });
    let live = copies
        .iter()
        .flat_map(|pair| {
            (0..2).filter_map(move |i| {
                let (c, other) = (pair[i], pair[1 - i]);
                let abandoned = held(&other) && newer((other.1, other.2), (c.1, c.2));
                (open(c.0) && !abandoned).then_some(c.1)
            })
        })
        .reduce(oldest);
    match (live, newest_done) {
        (Some(f), Some(d)) => oldest(f, d.wrapping_add(1)),
        (Some(f), None) => f,
        (None, Some(d)) => d.wrapping_add(1),
        (None, None) => 0,
    }
}

/// The copy a slot's next round takes, given what its two copies hold as (state, message,
/// segment) and the worker's first message: the copy holding the slot's oldest round of
/// that message or later, which the other members started (see [`Engine::start_sync`]);
/// else the copy that does not hold the newest round (copy 0 when both are empty).
fn next_shadow(copies: [(u8, u32, u32); 2], message: u32) -> u8 {
    let held = |c: (u8, u32, u32)| c.0 != ShadowState::Empty as u8;
    let ours = |c: (u8, u32, u32)| held(c) && c.1.wrapping_sub(message) as i32 >= 0;
    match (ours(copies[0]), ours(copies[1])) {
        (true, false) => return 0,
        (false, true) => return 1,
        (true, true) => {
            return if newer((copies[0].1, copies[0].2), (copies[1].1, copies[1].2)) {
                1
            } else {
                0
            }
        }
        (false, false) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // With requests pipelined, the slot's first round may be of a later message.
        assert_eq!(next_shadow([(filling, 6, 1), (empty, 0, 0)], 5), 0);
        // A member restarting after it contributed: the older of the slot's two rounds of
        // its messages comes first (it gets that one's stored result).
        assert_eq!(next_shadow([(filling, 6, 0), (done, 5, 2)], 5), 1);
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
        // Pipelined: messages 5 to 7 filling, the oldest is taken up.
        assert_eq!(
            next_message(&[
                [(f, 7, 0), (d, 4, 0)],
                [(f, 5, 1), (e, 0, 0)],
                [(f, 6, 0), (e, 0, 0)]
            ]),
            5
        );
        // A member ahead has rounds of later messages filling; the replies show those
        // before any of the oldest: the one after the newest completed message.
        assert_eq!(
            next_message(&[[(f, 20, 12), (d, 4, 0)], [(f, 19, 14), (d, 0, 108)]]),
            5
        );
        // At an inner level a round may wait for the parent: still under way.
        let p = ShadowState::PartialSent as u8;
        assert_eq!(
            next_message(&[[(d, 4, 0), (p, 5, 0)], [(d, 4, 1), (e, 0, 0)]]),
            5
        );
        // A round abandoned (its slot went on to a newer one) does not count.
        assert_eq!(
            next_message(&[[(f, 2, 0), (d, 9, 3)], [(d, 9, 4), (e, 0, 0)]]),
            10
        );
    }
}
