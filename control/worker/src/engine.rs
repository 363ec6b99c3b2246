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
//! worker's lock (`worker`). Its parts: learning the job's state (`sync`), the schedule
//! (`schedule`), what goes on and comes off the wire (`packets`), and giving a request up
//! (`diagnosis`).

mod diagnosis;
mod packets;
mod schedule;
mod sync;
mod worker;

use std::{
    collections::VecDeque,
    io,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use xagg_common::wire::{self, Header, ENC_NONFINITE, ENC_OVERFLOW, ENC_WITHDRAWN};

pub(crate) use self::worker::{now_ns, wait_readable, Pending, WorkerInner};
use self::{diagnosis::Diagnosis, schedule::slots_of, sync::JobState};
use crate::{
    request::{lock, Buffer, Completion, Shared},
    transport::Transport,
    window::{Answered, Window},
    AllreduceError, Reduction, Report, WorkerParams,
};

/// A pause between two calls into the library longer than this does not count towards a
/// request's give-up time: nobody was making progress.
const IDLE_GAP: Duration = Duration::from_millis(50);

/// A request the engine works on.
struct Active {
    shared: Arc<Shared>,
    r: Reduction,
    input: Option<Buffer>,
    output: Buffer,
    /// Its message id, from when the engine knows the job's next one.
    message: Option<u32>,
    /// How its buffers map onto segments, and the number of segments.
    layout: crate::Layout,
    /// A reduce-scatter made as an allreduce (`output` the whole result): the caller's
    /// output and where its block is in the result.
    block_of: Option<(Buffer, std::ops::Range<usize>)>,
    segments: usize,
    /// Segments sent at least once, the highest sent so far, segments answered, and
    /// segments in flight now.
    sent: usize,
    highest_sent: Option<usize>,
    done: usize,
    in_flight: usize,
    nonfinite: Vec<u32>,
    overflow: Vec<u32>,
    /// Segments whose result says another member gave up on the call.
    given_up: Vec<u32>,
    report: Report,
    started: Option<Instant>,
    last_progress: Instant,
    /// Refused and lost datagrams of the worker when the request started.
    refused0: u64,
    lost0: u64,
    /// Set while it asks the switch why it has no progress.
    diagnosis: Option<Diagnosis>,
    /// Since when the switch has said it waits for other members (a slow peer is not a
    /// failed switch: the request waits, up to the collective timeout).
    waiting_since: Option<Instant>,
    /// A segment a peer was promised this rank lacks: finished from the peers.
    withdrawn: Option<u32>,
    /// How long it will have waited on slow members when it next says so (doubling).
    next_notice: Duration,
    /// The `last_progress` of the stall its early look for a gone rank was made in.
    looked: Option<Instant>,
}

impl Active {
    /// Whether peers recover its results as an allreduce's ([`crate::peers`]); the
    /// other collectives' as a flat collective's.
    fn with_peers(&self) -> bool {
        self.layout.collective == crate::Collective::Allreduce
    }

    /// Whether it is still sending and taking results.
    fn running(&self) -> bool {
        self.message.is_some()
    }
}

pub(crate) struct Engine {
    p: WorkerParams,
    transport: Transport,
    window: Window,
    job_state: JobState,
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
    /// When queued sends last went out (explicitly: a full burst goes out by itself).
    flushed: Instant,
    answered: Vec<(Answered, u16)>,
    /// Rounds whose data (a gather's, sent pending) came before this member sent them.
    early: std::collections::HashSet<(u32, usize)>,
    /// A gather's pending data for messages this member has not started yet.
    ahead: VecDeque<(Header, Vec<u8>)>,
    replies: Vec<(Header, [u8; wire::STATUS_PAYLOAD])>,
    /// What the peers' responder answers from, once it runs ([`crate::peers`]).
    pub(crate) view: Option<Arc<std::sync::Mutex<crate::peers::View>>>,
    /// Every rank's responder, in rank order, once the peers are known: where a member
    /// the switch waits for is asked whether its process is still there and whether its
    /// call failed; and the job's secret, which authenticates the question.
    pub(crate) responders: Vec<std::net::SocketAddrV4>,
    pub(crate) responders_key: [u8; 32],
    /// Ranks of a flat job found gone (bit r: rank r), for the leave to tell the daemon.
    pub(crate) gone: std::sync::Arc<std::sync::atomic::AtomicU64>,
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
            job_state: JobState::Unknown,
            sync_error: None,
            active: VecDeque::new(),
            wait_set: Duration::ZERO,
            next_check: now,
            last_step: now,
            flushed: now,
            answered: Vec::with_capacity(64),
            early: Default::default(),
            ahead: VecDeque::new(),
            replies: Vec::new(),
            view: None,
            responders: Vec::new(),
            responders_key: [0; 32],
            gone: Default::default(),
            transport,
            p,
        }
    }

    /// Requests it works on.
    pub(crate) fn active_requests(&self) -> usize {
        self.active.len()
    }

    fn step_wait(&self) -> Duration {
        self.window.rto() / 4 + Duration::from_micros(100)
    }

    /// Takes up submitted requests: each gets the job's next message id once the engine
    /// knows it, and its first rounds go out on the slots it finds free.
    fn admit(&mut self, pending: Vec<Pending>) {
        for q in pending {
            let elements = self.p.shape.segment_bytes() / q.r.lane.size();
            let layout = crate::Layout::new(
                q.collective,
                q.block,
                q.blocks,
                elements * q.r.dtype.size(),
                q.root,
                // Behind a host level the blocks are the ranks'.
                if self.p.ranks.is_some() {
                    self.p.rank_in_job() as u8
                } else {
                    self.p.member
                },
            );
            let len = layout.message_bytes();
            let mut a = Active {
                shared: q.shared,
                r: q.r,
                input: q.input,
                output: q.output,
                message: None,
                layout,
                block_of: q.block_of,
                segments: layout.segments(),
                sent: 0,
                highest_sent: None,
                done: 0,
                in_flight: 0,
                nonfinite: Vec::new(),
                overflow: Vec::new(),
                given_up: Vec::new(),
                report: Report {
                    bytes: len,
                    segments: layout.segments(),
                    path: self.p.path,
                    why: self.p.path_why.clone(),
                    ..Report::default()
                },
                started: None,
                last_progress: Instant::now(),
                refused0: 0,
                lost0: 0,
                diagnosis: None,
                waiting_since: None,
                withdrawn: None,
                next_notice: Duration::ZERO,
                looked: None,
            };
            if a.segments == 0 {
                // Nothing to send: no message id taken (every member skips it alike).
                deliver(a, Ok(()), &self.transport, None);
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
        if matches!(self.job_state, JobState::Unknown) && !self.active.is_empty() {
            self.start_sync();
        }
    }

    /// Gives `a` the next message id and starts its clocks.
    fn start(&mut self, a: &mut Active) {
        let message = self.next_message;
        a.message = Some(message);
        self.next_message = self.next_message.wrapping_add(1);
        // A gather's data that came before this member started the message.
        if !self.ahead.is_empty() {
            let (now, later): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.ahead)
                .into_iter()
                .partition(|(h, _)| h.message() == message);
            self.ahead = later;
            for (h, payload) in &now {
                packets::take_into(a, &mut self.early, h, payload);
            }
        }
        if let Some(v) = self.view.as_ref() {
            let out = a.output.bytes();
            if a.with_peers() {
                a.withdrawn = lock(v).start(
                    message,
                    out.as_ptr(),
                    out.len(),
                    a.layout.segment_bytes,
                    self.next_message,
                );
            } else {
                let source = a.input.as_ref().unwrap_or(&a.output).bytes();
                let flat = crate::peers::Flat::new(a.layout, a.r, source);
                lock(v).start_flat(message, out, flat, self.next_message);
            }
        }
        let now = Instant::now();
        a.started = Some(now);
        a.last_progress = now;
        a.refused0 = self.transport.refused();
        a.lost0 = self.transport.lost_sends();
    }

    /// Sends what was queued (a request's first rounds, the first queries of a sync).
    fn send_queued(&mut self) {
        let r = self.ask_switch().and_then(|()| self.flush());
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
            if let JobState::Asking { started, .. } = &mut self.job_state {
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
        // Results already queued are drained without blocking while sends wait to go out
        // (they join one burst); otherwise the blocking receive below polls first anyway.
        let took = (wait.is_zero() || self.transport.queued()) && self.drain(64)?;
        self.flush()?;
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
        let mut now = Instant::now();
        if now >= self.next_check {
            // Whatever results already wait in the receive queue are taken before any
            // contribution is judged late: a worker that was off its CPU for longer than a
            // timeout comes back to a queue full of the answers it was waiting for, and
            // judging from the first batch alone resent the rest (8 workers on one CPU:
            // 640-1,100 retransmissions per 64 MiB allreduce, each answered by a replay of
            // a result the switch had sent; 2-51 once drained first). Bounded by what a
            // queue can hold for this worker — a result per slot, duplicates, one receive
            // each at worst — so that a queue that never empties cannot hold off the check
            // (a bound in time, a quarter of the timeout, cut a UDP socket's drain short
            // after a pause and resent the rest).
            if self.drain(2 * self.window.slots() + 64)? {
                now = Instant::now();
            }
            // Rounds queued since the last flush go out before the check, their clocks
            // restarted: they were stamped when queued, and a worker held off its CPU
            // between queueing and sending would judge them late though they never left.
            let queued_since = self.flushed;
            self.flush()?;
            self.window.restamp(queued_since, self.flushed);
            self.next_check = now + self.window.rto() / 4;
            self.check_requests(now)?;
            for (slot, mut f) in self.window.due(now) {
                let Some(i) = self.index_of(f.message) else {
                    continue;
                };
                self.send(i, slot, &f, false)?;
                f.sent = Instant::now();
                self.window.sent(slot, f);
                self.active[i].report.retransmissions += 1;
            }
        }
        self.flush()
    }

    /// Sends what is queued, noting when.
    fn flush(&mut self) -> io::Result<()> {
        self.transport.flush()?;
        self.flushed = Instant::now();
        Ok(())
    }

    /// Takes the results already queued, up to `limit` receives (a batch of buffers, or a
    /// datagram), without waiting; whether there was any.
    fn drain(&mut self, limit: usize) -> io::Result<bool> {
        let mut took = false;
        for _ in 0..limit {
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
        Ok(took)
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
                if let Some(v) = self.view.as_ref() {
                    if !lock(v).took(f.message, f.segment, *flags) {
                        // Promised to a peer not to be taken: recovered from the peers.
                        req.withdrawn = Some(f.segment as u32);
                        self.fill_slot(a.slot)?;
                        continue;
                    }
                }
                req.done += 1;
                req.last_progress = Instant::now();
                if !f.retransmitted {
                    req.report
                        .round_trips
                        .add(req.last_progress.duration_since(f.sent));
                }
                if flags & ENC_NONFINITE != 0 {
                    req.nonfinite.push(f.segment as u32);
                }
                if flags & ENC_OVERFLOW != 0 {
                    req.overflow.push(f.segment as u32);
                }
                if flags & ENC_WITHDRAWN != 0 {
                    req.given_up.push(f.segment as u32);
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
        self.active.iter().position(|a| a.message == Some(message))
    }

    /// Takes the status replies in: answers to a sync, or to diagnoses.
    fn take_replies(&mut self) -> io::Result<()> {
        let replies = std::mem::take(&mut self.replies);
        for (h, payload) in &replies {
            if !self.sync_reply(h) {
                self.diagnosis_reply(h, payload);
            }
        }
        self.replies = replies;
        self.replies.clear();
        self.sync_if_answered();
        Ok(())
    }

    /// Ends every request with `e` (the socket failed).
    fn fail_all(&mut self, e: AllreduceError) {
        for slot in 0..self.window.slots() {
            self.window.remove(slot);
        }
        while let Some(a) = self.active.pop_front() {
            deliver(a, Err(e.clone()), &self.transport, self.view_slots());
        }
        if !self.synced() {
            self.job_state = JobState::Unknown;
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

    /// Ends request `i`: `Ok` means all its results came (it may still have flagged
    /// segments).
    fn end(&mut self, i: usize, status: Result<(), AllreduceError>) {
        let a = self.active.remove(i).expect("an active request");
        if !self.early.is_empty() {
            self.early.retain(|&(m, _)| Some(m) != a.message);
        }
        deliver(a, status, &self.transport, self.view_slots());
    }

    /// The peers' view and the job's slots, for a delivery to update.
    fn view_slots(&self) -> Option<(&std::sync::Mutex<crate::peers::View>, usize)> {
        self.view.as_deref().map(|v| (v, self.window.slots()))
    }
}

/// Hands request `a`'s completion to its handle or queue, with the report or the error:
/// flagged segments turn a complete request into `NonFinite` or `Overflow`. The peers'
/// view keeps what peers may ask of it.
fn deliver(
    mut a: Active,
    status: Result<(), AllreduceError>,
    transport: &Transport,
    view: Option<(&std::sync::Mutex<crate::peers::View>, usize)>,
) {
    let (job, message) = (a.shared.job, a.message);
    if let (Some((v, slots)), Some(m)) = (view, message) {
        let source = a.input.as_ref().unwrap_or(&a.output).bytes();
        let mut v = lock(v);
        v.finish(m, a.output.bytes(), source, status.is_ok(), slots);
        // Not one the peers finish: this rank's rounds of it get nothing more, and a peer
        // the switch keeps waiting for them is told why.
        match &status {
            Err(e) if !e.recoverable() => v.fail(m, &e.fate(job, m)),
            _ => {}
        }
    }
    let status = status.and_then(|()| {
        let rep = &mut a.report;
        if let Some(t) = a.started {
            rep.seconds = t.elapsed().as_secs_f64();
            rep.goodput_gbps = rep.bytes as f64 * 8.0 / rep.seconds / 1e9;
        }
        rep.refused = transport.refused() - a.refused0;
        rep.lost_sends = transport.lost_sends() - a.lost0;
        let message = message.unwrap_or(0);
        if !a.given_up.is_empty() {
            a.given_up.sort();
            return Err(AllreduceError::GivenUp {
                job,
                message,
                segments: std::mem::take(&mut a.given_up),
            });
        }
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
    // A collective made as an allreduce: its part of the result into the caller's output
    // (none: a reduce's other members); after a failure the whole result so far stays
    // with the completion, for the peers to finish.
    let (buffer, part) = match a.block_of.take() {
        Some((mut output, range)) => {
            if status.is_ok() {
                crate::request::take_part(&mut output, &a.output, range);
                (output, None)
            } else {
                (output, Some((a.output, range)))
            }
        }
        None => (a.output, None),
    };
    let shared = a.shared.clone();
    shared.complete(Completion {
        id: shared.id,
        job,
        message,
        status,
        buffer,
        input: a.input,
        part,
    });
}
