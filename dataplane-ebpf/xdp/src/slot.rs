//! The slot state machine. A slot is a spin lock and two shadow copies; a packet's shadow
//! bit picks the copy. Each copy holds one round — the segment (message, segment) it is
//! aggregating — and moves Empty -> Filling -> Done:
//!
//! | the copy holds                | contribution from member m             | outcome   |
//! |-------------------------------|----------------------------------------|-----------|
//! | same round, m already in      | Done: send the stored result to m only | Replay    |
//! |                               | Filling: never add twice (a member giving up, `ENC_WITHDRAWN`, marks the round) | Duplicate |
//! | same round, m not in          | add; the last member completes it      | Added / Complete |
//! | same round, other count       | refuse                                 | Mismatch  |
//! | same round, other op or type, collective or root | refuse: its first contribution fixed them | OpMismatch |
//! | a newer round than m's        | a late packet from the past            | Stale     |
//! | Filling an older round        | abandoned (a failed allreduce): start m's round | Reclaimed / Complete |
//! | Done with an older round      | everyone has moved on: start m's round | Added / Complete |
//! | Empty                         | start m's round                        | Added / Complete |
//!
//! The collectives other than allreduce take the same rows (`docs/protocol.md`, "The
//! collectives"). A reduce-scatter or reduce folds like allreduce: only who gets the
//! result's data differs, decided per copy on the way out. A gather (all-gather,
//! broadcast) runs `Fold::Move`: only its root's contribution carries data, which the
//! fold stores as it is; the others contribute header-only (no words, nothing folded) or,
//! sent again by a member that lacks the data, with room for it, which a finished copy's
//! replay fills. So the rows hold as they are, with two outcomes of their own:
//!
//! | the copy holds                | contribution from member m             | outcome   |
//! |-------------------------------|----------------------------------------|-----------|
//! | same round, m the root, not the last | store the data                  | Posted: the data to every member, marked pending |
//! | same round, m not the root, the last | the frame gets the stored data if it has room | Complete |
//! | same round, m in, Filling with the data, m's frame with room | the data back to m | ReplayPending |
//!
//! At an inner level (`Role::Inner`: a host reducing its ranks, a lower switch) a copy
//! with every member in holds their *partial*, which goes to the parent, not to the
//! members: the copy moves Filling -> PartialSent -> Done, the parent's result stored over
//! the partial. The rows that differ:
//!
//! | the copy holds                     | packet                                  | outcome   |
//! |------------------------------------|-----------------------------------------|-----------|
//! | same round, m not in, m the last   | contribution from member m              | Partial: send it up |
//! | PartialSent, same round, m in      | contribution from member m (a resend)   | PartialAgain: the stored partial up again (marked by a member giving up) |
//! | PartialSent, same round            | the parent's result                     | Delivered: stored, sent to every member |
//! | anything else                      | the parent's result                     | Unawaited |
//! | PartialSent with an older round    | contribution from member m              | Reclaimed (abandoned, like Filling) |
//!
//! Behind a host level the collectives besides allreduce take the same rows: the ranks name
//! a segment's root here (`ROOT_ELSEWHERE`: another host's rank) and the root's host above
//! (`relay`, which the partial carries up as its root), and the parent's result goes down
//! naming the root here. A gather's root's host sends the data up (its other ranks send
//! room for it, so the completing contribution carries it); the others send headers; no
//! level but the top sends pending data of its own. From the parent:
//!
//! | the copy holds                     | packet                                  | outcome   |
//! |------------------------------------|-----------------------------------------|-----------|
//! | PartialSent, same round            | a header-only result (a reduce-scatter's or reduce's root elsewhere; a gather's, the copy holding the data) | Delivered: a completion to every member |
//! | PartialSent, same round, no data   | a gather's header-only result           | Unawaited: the ranks ask again with room |
//! | Filling or PartialSent, same round | a gather's data, pending                | DeliveredPending: kept (`COPY_HAS_DATA`), to every member pending |
//! | Empty, or Done with an older round | a gather's data, pending                | DeliveredPending: the round starts here, Filling, the root elsewhere |
//!
//! A partial is never handed to a member as data: only Done answers a member with `data`
//! (a Done copy of a reduce-scatter whose root is elsewhere keeps the partial, and a replay
//! of it is only a completion to a member, which takes no data of a segment it does not
//! own). The
//! invariant below holds across levels: a rank's round k+2 needs its result of round
//! k+1, which exists only once every level has delivered round k.
//!
//! A member sends round k+2 of a slot (same shadow copy as round k) only after it has the
//! result of round k+1, which exists only once every member has the result of round k:
//! so when a copy's next round starts, nobody can still need its stored result — and a
//! round still filling when a newer one arrives was abandoned by its members.
//!
//! Everything between lock and unlock is inlined: the verifier allows no calls there.

use aya_ebpf::{bindings::bpf_spin_lock, helpers};
use xagg_common::{
    slot::{Fold, ShadowState, COPY_HAS_DATA, EMPTY_TOP},
    wire::{ENC_WITHDRAWN, ROOT_ELSEWHERE},
    ShadowCopy,
};

use crate::reduce::{self, Words};

/// A `SLOTS` entry. The layout matches `xagg_common::slot::SlotImage`.
#[repr(C)]
pub struct Slot {
    pub lock: bpf_spin_lock,
    pub _pad: u32,
    pub shadow: [ShadowCopy; 2],
}

/// A contribution, as the slot needs it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Round {
    pub message: u32,
    pub segment: u32,
    /// The sender's member bit.
    pub bit: u64,
    /// All members' bits.
    pub members: u64,
    pub elems: u32,
    /// 64-bit words of payload.
    pub words: usize,
    /// The packet's block exponent and `enc_flags`.
    pub exponent: i32,
    pub flags: u32,
    /// What tells apart the folds that share a program (`Fold::masks`).
    pub masks: [u64; 2],
    pub op: u8,
    /// The header's, with `DTYPE_EXACT` in the exact lane.
    pub dtype: u8,
    /// Whether the job is at an inner level: a complete copy holds a partial.
    pub inner: u8,
    /// The packet's magnitude (exact lane; else 0).
    pub magnitude: u8,
    /// Bits the sum of the round's members may grow by: ceil(log2(members)).
    pub headroom: u8,
    /// The message's collective and the segment's root (`wire::Collective`).
    pub collective: u8,
    pub root: u8,
    /// Whether the payload is the round's data to store as it is: a gather's root's
    /// (`Fold::Move`). A gather's other members send none, or room for a replay.
    pub data: u8,
    /// A parent's result: whether it is a gather's data sent pending (before the round
    /// was complete above).
    pub pending: u8,
}

/// What a finished copy holds besides its data: the result header's block exponent,
/// sticky flags and magnitude.
#[derive(Default)]
pub struct Stored {
    pub exponent: i32,
    pub flags: u32,
    pub magnitude: u8,
    /// The segment's root as this level knows it.
    pub root: u8,
}

impl Stored {
    /// What copy `v` holds besides its data, read under the lock.
    #[inline(always)]
    fn of(v: &ShadowCopy) -> Self {
        let magnitude = if v.top == EMPTY_TOP {
            0
        } else {
            (v.top as i32 - v.exponent).clamp(0, 127) as u8
        };
        Self {
            exponent: v.exponent,
            flags: v.flags,
            magnitude,
            root: v.root,
        }
    }
}

/// A copy's `top` for a first block of magnitude `magnitude` at `exponent`.
#[inline(always)]
fn first_top(r: &Round) -> i16 {
    if r.magnitude == 0 {
        EMPTY_TOP
    } else {
        (r.exponent + r.magnitude as i32) as i16
    }
}

pub enum Outcome {
    /// Added; the slot waits for more members.
    Added,
    /// Added and complete: the frame's payload is the result.
    Complete,
    /// Added and complete at an inner level: the frame's payload is the partial, for the
    /// parent.
    Partial,
    /// Retransmission to a copy waiting for its parent: the frame's payload is the stored
    /// partial, for the parent again.
    PartialAgain,
    /// The parent's result, stored over the partial: the frame's payload is the result,
    /// for every member.
    Delivered,
    /// A gather's data from the parent, sent before its round was complete there: stored
    /// (the copy still waits for the completion), for every member, pending.
    DeliveredPending,
    /// A parent's result for a round the copy is not waiting for.
    Unawaited,
    /// Retransmission to a finished copy: the frame's payload is the stored result.
    Replay,
    /// A gather's member without the data, sent again with room for it to a copy that has
    /// the data but still waits for a member: the frame's payload is the data, pending.
    ReplayPending,
    /// Started a new round over an abandoned one.
    Reclaimed,
    Duplicate,
    Stale,
    Mismatch,
    /// The round was started with another op or data type.
    OpMismatch,
}

/// A shadow copy's state, for status queries.
pub struct Status {
    pub message: u32,
    pub segment: u32,
    pub seen: u64,
    pub state: u32,
    pub count: u32,
    /// Its sticky `enc_flags` (a member gave up on it: `ENC_WITHDRAWN`).
    pub flags: u32,
}

/// Reads shadow copy `shadow` of `slot` under its lock.
///
/// # Safety
/// `slot` must point into the `SLOTS` map.
#[inline(always)]
pub unsafe fn status(slot: *mut Slot, shadow: usize) -> Status {
    unsafe { helpers::bpf_spin_lock(&raw mut (*slot).lock) };
    let v = unsafe { &(*slot).shadow[shadow & 1] };
    let s = Status {
        message: v.message,
        segment: v.segment,
        seen: v.seen,
        state: v.state,
        count: v.count,
        flags: v.flags,
    };
    unsafe { helpers::bpf_spin_unlock(&raw mut (*slot).lock) };
    s
}

/// Whether round `(message, segment)` comes before the one `v` holds (serial-number arithmetic,
/// so the ids may wrap).
#[inline(always)]
fn older(message: u32, segment: u32, v: &ShadowCopy) -> bool {
    xagg_common::Round::new(message, segment).is_before_lazy(v.message, || v.segment)
}

/// Makes copy `v` hold round `r`: what the round's later packets must match.
#[inline(always)]
fn claim(v: &mut ShadowCopy, r: &Round) {
    v.message = r.message;
    v.segment = r.segment;
    v.count = r.elems;
    v.op = r.op;
    v.dtype = r.dtype;
    v.collective = r.collective;
}

/// Closes a copy with every member in: it holds the result, or at an inner level a
/// partial. Decided here, after the fold's loops, not before them: a value that differs
/// by role and lives through the loops doubles the states the verifier walks (measured:
/// past its budget).
#[inline(always)]
fn complete(v: &mut ShadowCopy, r: &Round) -> Outcome {
    if r.inner != 0 {
        v.state = ShadowState::PartialSent as u32;
        Outcome::Partial
    } else {
        v.state = ShadowState::Done as u32;
        Outcome::Complete
    }
}

/// Applies one contribution, its payload in `src`, to shadow copy `shadow` of `slot` with
/// fold `F` (a `Fold`); a completed or replayed round leaves the result in `src`.
///
/// # Safety
/// `slot` must point into the `SLOTS` map, and the caller must have checked that `src`
/// holds `r.words` words of payload.
#[inline(always)]
pub unsafe fn accept<const F: u32, W: Words>(
    slot: *mut Slot,
    shadow: usize,
    r: &Round,
    src: &W,
) -> (Outcome, Stored) {
    unsafe { helpers::bpf_spin_lock(&raw mut (*slot).lock) };
    let v = unsafe { &mut (*slot).shadow[shadow & 1] };
    let state = v.state;
    let same =
        state != ShadowState::Empty as u32 && v.message == r.message && v.segment == r.segment;
    let outcome = if same {
        if v.op != r.op || v.dtype != r.dtype || v.collective != r.collective || v.root != r.root {
            Outcome::OpMismatch
        } else if v.count != r.elems {
            Outcome::Mismatch
        } else if v.seen & r.bit != 0 {
            // A member giving up on a round not yet complete: kept, so that the round's
            // result fails the call on every member (`ENC_WITHDRAWN`).
            let withdrawn = r.flags & ENC_WITHDRAWN as u32;
            if F == Fold::Move as u32
                && state == ShadowState::Filling as u32
                && r.words != 0
                && v.seen & (1u64 << (r.root & 63)) != 0
            {
                // A gather's member asking for data it lost, the round still waiting for
                // another member: the data, pending.
                reduce::copy_out(v, src, r.words);
                Outcome::ReplayPending
            } else if state == ShadowState::Filling as u32 {
                v.flags |= withdrawn;
                Outcome::Duplicate
            } else {
                if state == ShadowState::PartialSent as u32 {
                    v.flags |= withdrawn;
                }
                // One copy for both answers: the verifier walks each loop once.
                reduce::copy_out(v, src, r.words);
                if state == ShadowState::Done as u32 {
                    Outcome::Replay
                } else {
                    Outcome::PartialAgain
                }
            }
        } else if v.seen | r.bit == r.members {
            reduce::fold::<F, W>(v, src, r, true);
            v.flags |= r.flags;
            v.seen |= r.bit;
            complete(v, r)
        } else {
            reduce::fold::<F, W>(v, src, r, false);
            v.flags |= r.flags;
            v.seen |= r.bit;
            Outcome::Added
        }
    } else if state != ShadowState::Empty as u32 && older(r.message, r.segment, v) {
        Outcome::Stale
    } else {
        // A round still open (filling, or waiting for its parent) was abandoned.
        let reclaim =
            state == ShadowState::Filling as u32 || state == ShadowState::PartialSent as u32;
        reduce::copy_in(v, src, r.words);
        claim(v, r);
        v.root = r.root;
        v.exponent = r.exponent;
        v.flags = r.flags;
        v.top = first_top(r);
        reduce::check_fits(v, r);
        v.seen = r.bit;
        if r.bit == r.members {
            complete(v, r)
        } else {
            v.state = ShadowState::Filling as u32;
            if reclaim {
                Outcome::Reclaimed
            } else {
                Outcome::Added
            }
        }
    };
    let stored = Stored::of(v);
    unsafe { helpers::bpf_spin_unlock(&raw mut (*slot).lock) };
    (outcome, stored)
}

/// Applies the parent's result, its payload in `src`, to shadow copy `shadow` of `slot`
/// at an inner level: stored over the partial if the copy sent that round's partial.
/// Its own program (`xagg_deliver`), apart from the folds: their loops fill the
/// verifier's budget.
///
/// # Safety
/// As for [`accept`].
#[inline(always)]
pub unsafe fn deliver<W: Words>(
    slot: *mut Slot,
    shadow: usize,
    r: &Round,
    src: &W,
) -> (Outcome, Stored) {
    unsafe { helpers::bpf_spin_lock(&raw mut (*slot).lock) };
    let v = unsafe { &mut (*slot).shadow[shadow & 1] };
    let gather = r.data != 0;
    let pending = r.pending != 0;
    let state = v.state;
    let same = state != ShadowState::Empty as u32
        && v.message == r.message
        && v.segment == r.segment
        && v.op == r.op
        && v.dtype == r.dtype
        && v.count == r.elems
        && v.collective == r.collective;
    // A gather's data sent pending from above: kept for this level's ranks whether this
    // level's round is still filling, waits for the completion, or has not started here
    // yet (its ranks behind the others: the copy holds an older round, all of whose
    // results went out, or nothing), which it starts, the root elsewhere. Never empty.
    let fresh = !same
        && (state == ShadowState::Empty as u32
            || (state == ShadowState::Done as u32 && !older(r.message, r.segment, v)));
    let keep =
        pending && gather && r.words != 0 && ((same && state != ShadowState::Done as u32) || fresh);
    // The parent's result: a gather's without its data completes the round here only if
    // the copy holds the data (its root's, or sent pending): else the ranks, still
    // waiting, ask again with room for it. A header-only one (a reduce-scatter's or
    // reduce's for a host none of whose ranks owns the segment) copies nothing.
    let result = !pending
        && same
        && state == ShadowState::PartialSent as u32
        && (!gather || r.words != 0 || v.flags & COPY_HAS_DATA != 0);
    let outcome = if keep || result {
        reduce::copy_in(v, src, r.words);
        if fresh {
            claim(v, r);
            v.root = ROOT_ELSEWHERE;
            v.seen = 0;
            v.flags = 0;
            v.state = ShadowState::Filling as u32;
        }
        if keep {
            v.flags |= COPY_HAS_DATA;
            Outcome::DeliveredPending
        } else {
            v.exponent = r.exponent;
            v.flags = r.flags;
            v.top = first_top(r);
            v.state = ShadowState::Done as u32;
            Outcome::Delivered
        }
    } else {
        Outcome::Unawaited
    };
    let stored = Stored::of(v);
    unsafe { helpers::bpf_spin_unlock(&raw mut (*slot).lock) };
    (outcome, stored)
}
