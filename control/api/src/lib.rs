//! The switch daemon's API, version 1, as its clients see it: HTTP/1.1 with JSON bodies on
//! the daemon's local Unix socket (`daemon.socket`). Each [`Request`] is one route
//! ([`Request::route`]); every answer's body is a [`Response`] in JSON, errors with a 4xx
//! status and `{"result": "error", "message": ...}`. The jobs requests carry are
//! [`JobSpec`]s ([`job`]); the listings and counters answers carry are in [`request`]. The
//! CLI, the lab and the tests are clients of it ([`call`]); anything that speaks HTTP over
//! a Unix socket can be (`curl --unix-socket /run/xagg/xaggd.sock
//! http://xagg/v1/status`). The routes are listed in `docs/daemon.md`; the daemon
//! (`xagg-daemon`) serves them.

use std::{io, path::PathBuf};

mod client;
pub mod job;
pub mod names;
pub mod request;

pub use client::call;
pub use job::{lane, JobSpec, MemberSpec, Neighbour, ParentSpec, RingSpec};
pub use request::{
    Faults, JobCounters, JoinListing, MemberCounters, ParentStatus, Request, Response, SlotStatus,
};

/// The version prefix of every route.
pub const VERSION: &str = "/v1";

/// Where the daemon serves the API unless `daemon.socket` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/xagg/xaggd.sock";
/// Where the daemon pins the dataplane unless `daemon.pin_path` says otherwise (`xagg
/// detach` removes it there when no daemon answers).
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/xagg";

/// A job spec that is wrong, or a call to the daemon that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of a job spec that is wrong, with how to fix it.
    #[error("job {field}: {problem}")]
    Job { field: String, problem: String },
    #[error("{op} over {dtype} is not supported: integers (i32, u32, i64) take sum, min, max, avg, prod, and, or, xor; floats (f32, f64, f16, bf16) take sum, min, max, avg")]
    Unsupported {
        op: xagg_common::wire::Op,
        dtype: xagg_common::wire::DType,
    },
    #[error("cannot reach the daemon at {}: is xaggd running? (start it with `xaggd --config FILE`, or pass --socket)", socket.display())]
    Unreachable { socket: PathBuf, source: io::Error },
    #[error("{} is not a socket: pass --socket (or XAGG_SOCKET) the daemon's daemon.socket", socket.display())]
    NotASocket { socket: PathBuf },
    /// The socket's permissions keep this user out.
    #[error("the daemon's socket {} is not open to you ({}): its daemon.socket_mode and daemon.socket_group say who may use the API; ask its operator to add you to that group (then log in again), or run as root", socket.display(), access)]
    Denied { socket: PathBuf, access: String },
    #[error("talking to the daemon at {}", socket.display())]
    Io { socket: PathBuf, source: io::Error },
    /// An answer that is not HTTP/1.1 as the daemon speaks it.
    #[error("the daemon's answer is not HTTP/1.1: {0}")]
    Http(String),
    #[error("the daemon answered {status} without a body")]
    NoBody { status: String },
    #[error("malformed response from the daemon ({status})")]
    Malformed {
        status: String,
        source: serde_json::Error,
    },
}

impl Error {
    /// A job spec's `field` that is wrong, and how to fix it.
    pub fn job(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::Job {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
