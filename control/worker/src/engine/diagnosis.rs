//! A request without progress: after the give-up time without a result it asks the
//! switch, for each of its rounds in flight, which members the slot waits for. A switch
//! that answers is alive — the request waits on slow members, saying whom, up to the
//! collective timeout; one that refused, or did not answer at all, ends it. At the
//! collective timeout the request first gives up on its rounds at the switch (its
//! contributions sent again, marked `ENC_WITHDRAWN`, and the switch asked once more): a
//! round still waiting keeps the mark, so the late member's call fails too; a round
//! complete meanwhile answers with its result, and the call succeeds after all.
//! Before the give-up time, a second into a stall, a request looks once for a rank whose
//! process is gone (the same questions, only that answer acted on): a killed rank's
//! others fail in about a second, not at the give-up time.

use std::{
    io,
    time::{Duration, Instant},
};

use xagg_common::{
    job::members_of,
    slot::ShadowState,
    wire::{self, Header, ENC_WITHDRAWN},
};

use super::Engine;
use crate::{request::lock, window::InFlight, AllreduceError, Missing};

/// How long a request's diagnosis waits for the switch's status replies.
const DIAGNOSIS: Duration = Duration::from_millis(300);

/// How long a request goes without progress before it looks, once per stall, for a rank
/// whose process is gone (its responder refuses connections): a killed rank is found in
/// about this time instead of at the give-up time, and nothing else is judged this early.
const LOOK_FOR_THE_GONE: Duration = Duration::from_secs(1);

/// A request asking the switch why it has no progress: what it asked, the answers so far,
/// and until when it waits for the rest.
pub(super) struct Diagnosis {
    until: Instant,
    waited: Duration,
    missing: Vec<Missing>,
    refusal: Option<(u8, u16)>,
    /// Asking after the request gave up on its rounds: each answer says whether the mark
    /// is kept.
    withdrawing: bool,
    /// An early look before the give-up time ([`LOOK_FOR_THE_GONE`]): only a rank found
    /// gone, or whose call failed for good, ends the request; anything else waits on.
    early: bool,
}

/// What a complete diagnosis means for its request.
enum Verdict {
    /// The switch answered: go on waiting.
    Wait,
    /// The collective timeout passed: give up on the rounds at the switch first.
    Withdraw(Duration),
    Fail(AllreduceError),
}

impl Engine {
    /// Ends requests a peer was promised this rank would not finish from the switch;
    /// starts the diagnosis of requests without progress for the give-up time, and acts
    /// on those whose diagnosis is complete.
    pub(super) fn check_requests(&mut self, now: Instant) -> io::Result<()> {
        let mut i = 0;
        while i < self.active.len() {
            let a = &mut self.active[i];
            if let (Some(v), Some(m), None) = (&self.view, a.message, a.withdrawn) {
                a.withdrawn = lock(v).withdrawn(m);
            }
            if let (Some(message), Some(segment)) = (a.message, a.withdrawn) {
                let e = AllreduceError::Withdrawn {
                    job: self.p.job,
                    message,
                    segment,
                };
                self.give_up(i, e);
                continue;
            }
            if let Some(d) = &a.diagnosis {
                let answered = if d.withdrawing {
                    d.missing.iter().all(|m| m.withdrawn && m.complete())
                } else {
                    d.missing.iter().all(Missing::complete)
                };
                if d.early {
                    // A refusal is judged at the give-up time, as a switch that is silent.
                    if now >= d.until || answered {
                        if let Some(e) = self.early_verdict(i) {
                            self.give_up(i, e);
                            continue;
                        }
                    }
                } else if now >= d.until || answered || d.refusal.is_some() {
                    match self.diagnosed(i, now) {
                        Verdict::Fail(e) => {
                            self.give_up(i, e);
                            continue;
                        }
                        Verdict::Withdraw(waited) => self.withdraw_rounds(i, waited)?,
                        Verdict::Wait => {}
                    }
                }
            } else if a.running() && a.in_flight > 0 {
                let waited = now.duration_since(a.last_progress);
                // A collective timeout shorter than the give-up time ends the call at
                // its own end, not at the give-up time.
                let give_up = self.p.give_up.min(self.p.collective_timeout);
                if waited > give_up {
                    self.diagnose(i, waited)?;
                } else if waited > LOOK_FOR_THE_GONE
                    && give_up > LOOK_FOR_THE_GONE * 2
                    && a.looked != Some(a.last_progress)
                    && !self.responders.is_empty()
                {
                    a.looked = Some(a.last_progress);
                    self.ask(i, waited, false, true)?;
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Ends request `i` with `e`, its rounds taken out of flight and their slots given to
    /// the next requests.
    fn give_up(&mut self, i: usize, e: AllreduceError) {
        let freed = self.withdraw(i);
        self.end(i, Err(e));
        self.fill(freed);
    }

    /// Asks the switch, for each of request `i`'s rounds in flight, which members the slot
    /// waits for; the rounds stay in flight.
    fn diagnose(&mut self, i: usize, waited: Duration) -> io::Result<()> {
        self.ask(i, waited, false, false)
    }

    /// Gives up on request `i`'s rounds in flight at the switch (each contribution sent
    /// again, twice, marked `ENC_WITHDRAWN`), then asks as [`Self::diagnose`] does.
    fn withdraw_rounds(&mut self, i: usize, waited: Duration) -> io::Result<()> {
        let (_, flights) = self.flights(i);
        for (slot, f) in flights {
            for _ in 0..2 {
                self.send(i, slot, &f, true)?;
            }
        }
        self.flush()?;
        self.ask(i, waited, true, false)
    }

    /// Request `i`'s message and its rounds in flight, by slot.
    fn flights(&self, i: usize) -> (u32, Vec<(usize, InFlight)>) {
        let message = self.active[i].message.expect("running");
        let flights = self
            .window
            .in_flight()
            .filter(|(_, f)| f.message == message)
            .map(|(s, f)| (s, *f))
            .collect();
        (message, flights)
    }

    /// The queries of a diagnosis (`withdrawing`: after giving up on the rounds; `early`:
    /// a look for a gone rank before the give-up time).
    fn ask(
        &mut self,
        i: usize,
        waited: Duration,
        withdrawing: bool,
        early: bool,
    ) -> io::Result<()> {
        let (message, flights) = self.flights(i);
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
                withdrawn: false,
                me: self.p.member,
                other_round: None,
            });
        }
        self.active[i].diagnosis = Some(Diagnosis {
            until: Instant::now() + DIAGNOSIS,
            waited,
            missing,
            refusal: None,
            withdrawing,
            early,
        });
        Ok(())
    }

    /// A status reply to a diagnosis: which members the slot waits for.
    pub(super) fn diagnosis_reply(&mut self, h: &Header, payload: &[u8; wire::STATUS_PAYLOAD]) {
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
        if h.message() == message && h.segment() == m.segment {
            // Giving up is kept there, or the round is complete (its result comes back
            // for the contribution sent again).
            m.withdrawn |=
                h.enc_flags() & ENC_WITHDRAWN != 0 || h.status == ShadowState::Done as u8;
        }
        if above {
            if h.message() == message && h.segment() == m.segment {
                let seen = u64::from_le_bytes(payload[..8].try_into().unwrap());
                let all = u64::from_le_bytes(payload[8..16].try_into().unwrap());
                m.above_members = Some(members_of(all & !seen).collect());
            }
            return;
        }
        m.answered = true;
        if h.message() != message {
            // Message ids wrap: the nearer way round tells earlier from later.
            m.other_round = Some((h.message().wrapping_sub(message) as i32).cmp(&0));
        }
        if h.message() == message && h.segment() == m.segment {
            let seen = u64::from_le_bytes(payload[..8].try_into().unwrap());
            let all = u64::from_le_bytes(payload[8..16].try_into().unwrap());
            m.members = Some(members_of(all & !seen).collect());
            m.above = h.status == ShadowState::PartialSent as u8;
        }
    }

    /// What an early look of request `i` found: a rank the switch waits for whose process
    /// is gone or whose call failed for good ([`Self::absent`]), else nothing (the request
    /// waits on as before; a switch that does not answer is judged at the give-up time).
    fn early_verdict(&mut self, i: usize) -> Option<AllreduceError> {
        let d = self.active[i].diagnosis.take().expect("looking");
        let message = self.active[i].message.expect("running");
        self.absent(message, &d.missing)
    }

    /// What a complete diagnosis of request `i` means: the error it ends with — refused,
    /// no switch (no reply at all), waited longer than the collective timeout (once it gave
    /// up on its rounds at the switch) — or waiting on when the switch answered (said once
    /// per give-up time, naming whom it waits for).
    fn diagnosed(&mut self, i: usize, now: Instant) -> Verdict {
        match self.verdict(i, now) {
            Some(Ok(waited)) => Verdict::Withdraw(waited),
            Some(Err(e)) => Verdict::Fail(e),
            None => Verdict::Wait,
        }
    }

    /// [`Self::diagnosed`]: `Some(Ok(waited))` to give up on the rounds first.
    fn verdict(&mut self, i: usize, now: Instant) -> Option<Result<Duration, AllreduceError>> {
        let (job, give_up, limit) = (self.p.job, self.p.give_up, self.p.collective_timeout);
        let d = self.active[i].diagnosis.take().expect("diagnosed");
        let message = self.active[i].message.expect("running");
        if let Some((code, slot)) = d.refusal {
            return Some(Err(self.refused(code, slot)));
        }
        if !d.missing.is_empty() && d.missing.iter().all(|m| !m.answered) {
            return Some(Err(AllreduceError::NoSwitch {
                job,
                switch: self.p.switch,
                waited: d.waited,
            }));
        }
        // A round that still waits for this member a give-up time after it sent: none of
        // its copies was taken (a filter on the way, or refused: another op, type or count
        // began the round). Waiting for itself cannot end: it gives up on its rounds, and
        // fails saying so.
        if !d.withdrawing && d.missing.iter().any(Missing::not_taken) {
            return Some(Ok(d.waited));
        }
        if let Some(e) = self.absent(message, &d.missing) {
            return Some(Err(e));
        }
        // Nobody waited for and still no result: lost on the way here, or the level above
        // silent (the peers may hold the results).
        if d.withdrawing {
            return Some(Err(AllreduceError::Timeout {
                job,
                message,
                waited: d.waited,
                missing: d.missing,
            }));
        }
        if d.missing.iter().all(Missing::stuck) {
            return Some(Err(AllreduceError::Timeout {
                job,
                message,
                waited: d.waited,
                missing: d.missing,
            }));
        }
        let a = &mut self.active[i];
        let since = *a.waiting_since.get_or_insert(now - d.waited);
        let waited = now.duration_since(since);
        if waited >= limit {
            return Some(Ok(waited));
        }
        a.last_progress = now;
        // Said at the give-up time, then each time the wait doubles.
        if waited < a.next_notice {
            return None;
        }
        a.next_notice = waited.max(give_up) * 2;
        let first = d.missing.iter().take(2).map(|m| m.to_string());
        crate::say(&format!(
            "job {job} message {message}, {} here: no result for {:.0} s, the switch is up and waits: {}; still waiting (the collective timeout is {} s, XAGG_TIMEOUT_S)",
            self.p.who(),
            waited.as_secs_f64().max(give_up.as_secs_f64()),
            first.collect::<Vec<_>>().join("; "),
            limit.as_secs()
        ));
        None
    }

    /// A rank the switch waits for that will not come: one whose responder refuses
    /// connections (its process is gone), or says that its call of `message` failed for
    /// good (the ranks' calls did not match: its contribution was refused). In a flat job
    /// the members waited for are the ranks; behind host levels (the ranks' places known)
    /// they are the ranks this rank's host waits for and every rank of the hosts the level
    /// above waits for. A rank that does not answer at all proves nothing (a slow or
    /// unreachable one is waited for).
    fn absent(&self, message: u32, missing: &[Missing]) -> Option<AllreduceError> {
        if self.responders.is_empty() {
            return None;
        }
        let job = self.p.job;
        let mine = self.p.rank_in_job();
        // The members waited for at this rank's aggregation point, or at the level above.
        let waited = |at: fn(&Missing) -> Option<&Vec<u8>>| -> std::collections::BTreeSet<u8> {
            missing.iter().filter_map(at).flatten().copied().collect()
        };
        let here = waited(|m| m.members.as_ref());
        let ranks: std::collections::BTreeSet<usize> = match self.p.levels_by_place() {
            None if self.p.ranks.is_none() => here.into_iter().map(usize::from).collect(),
            None => return None,
            Some(places) => {
                let host = places[mine].host;
                let above = waited(|m| m.above_members.as_ref());
                (0..places.len())
                    .filter(|&r| {
                        let p = places[r];
                        (p.host == host && here.contains(&p.member)) || above.contains(&p.host)
                    })
                    .collect()
            }
        };
        // A few at most: an unreachable host costs its connect's timeout.
        let patience = (Duration::from_millis(300), Duration::from_secs(1));
        ranks
            .into_iter()
            .filter(|&r| r != mine)
            .take(8)
            .find_map(|rank| {
                let at = *self.responders.get(rank)?;
                match crate::peers::fate(at, &self.responders_key, job, message, patience) {
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        // In a flat job the rank is the daemon's member: the leave says so.
                        if self.p.ranks.is_none() && rank < 64 {
                            self.gone
                                .fetch_or(1 << rank, std::sync::atomic::Ordering::SeqCst);
                        }
                        Some(AllreduceError::MemberGone {
                            job,
                            message,
                            rank,
                            at,
                        })
                    }
                    Ok(Some(reason)) => Some(AllreduceError::MemberFailed {
                        job,
                        message,
                        rank,
                        reason,
                    }),
                    _ => None,
                }
            })
    }

    /// Why the switch refused this member, from a status reply's refusal `code`.
    pub(super) fn refused(&self, code: u8, slot: u16) -> AllreduceError {
        let (job, member) = (self.p.job, self.p.member);
        let reason = match (code, self.p.joined_through) {
            // Joined: no flag of the member's own named the job, its member or its address.
            (wire::status::REFUSED_NOT_MEMBER, Some(daemon)) => format!(
                "job {job} is gone from the switch, or this rank no longer a member of it: the daemon it joined through ({daemon}) removed it — when a rank's lease runs out (its process gone: the other ranks then wait a lease for it), when a level below leaves with rounds waiting for it, when every rank left, or by hand; that daemon's log says which"
            ),
            // The switch does not tell a stranger whether a job exists: this covers both.
            (wire::status::REFUSED_NOT_MEMBER, None) => format!(
                "this is not member {member} of job {job} as the switch holds it: the switch has no job {job}, or the member index, the switch port this host is behind, or its MAC, IPv4 address or UDP port ({}) differ from the job's; compare --job, --member and --bind with `xagg job list --json`",
                self.p.bind
            ),
            (wire::status::REFUSED_SLOT_RANGE, _) => format!(
                "slot {slot} is outside the job's slots: this worker's --slots ({}) is more than the job has",
                self.p.shape.slots()
            ),
            (c, _) => format!("refusal {c:#x}"),
        };
        AllreduceError::Refused { job, reason }
    }

    /// The switch's status reply gave the job `slots` slots, not this worker's window.
    pub(super) fn other_slots_than_the_job(&self, slots: u16) -> AllreduceError {
        AllreduceError::Refused {
            job: self.p.job,
            reason: format!(
                "the job has {slots} slots and this worker's --slots is {}: a member with another window puts its segments on other slots than the others do; give every member the job's slot count (`slots` in `xagg job list --json`)",
                self.p.shape.slots()
            ),
        }
    }
}
