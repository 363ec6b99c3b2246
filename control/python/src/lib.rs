//! The Python module `xagg._xagg` (imported as `xagg`): a member of a job joined over the
//! network, allreducing NumPy arrays in place through the switch without copying them.
//! The GIL is released while a call waits. `xagg.torch` (Python) builds the
//! `torch.distributed` backend on it.

use std::{
    net::{SocketAddr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::{
    create_exception,
    exceptions::{PyException, PyTypeError, PyValueError},
    prelude::*,
};
use xagg_common::{
    wire::{DType, Op},
    JobShape,
};
use xagg_worker::{
    AllreduceError, Buffer, CredentialKey, JobKey, JoinParams, Placement, Secret, Worker,
};

create_exception!(
    _xagg,
    XaggError,
    PyException,
    "An allreduce or a join that failed: the message says what happened."
);

fn error(e: AllreduceError) -> PyErr {
    XaggError::new_err(e.to_string())
}

/// The wire type of a NumPy dtype, or a clear refusal.
fn dtype_of(array: &Bound<'_, PyUntypedArray>) -> PyResult<DType> {
    let d = array.dtype();
    let name = d.str()?.to_string();
    // Little-endian (or native, on the little-endian hosts this runs on) only.
    let native = matches!(d.byteorder(), b'=' | b'<' | b'|');
    Ok(match (native, d.kind(), d.itemsize()) {
        (true, b'i', 4) => DType::I32,
        (true, b'u', 4) => DType::U32,
        (true, b'i', 8) => DType::I64,
        (true, b'f', 2) => DType::F16,
        (true, b'f', 4) => DType::F32,
        (true, b'f', 8) => DType::F64,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "arrays of dtype {name} are not reduced by the switch: use int32, uint32, int64, float16, float32 or float64 (little-endian)"
            )))
        }
    })
}

/// The array's memory as a request buffer that keeps the array alive.
fn buffer(array: &Bound<'_, PyUntypedArray>) -> PyResult<Buffer> {
    if !array.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "the array is not contiguous: reduce a contiguous copy (numpy.ascontiguousarray) and copy the result back",
        ));
    }
    // Safety: a NumPy array object.
    let raw = unsafe { &*array.as_array_ptr() };
    if raw.fields.flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Err(PyValueError::new_err(
            "the array is read-only: the result is written into it",
        ));
    }
    let dtype = dtype_of(array)?;
    let len = array.len() * dtype.size();
    // Safety: the array's `len` contiguous bytes; the buffer holds a reference to the
    // array until the request completes (the caller must not touch it meanwhile, as with
    // any in-place allreduce).
    Ok(unsafe {
        Buffer::from_raw(
            raw.fields.data.cast::<u8>(),
            len,
            dtype,
            array.clone().unbind().into_any(),
        )
    })
}

fn op_of(op: &str) -> PyResult<Op> {
    op.parse()
        .map_err(|e: xagg_common::wire::UnknownName| PyValueError::new_err(e.to_string()))
}

/// A request in flight: `wait()` for its end (raising `XaggError` if it failed), `test()`
/// to ask without waiting.
#[pyclass(module = "xagg")]
struct Request {
    inner: Option<xagg_worker::Request>,
    /// How it ended, once it has: `None` for success, else the error's message.
    outcome: Option<Option<String>>,
    /// The error kind, for the callers that decide what to do (`nonfinite`, `failed`).
    kind: Option<&'static str>,
}

impl Request {
    fn finish(&mut self, c: xagg_worker::Completion) {
        match c.status {
            Ok(_) => self.outcome = Some(None),
            Err(e) => {
                self.kind = Some(match e {
                    AllreduceError::NonFinite { .. } => "nonfinite",
                    AllreduceError::Cancelled { .. } => "cancelled",
                    _ => "failed",
                });
                self.outcome = Some(Some(e.to_string()));
            }
        }
    }
}

#[pymethods]
impl Request {
    /// Waits for the request (the GIL released meanwhile; `timeout` in seconds, `None`
    /// for as long as it takes). Returns True when it has ended; raises `XaggError` if it
    /// failed.
    #[pyo3(signature = (timeout = None))]
    fn wait(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        if self.outcome.is_none() {
            let Some(mut r) = self.inner.take() else {
                return Err(XaggError::new_err("the request has no outcome"));
            };
            let (r, c) = py.detach(move || match timeout {
                None => (None, Some(r.wait())),
                Some(t) => {
                    let c = r.wait_timeout(Duration::from_secs_f64(t.max(0.0)));
                    (Some(r), c)
                }
            });
            self.inner = r;
            match c {
                Some(c) => self.finish(c),
                None => return Ok(false),
            }
        }
        match &self.outcome {
            Some(Some(e)) => Err(XaggError::new_err(e.clone())),
            _ => Ok(true),
        }
    }

    /// Whether the request has ended (it makes progress meanwhile).
    fn test(&mut self) -> bool {
        if self.outcome.is_some() {
            return true;
        }
        if let Some(c) = self.inner.as_mut().and_then(|r| r.test()) {
            self.inner = None;
            self.finish(c);
        }
        self.outcome.is_some()
    }

    /// After the request ended: None if it succeeded, else `(kind, message)` with kind
    /// `nonfinite` (NaN or infinity in a float sum), `cancelled` or `failed` — without
    /// raising, for callers that fall back.
    fn status(&self) -> Option<(&'static str, String)> {
        match &self.outcome {
            Some(Some(e)) => Some((self.kind.unwrap_or("failed"), e.clone())),
            _ => None,
        }
    }
}

/// This host's address toward the daemon: where the switch sees this member.
fn local_address(daemon: SocketAddr) -> PyResult<SocketAddrV4> {
    let s = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(daemon).map(|()| s))
        .map_err(|e| XaggError::new_err(format!("no route to the daemon at {daemon}: {e}")))?;
    match s.local_addr() {
        Ok(SocketAddr::V4(a)) => Ok(SocketAddrV4::new(*a.ip(), 0)),
        _ => Err(XaggError::new_err("the switch takes IPv4 members")),
    }
}

fn hex<const N: usize>(s: &str, what: &str) -> PyResult<[u8; N]> {
    xagg_join::from_hex(s, what).map_err(PyValueError::new_err)
}

/// One member of a job.
#[pyclass(module = "xagg")]
struct Job {
    worker: Worker,
    /// This process's rank in the whole job, and the job's ranks.
    rank: usize,
    size: usize,
}

#[pymethods]
impl Job {
    /// Joins a job over the network: the daemon's listener `daemon` ("IP:PORT"), this
    /// member's `rank` of `size`, the job's `key` (32 hex digits) and `secret` (64), the
    /// same on every rank ([`new_key`]), and a `credential` ("NAME:KEY") to create the job.
    /// Waits until every rank is in (up to `timeout` seconds).
    ///
    /// Where every host runs its own daemon (reducing its ranks before the switch), give
    /// either `daemons`, every rank's daemon in rank order (ranks naming one daemon are
    /// one host's; rank 0's coordinates a ring), or this host's `local_rank` and
    /// `local_size` (the launcher's) and the `coordinator` (rank 0's host's daemon).
    #[staticmethod]
    #[pyo3(signature = (daemon, rank, size, key, secret, credential = None, slots = 128, timeout = 10.0, give_up = None, daemons = None, local_rank = None, local_size = None, coordinator = None))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn join(
        py: Python<'_>,
        daemon: &str,
        rank: usize,
        size: usize,
        key: &str,
        secret: &str,
        credential: Option<&str>,
        slots: usize,
        timeout: f64,
        give_up: Option<f64>,
        daemons: Option<Vec<String>>,
        local_rank: Option<usize>,
        local_size: Option<usize>,
        coordinator: Option<&str>,
    ) -> PyResult<Self> {
        let address = |what: &str, s: &str| -> PyResult<SocketAddr> {
            s.parse().map_err(|_| {
                PyValueError::new_err(format!("{what} {s:?}: give IP:PORT, e.g. 10.77.0.1:47900"))
            })
        };
        let daemon = address("daemon", daemon)?;
        let placed = match (daemons, local_rank, local_size) {
            (Some(all), None, None) => {
                let all = all
                    .iter()
                    .map(|d| address("daemons[]", d))
                    .collect::<PyResult<Vec<_>>>()?;
                if all.len() != size {
                    return Err(PyValueError::new_err(format!(
                        "daemons: {} given for {size} ranks: give every rank's, in rank order",
                        all.len()
                    )));
                }
                Placement::by_daemon(&all, rank)
            }
            (None, Some(lr), Some(ls)) => {
                let coordinator = match coordinator.map(|c| address("coordinator", c)) {
                    None => None,
                    Some(Ok(SocketAddr::V4(a))) => Some(a),
                    Some(Ok(a)) => {
                        return Err(PyValueError::new_err(format!(
                            "coordinator {a}: daemons listen on IPv4"
                        )))
                    }
                    Some(Err(e)) => return Err(e),
                };
                Placement::local(rank, size, lr, ls, coordinator)
            }
            (None, None, None) => Placement::flat(rank, size),
            _ => {
                return Err(PyValueError::new_err(
                    "give daemons, or local_rank and local_size together, or neither",
                ))
            }
        }
        .map_err(PyValueError::new_err)?;
        let credential = match credential {
            None => None,
            Some(c) => {
                let (name, k) = c.split_once(':').ok_or_else(|| {
                    PyValueError::new_err("credential: give NAME:KEY (the key as 64 hex digits)")
                })?;
                Some((
                    name.to_string(),
                    CredentialKey(hex(k, "the credential's key")?),
                ))
            }
        };
        let shape = JobShape::full(placed.members, slots)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let j = JoinParams {
            daemon,
            key: JobKey(hex(key, "the job key")?),
            secret: Secret(hex(secret, "the job secret")?),
            rank: placed.member,
            shape,
            bind: local_address(daemon)?,
            credential,
            timeout: Duration::from_secs_f64(timeout),
            levels: placed.levels,
        };
        let worker = py
            .detach(move || {
                let w = Worker::join_with(j, |p| {
                    if let Some(g) = give_up {
                        p.give_up = Duration::from_secs_f64(g);
                    }
                })?;
                w.sync()?;
                Ok::<_, AllreduceError>(w)
            })
            .map_err(error)?;
        Ok(Self { worker, rank, size })
    }

    /// Starts an allreduce of `array` in place with `op` ("sum", "min", "max", "avg",
    /// "prod", "and", "or", "xor") and returns its `Request`. Every rank submits the same
    /// calls in the same order. The array must stay untouched until the request ends.
    #[pyo3(signature = (array, op = "sum"))]
    fn submit(&self, array: &Bound<'_, PyUntypedArray>, op: &str) -> PyResult<Request> {
        let r = self
            .worker
            .submit(op_of(op)?, buffer(array)?)
            .map_err(error)?;
        Ok(Request {
            inner: Some(r),
            outcome: None,
            kind: None,
        })
    }

    /// Allreduce of `array` in place with `op`, waiting for it (the GIL released).
    #[pyo3(signature = (array, op = "sum"))]
    fn allreduce(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyUntypedArray>,
        op: &str,
    ) -> PyResult<()> {
        self.submit(array, op)?.wait(py, None).map(|_| ())
    }

    /// Leaves the job (the daemon removes it when every rank has left).
    fn leave(&self, py: Python<'_>) -> PyResult<()> {
        let w = self.worker.clone();
        py.detach(move || w.leave()).map_err(error)
    }

    /// This process's rank in the job and the job's ranks.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// How this rank's allreduces go: "switch", "tree" (through its host) or "ring".
    #[getter]
    fn path(&self) -> &'static str {
        match self.worker.params().path {
            xagg_worker::Path::Switch => "switch",
            xagg_worker::Path::Tree => "tree",
            xagg_worker::Path::Ring => "ring",
        }
    }
}

/// A new random job key and secret, as hex: rank 0 makes them and shares them.
#[pyfunction]
fn new_key() -> (String, String) {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    (hex(&JobKey::random().0), hex(&Secret::random().0))
}

#[pymodule]
fn _xagg(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Job>()?;
    m.add_class::<Request>()?;
    m.add_function(wrap_pyfunction!(new_key, m)?)?;
    m.add("XaggError", m.py().get_type::<XaggError>())?;
    Ok(())
}
