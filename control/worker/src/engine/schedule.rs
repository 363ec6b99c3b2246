//! The schedule (see the [engine's overview](super)): which round each slot takes next,
//! and sending it as soon as the slot is free.

use std::{io, time::Instant};

use xagg_common::Round;

use super::Engine;
use crate::{data, window::InFlight, AllreduceError};

impl Engine {
    /// The next round slot `slot` takes: the first running request, in message order, with
    /// a segment on the slot not before the slot's cursor.
    fn next_round(&self, slot: usize) -> Option<(usize, usize)> {
        let w = self.window.slots();
        let (cm, cs) = self.cursor[slot];
        for (i, a) in self.active.iter().enumerate() {
            let Some(k) = a.message else { break };
            if !a.running() || Round::first(k).is_before(Round::first(cm)) {
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
    pub(super) fn fill(&mut self, slots: impl IntoIterator<Item = usize>) {
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

    /// Sends the next round of slot `slot` if it is free.
    pub(super) fn fill_slot(&mut self, slot: usize) -> io::Result<()> {
        if self.window.busy(slot) {
            return Ok(());
        }
        let Some((i, segment)) = self.next_round(slot) else {
            return Ok(());
        };
        let a = &self.active[i];
        let message = a.message.expect("running");
        let count = a.layout.range(segment).len().div_ceil(a.r.dtype.size());
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
            has_data: self.early.remove(&(message, segment)),
            complete: false,
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
        self.send(i, slot, &f, false)?;
        self.window.sent(slot, f);
        Ok(())
    }
}

/// The slots the first rounds of a message of `segments` segments go to.
pub(super) fn slots_of(message: u32, segments: usize, w: usize) -> impl Iterator<Item = usize> {
    let base = message as usize % w;
    (0..segments.min(w)).map(move |i| (base + i) % w)
}
