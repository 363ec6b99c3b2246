//! The switch daemon's library: the dataplane loader ([`dataplane`]: load, attach, pin,
//! adopt, and the map operations), the jobs in the dataplane ([`job`]), the API's routes
//! ([`api`]), the daemon's configuration ([`config`]) and what can go wrong in any of
//! them ([`Error`]). `xaggd` serves it; the API's requests and answers, and the client
//! the `xagg` CLI uses, are `xagg_api`'s.

pub mod api;
pub mod config;
pub mod connections;
pub mod dataplane;
mod error;
pub mod head;
pub mod job;
pub mod join;
pub mod metrics;
pub mod owner;
pub mod preflight;

pub use error::{Error, Result};
