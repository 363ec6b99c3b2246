//! Requests and their completions: the buffer a request owns while in flight
//! ([`Buffer`]), the handle [`Worker::submit`](crate::Worker::submit) returns
//! ([`Request`]), what a request ends with ([`Completion`]), and a queue gathering the
//! completions of many requests, of one job or several ([`CompletionQueue`]).
//!
//! Progress is made inside the library's calls, as in MPI: waiting on or testing a
//! request, or polling or waiting on a queue, sends what is due and takes in what came.
//! There is no thread and no async runtime behind the caller's back. Several threads may
//! submit, test and wait at once: one of them makes progress for all, the others wait for
//! it (a request submitted while another thread waits in the library goes out within that
//! thread's next step, a few milliseconds at most).

use std::{
    any::Any,
    collections::VecDeque,
    ptr::NonNull,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, Weak,
    },
    time::{Duration, Instant},
};

use xagg_common::wire::DType;

use crate::{engine::WorkerInner, AllreduceError, Element, Report};

/// Memory a request reduces, owned by the request while it is in flight and handed back
/// with its [`Completion`]: a `Vec` of elements ([`Buffer::from`]), or memory someone else
/// owns — a NumPy array, a tensor, an MPI program's buffer — without a copy
/// ([`Buffer::from_raw`], with an owner value the buffer keeps alive).
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    dtype: DType,
    owner: Box<dyn Any + Send>,
}

// Safety: the bytes are reached only through the buffer (`from_raw`'s contract), and the
// owner is `Send`.
unsafe impl Send for Buffer {}

impl<T: Element> From<Vec<T>> for Buffer {
    fn from(mut v: Vec<T>) -> Self {
        let len = std::mem::size_of_val(v.as_slice());
        // A Vec's heap block stays put when the Vec value moves into the box.
        let ptr = NonNull::new(v.as_mut_ptr().cast::<u8>()).expect("a Vec's pointer");
        Self {
            ptr,
            len,
            dtype: T::DTYPE,
            owner: Box::new(v),
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes of {})", self.len, self.dtype)
    }
}

impl Buffer {
    /// `len` bytes at `ptr`, little-endian elements of `dtype`, kept valid by `owner`
    /// (e.g. a reference to the Python array, or `()` when the caller keeps the memory
    /// alive itself), which the buffer holds and [`Buffer::into_owner`] gives back.
    ///
    /// # Safety
    /// Until the request using this buffer has completed (its [`Completion`] was
    /// delivered), the `len` bytes at `ptr` must stay valid for reads and writes, and
    /// nothing else may read or write them (an input buffer of
    /// [`Worker::submit_separate`](crate::Worker::submit_separate) is only read, so
    /// others may read it too).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, dtype: DType, owner: impl Any + Send) -> Self {
        Self {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            dtype,
            owner: Box::new(owner),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> &[u8] {
        // Safety: `ptr` is valid for `len` bytes (a Vec's, or `from_raw`'s contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Where the bytes are (for a second, read-only view of them).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // Safety: as in `bytes`, and the buffer is the only way to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The `Vec` this buffer was made from, or the buffer back if it was made from
    /// something else.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>, Self> {
        if !self.owner.is::<Vec<T>>() {
            return Err(self);
        }
        Ok(*self.owner.downcast::<Vec<T>>().expect("checked its type"))
    }

    /// What [`Buffer::from_raw`] was given to keep the memory alive (a `Vec` for a buffer
    /// made from one).
    pub fn into_owner(self) -> Box<dyn Any + Send> {
        self.owner
    }

    /// A buffer over `buf` for a call that waits for its request before it returns.
    ///
    /// # Safety
    /// The request must complete, and be out of the worker, before the borrow ends.
    pub(crate) unsafe fn borrowed(buf: &mut [u8], dtype: DType) -> Self {
        unsafe { Self::from_raw(buf.as_mut_ptr(), buf.len(), dtype, ()) }
    }
}

/// How a request ended: its status, and the buffers it owned.
#[derive(Debug)]
pub struct Completion {
    /// The request's id ([`Request::id`], or what [`CompletionQueue::submit`] returned),
    /// unique within the process.
    pub id: u64,
    /// The wire job id.
    pub job: u32,
    /// The message id the request took, if it got as far as the network.
    pub message: Option<u32>,
    /// Success with what the allreduce did (and the path it took), or why it failed.
    pub status: Result<Report, AllreduceError>,
    /// The result: the request's buffer (in place), or its output buffer
    /// ([`Worker::submit_separate`](crate::Worker::submit_separate)). After a failure,
    /// segments whose result came hold it and the others are unspecified: in place, the
    /// input or the result; an output buffer, the result or what it held before.
    pub buffer: Buffer,
    /// The input buffer of [`Worker::submit_separate`](crate::Worker::submit_separate),
    /// unchanged whatever happened.
    pub input: Option<Buffer>,
    /// A collective made as an allreduce that failed: the whole result so far, and which
    /// of its bytes are the caller's output ([`crate::Worker::recover`] finishes the
    /// whole, then takes them).
    pub(crate) part: Option<(Buffer, std::ops::Range<usize>)>,
}

impl Completion {
    pub fn is_ok(&self) -> bool {
        self.status.is_ok()
    }
}

/// Bytes `range` of `whole` into `output` (none: it stays as it was).
pub(crate) fn take_part(output: &mut Buffer, whole: &Buffer, range: std::ops::Range<usize>) {
    if !range.is_empty() {
        output.bytes_mut().copy_from_slice(&whole.bytes()[range]);
    }
}

/// State a request shares between its handle (or queue) and the worker.
pub(crate) struct Shared {
    pub id: u64,
    pub job: u32,
    completion: Mutex<Option<Completion>>,
    done: Condvar,
    pub cancel: AtomicBool,
    /// Whether a thread sleeps on `done` (waking costs a system call otherwise spared).
    parked: AtomicBool,
    /// Whether the worker let go of the request (its completion was delivered).
    ended: AtomicBool,
    /// The queue its completion goes to, if it was submitted through one.
    pub queue: Option<Arc<QueueInner>>,
}

impl Shared {
    pub fn new(job: u32, queue: Option<Arc<QueueInner>>) -> Arc<Self> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Arc::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            job,
            completion: Mutex::new(None),
            done: Condvar::new(),
            cancel: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            queue,
        })
    }

    /// Delivers the request's completion: to its queue, or to its handle.
    pub fn complete(self: &Arc<Self>, c: Completion) {
        *lock(&self.completion) = Some(c);
        self.ended.store(true, Ordering::Release);
        if self.parked.load(Ordering::Acquire) {
            self.done.notify_all();
        }
        if let Some(q) = &self.queue {
            lock(&q.ready).push_back(self.clone());
            q.ready_cv.notify_all();
        }
    }

    /// Whether the worker let go of the request.
    pub fn delivered(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn take(&self) -> Option<Completion> {
        lock(&self.completion).take()
    }

    /// Waits up to `d` for the completion to be delivered.
    fn park(&self, d: Duration) {
        let g = lock(&self.completion);
        if g.is_none() {
            // Set under the lock `complete` takes first: it sees the flag, or the waiter
            // sees the completion.
            self.parked.store(true, Ordering::Release);
            let _ = self.done.wait_timeout(g, d);
        }
    }
}

/// A mutex's guard, whether or not a thread panicked while holding it: what is guarded
/// here stays consistent at every point a panic could leave it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a waiting thread that is not the one making progress sleeps before it looks
/// again whether it should take over.
const PARK: Duration = Duration::from_millis(2);

/// The handle of a request from [`Worker::submit`](crate::Worker::submit). The request
/// owns its buffers until it completes; dropping the handle does not cancel it (it runs to
/// its end when the worker makes progress, and its completion is dropped).
pub struct Request {
    shared: Arc<Shared>,
    worker: Arc<WorkerInner>,
}

impl Request {
    pub(crate) fn new(shared: Arc<Shared>, worker: Arc<WorkerInner>) -> Self {
        Self { shared, worker }
    }

    pub fn id(&self) -> u64 {
        self.shared.id
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Makes progress once without blocking; the completion if the request is done (an
    /// `MPI_Test`). A completion is handed out once: afterwards `test` returns `None`.
    pub fn test(&mut self) -> Option<Completion> {
        if let Some(c) = self.shared.take() {
            return Some(c);
        }
        self.worker.progress(Duration::ZERO);
        self.shared.take()
    }

    /// Waits for the request to end, making progress meanwhile, and returns its
    /// completion (an `MPI_Wait`).
    pub fn wait(self) -> Completion {
        loop {
            if let Some(c) = self.shared.take() {
                return c;
            }
            if !self.worker.progress(self.worker.step()) {
                self.shared.park(PARK);
            }
        }
    }

    /// Waits up to `timeout`; the completion if the request ended meanwhile.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Completion> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(c) = self.shared.take() {
                return Some(c);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            if !self.worker.progress(self.worker.step().min(left)) {
                self.shared.park(PARK.min(left));
            }
        }
    }

    /// Cancels the request: at the worker's next step it stops sending, and its
    /// completion says [`AllreduceError::Cancelled`] (unless it ended before). Only this
    /// member stops: the others' requests for the same message wait for its missing
    /// contributions and end timed out, naming this member.
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
    }
}

/// A queue of the completions of many requests, of one job or several: submit with
/// [`CompletionQueue::submit`], then poll or wait for whichever ends first. Cheap to clone
/// and shared between threads.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<QueueInner>,
}

pub(crate) struct QueueInner {
    ready: Mutex<VecDeque<Arc<Shared>>>,
    ready_cv: Condvar,
    /// Requests submitted and not yet handed out.
    outstanding: AtomicUsize,
    /// Requests in flight by id, for `cancel`.
    requests: Mutex<Vec<Weak<Shared>>>,
    /// The workers of the requests in flight, whose progress the queue makes.
    workers: Mutex<Vec<Weak<WorkerInner>>>,
}

impl Default for CompletionQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionQueue {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(QueueInner {
                ready: Mutex::new(VecDeque::new()),
                ready_cv: Condvar::new(),
                outstanding: AtomicUsize::new(0),
                requests: Mutex::new(Vec::new()),
                workers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Submits an allreduce of `buffer` in place on `worker`, like
    /// [`Worker::submit`](crate::Worker::submit); its completion comes from this queue.
    /// Returns the request's id.
    pub fn submit(
        &self,
        worker: &crate::Worker,
        op: xagg_common::wire::Op,
        buffer: Buffer,
    ) -> Result<u64, AllreduceError> {
        self.submit_with(worker, op, None, buffer)
    }

    /// Submits an allreduce of `input` into `output` on `worker`, like
    /// [`Worker::submit_separate`](crate::Worker::submit_separate).
    pub fn submit_separate(
        &self,
        worker: &crate::Worker,
        op: xagg_common::wire::Op,
        input: Buffer,
        output: Buffer,
    ) -> Result<u64, AllreduceError> {
        self.submit_with(worker, op, Some(input), output)
    }

    fn submit_with(
        &self,
        worker: &crate::Worker,
        op: xagg_common::wire::Op,
        input: Option<Buffer>,
        output: Buffer,
    ) -> Result<u64, AllreduceError> {
        let shared = Shared::new(worker.params().job, Some(self.inner.clone()));
        let id = shared.id;
        self.inner.outstanding.fetch_add(1, Ordering::Relaxed);
        {
            let mut reqs = lock(&self.inner.requests);
            reqs.retain(|r| r.strong_count() > 0);
            reqs.push(Arc::downgrade(&shared));
            let mut ws = lock(&self.inner.workers);
            ws.retain(|w| w.strong_count() > 0);
            if !ws.iter().any(|w| w.as_ptr() == Arc::as_ptr(worker.inner())) {
                ws.push(Arc::downgrade(worker.inner()));
            }
        }
        if let Err(e) = worker.enqueue(op, input, output, shared) {
            self.inner.outstanding.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok(id)
    }

    /// Requests submitted whose completion has not been handed out yet.
    pub fn outstanding(&self) -> usize {
        self.inner.outstanding.load(Ordering::Relaxed)
    }

    /// Cancels request `id` (see [`Request::cancel`]); false if no request of this
    /// queue with that id is in flight.
    pub fn cancel(&self, id: u64) -> bool {
        let reqs = lock(&self.inner.requests);
        match reqs.iter().filter_map(Weak::upgrade).find(|r| r.id == id) {
            Some(r) => {
                r.cancel.store(true, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn pop(&self) -> Option<Completion> {
        let shared = lock(&self.inner.ready).pop_front()?;
        let c = shared.take()?;
        self.inner.outstanding.fetch_sub(1, Ordering::Relaxed);
        Some(c)
    }

    /// Makes progress once without blocking; a completion if one is ready.
    pub fn poll(&self) -> Option<Completion> {
        if let Some(c) = self.pop() {
            return Some(c);
        }
        self.step(Duration::ZERO);
        self.pop()
    }

    /// Waits for the next completion, making progress meanwhile; `None` when no request
    /// is outstanding.
    pub fn wait(&self) -> Option<Completion> {
        self.wait_timeout(Duration::MAX)
    }

    /// Waits up to `timeout` for the next completion; `None` if none came or none is
    /// outstanding.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Completion> {
        let until = Instant::now().checked_add(timeout);
        loop {
            if let Some(c) = self.pop() {
                return Some(c);
            }
            if self.outstanding() == 0 {
                return None;
            }
            let left = until.map_or(Duration::MAX, |u| {
                u.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return None;
            }
            if !self.step(left) {
                let g = lock(&self.inner.ready);
                if g.is_empty() {
                    let _ = self.inner.ready_cv.wait_timeout(g, PARK.min(left));
                }
            }
        }
    }

    /// One step of progress on the queue's workers, waiting at most `left`; false if
    /// other threads were making progress on all of them.
    fn step(&self, left: Duration) -> bool {
        let workers: Vec<Arc<WorkerInner>> = {
            let mut ws = lock(&self.inner.workers);
            ws.retain(|w| w.strong_count() > 0);
            ws.iter().filter_map(Weak::upgrade).collect()
        };
        match workers.as_slice() {
            [] => false,
            [w] => w.progress(if left.is_zero() {
                Duration::ZERO
            } else {
                w.step().min(left)
            }),
            ws => {
                // Several sockets: take what each has without blocking, then sleep on
                // all of them at once.
                let mut any = false;
                for w in ws {
                    any |= w.progress(Duration::ZERO);
                }
                if any && !left.is_zero() && lock(&self.inner.ready).is_empty() {
                    crate::engine::wait_readable(ws, ws[0].step().min(left));
                }
                any
            }
        }
    }
}
