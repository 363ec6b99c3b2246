//! A communicator as a job: made at its first served call, collectively, and left when the
//! communicator is freed or MPI finalizes.
//!
//! Every decision is taken together through `PMPI_` on a private duplicate of the
//! communicator (so these collectives never interleave with the program's own): whether
//! the job can be made (the settings, the communicator's size), the job's key and secret
//! (rank 0 draws them and broadcasts them), whether every rank joined, and every rank's
//! peer responder (where results are recovered from when the switch stops answering,
//! [`crate::call`]). Calls themselves take no collective of Open MPI's unless they fall
//! back.

use std::{
    collections::VecDeque,
    ffi::{c_int, c_void},
    net::{SocketAddr, SocketAddrV4},
};

use xagg_common::wire::Float;
use xagg_worker::{
    route::{Other, Route},
    JobKey, JoinSettings, Placement, Secret, Worker,
};

use crate::{
    abi::{handles, pmpi, Comm, SUCCESS},
    call::Call,
    error::Error,
};

/// How a communicator's allreduces are made.
pub enum Path {
    /// Through the switch, as this job.
    Switch(Job),
    /// By Open MPI, for the reason given (decided together when the communicator was
    /// first used).
    Pmpi(String),
}

/// A communicator's job.
pub struct Job {
    pub worker: Worker,
    /// The private duplicate of the communicator that carries this library's own
    /// collectives: agreements and fallbacks.
    pub private: Comm,
    /// Set once an allreduce failed at the switch: every later call still agrees, and is
    /// made by Open MPI.
    pub failed: Option<String>,
    /// Served calls in the order they were made (the same on every rank).
    pub calls: VecDeque<Call>,
    /// Buffers that kept finished calls' in-place inputs, for the next ones.
    pub spares: Vec<Vec<u8>>,
    /// Which calls go to the switch, by size (rank 0's `XAGG_ROUTE`).
    pub route: Route,
    /// Whether float sums take the switch (rank 0's `XAGG_FLOAT` is not `none`).
    pub float_sums: bool,
    /// Whether the collectives other than allreduce take the levels as they are (every
    /// rank the switch's own member, or a tree of hosts); if not (a ring of hosts) each is
    /// made as an allreduce, and all-gather and broadcast move 4-byte words. Agreed by
    /// every rank.
    pub any_bytes: bool,
    /// The communicator's size.
    pub size: c_int,
}

// Safety: `private` is an MPI handle, used only under the library's lock.
unsafe impl Send for Job {}

/// A communicator this library has seen.
pub struct CommState {
    pub path: Path,
    pub rank: c_int,
    pub name: String,
    /// Open MPI serves it for a reason nobody needs told (a communicator of one rank).
    pub quiet: bool,
    /// Its place in the order this process made its communicators' states in: the order
    /// of their first served collectives, the same on every rank of any two of them.
    pub made: u64,
}

/// The next [`CommState::made`].
static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn rank_size(comm: Comm) -> (c_int, c_int) {
    let (mut rank, mut size) = (0, 0);
    // Safety: a communicator the program passed to a collective.
    unsafe {
        (pmpi().comm_rank)(comm, &mut rank);
        (pmpi().comm_size)(comm, &mut size);
    }
    (rank, size)
}

/// Agrees on `local` over `comm`: `Ok` when every rank's is, else the first failing rank
/// and its reason (every rank learns both).
pub fn agree(comm: Comm, local: Result<(), &Error>) -> Result<(), Error> {
    let (rank, size) = rank_size(comm);
    let h = handles();
    let p = pmpi();
    let mine: c_int = if local.is_err() { rank } else { size };
    let mut first: c_int = size;
    // Safety: one int each way over a communicator every rank passes here together.
    unsafe {
        (p.allreduce)(
            (&mine as *const c_int).cast(),
            (&mut first as *mut c_int).cast(),
            1,
            h.int,
            op_min(),
            comm,
        )
    };
    if first == size {
        return Ok(());
    }
    let mut text = [0u8; 512];
    if let Err(e) = local {
        let e = e.to_string();
        let b = e.as_bytes();
        let n = b.len().min(text.len() - 1);
        text[..n].copy_from_slice(&b[..n]);
    }
    // Safety: as above, a fixed-size byte buffer from the first failing rank.
    unsafe {
        (p.bcast)(
            text.as_mut_ptr().cast(),
            text.len() as c_int,
            h.byte,
            first,
            comm,
        )
    };
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Err(Error::Rank {
        rank: first,
        reason: String::from_utf8_lossy(&text[..end]).into_owned(),
    })
}

/// `MPI_MIN`.
pub fn op_min() -> crate::abi::MpiOp {
    handles().op_min
}

/// The smallest of every rank's `mine` over `comm` (collective).
fn smallest(comm: Comm, mine: usize) -> usize {
    let mine = mine as c_int;
    let mut least: c_int = mine;
    // Safety: one int each way over a communicator every rank passes here together.
    unsafe {
        (pmpi().allreduce)(
            (&mine as *const c_int).cast(),
            (&mut least as *mut c_int).cast(),
            1,
            handles().int,
            op_min(),
            comm,
        )
    };
    least as usize
}

/// The communicator's description in messages.
fn describe(comm: Comm, size: c_int) -> String {
    // Open MPI's name: `MPI_COMM_WORLD`, `MPI_COMM_SELF`, `MPI COMMUNICATOR 4 SPLIT FROM 0`,
    // or the program's own (`MPI_Comm_set_name`). MPI_MAX_OBJECT_NAME is 64 there.
    let mut buf = [0 as std::ffi::c_char; 256];
    let mut len: c_int = 0;
    // Safety: a buffer longer than any name Open MPI writes.
    let rc = unsafe { (pmpi().comm_get_name)(comm, buf.as_mut_ptr(), &mut len) };
    let name = if rc == SUCCESS && len > 0 {
        // Safety: Open MPI wrote a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else if comm == handles().comm_world {
        "MPI_COMM_WORLD".into()
    } else {
        // Its place among the communicators this process made jobs of or tried to: an
        // address would mean nothing to the reader.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("communicator #{n} of those the program served collectives on (unnamed: MPI_Comm_set_name names it)")
    };
    let ranks = if size == 1 { "rank" } else { "ranks" };
    format!("{name} ({size} {ranks})")
}

/// Makes `comm` a job, or decides together that Open MPI serves it. Collective: every
/// rank of `comm` calls it at its first served call there.
pub fn create(comm: Comm) -> CommState {
    let p = pmpi();
    let (rank, size) = rank_size(comm);
    let name = describe(comm, size);
    let mut inter = 0;
    // Safety: a communicator the program passed to a collective.
    unsafe { (p.comm_test_inter)(comm, &mut inter) };
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let state = |path| CommState {
        path,
        rank,
        name: name.clone(),
        // One rank has nothing to reduce with: no news worth a line by default.
        quiet: size < 2,
        made,
    };
    if inter != 0 {
        // The same answer on every rank: no agreement needed.
        return state(Path::Pmpi("an intercommunicator".into()));
    }
    if size < 2 {
        return state(Path::Pmpi(
            "a communicator of one rank (a job has 2 ranks or more)".into(),
        ));
    }
    let mut private: Comm = std::ptr::null_mut();
    // Safety: collective over `comm`, at the same call on every rank.
    if unsafe { (p.comm_dup)(comm, &mut private) } != SUCCESS {
        return state(Path::Pmpi("MPI_Comm_dup failed".into()));
    }
    let fail = |private: &mut Comm, why: String| {
        // Safety: our own duplicate, freed together by every rank.
        unsafe { (p.comm_free)(private) };
        Path::Pmpi(why)
    };
    let settings = JoinSettings::from_env().map_err(Error::from);
    let settings = match agree(private, settings.as_ref().map(|_| ())) {
        Ok(()) => settings.expect("agreed"),
        Err(e) => return state(fail(&mut private, e.to_string())),
    };
    // Rank 0 draws the job's key and secret; every rank gets them.
    let mut secrets = [0u8; 48];
    if rank == 0 {
        secrets[..16].copy_from_slice(&JobKey::random().0);
        secrets[16..].copy_from_slice(&Secret::random().0);
    }
    // Safety: 48 bytes from rank 0 over our duplicate.
    unsafe { (p.bcast)(secrets.as_mut_ptr().cast(), 48, handles().byte, 0, private) };
    let route = shared_setting(private, rank, "XAGG_ROUTE");
    // Exact float sums unless rank 0 says otherwise: the fast lane may lose an element
    // far smaller than its segment's largest, which Open MPI's sum keeps.
    let float = xagg_worker::float_mode(
        Some(&shared_setting(private, rank, "XAGG_FLOAT")),
        Float::Exact,
    )
    .map_err(|e| format!("rank 0's {e}"));
    let (float, float_sums) = match float {
        Ok(f) => (f.unwrap_or(Float::Exact), f.is_some()),
        Err(why) => return state(fail(&mut private, why)),
    };
    // The route of a float allreduce depends on how float sums travel.
    let route = Route::parse(Some(&route), size as usize, Other::OpenMpi, float)
        .map_err(|e| format!("rank 0's {e}"));
    let route = match route {
        Ok(r) => r,
        Err(why) => return state(fail(&mut private, why)),
    };
    let key = JobKey(secrets[..16].try_into().expect("16 bytes"));
    let secret = Secret(secrets[16..].try_into().expect("32 bytes"));
    // The segment every rank's path carries: the smallest of the ranks' own (their
    // interfaces' MTUs and their daemons' ports').
    let segment = settings.segment_bytes().map_err(Error::from);
    if let Err(e) = agree(private, segment.as_ref().map(|_| ())) {
        return state(fail(&mut private, e.to_string()));
    }
    let settings = JoinSettings {
        segment: Some(smallest(private, segment.expect("agreed"))),
        float,
        ..settings
    };
    let joined = daemons(private, settings.daemon, size)
        .and_then(|all| Ok(Placement::by_daemon(&all, rank as usize)?))
        .and_then(|placed| Ok(settings.join(key, secret, &placed)?))
        .and_then(|w| {
            let at = w.serve_peers(&secret)?;
            Ok((w, at))
        });
    let local = joined.as_ref().map(|_| ());
    match agree(private, local) {
        Ok(()) => {
            let (worker, at) = joined.expect("agreed");
            worker.set_peers(rank as usize, responders(private, at, size));
            let not_ring = worker.params().path != xagg_worker::Path::Ring;
            let any_bytes = smallest(private, not_ring as usize) == 1;
            state(Path::Switch(Job {
                worker,
                private,
                failed: None,
                calls: VecDeque::new(),
                spares: Vec::new(),
                route,
                float_sums,
                any_bytes,
                size,
            }))
        }
        Err(e) => {
            if let Ok((w, _)) = joined {
                let _ = w.leave();
            }
            state(fail(&mut private, e.to_string()))
        }
    }
}

/// Rank 0's value of the environment variable `name` (empty if unset), read alike by every
/// rank. Collective over `comm`.
fn shared_setting(comm: Comm, rank: c_int, name: &str) -> String {
    const LEN: usize = 256;
    let mut text = [0u8; LEN];
    if rank == 0 {
        let v = std::env::var(name).unwrap_or_default();
        let n = v.len().min(LEN - 1);
        text[..n].copy_from_slice(&v.as_bytes()[..n]);
    }
    // Safety: LEN bytes from rank 0 over our duplicate, every rank here.
    unsafe {
        (pmpi().bcast)(
            text.as_mut_ptr().cast(),
            LEN as c_int,
            handles().byte,
            0,
            comm,
        )
    };
    let end = text.iter().position(|&b| b == 0).unwrap_or(LEN);
    String::from_utf8_lossy(&text[..end]).into_owned()
}

/// Every rank's peer responder, in rank order. Collective over `comm`.
fn responders(comm: Comm, mine: SocketAddrV4, size: c_int) -> Vec<SocketAddrV4> {
    let mut all = vec![[0u8; 6]; size as usize];
    let mut me = [0u8; 6];
    me[..4].copy_from_slice(&mine.ip().octets());
    me[4..].copy_from_slice(&mine.port().to_le_bytes());
    // Safety: 6 bytes from each rank into 6·size, over our duplicate, every rank here.
    unsafe {
        (pmpi().allgather)(
            me.as_ptr().cast(),
            6,
            handles().byte,
            all.as_mut_ptr().cast(),
            6,
            handles().byte,
            comm,
        )
    };
    all.iter()
        .map(|b| {
            SocketAddrV4::new(
                [b[0], b[1], b[2], b[3]].into(),
                u16::from_le_bytes([b[4], b[5]]),
            )
        })
        .collect()
}

/// Every rank's daemon (`XAGG_DAEMON`, which each host sets to its own), in rank order:
/// ranks at one daemon are one host's, reduced there first ([`Placement::by_daemon`]).
/// Collective over `comm`.
fn daemons(comm: Comm, mine: SocketAddr, size: c_int) -> Result<Vec<SocketAddr>, Error> {
    const LEN: usize = 64;
    let mut text = [0u8; LEN];
    let s = mine.to_string();
    text[..s.len()].copy_from_slice(s.as_bytes());
    let mut all = vec![0u8; LEN * size as usize];
    // Safety: LEN bytes from each rank into LEN·size, over our duplicate, every rank here.
    unsafe {
        (pmpi().allgather)(
            text.as_ptr().cast(),
            LEN as c_int,
            handles().byte,
            all.as_mut_ptr().cast(),
            LEN as c_int,
            handles().byte,
            comm,
        )
    };
    all.chunks(LEN)
        .enumerate()
        .map(|(r, c)| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(LEN);
            std::str::from_utf8(&c[..end])
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or(Error::DaemonAddress { rank: r })
        })
        .collect()
}

/// A pointer-sized key for maps of handles.
pub fn key(p: *const c_void) -> usize {
    p as usize
}
