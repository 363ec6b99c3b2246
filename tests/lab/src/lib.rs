//! The lab and the test harness, shared by `xtask` (demo, bench) and the tests, never
//! shipped: the netns lab ([`lab`]), the BPF_PROG_RUN harness around the switch program
//! ([`testrun`]), the lab's switch daemon and its API ([`switch`]), and workers run as
//! `xagg allreduce` processes with their typed reports ([`workers`]), and labs of
//! aggregation trees — hosts reducing their ranks below the switch ([`tree`]).

pub mod lab;
pub mod mpi;
pub mod python;
pub mod switch;
pub mod testrun;
pub mod tree;
pub mod workers;

use std::path::{Path, PathBuf};

/// The workspace's target directory (`CARGO_TARGET_DIR`, or `target/` at the root).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2);
            root.expect("tests/lab sits two levels down").join("target")
        })
}

/// A release binary of this workspace (`xaggd`, `xagg`): from `XAGG_BIN_DIR` if set, else
/// the target directory's `release/`.
pub fn bin(name: &str) -> PathBuf {
    std::env::var_os("XAGG_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("release"))
        .join(name)
}

/// The object of the bench's and the tests' programs (`xagg_floor`, `xagg_impair`), which
/// `cargo xtask build` builds beside the switch's: in the target directory's `ebpf/`.
pub fn test_object() -> PathBuf {
    target_dir().join("ebpf/bpfel-unknown-none/release/xagg-test")
}
