//! What can go wrong reading the host's facts.
//!
//! A variant that prints the OS error it wraps does not also give it as its `source()`,
//! so an error chain printed whole (`{:#}`) says it once.

use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no interface `{name}` in this network namespace: {errno}")]
    NoInterface { name: String, errno: Errno },
    #[error("no MAC address for interface `{name}`")]
    NoMac { name: String },
    /// Listing the interfaces' addresses failed.
    #[error(transparent)]
    Addresses(#[from] Errno),
    #[error("a socket to ask for an MTU: {errno}")]
    MtuSocket { errno: Errno },
    #[error("`{name}` is too long for an interface name")]
    NameTooLong { name: String },
    #[error("no MTU for interface `{name}` in this network namespace: {error}")]
    NoMtu { name: String, error: std::io::Error },
    #[error("`{text}` is not a MAC address: write six hex bytes, e.g. 02:00:00:00:00:01")]
    NotMac { text: String },
    #[error("network namespace `{name}` not found ({path}): {error}")]
    NoNetns {
        name: String,
        path: String,
        error: std::io::Error,
    },
    #[error("cannot enter network namespace `{name}`: {errno}")]
    EnterNetns { name: String, errno: Errno },
    #[error("reading {path}: {error}")]
    Proc {
        path: &'static str,
        error: std::io::Error,
    },
    #[error("asking the kernel (rtnetlink) how XDP is attached to `{name}`: {errno}")]
    Netlink { name: String, errno: Errno },
    #[error("mounting a bpffs at /sys/fs/bpf (needed to pin programs): {errno}")]
    MountBpffs { errno: Errno },
    #[error("mapping no memory")]
    EmptyMapping,
    #[error("mapping {size} bytes of buffers: {errno}")]
    Map { size: usize, errno: Errno },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
