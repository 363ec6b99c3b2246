//! The lab and the test harness, shared by `xtask` (demo, bench) and the tests, never
//! shipped: the netns lab ([`lab`]), the BPF_PROG_RUN harness around the switch program
//! ([`testrun`]), the lab's switch daemon and its API ([`switch`]), and workers run as
//! `xagg allreduce` processes with their typed reports ([`workers`]), and labs of
//! aggregation trees — hosts reducing their ranks below the switch ([`tree`]).

pub mod lab;
pub mod mpi;
pub mod placement;
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

/// An XDP object `cargo xtask build` builds, into the target directory's `ebpf/`; read from
/// `XAGG_OBJECT_DIR` instead if set (a bench bundle's `objects/`).
#[derive(Clone, Copy, Debug)]
pub enum Object {
    /// The switch's (`xagg`), which `xaggd` attaches to its ports.
    Switch,
    /// A worker's (`xagg-host`: `xagg_host`), on the interface of a worker or a rank.
    Host,
    /// The bench's and the tests' programs (`xagg-test`: `xagg_floor`, `xagg_impair`).
    Test,
}

impl Object {
    pub fn path(self) -> PathBuf {
        let name = match self {
            Object::Switch => "xagg",
            Object::Host => "xagg-host",
            Object::Test => "xagg-test",
        };
        std::env::var_os("XAGG_OBJECT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("ebpf/bpfel-unknown-none/release"))
            .join(name)
    }

    /// The object's bytes, or an error naming it and how to build it.
    pub fn read(self) -> anyhow::Result<Vec<u8>> {
        use anyhow::Context;
        let path = self.path();
        std::fs::read(&path).with_context(|| {
            format!(
                "reading the XDP object {} (`cargo xtask build`)",
                path.display()
            )
        })
    }
}
