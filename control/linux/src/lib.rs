//! What the daemon, the worker library and the lab take from the host they run on:
//! interface facts and network namespaces ([`iface`]), memory shared with the kernel
//! ([`pages`]), pinned programs ([`pins`]) and the daemons' claims on them ([`locks`]), CPU time and mounts ([`proc`]), CPU lists
//! ([`cpus`]), XDP attach modes ([`xdp`]), and the type an XDP object's bytes are handed over in ([`XdpObject`]; the binaries embed them, from `xagg-objects`).

pub mod cpus;
mod error;
pub mod iface;
pub mod locks;
mod object;
pub mod pages;
pub mod pins;
pub mod proc;
pub mod xdp;

pub use error::{Error, Result};
pub use object::XdpObject;
