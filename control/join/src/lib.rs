//! The join protocol: how a worker joins a job over the network, without anyone typing
//! its interface, MAC or address. The daemon's network listener (opt-in,
//! `daemon.listen`) and the worker library speak it; HTTP/1.1 with JSON bodies, version 1.
//!
//! 1. `GET /v1/nonce` → [`NonceReply`]: a single-use nonce (valid [`NONCE_TTL_S`] s) and the
//!    switch's data address.
//! 2. The worker sends a hello ([`xagg_common::wire::hello`]) from its own data socket to the
//!    switch's collective port: the switch records the port it came in on and its source
//!    MAC, IPv4 address and UDP port under the hello's random token — exactly what it will
//!    check of the member's packets. Nothing the worker claims is trusted.
//! 3. `POST /v1/join` with a [`JoinRequest`] naming the job by its key (128 bits, chosen
//!    by the launcher and shared among its ranks), the job's shape, the rank and the hello
//!    token, with a proof of the job's secret over the nonce ([`Proof::join`]). The first
//!    valid join creates the job: it carries an admission credential's name, a proof of
//!    the credential over the same nonce, and the job's secret sealed under the
//!    credential ([`seal`]) — the secret never travels in clear. Later joins must agree
//!    on the shape. The answer ([`JoinReply`]) is pending (naming the missing ranks)
//!    until every rank is there, then the wire job id, the member index (the rank) and
//!    the slot range.
//! 4. `POST /v1/leave` and `POST /v1/joined/status` ([`MemberRequest`]), each proven the
//!    same way over a fresh nonce.
//!
//! Proofs are HMAC-SHA256 over a domain string and every field of the request, so a
//! captured request can be neither replayed (the nonce is spent) nor altered. Answers are
//! not authenticated: someone on the path can make a join fail, not join.
//!
//! **Levels.** A join may carry [`Levels`]: the job's ranks in all (N), the first rank the
//! member stands for and how many it stands for. A rank joining its host states N and its
//! global rank (weight 1); a host whose ranks are all in joins its parent's daemon (named
//! in the host daemon's configuration) as one member standing for its ranks, its levels
//! `open` and its shape of one member: the parent's level is complete when its members'
//! weights add up to N, and orders them by their first rank.
//!
//! **The ring.** A job's ranks may name a coordinator (the daemon of rank 0's host). Each
//! host whose ranks are in tells it where it is ([`RingRequest`]) while it joins its
//! parent; a host whose parent refuses the job, or does not answer within its
//! configured time, or that has no parent, says so, and the coordinator then places
//! every host in a ring ([`RingReply::Ring`]) once they are all known: the job runs
//! without the switch.

#[cfg(feature = "client")]
pub mod client;
mod error;

pub use error::{Error, Result};

use std::{fmt, net::SocketAddrV4};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use xagg_common::JobShape;

/// How long a nonce stays valid, in seconds.
pub const NONCE_TTL_S: u64 = 30;

/// A job's key: names the job; chosen at random by the launcher, shared by its ranks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey(pub [u8; 16]);

/// A job's secret (256 bits): proves membership. Never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 32]);

/// An admission credential's key (256 bits), configured on the daemon and given to whoever
/// may create jobs. Never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CredentialKey(pub [u8; 32]);

impl JobKey {
    /// A new random key.
    pub fn random() -> Self {
        Self(random())
    }
}

impl Secret {
    pub fn random() -> Self {
        Self(random())
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the kernel's random numbers");
    b
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobKey({self})")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CredentialKey(..)")
    }
}

/// Parses `n` bytes from hex, naming `what` in the error.
pub fn from_hex<const N: usize>(s: &str, what: &str) -> Result<[u8; N]> {
    let mut b = [0u8; N];
    hex::decode_to_slice(s.trim(), &mut b).map_err(|_| Error::NotHex {
        what: what.to_owned(),
        bytes: N,
    })?;
    Ok(b)
}

impl std::str::FromStr for JobKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        from_hex(s, "a job key").map(Self)
    }
}

impl std::str::FromStr for Secret {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        from_hex(s, "a job secret").map(Self)
    }
}

impl std::str::FromStr for CredentialKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        from_hex(s, "a credential key").map(Self)
    }
}

/// Hex on the wire, for keys, nonces, tokens and proofs.
macro_rules! hex_serde {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&hex::encode(self.0))
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                from_hex(&s, stringify!($t)).map(Self).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

/// A daemon's single-use nonce.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Nonce(pub [u8; 16]);

impl Nonce {
    pub fn random() -> Self {
        Self(random())
    }
}

/// An HMAC-SHA256 proof.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Proof(pub [u8; 32]);

/// A secret sealed under a credential for one nonce.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Sealed(pub [u8; 32]);

hex_serde!(JobKey, Nonce, Proof, Sealed);

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NonceReply {
    pub nonce: Nonce,
    /// The switch's data address and collective port: where hellos and contributions go.
    pub switch: SocketAddrV4,
    /// The switch's MAC (a child aggregation point addresses its partials to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Collective ports from `switch`'s on (`switch.udp_ports`): a member sends slot `s`'s
    /// contributions to the `s % switch_ports`-th. Left out when 1.
    #[serde(default = "one_port", skip_serializing_if = "is_one_port")]
    pub switch_ports: u8,
    /// The longest segment, in bytes, every port of this daemon carries in one packet (the
    /// smallest port MTU's): joining ranks take no longer one. Left out by older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u32>,
}

fn one_port() -> u8 {
    1
}

fn is_one_port(n: &u8) -> bool {
    *n == 1
}

/// Where a member of a job with levels stands (see the module's "Levels").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Levels {
    /// Ranks in the whole job.
    pub ranks: u32,
    /// The first (lowest) rank this member stands for: a rank's own, a host's lowest.
    pub first: u32,
    /// Ranks this member stands for: 1 for a rank, its ranks for a host.
    pub weight: u32,
    /// The daemon that places the job's hosts in a ring when the switch cannot take it
    /// (rank 0's host's network listener).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<SocketAddrV4>,
    /// The level joined is gathered by its children (a host joining its parent): its
    /// members are whoever joins, and the join's shape is of one member, the joiner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
}

impl Levels {
    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(18);
        b.extend(self.ranks.to_le_bytes());
        b.extend(self.first.to_le_bytes());
        b.extend(self.weight.to_le_bytes());
        if let Some(c) = self.coordinator {
            b.extend(c.ip().octets());
            b.extend(c.port().to_le_bytes());
        }
        b.push(u8::from(self.open));
        b
    }
}

/// Which way a job with levels runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "path", rename_all = "snake_case")]
pub enum Path {
    /// Through this host's parent (the switch).
    Tree,
    /// Round a ring of the job's hosts, and why.
    Ring { why: String },
}

/// A host of a job, as the ring needs it: its collective address and MAC, the ranks it
/// stands for, and its own wire id of the job (each host numbers its jobs itself; its
/// neighbours' frames to it carry this one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingHost {
    pub addr: SocketAddrV4,
    pub mac: String,
    pub first: u32,
    pub weight: u32,
    pub job: u32,
}

/// A host to its job's coordinator: where it is, and whether the tree failed it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingRequest {
    pub key: JobKey,
    pub nonce: Nonce,
    pub host: RingHost,
    /// Why this host's parent cannot take the job (refused, no answer, no parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// [`Proof::ring`] under the job's secret.
    pub proof: Proof,
}

/// The coordinator's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum RingReply {
    /// No host's tree failed: go on joining the parent.
    Tree,
    /// The ring, waiting for hosts still to come.
    Pending {
        why: String,
    },
    /// This host's place in the ring: its neighbours, and its member index at its
    /// successor.
    Ring {
        size: u8,
        position: u8,
        predecessor: RingHost,
        successor: RingHost,
        member: u8,
        why: String,
    },
    Refused {
        reason: String,
    },
}

impl RingRequest {
    pub fn new(
        key: JobKey,
        secret: &Secret,
        nonce: Nonce,
        host: RingHost,
        failed: Option<String>,
    ) -> Self {
        let mut r = Self {
            key,
            nonce,
            host,
            failed,
            proof: Proof([0; 32]),
        };
        r.proof = Proof::ring(secret, &r);
        r
    }
}

/// What creating a job adds to a join.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admission {
    /// The credential's name in the daemon's configuration.
    pub credential: String,
    /// [`Proof::admission`] under the credential's key.
    pub proof: Proof,
    /// The job's secret sealed under the credential's key ([`seal`]).
    pub secret: Sealed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub key: JobKey,
    pub shape: JobShape,
    pub rank: u8,
    /// The token of the hellos this member sent from its data socket.
    pub hello: u64,
    pub nonce: Nonce,
    /// [`Proof::join`] under the job's secret.
    pub proof: Proof,
    /// Present to create the job if it does not exist yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// Present in a job with levels (hosts, switches above them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub levels: Option<Levels>,
}

/// What a join request's answer says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum JoinReply {
    /// The switch has seen no hello with the request's token: send hellos again, then
    /// join again.
    NoHello,
    /// This member is in; the job waits for the ranks named (or, with levels, for what
    /// `waiting` says: ranks still to join elsewhere, or this level's parent).
    Pending {
        missing: Vec<u8>,
        waited_s: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waiting: Option<String>,
    },
    /// Every rank is in: the job runs.
    Ready {
        job: u32,
        member: u8,
        slot_base: u32,
        slots: u32,
        /// With levels: which way the job runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<Path>,
        /// The member's lease: it keeps its membership while it renews (`/v1/joined/renew`)
        /// within this many seconds; a daemon without leases says nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_s: Option<u32>,
    },
    /// Refused, and why (nothing changed).
    Refused { reason: String },
}

/// Leave a job, renew its lease, or ask for its state, as one of its members.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRequest {
    pub key: JobKey,
    pub rank: u8,
    pub nonce: Nonce,
    /// [`Proof::member`] under the job's secret, for the route's action
    /// ([`MemberRequest::action`]).
    pub proof: Proof,
    /// Leaving: the job's ranks this member found gone (their processes: their responders
    /// refused connections), so the daemon need not wait for their leases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<u8>,
}

/// The answer to a member's leave or status request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum MemberReply {
    Left,
    /// The lease runs again from now, for `lease_s` seconds.
    Renewed {
        lease_s: u32,
    },
    Status {
        job: u32,
        ready: bool,
        missing: Vec<u8>,
        /// Busy slots and the members each waits for: (slot, message, segment, missing).
        waiting: Vec<(u32, u32, u32, Vec<u8>)>,
    },
    Refused {
        reason: String,
    },
}

type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 of `parts` under `key`, each part preceded by its length (so no two lists
/// of parts give the same input).
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u32).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn shape_bytes(s: &JobShape) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&(s.members() as u64).to_le_bytes());
    b[8..16].copy_from_slice(&(s.slots() as u64).to_le_bytes());
    b[16..].copy_from_slice(&(s.segment_bytes() as u64).to_le_bytes());
    b
}

impl Proof {
    /// Proves knowledge of the job's secret for this join: every field of it.
    pub fn join(secret: &Secret, r: &JoinRequest) -> Self {
        let levels = r.levels.map(|l| l.bytes());
        let mut parts: Vec<&[u8]> = vec![b"xagg join v1", &r.nonce.0, &r.key.0];
        let shape = shape_bytes(&r.shape);
        let hello = r.hello.to_le_bytes();
        let rank = [r.rank];
        parts.extend([&shape[..], &rank, &hello]);
        if let Some(l) = &levels {
            parts.push(l);
        }
        Self(hmac(&secret.0, &parts))
    }

    /// Proves knowledge of the job's secret for a host's word to the coordinator.
    pub fn ring(secret: &Secret, r: &RingRequest) -> Self {
        let h = &r.host;
        let mut addr = [0u8; 6];
        addr[..4].copy_from_slice(&h.addr.ip().octets());
        addr[4..].copy_from_slice(&h.addr.port().to_le_bytes());
        Self(hmac(
            &secret.0,
            &[
                b"xagg ring v2",
                &r.nonce.0,
                &r.key.0,
                &addr,
                h.mac.as_bytes(),
                &h.first.to_le_bytes(),
                &h.weight.to_le_bytes(),
                &h.job.to_le_bytes(),
                r.failed.as_deref().unwrap_or("").as_bytes(),
            ],
        ))
    }

    /// Proves the credential for creating job `key` of `shape` with this nonce.
    pub fn admission(cred: &CredentialKey, nonce: &Nonce, key: &JobKey, shape: &JobShape) -> Self {
        Self(hmac(
            &cred.0,
            &[b"xagg admit v1", &nonce.0, &key.0, &shape_bytes(shape)],
        ))
    }

    /// Proves knowledge of the job's secret for `action` ("leave", "renew", "status").
    pub fn member(secret: &Secret, action: &str, nonce: &Nonce, key: &JobKey, rank: u8) -> Self {
        Self(hmac(
            &secret.0,
            &[
                b"xagg member v1",
                action.as_bytes(),
                &nonce.0,
                &key.0,
                &[rank],
            ],
        ))
    }

    /// Whether two proofs are equal, in constant time.
    pub fn matches(&self, other: &Proof) -> bool {
        use subtle::ConstantTimeEq;
        self.0.ct_eq(&other.0).into()
    }
}

/// The one-time pad that seals a secret under a credential for one nonce and job.
fn pad(cred: &CredentialKey, nonce: &Nonce, key: &JobKey) -> [u8; 32] {
    hmac(&cred.0, &[b"xagg seal v1", &nonce.0, &key.0])
}

/// Seals the job's secret under the credential: only the credential's holder (the
/// daemon) can open it, and only for this nonce and job.
pub fn seal(secret: &Secret, cred: &CredentialKey, nonce: &Nonce, key: &JobKey) -> Sealed {
    let p = pad(cred, nonce, key);
    Sealed(std::array::from_fn(|i| secret.0[i] ^ p[i]))
}

pub fn unseal(sealed: &Sealed, cred: &CredentialKey, nonce: &Nonce, key: &JobKey) -> Secret {
    let p = pad(cred, nonce, key);
    Secret(std::array::from_fn(|i| sealed.0[i] ^ p[i]))
}

impl JoinRequest {
    /// A join of member `rank`, proven with `secret`; with `admission` (a credential's
    /// name and key) it may create the job.
    #[expect(
        clippy::too_many_arguments,
        reason = "every field of the join is proven"
    )]
    pub fn new(
        key: JobKey,
        secret: &Secret,
        shape: JobShape,
        rank: u8,
        hello: u64,
        nonce: Nonce,
        admission: Option<(&str, &CredentialKey)>,
        levels: Option<Levels>,
    ) -> Self {
        let mut r = Self {
            key,
            shape,
            rank,
            hello,
            nonce,
            proof: Proof([0; 32]),
            admission: None,
            levels,
        };
        r.proof = Proof::join(secret, &r);
        r.admission = admission.map(|(name, cred)| Admission {
            credential: name.to_string(),
            proof: Proof::admission(cred, &nonce, &key, &shape),
            secret: seal(secret, cred, &nonce, &key),
        });
        r
    }
}

impl MemberRequest {
    pub fn new(key: JobKey, secret: &Secret, action: &str, rank: u8, nonce: Nonce) -> Self {
        Self::reporting(key, secret, action, rank, nonce, Vec::new())
    }

    /// [`Self::new`], naming the ranks this member found gone (a leave's).
    pub fn reporting(
        key: JobKey,
        secret: &Secret,
        action: &str,
        rank: u8,
        nonce: Nonce,
        gone: Vec<u8>,
    ) -> Self {
        let proven = Self::action(action, &gone);
        Self {
            key,
            rank,
            nonce,
            proof: Proof::member(secret, &proven, &nonce, &key, rank),
            gone,
        }
    }

    /// What the proof covers: the route's action, and the ranks found gone, so that
    /// nobody without the secret can add a rank to them.
    pub fn action(action: &str, gone: &[u8]) -> String {
        if gone.is_empty() {
            action.to_string()
        } else {
            format!("{action} gone {gone:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leave_proves_the_ranks_it_reports_gone() {
        let (key, secret, nonce) = (JobKey::random(), Secret::random(), Nonce::random());
        let r = MemberRequest::reporting(key, &secret, "leave", 0, nonce, vec![2]);
        let proven = |gone: &[u8]| {
            Proof::member(
                &secret,
                &MemberRequest::action("leave", gone),
                &nonce,
                &key,
                0,
            )
        };
        assert!(proven(&r.gone).matches(&r.proof));
        // Another list of ranks, or none: not what was proven.
        assert!(!proven(&[1, 2]).matches(&r.proof));
        assert!(!proven(&[]).matches(&r.proof));
        // A leave naming none proves as before.
        let plain = MemberRequest::new(key, &secret, "leave", 0, nonce);
        assert!(plain.gone.is_empty());
        assert!(Proof::member(&secret, "leave", &nonce, &key, 0).matches(&plain.proof));
        assert!(!serde_json::to_string(&plain).unwrap().contains("gone"));
    }

    #[test]
    fn proofs_bind_every_field_and_seals_open_only_with_the_credential() {
        let (key, secret, cred) = (JobKey::random(), Secret::random(), CredentialKey([7; 32]));
        let shape = JobShape::new(4, 64, 3440).unwrap();
        let nonce = Nonce::random();
        let r = JoinRequest::new(key, &secret, shape, 2, 99, nonce, Some(("a", &cred)), None);
        assert!(Proof::join(&secret, &r).matches(&r.proof));
        // Any field changed, or another secret: the proof no longer holds.
        for changed in [
            JoinRequest {
                rank: 3,
                ..r.clone()
            },
            JoinRequest {
                hello: 98,
                ..r.clone()
            },
            JoinRequest {
                nonce: Nonce::random(),
                ..r.clone()
            },
            JoinRequest {
                shape: JobShape::new(4, 65, 3440).unwrap(),
                ..r.clone()
            },
        ] {
            assert!(!Proof::join(&secret, &changed).matches(&r.proof));
        }
        assert!(!Proof::join(&Secret::random(), &r).matches(&r.proof));
        let a = r.admission.as_ref().unwrap();
        assert_ne!(a.secret.0, secret.0, "the secret travels sealed");
        assert_eq!(unseal(&a.secret, &cred, &nonce, &key), secret);
        assert_ne!(
            unseal(&a.secret, &CredentialKey([8; 32]), &nonce, &key),
            secret
        );
        assert_ne!(unseal(&a.secret, &cred, &Nonce::random(), &key), secret);
        // The wire form round-trips, and the secret's Debug prints nothing of it.
        let json = serde_json::to_string(&r).unwrap();
        let back: JoinRequest = serde_json::from_str(&json).unwrap();
        assert!(back.proof.matches(&r.proof));
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert!(!json.contains(&hex::encode(secret.0)));
    }
}
