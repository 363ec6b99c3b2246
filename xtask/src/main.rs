//! Project tasks: `cargo xtask setup | build | demo | bench | test`.

mod bench;
mod build;
mod demo;
mod setup;
mod test;
mod topology;
mod xsk_send;

use anyhow::Result;
use clap::{Parser, Subcommand};
use setup::Needs;

#[derive(Parser)]
#[command(about = "Build, demo and test the in-network aggregation switch")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install everything the test suite needs and is missing, idempotently: iproute2, the
    /// rust-src component, LLVM 22 and bpf-linker 0.13 (the eBPF toolchain); Open MPI and
    /// gfortran; Debian's PyTorch and NumPy, and a Python virtual environment with maturin;
    /// iputils-ping, nftables, tmux, systemd-analyze and mpi4py (the tests'); with `--fuzz`
    /// also cargo-fuzz. Every other command installs only what it uses.
    Setup {
        /// Also cargo-fuzz (for `cargo xtask test --long`).
        #[arg(long)]
        fuzz: bool,
    },
    /// Build the XDP object, the release binaries (xaggd, xagg), the MPI library, the
    /// Python module and the worker library's examples.
    Build,
    /// Build, bring up a netns lab, allreduce through the XDP switch, verify, report, clean
    /// up. Installs the eBPF toolchain; `--mpi` adds Open MPI, `--ddp` PyTorch.
    Demo(demo::DemoArgs),
    /// Measure the switch against Open MPI end to end, the switch program's cost per
    /// packet (BPF_PROG_RUN) and the worker's conversions.
    Bench(bench::BenchArgs),
    /// Build and run the test suite: fmt and clippy, unit, BPF_PROG_RUN and netns end to
    /// end tests, the benchmark quick; `--long` adds fuzzing and the demo's topologies.
    Test(test::TestArgs),
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup { fuzz } => setup::install(Needs::all(fuzz)),
        Cmd::Build => prepare(Needs::all(false)),
        Cmd::Demo(a) => {
            let fortran = a
                .mpi
                .as_ref()
                .is_some_and(|p| p.extension().is_some_and(|e| e != "c"));
            prepare(Needs {
                mpi: a.mpi.is_some(),
                fortran,
                python: a.ddp.is_some(),
                ..Needs::default()
            })?;
            demo::run(a)
        }
        Cmd::Bench(a) => {
            // Open MPI is the baseline of the end-to-end runs, which also run the MPI
            // library and the Python module.
            let against_others = !a.dataplane_only && !a.switch_only;
            prepare(Needs {
                mpi: against_others,
                python: against_others,
                ..Needs::default()
            })?;
            bench::run(a)
        }
        Cmd::Test(a) => {
            prepare(Needs::all(a.long))?;
            test::run_suite(&a)
        }
    }
}

/// Installs what is missing for `needs`, then builds it.
fn prepare(needs: Needs) -> Result<()> {
    setup::install(needs)?;
    build::build(needs)
}
