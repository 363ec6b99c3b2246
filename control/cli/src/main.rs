//! xagg — the aggregation switch's command line: jobs, counters, detaching, and running an
//! allreduce as a worker.
//!
//! One file per subcommand; this one holds the top-level arguments and the dispatch.

mod allreduce;
mod counters;
mod daemon;
mod detach;
#[cfg(feature = "afxdp")]
mod host;
mod inject;
mod job;
mod keygen;
mod status;
mod top;

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};
use xagg_api::DEFAULT_SOCKET;

/// Control the in-network aggregation switch, and run allreduces through it.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The daemon's API socket.
    #[arg(long, global = true, env = "XAGG_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Add, remove and list jobs.
    #[command(subcommand)]
    Job(job::JobCmd),
    /// The dataplane's counters, summed over CPUs.
    Counters {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The switch's address, ports, XDP mode, pinning, jobs and slots in use.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fault injection in the dataplane (off by default): drop fractions of contributions
    /// and of result copies. Each call sets both (one left out is 0); with neither, it is
    /// turned off. `xagg status` says when it is on.
    Inject {
        /// The fraction of contributions dropped at the switch (0 to 1).
        #[arg(long, default_value_t = 0.0)]
        drop_contrib: f64,
        /// The fraction of result copies dropped on their way to the members (0 to 1).
        #[arg(long, default_value_t = 0.0)]
        drop_result: f64,
    },
    /// Detach the dataplane and remove its pins; stops the daemon if it runs.
    Detach {
        /// The pin directory of the dataplane to detach: removed directly when no daemon
        /// answers (default /sys/fs/bpf/xagg); when one does, it must be the daemon's.
        #[arg(long)]
        pin_path: Option<PathBuf>,
    },
    /// Allreduce a buffer through the switch, as one member of a job.
    Allreduce(Box<allreduce::AllreduceArgs>),
    /// A rank's end of a veth behind a switch or host aggregator port: attach (pinned) or
    /// detach the XDP program without which veth drops the results redirected into it.
    #[cfg(feature = "afxdp")]
    #[command(subcommand)]
    Host(host::HostCmd),
    /// A live view of the jobs: segments and contributions per second, retransmissions,
    /// drops by reason, slots waiting and for whom. Ctrl-C ends it.
    Top {
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Make a new job key and secret for a job workers join (`xagg allreduce --join`):
    /// prints the key, writes the secret to a file readable by its owner only.
    Keygen {
        /// Where to write the job's secret (hex); share it with every rank, not on a
        /// command line.
        #[arg(long)]
        secret_file: PathBuf,
    },
}

fn main() {
    // Output piped into `head` and the like ends quietly when the reader is gone, as
    // with other command-line tools, instead of panicking on a broken pipe.
    // Safety: at the start of main, before any thread or other handler exists.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("xagg: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let socket = &cli.socket;
    match cli.cmd {
        Cmd::Job(cmd) => job::run(socket, cmd),
        Cmd::Counters { json } => counters::run(socket, json),
        Cmd::Status { json } => status::run(socket, json),
        Cmd::Inject {
            drop_contrib,
            drop_result,
        } => inject::run(socket, drop_contrib, drop_result),
        Cmd::Detach { pin_path } => detach::run(socket, pin_path),
        Cmd::Allreduce(a) => allreduce::run(*a),
        #[cfg(feature = "afxdp")]
        Cmd::Host(cmd) => host::run(cmd),
        Cmd::Top { interval_ms, count } => {
            top::run(socket, Duration::from_millis(interval_ms), count)
        }
        Cmd::Keygen { secret_file } => keygen::run(&secret_file),
    }
}
