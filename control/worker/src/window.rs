//! The worker's window: which rounds of the job's requests are in flight on which slots,
//! which shadow copy each slot uses next, when a contribution is due again, and whether a
//! result that came in is one the worker is waiting for.
//!
//! A slot has one round (a segment of a message) in flight at a time and takes its next
//! one only once the result of the last is in; which round comes next is the engine's
//! schedule ([`crate::engine`]). Each use of a slot flips its shadow copy, so the switch
//! keeps the previous result while a slower member may still ask for it.

use std::time::{Duration, Instant};

use xagg_common::wire::{Header, Kind};

/// A contribution sent and not yet answered.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    pub message: u32,
    pub segment: usize,
    pub shadow: u8,
    /// Elements of the segment, its op and data type: what the result must carry.
    pub count: u16,
    pub op: u8,
    pub dtype: u8,
    pub sent: Instant,
    /// Retransmission timeout of this contribution.
    pub rto: Duration,
    pub retransmitted: bool,
    /// A gather's data came in, marked pending, while its completion had not.
    pub has_data: bool,
    /// A gather's completion came in without its data, which had not.
    pub complete: bool,
}

/// A result the window took: its slot and the contribution it answers.
#[derive(Clone, Copy, Debug)]
pub struct Answered {
    pub slot: usize,
    pub flight: InFlight,
}

pub struct Window {
    job: u32,
    /// Uses of each of the job's slots so far: the parity is the next shadow copy.
    uses: Vec<u32>,
    /// Smoothed round trip.
    srtt: Option<Duration>,
    timeout: Duration,
    min_timeout: Duration,
    max_timeout: Duration,
    flight: Vec<Option<InFlight>>,
}

impl Window {
    /// `timeout` until a round trip is measured, then four smoothed round trips within
    /// `(min, max)`.
    pub fn new(
        job: u32,
        slots: usize,
        timeout: Duration,
        (min_timeout, max_timeout): (Duration, Duration),
    ) -> Self {
        Self {
            job,
            uses: vec![0; slots],
            srtt: None,
            timeout,
            min_timeout,
            max_timeout,
            flight: vec![None; slots],
        }
    }

    /// The job's slots.
    pub fn slots(&self) -> usize {
        self.uses.len()
    }

    /// The shadow copy slot `slot`'s next round uses (and counts the use).
    pub fn next_shadow(&mut self, slot: usize) -> u8 {
        let shadow = (self.uses[slot] & 1) as u8;
        self.uses[slot] = self.uses[slot].wrapping_add(1);
        shadow
    }

    /// Makes `shadow` the copy slot `slot`'s next round uses (learned from the switch).
    pub fn set_next_shadow(&mut self, slot: usize, shadow: u8) {
        self.uses[slot] = u32::from(shadow & 1);
    }

    /// Records a contribution just sent on `slot`.
    pub fn sent(&mut self, slot: usize, f: InFlight) {
        self.flight[slot] = Some(f);
    }

    /// Whether `slot` has a round in flight.
    pub fn busy(&self, slot: usize) -> bool {
        self.flight[slot].is_some()
    }

    /// Takes `slot`'s round out of flight without a result (a request given up).
    pub fn remove(&mut self, slot: usize) -> Option<InFlight> {
        self.flight[slot].take()
    }

    /// Checks a result's header against what is in flight: the job, the slot and its
    /// round (message and segment), its shadow copy, the op and type, and the element
    /// count. Returns the slot and the contribution it answers, which stays in flight
    /// until [`Self::take`].
    pub fn check(&self, h: &Header) -> Option<Answered> {
        if h.kind != Kind::Result as u8 || h.job() != self.job {
            return None;
        }
        let slot = usize::from(h.slot());
        let f = *self.flight.get(slot)?.as_ref()?;
        if f.message != h.message()
            || f.segment as u32 != h.segment()
            || h.shadow() as u8 != f.shadow
            || h.dtype != f.dtype
            || h.op != f.op
            || h.count() != f.count
        {
            return None;
        }
        Some(Answered { slot, flight: f })
    }

    /// Notes that `a`'s round's data came in, marked pending (a gather's); whether its
    /// completion came already, so that the round is over.
    pub fn data_came(&mut self, a: &Answered) -> bool {
        self.round_of(a).is_some_and(|f| {
            f.has_data = true;
            f.complete
        })
    }

    /// Notes that `a`'s round is complete but its data (a gather's, sent pending) has not
    /// come; the round stays in flight until it does.
    pub fn completion_came(&mut self, a: &Answered) {
        if let Some(f) = self.round_of(a) {
            f.complete = true;
        }
    }

    fn round_of(&mut self, a: &Answered) -> Option<&mut InFlight> {
        self.flight[a.slot]
            .as_mut()
            .filter(|f| f.segment == a.flight.segment && f.message == a.flight.message)
    }

    /// Takes the contribution a result answered out of flight, unless it already left:
    /// one receive batch may hold the same result twice (a reply to a retransmission and
    /// the broadcast), and the second finds the slot moved on to a later round.
    pub fn take(&mut self, a: &Answered) -> Option<InFlight> {
        let entry = &mut self.flight[a.slot];
        if entry
            .as_ref()
            .is_none_or(|f| f.segment != a.flight.segment || f.message != a.flight.message)
        {
            return None;
        }
        let f = entry.take()?;
        if !f.retransmitted {
            self.sample_rtt(f.sent.elapsed());
        }
        Some(f)
    }

    /// The contributions whose timeout has passed at `now`: taken out of flight, each to
    /// be sent again (and recorded with [`Self::sent`]) with the timeout to use next.
    pub fn due(&mut self, now: Instant) -> Vec<(usize, InFlight)> {
        let max = self.max_timeout;
        self.flight
            .iter_mut()
            .enumerate()
            .filter(|(_, e)| matches!(e, Some(f) if now.duration_since(f.sent) >= f.rto))
            .map(|(slot, e)| {
                let mut f = e.take().expect("matched Some");
                f.rto = (f.rto * 2).min(max);
                f.retransmitted = true;
                (slot, f)
            })
            .collect()
    }

    /// Restarts the clocks of the contributions recorded after `since` (queued, and sent
    /// only at `now`).
    pub fn restamp(&mut self, since: Instant, now: Instant) {
        for f in self.flight.iter_mut().flatten() {
            if f.sent > since {
                f.sent = now;
            }
        }
    }

    /// What is in flight, by slot.
    pub fn in_flight(&self) -> impl Iterator<Item = (usize, &InFlight)> {
        self.flight
            .iter()
            .enumerate()
            .filter_map(|(s, f)| f.as_ref().map(|f| (s, f)))
    }

    /// The retransmission timeout of a new contribution.
    pub fn rto(&self) -> Duration {
        match self.srtt {
            None => self.timeout,
            Some(s) => (s * 4).clamp(self.min_timeout.min(self.max_timeout), self.max_timeout),
        }
    }

    fn sample_rtt(&mut self, rtt: Duration) {
        self.srtt = Some(match self.srtt {
            None => rtt,
            Some(s) => (s * 7 + rtt) / 8,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagg_common::wire::{DType, Op};

    fn result(slot: u16, segment: u32, shadow: u8, count: u16) -> Header {
        Header::builder(Kind::Result)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(3)
            .message(9)
            .segment(segment)
            .slot(slot)
            .shadow(shadow)
            .count(count)
            .build()
    }

    #[test]
    fn results_are_checked_and_taken_once() {
        let mut w = Window::new(
            3,
            2,
            Duration::from_millis(20),
            (Duration::from_millis(10), Duration::from_millis(500)),
        );
        let now = Instant::now();
        for slot in 0..2 {
            let shadow = w.next_shadow(slot);
            w.sent(
                slot,
                InFlight {
                    message: 9,
                    segment: slot,
                    shadow,
                    count: 4,
                    op: Op::Sum as u8,
                    dtype: DType::I32 as u8,
                    sent: now,
                    rto: w.rto(),
                    retransmitted: false,
                    has_data: false,
                    complete: false,
                },
            );
        }
        assert!(w.check(&result(0, 0, 1, 4)).is_none(), "wrong shadow copy");
        assert!(w.check(&result(0, 1, 0, 4)).is_none(), "wrong segment");
        assert!(w.check(&result(0, 0, 0, 3)).is_none(), "wrong count");
        let mut other = result(0, 0, 0, 4);
        other.set_message(8);
        assert!(w.check(&other).is_none(), "another message");
        let a = w.check(&result(0, 0, 0, 4)).unwrap();
        assert!(w.take(&a).is_some());
        assert!(w.take(&a).is_none(), "the same result twice");
        assert!(!w.busy(0));
        // Slot 0's next round uses the other shadow copy.
        assert_eq!(w.next_shadow(0), 1);
        // Slot 1, sent (queued) at `now`, went out only 15 ms later: its clock restarts.
        w.restamp(
            now - Duration::from_millis(1),
            now + Duration::from_millis(15),
        );
        assert!(
            w.due(now + Duration::from_millis(25)).is_empty(),
            "restamped"
        );
        let due = w.due(now + Duration::from_millis(40));
        assert_eq!(due.len(), 1, "slot 1 is due");
        assert_eq!(due[0].1.rto, Duration::from_millis(40));
    }
}
