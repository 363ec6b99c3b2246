//! What a worker's handles share: the engine behind its lock, and the requests submitted
//! since it last ran. Whichever thread gets the lock makes progress for everyone.

use std::{
    os::fd::RawFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, TryLockError,
    },
    time::Duration,
};

use super::Engine;
use crate::{
    request::{lock, Buffer, Shared},
    transport::Transport,
    Reduction, WorkerParams,
};

/// A request handed to the worker and not yet taken up by the engine.
pub(crate) struct Pending {
    pub r: Reduction,
    /// The call's collective and its root (reduce, broadcast), and the bytes of one
    /// block of its message ([`crate::Layout`]) with their number.
    pub collective: crate::Collective,
    pub root: u8,
    pub block: usize,
    pub blocks: usize,
    /// A collective made as an allreduce: the caller's output, and which bytes of the
    /// whole result (`output`) go there (none: it stays as it was).
    pub block_of: Option<(crate::Buffer, std::ops::Range<usize>)>,
    pub input: Option<Buffer>,
    pub output: Buffer,
    pub shared: Arc<Shared>,
}

/// What a worker shares between its handles: its parameters, the engine behind a lock,
/// and the requests submitted since the engine last ran.
pub(crate) struct WorkerInner {
    pub p: WorkerParams,
    engine: Mutex<Engine>,
    inbox: Mutex<Vec<Pending>>,
    /// How long one blocking step waits (nanoseconds), from the engine's timeout.
    step_ns: AtomicU64,
    pub fds: Vec<RawFd>,
    /// When a caller's thread last made the engine progress ([`now_ns`]), and the requests
    /// it ran then: what the peers' responder reads to make progress while the caller is
    /// away (in a call the library does not wrap).
    pub last_step: AtomicU64,
    pub active: AtomicU64,
    /// The job this worker joined over the network, to leave it.
    pub membership: Option<crate::join::Membership>,
    /// Its lease's renewals, while the worker is a member.
    pub lease: Mutex<Option<crate::lease::Lease>>,
    /// Whether it left (or handed its leave to the lease's thread).
    pub left: std::sync::atomic::AtomicBool,
    /// The responder started, waiting for the peers' addresses; then the peers.
    pub peers_setup: Mutex<Option<crate::peers::PeersSetup>>,
    pub peers: std::sync::OnceLock<crate::peers::Peers>,
    /// How the peers' responder lets go of this worker when the program drops it.
    pub responder: std::sync::OnceLock<Arc<crate::peers::Handoff>>,
}

impl WorkerInner {
    pub fn new(p: WorkerParams, transport: Transport) -> Self {
        let fds = transport.fds();
        let engine = Engine::new(p.clone(), transport);
        Self {
            step_ns: AtomicU64::new(engine.step_wait().as_nanos() as u64),
            engine: Mutex::new(engine),
            inbox: Mutex::new(Vec::new()),
            fds,
            last_step: AtomicU64::new(now_ns()),
            active: AtomicU64::new(0),
            p,
            membership: None,
            lease: Mutex::new(None),
            left: std::sync::atomic::AtomicBool::new(false),
            peers_setup: Mutex::new(None),
            peers: std::sync::OnceLock::new(),
            responder: std::sync::OnceLock::new(),
        }
    }

    /// Where the engine marks the ranks it finds gone.
    pub fn gone(&self) -> Arc<AtomicU64> {
        self.engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gone
            .clone()
    }

    /// Every rank's responder, in rank order, and the job's secret, for the engine's waits.
    pub fn set_responders(&self, addresses: Vec<std::net::SocketAddrV4>, key: [u8; 32]) {
        let mut e = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        e.responders = addresses;
        e.responders_key = key;
    }

    /// Hands a request to the engine: taken up at once unless another thread is inside
    /// the engine, else at that thread's next step.
    pub fn enqueue(&self, pending: Pending) {
        lock(&self.inbox).push(pending);
        // Its first rounds go out now; what comes back is taken by whoever waits.
        let mut e = match self.engine.try_lock() {
            Ok(e) => e,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let pending = std::mem::take(&mut *lock(&self.inbox));
        e.admit(pending);
        e.send_queued();
        self.active
            .store(e.active_requests() as u64, Ordering::Relaxed);
        self.last_step.store(now_ns(), Ordering::Relaxed);
    }

    /// One step of the engine, waiting up to `wait` for something to come in; false if
    /// another thread holds the engine (it is making progress for everyone).
    pub fn progress(&self, wait: Duration) -> bool {
        self.progress_as(wait, true)
    }

    /// [`Self::progress`], by the caller's thread (`caller`) or by the library's own.
    pub fn progress_as(&self, wait: Duration, caller: bool) -> bool {
        let mut e = match self.engine.try_lock() {
            Ok(e) => e,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let pending = std::mem::take(&mut *lock(&self.inbox));
        e.admit(pending);
        e.step(wait);
        self.step_ns
            .store(e.step_wait().as_nanos() as u64, Ordering::Relaxed);
        self.active
            .store(e.active_requests() as u64, Ordering::Relaxed);
        if caller {
            self.last_step.store(now_ns(), Ordering::Relaxed);
        }
        true
    }

    /// How long one blocking step should wait: long enough to sleep, short enough for the
    /// retransmission timers.
    pub fn step(&self) -> Duration {
        Duration::from_nanos(self.step_ns.load(Ordering::Relaxed))
    }

    /// Runs `f` on the engine, waiting for the lock.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut lock(&self.engine))
    }
}

/// Nanoseconds since the first call in this process (a monotonic clock).
pub(crate) fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Waits until one of the workers' sockets has something to read, or `d` passed.
pub(crate) fn wait_readable(workers: &[Arc<WorkerInner>], d: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    let fds: Vec<RawFd> = workers.iter().flat_map(|w| w.fds.iter().copied()).collect();
    // Safety: each worker's transport, which owns these descriptors, outlives the call
    // (the workers are held by the caller).
    let mut polled: Vec<PollFd> = fds
        .iter()
        .map(|&fd| PollFd::new(unsafe { BorrowedFd::borrow_raw(fd) }, PollFlags::POLLIN))
        .collect();
    let ms = d.as_millis().clamp(1, 1000) as u16;
    let _ = poll(&mut polled, PollTimeout::from(ms));
}
