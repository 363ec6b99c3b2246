//! The switch daemon's library: the dataplane loader ([`dataplane`]: load, attach, pin,
//! adopt, and the map operations), the job API ([`job`], [`api`]) and the daemon's
//! configuration ([`config`]). `xaggd` serves it; the `xagg` CLI is a client of [`api`].

pub mod api;
pub mod config;
pub mod dataplane;
pub mod head;
pub mod job;
pub mod join;
pub mod metrics;
pub mod names;
