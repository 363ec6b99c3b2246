//! `libxagg_mpi.so`: preloaded under an unmodified Open MPI program (`mpirun -x
//! LD_PRELOAD=libxagg_mpi.so ...`), it serves `MPI_Allreduce`, `MPI_Iallreduce`,
//! `MPI_Barrier`, and reduce-scatter, all-gather, broadcast and reduce (blocking and
//! nonblocking) through the switch and hands everything else to Open MPI (`PMPI_`).
//!
//! - A communicator becomes a job at its first served call ([`comm`]): rank 0 draws the
//!   job's key and secret and broadcasts them, every rank joins through the daemon's
//!   network listener (`XAGG_DAEMON`), the first with the admission credential
//!   (`XAGG_CREDENTIAL`, its key in `XAGG_CREDENTIAL_FILE`). Ranks agree on the outcome; if any cannot join, Open MPI serves
//!   the communicator and rank 0 says why.
//! - Each call ([`call`]) goes to the switch, then the ranks agree it succeeded everywhere;
//!   otherwise Open MPI makes it again from the kept input.
//! - `MPI_Iallreduce` and the other nonblocking collectives return a generalized request; the completion calls (`MPI_Wait`,
//!   `MPI_Test`, their `all`/`any`/`some` forms, `MPI_Request_free`,
//!   `MPI_Request_get_status`) are wrapped so they make this library's requests progress,
//!   mixed with any of Open MPI's.
//! - Served: the types and ops of [`abi::Handles`] (C and Fortran), on intracommunicators
//!   of 2 to 64 ranks. Everything else goes to `PMPI_` unchanged.
//!
//! Each communicator's calls are serialized by its own lock, held across a blocking call:
//! MPI lets threads run collectives on different communicators at once (and in any
//! order), never on one. What the process shares (the communicators' table, requests,
//! the summary) is behind one lock held only briefly, never while waiting. No panic
//! crosses into C: one aborts the MPI job with a message instead.

// The entry points' safety contract is MPI's (the standard's rules on each call's
// arguments), not restated on each.
#![expect(clippy::missing_safety_doc, reason = "MPI's own contract applies")]

mod abi;
mod call;
mod comm;
mod entry;
mod error;
mod fortran;
mod layout;

use std::{
    collections::HashMap,
    ffi::{c_char, c_int, c_void},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

use abi::{handles, pmpi, Comm, Datatype, MpiOp, Request, Status, IN_PLACE, SUCCESS, UNDEFINED};
use call::{Args, Call, Kind, Phase, Taken};
use comm::{key, CommState, Path};
use entry::{enter, Way};
use xagg_common::wire::{self, Collective, DType, Op};

/// What the process did, for the summary at `MPI_Finalize`.
#[derive(Default)]
struct Stats {
    switch_calls: u64,
    switch_bytes: u64,
    /// The collectives besides allreduce the switch made (recovered included).
    other_switch_calls: u64,
    /// Allreduces, and the other collectives, made round a ring of hosts instead (a job
    /// with no aggregating switch): not the switch's, so not counted as its.
    ring_calls: u64,
    other_ring_calls: u64,
    /// Of the switch's calls, those finished with results from peers.
    recovered_calls: u64,
    /// Made by Open MPI because the switch's result was flagged (NaN, overflow).
    flagged_calls: u64,
    fallback_calls: u64,
    /// Calls handed to Open MPI unchanged, by reason.
    passed: HashMap<String, u64>,
    /// The entry points and reasons said so far (each said once).
    said: std::collections::HashSet<(&'static str, String)>,
    /// Calls handed to Open MPI for their size (`XAGG_ROUTE`): faster there.
    routed: u64,
    /// Every call by entry point and way.
    table: entry::Table,
    /// The communicators the switch served, by how they joined (switch, tree, ring).
    paths: std::collections::BTreeMap<String, u64>,
    /// The communicators Open MPI serves instead, by why (the join failed, one rank...).
    served_by_pmpi: std::collections::BTreeMap<String, u64>,
}

/// A communicator's state behind its own lock; `None` until its first served call.
type Slot = Arc<Mutex<Option<CommState>>>;

#[derive(Default)]
struct State {
    comms: HashMap<usize, Slot>,
    /// The program's generalized requests of calls in flight: their communicator.
    requests: HashMap<usize, usize>,
    /// The program's requests whose calls are done and not yet handed back by a completion
    /// call: how each was made (counted under the call that hands it back).
    finished: HashMap<usize, (&'static str, Way)>,
    stats: Stats,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Calls' ids, in the order they were made in this process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Runs `f` on what the process shares, under its lock (briefly: never across a wait).
fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(State::default))
}

/// Communicator `comm`'s slot, made empty if it has none.
fn slot(comm: usize) -> Slot {
    with_state(|st| st.comms.entry(comm).or_default().clone())
}

fn lock(slot: &Slot) -> MutexGuard<'_, Option<CommState>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
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
fn served(count: c_int, datatype: Datatype, op: MpiOp) -> Result<(DType, Op), String> {
    let h = handles();
    let dtype = h
        .dtype(datatype)
        .ok_or_else(|| format!("{}: {}", abi::type_name(datatype), layout::NOT_SERVED))?;
    let wire_op = h
        .op(op)
        .ok_or_else(|| format!("{}: an op the switch does not take", h.op_name(op)))?;
    if wire::lane(wire_op, dtype).is_none() {
        return Err(format!(
            "{} over {}: an op the switch does not take over this type",
            h.op_name(op),
            abi::type_name(datatype)
        ));
    }
    if count <= 0 {
        return Err("no elements".into());
    }
    Ok((dtype, wire_op))
}

/// A reason for the summary's count: without the list of what the switch takes.
fn short_reason(why: &str) -> &str {
    why.split(" (it takes ").next().unwrap_or(why)
}

/// Why `normalize` did not serve a call, naming the datatype where that is why.
fn unserved_layout(why: &'static str, datatype: Datatype, send: Option<Datatype>) -> String {
    if why != layout::NOT_SERVED {
        return why.into();
    }
    let culprit = match send {
        Some(t) if layout::of(datatype).is_ok() => t,
        _ => datatype,
    };
    format!("{}: {why}", abi::type_name(culprit))
}

/// Why a nonblocking call on a communicator not yet a job goes to Open MPI: making it one
/// takes collectives over it and the join, which wait for every rank, and a nonblocking
/// call may not wait (even ranks starting A's call first and odd ranks B's is legal MPI:
/// waiting there hung both). Every rank decides alike: a communicator becomes a job at the
/// same blocking call on each.
const FIRST_NONBLOCKING: &str = "a nonblocking call on a communicator that has not joined the switch (it joins at its first served blocking collective: joining waits for every rank, which a nonblocking call may not)";

/// The communicator's state, made at its first served (blocking) call (a collective over `comm`,
/// under its own lock only).
fn comm_state(slot: &mut Option<CommState>, comm: Comm) -> &mut CommState {
    slot.get_or_insert_with(|| {
        let c = comm::create(comm);
        match &c.path {
            Path::Pmpi(why) => {
                // Said once per reason (a program making a communicator per step, the
                // daemon unreachable, said it per communicator); the summary counts them.
                let first = with_state(|st| {
                    let n = st.stats.served_by_pmpi.entry(why.clone()).or_default();
                    *n += 1;
                    *n == 1
                });
                if (c.rank == 0 && !c.quiet && first) || verbose() {
                    let once = if verbose() {
                        ""
                    } else {
                        " (said once; the summary at MPI_Finalize counts the communicators)"
                    };
                    say(&format!(
                        "{}: collectives go to Open MPI: {why}{once}",
                        c.name
                    ));
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

/// The communicator's job, or `None` with the call passed to Open MPI saying why.
fn switch_job<'a>(c: &'a mut CommState, entry: &'static str) -> Option<&'a mut comm::Job> {
    match &mut c.path {
        Path::Switch(job) => Some(job),
        Path::Pmpi(why) => {
            // Said once for the communicator, by its rank 0 (`comm_state`): each entry
            // point is counted, and said only with XAGG_VERBOSE.
            let why = format!("the communicator is served by Open MPI: {why}");
            with_state(|st| pass_as(st, entry, &why, verbose()));
            None
        }
    }
}

/// Takes the communicator's calls as far as they go; with `until`, blocks until that call
/// is done (holding only this communicator's lock). Completed calls are counted and their
/// generalized requests completed.
fn progress(c: &mut CommState, until: Option<u64>) {
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
                    "{} rank {}: the switch failed, collectives go to Open MPI from now on: {}",
                    c.name,
                    c.rank,
                    job.failed.as_deref().unwrap_or_default()
                ));
            }
            for later in job.calls.iter().skip(1) {
                later.cancel_switch();
            }
            // The job's slots are of no use to this communicator any more.
            job.worker.leave_soon();
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
            // A ring's calls are in the table's switch column (the paths line says how the
            // communicator ran) but not in the headline's switch count.
            let ring = job.worker.params().path == xagg_worker::Path::Ring;
            let way = match done.taken {
                Some(Taken::Switch) => Way::Switch,
                Some(Taken::Recovered) => Way::Recovered,
                Some(Taken::Flagged) => Way::Flagged,
                _ => Way::Fallback,
            };
            with_state(|st| {
                if done.request.is_null() {
                    st.stats.table.count(done.entry, way);
                } else {
                    st.finished.insert(key(done.request), (done.entry, way));
                    st.requests.remove(&key(done.request));
                }
                // The summary's headline counts allreduces (and the other collectives the
                // switch made); every call is in the table.
                let made = matches!(done.taken, Some(Taken::Switch | Taken::Recovered));
                if done.kind != Kind::Allreduce {
                    match made {
                        true if ring => st.stats.other_ring_calls += 1,
                        true => st.stats.other_switch_calls += 1,
                        false => {}
                    }
                    return;
                }
                if made && ring {
                    st.stats.ring_calls += 1;
                    return;
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
            });
            if !done.request.is_null() {
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

/// Makes every communicator's calls progress without blocking (one another thread is in
/// is left to that thread).
fn poll_all() {
    let slots: Vec<Slot> = with_state(|st| st.comms.values().cloned().collect());
    for slot in slots {
        if let Ok(mut c) = slot.try_lock() {
            if let Some(c) = c.as_mut() {
                progress(c, None);
            }
        }
    }
}

/// Counts a call handed to Open MPI unchanged; says why the first time for each reason.
fn pass(st: &mut State, entry: &'static str, why: &str) {
    pass_as(st, entry, why, true)
}

/// [`pass`], saying why only if `say_it`.
fn pass_as(st: &mut State, entry: &'static str, why: &str, say_it: bool) {
    *st.stats.passed.entry(why.to_string()).or_default() += 1;
    if st.stats.said.insert((entry, why.to_string())) && say_it {
        say(&format!(
            "rank {}: {entry} goes to Open MPI: {why} (said once; the summary at MPI_Finalize counts them)",
            world_rank()
        ));
    }
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
    let entry = if request.is_some() {
        "MPI_Iallreduce"
    } else {
        entry::current()
    };
    let normal = match layout::normalize(layout::Given {
        kind: Kind::Allreduce,
        send,
        recv,
        count,
        datatype,
        send_side: None,
        counts: None,
        root: 0,
        comm,
    }) {
        Ok(n) => n,
        Err(why) => {
            with_state(|st| pass(st, entry, &unserved_layout(why, datatype, None)));
            return None;
        }
    };
    let (send, recv, count, datatype) = (normal.send, normal.recv, normal.count, normal.element);
    let (dtype, wire_op) = match served(count, datatype, op) {
        Ok(x) => x,
        Err(why) => {
            with_state(|st| pass(st, entry, &why));
            return None;
        }
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let slot = slot(key(comm));
    let mut guard = lock(&slot);
    if request.is_some() && guard.is_none() {
        with_state(|st| pass(st, entry, FIRST_NONBLOCKING));
        return None;
    }
    let c = comm_state(&mut guard, comm);
    let rank = c.rank;
    let job = switch_job(c, entry)?;
    if !job.float_sums && matches!(dtype, DType::F32 | DType::F64) && wire_op == Op::Sum {
        with_state(|st| {
            pass(
                st,
                entry,
                "float sums go to Open MPI (rank 0's XAGG_FLOAT=none)",
            )
        });
        return None;
    }
    // Decided from the type signature (elements and their type), alike on every rank.
    let bytes = count as u64 * dtype.size() as u64;
    if !job.route.takes(Collective::Allreduce, Some(dtype), bytes) {
        with_state(|st| {
            st.stats.routed += 1;
            st.stats.table.count(entry, Way::Routed);
        });
        return None;
    }
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
        kind: Kind::Allreduce,
        root: 0,
        rank,
        size: job.size,
        counts: None,
        stage: normal.stage,
    };
    let call = Call::start(job, id, greq, entry, args);
    job.calls.push_back(call);
    match request {
        None => progress(c, Some(id)),
        Some(out) => {
            with_state(|st| st.requests.insert(key(greq), key(comm)));
            progress(c, None);
            // Safety: the program's request handle.
            unsafe { *out = greq };
        }
    }
    Some(SUCCESS)
}

/// A collective other than allreduce: served, or `None` for Open MPI; with `request`, a
/// nonblocking one, whose generalized request is written there. `count` as [`Args`]
/// says; `op` is ignored by an all-gather and a broadcast, which move bytes (their type
/// must still be one the switch takes).
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    root: c_int,
    comm: Comm,
    (request, counts): (Option<*mut Request>, Option<Vec<c_int>>),
    send_side: Option<(c_int, Datatype)>,
) -> Option<c_int> {
    let entry = entry::current();
    let moves = matches!(kind, Kind::Allgather | Kind::Bcast);
    let op = if moves { handles().op_sum } else { op };
    let normal = match layout::normalize(layout::Given {
        kind,
        send,
        recv,
        count,
        datatype,
        send_side,
        counts,
        root,
        comm,
    }) {
        Ok(n) => n,
        Err(why) => {
            let why = unserved_layout(why, datatype, send_side.map(|(_, t)| t));
            with_state(|st| pass(st, entry, &why));
            return None;
        }
    };
    let (send, recv, count, datatype, counts) = (
        normal.send,
        normal.recv,
        normal.count,
        normal.element,
        normal.counts,
    );
    let (dtype, wire_op) = match served(count, datatype, op) {
        Ok(x) => x,
        Err(why) => {
            with_state(|st| pass(st, entry, &why));
            return None;
        }
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let slot = slot(key(comm));
    let mut guard = lock(&slot);
    if request.is_some() && guard.is_none() {
        with_state(|st| pass(st, entry, FIRST_NONBLOCKING));
        return None;
    }
    let c = comm_state(&mut guard, comm);
    let rank = c.rank;
    let job = switch_job(c, entry)?;
    if matches!(kind, Kind::Bcast | Kind::Reduce) && !(0..job.size).contains(&root) {
        // Open MPI says what is wrong with it.
        with_state(|st| pass(st, entry, "a root that is not a rank"));
        return None;
    }
    if !moves && !job.float_sums && matches!(dtype, DType::F32 | DType::F64) && wire_op == Op::Sum {
        with_state(|st| {
            pass(
                st,
                entry,
                "float sums go to Open MPI (rank 0's XAGG_FLOAT=none)",
            )
        });
        return None;
    }
    let block = count as u64 * dtype.size() as u64;
    let bytes = match kind {
        Kind::ReduceScatter | Kind::Allgather => block * job.size as u64,
        _ => block,
    };
    if moves && !job.any_bytes && bytes % 4 != 0 {
        with_state(|st| {
            pass(
                st,
                entry,
                "on a ring of hosts it moves 4-byte words, and its bytes are not a whole number of them",
            )
        });
        return None;
    }
    // Decided from the type signature, alike on every rank (the collective's route).
    if !job.route.takes(kind.collective(), Some(dtype), bytes) {
        with_state(|st| {
            st.stats.routed += 1;
            st.stats.table.count(entry, Way::Routed);
        });
        return None;
    }
    let args = Args {
        send,
        recv,
        count,
        datatype,
        op,
        dtype,
        wire_op,
        kind,
        root,
        rank,
        size: job.size,
        counts,
        stage: normal.stage,
    };
    let mut greq: Request = std::ptr::null_mut();
    if request.is_some() {
        // Safety: callbacks that touch nothing of the library's state.
        unsafe { (pmpi().grequest_start)(query, free, cancel, std::ptr::null_mut(), &mut greq) };
    }
    let call = Call::start(job, id, greq, entry, args);
    job.calls.push_back(call);
    match request {
        None => progress(c, Some(id)),
        Some(out) => {
            with_state(|st| st.requests.insert(key(greq), key(comm)));
            progress(c, None);
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
/// `ENTRY by NAME` (`MPI_Iallreduce by MPI_Wait`).
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
    // Safety: the same array, after the call.
    let after = unsafe { requests(n, reqs) };
    with_state(|st| {
        for (b, a) in before.iter().zip(after) {
            if b != a {
                if let Some((entry, way)) = st.finished.remove(&key(*b)) {
                    st.stats.table.count(&format!("{entry} by {name}"), way);
                }
            }
        }
    });
    rc
}

/// Drives the calls behind the program's requests in `reqs` to completion.
fn complete_ours(reqs: &[Request]) {
    for r in reqs {
        let Some(slot) = with_state(|st| {
            let comm = st.requests.get(&key(*r))?;
            st.comms.get(comm).cloned()
        }) else {
            continue;
        };
        let mut guard = lock(&slot);
        let Some(c) = guard.as_mut() else {
            continue;
        };
        let id = match &c.path {
            Path::Switch(job) => job.calls.iter().find(|c| c.request == *r).map(|c| c.id),
            Path::Pmpi(_) => None,
        };
        if let Some(id) = id {
            progress(c, Some(id));
        }
    }
}

/// Whether any of `reqs` is this library's (in flight, or done and not yet handed back).
fn any_ours(reqs: &[Request]) -> bool {
    with_state(|st| {
        reqs.iter()
            .any(|r| st.requests.contains_key(&key(*r)) || st.finished.contains_key(&key(*r)))
    })
}

/// Leaves the communicator's job after its calls completed (in `during`: `MPI_Comm_free`
/// or `MPI_Finalize`); frees the private duplicate.
fn retire(comm: usize, during: &str) {
    let Some(slot) = with_state(|st| st.comms.remove(&comm)) else {
        return;
    };
    let Some(mut c) = lock(&slot).take() else {
        return;
    };
    let last = match &c.path {
        Path::Switch(job) => job.calls.back().map(|c| c.id),
        Path::Pmpi(_) => None,
    };
    if let Some(last) = last {
        progress(&mut c, Some(last));
    }
    if let Path::Switch(mut job) = c.path {
        let p = job.worker.params();
        let how = p.path.joined(p.path_why.as_deref());
        with_state(|st| *st.stats.paths.entry(how).or_default() += 1);
        // A rank still finishing a call from its peers may need this one's results:
        // nobody leaves before everybody is done. A peer that waits at the switch for a
        // call this rank will never make meanwhile hears why when it asks.
        job.worker.elsewhere(Some(format!(
            "it is in {during}: it makes no more calls on {}",
            c.name
        )));
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

/// Open MPI's `call` of a blocking collective `entry` on `comm` that the switch did not
/// take. Meanwhile a peer that the switch keeps waiting for this rank's next call there
/// hears why when it asks this rank (the ranks' calls differ: one rank's went to Open MPI
/// and the others' to the switch, each waiting for the other for ever), and fails at the
/// give-up time naming it, instead of at the collective timeout.
fn by_pmpi(comm: Comm, entry: &str, call: impl FnOnce() -> c_int) -> c_int {
    let slot = with_state(|st| st.comms.get(&key(comm)).cloned());
    let mark = |why: Option<String>| {
        let Some(slot) = &slot else { return };
        if let Some(CommState {
            path: Path::Switch(job),
            ..
        }) = lock(slot).as_ref()
        {
            job.worker.elsewhere(why);
        }
    };
    mark(Some(format!(
        "it made this call with Open MPI instead ({entry}): the ranks' calls differ (another count, type, op, root or collective), and every rank must make the same calls"
    )));
    let rc = call();
    mark(None);
    rc
}

/// Before `MPI_Finalize`: every job left, and the summary printed.
fn finalize() {
    // Retiring waits for the communicator's ranks: every rank retires in the order its
    // communicators were made jobs (a map's order differs by process, and the ranks of two
    // communicators left unfreed then waited for each other on different ones for ever).
    let slots: Vec<(usize, Slot)> =
        with_state(|st| st.comms.iter().map(|(c, s)| (*c, s.clone())).collect());
    let mut comms: Vec<(u64, usize)> = slots
        .iter()
        .map(|(c, s)| (lock(s).as_ref().map_or(u64::MAX, |st| st.made), *c))
        .collect();
    comms.sort_unstable();
    for (_, c) in comms {
        retire(c, "MPI_Finalize");
    }
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(st) = guard.as_mut() else {
        return;
    };
    let rank = world_rank();
    if rank == 0 || verbose() {
        let s = &st.stats;
        let passed: u64 = s.passed.values().sum();
        let mut reasons: Vec<_> = s.passed.iter().collect();
        reasons.sort();
        say(&format!(
            "rank {rank}: {} allreduces through the switch ({} bytes, {} finished from peers){}, {} made by Open MPI after the switch failed, {} made again by Open MPI for a flagged result (NaN, infinity, or values too far apart for the exact lanes); of every collective, {} routed to Open MPI by size (XAGG_ROUTE), {passed} passed to Open MPI{}; {} other collectives through the switch (reduce-scatters, all-gathers, broadcasts, reduces: their lines below)",
            s.switch_calls,
            s.switch_bytes,
            s.recovered_calls,
            if s.ring_calls + s.other_ring_calls > 0 {
                format!(
                    ", {} allreduces and {} other collectives round a ring of hosts (no switch aggregated them)",
                    s.ring_calls, s.other_ring_calls
                )
            } else {
                String::new()
            },
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
                        // The list of what the switch takes was said with the first.
                        .map(|(why, n)| format!("{}: {n}", short_reason(why)))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            },
            s.other_switch_calls,
        ));
        for (how, n) in &s.paths {
            say(&format!("rank {rank}: communicators served: {n} {how}"));
        }
        for (why, n) in &s.served_by_pmpi {
            say(&format!(
                "rank {rank}: communicators served by Open MPI: {n} ({why})"
            ));
        }
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
            "rank {}: serving MPI_Allreduce, MPI_Iallreduce, MPI_Barrier, and reduce-scatter, all-gather, broadcast and reduce (blocking and nonblocking) through the switch",
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
        say(&format!("rank {}: serving MPI_Allreduce, MPI_Iallreduce, MPI_Barrier, and reduce-scatter, all-gather, broadcast and reduce (blocking and nonblocking) through the switch (thread level {})", world_rank(), unsafe { *provided }));
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
            by_pmpi(comm, "MPI_Allreduce", || unsafe {
                (pmpi().allreduce)(send, recv, count, datatype, op, comm)
            })
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

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Reduce_scatter_block");
        collective(
            Kind::ReduceScatter,
            send,
            recv,
            count,
            datatype,
            op,
            0,
            comm,
            (None, None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            by_pmpi(comm, "MPI_Reduce_scatter_block", || unsafe {
                (pmpi().reduce_scatter_block)(send, recv, count, datatype, op, comm)
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_block(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Ireduce_scatter_block");
        collective(
            Kind::ReduceScatter,
            send,
            recv,
            count,
            datatype,
            op,
            0,
            comm,
            (Some(request), None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe {
                (pmpi().ireduce_scatter_block)(send, recv, count, datatype, op, comm, request)
            }
        })
    })
}

/// Served for any counts: unequal ones as a reduce-scatter of blocks of the largest, each
/// rank's part padded ([`call`]).
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    counts: *const c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Reduce_scatter");
        reduce_scatter(send, recv, counts, datatype, op, comm, None).unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            by_pmpi(comm, "MPI_Reduce_scatter", || unsafe {
                (pmpi().reduce_scatter)(send, recv, counts, datatype, op, comm)
            })
        })
    })
}

/// [`MPI_Reduce_scatter`], nonblocking.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    counts: *const c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Ireduce_scatter");
        reduce_scatter(send, recv, counts, datatype, op, comm, Some(request)).unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe { (pmpi().ireduce_scatter)(send, recv, counts, datatype, op, comm, request) }
        })
    })
}

/// A reduce-scatter of per-rank `counts`, through the switch as blocks of the largest
/// count (unequal ones padded); with `request`, nonblocking. `None`: not served (negative
/// counts included: Open MPI says what is wrong with them).
fn reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    counts: *const c_int,
    datatype: Datatype,
    op: MpiOp,
    comm: Comm,
    request: Option<*mut Request>,
) -> Option<c_int> {
    let mut size: c_int = 0;
    // Safety: the program's communicator; its counts, one per rank.
    let counts_of = unsafe {
        (pmpi().comm_size)(comm, &mut size);
        std::slice::from_raw_parts(counts, size.max(0) as usize)
    };
    let equal = counts_of.windows(2).all(|w| w[0] == w[1]);
    match counts_of.iter().copied().max() {
        Some(_) if counts_of.iter().any(|&c| c < 0) => None,
        Some(count) => collective(
            Kind::ReduceScatter,
            send,
            recv,
            count,
            datatype,
            op,
            0,
            comm,
            (request, (!equal).then(|| counts_of.to_vec())),
            None,
        ),
        None => None,
    }
}

/// An all-gather, served when each rank sends what it receives from each (the same count
/// and type); with `request`, nonblocking.
#[allow(clippy::too_many_arguments)]
fn allgather(
    send: *const c_void,
    send_count: c_int,
    send_type: Datatype,
    recv: *mut c_void,
    recv_count: c_int,
    recv_type: Datatype,
    comm: Comm,
    request: Option<*mut Request>,
) -> Option<c_int> {
    // The send side may be another datatype of the same signature (checked in elements).
    collective(
        Kind::Allgather,
        send,
        recv,
        recv_count,
        recv_type,
        handles().op_sum,
        0,
        comm,
        (request, None),
        (send != IN_PLACE).then_some((send_count, send_type)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    send: *const c_void,
    send_count: c_int,
    send_type: Datatype,
    recv: *mut c_void,
    recv_count: c_int,
    recv_type: Datatype,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Allgather");
        let served = allgather(
            send, send_count, send_type, recv, recv_count, recv_type, comm, None,
        );
        served.unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            by_pmpi(comm, "MPI_Allgather", || unsafe {
                (pmpi().allgather)(
                    send, send_count, send_type, recv, recv_count, recv_type, comm,
                )
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgather(
    send: *const c_void,
    send_count: c_int,
    send_type: Datatype,
    recv: *mut c_void,
    recv_count: c_int,
    recv_type: Datatype,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Iallgather");
        let served = allgather(
            send,
            send_count,
            send_type,
            recv,
            recv_count,
            recv_type,
            comm,
            Some(request),
        );
        served.unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe {
                (pmpi().iallgather)(
                    send, send_count, send_type, recv, recv_count, recv_type, comm, request,
                )
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast(
    buffer: *mut c_void,
    count: c_int,
    datatype: Datatype,
    root: c_int,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Bcast");
        collective(
            Kind::Bcast,
            buffer,
            buffer,
            count,
            datatype,
            handles().op_sum,
            root,
            comm,
            (None, None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            by_pmpi(comm, "MPI_Bcast", || unsafe {
                (pmpi().bcast)(buffer, count, datatype, root, comm)
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ibcast(
    buffer: *mut c_void,
    count: c_int,
    datatype: Datatype,
    root: c_int,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Ibcast");
        collective(
            Kind::Bcast,
            buffer,
            buffer,
            count,
            datatype,
            handles().op_sum,
            root,
            comm,
            (Some(request), None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe { (pmpi().ibcast)(buffer, count, datatype, root, comm, request) }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    root: c_int,
    comm: Comm,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Reduce");
        collective(
            Kind::Reduce,
            send,
            recv,
            count,
            datatype,
            op,
            root,
            comm,
            (None, None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            by_pmpi(comm, "MPI_Reduce", || unsafe {
                (pmpi().reduce)(send, recv, count, datatype, op, root, comm)
            })
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce(
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    datatype: Datatype,
    op: MpiOp,
    root: c_int,
    comm: Comm,
    request: *mut Request,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Ireduce");
        collective(
            Kind::Reduce,
            send,
            recv,
            count,
            datatype,
            op,
            root,
            comm,
            (Some(request), None),
            None,
        )
        .unwrap_or_else(|| {
            // Safety: the program's arguments, passed on.
            unsafe { (pmpi().ireduce)(send, recv, count, datatype, op, root, comm, request) }
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
        .unwrap_or_else(|| by_pmpi(comm, "MPI_Barrier", || unsafe { (pmpi().barrier)(comm) }))
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut Comm) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Comm_free");
        // Safety: the program's communicator handle.
        retire(key(unsafe { *comm }), "MPI_Comm_free");
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
        poll_all();
        // Safety: passed on.
        unsafe { handing_back("MPI_Test", 1, req, || (pmpi().test)(req, flag, status)) }
    })
}

/// Asks without handing the request back: this library's calls progress first, or a
/// program polling with it alone would never see them complete.
#[no_mangle]
pub unsafe extern "C" fn MPI_Request_get_status(
    req: Request,
    flag: *mut c_int,
    status: *mut Status,
) -> c_int {
    guard(|| {
        let _entry = enter("MPI_Request_get_status");
        poll_all();
        // Safety: passed on.
        unsafe { (pmpi().request_get_status)(req, flag, status) }
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
        poll_all();
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
        poll_all();
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
        poll_all();
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
        poll_all();
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
