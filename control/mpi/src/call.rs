//! One served allreduce and the steps it goes through:
//!
//! 1. **Switch**: submitted to the communicator's job. The input is kept — an in-place
//!    buffer is copied first — so the call can be made again another way.
//! 2. **Agree**: every rank says how its switch request ended (`PMPI_Iallreduce` of one
//!    int, the minimum, on the private communicator): 2 the result came, 1 this call must
//!    be made again (NaN or infinity in a float sum, which Open MPI carries per element), 0
//!    the switch failed. Agreements are started in the calls' order, which is the same on
//!    every rank, so they pair up.
//! 3. **Fallback** (when the agreement is not 2): the input is put back and Open MPI
//!    reduces it (`PMPI_Iallreduce` on the private communicator). After a 0 the
//!    communicator's later calls go to Open MPI too, still agreeing one by one, since a
//!    rank may have sent them to the switch before it learnt of the failure (those
//!    requests are cancelled).
//!
//! A rank never waits at the switch for a rank that took another way, and never hands the
//! program a result the others did not get.

use std::ffi::{c_int, c_void};

use xagg_common::wire::{DType, Op};
use xagg_worker::{AllreduceError, Buffer, Request as SwitchRequest};

use crate::{
    abi::{handles, pmpi, Comm, Datatype, MpiOp, Request, IN_PLACE, SUCCESS},
    comm::{op_min, Job},
    say,
};

/// The agreement's votes.
const VOTE_FAILED: c_int = 0;
const VOTE_AGAIN: c_int = 1;
const VOTE_OK: c_int = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Switch,
    Agree,
    Fallback,
    Done,
}

/// How a call's result was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Switch,
    /// By Open MPI after the switch path failed or could not carry the data.
    Fallback,
}

/// One served allreduce.
pub struct Call {
    pub id: u64,
    /// The generalized request the program holds (null for a blocking call).
    pub request: Request,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    pub bytes: usize,
    /// The in-place input, kept until the result is agreed on.
    saved: Option<Vec<u8>>,
    switch: Option<SwitchRequest>,
    /// Why the switch did not serve it on this rank.
    pub error: Option<String>,
    /// [mine, agreed]: boxed so the pointers given to Open MPI stay put.
    votes: Box<[c_int; 2]>,
    /// The agreement's or the fallback's Open MPI request.
    pending: Box<Request>,
    pub phase: Phase,
    pub taken: Option<Taken>,
}

// Safety: the raw pointers are the program's buffers and handles, used only under the
// library's lock while the call is in flight (MPI's own rules on buffers apply).
unsafe impl Send for Call {}

/// The arguments of an allreduce the switch takes.
pub struct Args {
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: c_int,
    pub datatype: Datatype,
    pub op: MpiOp,
    pub dtype: DType,
    pub wire_op: Op,
}

impl Call {
    /// Starts a call on `job`: submitted to the switch unless the job failed before.
    pub fn start(job: &mut Job, id: u64, request: Request, a: &Args) -> Self {
        let bytes = a.count as usize * a.dtype.size();
        let mut call = Self {
            id,
            request,
            send: a.send,
            recv: a.recv,
            count: a.count,
            datatype: a.datatype,
            op: a.op,
            bytes,
            saved: None,
            switch: None,
            error: None,
            votes: Box::new([VOTE_FAILED, VOTE_FAILED]),
            pending: Box::new(std::ptr::null_mut()),
            phase: Phase::Switch,
            taken: None,
        };
        if let Some(why) = &job.failed {
            call.error = Some(format!("an earlier allreduce failed: {why}"));
            return call;
        }
        let recv = a.recv.cast::<u8>();
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

    /// Takes the call one step further if it can; with `block`, waits for that step.
    /// Returns whether the call advanced. `private` carries the agreement and fallback.
    pub fn step(&mut self, private: Comm, failed: &mut Option<String>, block: bool) -> bool {
        let p = pmpi();
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
                self.votes[0] = match completion.map(|c| c.status) {
                    Some(Ok(_)) => VOTE_OK,
                    Some(Err(e @ AllreduceError::NonFinite { .. })) => {
                        self.error = Some(e.to_string());
                        VOTE_AGAIN
                    }
                    Some(Err(e)) => {
                        self.error = Some(e.to_string());
                        VOTE_FAILED
                    }
                    None => VOTE_FAILED,
                };
                // Safety: one int each way, boxed, over our communicator; every rank
                // starts its agreements in the same order.
                unsafe {
                    (p.iallreduce)(
                        (&self.votes[0] as *const c_int).cast(),
                        (&mut self.votes[1] as *mut c_int).cast(),
                        1,
                        handles().int,
                        op_min(),
                        private,
                        &mut *self.pending,
                    )
                };
                self.phase = Phase::Agree;
                true
            }
            Phase::Agree | Phase::Fallback => {
                if !self.finished(block) {
                    return false;
                }
                if self.phase == Phase::Fallback {
                    self.phase = Phase::Done;
                    self.taken = Some(Taken::Fallback);
                    return true;
                }
                if self.votes[1] == VOTE_OK {
                    self.phase = Phase::Done;
                    self.taken = Some(Taken::Switch);
                    return true;
                }
                if self.votes[1] == VOTE_FAILED && failed.is_none() {
                    *failed = Some(self.error.clone().unwrap_or_else(|| {
                        "another rank's allreduce through the switch failed".into()
                    }));
                }
                // Made again by Open MPI from the kept input.
                let send = match &self.saved {
                    Some(saved) => {
                        // Safety: the program's buffer of `bytes` bytes, as at the start.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                saved.as_ptr(),
                                self.recv.cast::<u8>(),
                                saved.len(),
                            )
                        };
                        IN_PLACE
                    }
                    None => self.send,
                };
                // Safety: the program's arguments, over our communicator, started in the
                // same order on every rank.
                let rc = unsafe {
                    (p.iallreduce)(
                        send,
                        self.recv,
                        self.count,
                        self.datatype,
                        self.op,
                        private,
                        &mut *self.pending,
                    )
                };
                if rc != SUCCESS {
                    // Open MPI's errors are fatal by default; if the program chose
                    // otherwise, there is nothing left to fall back on.
                    say(&format!("the fallback MPI_Iallreduce failed ({rc})"));
                    // Safety: MPI is initialized.
                    unsafe { (p.abort)(handles().comm_world, 1) };
                }
                self.phase = Phase::Fallback;
                true
            }
            Phase::Done => false,
        }
    }

    /// Whether the agreement's or the fallback's request is complete (waiting with
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
