//! What can go wrong reading the protocol's values, and (feature `client`) talking to a
//! daemon's network listener.
//!
//! A variant that prints the error it wraps does not also give it as its `source()`, so an
//! error chain printed whole (`{:#}`) says it once.

#[cfg(feature = "client")]
use std::{net::SocketAddr, time::Duration};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key, nonce, proof or sealed secret that is not `bytes` bytes of hex.
    #[error("{what} is not {} hexadecimal digits ({bytes} bytes)", 2 * bytes)]
    NotHex { what: String, bytes: usize },
    #[cfg(feature = "client")]
    #[error("random: {0}")]
    Random(getrandom::Error),
    #[cfg(feature = "client")]
    #[error("the daemon's network listener at {daemon} does not answer ({error}): is xaggd running on that host, with daemon.listen set to that address? (Ranks are given that address in XAGG_DAEMON; a host daemon, in its [parent] daemon.)")]
    Unreachable {
        daemon: SocketAddr,
        error: ureq::Error,
    },
    /// An answer that is not the route's: its status and body as they came.
    #[cfg(feature = "client")]
    #[error("the daemon answered {route} with {status}: {body}")]
    Answer {
        route: String,
        status: ureq::http::StatusCode,
        body: String,
    },
    #[cfg(feature = "client")]
    #[error("sending hellos to {switch}: {error}")]
    Hellos {
        switch: std::net::SocketAddrV4,
        error: std::io::Error,
    },
    #[cfg(feature = "client")]
    #[error("the daemon refused it: {reason}")]
    Refused { reason: String },
    /// The job did not run in time: `waiting` is who it waits for, as the daemon says it
    /// (or the missing ranks).
    #[cfg(feature = "client")]
    #[error("{waiting} did not join within {timeout:?}")]
    NotJoined { waiting: String, timeout: Duration },
    /// The daemon saw none of this rank's hellos: its packets to the switch do not arrive.
    #[cfg(feature = "client")]
    #[error("none of this rank's hellos reached the switch at {switch} within {timeout:?} (the daemon answered, the data path did not): check that {} resolves from this host (a switch whose address is on no interface of its host needs a static neighbour here: `ip neigh replace {} lladdr MAC dev IFACE nud permanent`), that the route to it leaves by the switch's port, and that the port runs the switch (`xagg status`; the switch's `hello` counter stays 0)", switch.ip(), switch.ip())]
    NoHello {
        switch: std::net::SocketAddrV4,
        timeout: Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
