//! The integration tests, one binary: each file beside this one a module of its own (one
//! concept each); built as one program, the suite links once instead of once per file (23
//! links took most of its test build). `cargo xtask test NAME` runs the tests matching NAME,
//! `tree::` those of tree.rs.

mod afxdp;
mod api;
mod collectives;
mod concurrency;
mod daemon;
mod deploy;
mod fuzz_frames;
mod inner_table;
mod isolation;
mod join;
mod loss;
mod mpi;
mod netns;
mod netns_types;
mod observe;
mod ops;
mod python;
mod requests;
mod steer;
mod switch_table;
mod tree;
mod trust;
mod vectors;
