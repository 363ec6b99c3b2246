//! `libxagg_mpi.so`: preloaded under an unmodified Open MPI program (`mpirun -x
//! LD_PRELOAD=libxagg_mpi.so ...`), it serves `MPI_Allreduce`, `MPI_Iallreduce` and
//! `MPI_Barrier` through the switch and hands everything else to Open MPI (`PMPI_`).
//!
//! - A communicator becomes a job at its first served call ([`comm`]): rank 0 draws the
//!   job's key and secret and broadcasts them, every rank joins through the daemon's
//!   network listener (`XAGG_DAEMON`), the first with the admission credential
//!   (`XAGG_CREDENTIAL`, its key in `XAGG_CREDENTIAL_FILE`). Ranks agree on the outcome; if any cannot join, Open MPI serves
//!   the communicator and rank 0 says why.
//! - Each call ([`call`]) goes to the switch, then the ranks agree it succeeded everywhere;
//!   otherwise Open MPI makes it again from the kept input.
//! - `MPI_Iallreduce` returns a generalized request; the completion calls (`MPI_Wait`,
//!   `MPI_Test`, their `all`/`any`/`some` forms, `MPI_Request_free`) are wrapped so they
//!   make this library's requests progress, mixed with any of Open MPI's.
//! - Served: the types and ops of [`abi::Handles`] (C and Fortran), on intracommunicators
//!   of 2 to 64 ranks. Everything else goes to `PMPI_` unchanged.
//!
//! Calls are serialized by one lock (programs calling MPI from several threads at once
//! wait for each other here). No panic crosses into C: one aborts the MPI job with a
//! message instead.

// The entry points' safety contract is MPI's (the standard's rules on each call's
// arguments), not restated on each.
#![expect(clippy::missing_safety_doc, reason = "MPI's own contract applies")]

mod abi;
mod call;
mod comm;
mod entry;
mod error;
mod fortran;

use std::{
    collections::HashMap,
    ffi::{c_char, c_int, c_void},
    sync::{Mutex, MutexGuard},
};

use abi::{handles, pmpi, Comm, Datatype, MpiOp, Request, Status, IN_PLACE, SUCCESS, UNDEFINED};
use call::{Args, Call, Phase, Taken};
use comm::{key, CommState, Path};
use entry::{enter, Way};
use xagg_common::wire::{self, DType, Op};

/// What the process did, for the summary at `MPI_Finalize`.
#[derive(Default)]
struct Stats {
    switch_calls: u64,
    switch_bytes: u64,
    /// Of the switch's calls, those finished with results from peers.
    recovered_calls: u64,
    /// Made by Open MPI because the switch's result was flagged (NaN, overflow).
    flagged_calls: u64,
    fallback_calls: u64,
    /// Calls handed to Open MPI unchanged, by reason.
    passed: HashMap<String, u64>,
    /// Calls handed to Open MPI for their size (`XAGG_ROUTE`): faster there.
    routed: u64,
    /// Every call by entry point and way.
    table: entry::Table,
}

#[derive(Default)]
struct State {
    comms: HashMap<usize, CommState>,
    /// The program's generalized requests of calls in flight: their communicator.
    requests: HashMap<usize, usize>,
    /// The program's requests whose calls are done and not yet handed back by a completion
    /// call: how each was made (counted under the call that hands it back).
    finished: HashMap<usize, Way>,
    next_id: u64,
    stats: Stats,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `xagg: msg` to stderr in one write, so the lines of ranks sharing a terminal do
/// not interleave.
fn say(msg: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("xagg: {msg}\n").as_bytes());
}

fn verbose() -> bool {
    std::env::var("XAGG_VERBOSE").is_ok_and(|v| v != "0" && !v.is_empty())
}

fn world_rank() -> c_int {
    let mut r = 0;
    // Safety: after MPI_Init.
    unsafe { (pmpi().comm_rank)(handles().comm_world, &mut r) };
    r
}

/// Runs `f`, turning a panic into an aborted MPI job (a panic must not unwind into C).
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(e) => {
            let what = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            say(&format!("internal error, aborting the MPI job: {what}"));
            // Safety: MPI is initialized in every served call.
            unsafe { (pmpi().abort)(handles().comm_world, 1) }
        }
    }
}

/// The wire type and op of an allreduce the switch serves, or why it is not served.
fn served(count: c_int, datatype: Datatype, op: MpiOp) -> Result<(DType, Op), &'static str> {
    let h = handles();
    let dtype = h
        .dtype(datatype)
        .ok_or("a datatype the switch does not take")?;
    let wire_op = h.op(op).ok_or("an op the switch does not take")?;
    if wire::lane(wire_op, dtype).is_none() {
        return Err("an op the switch does not take over this type");
    }
    if count <= 0 {
        return Err("no elements");
    }
    Ok((dtype, wire_op))
}

/// The communicator's state, made at its first served call.
fn comm_state(st: &mut State, comm: Comm) -> &mut CommState {
    st.comms.entry(key(comm)).or_insert_with(|| {
        let c = comm::create(comm);
        match &c.path {
            Path::Pmpi(why) => {
                if (c.rank == 0 && !c.quiet) || verbose() {
                    say(&format!("{}: allreduces go to Open MPI: {why}", c.name));
                }
            }
            Path::Switch(job) => {
                if verbose() {
                    let p = job.worker.params();
                    let how = p.path.joined(p.path_why.as_deref());
                    say(&format!("{} rank {}: {how}", c.name, c.rank));
                }
            }
        }
        c
    })
}

/// Takes the communicator's calls as far as they go; with `until`, blocks until that call
/// is done. Completed calls are counted and their generalized requests completed.
fn progress(st: &mut State, comm: usize, until: Option<u64>) {
    let Some(c) = st.comms.get_mut(&comm) else {
        return;
    };
    let Path::Switch(job) = &mut c.path else {
        return;
    };
    loop {
        let Some(head) = job.calls.front_mut() else {
            return;
        };
        let block = until.is_some();
        let failed_before = job.failed.is_some();
        let advanced = head.step(&job.worker, job.private, &mut job.failed, block);
        let phase = head.phase;
        if !failed_before && job.failed.is_some() {
            if c.rank == 0 || verbose() {
                say(&format!(
                    "{} rank {}: the switch failed, allreduces go to Open MPI from now on: {}",
                    c.name,
                    c.rank,
                    job.failed.as_deref().unwrap_or_default()
                ));
            }
            for later in job.calls.iter().skip(1) {
                later.cancel_switch();
            }
        }
        if phase == Phase::Done {
            let mut done = job.calls.pop_front().expect("the head");
            if let Some(spare) = done.take_saved() {
                // Two are enough for a blocking call and the next; more in-flight calls
                // allocate their own.
                if job.spares.len() < 2 {
                    job.spares.push(spare);
                }
            }
            let way = match done.taken {
                Some(Taken::Switch) => Way::Switch,
                Some(Taken::Recovered) => Way::Recovered,
                Some(Taken::Flagged) => Way::Flagged,
                _ => Way::Fallback,
            };
            if done.request.is_null() {
                st.stats.table.count(done.entry, way);
            } else {
                st.finished.insert(key(done.request), way);
            }
            match done.taken {
                Some(t @ (Taken::Switch | Taken::Recovered)) => {
                    st.stats.switch_calls += 1;
                    st.stats.switch_bytes += done.bytes as u64;
                    if t == Taken::Recovered {
                        st.stats.recovered_calls += 1;
                    }
                }
                Some(Taken::Flagged) => st.stats.flagged_calls += 1,
                _ => st.stats.fallback_calls += 1,
            }
            if !done.request.is_null() {
                st.requests.remove(&key(done.request));
                // Safety: the generalized request this call started, completed once.
                unsafe { (pmpi().grequest_complete)(done.request) };
            }
            if until == Some(done.id) {
                return;
            }
            continue;
        }
        if !advanced && !block {
            return;
        }
    }
}

/// Makes every communicator's calls progress without blocking.
fn poll_all(st: &mut State) {
    let comms: Vec<usize> = st.comms.keys().copied().collect();
    for c in comms {
        progress(st, c, None);
    }
}

/// Counts a call handed to Open MPI unchanged.
fn pass(st: &mut State, entry: &'static str, why: &str) {
    *st.stats.passed.entry(why.to_string()).or_default() += 1;
    st.stats.table.count(entry, Way::Passed);
}

/// An allreduce: served (blocking when `request` is null, else started with a
/// generalized request written to `*request`), or `None` for Open MPI.
fn allreduce(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
    request: Option<*mut Request>,
) -> Option<c_int> {
    let mut guard = state();
    let st = guard.get_or_insert_with(State::default);
    let entry = if request.is_some() {
        "MPI_Iallreduce"
    } else {
        entry::current()
    };
    let (dtype, wire_op) = match served(count, datatype, op) {
        Ok(x) => x,
        Err(why) => {
            pass(st, entry, why);
            return None;
        }
    };
    st.next_id += 1;
    let id = st.next_id;
    if !matches!(comm_state(st, comm).path, Path::Switch(_)) {
        pass(st, entry, "the communicator is served by Open MPI");
        return None;
    }
    // Decided from the type signature (elements and their type), alike on every rank.
    let bytes = count as u64 * dtype.size() as u64;
    if !matches!(&comm_state(st, comm).path, Path::Switch(job) if job.route.takes(bytes)) {
        st.stats.routed += 1;
        st.stats.table.count(entry, Way::Routed);
        return None;
    }
    let Path::Switch(job) = &mut comm_state(st, comm).path else {
        unreachable!("checked")
    };
    let mut greq: Request = std::ptr::null_mut();
    if request.is_some() {
        // Safety: callbacks that touch nothing of the library's state.
        unsafe { (pmpi().grequest_start)(query, free, cancel, std::ptr::null_mut(), &mut greq) };
    }
    let args = Args {
        send,
        recv,
        count,
        datatype,
        op,
        dtype,
        wire_op,
    };
    let call = Call::start(job, id, greq, entry, &args);
    job.calls.push_back(call);
    match request {
        None => progress(st, key(comm), Some(id)),
        Some(out) => {
            st.requests.insert(key(greq), key(comm));
            progress(st, key(comm), None);
            // Safety: the program's request handle.
            unsafe { *out = greq };
        }
    }
    Some(SUCCESS)
}

unsafe extern "C" fn query(_extra: *mut c_void, status: *mut Status) -> c_int {
    let p = pmpi();
    // Safety: Open MPI's status for this request.
    unsafe {
        (p.status_set_elements)(status, handles().byte, 0);
        (p.status_set_cancelled)(status, 0);
        (*status).source = UNDEFINED;
        (*status).tag = UNDEFINED;
    }
    SUCCESS
}

unsafe extern "C" fn free(_extra: *mut c_void) -> c_int {
    SUCCESS
}

/// A collective cannot be cancelled (MPI says so): nothing to do.
unsafe extern "C" fn cancel(_extra: *mut c_void, _complete: c_int) -> c_int {
    SUCCESS
}

/// Runs a completion call over the program's requests `reqs` (`n` of them) and counts
/// this library's calls it handed back (their handles changed: freed or set to null) as
/// `MPI_Iallreduce by NAME`.
///
/// # Safety
/// `reqs` points to `n` requests, as for the completion call.
unsafe fn handing_back(
    name: &str,
    n: c_int,
    reqs: *mut Request,
    call: impl FnOnce() -> c_int,
) -> c_int {
    // Safety: the caller's array.
    let before: Vec<Request> = unsafe { requests(n, reqs) }.to_vec();
    let rc = call();
    let mut guard = state();
    if let Some(st) = guard.as_mut() {
        // Safety: the same array, after the call.
        let after = unsafe { requests(n, reqs) };
        for (b, a) in before.iter().zip(after) {
            if b != a {
                if let Some(way) = st.finished.remove(&key(*b)) {
                    st.stats
                        .table
                        .count(&format!("MPI_Iallreduce by {name}"), way);
                }
            }
        }
    }
    rc
}

/// Drives the calls behind the program's requests in `reqs` to completion.
fn complete_ours(reqs: &[Request]) {
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        return;
    };
    for r in reqs {
        if let Some(&comm) = st.requests.get(&key(*r)) {
            let id = match &st.comms.get(&comm).map(|c| &c.path) {
                Some(Path::Switch(job)) => job.calls.iter().find(|c| c.request == *r).map(|c| c.id),
                _ => None,
            };
            if let Some(id) = id {
                progress(st, comm, Some(id));
            }
        }
    }
}

/// Whether any of `reqs` is this library's (in flight, or done and not yet handed back).
fn any_ours(reqs: &[Request]) -> bool {
    let guard = state();
    guard.as_ref().is_some_and(|st| {
        reqs.iter()
            .any(|r| st.requests.contains_key(&key(*r)) || st.finished.contains_key(&key(*r)))
    })
}

fn poll() {
    if let Some(st) = state().as_mut() {
        poll_all(st);
    }
}

/// Leaves the communicator's job after its calls completed; frees the private duplicate.
fn retire(st: &mut State, comm: usize) {
    let calls: Vec<u64> = match st.comms.get(&comm).map(|c| &c.path) {
        Some(Path::Switch(job)) => job.calls.iter().map(|c| c.id).collect(),
        _ => Vec::new(),
    };
    if let Some(&last) = calls.last() {
        progress(st, comm, Some(last));
    }
    if let Some(c) = st.comms.remove(&comm) {
        if let Path::Switch(mut job) = c.path {
            // A rank still finishing a call from its peers may need this one's results:
            // nobody leaves before everybody is done.
            // Safety: our duplicate, every rank here together.
            unsafe { (pmpi().barrier)(job.private) };
            if let Err(e) = job.worker.leave() {
                if verbose() {
                    say(&format!("{} rank {}: leaving the job: {e}", c.name, c.rank));
                }
            }
            // Safety: our duplicate, freed together by every rank.
            unsafe { (pmpi().comm_free)(&mut job.private) };
        }
    }
}

/// Before `MPI_Finalize`: every job left, and the summary printed.
fn finalize() {
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        return;
    };
    let comms: Vec<usize> = st.comms.keys().copied().collect();
    for c in comms {
        retire(st, c);
    }
    let rank = world_rank();
    if rank == 0 || verbose() {
        let s = &st.stats;
        let passed: u64 = s.passed.values().sum();
        let mut reasons: Vec<_> = s.passed.iter().collect();
        reasons.sort();
        say(&format!(
            "rank {rank}: {} allreduces through the switch ({} bytes, {} finished from peers), {} made by Open MPI after the switch failed, {} made again by Open MPI for a flagged result (NaN, infinity, overflow), {} routed to Open MPI by size (XAGG_ROUTE), {passed} passed to Open MPI{}",
            s.switch_calls,
            s.switch_bytes,
            s.recovered_calls,
            s.fallback_calls,
            s.flagged_calls,
            s.routed,
            if reasons.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    reasons
                        .iter()
                        .map(|(why, n)| format!("{why}: {n}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        ));
        for line in s.table.lines() {
            say(&format!("rank {rank}: {line}"));
        }
    }
    *guard = None;
}

// ---- The C entry points. ----

#[no_mangle]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    // Safety: the program's arguments, passed on.
    let rc = unsafe { (pmpi().init)(argc, argv) };
    if verbose() {
        say(&format!(
            "rank {}: serving MPI_Allreduce, MPI_Iallreduce and MPI_Barrier through the switch",
            world_rank()
        ));
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    // Safety: the program's arguments, passed on.
    let rc = unsafe { (pmpi().init_thread)(argc, argv, required, provided) };
    if verbose() {
        say(&format!("rank {}: serving MPI_Allreduce, MPI_Iallreduce and MPI_Barrier through the switch (thread level {})", world_rank(), unsafe { *provided }));
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    guard(|| {
        let _entry = enter("MPI_Finalize");
        finalize();
        // Safety: passed on.
        unsafe { (pmpi().finalize)() }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Allreduce");
        allreduce(send, recv, count, datatype, op, comm, None).unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe { (pmpi().allreduce)(send, recv, count, datatype, op, comm) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Iallreduce");
        allreduce(send, recv, count, datatype, op, comm, Some(request)).unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe { (pmpi().iallreduce)(send, recv, count, datatype, op, comm, request) }
        })
    })
}

/// A barrier is an allreduce of one int: its result cannot come before every rank's
/// contribution.
#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: Comm) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Barrier");
        let mut one: c_int = 0;
        let h = handles();
        let op = h.op_sum;
        allreduce(
            IN_PLACE,
            (&mut one as *mut c_int).cast(),
            1,
            h.int,
            op,
            comm,
            None,
        )
        // Safety: passed on.
        .unwrap_or_else(|| unsafe { (pmpi().barrier)(comm) })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut Comm) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Comm_free");
        if let Some(st) = state().as_mut() {
            // Safety: the program's communicator handle.
            retire(st, key(unsafe { *comm }));
        }
        // Safety: passed on.
        unsafe { (pmpi().comm_free)(comm) }
    })
}

/// The program's requests as a slice.
///
/// # Safety
/// `reqs` points to `n` requests.
unsafe fn requests<'a>(n: c_int, reqs: *mut Request) -> &'a [Request] {
    if reqs.is_null() || n <= 0 {
        return &[];
    }
    // Safety: the caller's array of `n` requests.
    unsafe { std::slice::from_raw_parts(reqs, n as usize) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(req: *mut Request, status: *mut Status) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Wait");
        // Safety: the program's request.
        complete_ours(unsafe { requests(1, req) });
        unsafe { handing_back("MPI_Wait", 1, req, || (pmpi().wait)(req, status)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitall(n: c_int, reqs: *mut Request, statuses: *mut Status) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Waitall");
        // Safety: the program's requests.
        complete_ours(unsafe { requests(n, reqs) });
        unsafe {
            handing_back("MPI_Waitall", n, reqs, || {
                (pmpi().waitall)(n, reqs, statuses)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Request_free(req: *mut Request) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Request_free");
        // A freed request's call still completes: drive it here, while its buffers are
        // certainly alive.
        // Safety: the program's request.
        complete_ours(unsafe { requests(1, req) });
        unsafe { handing_back("MPI_Request_free", 1, req, || (pmpi().request_free)(req)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Test(
    req: *mut Request,
    flag: *mut c_int,
    status: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Test");
        poll();
        // Safety: passed on.
        unsafe { handing_back("MPI_Test", 1, req, || (pmpi().test)(req, flag, status)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testall(
    n: c_int,
    reqs: *mut Request,
    flag: *mut c_int,
    statuses: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Testall");
        poll();
        // Safety: passed on.
        unsafe {
            handing_back("MPI_Testall", n, reqs, || {
                (pmpi().testall)(n, reqs, flag, statuses)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testany(
    n: c_int,
    reqs: *mut Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Testany");
        poll();
        // Safety: passed on.
        unsafe {
            handing_back("MPI_Testany", n, reqs, || {
                (pmpi().testany)(n, reqs, index, flag, status)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testsome(
    n: c_int,
    reqs: *mut Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Testsome");
        poll();
        // Safety: passed on.
        unsafe {
            handing_back("MPI_Testsome", n, reqs, || {
                (pmpi().testsome)(n, reqs, outcount, indices, statuses)
            })
        }
    })
}

/// `MPI_Waitany` and `MPI_Waitsome` over a set holding this library's requests: test
/// both kinds in turn until one completes (Open MPI cannot wait on ours for us).
fn wait_polling(mut test: impl FnMut() -> (c_int, bool)) -> c_int {
    loop {
        poll();
        let (rc, done) = test();
        if rc != SUCCESS || done {
            return rc;
        }
        std::thread::yield_now();
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitany(
    n: c_int,
    reqs: *mut Request,
    index: *mut c_int,
    status: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Waitany");
        // Safety: the program's requests.
        if !any_ours(unsafe { requests(n, reqs) }) {
            return unsafe { (pmpi().waitany)(n, reqs, index, status) };
        }
        let wait = || {
            wait_polling(|| {
                let mut flag = 0;
                // Safety: passed on.
                let rc = unsafe { (pmpi().testany)(n, reqs, index, &mut flag, status) };
                (rc, flag != 0)
            })
        };
        // Safety: the program's requests.
        unsafe { handing_back("MPI_Waitany", n, reqs, wait) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitsome(
    n: c_int,
    reqs: *mut Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Waitsome");
        // Safety: the program's requests.
        if !any_ours(unsafe { requests(n, reqs) }) {
            return unsafe { (pmpi().waitsome)(n, reqs, outcount, indices, statuses) };
        }
        let wait = || {
            wait_polling(|| {
                // Safety: passed on.
                let rc = unsafe { (pmpi().testsome)(n, reqs, outcount, indices, statuses) };
                (rc, unsafe { *outcount } != 0)
            })
        };
        // Safety: the program's requests.
        unsafe { handing_back("MPI_Waitsome", n, reqs, wait) }
    })
}
