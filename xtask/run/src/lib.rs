//! What `cargo xtask demo | bench | test` run, once `xtask` has installed and built what
//! they need. A library under a one-line binary: `xtask` compiles it while the eBPF
//! toolchain installs, before the XDP objects exist (`xtask::build::libraries`).

mod bench;
mod demo;
mod test;
mod topology;
mod xsk_send;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, demo and test the in-network aggregation switch (`cargo xtask --help` lists every command)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build, bring up a netns lab, allreduce through the XDP switch, verify, report, clean
    /// up. Installs iproute2 and the eBPF toolchain; `--mpi` adds Open MPI, `--ddp` PyTorch.
    Demo(demo::DemoArgs),
    /// Measure the switch against Open MPI end to end, the switch program's cost per
    /// packet (BPF_PROG_RUN) and the worker's conversions.
    Bench(bench::BenchArgs),
    /// Build and run the test suite: fmt and clippy, unit, BPF_PROG_RUN and netns end to
    /// end tests, the benchmark quick; `--long` adds fuzzing and the demo's topologies.
    Test(test::TestArgs),
}

/// Parses the command line and runs the command.
pub fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Test(a) => test::run_suite(&a),
    }
}
