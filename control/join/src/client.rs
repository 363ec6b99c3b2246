//! A plain blocking client of the join protocol (no runtime, nothing left running between
//! calls): the worker library joins its jobs with it, and a host's daemon joins its
//! parent's with it.

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use xagg_common::wire;

use crate::{JoinReply, JoinRequest, Nonce, NonceReply};

/// A daemon's network listener.
pub struct Client {
    http: ureq::Agent,
    pub daemon: SocketAddr,
}

/// A joined member's place: its job's wire id, its member index and slot range, and
/// the aggregation point's data address (and MAC, when the daemon says it).
#[derive(Clone, Debug)]
pub struct Joined {
    pub job: u32,
    pub member: u8,
    pub slot_base: u32,
    pub slots: u32,
    pub at: NonceReply,
}

impl Client {
    pub fn new(daemon: SocketAddr) -> Self {
        let http = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        Self { http, daemon }
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> String {
        format!(
            "the daemon's network listener at {} does not answer ({e}): is daemon.listen set to it?",
            self.daemon
        )
    }

    /// `GET /v1/nonce`.
    pub fn nonce(&self) -> Result<NonceReply, String> {
        self.http
            .get(format!("http://{}/v1/nonce", self.daemon))
            .call()
            .map_err(|e| self.unreachable(e))?
            .body_mut()
            .read_json()
            .map_err(|e| self.unreachable(e))
    }

    /// Posts `body` to `route` and reads the answer as `T`; an error answer of the API (a
    /// malformed request) is its message.
    pub fn post<T: serde::de::DeserializeOwned>(
        &self,
        route: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, String> {
        let mut r = self
            .http
            .post(format!("http://{}{route}", self.daemon))
            .send_json(body)
            .map_err(|e| self.unreachable(e))?;
        let text = r
            .body_mut()
            .read_to_string()
            .map_err(|e| self.unreachable(e))?;
        serde_json::from_str(&text)
            .map_err(|_| format!("the daemon answered {route} with {}: {text}", r.status()))
    }

    /// Joins a job until it runs: hellos from `sock` (the member's data socket) to the
    /// switch, then the join `request` makes for a nonce and a hello token, again until
    /// every member is in or `timeout` has passed.
    pub fn join(
        &self,
        sock: &UdpSocket,
        timeout: Duration,
        request: impl Fn(Nonce, u64) -> JoinRequest,
    ) -> Result<Joined, String> {
        let mut token = [0u8; 8];
        getrandom::fill(&mut token).map_err(|e| format!("random: {e}"))?;
        let token = u64::from_le_bytes(token);
        let mut hello = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
        wire::finish(&wire::hello(token), wire::STATUS_PAYLOAD, &mut hello)
            .expect("room for a hello");
        let start = Instant::now();
        let mut waiting = String::new();
        loop {
            let n = self.nonce()?;
            // Hellos from the data socket first: the switch records where they came from.
            for _ in 0..3 {
                sock.send_to(&hello, n.switch)
                    .map_err(|e| format!("sending hellos to {}: {e}", n.switch))?;
            }
            std::thread::sleep(Duration::from_millis(2));
            let req = request(n.nonce, token);
            match self.post::<JoinReply>("/v1/join", &req)? {
                JoinReply::Ready {
                    job,
                    member,
                    slot_base,
                    slots,
                } => {
                    return Ok(Joined {
                        job,
                        member,
                        slot_base,
                        slots,
                        at: n,
                    })
                }
                JoinReply::Refused { reason } => {
                    return Err(format!("the daemon refused it: {reason}"))
                }
                JoinReply::NoHello => {}
                JoinReply::Pending {
                    missing,
                    waiting: w,
                    ..
                } => {
                    waiting = w.unwrap_or_else(|| format!("ranks {missing:?}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "job {}: {waiting} did not join within {timeout:?}",
                    req.key
                ));
            }
        }
    }
}
