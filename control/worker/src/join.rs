//! Joining a job over the network (the protocol: `xagg_join`): the worker opens its data
//! socket, sends hellos from it to the switch (which records the port and addresses they
//! came from), and joins through the daemon's network listener until every rank is in.
//! A plain blocking HTTP client: no runtime, nothing left running between calls.

use std::{
    net::{SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use xagg_common::{wire, JobShape};
use xagg_join::{
    CredentialKey, JobKey, JoinReply, JoinRequest, MemberReply, MemberRequest, NonceReply, Secret,
    Shape,
};

use crate::{AllreduceError, WorkerParams};

/// What a rank needs to join a job.
#[derive(Clone, Debug)]
pub struct JoinParams {
    /// The daemon's network listener (`daemon.listen`).
    pub daemon: SocketAddr,
    /// The job's key and secret, chosen by the launcher and shared by its ranks.
    pub key: JobKey,
    pub secret: Secret,
    /// This rank (its member index) and the job's shape, the same on every rank.
    pub rank: u8,
    pub shape: JobShape,
    /// This member's data address: its IPv4 address and a UDP port (0: any free one).
    pub bind: SocketAddrV4,
    /// An admission credential (name, key), to create the job if this rank is the first.
    pub credential: Option<(String, CredentialKey)>,
    /// How long to wait for every rank.
    pub timeout: Duration,
}

/// What a joined worker keeps to leave its job.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    daemon: SocketAddr,
    key: JobKey,
    secret: Secret,
    rank: u8,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn unreachable(daemon: SocketAddr, e: impl std::fmt::Display) -> AllreduceError {
    AllreduceError::Join(format!(
        "the daemon's network listener at {daemon} does not answer ({e}): is daemon.listen set to it?"
    ))
}

/// `GET /v1/nonce`.
fn nonce(http: &ureq::Agent, daemon: SocketAddr) -> Result<NonceReply, AllreduceError> {
    http.get(format!("http://{daemon}/v1/nonce"))
        .call()
        .map_err(|e| unreachable(daemon, e))?
        .body_mut()
        .read_json()
        .map_err(|e| unreachable(daemon, e))
}

/// Posts `body` to `route` and reads the answer as `T`; an error answer of the API (a
/// malformed request) is its message.
fn post<T: serde::de::DeserializeOwned>(
    http: &ureq::Agent,
    daemon: SocketAddr,
    route: &str,
    body: &impl serde::Serialize,
) -> Result<T, AllreduceError> {
    let mut r = http
        .post(format!("http://{daemon}{route}"))
        .send_json(body)
        .map_err(|e| unreachable(daemon, e))?;
    let text = r
        .body_mut()
        .read_to_string()
        .map_err(|e| unreachable(daemon, e))?;
    serde_json::from_str(&text).map_err(|_| {
        AllreduceError::Join(format!(
            "the daemon answered {route} with {}: {text}",
            r.status()
        ))
    })
}

/// Joins the job; returns the worker's parameters (job id, member index, the switch) and
/// its data socket, from which the hellos went.
pub(crate) fn join(
    j: &JoinParams,
) -> Result<(WorkerParams, std::net::UdpSocket, Membership), AllreduceError> {
    let http = agent();
    let mut n = nonce(&http, j.daemon)?;
    let sock = std::net::UdpSocket::bind(j.bind)?;
    // Port 0 in `j.bind` lets the system choose: the member is where the socket is.
    let bind = match sock.local_addr()? {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => {
            return Err(AllreduceError::Invalid(format!(
                "{a}: members are IPv4 addresses"
            )))
        }
    };
    let mut token = [0u8; 8];
    getrandom::fill(&mut token).map_err(|e| AllreduceError::Join(format!("random: {e}")))?;
    let token = u64::from_le_bytes(token);
    let mut hello = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
    wire::finish(&wire::hello(token), wire::STATUS_PAYLOAD, &mut hello).expect("room for a hello");
    let start = Instant::now();
    let mut missing = Vec::new();
    loop {
        // Hellos from the data socket first: the switch records where they came from.
        for _ in 0..3 {
            sock.send_to(&hello, n.switch)?;
        }
        std::thread::sleep(Duration::from_millis(2));
        let req = JoinRequest::new(
            j.key,
            &j.secret,
            Shape::from(j.shape),
            j.rank,
            token,
            n.nonce,
            j.credential
                .as_ref()
                .map(|(name, key)| (name.as_str(), key)),
        );
        match post::<JoinReply>(&http, j.daemon, "/v1/join", &req)? {
            JoinReply::Ready { job, member, .. } => {
                let mut p = WorkerParams::new(n.switch, bind, job, member, j.shape);
                p.first_message = None;
                let m = Membership {
                    daemon: j.daemon,
                    key: j.key,
                    secret: j.secret,
                    rank: j.rank,
                };
                return Ok((p, sock, m));
            }
            JoinReply::Refused { reason } => {
                return Err(AllreduceError::Join(format!(
                    "the daemon refused it: {reason}"
                )))
            }
            JoinReply::NoHello => {}
            JoinReply::Pending { missing: m, .. } => {
                missing = m;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if start.elapsed() > j.timeout {
            return Err(AllreduceError::Join(format!(
                "job {}: ranks {missing:?} did not join within {:?}",
                j.key, j.timeout
            )));
        }
        n = nonce(&http, j.daemon)?;
    }
}

impl Membership {
    /// Leaves the job: when every rank has left, the daemon removes it.
    pub(crate) fn leave(&self) -> Result<(), AllreduceError> {
        let http = agent();
        let n = nonce(&http, self.daemon)?;
        let req = MemberRequest::new(self.key, &self.secret, "leave", self.rank, n.nonce);
        match post::<MemberReply>(&http, self.daemon, "/v1/leave", &req)? {
            MemberReply::Left => Ok(()),
            MemberReply::Refused { reason } => Err(AllreduceError::Join(format!(
                "the daemon refused to let this rank leave: {reason}"
            ))),
            other => Err(AllreduceError::Join(format!("unexpected answer {other:?}"))),
        }
    }

    /// The job's state as the daemon sees it.
    pub(crate) fn status(&self) -> Result<MemberReply, AllreduceError> {
        let http = agent();
        let n = nonce(&http, self.daemon)?;
        let req = MemberRequest::new(self.key, &self.secret, "status", self.rank, n.nonce);
        post(&http, self.daemon, "/v1/joined/status", &req)
    }
}
