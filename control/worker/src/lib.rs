//! The worker library: allreduce of a buffer through an aggregation switch. What an MPI
//! interposer or a Python module links: no daemon, no loader, no async runtime, no thread
//! of its own; AF_XDP receive behind the `afxdp` feature.
//!
//! A [`Worker`] is one member of one job. [`Worker::submit`] hands it an allreduce and
//! returns a [`Request`] at once; many requests may be in flight together — several
//! messages of one job pipelined, requests of several jobs (one worker each) — and a
//! [`CompletionQueue`] gathers the completions of any of them. The blocking
//! [`Worker::allreduce`] is a request and its wait.
//!
//! The buffer is cut into segments of the job's length; each goes to a slot of the job
//! ([`engine`]'s schedule) and is sent through the window ([`window`]: rounds in flight,
//! shadow copies, retransmission) over the transport ([`transport`]: UDP with GSO/GRO, or
//! AF_XDP receive). A contribution whose result does not come back in time is sent again;
//! the switch never adds it twice and answers it with the stored result if the slot
//! already finished.
//!
//! # Rules
//! - **Order.** All members submit a job's requests in the same order, each with the same
//!   length, op and data type: the messages' sizes decide which slot each segment takes.
//!   Requests of one job submitted from several threads must be ordered by the caller.
//! - **Progress** is made inside the library's calls — [`Request::wait`],
//!   [`Request::test`], [`CompletionQueue::wait`] and [`CompletionQueue::poll`] — as in
//!   MPI. A request nobody waits on, tests or polls makes no progress (and holds the other
//!   members up).
//! - **Errors at submit** are the request's own: an op its type does not take, a length
//!   that is not a whole number of elements, input and output of different lengths or
//!   types, a segment too short for one element ([`AllreduceError::Invalid`]). Everything
//!   else comes in the [`Completion`]: success with the [`Path`] taken; timed out
//!   ([`AllreduceError::Timeout`]: which segments and slots, which members the switch waits
//!   for); switch unreachable ([`AllreduceError::NoSwitch`]: no status reply at all);
//!   refused ([`AllreduceError::Refused`], with the switch's reason); overflow and
//!   non-finite input (which segments; the others hold their result); cancelled; an I/O
//!   error of the socket.
//! - **Buffers after a failure**: segments whose result came hold it; the others hold,
//!   in place, the input or the result, and in an output buffer what it held before. The
//!   input of [`Worker::submit_separate`] is never written: a caller can fall back to
//!   another way with it.
//! - **Cancelling** ([`Request::cancel`]) is local: the request stops at the next step
//!   (what it sent before stays sent) and ends [`AllreduceError::Cancelled`]; the other
//!   members' requests for that message time out, naming this member.
//! - **Give-up time** ([`WorkerParams::give_up`], 10 s) counts only time spent in the
//!   library's calls without a result of the request.
//!
//! # Examples
//! Each runs verbatim on every member of a job in the lab tests (`tests/tests/requests.rs`);
//! they read the `XAGG_*` environment ([`WorkerParams::from_env`]).
//!
//! A blocking allreduce:
//! ```no_run
#![doc = include_str!("../examples/blocking.rs")]
//! ```
//! Several requests in flight, with separate input and output, and over memory owned
//! elsewhere:
//! ```no_run
#![doc = include_str!("../examples/requests.rs")]
//! ```
//! A completion queue:
//! ```no_run
#![doc = include_str!("../examples/queue.rs")]
//! ```
//! What each completion status says:
//! ```no_run
#![doc = include_str!("../examples/statuses.rs")]
//! ```

pub mod codec;
pub mod collective;
pub mod data;
pub mod engine;
mod error;
mod fold;
#[cfg(feature = "afxdp")]
pub mod host_end;
pub mod join;
mod lease;
mod params;
mod peers;
pub mod report;
pub mod request;
pub mod route;
pub mod settings;
pub mod transport;
pub mod window;
#[cfg(feature = "afxdp")]
pub mod xsk;

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

pub use collective::Layout;
use engine::{Pending, WorkerInner};
pub use error::{AllreduceError, Error, Missing};
pub use join::{JoinParams, Placement};
pub use params::{Place, WorkerParams, COLLECTIVE_TIMEOUT, MIN_TIMEOUT};
pub use report::{Path, Report};
use request::Shared;
pub use request::{Buffer, Completion, CompletionQueue, Request};
pub use settings::{float_mode, JoinSettings, JOIN_TIMEOUT};
use transport::Transport;
pub use xagg_common::wire::Collective;
use xagg_common::wire::{self, DType, Float, Lane, Op};
pub use xagg_join::{CredentialKey, JobKey, Levels, MemberReply, Secret};

/// Writes `xagg: msg` to stderr in one write (the lines of processes sharing a terminal do
/// not interleave): what a waiting request says of the ranks it waits for.
pub(crate) fn say(msg: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("xagg: {msg}\n").as_bytes());
}

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
element!(i32 => I32, u32 => U32, i64 => I64, f32 => F32, half::f16 => F16, half::bf16 => Bf16, f64 => F64);

/// What a message reduces: its op and data type, the float mode, and the lane they
/// travel in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub op: Op,
    pub dtype: DType,
    pub float: Float,
    pub lane: Lane,
}

/// A collective's call as one member makes it: what [`Call::into_allreduce`] needs.
struct Call {
    collective: Collective,
    member: usize,
    root: usize,
    block: usize,
}

impl Call {
    /// The call made as an allreduce of its whole message (`whole` bytes), each member
    /// taking its part of the result: a reduce-scatter its block; a reduce the whole at
    /// the root, nothing elsewhere; an all-gather (every member's block at its place,
    /// zeros elsewhere) and a broadcast (zeros but at the root) moved by `or`.
    fn into_allreduce(
        self,
        r: Reduction,
        whole: usize,
        input: Option<Buffer>,
        mut output: Buffer,
        shared: Arc<Shared>,
    ) -> Pending {
        let owned = |dtype| {
            let mut bytes = vec![0u8; whole];
            let (ptr, len) = (bytes.as_mut_ptr(), bytes.len());
            // Safety: the Vec's heap block, owned by the buffer (it does not move).
            unsafe { Buffer::from_raw(ptr, len, dtype, bytes) }
        };
        let mine = self.member * self.block..(self.member + 1) * self.block;
        let (input, output, block_of) = match self.collective {
            Collective::AllGather => {
                // The output holds this member's block already.
                let bytes = output.bytes_mut();
                bytes[..mine.start].fill(0);
                bytes[mine.end..].fill(0);
                (None, output, None)
            }
            Collective::Broadcast => {
                if self.member != self.root {
                    output.bytes_mut().fill(0);
                }
                (None, output, None)
            }
            Collective::ReduceScatter => {
                let result = owned(output.dtype());
                (input, result, Some((output, mine)))
            }
            Collective::Reduce if self.member != self.root => {
                let result = owned(output.dtype());
                // In place: the data is in the output, which must stay as it was.
                let input = input.unwrap_or_else(|| {
                    // Safety: only read, while the output (kept in `block_of`) lives.
                    unsafe { Buffer::from_raw(output.as_ptr(), output.len(), output.dtype(), ()) }
                });
                (Some(input), result, Some((output, 0..0)))
            }
            Collective::Reduce | Collective::Allreduce => (input, output, None),
        };
        Pending {
            r,
            collective: Collective::Allreduce,
            root: 0,
            block: whole,
            blocks: 1,
            block_of,
            input,
            output,
            shared,
        }
    }
}

impl Reduction {
    /// What a gather (all-gather, broadcast) carries: bytes, moved rather than reduced,
    /// in 4-byte words (`or` over u32 on the wire; the switch stores them as they come).
    pub const MOVE: Self = Self {
        op: Op::Or,
        dtype: DType::U32,
        float: Float::Fast,
        lane: Lane::U32,
    };
}

impl Reduction {
    /// `op` over `dtype` in float mode `float`, if the switch reduces it.
    pub fn new(op: Op, dtype: DType, float: Float) -> Result<Self, AllreduceError> {
        let lane = wire::lane_in(op, dtype, float).ok_or_else(|| {
            AllreduceError::Invalid(format!(
                "{op} over {dtype} is not supported (floats take sum, min, max, avg)"
            ))
        })?;
        Ok(Self {
            op,
            dtype,
            float,
            lane,
        })
    }
}

/// A member of a job: submits allreduces and makes them progress. Cheap to clone; clones
/// share the member's socket and requests, and may be used from several threads.
#[derive(Clone)]
pub struct Worker {
    /// Dropped by hand, after the peers' responder let go of it (`Drop`).
    inner: std::mem::ManuallyDrop<Arc<WorkerInner>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The last handle but the responder's (requests may hold the worker too: its
        // address is freed with them then): the responder lets go first, so that the
        // worker's sockets close before this drop returns.
        let handoff = (Arc::strong_count(&self.inner) <= 2)
            .then(|| self.inner.responder.get().cloned())
            .flatten();
        let inner = &mut self.inner;
        // Safety: `inner` is dropped here, once, and not used after.
        let mut drop_inner = || unsafe { std::mem::ManuallyDrop::drop(inner) };
        match handoff {
            Some(h) => h.let_go(drop_inner),
            None => drop_inner(),
        }
    }
}

impl Worker {
    /// Opens the member's socket (its address and port: `p.bind`) and checks the
    /// parameters. Nothing is sent until the first request.
    pub fn new(p: WorkerParams) -> Result<Self, AllreduceError> {
        p.lane()?;
        check_mtu(&p)?;
        Reduction::new(p.op, p.dtype, p.float)?;
        let transport = Transport::new(&p)?;
        Ok(Self {
            inner: std::mem::ManuallyDrop::new(Arc::new(WorkerInner::new(p, transport))),
        })
    }

    /// Joins a job over the network (see [`join`]): sends hellos from its data socket,
    /// then joins through the daemon's listener, waiting until every rank is in (up to
    /// `j.timeout`). The job is created by the first rank that carries a credential.
    pub fn join(j: JoinParams) -> Result<Self, AllreduceError> {
        Self::join_with(j, |_| {})
    }

    /// [`Worker::join`], with the worker's settings (timeouts, GSO, AF_XDP, the default
    /// op and type...) changed by `tweak` once the join has set the job, member and switch.
    pub fn join_with(
        j: JoinParams,
        tweak: impl FnOnce(&mut WorkerParams),
    ) -> Result<Self, AllreduceError> {
        let (mut p, sock, membership) = join::join(&j)?;
        tweak(&mut p);
        let set_up = p
            .lane()
            .and_then(|_| check_mtu(&p))
            .and_then(|()| Transport::with_socket(sock, &p));
        let transport = match set_up {
            Ok(t) => t,
            Err(e) => {
                // Joined but unable to take part (its settings, its MTU, an AF_XDP socket
                // it cannot open): it leaves, so the job holds no slots for it.
                let _ = membership.leave();
                return Err(e);
            }
        };
        let mut inner = WorkerInner::new(p, transport);
        let mut membership = membership;
        membership.gone = inner.gone();
        if let Some(l) = membership.lease_s {
            inner.lease = std::sync::Mutex::new(Some(lease::Lease::start(membership.clone(), l)?));
        }
        inner.membership = Some(membership);
        Ok(Self {
            inner: std::mem::ManuallyDrop::new(Arc::new(inner)),
        })
    }

    /// [`Worker::join_with`], then [`Worker::sync`]: a switch that does not answer is
    /// found here, before any data waits on it. A rank whose sync fails leaves the job.
    pub fn join_synced(
        j: JoinParams,
        tweak: impl FnOnce(&mut WorkerParams),
    ) -> Result<Self, AllreduceError> {
        let w = Self::join_with(j, tweak)?;
        match w.sync() {
            Ok(()) => Ok(w),
            Err(e) => {
                let _ = w.leave();
                Err(e)
            }
        }
    }

    /// Leaves the job this worker joined; when every rank has left, the daemon removes
    /// it. (A job added by hand has nobody to leave: an error.)
    pub fn leave(&self) -> Result<(), AllreduceError> {
        match &self.inner.membership {
            Some(m) => {
                drop(self.take_lease());
                if self.inner.left.swap(true, Ordering::SeqCst) {
                    return Ok(());
                }
                m.leave()
            }
            None => Err(AllreduceError::Invalid(
                "this worker did not join its job over the network: there is nothing to leave"
                    .into(),
            )),
        }
    }

    /// Leaves the job without waiting for the daemon's answer (a rank moving to another
    /// way of reducing: it should not hold the switch's slots, nor wait on a daemon that
    /// may be what failed). A worker that did not join has nothing to leave.
    pub fn leave_soon(&self) {
        let Some(m) = &self.inner.membership else {
            return;
        };
        let mut lease = self.inner.lease.lock().unwrap_or_else(|e| e.into_inner());
        if self.inner.left.swap(true, Ordering::SeqCst) {
            return;
        }
        match lease.as_mut() {
            // Kept: [`Worker::leave`] and the worker's end wait for it to be done.
            Some(l) => l.leave_soon(),
            None => {
                let m = m.clone();
                std::thread::spawn(move || m.leave());
            }
        }
    }

    fn take_lease(&self) -> Option<lease::Lease> {
        self.inner
            .lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The joined job's state as the daemon sees it: ranks missing, slots waiting and
    /// for whom.
    pub fn job_status(&self) -> Result<MemberReply, AllreduceError> {
        match &self.inner.membership {
            Some(m) => m.status(),
            None => Err(AllreduceError::Invalid(
                "this worker did not join its job over the network: ask the daemon's local API"
                    .into(),
            )),
        }
    }

    pub fn params(&self) -> &WorkerParams {
        &self.inner.p
    }

    pub(crate) fn inner(&self) -> &Arc<WorkerInner> {
        &self.inner
    }

    /// Starts answering the job's other ranks for results this rank holds (a thread
    /// with a TCP listener at this worker's address; [`peers`](crate::peers)), each
    /// question and answer authenticated with the job's `secret`. Returns the address
    /// to hand the peers; every rank then gives [`Worker::set_peers`] everyone's.
    pub fn serve_peers(&self, secret: &Secret) -> Result<std::net::SocketAddrV4, AllreduceError> {
        let view = Arc::new(std::sync::Mutex::new(peers::View::default()));
        let (at, setup) =
            peers::serve(&self.inner, *self.params().bind.ip(), secret, view.clone())?;
        self.inner.with_engine(|e| e.view = Some(view));
        *request::lock(&self.inner.peers_setup) = Some(setup);
        Ok(at)
    }

    /// This rank makes the job's next call another way, or no more calls (`Some(why)`),
    /// or is back (`None`): a peer the switch keeps waiting for a message this rank has not
    /// started is told why when it asks this rank's responder, and its call fails at the
    /// give-up time with that reason ([`AllreduceError::MemberFailed`]) instead of waiting
    /// out the collective timeout.
    pub fn elsewhere(&self, why: Option<String>) {
        if let Some(p) = self.inner.peers.get() {
            request::lock(&p.view).elsewhere = why;
        }
    }

    /// Every rank's responder address, in rank order (this one's `rank` included): from
    /// now on a request the switch fails is recovered from them ([`Worker::recover`]).
    pub fn set_peers(&self, rank: usize, addresses: Vec<std::net::SocketAddrV4>) {
        if let Some(setup) = request::lock(&self.inner.peers_setup).take() {
            self.inner.set_responders(addresses.clone(), setup.key());
            let _ = self.inner.peers.set(setup.with(rank, addresses));
        }
    }

    /// Finishes a request the switch failed ([`AllreduceError::recoverable`]) from the
    /// peers: each missing segment's result, with the switch's exact bits, from the first
    /// rank that holds it. Returns whether it tried (peers set, a recoverable failure);
    /// the completion then says how it ended: success ([`Report::recovered`] counts the
    /// segments taken from peers), flagged segments as from the switch, or
    /// [`AllreduceError::Abandoned`] when no rank holds some segment — every rank reaches
    /// that verdict for the same call, and makes it another way.
    pub fn recover(&self, c: &mut Completion) -> bool {
        let (Some(peers), Some(message)) = (self.inner.peers.get(), c.message) else {
            return false;
        };
        if !c.status.as_ref().is_err_and(AllreduceError::recoverable) {
            return false;
        }
        let flat = request::lock(&peers.view).parked_flat(message);
        if let Some(p) = flat {
            c.status = self.recover_flat(peers, message, p, &mut c.buffer);
            return true;
        }
        let Some((have, mut flags, segment_bytes)) = request::lock(&peers.view).parked(message)
        else {
            return false;
        };
        let missing: Vec<u32> = (0..have.len() as u32)
            .filter(|&s| !have[s as usize])
            .collect();
        let asked = missing.len();
        let job = self.params().job;
        let whole = match c.part.as_mut() {
            Some((whole, _)) => whole,
            None => &mut c.buffer,
        };
        let bytes = whole.len();
        c.status = match peers.recover(
            message,
            missing,
            whole.bytes_mut(),
            segment_bytes,
            &mut flags,
            self.params().give_up,
        ) {
            Ok(none) if none.is_empty() => {
                let flagged = |bit| -> Vec<u32> {
                    (0..flags.len() as u32)
                        .filter(|&s| flags[s as usize] & bit != 0)
                        .collect()
                };
                let (nonfinite, overflow) =
                    (flagged(wire::ENC_NONFINITE), flagged(wire::ENC_OVERFLOW));
                if !nonfinite.is_empty() {
                    Err(AllreduceError::NonFinite {
                        job,
                        message,
                        segments: nonfinite,
                    })
                } else if !overflow.is_empty() {
                    Err(AllreduceError::Overflow {
                        job,
                        message,
                        segments: overflow,
                    })
                } else {
                    if let Some((whole, range)) = c.part.take() {
                        request::take_part(&mut c.buffer, &whole, range);
                    }
                    Ok(Report {
                        bytes,
                        segments: have.len(),
                        recovered: asked,
                        path: self.params().path,
                        ..Report::default()
                    })
                }
            }
            Ok(none) => Err(AllreduceError::Abandoned {
                job,
                message,
                segments: none,
            }),
            Err(e) => Err(e),
        };
        true
    }

    /// [`Worker::recover`] of a flat collective (reduce-scatter, all-gather, broadcast or
    /// reduce through the switch's own members): the segments this rank gets and lacks,
    /// each from a peer that got it or made here from every rank's contribution.
    fn recover_flat(
        &self,
        peers: &peers::Peers,
        message: u32,
        mut p: peers::ParkedFlat,
        output: &mut Buffer,
    ) -> Result<Report, AllreduceError> {
        let layout = p.flat.layout;
        let missing: Vec<u32> = (0..layout.segments())
            .filter(|&s| layout.destination(s).is_some() && !p.have[s])
            .map(|s| s as u32)
            .collect();
        let asked = missing.len();
        let params = self.params();
        let job = params.job;
        peers.recover_flat(
            message,
            missing,
            (p.flat, &p.source),
            params.ranks(),
            output.bytes_mut(),
            &mut p.flags,
            (params.give_up, params.collective_timeout),
        )?;
        let flagged = |bit| -> Vec<u32> {
            (0..layout.segments() as u32)
                .filter(|&s| layout.destination(s as usize).is_some())
                .filter(|&s| p.flags[s as usize] & bit != 0)
                .collect()
        };
        let (nonfinite, overflow) = (flagged(wire::ENC_NONFINITE), flagged(wire::ENC_OVERFLOW));
        if !nonfinite.is_empty() {
            return Err(AllreduceError::NonFinite {
                job,
                message,
                segments: nonfinite,
            });
        }
        if !overflow.is_empty() {
            return Err(AllreduceError::Overflow {
                job,
                message,
                segments: overflow,
            });
        }
        Ok(Report {
            bytes: layout.message_bytes(),
            segments: layout.segments(),
            recovered: asked,
            path: params.path,
            ..Report::default()
        })
    }

    /// Learns the job's state from the switch (which message comes next, which shadow
    /// copy each slot takes), waiting for it. The first request does it when it has not
    /// been done; calling it before the clock of a measurement starts keeps its round trip
    /// out of the figures. Fails as a request would: no reply ([`AllreduceError::NoSwitch`])
    /// or a refusal ([`AllreduceError::Refused`]).
    pub fn sync(&self) -> Result<(), AllreduceError> {
        loop {
            if let Some(r) = self.inner.with_engine(|e| e.sync()) {
                return r;
            }
            self.inner.progress(self.inner.step());
        }
    }

    /// Submits an allreduce of `buffer` in place with `op` (its data type is the
    /// buffer's) and returns its handle at once. The request owns the buffer until its
    /// [`Completion`] hands it back with the result.
    ///
    /// Every member of a job must submit the job's requests in the same order, each with
    /// the same length, op and type as the other members' (the messages' sizes decide
    /// which slot each segment takes). Errors here are the request's own: an op the type
    /// does not take or a segment that holds no element ([`AllreduceError::Invalid`]);
    /// everything the network or the switch says comes in the completion.
    pub fn submit(&self, op: Op, buffer: Buffer) -> Result<Request, AllreduceError> {
        let shared = Shared::new(self.params().job, None);
        self.enqueue(op, None, buffer, shared.clone())?;
        Ok(Request::new(shared, Arc::clone(&self.inner)))
    }

    /// Submits an allreduce of `input` with `op` whose result goes to `output` (same
    /// length and type); `input` is only read, and comes back unchanged with the
    /// completion, whatever happened — what a caller needs that falls back to another way
    /// when this one fails.
    pub fn submit_separate(
        &self,
        op: Op,
        input: Buffer,
        output: Buffer,
    ) -> Result<Request, AllreduceError> {
        let shared = Shared::new(self.params().job, None);
        self.enqueue(op, Some(input), output, shared.clone())?;
        Ok(Request::new(shared, Arc::clone(&self.inner)))
    }

    /// Checks a request and hands it to the engine.
    pub(crate) fn enqueue(
        &self,
        op: Op,
        input: Option<Buffer>,
        output: Buffer,
        shared: Arc<Shared>,
    ) -> Result<(), AllreduceError> {
        let dtype = output.dtype();
        let r = Reduction::new(op, dtype, self.params().float)?;
        if let Some(i) = &input {
            if i.dtype() != dtype || i.len() != output.len() {
                return Err(AllreduceError::Invalid(format!(
                    "the input ({} bytes of {}) and the output ({} bytes of {dtype}) differ in length or type",
                    i.len(),
                    i.dtype(),
                    output.len()
                )));
            }
        }
        if !output.len().is_multiple_of(dtype.size()) {
            return Err(AllreduceError::Invalid(format!(
                "buffer of {} bytes is not a whole number of {dtype} elements",
                output.len(),
            )));
        }
        // A segment carries as many lanes of this message's type as fit the job's bytes.
        let segment_bytes = self.params().shape.segment_bytes();
        if segment_bytes < r.lane.size() {
            return Err(AllreduceError::Invalid(format!(
                "the job's segments of {segment_bytes} bytes hold no {}-byte lane of {op} over {dtype}",
                r.lane.size()
            )));
        }
        let block = output.len();
        self.inner.enqueue(Pending {
            r,
            collective: Collective::Allreduce,
            root: 0,
            block,
            blocks: 1,
            block_of: None,
            input,
            output,
            shared,
        });
        Ok(())
    }

    /// Submits `collective` and returns its handle at once, on the same completion path
    /// as [`Self::submit`] (each call takes the job's next message, so every member submits
    /// the job's calls, whatever their collective, in the same order). The buffers, for
    /// a job of n members where this one is member (and rank) i:
    ///
    /// | collective | `input` | `output` |
    /// |---|---|---|
    /// | allreduce | `None` (in place) or S bytes | S bytes: the reduced buffer |
    /// | reduce-scatter | n·B bytes | B bytes: block i of the reduced buffer |
    /// | all-gather | B bytes: block i | n·B bytes: every member's block, in member order |
    /// | broadcast | `None` | S bytes: the root's, sent from it, received into it |
    /// | reduce | `None` (in place) or S bytes | S bytes: the reduced buffer at the root; left as it was elsewhere |
    ///
    /// `op` is the reduction's (ignored by all-gather and broadcast, which move bytes);
    /// `root` the root's member index (reduce, broadcast; ignored otherwise). Member i owns
    /// block i, and a block's segments never straddle two owners ([`Layout`]). Behind a
    /// host level (a tree, a ring) i is the member's rank in the job
    /// ([`WorkerParams::rank`]); with every rank's place ([`WorkerParams::places`], a
    /// join learns them) each level carries the collective's own bytes, and without them
    /// (or on a ring) each call is made as an allreduce of the whole message
    /// (docs/protocol.md, "The collectives"): an all-gather or broadcast then moves 4-byte
    /// words, and one of other bytes is refused.
    pub fn submit_collective(
        &self,
        collective: Collective,
        op: Op,
        root: usize,
        input: Option<Buffer>,
        output: Buffer,
    ) -> Result<Request, AllreduceError> {
        let shared = Shared::new(self.params().job, None);
        if collective == Collective::Allreduce {
            self.enqueue(op, input, output, shared.clone())?;
        } else {
            self.enqueue_collective(collective, op, root, input, output, shared.clone())?;
        }
        Ok(Request::new(shared, Arc::clone(&self.inner)))
    }

    /// Checks a call of a collective other than allreduce and hands it to the engine.
    fn enqueue_collective(
        &self,
        collective: Collective,
        op: Op,
        root: usize,
        input: Option<Buffer>,
        mut output: Buffer,
        shared: Arc<Shared>,
    ) -> Result<(), AllreduceError> {
        let p = self.params();
        let invalid = |s: String| Err(AllreduceError::Invalid(format!("{collective}: {s}")));
        // Behind a host level the blocks are the job's ranks', in the launcher's order.
        let hosted = p.ranks.is_some();
        let (n, member) = if hosted {
            let Some(rank) = p.rank else {
                return invalid(
                    "this member is a host level's rank and does not know its rank in the job \
                     (join with `levels`, or set `WorkerParams::rank`)"
                        .into(),
                );
            };
            (p.ranks(), rank)
        } else {
            (p.shape.members(), usize::from(p.member))
        };
        let dtype = output.dtype();
        if !output.len().is_multiple_of(dtype.size()) {
            return invalid(format!(
                "the output of {} bytes is not a whole number of {dtype} elements",
                output.len()
            ));
        }
        let input_len = input.as_ref().map(Buffer::len);
        if let Some(i) = input.as_ref().filter(|i| i.dtype() != dtype) {
            return invalid(format!(
                "the input's type ({}) is not the output's ({dtype})",
                i.dtype()
            ));
        }
        let (block, blocks) = match collective {
            Collective::ReduceScatter => {
                if input_len != Some(n * output.len()) {
                    return invalid(format!(
                        "the input must be the {n} members' blocks of {} bytes ({} bytes), not {}",
                        output.len(),
                        n * output.len(),
                        input_len.map_or("none".into(), |l| format!("{l} bytes"))
                    ));
                }
                (output.len(), n)
            }
            Collective::AllGather => {
                let Some(b) = input_len.filter(|b| b * n == output.len()) else {
                    return invalid(format!(
                        "the output ({} bytes) must hold the {n} members' blocks of the input's length ({})",
                        output.len(),
                        input_len.map_or("no input".into(), |l| format!("{l} bytes"))
                    ));
                };
                // This member's own block is in its output at once.
                let own = input.as_ref().expect("checked").bytes();
                output.bytes_mut()[member * b..(member + 1) * b].copy_from_slice(own);
                (b, n)
            }
            Collective::Broadcast | Collective::Reduce => {
                if root >= n {
                    return invalid(format!("root {root} is not a member (the job has {n})"));
                }
                if collective == Collective::Broadcast && input.is_some() {
                    return invalid(
                        "a broadcast is in place: give the buffer as the output alone".into(),
                    );
                }
                if input_len.is_some_and(|l| l != output.len()) {
                    return invalid(format!(
                        "the input ({} bytes) and the output ({} bytes) differ in length",
                        input_len.unwrap_or(0),
                        output.len()
                    ));
                }
                (output.len(), 1)
            }
            Collective::Allreduce => unreachable!("served by enqueue"),
        };
        let r = if collective.gathers() {
            Reduction::MOVE
        } else {
            Reduction::new(op, dtype, p.float)?
        };
        // Behind a host level whose ranks' places are not known (or a ring of hosts) every
        // collective is made as an allreduce of the whole message (each rank sends and
        // receives S; a host sends one partial up per segment, S each way).
        let hosted = hosted && p.levels_by_place().is_none();
        // A message of one segment: a reduce-scatter or all-gather in blocks would take a
        // segment (a round, a packet each way) per member; made as an allreduce it takes
        // one — the whole result to every member, at most a segment's bytes more.
        let whole = block * blocks;
        let one_segment = whole <= p.shape.segment_bytes() / r.lane.size() * r.dtype.size();
        let small_in_blocks = one_segment
            && blocks > 1
            && matches!(
                collective,
                Collective::AllGather | Collective::ReduceScatter
            );
        let words = whole.is_multiple_of(r.dtype.size());
        if hosted && !words {
            return invalid(format!(
                "behind a host level without every rank's place (or on a ring of hosts) it moves 4-byte words: {whole} bytes are not a whole number of them (pass it to another way)"
            ));
        }
        if hosted || (small_in_blocks && words) {
            let call = Call {
                collective,
                member,
                root,
                block,
            };
            self.inner
                .enqueue(call.into_allreduce(r, whole, input, output, shared));
            return Ok(());
        }
        if p.shape.segment_bytes() < r.lane.size() {
            return invalid(format!(
                "the job's segments of {} bytes hold no {}-byte lane",
                p.shape.segment_bytes(),
                r.lane.size()
            ));
        }
        self.inner.enqueue(Pending {
            r,
            collective,
            root: root as u8,
            block,
            blocks,
            block_of: None,
            input,
            output,
            shared,
        });
        Ok(())
    }

    /// Allreduce of `buf` in place with the job's op (`WorkerParams::op`), waiting for it.
    pub fn allreduce<T: Element>(&self, buf: &mut [T]) -> Result<Report, AllreduceError> {
        self.allreduce_op(self.params().op, buf)
    }

    /// Allreduce of `buf` in place with `op`, waiting for it: every message carries its
    /// own op and type, so one job reduces any pair the switch supports.
    pub fn allreduce_op<T: Element>(
        &self,
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
    /// job's op, waiting for it.
    pub fn allreduce_bytes(&self, buf: &mut [u8]) -> Result<Report, AllreduceError> {
        self.allreduce_bytes_as(self.params().op, self.params().dtype, buf)
    }

    /// Allreduce of a buffer of little-endian elements of `dtype`, with `op`, waiting for
    /// it: a request like [`Worker::submit`]'s, over the caller's memory.
    pub fn allreduce_bytes_as(
        &self,
        op: Op,
        dtype: DType,
        buf: &mut [u8],
    ) -> Result<Report, AllreduceError> {
        // Safety: the request ends before this returns, and `Waited` takes it out of the
        // worker if anything unwinds first.
        let buffer = unsafe { Buffer::borrowed(buf, dtype) };
        self.wait_borrowed(self.submit(op, buffer)?)
    }

    /// Allreduce of `input` (little-endian elements of `dtype`) with `op` into `output` (as
    /// long), waiting for it: [`Worker::submit_separate`] over the caller's memory. `input`
    /// is only read, so a caller repeating an allreduce of the same data copies nothing
    /// between the calls.
    pub fn allreduce_bytes_into(
        &self,
        op: Op,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<Report, AllreduceError> {
        // Safety: a separate request's input is only read (nothing is written through the
        // pointer); both borrows outlive the request, as in `allreduce_bytes_as`.
        let input = unsafe { Buffer::from_raw(input.as_ptr().cast_mut(), input.len(), dtype, ()) };
        let output = unsafe { Buffer::borrowed(output, dtype) };
        self.wait_borrowed(self.submit_separate(op, input, output)?)
    }

    /// [`Self::submit_collective`] over borrowed buffers of `dtype` (an input, if any, only
    /// read), waiting for it.
    pub fn collective_bytes_into(
        &self,
        collective: Collective,
        op: Op,
        root: usize,
        dtype: DType,
        input: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<Report, AllreduceError> {
        // Safety: as in `allreduce_bytes_into`.
        let input =
            input.map(|i| unsafe { Buffer::from_raw(i.as_ptr().cast_mut(), i.len(), dtype, ()) });
        let output = unsafe { Buffer::borrowed(output, dtype) };
        self.wait_borrowed(self.submit_collective(collective, op, root, input, output)?)
    }

    /// Waits for a request over borrowed memory; if anything unwinds first, `Waited` takes
    /// it out of the worker before the borrow ends.
    fn wait_borrowed(&self, request: Request) -> Result<Report, AllreduceError> {
        let mut guard = Waited(Some((request.shared(), Arc::clone(&self.inner))));
        let c = request.wait();
        guard.0 = None;
        c.status
    }
}

/// Cancels a request over borrowed memory if the call waiting for it unwinds, and makes
/// the worker let go of it before the borrow ends.
struct Waited(Option<(Arc<Shared>, Arc<WorkerInner>)>);

impl Drop for Waited {
    fn drop(&mut self) {
        if let Some((s, w)) = self.0.take() {
            s.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            while !s.delivered() {
                if !w.progress(w.step()) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// Whether the link of the worker's address carries the job's full segments: one IPv4
/// packet each (skipped when no interface here holds the address).
fn check_mtu(p: &WorkerParams) -> Result<(), AllreduceError> {
    let Ok(Some(iface)) = xagg_linux::iface::holding(*p.bind.ip()) else {
        return Ok(());
    };
    let Ok(mtu) = xagg_linux::iface::mtu(&iface) else {
        return Ok(());
    };
    let need = wire::ip_packet_len(p.shape.segment_bytes());
    if mtu < need {
        return Err(AllreduceError::Invalid(format!(
            "the job's segments of {} bytes make {need}-byte packets, but {iface} has an MTU of {mtu}: at most {} bytes of segment fit; raise the MTU or use a job with shorter segments",
            p.shape.segment_bytes(),
            wire::payload_for_mtu(mtu)
        )));
    }
    Ok(())
}

/// Parses sizes like `64MiB`, `4KiB`, `1GB`, `4096`: binary units (K, KiB, M, MiB, G,
/// GiB) and decimal ones (KB, kB, MB, GB).
pub fn parse_size(s: &str) -> Result<usize, Error> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| Error::NotASize { text: s.into() })?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(Error::UnknownUnit {
                unit: u.into(),
                text: s.into(),
            })
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| Error::SizeTooLarge { text: s.into() })
}

// Workers and queues are shared between threads; requests and completions move between
// them.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send::<engine::Engine>();
    send_sync::<Worker>();
    send_sync::<CompletionQueue>();
    send::<Request>();
    send::<Completion>();
};

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
        let w = Worker::new(p.clone()).unwrap();
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

    /// A worker whose responder polls its sockets (a request in flight, its caller away
    /// from the library) frees its address when the program drops it: a new worker may
    /// bind it at once, not only after the responder's poll (5 ms) ends.
    #[test]
    fn a_dropped_worker_frees_its_address_at_once() {
        let shape = xagg_common::JobShape::new(2, 4, 1024).unwrap();
        for _ in 0..5 {
            let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let at = match free.local_addr().unwrap() {
                std::net::SocketAddr::V4(a) => a,
                a => panic!("{a}"),
            };
            drop(free);
            // Nothing answers at the switch's address: the request stays in flight.
            let p = WorkerParams::new("127.0.0.1:9".parse().unwrap(), at, 1, 0, shape);
            let w = Worker::new(p).unwrap();
            w.serve_peers(&Secret([1; 32])).unwrap();
            let mut r = w.submit(Op::Sum, Buffer::from(vec![1i32; 256])).unwrap();
            assert!(r.test().is_none());
            // Away: the responder makes the request progress, its sockets polled.
            std::thread::sleep(Duration::from_millis(30));
            r.cancel();
            drop(r);
            drop(w);
            if let Err(e) = std::net::UdpSocket::bind(at) {
                panic!("{at} still bound after the worker was dropped: {e}");
            }
        }
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
            assert_eq!(parse_size(s).ok(), Some(want), "{s}");
        }
        assert!(parse_size("12XB")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
