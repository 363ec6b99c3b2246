//! The switch daemon's library: the dataplane loader ([`dataplane`]: load, attach, pin,
//! adopt, and the map operations), the jobs in the dataplane ([`job`]), the API's routes
//! ([`api`]) and the daemon's configuration ([`config`]). `xaggd` serves it; the API's
//! requests and answers, and the client the `xagg` CLI uses, are `xagg_api`'s.

pub mod api;
pub mod config;
pub mod dataplane;
pub mod head;
pub mod job;
pub mod join;
pub mod metrics;
