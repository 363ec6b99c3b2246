//! Results from peers: what finishes a request whose switch stopped answering, with the
//! switch's exact bits where any rank has them, without asking every rank to agree after
//! every call.
//!
//! **Why a rank can always answer.** Each rank keeps, per slot, the last result it took
//! there (a copy made when the request is delivered: at most slots × segment bytes). A
//! slot takes its next round only once its last result is in, and a round completes only
//! when every member contributed to it: so a later round's result on the slot proves that
//! every member had the earlier one, and nobody can still be asking for it. Results of
//! requests still in the engine are read in place; those of a request that failed are
//! copied aside while it is recovered.
//!
//! **None is a promise.** A rank asked for a result it does not hold answers "none" and
//! promises never to take that result from the switch: its own request for that message
//! ends ([`AllreduceError::Withdrawn`]) and is recovered from the peers in turn. So when
//! every peer answers "none" for a segment, no rank holds it nor ever will, no rank
//! returned that call, and every rank reaches the same verdict
//! ([`AllreduceError::Abandoned`]): the caller makes that call (and the job's later ones)
//! another way from its untouched input, in the same order on every rank.
//!
//! **The responder** is a thread with a TCP listener at the address the worker sends
//! from. Before answering, it takes in the results already queued on the worker's socket
//! if no other thread is inside the engine: a rank sitting in a call the library does not
//! wrap (an MPI receive, a computation) still hands over what the switch sent it. For the
//! same reason it makes the worker's requests progress whenever the caller's thread has
//! been away from the library for a few milliseconds with requests in flight: a rank that
//! started an allreduce and then blocks elsewhere (`MPI_Iallreduce; MPI_Recv; MPI_Wait`)
//! still sends its later rounds, and the others are not held up. Every
//! request and answer is authenticated with the job's secret (HMAC-SHA256): a stranger
//! can neither read results nor extract a promise.

use std::{
    collections::{HashSet, VecDeque},
    io::{self, Read, Write},
    net::{SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{
            AtomicBool,
            Ordering::{Relaxed, SeqCst},
        },
        Arc, Mutex, Weak,
    },
    time::{Duration, Instant},
};

use xagg_common::wire;
use xagg_join::{hmac, Secret};

use crate::{engine::WorkerInner, request::lock, AllreduceError, Layout, Reduction};

const MAGIC: &[u8; 4] = b"XAGP";
/// A question about a flat collective's segments ([`View::answer_flat`]).
const MAGIC_FLAT: &[u8; 4] = b"XAGF";
/// A question about this rank's call of a message: did it fail, and why ([`fate`]).
const MAGIC_FATE: &[u8; 4] = b"XAGW";
/// Segments asked for in one request (a request is read whole before it is answered).
const MAX_ASK: usize = 1 << 16;
/// Requests that failed, kept aside while they are recovered (the newest).
const PARKED: usize = 8;
/// Flat collectives remembered as finished from the peers (the newest).
const MAX_ABANDONED: usize = 64;
/// Failed calls remembered, with why, for the peers that wait for them (the newest).
const MAX_FAILED: usize = 64;
/// The longest reason a failed call's answer carries.
const MAX_REASON: usize = 2048;

/// What one rank holds of a message's segment, as it answers a peer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The result's bytes, and the flags the switch set in it.
    Result { flags: u16, bytes: Vec<u8> },
    /// A flat reduce-scatter's or reduce's segment this rank does not get: its own data
    /// for it, as the program gave it (not encoded).
    Contribution { bytes: Vec<u8> },
    /// Not held (an allreduce's: and promised never to be taken from the switch).
    None,
    /// A flat collective's message not started here yet: ask again.
    NotYet,
    /// Delivered and proven held by every member: nobody should be asking.
    Gone,
}

/// A request the engine runs: its output buffer, and which segments came.
struct Live {
    message: u32,
    ptr: usize,
    len: usize,
    segment_bytes: usize,
    have: Vec<bool>,
    flags: Vec<u16>,
    flat: Option<Flat>,
}

/// A flat collective's request (reduce-scatter, all-gather, broadcast, reduce through the
/// switch's own members): how its segments map, what it reduces, and where this rank's
/// own data is (the input, or the output in place).
#[derive(Clone, Copy)]
pub(crate) struct Flat {
    pub layout: Layout,
    pub r: Reduction,
    source: usize,
    source_len: usize,
}

impl Flat {
    pub fn new(layout: Layout, r: Reduction, source: &[u8]) -> Self {
        Self {
            layout,
            r,
            source: source.as_ptr() as usize,
            source_len: source.len(),
        }
    }
}

/// A failed request's results so far, copied aside while it is recovered.
struct Parked {
    message: u32,
    segment_bytes: usize,
    have: Vec<bool>,
    flags: Vec<u16>,
    bytes: Vec<u8>,
    /// A flat collective's layout and reduction, and a copy of this rank's own data.
    flat: Option<(Flat, Vec<u8>)>,
}

/// The last result delivered on a slot, or this rank's own data for a flat collective's
/// segment it did not get.
struct Kept {
    message: u32,
    segment: u32,
    flags: u16,
    contribution: bool,
    bytes: Vec<u8>,
}

/// What a failed flat collective holds: which segments came, their flags, its layout
/// and reduction, and this rank's own data.
pub(crate) struct ParkedFlat {
    pub have: Vec<bool>,
    pub flags: Vec<u16>,
    pub flat: Flat,
    pub source: Vec<u8>,
}

/// What the responder answers from: shared by the engine (which updates it as results
/// come) and the responder thread.
#[derive(Default)]
pub(crate) struct View {
    live: Vec<Live>,
    parked: VecDeque<Parked>,
    kept: Vec<Option<Kept>>,
    promised: HashSet<(u32, u32)>,
    /// Flat collectives a peer is finishing from the peers (the first segment it asked
    /// for): it sends that message's later rounds to nobody, so this rank's request for
    /// it, which would wait at the switch for them, is finished from the peers as well.
    abandoned: VecDeque<(u32, u32)>,
    /// The engine's next message id: ids from it on are not yet started here.
    next_message: Option<u32>,
    /// Calls that failed here and are not finished another way (the peers cannot finish
    /// them): this rank sends their rounds nothing more, and a peer the switch keeps
    /// waiting for it is told why.
    failed: VecDeque<(u32, String)>,
    /// Why this rank makes its next call another way (or no more calls), while it does:
    /// a peer the switch keeps waiting for a message not started here is told so.
    pub(crate) elsewhere: Option<String>,
}

fn range(segment_bytes: usize, len: usize, segment: usize) -> std::ops::Range<usize> {
    let lo = segment * segment_bytes;
    lo..(lo + segment_bytes).min(len)
}

impl View {
    /// A request started as `message` over `len` bytes at `ptr`: a segment a peer was
    /// already promised it lacks, if any (it must then be recovered, not waited for).
    pub fn start(
        &mut self,
        message: u32,
        ptr: *const u8,
        len: usize,
        segment_bytes: usize,
        next: u32,
    ) -> Option<u32> {
        let segments = len.div_ceil(segment_bytes);
        self.next_message = Some(next);
        self.live.push(Live {
            message,
            ptr: ptr as usize,
            len,
            segment_bytes,
            have: vec![false; segments],
            flags: vec![0; segments],
            flat: None,
        });
        self.withdrawn(message)
    }

    /// A flat collective started as `message` with `output`: nothing is promised for
    /// it (every rank's contribution to it exists in the end), so nothing is withdrawn.
    pub fn start_flat(&mut self, message: u32, output: &[u8], flat: Flat, next: u32) {
        let segments = flat.layout.segments();
        self.next_message = Some(next);
        self.live.push(Live {
            message,
            ptr: output.as_ptr() as usize,
            len: output.len(),
            segment_bytes: flat.layout.segment_bytes,
            have: vec![false; segments],
            flags: vec![0; segments],
            flat: Some(flat),
        });
    }

    /// A result came for `message`'s `segment` (already in the output buffer): false if
    /// a peer was promised it would not be taken.
    pub fn took(&mut self, message: u32, segment: usize, flags: u16) -> bool {
        if self.promised.contains(&(message, segment as u32)) {
            return false;
        }
        if let Some(l) = self.live.iter_mut().find(|l| l.message == message) {
            // A flat collective's completion without data for this rank holds nothing.
            if l.flat
                .is_none_or(|f| f.layout.destination(segment).is_some())
            {
                l.have[segment] = true;
                l.flags[segment] = flags;
            }
        }
        true
    }

    /// A segment of `message` a peer was promised this rank lacks, or that a peer
    /// finishing the flat collective `message` from the peers asked for, if any.
    pub fn withdrawn(&self, message: u32) -> Option<u32> {
        self.promised
            .iter()
            .chain(self.abandoned.iter())
            .find(|&&(m, _)| m == message)
            .map(|&(_, s)| s)
    }

    /// A peer asked for `segment` of the flat collective `message`: it finishes it from
    /// the peers ([`View::withdrawn`]).
    fn abandon(&mut self, message: u32, segment: u32) {
        if self.abandoned.iter().any(|&(m, _)| m == message) {
            return;
        }
        if self.abandoned.len() == MAX_ABANDONED {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back((message, segment));
    }

    /// The request of `message` is delivered, out of `buffer`: a complete one leaves its
    /// last result on each of its slots (of `slots`); any other is copied aside.
    ///
    /// A flat collective's (`source`: this rank's own data) keeps, per slot, the result
    /// this rank got there or else its own data for the round: a round whose result
    /// went to another member ends here on its completion, and the owner may still lack
    /// it — until a later round on the slot completes, which needs the owner's next
    /// contribution there, sent only once it had this result.
    pub fn finish(
        &mut self,
        message: u32,
        buffer: &[u8],
        source: &[u8],
        complete: bool,
        slots: usize,
    ) {
        let Some(at) = self.live.iter().position(|l| l.message == message) else {
            return;
        };
        let l = self.live.swap_remove(at);
        let segments = l.have.len();
        let held = |s: usize| -> Option<std::ops::Range<usize>> {
            match l.flat {
                Some(f) => f.layout.destination(s),
                None => Some(range(l.segment_bytes, l.len, s)),
            }
        };
        let all = (0..segments).all(|s| l.have[s] || held(s).is_none());
        if complete && all {
            if self.kept.len() < slots {
                self.kept.resize_with(slots, || None);
            }
            for segment in segments.saturating_sub(slots)..segments {
                let slot = (message as usize + segment) % slots;
                let (bytes, contribution) = match (held(segment), l.flat) {
                    (Some(r), _) => (&buffer[r], false),
                    (None, Some(f)) => match f.layout.source(segment) {
                        Some(r) => (&source[r], !f.layout.collective.gathers()),
                        None => {
                            self.kept[slot] = None;
                            continue;
                        }
                    },
                    (None, None) => unreachable!("an allreduce holds every segment"),
                };
                let k = self.kept[slot].get_or_insert_with(|| Kept {
                    message,
                    segment: segment as u32,
                    flags: 0,
                    contribution,
                    bytes: Vec::with_capacity(l.segment_bytes),
                });
                k.message = message;
                k.segment = segment as u32;
                k.flags = l.flags[segment];
                k.contribution = contribution;
                k.bytes.clear();
                k.bytes.extend_from_slice(bytes);
            }
            return;
        }
        let mut bytes = vec![0; l.len];
        for (s, _) in l.have.iter().enumerate().filter(|(_, &h)| h) {
            if let Some(r) = held(s) {
                bytes[r.clone()].copy_from_slice(&buffer[r]);
            }
        }
        if self.parked.len() == PARKED {
            self.parked.pop_front();
        }
        self.parked.push_back(Parked {
            message,
            segment_bytes: l.segment_bytes,
            have: l.have,
            flags: l.flags,
            bytes,
            flat: l.flat.map(|f| (f, source.to_vec())),
        });
    }

    /// What this rank holds of `message`'s `segment`; "none" is a promise, kept here.
    pub fn answer(&mut self, message: u32, segment: u32) -> Answer {
        let s = segment as usize;
        if let Some(l) = self.live.iter().find(|l| l.message == message) {
            if l.flat.is_some() {
                return Answer::Gone;
            }
            if l.have.get(s) == Some(&true) {
                let r = range(l.segment_bytes, l.len, s);
                // Safety: a live request's output buffer stays valid until the engine
                // delivers it, which removes it from the view under this lock first; a
                // segment marked held is written already and not written again.
                let bytes = unsafe {
                    std::slice::from_raw_parts((l.ptr as *const u8).add(r.start), r.len())
                };
                return Answer::Result {
                    flags: l.flags[s],
                    bytes: bytes.to_vec(),
                };
            }
        } else if let Some(p) = self.parked.iter().find(|p| p.message == message) {
            if p.flat.is_some() {
                return Answer::Gone;
            }
            if p.have.get(s) == Some(&true) {
                let r = range(p.segment_bytes, p.bytes.len(), s);
                return Answer::Result {
                    flags: p.flags[s],
                    bytes: p.bytes[r].to_vec(),
                };
            }
        } else if let Some(k) = self
            .kept
            .iter()
            .flatten()
            .find(|k| k.message == message && k.segment == segment)
        {
            if k.contribution {
                return Answer::Gone;
            }
            return Answer::Result {
                flags: k.flags,
                bytes: k.bytes.clone(),
            };
        } else if !self.future(message) {
            return Answer::Gone;
        }
        self.promised.insert((message, segment));
        Answer::None
    }

    /// What this rank holds of a flat collective's `segment` of `message`: the result if
    /// it got it, else its own data for it (a gather's root's data is the result), else
    /// nothing; "not yet" for a message not started here. Nothing is promised: every
    /// rank's contribution exists in the end, and a rank that gets its result from the
    /// switch after all gets the same.
    pub fn answer_flat(&self, message: u32, segment: u32) -> Answer {
        let s = segment as usize;
        let own = |f: &Flat, bytes: &[u8]| -> Answer {
            match f.layout.source(s) {
                Some(r) if f.layout.collective.gathers() => Answer::Result {
                    flags: 0,
                    bytes: bytes[r].to_vec(),
                },
                Some(r) => Answer::Contribution {
                    bytes: bytes[r].to_vec(),
                },
                None => Answer::None,
            }
        };
        if let Some(l) = self.live.iter().find(|l| l.message == message) {
            let Some(f) = l.flat.filter(|f| s < f.layout.segments()) else {
                return Answer::Gone;
            };
            if l.have[s] {
                let r = f.layout.destination(s).expect("held: a destination");
                // Safety: as in `answer`: the output stays valid while the request is
                // live, and a held segment is not written again.
                let bytes = unsafe {
                    std::slice::from_raw_parts((l.ptr as *const u8).add(r.start), r.len())
                };
                return Answer::Result {
                    flags: l.flags[s],
                    bytes: bytes.to_vec(),
                };
            }
            // Safety: the request's own data, valid while it is live (the caller's
            // buffer, not written by the request but where its own results go, which
            // are the segments held above).
            let source = unsafe { std::slice::from_raw_parts(f.source as *const u8, f.source_len) };
            return own(&f, source);
        }
        if let Some(p) = self.parked.iter().find(|p| p.message == message) {
            let Some((f, source)) = p.flat.as_ref().filter(|(f, _)| s < f.layout.segments()) else {
                return Answer::Gone;
            };
            if p.have[s] {
                let r = f.layout.destination(s).expect("held: a destination");
                return Answer::Result {
                    flags: p.flags[s],
                    bytes: p.bytes[r].to_vec(),
                };
            }
            return own(f, source);
        }
        if let Some(k) = self
            .kept
            .iter()
            .flatten()
            .find(|k| k.message == message && k.segment == segment)
        {
            return if k.contribution {
                Answer::Contribution {
                    bytes: k.bytes.clone(),
                }
            } else {
                Answer::Result {
                    flags: k.flags,
                    bytes: k.bytes.clone(),
                }
            };
        }
        if self.future(message) {
            Answer::NotYet
        } else {
            Answer::Gone
        }
    }

    /// This rank's call of `message` failed for good (`why`): its rounds get nothing
    /// more from here.
    pub fn fail(&mut self, message: u32, why: &str) {
        if self.failed.len() == MAX_FAILED {
            self.failed.pop_front();
        }
        let mut end = why.len().min(MAX_REASON);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        self.failed.push_back((message, why[..end].to_string()));
    }

    /// Why this rank's call of `message` failed for good, if it did — or, a message not
    /// started here, why this rank is making its call another way.
    fn failure(&self, message: u32) -> Option<String> {
        self.failed
            .iter()
            .rev()
            .find(|(m, _)| *m == message)
            .map(|(_, why)| why.clone())
            .or_else(|| self.elsewhere.clone().filter(|_| self.future(message)))
    }

    /// A failed flat collective's state, for its recovery.
    pub fn parked_flat(&self, message: u32) -> Option<ParkedFlat> {
        let p = self.parked.iter().find(|p| p.message == message)?;
        let (flat, source) = p.flat.as_ref()?;
        Some(ParkedFlat {
            have: p.have.clone(),
            flags: p.flags.clone(),
            flat: *flat,
            source: source.clone(),
        })
    }

    /// Whether `message` has not started here yet (ids wrap: within half the space
    /// ahead of the next one).
    fn future(&self, message: u32) -> bool {
        self.next_message
            .is_none_or(|next| message.wrapping_sub(next) < 1 << 31)
    }

    /// A parked request's results so far: which segments came, their flags, and the
    /// buffer bytes of a full segment.
    pub fn parked(&self, message: u32) -> Option<(Vec<bool>, Vec<u16>, usize)> {
        self.parked
            .iter()
            .find(|p| p.message == message)
            .map(|p| (p.have.clone(), p.flags.clone(), p.segment_bytes))
    }

    /// A parked request's segment came from a peer: held now, to answer others.
    fn recovered(&mut self, message: u32, segment: usize, flags: u16, bytes: &[u8]) {
        if let Some(p) = self.parked.iter_mut().find(|p| p.message == message) {
            let r = match &p.flat {
                Some((f, _)) => match f.layout.destination(segment) {
                    Some(r) => r,
                    None => return,
                },
                None => range(p.segment_bytes, p.bytes.len(), segment),
            };
            if r.len() == bytes.len() {
                p.bytes[r].copy_from_slice(bytes);
                p.have[segment] = true;
                p.flags[segment] = flags;
            }
        }
    }
}

/// A worker's peers: the other ranks' responders and the job's secret.
pub(crate) struct Peers {
    pub view: Arc<Mutex<View>>,
    key: [u8; 32],
    job: u32,
    rank: usize,
    addresses: Vec<SocketAddrV4>,
}

impl Peers {
    /// Asks the peers, in rank order, for the segments `missing` of `message` until each
    /// is found; writes each into `out` (by `segment_bytes`) and its flags into `flags`.
    /// Returns the segments no peer holds. Gives up when a peer cannot be reached
    /// within `patience`.
    pub fn recover(
        &self,
        message: u32,
        mut missing: Vec<u32>,
        out: &mut [u8],
        segment_bytes: usize,
        flags: &mut [u16],
        patience: Duration,
    ) -> Result<Vec<u32>, AllreduceError> {
        for (rank, &at) in self.addresses.iter().enumerate() {
            if rank == self.rank || missing.is_empty() {
                continue;
            }
            let answers = self
                .ask(at, message, &missing, false, patience)
                .map_err(|e| {
                    AllreduceError::Invalid(format!(
                        "job {}: recovering message {message} from rank {rank} at {at}: {e}",
                        self.job
                    ))
                })?;
            let mut still = Vec::new();
            for (&segment, answer) in missing.iter().zip(answers) {
                let s = segment as usize;
                let r = range(segment_bytes, out.len(), s);
                match answer {
                    Answer::Result { flags: f, bytes } if bytes.len() == r.len() => {
                        out[r].copy_from_slice(&bytes);
                        flags[s] = f;
                        lock(&self.view).recovered(message, s, f, &bytes);
                    }
                    Answer::Result { bytes, .. } => {
                        return Err(AllreduceError::Invalid(format!(
                            "job {}: rank {rank} answered {} bytes for segment {segment} of message {message}, which has {}",
                            self.job,
                            bytes.len(),
                            r.len()
                        )))
                    }
                    Answer::None => still.push(segment),
                    Answer::Gone | Answer::Contribution { .. } | Answer::NotYet => {
                        return Err(AllreduceError::Invalid(format!(
                            "job {}: rank {rank} no longer holds segment {segment} of message {message}, which every rank took: the ranks' calls are out of order",
                            self.job
                        )))
                    }
                }
            }
            missing = still;
        }
        Ok(missing)
    }

    /// Finishes a flat collective's `missing` segments of `message` (the ones this rank
    /// gets) from the peers: a segment's result from any rank that got it (a gather's
    /// from its root's own data), or else every other rank's contribution to it, folded
    /// here with this rank's own (`flat`'s reduction, as the switch folds) — asking again
    /// the ranks that have not started the message, until `wait` runs out. Writes each
    /// into `out` (this rank's output) and its flags into `flags`. Gives up when a peer
    /// cannot be reached within `patience`.
    #[allow(clippy::too_many_arguments)]
    pub fn recover_flat(
        &self,
        message: u32,
        missing: Vec<u32>,
        (flat, source): (Flat, &[u8]),
        ranks: usize,
        out: &mut [u8],
        flags: &mut [u16],
        (patience, wait): (Duration, Duration),
    ) -> Result<(), AllreduceError> {
        let layout = flat.layout;
        let n = self.addresses.len();
        let job = self.job;
        let invalid = |rank: usize, what: String| {
            AllreduceError::Invalid(format!(
                "job {job}: recovering message {message} from rank {rank}: {what}"
            ))
        };
        // Per missing segment, what each rank answered so far (None: ask again).
        let mut pending: Vec<(u32, Vec<Option<Vec<u8>>>)> =
            missing.into_iter().map(|s| (s, vec![None; n])).collect();
        let until = Instant::now() + wait;
        let mut told = vec![false; n];
        loop {
            for (rank, &at) in self.addresses.iter().enumerate() {
                if rank == self.rank {
                    continue;
                }
                let ask: Vec<u32> = pending
                    .iter()
                    .filter(|(_, got)| got[rank].is_none())
                    .map(|&(s, _)| s)
                    .collect();
                // Every peer is asked once, even with nothing left to ask: it learns that
                // this rank sends the message's later rounds to nobody.
                if ask.is_empty() && told[rank] {
                    continue;
                }
                told[rank] = true;
                let answers = self
                    .ask(at, message, &ask, true, patience)
                    .map_err(|e| invalid(rank, format!("at {at}: {e}")))?;
                for (&segment, answer) in ask.iter().zip(answers) {
                    let s = segment as usize;
                    let Some(dest) = layout.destination(s) else {
                        continue;
                    };
                    let at = pending
                        .iter()
                        .position(|&(p, _)| p == segment)
                        .expect("asked: pending");
                    match answer {
                        Answer::Result { flags: f, bytes } if bytes.len() == dest.len() => {
                            out[dest].copy_from_slice(&bytes);
                            flags[s] = f;
                            lock(&self.view).recovered(message, s, f, &bytes);
                            pending.swap_remove(at);
                        }
                        Answer::Contribution { bytes } if bytes.len() == dest.len() => {
                            pending[at].1[rank] = Some(bytes);
                        }
                        Answer::Result { bytes, .. } | Answer::Contribution { bytes } => {
                            return Err(invalid(
                                rank,
                                format!(
                                    "{} bytes for segment {segment}, which has {}",
                                    bytes.len(),
                                    dest.len()
                                ),
                            ))
                        }
                        // A gather's member without the data: its root has it.
                        Answer::None => pending[at].1[rank] = Some(Vec::new()),
                        Answer::NotYet => {}
                        Answer::Gone => {
                            return Err(invalid(
                                rank,
                                format!("it no longer holds segment {segment}, which every rank took: the ranks' calls are out of order"),
                            ))
                        }
                    }
                }
            }
            // The segments every other rank contributed to, folded here.
            let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut pending)
                .into_iter()
                .partition(|(_, got)| {
                    !layout.collective.gathers()
                        && got
                            .iter()
                            .enumerate()
                            .all(|(rank, g)| rank == self.rank || g.is_some())
                });
            pending = rest;
            for (segment, got) in ready {
                let s = segment as usize;
                let own = layout.source(s).expect("a reduction's member contributes");
                let inputs: Vec<&[u8]> = got
                    .iter()
                    .enumerate()
                    .map(|(rank, g)| match g {
                        _ if rank == self.rank => &source[own.clone()],
                        Some(b) => &b[..],
                        None => unreachable!("every other rank answered"),
                    })
                    .collect();
                let folded = crate::fold::fold(flat.r, ranks, &inputs);
                let dest = layout.destination(s).expect("missing: a destination");
                let r = flat.r;
                if folded.flags & (wire::ENC_NONFINITE | wire::ENC_OVERFLOW) != 0 {
                    crate::codec::fill_nan(r.dtype, &mut out[dest.clone()]);
                } else {
                    crate::codec::decode(
                        (r.op, r.dtype, r.float),
                        ranks as u32,
                        &folded.lanes,
                        folded.exponent,
                        &mut out[dest.clone()],
                    );
                }
                flags[s] = folded.flags;
                let bytes = out[dest].to_vec();
                lock(&self.view).recovered(message, s, folded.flags, &bytes);
            }
            if pending.is_empty() && told.iter().enumerate().all(|(r, &t)| t || r == self.rank) {
                return Ok(());
            }
            if pending.is_empty() {
                continue;
            }
            if Instant::now() >= until {
                let mut segments: Vec<u32> = pending.iter().map(|&(s, _)| s).collect();
                segments.sort();
                return Err(AllreduceError::Invalid(format!(
                    "job {job}: segments {segments:?} of message {message} could not be finished from the peers within the collective timeout ({wait:?}): a rank never made the call"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One question to one peer (about a flat collective's segments with `flat`),
    /// retried until `patience` runs out.
    fn ask(
        &self,
        at: SocketAddrV4,
        message: u32,
        segments: &[u32],
        flat: bool,
        patience: Duration,
    ) -> io::Result<Vec<Answer>> {
        let until = Instant::now() + patience;
        loop {
            match self.ask_once(at, message, segments, flat) {
                Ok(a) => return Ok(a),
                Err(e) if Instant::now() >= until => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn ask_once(
        &self,
        at: SocketAddrV4,
        message: u32,
        segments: &[u32],
        flat: bool,
    ) -> io::Result<Vec<Answer>> {
        let magic = if flat { MAGIC_FLAT } else { MAGIC };
        let (mut s, nonce) = put(
            at,
            &self.key,
            (magic, self.job, message, segments),
            (Duration::from_secs(2), Duration::from_secs(10)),
        )?;
        let mut answers = Vec::with_capacity(segments.len());
        let mut mac_input = Vec::new();
        for _ in segments {
            // Kind (1 result, 0 none, 2 gone, 3 contribution, 4 not yet), flags, length.
            let mut head = [0u8; 7];
            s.read_exact(&mut head)?;
            mac_input.extend_from_slice(&head);
            let len = u32::from_le_bytes(head[3..7].try_into().expect("4 bytes")) as usize;
            let mut bytes = || -> io::Result<Vec<u8>> {
                if len > 1 << 20 {
                    return Err(io::Error::other("an answer longer than any segment"));
                }
                let mut bytes = vec![0; len];
                s.read_exact(&mut bytes)?;
                mac_input.extend_from_slice(&bytes);
                Ok(bytes)
            };
            answers.push(match head[0] {
                1 => Answer::Result {
                    flags: u16::from_le_bytes([head[1], head[2]]),
                    bytes: bytes()?,
                },
                3 => Answer::Contribution { bytes: bytes()? },
                0 => Answer::None,
                2 => Answer::Gone,
                4 => Answer::NotYet,
                k => return Err(io::Error::other(format!("answer kind {k}"))),
            });
        }
        let mut tag = [0u8; 32];
        s.read_exact(&mut tag)?;
        let want = hmac(&self.key, &[b"peer answer", &nonce, &mac_input]);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&tag[..], &want[..])) {
            return Err(io::Error::other(
                "the answer's authentication failed: not this job's rank",
            ));
        }
        Ok(answers)
    }
}

/// Connects to the responder at `at` within `connect` and puts a question to it (`magic`,
/// `job`, `message`, `segments`), authenticated with `key`; answers are awaited up to
/// `read`. Returns the connection and the question's nonce, which the answer's tag covers.
fn put(
    at: SocketAddrV4,
    key: &[u8; 32],
    (magic, job, message, segments): (&[u8; 4], u32, u32, &[u32]),
    (connect, read): (Duration, Duration),
) -> io::Result<(TcpStream, [u8; 16])> {
    let mut s = TcpStream::connect_timeout(&at.into(), connect)?;
    s.set_read_timeout(Some(read))?;
    s.set_nodelay(true)?;
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
    let mut q = Vec::with_capacity(32 + 4 * segments.len() + 32);
    q.extend_from_slice(magic);
    q.extend_from_slice(&job.to_le_bytes());
    q.extend_from_slice(&message.to_le_bytes());
    q.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    q.extend_from_slice(&nonce);
    for seg in segments {
        q.extend_from_slice(&seg.to_le_bytes());
    }
    let tag = hmac(key, &[b"peer question", &q]);
    q.extend_from_slice(&tag);
    s.write_all(&q)?;
    Ok((s, nonce))
}

/// Asks the responder at `at` (job `job`'s rank, `key` its secret) whether its rank's call
/// of `message` failed for good: `Some(why)` if it did, `None` if not (or not yet), within
/// `patience` (connecting, answering). A connection refused is an error of kind
/// `ConnectionRefused`: its process is gone.
pub(crate) fn fate(
    at: SocketAddrV4,
    key: &[u8; 32],
    job: u32,
    message: u32,
    patience: (Duration, Duration),
) -> io::Result<Option<String>> {
    let (mut s, nonce) = put(at, key, (MAGIC_FATE, job, message, &[]), patience)?;
    // Kind (0 not failed, 1 failed), the reason's length, the reason.
    let mut head = [0u8; 5];
    s.read_exact(&mut head)?;
    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    if len > MAX_REASON {
        return Err(io::Error::other("a reason longer than any"));
    }
    let mut why = vec![0; len];
    s.read_exact(&mut why)?;
    let mut tag = [0u8; 32];
    s.read_exact(&mut tag)?;
    let mut got = head.to_vec();
    got.extend_from_slice(&why);
    let want = hmac(key, &[b"peer answer", &nonce, &got]);
    if !bool::from(subtle::ConstantTimeEq::ct_eq(&tag[..], &want[..])) {
        return Err(io::Error::other(
            "the answer's authentication failed: not this job's rank",
        ));
    }
    match head[0] {
        0 => Ok(None),
        1 => Ok(Some(String::from_utf8_lossy(&why).into_owned())),
        k => Err(io::Error::other(format!("answer kind {k}"))),
    }
}

/// Starts the responder of `worker` (a thread, until the worker is dropped), listening
/// at `ip`; returns its address for the peers, and the peers' state to complete with
/// their addresses.
pub(crate) fn serve(
    worker: &Arc<WorkerInner>,
    ip: std::net::Ipv4Addr,
    secret: &Secret,
    view: Arc<Mutex<View>>,
) -> io::Result<(SocketAddrV4, PeersSetup)> {
    let listener = TcpListener::bind((ip, 0))?;
    listener.set_nonblocking(true)?;
    let at = match listener.local_addr()? {
        std::net::SocketAddr::V4(a) => a,
        a => return Err(io::Error::other(format!("{a}: not IPv4"))),
    };
    let key = secret.0;
    let job = worker.p.job;
    let (wake, woken) = std::os::unix::net::UnixDatagram::pair()?;
    wake.set_nonblocking(true)?;
    woken.set_nonblocking(true)?;
    let handoff = Arc::new(Handoff {
        wake,
        woken,
        dropping: AtomicBool::new(false),
        holds: AtomicBool::new(false),
    });
    let _ = worker.responder.set(handoff.clone());
    let weak = Arc::downgrade(worker);
    let v = view.clone();
    std::thread::Builder::new()
        .name("xagg-peers".into())
        .spawn(move || respond(listener, handoff, weak, v, key, job))?;
    Ok((at, PeersSetup { view, key, job }))
}

/// What [`serve`] made, waiting for the peers' addresses.
pub(crate) struct PeersSetup {
    view: Arc<Mutex<View>>,
    key: [u8; 32],
    job: u32,
}

impl PeersSetup {
    /// The job's secret, which authenticates every question and answer.
    pub fn key(&self) -> [u8; 32] {
        self.key
    }

    pub fn with(self, rank: usize, addresses: Vec<SocketAddrV4>) -> Peers {
        Peers {
            view: self.view,
            key: self.key,
            job: self.job,
            rank,
            addresses,
        }
    }
}

/// How long the caller's thread may be away from the library, with requests in flight,
/// before the responder makes them progress itself.
const AWAY: Duration = Duration::from_millis(5);

/// How the responder lets go of its worker when the program drops its last handle. The
/// responder holds the worker while it polls the worker's sockets (the caller away), and
/// a poll keeps the sockets open until it ends: a program that dropped its worker and
/// bound a new one to the same address at once would find it taken. So the drop wakes
/// the responder, waits for it to let go, and keeps it off until the worker is gone.
pub(crate) struct Handoff {
    wake: std::os::unix::net::UnixDatagram,
    woken: std::os::unix::net::UnixDatagram,
    /// The program is dropping its last handle: the responder takes no new hold.
    dropping: AtomicBool,
    /// The responder holds the worker.
    holds: AtomicBool,
}

impl Handoff {
    /// The program's side: `drop` (the last handle's) once the responder let go of the
    /// worker (waiting 50 ms at most: it may be answering a peer).
    pub(crate) fn let_go(&self, drop: impl FnOnce()) {
        // Sequentially consistent with `hold`: either this sees the responder's hold and
        // waits for its end, or the responder sees `dropping` and takes none.
        self.dropping.store(true, SeqCst);
        let _ = self.wake.send(&[0]);
        let until = std::time::Instant::now() + Duration::from_millis(50);
        while self.holds.load(SeqCst) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_micros(20));
        }
        drop();
        self.dropping.store(false, SeqCst);
    }

    /// The responder's side: the worker, held until the [`Held`] is dropped.
    fn hold(&self, worker: &Weak<WorkerInner>) -> Turn<'_> {
        self.holds.store(true, SeqCst);
        if self.dropping.load(SeqCst) {
            self.holds.store(false, SeqCst);
            return Turn::Dropping;
        }
        match worker.upgrade() {
            Some(w) => Turn::Held(Held {
                w: Some(w),
                handoff: self,
            }),
            None => {
                self.holds.store(false, SeqCst);
                Turn::Gone
            }
        }
    }

    /// Takes every wake-up the program sent.
    fn take_wakes(&self) {
        while matches!(self.woken.recv(&mut [0u8; 8]), Ok(n) if n > 0) {}
    }
}

enum Turn<'a> {
    Held(Held<'a>),
    /// The program is dropping the worker.
    Dropping,
    /// The worker is gone.
    Gone,
}

/// The responder's hold of its worker.
struct Held<'a> {
    w: Option<Arc<WorkerInner>>,
    handoff: &'a Handoff,
}

impl std::ops::Deref for Held<'_> {
    type Target = WorkerInner;
    fn deref(&self) -> &WorkerInner {
        self.w.as_ref().expect("held")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // The worker first: the program's drop, waiting for the flag, may close it next.
        self.w = None;
        self.handoff.holds.store(false, SeqCst);
    }
}

fn respond(
    listener: TcpListener,
    handoff: Arc<Handoff>,
    worker: Weak<WorkerInner>,
    view: Arc<Mutex<View>>,
    key: [u8; 32],
    job: u32,
) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    let wait_for = |fds: &[i32], wait: Duration| {
        // Safety: the listener, the wake-up socket and the worker's sockets (held by the
        // caller) outlive the poll.
        let mut polled: Vec<PollFd> = fds
            .iter()
            .map(|&fd| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, PollFlags::POLLIN))
            .collect();
        let _ = poll(&mut polled, PollTimeout::from(wait.as_millis() as u16));
    };
    let ours = [listener.as_raw_fd(), handoff.woken.as_raw_fd()];
    loop {
        let w = match handoff.hold(&worker) {
            Turn::Held(w) => w,
            Turn::Gone => return,
            Turn::Dropping => {
                wait_for(&ours, Duration::from_millis(1));
                handoff.take_wakes();
                continue;
            }
        };
        while let Ok((s, _)) = listener.accept() {
            // A peer that stalls mid-question holds this rank's answers up only so long.
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = answer(s, &w, &view, &key, job);
        }
        // The caller away (in a call the library does not wrap, or computing) with
        // requests in flight: this thread takes their results in and sends their next
        // rounds as they come, so that the other ranks are not held up. While the caller
        // is in the library it does that itself, and this thread only listens.
        let active = w.active.load(Relaxed) > 0;
        let away = active
            && crate::engine::now_ns().saturating_sub(w.last_step.load(Relaxed))
                > AWAY.as_nanos() as u64;
        if away {
            w.progress_as(Duration::ZERO, false);
        }
        let wait = if active {
            AWAY
        } else {
            Duration::from_millis(200)
        };
        // Polling the worker's sockets holds it (a program dropping it wakes this thread
        // and waits for it to let go: `Handoff`); polling only the listener does not.
        if away {
            let fds: Vec<i32> = ours.iter().chain(&w.fds).copied().collect();
            wait_for(&fds, wait);
            drop(w);
        } else {
            drop(w);
            wait_for(&ours, wait);
        }
        // A wake-up is seen by the next turn's hold (`Dropping`, or the worker gone).
        handoff.take_wakes();
    }
}

/// Reads one question, takes in what the worker's socket holds, and answers it.
fn answer(
    mut s: TcpStream,
    w: &WorkerInner,
    view: &Mutex<View>,
    key: &[u8; 32],
    job: u32,
) -> io::Result<()> {
    // Magic, job, message, count, nonce; then the segments and the tag.
    let mut head = [0u8; 32];
    s.read_exact(&mut head)?;
    let count = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes")) as usize;
    let flat = &head[..4] == MAGIC_FLAT;
    let fate = &head[..4] == MAGIC_FATE;
    if (&head[..4] != MAGIC && !flat && !fate)
        || u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) != job
        || count > MAX_ASK
        || (fate && count != 0)
    {
        return Err(io::Error::other("not a question of this job"));
    }
    let message = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    let mut rest = vec![0u8; 4 * count + 32];
    s.read_exact(&mut rest)?;
    let (body, tag) = rest.split_at(4 * count);
    let mut q = head.to_vec();
    q.extend_from_slice(body);
    let want = hmac(key, &[b"peer question", &q]);
    if !bool::from(subtle::ConstantTimeEq::ct_eq(tag, &want[..])) {
        return Err(io::Error::other("the question's authentication failed"));
    }
    if fate {
        let why = lock(view).failure(message);
        let mut out = vec![u8::from(why.is_some())];
        let why = why.unwrap_or_default();
        out.extend_from_slice(&(why.len() as u32).to_le_bytes());
        out.extend_from_slice(why.as_bytes());
        let tag = hmac(key, &[b"peer answer", &head[16..32], &out]);
        s.write_all(&out)?;
        return s.write_all(&tag);
    }
    // Results already on the socket count: take them in unless a thread of this rank
    // is in the engine (it takes them itself).
    for _ in 0..4 {
        if !w.progress_as(Duration::ZERO, false) {
            break;
        }
    }
    let mut out = Vec::new();
    {
        let mut v = lock(view);
        if flat {
            let first = body
                .get(..4)
                .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            v.abandon(message, first);
        }
        for seg in body.chunks_exact(4) {
            let segment = u32::from_le_bytes(seg.try_into().expect("4 bytes"));
            let a = if flat {
                v.answer_flat(message, segment)
            } else {
                v.answer(message, segment)
            };
            let (kind, flags, bytes) = match a {
                Answer::Result { flags, bytes } => (1, flags, bytes),
                Answer::Contribution { bytes } => (3, 0, bytes),
                Answer::None => (0, 0, Vec::new()),
                Answer::Gone => (2, 0, Vec::new()),
                Answer::NotYet => (4, 0, Vec::new()),
            };
            out.push(kind);
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
    }
    let tag = hmac(key, &[b"peer answer", &head[16..32], &out]);
    s.write_all(&out)?;
    s.write_all(&tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_a_promise_and_kept_results_answer_until_superseded() {
        let mut v = View::default();
        // Message 5 over 3 segments of 4 bytes: segment 0 came, segment 1 did not.
        let out5 = [1u8, 1, 1, 1, 2, 2, 2, 2, 3, 3];
        assert_eq!(v.start(5, out5.as_ptr(), out5.len(), 4, 6), None);
        assert!(v.took(5, 0, 0));
        assert_eq!(
            v.answer(5, 0),
            Answer::Result {
                flags: 0,
                bytes: vec![1, 1, 1, 1]
            }
        );
        // Asked for what it lacks: none, and never taken from the switch after.
        assert_eq!(v.answer(5, 1), Answer::None);
        assert!(!v.took(5, 1, 0));
        assert_eq!(v.withdrawn(5), Some(1));
        v.finish(5, &out5, &[], false, 2);
        assert_eq!(v.parked(5).map(|p| p.0), Some(vec![true, false, false]));

        // Message 6 complete over 2 slots: its last result on each slot is kept; the
        // first segment's slot took a later round, so nobody can still ask for it.
        let out6 = [7u8; 10];
        assert_eq!(v.start(6, out6.as_ptr(), out6.len(), 4, 7), None);
        for s in 0..3 {
            assert!(v.took(6, s, 0));
        }
        v.finish(6, &out6, &[], true, 2);
        assert_eq!(
            v.answer(6, 2),
            Answer::Result {
                flags: 0,
                bytes: vec![7, 7]
            }
        );
        assert_eq!(v.answer(6, 0), Answer::Gone);

        // A message not started here yet: none, and its request is recovered when it comes.
        assert_eq!(v.answer(9, 3), Answer::None);
        let out9 = [0u8; 16];
        assert_eq!(v.start(9, out9.as_ptr(), out9.len(), 4, 10), Some(3));

        // A call failed for good: why, for the peers; a long reason cut on a character.
        v.fail(9, "refused");
        assert_eq!(v.failure(9).as_deref(), Some("refused"));
        assert_eq!(v.failure(6), None);
        v.fail(10, &"é".repeat(MAX_REASON));
        assert_eq!(v.failure(10).map(|w| w.len()), Some(MAX_REASON));
        for m in 11..11 + MAX_FAILED as u32 {
            v.fail(m, "later");
        }
        assert_eq!(v.failure(9), None, "only the newest kept");

        // A call made another way: said of the messages not started here, while it lasts.
        v.elsewhere = Some("by Open MPI".into());
        assert_eq!(v.failure(100).as_deref(), Some("by Open MPI"));
        assert_eq!(v.failure(9), None, "a message started here");
        v.elsewhere = None;
        assert_eq!(v.failure(100), None);
    }

    #[test]
    fn a_flat_collective_answers_its_result_or_its_contribution() {
        use xagg_common::wire::{Collective, DType, Float, Lane, Op};
        let r = Reduction {
            op: Op::Sum,
            dtype: DType::I32,
            float: Float::Fast,
            lane: Lane::I32,
        };
        let contribution = |bytes: &[u8]| Answer::Contribution {
            bytes: bytes.to_vec(),
        };
        let mut v = View::default();
        // A reduce-scatter of 2 blocks of 8 bytes in segments of 4, as member 1 sees it:
        // segments 2 and 3 are its block's.
        let layout = Layout::new(Collective::ReduceScatter, 8, 2, 4, 0, 1);
        let input: Vec<u8> = (0..16).collect();
        let out = [9u8; 8];
        v.start_flat(3, &out, Flat::new(layout, r, &input), 4);
        assert!(v.took(3, 2, 0));
        // Held: the result; another's block or its own not held: its contribution.
        let result = Answer::Result {
            flags: 0,
            bytes: vec![9; 4],
        };
        assert_eq!(v.answer_flat(3, 2), result);
        assert_eq!(v.answer_flat(3, 0), contribution(&input[0..4]));
        assert_eq!(v.answer_flat(3, 3), contribution(&input[12..16]));
        // Not started here: asked again later, nothing promised.
        assert_eq!(v.answer_flat(5, 0), Answer::NotYet);
        assert!(v.promised.is_empty());
        // Failed: the same answers from the copies.
        v.finish(3, &out, &input, false, 2);
        assert_eq!(v.answer_flat(3, 2), result);
        assert_eq!(v.answer_flat(3, 1), contribution(&input[4..8]));
        assert_eq!(
            v.parked_flat(3).map(|p| p.have),
            Some(vec![false, false, true, false])
        );

        // Message 4 complete over 2 slots: the last round on each slot keeps this rank's
        // result there, or its contribution; the earlier ones are gone.
        let out4 = [7u8; 8];
        v.start_flat(4, &out4, Flat::new(layout, r, &input), 5);
        for s in 0..4 {
            assert!(v.took(4, s, 0));
        }
        v.finish(4, &out4, &input, true, 2);
        assert_eq!(
            v.answer_flat(4, 3),
            Answer::Result {
                flags: 0,
                bytes: vec![7; 4]
            }
        );
        assert_eq!(
            v.answer_flat(4, 2),
            Answer::Result {
                flags: 0,
                bytes: vec![7; 4]
            }
        );
        assert_eq!(v.answer_flat(4, 1), Answer::Gone);

        // A broadcast's root answers its own data as the result.
        let b = Layout::new(Collective::Broadcast, 8, 1, 4, 1, 1);
        v.start_flat(5, &out, Flat::new(b, r, &input[..8]), 6);
        assert_eq!(
            v.answer_flat(5, 1),
            Answer::Result {
                flags: 0,
                bytes: input[4..8].to_vec()
            }
        );
    }
}
