//! What can go wrong in an allreduce, and what the switch said about it
//! ([`AllreduceError`], the error of each call, which callers match on); and what can go
//! wrong before and around one: settings, placement, joining, AF_XDP receive, checking a
//! result ([`Error`]).
//!
//! A variant that prints the error it wraps does not also give it as its `source()`, so an
//! error chain printed whole (`{:#}`) says it once.

use std::{
    cmp::Ordering,
    io,
    net::{SocketAddr, SocketAddrV6},
    sync::Arc,
    time::Duration,
};

use xagg_common::wire::{DType, Op};

/// A segment whose result never came, and what the switch said about its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub slot: usize,
    pub segment: u32,
    /// Members the switch still waits for in this round: empty if the switch completed
    /// it (and so sent the result, which did not arrive); `None` if the switch did not
    /// answer, or holds another round in the slot (see `answered`).
    pub members: Option<Vec<u8>>,
    /// Whether the switch answered the status query at all.
    pub answered: bool,
    /// Whether the aggregation point (a host, a lower switch) has every member's
    /// contribution and sent its partial up: the level above has not answered.
    pub above: bool,
    /// What the level above waits for in this round, when it answered the query the
    /// aggregation point forwarded: its members still missing (empty: it completed the
    /// round, and its result did not come down).
    pub above_members: Option<Vec<u8>>,
    /// Whether this rank's giving up on the round is kept where it waits (the status
    /// reply after it carries `ENC_WITHDRAWN`), or the round was complete.
    pub withdrawn: bool,
    /// This rank's member index at its aggregation point: a round waiting for it did not
    /// take what it sent.
    pub me: u8,
    /// The round the slot's copy holds instead of this one, when it answered with another:
    /// an earlier one (this round not begun there) or a later one (this one completed).
    pub other_round: Option<Ordering>,
}

impl Missing {
    /// Whether everything there is to learn about this segment is in: the aggregation
    /// point's answer, and for a round it sent up, the level above's.
    pub fn complete(&self) -> bool {
        self.answered && (!self.above || self.above_members.is_some())
    }

    /// Whether nobody is waited for in this round and still no result came: it is
    /// complete (at this rank's aggregation point, and above it where it went up) and its
    /// result was lost on the way, or the level above it does not answer.
    pub fn stuck(&self) -> bool {
        (self.members.as_ref().is_some_and(Vec::is_empty)
            && (!self.above || self.above_members.as_ref().is_none_or(Vec::is_empty)))
            || self.other_round == Some(Ordering::Greater)
    }

    /// Whether the switch answers but has not begun this round at all: no member's
    /// contribution reached it (the switch taking none: a path that loses them all).
    pub fn unbegun(&self) -> bool {
        self.members.is_none() && self.answered && self.other_round == Some(Ordering::Less)
    }

    /// Whether the round has not taken what this member sent (a give-up time ago): it
    /// waits for this member, or has not begun at all.
    pub fn not_taken(&self) -> bool {
        self.members.as_ref().is_some_and(|m| m.contains(&self.me))
            || (self.members.is_none() && self.other_round == Some(Ordering::Less))
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (slot, segment) = (self.slot, self.segment);
        match (&self.members, self.answered) {
            (Some(m), _) if m.is_empty() && self.above => match &self.above_members {
                Some(up) if up.is_empty() => write!(
                    f,
                    "slot {slot} segment {segment}: the level above completed it, and its result did not come down to this rank's aggregation point"
                ),
                Some(up) => write!(
                    f,
                    "slot {slot} segment {segment}: this rank's aggregation point sent its partial up; the level above waits for its members {up:?}"
                ),
                None => write!(
                f,
                    "slot {slot} segment {segment}: this rank's aggregation point has every member's contribution and sent its partial up; the level above has not answered (a member missing there, or the parent gone)"
                ),
            },
            (Some(m), _) if m.is_empty() => write!(
                f,
                "slot {slot} segment {segment}: the switch completed it and sent the result, which never arrived here (a packet filter on this host? on veth, this host's end of the link must run an XDP program: `xagg host attach IFACE --netns NAME` as root on the host, or `xagg allreduce --afxdp`)"
            ),
            (Some(m), _) if m.contains(&self.me) => write!(
                f,
                "slot {slot} segment {segment} waits for members {m:?}, this one ({}) among them: the switch has not taken what it sent",
                self.me
            ),
            (Some(m), _) => write!(f, "slot {slot} segment {segment} waits for members {m:?}"),
            (None, true) if self.other_round == Some(Ordering::Greater) => write!(
                f,
                "slot {slot} segment {segment}: the switch completed this round and holds a later one: its result never arrived here"
            ),
            (None, true) => write!(
                f,
                "slot {slot} segment {segment}: the switch has not begun this round: none of this member's ({}) contributions reached it (lost on the way, or refused: `xagg counters` shows why)",
                self.me
            ),
            (None, false) => write!(
                f,
                "slot {slot} segment {segment}: no status reply from the switch"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AllreduceError {
    #[error("job {job} message {message} failed: no result for {:.1} s; {} missing: {}{}", waited.as_secs_f64(), segment_count(missing.len()), first_few(missing), if missing.iter().any(Missing::not_taken) { NOT_TAKEN } else { "" })]
    Timeout {
        job: u32,
        message: u32,
        waited: Duration,
        missing: Vec<Missing>,
    },
    #[error("job {job} message {message}: NaN or infinity in the input of {} ({}); their elements are NaN in the result", segment_count(segments.len()), first_few(segments))]
    NonFinite {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
    #[error("job {job} message {message}: the exact float sum is too wide for its lanes in {} ({}): the inputs span more binary orders than 64 bits (128 for doubles) hold, and their elements are NaN in the result; make them another way (the MPI library and the PyTorch backend do: Open MPI, Gloo) or with XAGG_FLOAT=fast", segment_count(segments.len()), first_few(segments))]
    Overflow {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
    #[error("job {job} message {message} failed: other members gave up on it (their collective timeout, XAGG_TIMEOUT_S, passed while they waited for this rank) in {} ({})", segment_count(segments.len()), first_few(segments))]
    GivenUp {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
    #[error("job {job}: no status reply from the switch at {switch} within {:.1} s: is the switch up (its dataplane attached, not detached), with job {job} on it and this member registered at this address and port? (on veth, replies are also lost when this host's end of the link runs no XDP program: `xagg host attach IFACE --netns NAME` as root on the host, or `xagg allreduce --afxdp`)", waited.as_secs_f64())]
    NoSwitch {
        job: u32,
        switch: std::net::SocketAddrV4,
        waited: Duration,
    },
    /// A rank the switch waits for (in a flat job its member; behind host levels a rank of
    /// a host it waits for, or a rank its host waits for) whose process is gone: its
    /// responder refuses connections.
    #[error("job {job} message {message}: the switch waits for rank {rank}, whose process is gone (its responder at {at} refuses connections): the job cannot go on without it")]
    MemberGone {
        job: u32,
        message: u32,
        rank: usize,
        at: std::net::SocketAddrV4,
    },
    /// A rank the switch waits for (as for [`Self::MemberGone`]) whose own call of this
    /// message failed for good (its responder says why): it sends the round nothing more.
    /// The ranks' calls did not match (another size, type, op or collective), or that
    /// rank failed otherwise.
    #[error("job {job} message {message}: the switch waits for rank {rank}, whose call of it failed there: {reason}")]
    MemberFailed {
        job: u32,
        message: u32,
        rank: usize,
        reason: String,
    },
    /// Not marked as the error's source: the message carries it once already.
    #[error("job {job}: the switch refused this member: {reason}")]
    Refused { job: u32, reason: String },
    #[error("job {job}{}: cancelled", message.map(|m| format!(" message {m}")).unwrap_or_default())]
    Cancelled { job: u32, message: Option<u32> },
    /// Joining (or leaving) the job failed: the daemon did not answer, refused, or not
    /// every rank came. Shared, as the error is handed to every waiting request.
    #[error("join: {0}")]
    Join(Arc<Error>),
    #[error("socket: {0}")]
    Io(io::Error),
    #[error("{0}")]
    Invalid(String),
    /// The AF_XDP receive path could not be set up.
    #[error("{0}")]
    AfXdp(Arc<Error>),
    /// A peer whose switch stopped answering asked this rank for a result it did not hold,
    /// and was promised it would not be taken from the switch: the request is finished
    /// from the peers instead ([`Worker::recover`](crate::Worker::recover)).
    #[error("job {job} message {message}: a peer recovering it was told this rank lacks segment {segment}, so it is taken from the peers, not the switch")]
    Withdrawn {
        job: u32,
        message: u32,
        segment: u32,
    },
    /// Recovery found segments no rank holds: no rank returned this call, and every rank
    /// reaches this verdict for it. Make it, and the job's later calls, another way.
    #[error("job {job} message {message}: the switch stopped answering and no rank holds {} ({}): no rank returned this call, so it is made another way", segment_count(segments.len()), first_few(segments))]
    Abandoned {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
}

impl AllreduceError {
    /// Whether the call ended because the switch did not take this rank's own
    /// contributions (refused: the ranks' calls did not match; or every copy lost on the
    /// way), not waiting for others.
    pub fn not_taken(&self) -> bool {
        matches!(self, Self::Timeout { missing, .. } if missing.iter().any(Missing::not_taken))
    }

    /// Why this rank's call of `message` failed, as its responder tells a peer that asks
    /// (the peer's [`Self::MemberFailed`] names this rank, the job and the message): a
    /// failure for another rank says that one's reason once, not the peer's whole error
    /// again at each link of a chain.
    pub fn fate(&self, job: u32, message: u32) -> String {
        match self {
            Self::MemberFailed { rank, reason, .. } => {
                format!("it gave up on rank {rank}, whose call failed there: {reason}")
            }
            Self::MemberGone { rank, at, .. } => {
                format!("it gave up on rank {rank}, whose process is gone (its responder at {at} refuses connections)")
            }
            e => {
                let e = e.to_string();
                let named = format!("job {job} message {message}");
                [": ", " failed: "]
                    .iter()
                    .find_map(|after| e.strip_prefix(&format!("{named}{after}")))
                    .map_or(e.clone(), str::to_owned)
            }
        }
    }

    /// Whether the peers may hold what this request lacks: the switch stopped answering
    /// or refused, the socket failed, or a peer was promised this rank would not wait.
    pub fn recoverable(&self) -> bool {
        match self {
            Self::NoSwitch { .. } | Self::Refused { .. } | Self::Io(_) | Self::Withdrawn { .. } => {
                true
            }
            // Results lost on the way here, or a level above that does not answer: the
            // peers may hold them. A round no member's contribution reached: nobody holds
            // it, and every rank finds so (the switch takes nothing: made another way). A
            // round that began without this member's (another op, type or count: the
            // calls differ) is not: making it another way would not mend the program.
            // (Members still waited for past the collective timeout are not the peers' to
            // fix.)
            Self::Timeout { missing, .. } => missing.iter().all(|m| m.stuck() || m.unbegun()),
            _ => false,
        }
    }
}

impl Clone for AllreduceError {
    fn clone(&self) -> Self {
        match self {
            Self::MemberGone {
                job,
                message,
                rank,
                at,
            } => Self::MemberGone {
                job: *job,
                message: *message,
                rank: *rank,
                at: *at,
            },
            Self::MemberFailed {
                job,
                message,
                rank,
                reason,
            } => Self::MemberFailed {
                job: *job,
                message: *message,
                rank: *rank,
                reason: reason.clone(),
            },
            Self::Timeout {
                job,
                message,
                waited,
                missing,
            } => Self::Timeout {
                job: *job,
                message: *message,
                waited: *waited,
                missing: missing.clone(),
            },
            Self::NonFinite {
                job,
                message,
                segments,
            } => Self::NonFinite {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
            Self::GivenUp {
                job,
                message,
                segments,
            } => Self::GivenUp {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
            Self::Overflow {
                job,
                message,
                segments,
            } => Self::Overflow {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
            Self::NoSwitch {
                job,
                switch,
                waited,
            } => Self::NoSwitch {
                job: *job,
                switch: *switch,
                waited: *waited,
            },
            Self::Refused { job, reason } => Self::Refused {
                job: *job,
                reason: reason.clone(),
            },
            Self::Cancelled { job, message } => Self::Cancelled {
                job: *job,
                message: *message,
            },
            // An OS error keeps its code; others their kind and text.
            Self::Io(e) => Self::Io(match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            }),
            Self::Invalid(s) => Self::Invalid(s.clone()),
            Self::Join(e) => Self::Join(e.clone()),
            Self::AfXdp(e) => Self::AfXdp(e.clone()),
            Self::Withdrawn {
                job,
                message,
                segment,
            } => Self::Withdrawn {
                job: *job,
                message: *message,
                segment: *segment,
            },
            Self::Abandoned {
                job,
                message,
                segments,
            } => Self::Abandoned {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
        }
    }
}

/// The first eight items, comma-separated, then "..." if there are more.
/// Why the switch may not have taken a member's contributions, said once however many
/// segments it did not take.
const NOT_TAKEN: &str = ". What this member sent was lost on the way, or refused: the round began with another op, type or count — the members' calls differ, and every member must make the same calls, with the same size, type and op, in the same order (`xagg counters` on the switch's host shows such refusals as drop_bad_op or drop_bad_count)";

/// "1 segment", "3 segments".
fn segment_count(n: usize) -> String {
    format!("{n} segment{}", if n == 1 { "" } else { "s" })
}

fn first_few<T: std::fmt::Display>(items: &[T]) -> String {
    let mut s: Vec<String> = items.iter().take(8).map(|x| x.to_string()).collect();
    if items.len() > 8 {
        s.push("...".into());
    }
    s.join(", ")
}

impl From<io::Error> for AllreduceError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// What can go wrong outside a call: the settings and placement of a rank, its join, its
/// AF_XDP receive path, a size on a command line, a result checked against its inputs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "rank {rank} of {size}: a job has 1 to {} ranks, numbered from 0",
        crate::codec::MAX_RANKS
    )]
    Rank { rank: usize, size: usize },
    #[error("{ranks} ranks at one daemon: a job has at most {} members there (hosts of fewer ranks, each with its daemon, take more)", xagg_common::wire::MAX_MEMBERS)]
    TooManyMembers { ranks: usize },
    #[error("rank 0's daemon {daemon}: daemons listen on IPv4")]
    CoordinatorNotIpv4 { daemon: SocketAddrV6 },
    #[error("local rank {local_rank} of {local_size} on this host, in a job of {size} ranks: the local rank is below the local size, which is 1 to the job's size")]
    LocalRank {
        local_rank: usize,
        local_size: usize,
        size: usize,
    },
    #[error("XAGG_DAEMON is not set: give the switch daemon's network listener, e.g. XAGG_DAEMON=10.77.0.1:47900 (mpirun -x XAGG_DAEMON)")]
    NoDaemon,
    #[error("XAGG_DAEMON={value} is not an address: e.g. XAGG_DAEMON=10.77.0.1:47900")]
    NotAnAddress { value: String },
    #[error("{name}={value} is not a number")]
    NotANumber { name: String, value: String },
    #[error("XAGG_CREDENTIAL_FILE={file} (--credential-file) names no credential: set XAGG_CREDENTIAL=NAME (--credential NAME) too, the credential's name in the daemon's configuration")]
    CredentialUnnamed { file: String },
    #[error("XAGG_CREDENTIAL holds a key and XAGG_CREDENTIAL_FILE={file} another: give the key once — XAGG_CREDENTIAL=NAME with the file, which keeps it out of the environment")]
    CredentialTwice { file: String },
    #[error("the credential's key file {file} (--credential-file, XAGG_CREDENTIAL_FILE): {error} (the credential's key, 64 hex digits, as in the daemon's key_file: the ranks' user must be able to read it, e.g. a copy of its own, mode 0400)")]
    CredentialFile { file: String, error: io::Error },
    /// `what` names the setting.
    #[error("{what} must be NAME:KEY (the credential's name in the daemon's configuration, its key as 64 hex digits), or NAME with the key's file in XAGG_CREDENTIAL_FILE (--credential-file)")]
    NotCredential { what: String },
    /// A key that is not hex, or a call to the daemon's listener that failed.
    #[error(transparent)]
    Protocol(#[from] xagg_join::Error),
    #[error("a UDP socket: {0}")]
    UdpSocket(io::Error),
    #[error("no route to the daemon at {daemon}: {error}")]
    NoRoute {
        daemon: SocketAddr,
        error: io::Error,
    },
    #[error("{local}: the switch takes IPv4 members")]
    NotIpv4 { local: SocketAddr },
    #[error("this host's address toward {daemon}: {error}")]
    NoLocalAddress {
        daemon: SocketAddr,
        error: io::Error,
    },
    #[error("the daemon refused to let this rank leave: {reason}")]
    LeaveRefused { reason: String },
    /// An answer the route does not give (its debug form).
    #[error("unexpected answer {answer}")]
    UnexpectedAnswer { answer: String },
    #[error("AF_XDP receive: no interface holds {ip} in this network namespace")]
    NoInterface { ip: std::net::Ipv4Addr },
    #[error("AF_XDP receive: this build of the worker library lacks the `afxdp` feature")]
    NoAfXdp,
    /// This host's interfaces (their MTU, the one holding an address).
    #[error(transparent)]
    Host(#[from] xagg_linux::Error),
    /// Why the embedded object cannot be used.
    #[cfg(feature = "afxdp")]
    #[error("{0}")]
    NoObject(&'static str),
    #[cfg(feature = "afxdp")]
    #[error("{}", chain(.0))]
    Load(aya::EbpfError),
    #[cfg(feature = "afxdp")]
    #[error("no {0} map")]
    NoMap(&'static str),
    #[cfg(feature = "afxdp")]
    #[error("{}", chain(.0))]
    Map(aya::maps::MapError),
    #[cfg(feature = "afxdp")]
    #[error("no xagg_host program")]
    NoProgram,
    #[cfg(feature = "afxdp")]
    #[error("{name} ({}): {error}", file.display())]
    Netns {
        name: String,
        file: std::path::PathBuf,
        error: io::Error,
    },
    #[cfg(feature = "afxdp")]
    #[error("{}", chain(.0))]
    Program(aya::programs::ProgramError),
    #[cfg(feature = "afxdp")]
    #[error("{iface} already runs an XDP program ({mode} mode) that is not a pinned xagg_host: another tool's, or a program some process holds (`ip link show {iface}`). `ip link set dev {iface} xdp off` frees it; an xagg_host pinned elsewhere goes with `xagg host detach`")]
    HostEndTaken { iface: String, mode: &'static str },
    #[cfg(feature = "afxdp")]
    #[error("pinning xagg_host at {}: {error}", path.display())]
    HostEndPin {
        path: std::path::PathBuf,
        error: String,
    },
    #[cfg(feature = "afxdp")]
    #[error("attaching xagg_host to {iface}: {native}; AF_XDP receive attaches an xagg_host of its own: if `xagg host attach` pinned one there, detach it first (`xagg host detach {iface}`), or receive without AF_XDP (the pinned one serves); another program (`ip link show {iface}`) is its owner's to remove")]
    Attach {
        iface: String,
        /// The native attach's error (the generic one's says less).
        native: aya::programs::ProgramError,
    },
    #[cfg(feature = "afxdp")]
    #[error("the AF_XDP buffers: {0}")]
    Buffers(xagg_linux::Error),
    #[cfg(feature = "afxdp")]
    #[error("interface name: {0}")]
    InterfaceName(std::ffi::NulError),
    /// A step of setting up the AF_XDP socket.
    #[cfg(feature = "afxdp")]
    #[error("{what}: {errno}")]
    Xsk {
        what: &'static str,
        errno: xdpilone::Errno,
    },
    #[cfg(feature = "afxdp")]
    #[error("posted {posted} of {frames} AF_XDP buffers")]
    Posted { posted: u32, frames: u32 },
    #[error("`{text}` is not a size: use a number with an optional unit, e.g. 64MiB")]
    NotASize { text: String },
    #[error("unknown unit `{unit}` in `{text}`: use B, KiB, MiB, GiB, KB, MB or GB")]
    UnknownUnit { unit: String, text: String },
    #[error("`{text}` is too large")]
    SizeTooLarge { text: String },
    /// An element of a result that is not its inputs' reduction.
    #[error("element {element}: {got} != {want} ({} over {})", op.name(), dtype.name())]
    WrongInteger {
        element: usize,
        got: i128,
        want: i128,
        op: Op,
        dtype: DType,
    },
    #[error("element {element}: {got} != {want} ({} over {})", op.name(), dtype.name())]
    WrongFloat {
        element: usize,
        got: f64,
        want: f64,
        op: Op,
        dtype: DType,
    },
    /// A float sum or mean further from the exact one than the block floating point bound.
    #[error("element {element}: {got} vs {want}: error {error:e} above the bound {bound:e} (block exponent {exponent}, {} over {})", op.name(), dtype.name())]
    AboveBound {
        element: usize,
        got: f64,
        want: f64,
        error: f64,
        bound: f64,
        exponent: i32,
        op: Op,
        dtype: DType,
    },
}

impl From<xagg_join::Error> for AllreduceError {
    fn from(e: xagg_join::Error) -> Self {
        Self::Join(Arc::new(Error::Protocol(e)))
    }
}

/// An error and its sources, `: `-separated (as an error chain prints whole).
#[cfg(feature = "afxdp")]
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        next = cause.source();
    }
    s
}

/// The member's UDP socket at `at`, or why not, naming the address (`--bind`).
pub(crate) fn bind_udp(
    at: impl std::net::ToSocketAddrs + std::fmt::Display + Copy,
) -> Result<std::net::UdpSocket, AllreduceError> {
    std::net::UdpSocket::bind(at).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::AddrNotAvailable => {
                " (no interface here has that address: bind to this host's own address on the switch's network)"
            }
            io::ErrorKind::AddrInUse => " (another process has that port: choose another)",
            _ => "",
        };
        AllreduceError::Invalid(format!("binding the member's UDP socket to {at}: {e}{why}"))
    })
}

#[cfg(test)]
mod tests {
    use super::AllreduceError;

    /// What a rank's responder says of a failed call: its own error without the job and
    /// message (the asker's error names them), and for a failure for another rank, that
    /// rank and its reason once.
    #[test]
    fn a_fate_names_the_rank_it_failed_for_once() {
        let own = AllreduceError::Abandoned {
            job: 1,
            message: 7,
            segments: vec![3],
        };
        let said = own.fate(1, 7);
        assert!(!said.contains("job 1"), "{said}");
        let failed_for = AllreduceError::MemberFailed {
            job: 1,
            message: 7,
            rank: 3,
            reason: said.clone(),
        };
        assert_eq!(
            failed_for.fate(1, 7),
            format!("it gave up on rank 3, whose call failed there: {said}")
        );
        // As a third rank sees it: one clause per link, the job and message once.
        let asked = AllreduceError::MemberFailed {
            job: 1,
            message: 7,
            rank: 2,
            reason: failed_for.fate(1, 7),
        }
        .to_string();
        assert_eq!(asked.matches("job 1").count(), 1, "{asked}");
        assert!(asked.contains("rank 2, whose call of it failed there: it gave up on rank 3, whose call failed there: "), "{asked}");
    }
}
