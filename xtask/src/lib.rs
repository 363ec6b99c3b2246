//! What `cargo xtask` does before a command runs: installing what it needs ([`setup`]) and
//! building it ([`build`]). `xtask-run` (the demo, the bench, the suite) uses the same
//! helpers.

pub mod build;
pub mod setup;
