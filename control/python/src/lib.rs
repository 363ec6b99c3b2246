//! The Python module `xagg._xagg` (imported as `xagg`): a member of a job joined over the
//! network, allreducing NumPy arrays in place through the switch without copying them.
//! The GIL is released while a call waits. `xagg.torch` (Python) builds the
//! `torch.distributed` backend on it.

use std::{net::SocketAddr, time::Duration};

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::{
    create_exception,
    exceptions::{PyException, PyTypeError, PyValueError},
    prelude::*,
};
use xagg_common::wire::{DType, Float, Op};
use xagg_worker::{
    settings::parse_credential, AllreduceError, Buffer, JobKey, JoinSettings, Placement, Secret,
    Worker,
};

// Named in the package the program imports (`xagg.XaggError`), so it pickles: DDP sends
// a hook's exception across to the caller, and `_xagg` is no module of that name.
create_exception!(
    xagg,
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
            // Named only here: asking NumPy for the name costs as much as the rest of a call.
            let name = d.str()?.to_string();
            return Err(PyTypeError::new_err(format!(
                "arrays of dtype {name} are not reduced by the switch: use int32, uint32, int64, float16, float32 or float64 (little-endian)"
            )));
        }
    })
}

/// The array's memory as a request buffer that keeps the array alive, its elements of
/// type `as_type` when given (of the array's item size: bf16 travels as 2-byte integers,
/// which NumPy has and bf16 it has not), else of the array's own type.
fn buffer(array: &Bound<'_, PyUntypedArray>, as_type: Option<&str>) -> PyResult<Buffer> {
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
    let dtype = match as_type {
        None => dtype_of(array)?,
        Some(name) => {
            let t: DType = name.parse().map_err(|e: xagg_common::wire::UnknownName| {
                PyValueError::new_err(e.to_string())
            })?;
            let size = array.dtype().itemsize();
            if size != t.size() {
                return Err(PyTypeError::new_err(format!(
                    "dtype {name} has {}-byte elements, the array {size}-byte ones: pass a view of the same size (for bf16, int16 or uint16)",
                    t.size()
                )));
            }
            t
        }
    };
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
    /// Its worker: a request the switch failed is recovered from the peers.
    worker: Worker,
    /// Segments whose result came from a peer.
    recovered: usize,
    /// How it ended, once it has: `None` for success, else the error's message.
    outcome: Option<Option<String>>,
    /// The error kind, for the callers that decide what to do (`nonfinite`, `failed`).
    kind: Option<&'static str>,
}

impl Request {
    fn finish(&mut self, c: xagg_worker::Completion) {
        match c.status {
            Ok(r) => {
                self.recovered = r.recovered;
                self.outcome = Some(None)
            }
            Err(e) => {
                self.kind = Some(match e {
                    AllreduceError::NonFinite { .. } => "nonfinite",
                    AllreduceError::Overflow { .. } => "overflow",
                    AllreduceError::Cancelled { .. } => "cancelled",
                    AllreduceError::Abandoned { .. } => "abandoned",
                    AllreduceError::Timeout { .. } | AllreduceError::GivenUp { .. } => "timeout",
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
            let w = self.worker.clone();
            let (r, c) = py.detach(move || {
                let (r, mut c) = match timeout {
                    None => (None, Some(r.wait())),
                    Some(t) => {
                        let c = r.wait_timeout(Duration::from_secs_f64(t.max(0.0)));
                        (Some(r), c)
                    }
                };
                if let Some(c) = &mut c {
                    w.recover(c);
                }
                (r, c)
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
        if let Some(mut c) = self.inner.as_mut().and_then(|r| r.test()) {
            self.inner = None;
            self.worker.recover(&mut c);
            self.finish(c);
        }
        self.outcome.is_some()
    }

    /// Stops the request at its next step: it ends `cancelled` (what it sent stays sent).
    fn cancel(&self) {
        if let Some(r) = &self.inner {
            r.cancel();
        }
    }

    /// Segments whose result came from a peer (the switch having stopped answering).
    #[getter]
    fn recovered(&self) -> usize {
        self.recovered
    }

    /// After the request ended: None if it succeeded, else `(kind, message)` with kind
    /// `nonfinite` (NaN or infinity in a float sum), `overflow` (an exact float sum too
    /// wide for its lanes; the segments NaN, as for `nonfinite`), `abandoned` (no rank
    /// holds some segment: every rank makes this call another way), `timeout` (slow ranks
    /// past the collective timeout), `cancelled` or `failed` — without raising, for
    /// callers that fall back.
    fn status(&self) -> Option<(&'static str, String)> {
        match &self.outcome {
            Some(Some(e)) => Some((self.kind.unwrap_or("failed"), e.clone())),
            _ => None,
        }
    }
}

/// One member of a job.
#[pyclass(module = "xagg")]
struct Job {
    worker: Worker,
    /// The job's secret: what authenticates the peers' questions and answers.
    secret: Secret,
    /// This process's rank in the whole job, and the job's ranks.
    rank: usize,
    size: usize,
}

/// `IP:PORT` of a daemon's listener.
fn address(what: &str, s: &str) -> PyResult<SocketAddr> {
    s.parse().map_err(|_| {
        PyValueError::new_err(format!("{what} {s:?}: give IP:PORT, e.g. 10.77.0.1:47900"))
    })
}

/// A setting the environment gives as a whole number.
fn number(name: &str, v: &str) -> PyResult<usize> {
    v.trim()
        .parse()
        .map_err(|_| PyValueError::new_err(format!("{name}={v} is not a number")))
}

/// The first of the launchers' variables that is set, and its name.
fn first_var(names: &[&'static str]) -> Option<(&'static str, String)> {
    names
        .iter()
        .find_map(|&n| std::env::var(n).ok().map(|v| (n, v)))
}

/// Where this rank stands: every rank's daemon given, or this host's ranks, or neither
/// (one daemon for all).
struct Place<'a> {
    daemons: Option<Vec<String>>,
    local_rank: Option<usize>,
    local_size: Option<usize>,
    coordinator: Option<&'a str>,
}

impl Place<'_> {
    fn placement(self, rank: usize, size: usize) -> PyResult<Placement> {
        match (self.daemons, self.local_rank, self.local_size) {
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
                let coordinator = match self.coordinator.map(|c| address("coordinator", c)) {
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
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// The keyword arguments that override the settings.
struct Overrides<'a> {
    credential: Option<&'a str>,
    slots: Option<usize>,
    timeout: Option<f64>,
    give_up: Option<f64>,
}

impl Overrides<'_> {
    fn apply(self, s: &mut JoinSettings) -> PyResult<()> {
        if let Some(c) = self.credential {
            s.credential = Some(
                parse_credential(c, "credential")
                    .map_err(|e| PyValueError::new_err(e.to_string()))?,
            );
        }
        if let Some(n) = self.slots {
            s.slots = n;
        }
        if let Some(t) = self.timeout {
            s.join_timeout = Duration::from_secs_f64(t);
        }
        if let Some(g) = self.give_up {
            s.give_up = Some(Duration::from_secs_f64(g));
        }
        Ok(())
    }
}

impl Job {
    /// Joins as `settings` say, this process rank `rank` of `size`, placed as `place` says.
    fn join_as(
        py: Python<'_>,
        settings: JoinSettings,
        rank: usize,
        size: usize,
        key: &str,
        secret: &str,
        place: Place<'_>,
    ) -> PyResult<Self> {
        let placed = place.placement(rank, size)?;
        let key = key
            .parse::<JobKey>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let secret = secret
            .parse::<Secret>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let worker = py
            .detach(move || settings.join(key, secret, &placed))
            .map_err(error)?;
        Ok(Self {
            worker,
            secret,
            rank,
            size,
        })
    }
}

#[pymethods]
impl Job {
    /// Joins a job over the network: the daemon's listener `daemon` ("IP:PORT"), this
    /// member's `rank` of `size`, the job's `key` (32 hex digits) and `secret` (64), the
    /// same on every rank ([`new_key`]), and a `credential` ("NAME:KEY") to create the job.
    /// Waits until every rank is in (up to `timeout` seconds; the library's default, 30).
    ///
    /// Where every host runs its own daemon (reducing its ranks before the switch), give
    /// either `daemons`, every rank's daemon in rank order (ranks naming one daemon are
    /// one host's; rank 0's coordinates a ring), or this host's `local_rank` and
    /// `local_size` (the launcher's) and the `coordinator` (rank 0's host's daemon).
    #[staticmethod]
    #[pyo3(signature = (daemon, rank, size, key, secret, credential = None, slots = None, timeout = None, give_up = None, daemons = None, local_rank = None, local_size = None, coordinator = None, segment = None))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn join(
        py: Python<'_>,
        daemon: &str,
        rank: usize,
        size: usize,
        key: &str,
        secret: &str,
        credential: Option<&str>,
        slots: Option<usize>,
        timeout: Option<f64>,
        give_up: Option<f64>,
        daemons: Option<Vec<String>>,
        local_rank: Option<usize>,
        local_size: Option<usize>,
        coordinator: Option<&str>,
        segment: Option<usize>,
    ) -> PyResult<Self> {
        let mut settings = JoinSettings::new(address("daemon", daemon)?);
        Overrides {
            credential,
            slots,
            timeout,
            give_up,
        }
        .apply(&mut settings)?;
        let place = Place {
            daemons,
            local_rank,
            local_size,
            coordinator,
        };
        settings.segment = segment;
        Self::join_as(py, settings, rank, size, key, secret, place)
    }

    /// Joins the job the environment describes (`xagg.from_env`): the settings from
    /// `XAGG_DAEMON`, `XAGG_CREDENTIAL`, `XAGG_CREDENTIAL_FILE`, `XAGG_SLOTS`, `XAGG_JOIN_TIMEOUT_MS` and
    /// `XAGG_GIVE_UP_MS`, the float mode from `XAGG_FLOAT` (`fast`, the default, or `exact`);
    /// the job's key and secret from `XAGG_JOB_KEY` and
    /// `XAGG_JOB_SECRET`; the rank and size from the launcher; with `XAGG_COORDINATOR`,
    /// this host's ranks from the launcher. Keyword arguments override them; with
    /// `daemons` given, the launcher's host ranks are not read. `collective_timeout`
    /// (seconds) is how long a call waits for slow ranks unless `XAGG_TIMEOUT_S` is set.
    #[staticmethod]
    #[pyo3(signature = (*, daemon = None, rank = None, size = None, key = None, secret = None, credential = None, slots = None, timeout = None, give_up = None, daemons = None, local_rank = None, local_size = None, coordinator = None, segment = None, float = None, collective_timeout = None))]
    #[expect(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn from_env(
        py: Python<'_>,
        daemon: Option<&str>,
        rank: Option<usize>,
        size: Option<usize>,
        key: Option<String>,
        secret: Option<String>,
        credential: Option<&str>,
        slots: Option<usize>,
        timeout: Option<f64>,
        give_up: Option<f64>,
        daemons: Option<Vec<String>>,
        local_rank: Option<usize>,
        local_size: Option<usize>,
        coordinator: Option<String>,
        segment: Option<usize>,
        float: Option<String>,
        collective_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let mut place = Place {
            daemons,
            local_rank,
            local_size,
            coordinator: None,
        };
        let env_coordinator = std::env::var("XAGG_COORDINATOR").ok();
        if let (Some(_), None) = (&env_coordinator, &place.daemons) {
            let lr = first_var(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"]);
            let ls = first_var(&["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]);
            let (Some(lr), Some(ls)) = (lr, ls) else {
                return Err(XaggError::new_err(
                    "XAGG_COORDINATOR is set but not this host's ranks: set LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun and Open MPI set theirs)",
                ));
            };
            place.local_rank = Some(place.local_rank.map_or_else(|| number(lr.0, &lr.1), Ok)?);
            place.local_size = Some(place.local_size.map_or_else(|| number(ls.0, &ls.1), Ok)?);
        }
        let coordinator = coordinator.or(env_coordinator);
        place.coordinator = coordinator.as_deref().filter(|_| place.daemons.is_none());
        let key = key.or_else(|| std::env::var("XAGG_JOB_KEY").ok());
        let secret = secret.or_else(|| std::env::var("XAGG_JOB_SECRET").ok());
        let rank = match rank {
            Some(r) => Some(r),
            None => first_var(&["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])
                .map(|(n, v)| number(n, &v))
                .transpose()?,
        };
        let size = match size {
            Some(s) => Some(s),
            None => first_var(&["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
                .map(|(n, v)| number(n, &v))
                .transpose()?,
        };
        let daemon = daemon.map(|d| address("daemon", d)).transpose()?;
        let missing: Vec<&str> = [
            (
                "daemon",
                daemon.is_none() && std::env::var_os("XAGG_DAEMON").is_none(),
            ),
            ("key", key.is_none()),
            ("secret", secret.is_none()),
            ("rank", rank.is_none()),
            ("size", size.is_none()),
        ]
        .into_iter()
        .filter_map(|(what, unset)| unset.then_some(what))
        .collect();
        let described = match (key, secret, rank, size) {
            (Some(k), Some(s), Some(r), Some(n)) if missing.is_empty() => Some((k, s, r, n)),
            _ => None,
        };
        let Some((key, secret, rank, size)) = described else {
            return Err(XaggError::new_err(format!(
                "the job is not fully described: missing {} (set XAGG_DAEMON, XAGG_JOB_KEY, XAGG_JOB_SECRET and the launcher's RANK/WORLD_SIZE, or pass them)",
                missing.join(", ")
            )));
        };
        let mut settings = match daemon {
            Some(d) => JoinSettings::from_env_at(d),
            None => JoinSettings::from_env(),
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Overrides {
            credential,
            slots,
            timeout,
            give_up,
        }
        .apply(&mut settings)?;
        settings.segment = segment;
        // How long a call waits for slow ranks: `collective_timeout` (seconds; the process
        // group's timeout) unless XAGG_TIMEOUT_S is set.
        if let (Some(t), None) = (collective_timeout, std::env::var_os("XAGG_TIMEOUT_S")) {
            if !(t.is_finite() && t > 0.0) {
                return Err(PyValueError::new_err(format!(
                    "collective_timeout {t}: a number of seconds above 0"
                )));
            }
            settings.collective_timeout = Some(Duration::from_secs_f64(t));
        }
        // How float sums travel: `float`, else XAGG_FLOAT; the fast lane by default.
        let float = float.or_else(|| std::env::var("XAGG_FLOAT").ok());
        // `none` is the caller's to act on (float sums by Gloo): the worker keeps the fast lane.
        settings.float = xagg_worker::float_mode(float.as_deref(), Float::Fast)
            .map_err(PyValueError::new_err)?
            .unwrap_or(Float::Fast);
        Self::join_as(py, settings, rank, size, &key, &secret, place)
    }

    /// Starts an allreduce of `array` in place with `op` ("sum", "min", "max", "avg",
    /// "prod", "and", "or", "xor") and returns its `Request`. Every rank submits the same
    /// calls in the same order. The array must stay untouched until the request ends.
    /// `dtype` reduces its elements as another type of their size: "bf16" over an int16
    /// or uint16 view of bfloat16 data.
    #[pyo3(signature = (array, op = "sum", dtype = None))]
    fn submit(
        &self,
        array: &Bound<'_, PyUntypedArray>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<Request> {
        let r = self
            .worker
            .submit(op_of(op)?, buffer(array, dtype)?)
            .map_err(error)?;
        Ok(Request {
            inner: Some(r),
            worker: self.worker.clone(),
            recovered: 0,
            outcome: None,
            kind: None,
        })
    }

    /// Starts `collective` ("reduce_scatter", "all_gather", "broadcast", "reduce" or
    /// "allreduce") with its result in `output` and returns its `Request`; `input` is what
    /// the rank sends where it differs from the output (a reduce-scatter's n blocks, an
    /// all-gather's own block, a reduce's buffer when not in place), `op` the reduction
    /// (reduce-scatter, reduce, allreduce), `root` the root rank (broadcast, reduce).
    /// Every rank submits the job's calls in the same order; the arrays must stay
    /// untouched until the request ends. `dtype` as for `submit`.
    #[pyo3(signature = (collective, output, input = None, op = "sum", root = 0, dtype = None))]
    fn submit_collective(
        &self,
        collective: &str,
        output: &Bound<'_, PyUntypedArray>,
        input: Option<&Bound<'_, PyUntypedArray>>,
        op: &str,
        root: usize,
        dtype: Option<&str>,
    ) -> PyResult<Request> {
        let c: xagg_worker::Collective = collective
            .parse()
            .map_err(|e: xagg_common::wire::UnknownName| PyValueError::new_err(e.to_string()))?;
        let input = input.map(|i| buffer(i, dtype)).transpose()?;
        let r = self
            .worker
            .submit_collective(c, op_of(op)?, root, input, buffer(output, dtype)?)
            .map_err(error)?;
        Ok(Request {
            inner: Some(r),
            worker: self.worker.clone(),
            recovered: 0,
            outcome: None,
            kind: None,
        })
    }

    /// Starts answering the other ranks for results this rank holds; returns the address
    /// ("IP:PORT") to hand them. Every rank then calls `set_peers` with everyone's.
    fn serve_peers(&self) -> PyResult<String> {
        Ok(self
            .worker
            .serve_peers(&self.secret)
            .map_err(error)?
            .to_string())
    }

    /// Every rank's `serve_peers` address, in rank order: an allreduce the switch fails
    /// is then finished with the results other ranks hold.
    fn set_peers(&self, addresses: Vec<String>) -> PyResult<()> {
        let all = addresses
            .iter()
            .map(|a| {
                a.parse()
                    .map_err(|_| PyValueError::new_err(format!("peer address {a:?}: give IP:PORT")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.worker.set_peers(self.rank, all);
        Ok(())
    }

    /// Allreduce of `array` in place with `op`, waiting for it (the GIL released).
    #[pyo3(signature = (array, op = "sum"))]
    fn allreduce(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyUntypedArray>,
        op: &str,
    ) -> PyResult<()> {
        self.submit(array, op, None)?.wait(py, None).map(|_| ())
    }

    /// Leaves the job (the daemon removes it when every rank has left).
    fn leave(&self, py: Python<'_>) -> PyResult<()> {
        let w = self.worker.clone();
        py.detach(move || w.leave()).map_err(error)
    }

    /// Leaves the job without waiting for the daemon's answer (this rank reduces another
    /// way from now on).
    fn leave_soon(&self) {
        self.worker.leave_soon();
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

/// Which calls go to the switch by size: `XAGG_ROUTE`'s value (rank 0's, shared) for a
/// job of `ranks` whose float sums travel as `float` ("fast" or "exact"; `None` or "auto":
/// the bench's figures against Gloo; "all"; "none"; byte ranges such as "0-16KiB,32MiB-").
#[pyclass(module = "xagg")]
struct Route(xagg_worker::route::Route);

#[pymethods]
impl Route {
    #[new]
    #[pyo3(signature = (value, ranks, float = "fast"))]
    fn new(value: Option<&str>, ranks: usize, float: &str) -> PyResult<Self> {
        let float: Float = float
            .parse()
            .map_err(|e: xagg_common::wire::UnknownName| PyValueError::new_err(e.to_string()))?;
        xagg_worker::route::Route::parse(value, ranks, xagg_worker::route::Other::Gloo, float)
            .map(Self)
            .map_err(PyValueError::new_err)
    }

    /// Whether a call of `collective` ("allreduce", "reduce_scatter", "all_gather",
    /// "broadcast", "reduce") moving `nbytes` (the whole message: elements times their
    /// size) of elements of `dtype` (the switch's name: "f16", "bf16", "f32", ...; None
    /// where it does not matter) goes to the switch.
    #[pyo3(signature = (nbytes, collective = "allreduce", dtype = None))]
    fn takes(&self, nbytes: u64, collective: &str, dtype: Option<&str>) -> PyResult<bool> {
        let unknown = |e: xagg_common::wire::UnknownName| PyValueError::new_err(e.to_string());
        let c: xagg_common::wire::Collective = collective.parse().map_err(unknown)?;
        let t = dtype
            .map(str::parse::<DType>)
            .transpose()
            .map_err(unknown)?;
        Ok(self.0.takes(c, t, nbytes))
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }
}

/// A new random job key and secret, as hex: rank 0 makes them and shares them.
#[pyfunction]
fn new_key() -> (String, String) {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    (hex(&JobKey::random().0), hex(&Secret::random().0))
}

/// The longest segment, in bytes, this rank's path to the daemon `daemon` ("IP:PORT";
/// default `XAGG_DAEMON`) carries: its interface's MTU and the daemon's ports'. Ranks
/// take the smallest of theirs and pass it to `Job.join`/`from_env` as `segment`.
#[pyfunction]
#[pyo3(signature = (daemon = None))]
fn segment_bytes(py: Python<'_>, daemon: Option<&str>) -> PyResult<usize> {
    let settings = match daemon {
        Some(d) => JoinSettings::new(address("daemon", d)?),
        None => JoinSettings::from_env().map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    py.detach(move || settings.segment_bytes())
        .map_err(|e| XaggError::new_err(e.to_string()))
}

#[pymodule]
fn _xagg(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Job>()?;
    m.add_class::<Request>()?;
    m.add_class::<Route>()?;
    m.add_function(wrap_pyfunction!(new_key, m)?)?;
    m.add_function(wrap_pyfunction!(segment_bytes, m)?)?;
    m.add("XaggError", m.py().get_type::<XaggError>())?;
    Ok(())
}
