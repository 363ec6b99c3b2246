//! Project tasks: `cargo xtask setup | build | demo | bench | test`.

mod bench;
mod build;
mod demo;
mod topology;
mod xsk_send;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Build, demo and test the in-network aggregation switch")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing (LLVM 22, rust-src, bpf-linker, iputils-ping, nftables,
    /// systemd-analyze), idempotently.
    Setup,
    /// Build the XDP object and the release binaries (xaggd, xagg).
    Build,
    /// Build, bring up a netns lab, allreduce through the XDP switch, verify, report, clean up.
    Demo(demo::DemoArgs),
    /// Measure the switch against Open MPI end to end, the switch program's cost per
    /// packet (BPF_PROG_RUN) and the worker's conversions.
    Bench(bench::BenchArgs),
    /// Build and run the whole test suite (unit, BPF_PROG_RUN, netns end to end).
    Test {
        /// Extra arguments for the test binaries (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup => build::setup(),
        Cmd::Build => {
            build::setup()?;
            build::build_all()
        }
        Cmd::Demo(a) => {
            build::setup()?;
            build::build_all()?;
            demo::run(a)
        }
        Cmd::Bench(a) => {
            build::setup()?;
            build::build_all()?;
            bench::run(a)
        }
        Cmd::Test { args } => {
            build::setup()?;
            build::build_all()?;
            build::test(&args)
        }
    }
}
