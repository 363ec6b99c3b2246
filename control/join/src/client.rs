//! A plain blocking client of the join protocol (no runtime, nothing left running between
//! calls): the worker library joins its jobs with it, and a host's daemon joins its
//! parent's with it.

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use xagg_common::wire;

use crate::{Error, JoinReply, JoinRequest, Nonce, NonceReply, Result};

/// A daemon's network listener.
pub struct Client {
    http: ureq::Agent,
    pub daemon: SocketAddr,
}

/// A joined member's place: its job's wire id, its member index and slot range, which way
/// the job runs (with levels), and the aggregation point's data address (and MAC, when the
/// daemon says it).
#[derive(Clone, Debug)]
pub struct Joined {
    pub job: u32,
    pub member: u8,
    pub slot_base: u32,
    pub slots: u32,
    pub path: Option<crate::Path>,
    /// How long the membership lasts unrenewed, if the daemon keeps leases.
    pub lease_s: Option<u32>,
    pub at: NonceReply,
}

/// A join hello from the member's data socket, with its token.
pub struct Hello {
    pub token: u64,
    bytes: [u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD],
}

impl Hello {
    pub fn new() -> Result<Self> {
        let mut token = [0u8; 8];
        getrandom::fill(&mut token).map_err(Error::Random)?;
        let token = u64::from_le_bytes(token);
        let mut bytes = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
        wire::finish(&wire::hello(token), wire::STATUS_PAYLOAD, &mut bytes)
            .expect("room for a hello");
        Ok(Self { token, bytes })
    }
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

    fn unreachable(&self, error: ureq::Error) -> Error {
        Error::Unreachable {
            daemon: self.daemon,
            error,
        }
    }

    /// `GET /v1/nonce`.
    pub fn nonce(&self) -> Result<NonceReply> {
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
    ) -> Result<T> {
        let mut r = self
            .http
            .post(format!("http://{}{route}", self.daemon))
            .send_json(body)
            .map_err(|e| self.unreachable(e))?;
        let text = r
            .body_mut()
            .read_to_string()
            .map_err(|e| self.unreachable(e))?;
        serde_json::from_str(&text).map_err(|_| Error::Answer {
            route: route.to_owned(),
            status: r.status(),
            body: text,
        })
    }

    /// Joins a job until it runs: each round [`Client::join_once`], again until every
    /// member is in or `timeout` has passed.
    pub fn join(
        &self,
        sock: &UdpSocket,
        timeout: Duration,
        request: impl Fn(Nonce, u64) -> JoinRequest,
    ) -> Result<Joined> {
        let hello = Hello::new()?;
        let start = Instant::now();
        loop {
            let (reply, at) = self.join_once(sock, &hello, &request)?;
            match reply {
                JoinReply::Ready {
                    job,
                    member,
                    slot_base,
                    slots,
                    path,
                    lease_s,
                } => {
                    return Ok(Joined {
                        job,
                        member,
                        slot_base,
                        slots,
                        path,
                        lease_s,
                        at,
                    })
                }
                JoinReply::Refused { reason } => return Err(Error::Refused { reason }),
                JoinReply::NoHello => {
                    if start.elapsed() > timeout {
                        return Err(Error::NoHello {
                            switch: at.switch,
                            timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                JoinReply::Pending {
                    missing, waiting, ..
                } => {
                    if start.elapsed() > timeout {
                        let waiting = waiting.unwrap_or_else(|| format!("ranks {missing:?}"));
                        return Err(Error::NotJoined { waiting, timeout });
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// One round of a join: a nonce, hellos from the member's data socket (the switch
    /// records where they came from), the join request; its answer, and the nonce reply
    /// (the aggregation point's addresses).
    pub fn join_once(
        &self,
        sock: &UdpSocket,
        hello: &Hello,
        request: impl Fn(Nonce, u64) -> JoinRequest,
    ) -> Result<(JoinReply, NonceReply)> {
        let n = self.nonce()?;
        for _ in 0..3 {
            sock.send_to(&hello.bytes, n.switch)
                .map_err(|error| Error::Hellos {
                    switch: n.switch,
                    error,
                })?;
        }
        std::thread::sleep(Duration::from_millis(2));
        let req = request(n.nonce, hello.token);
        Ok((self.post::<JoinReply>("/v1/join", &req)?, n))
    }
}
