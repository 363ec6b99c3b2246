//! One served allreduce and the steps it goes through:
//!
//! 1. **Switch**: submitted to the communicator's job. The input is kept — an in-place
//!    buffer is copied first — so the call can be made again another way. A result from
//!    the switch ends the call: nothing is asked of Open MPI.
//! 2. If the switch stopped answering (or refused), the missing results are taken from
//!    the peers ([`xagg_worker::Worker::recover`]): the switch's exact bits from any rank
//!    that holds them.
//! 3. **Fallback**: the input is put back and Open MPI makes the call
//!    (`PMPI_Iallreduce` on the private communicator) when every rank knows it must, from
//!    what every rank sees alike: flagged segments (NaN or infinity in a float sum, which
//!    Open MPI carries per element; a 64-bit overflow) travel in every copy of the result;
//!    segments no rank holds ([`AllreduceError::Abandoned`]) are found so by every rank
//!    for the same call, which then moves the communicator to Open MPI for good — later
//!    calls still in flight at the switch are made by Open MPI too, whatever their switch
//!    request did. Fallbacks are started in the calls' order, the same on every rank.
//!
//! A rank never waits at the switch for a rank that took another way, and never hands the
//! program a result the others did not get. A slow rank is no failure: the switch says
//! whom it waits for and the call waits, up to the collective timeout (`XAGG_TIMEOUT_S`),
//! which ends the program with a message naming them (MPI has no way back from a
//! collective some ranks left).

use std::ffi::{c_int, c_void};

use xagg_common::wire::{Collective, DType, Op};
use xagg_worker::{AllreduceError, Buffer, Request as SwitchRequest, Worker};

use crate::{
    abi::{handles, pmpi, Comm, Datatype, MpiOp, Request, IN_PLACE, SUCCESS},
    comm::Job,
    layout::Staged,
    say,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Switch,
    Fallback,
    Done,
}

/// How a call's result was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Switch,
    /// By the switch, some segments taken from peers after it stopped answering.
    Recovered,
    /// By Open MPI, the switch's result flagged (NaN or infinity, an overflow).
    Flagged,
    /// By Open MPI after the switch failed (this call or an earlier one).
    Fallback,
}

/// Which collective a served call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Allreduce,
    /// `MPI_Reduce_scatter_block`, and `MPI_Reduce_scatter` with equal counts.
    ReduceScatter,
    Allgather,
    Bcast,
    Reduce,
}

impl Kind {
    pub fn collective(self) -> Collective {
        match self {
            Self::Allreduce => Collective::Allreduce,
            Self::ReduceScatter => Collective::ReduceScatter,
            Self::Allgather => Collective::AllGather,
            Self::Bcast => Collective::Broadcast,
            Self::Reduce => Collective::Reduce,
        }
    }
}

/// One served call.
pub struct Call {
    pub id: u64,
    /// The program's entry point that made it ([`crate::entry`]).
    pub entry: &'static str,
    /// The generalized request the program holds (null for a blocking call).
    pub request: Request,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    pub kind: Kind,
    root: c_int,
    /// The message's bytes (all ranks' blocks for a reduce-scatter or all-gather).
    pub bytes: usize,
    /// The in-place input, kept until the result is agreed on, and where in the receive
    /// buffer it goes back for a fallback.
    saved: Option<Vec<u8>>,
    saved_at: usize,
    /// Where a reduce's result goes on a rank that is not its root (MPI gives it none),
    /// and a reduce-scatter's of unequal counts before its part is copied out.
    scratch: Option<Vec<u8>>,
    /// A reduce-scatter of unequal counts: the counts (for Open MPI's same call), the
    /// bytes of this rank's part, and the input with every rank's part padded to the
    /// largest (the switch's blocks are equal; the padding's results are not used).
    unequal: Option<(Vec<c_int>, usize)>,
    padded: Option<Vec<u8>>,
    switch: Option<SwitchRequest>,
    /// Why the switch did not serve it on this rank.
    pub error: Option<String>,
    /// The fallback's Open MPI request: boxed so the pointer given to Open MPI stays put.
    pending: Box<Request>,
    pub phase: Phase,
    pub taken: Option<Taken>,
    /// Packed buffers, unpacked into the program's at completion.
    stage: Option<Staged>,
}

// Safety: the raw pointers are the program's buffers and handles, used only under the
// library's lock while the call is in flight (MPI's own rules on buffers apply).
unsafe impl Send for Call {}

/// The arguments of a call the switch takes: `count` is the elements of one rank's block
/// for a reduce-scatter (its receive count) and an all-gather (its send count), of the
/// buffer otherwise; `op` is Open MPI's sum where the call has none.
pub struct Args {
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: c_int,
    pub datatype: Datatype,
    pub op: MpiOp,
    pub dtype: DType,
    pub wire_op: Op,
    pub kind: Kind,
    pub root: c_int,
    /// This rank and the communicator's size.
    pub rank: c_int,
    pub size: c_int,
    /// A reduce-scatter's counts where they differ (`count` is then the largest).
    pub counts: Option<Vec<c_int>>,
    /// The packed buffers `send` and `recv` point into, for a datatype that is not
    /// contiguous ([`crate::layout`]).
    pub stage: Option<Staged>,
}

impl Call {
    /// Starts a call on `job`: submitted to the switch unless the job failed before.
    pub fn start(
        job: &mut Job,
        id: u64,
        request: Request,
        entry: &'static str,
        mut a: Args,
    ) -> Self {
        let block = a.count as usize * a.dtype.size();
        let bytes = match a.kind {
            Kind::ReduceScatter | Kind::Allgather => block * a.size as usize,
            _ => block,
        };
        let mut call = Self {
            id,
            entry,
            request,
            send: a.send,
            recv: a.recv,
            count: a.count,
            datatype: a.datatype,
            op: a.op,
            kind: a.kind,
            root: a.root,
            bytes,
            saved: None,
            saved_at: 0,
            scratch: None,
            unequal: a.counts.clone().map(|c| {
                let mine = c[a.rank as usize] as usize * a.dtype.size();
                (c, mine)
            }),
            padded: None,
            switch: None,
            error: None,
            pending: Box::new(std::ptr::null_mut()),
            phase: Phase::Switch,
            taken: None,
            stage: a.stage.take(),
        };
        let a = &a;
        if let Some(why) = &job.failed {
            call.error = Some(format!("an earlier allreduce failed: {why}"));
            return call;
        }
        let recv = a.recv.cast::<u8>();
        if a.kind != Kind::Allreduce {
            // Safety: MPI's contract, as below, for each collective's buffers.
            let submitted = unsafe { call.submit_collective(job, a, block) };
            match submitted {
                Ok(r) => call.switch = Some(r),
                Err(e) => call.error = Some(e.to_string()),
            }
            return call;
        }
        // Safety: MPI's contract: the buffers hold `count` elements of the datatype and
        // are not touched by the program until the call completes.
        let submitted = unsafe {
            let output = Buffer::from_raw(recv, bytes, a.dtype, ());
            if a.send == IN_PLACE {
                // Into a buffer of an earlier call: fresh memory would cost a page fault
                // per 4 KiB on every call.
                let mut keep = job.spares.pop().unwrap_or_default();
                keep.clear();
                keep.extend_from_slice(std::slice::from_raw_parts(recv, bytes));
                call.saved = Some(keep);
                job.worker.submit(a.wire_op, output)
            } else {
                let input = Buffer::from_raw(a.send as *mut u8, bytes, a.dtype, ());
                job.worker.submit_separate(a.wire_op, input, output)
            }
        };
        match submitted {
            Ok(r) => call.switch = Some(r),
            Err(e) => call.error = Some(e.to_string()),
        }
        call
    }

    /// Submits a collective other than allreduce: its input (the send buffer, or a kept
    /// copy of the in-place part of the receive buffer) and its output (the receive
    /// buffer, or scratch memory on a reduce's other ranks).
    ///
    /// # Safety
    /// MPI's contract on the call's buffers: each holds what the collective reads or
    /// writes, untouched by the program until the call completes.
    unsafe fn submit_collective(
        &mut self,
        job: &mut Job,
        a: &Args,
        block: usize,
    ) -> Result<SwitchRequest, AllreduceError> {
        let recv = a.recv.cast::<u8>();
        let n = a.size as usize;
        let mut keep = |from: usize, len: usize| -> *mut u8 {
            let mut k = job.spares.pop().unwrap_or_default();
            k.clear();
            // Safety: the part of the receive buffer the call reads in place.
            k.extend_from_slice(unsafe { std::slice::from_raw_parts(recv.add(from), len) });
            self.saved_at = from;
            self.saved.insert(k).as_mut_ptr()
        };
        let in_place = a.send == IN_PLACE;
        let raw = |p: *mut u8, len: usize| unsafe { Buffer::from_raw(p, len, a.dtype, ()) };
        let (input, output) = match a.kind {
            Kind::ReduceScatter if a.counts.is_some() => {
                // Each rank's part at the start of an equal block; the program's buffers
                // untouched until the result is copied out.
                let counts = a.counts.as_deref().expect("checked");
                let from = if in_place {
                    recv.cast_const()
                } else {
                    a.send.cast::<u8>()
                };
                let mut padded = vec![0u8; n * block];
                let mut at = 0;
                for (i, &c) in counts.iter().enumerate() {
                    let len = c as usize * a.dtype.size();
                    // Safety: the program's input holds every rank's part, in rank order.
                    let part = unsafe { std::slice::from_raw_parts(from.add(at), len) };
                    padded[i * block..i * block + len].copy_from_slice(part);
                    at += len;
                }
                let input = self.padded.insert(padded).as_mut_ptr();
                let output = self.scratch.insert(vec![0u8; block]).as_mut_ptr();
                (Some(raw(input, n * block)), raw(output, block))
            }
            Kind::ReduceScatter => {
                let input = if in_place {
                    keep(0, n * block)
                } else {
                    a.send as *mut u8
                };
                (Some(raw(input, n * block)), raw(recv, block))
            }
            Kind::Allgather => {
                let me = a.rank as usize;
                let input = if in_place {
                    keep(me * block, block)
                } else {
                    a.send as *mut u8
                };
                (Some(raw(input, block)), raw(recv, n * block))
            }
            Kind::Bcast => (None, raw(recv, block)),
            Kind::Reduce => {
                let input = if in_place {
                    keep(0, block)
                } else {
                    a.send as *mut u8
                };
                let output = if a.rank == a.root {
                    recv
                } else {
                    self.scratch.insert(vec![0u8; block]).as_mut_ptr()
                };
                (Some(raw(input, block)), raw(output, block))
            }
            Kind::Allreduce => unreachable!("submitted by start"),
        };
        job.worker.submit_collective(
            a.kind.collective(),
            a.wire_op,
            a.root as usize,
            input,
            output,
        )
    }

    /// Takes the call one step further if it can; with `block`, waits for that step.
    /// Returns whether the call advanced. `private` carries the fallback; `failed` is
    /// the communicator's switch failure, set here by the call that finds it.
    pub fn step(
        &mut self,
        worker: &Worker,
        private: Comm,
        failed: &mut Option<String>,
        block: bool,
    ) -> bool {
        match self.phase {
            Phase::Switch => {
                let done = match self.switch.as_mut() {
                    None => Some(None),
                    Some(_) if block => {
                        let r = self.switch.take().expect("checked");
                        Some(Some(r.wait()))
                    }
                    Some(r) => r.test().map(Some),
                };
                let Some(completion) = done else {
                    return false;
                };
                self.switch = None;
                let status = completion.map(|mut c| {
                    worker.recover(&mut c);
                    c.status
                });
                let taken = match status {
                    // An earlier call failed: every rank makes this one with Open MPI,
                    // whatever its switch request did.
                    _ if failed.is_some() => Taken::Fallback,
                    Some(Ok(r)) if r.recovered > 0 => Taken::Recovered,
                    Some(Ok(_)) => Taken::Switch,
                    Some(Err(
                        e @ (AllreduceError::NonFinite { .. } | AllreduceError::Overflow { .. }),
                    )) => {
                        self.error = Some(e.to_string());
                        Taken::Flagged
                    }
                    Some(Err(e @ AllreduceError::Abandoned { .. })) => {
                        *failed = Some(e.to_string());
                        Taken::Fallback
                    }
                    // Cancelled only once the communicator failed; not submitted: an
                    // error of the call's own arguments, the same on every rank.
                    Some(Err(AllreduceError::Cancelled { .. })) | None => Taken::Fallback,
                    Some(Err(e)) => {
                        let why = if e.not_taken() {
                            "was not taken by the switch (this rank's call does not match the others', or all it sent was lost)"
                        } else if matches!(
                            e,
                            AllreduceError::Timeout { .. } | AllreduceError::GivenUp { .. }
                        ) {
                            "waited past the collective timeout (XAGG_TIMEOUT_S) for the members the switch names"
                        } else {
                            "failed and cannot be made another way (the other ranks may have its result)"
                        };
                        say(&format!(
                            "rank {}: {} {why}: {e}; aborting",
                            crate::world_rank(),
                            self.entry
                        ));
                        // Safety: MPI is initialized.
                        unsafe { (pmpi().abort)(handles().comm_world, 1) };
                        Taken::Fallback
                    }
                };
                self.taken = Some(taken);
                if matches!(taken, Taken::Switch | Taken::Recovered) {
                    if let (Some((_, mine)), Some(scratch)) = (&self.unequal, &self.scratch) {
                        // Safety: the program's receive buffer holds its part.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                scratch.as_ptr(),
                                self.recv.cast::<u8>(),
                                *mine,
                            )
                        };
                    }
                    self.done();
                    return true;
                }
                self.fallback(private);
                true
            }
            Phase::Fallback => {
                if !self.finished(block) {
                    return false;
                }
                self.done();
                true
            }
            Phase::Done => false,
        }
    }

    /// The result is in: unpacked into the program's buffer if it was packed.
    fn done(&mut self) {
        if let Some(stage) = &mut self.stage {
            stage.finish();
        }
        self.phase = Phase::Done;
    }

    /// Starts Open MPI's same call with the kept input, on `private`.
    fn fallback(&mut self, private: Comm) {
        let p = pmpi();
        let send = match &self.saved {
            Some(saved) => {
                // Safety: the part of the program's buffer kept at the start, put back.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        saved.as_ptr(),
                        self.recv.cast::<u8>().add(self.saved_at),
                        saved.len(),
                    )
                };
                IN_PLACE
            }
            None => self.send,
        };
        let req = &mut *self.pending;
        let (recv, count, dt, op, root) =
            (self.recv, self.count, self.datatype, self.op, self.root);
        // Safety: the program's arguments, over our communicator, started in the same
        // order on every rank.
        let rc = unsafe {
            match self.kind {
                Kind::Allreduce => (p.iallreduce)(send, recv, count, dt, op, private, req),
                Kind::ReduceScatter => match &self.unequal {
                    Some((counts, _)) => {
                        (p.ireduce_scatter)(send, recv, counts.as_ptr(), dt, op, private, req)
                    }
                    None => (p.ireduce_scatter_block)(send, recv, count, dt, op, private, req),
                },
                Kind::Allgather => (p.iallgather)(send, count, dt, recv, count, dt, private, req),
                Kind::Bcast => (p.ibcast)(recv, count, dt, root, private, req),
                Kind::Reduce => (p.ireduce)(send, recv, count, dt, op, root, private, req),
            }
        };
        if rc != SUCCESS {
            // Open MPI's errors are fatal by default; if the program chose otherwise,
            // there is nothing left to fall back on.
            say(&format!("the fallback of {:?} failed ({rc})", self.kind));
            // Safety: MPI is initialized.
            unsafe { (p.abort)(handles().comm_world, 1) };
        }
        self.phase = Phase::Fallback;
    }

    /// Whether the fallback's request is complete (waiting with
    /// `block`).
    fn finished(&mut self, block: bool) -> bool {
        let p = pmpi();
        // Safety: our own request, completed once.
        unsafe {
            if block {
                (p.wait)(&mut *self.pending, std::ptr::null_mut());
                true
            } else {
                let mut flag = 0;
                (p.test)(&mut *self.pending, &mut flag, std::ptr::null_mut());
                flag != 0
            }
        }
    }

    /// The kept input's buffer, for a later call to reuse.
    pub fn take_saved(&mut self) -> Option<Vec<u8>> {
        self.saved.take()
    }

    /// Stops the switch request of a call that will be made by Open MPI anyway.
    pub fn cancel_switch(&self) {
        if let Some(r) = &self.switch {
            r.cancel();
        }
    }
}
