//! The daemon's local API: one JSON request per line on a Unix socket, one JSON response
//! per line back. The CLI is a client of it; anything else can be too (`docs/daemon.md`).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::job::JobSpec;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    AddJob {
        job: JobSpec,
    },
    RemoveJob {
        id: u32,
    },
    ListJobs,
    Counters,
    Status,
    /// The state of a job's busy slot versions (which members are missing).
    JobStatus {
        id: u32,
    },
    /// Fault injection in the dataplane: probabilities 0..=1 (0 = off).
    Inject {
        drop_contribution: f64,
        drop_result: f64,
    },
    /// Detach the dataplane, remove its pins, and stop the daemon.
    Detach,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Ok,
    Job {
        job: JobSpec,
    },
    Jobs {
        jobs: Vec<JobSpec>,
    },
    Counters {
        counters: BTreeMap<String, u64>,
    },
    Status {
        ports: Vec<String>,
        pinned: bool,
        adopted: bool,
        jobs: usize,
        slots_total: u32,
        slots_used: u32,
        /// The switch's address, collective port and MAC, as the dataplane has them.
        #[serde(default)]
        address: String,
        #[serde(default)]
        udp_port: u16,
        #[serde(default)]
        mac: String,
        /// `native`, `generic` or `auto`, as configured.
        #[serde(default)]
        xdp_mode: String,
        /// Where the dataplane is pinned (none when it detaches on exit).
        #[serde(default)]
        pin_path: Option<std::path::PathBuf>,
    },
    JobStatus {
        slots: Vec<crate::dataplane::SlotStatus>,
    },
    Error {
        message: String,
    },
}

/// Sends one request to the daemon at `socket` and waits for its response.
pub fn call(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the daemon at {}: is xaggd running? (start it with `xaggd --config FILE`, or pass --socket)",
            socket.display()
        )
    })?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut resp = String::new();
    r.read_line(&mut resp)?;
    if resp.is_empty() {
        bail!("the daemon closed the connection without answering");
    }
    serde_json::from_str(&resp).context("malformed response from the daemon")
}
