//! The engine learning the job's state at the switch before its first message: which
//! message comes next and which shadow copy each slot takes, from a status query per slot
//! and copy.

use std::{
    io,
    time::{Duration, Instant},
};

use xagg_common::{slot::ShadowState, wire, Header, Round};

use super::{deliver, Active, Engine};
use crate::AllreduceError;

/// What the engine knows of the job's state at the switch.
pub(super) enum JobState {
    /// Nothing yet: the first request starts the queries.
    Unknown,
    /// Asked; per slot and copy, what the switch answered.
    Asking {
        copies: Vec<[Option<CopyStatus>; 2]>,
        started: Instant,
        pace: Pace,
    },
    Known,
}

/// Status queries a worker learning the job's state sends per second once its first round
/// (one per copy of each slot) is out. A worker whose replies never arrive — a rank behind
/// veth whose end runs no XDP program — asked about every copy again each retransmission
/// timeout (2 x 128 queries every 20 ms at 128 slots); now at most its first round plus
/// this many a second, while the give-up time still ends the wait as before.
pub const SYNC_QUERIES_PER_SECOND: f64 = 20.0;

/// Longest pause between two rounds of a sync's queries.
const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// When a sync asks again, and how many queries it may send: a bucket of tokens, full at
/// the start (a round for every copy), refilled at [`SYNC_QUERIES_PER_SECOND`]; the
/// rounds' interval doubles from the retransmission timeout up to [`MAX_SYNC_INTERVAL`].
pub(super) struct Pace {
    next_send: Instant,
    interval: Duration,
    tokens: f64,
    capacity: f64,
    refilled: Instant,
}

impl Pace {
    fn new(now: Instant, first_interval: Duration, capacity: usize) -> Self {
        Self {
            next_send: now,
            interval: first_interval,
            tokens: capacity as f64,
            capacity: capacity as f64,
            refilled: now,
        }
    }

    /// How many queries may go out at `now` (none before the next round is due), taken
    /// from the bucket; `want` are waiting.
    fn take(&mut self, now: Instant, want: usize) -> usize {
        if now < self.next_send {
            return 0;
        }
        let gained = now.duration_since(self.refilled).as_secs_f64() * SYNC_QUERIES_PER_SECOND;
        self.tokens = (self.tokens + gained).min(self.capacity);
        self.refilled = now;
        self.next_send = now + self.interval;
        self.interval = (self.interval * 2).min(MAX_SYNC_INTERVAL);
        let n = (self.tokens as usize).min(want);
        self.tokens -= n as f64;
        n
    }
}

/// What one of a slot's shadow copies held when the switch answered a status query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CopyStatus {
    /// A [`ShadowState`], as the reply's status.
    state: u8,
    round: Round,
    /// A member gave up on the round (`ENC_WITHDRAWN` in the reply): it cannot end well.
    withdrawn: bool,
}

impl CopyStatus {
    fn held(self) -> bool {
        self.state != ShadowState::Empty as u8
    }

    /// Whether it holds a round still under way: filling, or (at an inner level) complete
    /// there and waiting for its parent's result.
    fn open(self) -> bool {
        self.state == ShadowState::Filling as u8 || self.state == ShadowState::PartialSent as u8
    }
}

impl Engine {
    /// Whether the engine knows the job's state at the switch.
    pub fn synced(&self) -> bool {
        matches!(self.job_state, JobState::Known)
    }

    /// Starts learning the job's state if nobody did; takes the error of an attempt that
    /// failed.
    pub fn sync(&mut self) -> Option<Result<(), AllreduceError>> {
        if let Some(e) = self.sync_error.take() {
            return Some(Err(e));
        }
        match self.job_state {
            JobState::Known => Some(Ok(())),
            JobState::Unknown => {
                self.start_sync();
                None
            }
            JobState::Asking { .. } => None,
        }
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
    pub(super) fn start_sync(&mut self) {
        let now = Instant::now();
        let slots = self.p.shape.slots();
        self.job_state = JobState::Asking {
            copies: vec![[None; 2]; slots],
            started: now,
            pace: Pace::new(now, self.window.rto(), 2 * slots),
        };
    }

    /// Sends the queries of a sync in progress that are due, and gives up on a switch that
    /// never answered.
    pub(super) fn ask_switch(&mut self) -> io::Result<()> {
        let JobState::Asking {
            copies,
            started,
            pace,
        } = &mut self.job_state
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
            self.fail_sync(e);
            return Ok(());
        }
        let waiting = copies
            .iter()
            .map(|c| c.iter().filter(|x| x.is_none()).count())
            .sum();
        let allowed = pace.take(now, waiting);
        let unanswered: Vec<(usize, u8)> = copies
            .iter()
            .enumerate()
            .flat_map(|(slot, c)| {
                (0..2u8)
                    .filter(|&s| c[usize::from(s)].is_none())
                    .map(move |s| (slot, s))
            })
            .take(allowed)
            .collect();
        let message = self.next_message;
        for (slot, shadow) in unanswered {
            self.query(message, 0, slot, shadow)?;
        }
        Ok(())
    }

    /// Takes a status reply in if a sync is asking; false if it is not (the reply is a
    /// diagnosis's).
    pub(super) fn sync_reply(&mut self, h: &Header) -> bool {
        if !matches!(self.job_state, JobState::Asking { .. }) {
            return false;
        }
        if wire::status::is_refusal(h.status) {
            let e = self.refused(h.status, h.slot());
            self.fail_sync(e);
            return true;
        }
        // A member whose window is not the job's would put its segments on other slots
        // than the others do and wait for them until its collective timeout. (The level
        // above's answer to a forwarded query gives its own job's count.)
        let slots = h.job_slots();
        if h.above == 0 && slots != 0 && usize::from(slots) != self.p.shape.slots() {
            let e = self.other_slots_than_the_job(slots);
            self.fail_sync(e);
            return true;
        }
        let JobState::Asking { copies, .. } = &mut self.job_state else {
            return false;
        };
        if let Some(c) = copies.get_mut(usize::from(h.slot())) {
            c[h.shadow()] = Some(CopyStatus {
                state: h.status,
                round: Round::new(h.message(), h.segment()),
                withdrawn: h.enc_flags() & wire::ENC_WITHDRAWN != 0,
            });
        }
        true
    }

    /// Takes up the job's state once the switch answered for every copy.
    pub(super) fn sync_if_answered(&mut self) {
        if let JobState::Asking { copies, .. } = &self.job_state {
            if copies.iter().all(|c| c.iter().all(Option::is_some)) {
                let copies: Vec<[CopyStatus; 2]> = copies
                    .iter()
                    .map(|c| c.map(|x| x.expect("every copy answered")))
                    .collect();
                self.synced_to(&copies);
            }
        }
    }

    /// Takes up the job's state as learned: the next message, each slot's next copy; the
    /// requests waiting for it start.
    fn synced_to(&mut self, copies: &[[CopyStatus; 2]]) {
        if self.p.first_message.is_none() {
            self.next_message = next_message(copies);
        }
        for (slot, held) in copies.iter().enumerate() {
            self.window
                .set_next_shadow(slot, next_shadow(*held, self.next_message));
            self.cursor[slot] = (self.next_message, 0);
        }
        self.job_state = JobState::Known;
        let mut waiting: Vec<Active> = self.active.drain(..).collect();
        for a in &mut waiting {
            self.start(a);
        }
        self.active.extend(waiting);
        self.fill(0..self.window.slots());
    }

    /// Forgets the attempt to learn the job's state, ends every request waiting for it
    /// with `e`, and keeps `e` for [`Self::sync`].
    fn fail_sync(&mut self, e: AllreduceError) {
        self.job_state = JobState::Unknown;
        while let Some(a) = self.active.pop_front() {
            deliver(a, Err(e.clone()), &self.transport, self.view_slots());
        }
        self.sync_error = Some(e);
    }
}

/// The message a new process of a job takes up, from what every slot's copies hold: the
/// oldest message with a round still filling (the others are in it and wait for this
/// member), but never past the one after the newest message with a completed round —
/// members ahead, with requests pipelined, may already have rounds of later messages
/// filling, and the replies may show those before the oldest; 0 on a job that never ran.
/// A filling round whose slot's other copy holds a newer round was abandoned (its members
/// gave up and went on) and does not count; nor does one a member gave up on (withdrawn:
/// its result would fail every member), whose message counts as finished instead; nor
/// does a message a new process can no longer take up from its start ([`can_take_up`]).
fn next_message(copies: &[[CopyStatus; 2]]) -> u32 {
    let oldest = |a: u32, b: u32| {
        if Round::first(a).is_after(Round::first(b)) {
            b
        } else {
            a
        }
    };
    let newest_done = copies
        .iter()
        .flatten()
        .filter(|c| c.state == ShadowState::Done as u8 || (c.open() && c.withdrawn))
        .map(|c| c.round.message)
        .reduce(|a, b| {
            if Round::first(b).is_after(Round::first(a)) {
                b
            } else {
                a
            }
        });
    let live = copies
        .iter()
        .flat_map(|pair| {
            (0..2).filter_map(move |i| {
                let (c, other) = (pair[i], pair[1 - i]);
                let abandoned = other.held() && other.round.is_after(c.round);
                (c.open() && !abandoned && !c.withdrawn && can_take_up(copies, c.round.message))
                    .then_some(c.round.message)
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

/// Whether a new process can take up message `m` from its first segment: on every slot
/// that holds rounds of `m`, the first of `m`'s rounds there (segment s goes to slot
/// (m + s) mod slots, as the schedule sends it) is among them — under way, or done and its
/// result stored for the asking. A slot holding only later rounds of `m` dropped that
/// result: the new process's contribution would be stale there and its result never come
/// (every member restarted after one was killed mid-message waited there until its
/// collective timeout). Such a message counts as passed over; the members still in it (if
/// any) time out in it.
fn can_take_up(copies: &[[CopyStatus; 2]], m: u32) -> bool {
    let w = copies.len();
    copies.iter().enumerate().all(|(slot, pair)| {
        let first = (slot + w - m as usize % w) % w;
        let mut of_m = pair
            .iter()
            .filter(|c| c.held() && c.round.message == m)
            .peekable();
        of_m.peek().is_none() || of_m.any(|c| c.round.segment as usize == first)
    })
}

/// The copy a slot's next round takes, given what its two copies hold and the worker's
/// first message: the copy holding the slot's oldest round of that message or later,
/// which the other members started (see [`Engine::start_sync`]); else the copy that does
/// not hold the newest round (copy 0 when both are empty).
fn next_shadow(copies: [CopyStatus; 2], message: u32) -> u8 {
    let ours =
        |c: CopyStatus| c.held() && !Round::first(c.round.message).is_before(Round::first(message));
    match (ours(copies[0]), ours(copies[1])) {
        (true, false) => return 0,
        (false, true) => return 1,
        (true, true) => {
            return if copies[0].round.is_after(copies[1].round) {
                1
            } else {
                0
            }
        }
        (false, false) => {}
    }
    match (copies[0].held(), copies[1].held()) {
        (false, false) => 0,
        (true, false) => 1,
        (false, true) => 0,
        (true, true) => {
            if copies[0].round.is_after(copies[1].round) {
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

    fn copy(state: u8, message: u32, segment: u32) -> CopyStatus {
        CopyStatus {
            state,
            round: Round::new(message, segment),
            withdrawn: false,
        }
    }

    /// A sync nobody answers, asked about 256 copies and polled every millisecond for 10 s:
    /// the first round whole, then at most 20 queries a second, in rounds ever further
    /// apart up to a second.
    #[test]
    fn unanswered_queries_slow_down() {
        let start = Instant::now();
        let mut pace = Pace::new(start, Duration::from_millis(20), 256);
        let mut sent = Vec::new();
        for ms in 0..10_000u64 {
            let n = pace.take(start + Duration::from_millis(ms), 256);
            if n > 0 {
                sent.push((ms, n));
            }
        }
        assert_eq!(sent[0], (0, 256));
        let later: usize = sent[1..].iter().map(|&(_, n)| n).sum();
        assert!(later <= 200, "{sent:?}");
        assert!(later >= 150, "{sent:?}");
        let gaps: Vec<u64> = sent.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(gaps.iter().all(|&g| g <= 1000), "{gaps:?}");
    }

    #[test]
    fn the_next_shadow_copy_follows_the_newest_round() {
        let (empty, done) = (ShadowState::Empty as u8, ShadowState::Done as u8);
        let filling = ShadowState::Filling as u8;
        // A new job: copy 0.
        assert_eq!(next_shadow([copy(empty, 0, 0), copy(empty, 0, 0)], 0), 0);
        // One round so far, on copy 0: copy 1 next.
        assert_eq!(next_shadow([copy(done, 4, 3), copy(empty, 0, 0)], 5), 1);
        // The newest round decides, by message then segment, ids wrapping.
        assert_eq!(next_shadow([copy(done, 4, 3), copy(done, 4, 7)], 5), 0);
        assert_eq!(next_shadow([copy(done, 4, 11), copy(done, 4, 7)], 5), 1);
        assert_eq!(
            next_shadow([copy(done, 0, 0), copy(done, u32::MAX, 9)], 1),
            1
        );
        // Others already started this message's round on copy 1: join it.
        assert_eq!(next_shadow([copy(done, 4, 11), copy(filling, 5, 3)], 5), 1);
        // With requests pipelined, the slot's first round may be of a later message.
        assert_eq!(next_shadow([copy(filling, 6, 1), copy(empty, 0, 0)], 5), 0);
        // A member restarting after it contributed: the older of the slot's two rounds of
        // its messages comes first (it gets that one's stored result).
        assert_eq!(next_shadow([copy(filling, 6, 0), copy(done, 5, 2)], 5), 1);
    }

    #[test]
    fn a_new_process_takes_up_the_jobs_next_message() {
        let (e, f, d) = (
            ShadowState::Empty as u8,
            ShadowState::Filling as u8,
            ShadowState::Done as u8,
        );
        assert_eq!(next_message(&[[copy(e, 0, 0), copy(e, 0, 0)]]), 0);
        // Message 4 done everywhere: 5 next.
        assert_eq!(
            next_message(&[
                [copy(d, 4, 0), copy(d, 3, 2)],
                [copy(d, 4, 1), copy(e, 0, 0)]
            ]),
            5
        );
        // Message 5 under way on one slot (its segment 1, the first on slot 0: segment s
        // of message m goes to slot (m + s) mod slots): take it up.
        assert_eq!(
            next_message(&[
                [copy(d, 4, 0), copy(f, 5, 1)],
                [copy(d, 4, 1), copy(e, 0, 0)]
            ]),
            5
        );
        // Message 5 filling, but given up on by a member (its collective timeout): its
        // result would fail every member, so 6 next.
        let given_up = CopyStatus {
            withdrawn: true,
            ..copy(f, 5, 1)
        };
        assert_eq!(
            next_message(&[[copy(d, 4, 0), given_up], [copy(d, 4, 1), copy(e, 0, 0)]]),
            6
        );
        // Ids wrap.
        assert_eq!(next_message(&[[copy(d, u32::MAX, 0), copy(d, 0, 1)]]), 1);
        // Pipelined: messages 5 to 7 filling, the oldest is taken up.
        assert_eq!(
            next_message(&[
                [copy(f, 7, 2), copy(d, 4, 2)],
                [copy(f, 5, 2), copy(e, 0, 0)],
                [copy(f, 6, 2), copy(e, 0, 0)]
            ]),
            5
        );
        // A member ahead has rounds of later messages filling; the replies show those
        // before any of the oldest: the one after the newest completed message.
        assert_eq!(
            next_message(&[
                [copy(f, 20, 12), copy(d, 4, 0)],
                [copy(f, 19, 14), copy(d, 0, 108)]
            ]),
            5
        );
        // At an inner level a round may wait for the parent: still under way.
        let p = ShadowState::PartialSent as u8;
        assert_eq!(
            next_message(&[
                [copy(d, 4, 0), copy(p, 5, 1)],
                [copy(d, 4, 1), copy(e, 0, 0)]
            ]),
            5
        );
        // Every member restarted after one was killed in message 5: its first rounds'
        // results (segment 1 on slot 0, 0 on slot 1) are gone from both slots, which hold
        // later rounds of 5, one waiting for the killed member: 5 cannot be taken up from
        // its start, 6 next.
        assert_eq!(
            next_message(&[
                [copy(d, 5, 3), copy(f, 5, 5)],
                [copy(d, 5, 4), copy(d, 5, 2)]
            ]),
            6
        );
        // Slot 1 moved on with its first round still stored: 5 can be taken up.
        assert_eq!(
            next_message(&[
                [copy(f, 5, 1), copy(d, 4, 6)],
                [copy(d, 5, 0), copy(f, 5, 2)]
            ]),
            5
        );
        // Some members already went on to 1 (its first rounds filling, in the copies that
        // held 0's done rounds; its segment 0 on slot 1), 0 passed over: 1 — not 0 for
        // want of a done round (seen: the first member restarted took 1, the others 0).
        assert_eq!(
            next_message(&[
                [copy(f, 1, 1), copy(f, 0, 4)],
                [copy(f, 1, 0), copy(f, 0, 5)]
            ]),
            1
        );
        // A round abandoned (its slot went on to a newer one) does not count.
        assert_eq!(
            next_message(&[
                [copy(f, 2, 0), copy(d, 9, 3)],
                [copy(d, 9, 4), copy(e, 0, 0)]
            ]),
            10
        );
    }
}
