//! `xagg allreduce`: allreduce a buffer through the switch as one member of a job, a job
//! added by hand or one joined over the network, and report the run.
//!
//! Here the arguments and the run's steps; the steps themselves in `start` (the worker),
//! `timed` (the timed allreduces) and `report` (the check and the report).

mod report;
mod start;
mod timed;

use std::{
    net::SocketAddrV4,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use serde::Deserialize;
use xagg_api::lane;
use xagg_common::{
    wire::{self, DType, Float, Op},
    JobShape,
};

#[derive(clap::Args)]
pub struct AllreduceArgs {
    /// Join the job over the network through the daemon's listener at this address
    /// (IP:PORT, `daemon.listen`), instead of naming a job added by hand: with --key,
    /// --secret-file, --member (this rank) and the job's shape (--members, --slots,
    /// --segment); --switch and --job come from the join.
    #[arg(long, value_name = "IP:PORT")]
    join: Option<std::net::SocketAddr>,
    /// The job's key (from `xagg keygen`), the same on every rank.
    #[arg(long, env = "XAGG_JOB_KEY")]
    key: Option<xagg_worker::JobKey>,
    /// A file holding the job's secret (from `xagg keygen`).
    #[arg(long, env = "XAGG_JOB_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// An admission credential's name, to create the job if this rank joins first. Without
    /// it, `XAGG_CREDENTIAL` as the MPI library and the Python module read it (`NAME` with
    /// the key's file, or `NAME:KEY`).
    #[arg(long)]
    credential: Option<String>,
    /// The file holding that credential's key.
    #[arg(long, env = "XAGG_CREDENTIAL_FILE")]
    credential_file: Option<PathBuf>,
    /// Seconds to wait for every rank to join (the worker library's default, as MPI's and
    /// Python's).
    #[arg(long, default_value_t = xagg_worker::JOIN_TIMEOUT.as_secs())]
    join_timeout_s: u64,
    /// Leave the joined job after the run (the daemon removes it when every rank left).
    #[arg(long)]
    leave: bool,
    /// Worker parameters file (TOML with the flags' names); flags override it.
    #[arg(long)]
    params: Option<PathBuf>,
    /// The switch: IP[:PORT].
    #[arg(long)]
    switch: Option<String>,
    /// This member's own IP:PORT, as registered in the job.
    #[arg(long)]
    bind: Option<SocketAddrV4>,
    /// The job's id at the switch (`xagg job list`), for a job added by hand.
    #[arg(long)]
    job: Option<u32>,
    /// This member's index in the job (0 to its members - 1), for a job added by hand.
    #[arg(long)]
    member: Option<u8>,
    /// The job's op (default sum): sum | min | max | avg | prod | and | or | xor.
    #[arg(long)]
    op: Option<Op>,
    /// The job's data type (default i32): i32 | u32 | i64 | f32 | f64 | f16 | bf16.
    #[arg(long)]
    dtype: Option<DType>,
    /// How float sums travel: fast (block floating point, one exponent per segment: a
    /// bound on the error, the last bits dependent on the order contributions meet) or
    /// exact (the exact sum of the inputs rounded once, the same bits whatever the order;
    /// f32, f16 and bf16 travel as 8 bytes; a segment too wide for it fails, flagged).
    /// Every member must use the same.
    #[arg(long, default_value = "fast")]
    pub(crate) float: Float,
    /// The job's segment length in elements (of the lane the op and type travel in).
    #[arg(long)]
    segment: Option<usize>,
    /// The job's slot count.
    #[arg(long)]
    slots: Option<usize>,
    /// The collective to run instead of allreduce: reduce_scatter, all_gather, broadcast
    /// or reduce. --size is its whole message (a reduce-scatter's input, an all-gather's
    /// output: --members blocks of --size / --members bytes, member i owning block i).
    #[arg(long, default_value = "allreduce")]
    collective: wire::Collective,
    /// The root member of a broadcast or reduce.
    #[arg(long, default_value_t = 0)]
    root: usize,
    /// Bytes to allreduce (suffixes: KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, default_value = "1MiB", value_parser = xagg_worker::parse_size)]
    size: usize,
    /// Seed of the generated test data (member m contributes element i = f(seed, m, i)).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Members of the job (the divisor of avg; with --verify, whose inputs the result is
    /// checked against).
    #[arg(long)]
    members: Option<usize>,
    /// Check the result bit-exactly against the locally computed wrapping sum.
    #[arg(long)]
    verify: bool,
    /// Start at this wall-clock time (ns since the Unix epoch): a common start for all
    /// workers of a measurement.
    #[arg(long)]
    start_at: Option<u64>,
    /// Message id of the first allreduce (must grow from one run on a job to the next).
    /// Without it the worker takes up the job where it stands: the message in progress
    /// (unless a member gave up on it, or its first rounds are gone from the switch), or
    /// the one after the newest the switch holds.
    #[arg(long, alias = "message")]
    mid: Option<u32>,
    /// Allreduces to run.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Test option: send segments out of order.
    #[arg(long)]
    reorder: bool,
    /// Send one datagram per system call instead of UDP GSO bursts.
    #[arg(long)]
    no_gso: bool,
    /// Read one result per system call instead of UDP GRO batches.
    #[arg(long)]
    no_gro: bool,
    /// Receive results with AF_XDP: attaches xagg_host to the interface holding the
    /// member's address (which must carry no other XDP program) and reads results from
    /// posted buffers instead of the UDP socket. Needs a build with the `afxdp` feature
    /// (the default).
    #[arg(long)]
    afxdp: bool,
    /// Waiting on results, poll this many µs for them, yielding the CPU, before sleeping
    /// (0: sleep at once).
    #[arg(long, default_value_t = 100)]
    spin_us: u64,
    /// Fail after this many milliseconds in which the switch answered nothing (no result,
    /// no status reply).
    #[arg(long, default_value_t = 10_000)]
    give_up_ms: u64,
    /// While the switch answers that it waits for other members, wait this many seconds
    /// before failing, naming them (30 minutes, as Gloo's and NCCL's).
    #[arg(long, default_value_t = 1800)]
    timeout_s: u64,
    /// Send slot s's contributions to the switch's port + s % N (its `switch.udp_ports`; a
    /// join learns it): with flow rules on the destination port, each slot is taken on one
    /// of the switch's receive queues.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    switch_ports: u8,
    /// Resend a contribution no sooner than this many milliseconds after it went out,
    /// however short the measured round trip: raise it where workers share CPUs with
    /// other busy processes, so that a peer held off its CPU does not make every round
    /// in flight go out twice.
    #[arg(long, default_value_t = xagg_worker::MIN_TIMEOUT.as_millis() as u64)]
    min_timeout_ms: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Record each allreduce's timed window with the machine's CPU counters at both ends
    /// (in the JSON report). The readings fall outside the windows, but they delay the
    /// next allreduce by some µs: leave this off when measuring small-message latency.
    #[arg(long)]
    cpu_windows: bool,
}

/// A `--params` file: the flags' names, each optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ParamsFile {
    switch: Option<String>,
    bind: Option<SocketAddrV4>,
    job: Option<u32>,
    member: Option<u8>,
    #[serde(default, deserialize_with = "some_name")]
    op: Option<Op>,
    #[serde(default, deserialize_with = "some_name")]
    dtype: Option<DType>,
    segment: Option<usize>,
    slots: Option<usize>,
    members: Option<usize>,
}

fn some_name<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
    D: serde::Deserializer<'de>,
{
    xagg_api::names::deserialize(d).map(Some)
}

impl ParamsFile {
    /// The `--params` file, or no settings without one.
    fn read(path: Option<&Path>) -> Result<Self> {
        Ok(match path {
            Some(p) => toml::from_str(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("params file {}", p.display()))?,
            None => ParamsFile::default(),
        })
    }
}

/// This member of the job as the flags settle it, over the params file: its address and
/// index, and the job's op, data type and shape.
struct Member {
    bind: SocketAddrV4,
    index: u8,
    op: Op,
    dtype: DType,
    segment: usize,
    members: usize,
    shape: JobShape,
}

impl Member {
    /// The flags over the params file; required ones missing are errors that name them.
    fn settle(a: &AllreduceArgs, f: &ParamsFile) -> Result<Self> {
        let bind = a
            .bind
            .or(f.bind)
            .context("--bind is required (this member's IP:PORT as registered in the job)")?;
        let index = a
            .member
            .or(f.member)
            .context("--member is required (this worker's member index)")?;
        let op = a.op.or(f.op).unwrap_or(Op::Sum);
        let dtype = a.dtype.or(f.dtype).unwrap_or(DType::I32);
        let segment = a
            .segment
            .or(f.segment)
            .context("--segment is required (the job's segment length)")?;
        let slots = a
            .slots
            .or(f.slots)
            .context("--slots is required (the job's slot count)")?;
        let members = a
            .members
            .or(f.members)
            .context("--members is required (the job's member count)")?;
        let shape = JobShape::with_elements(
            members,
            slots,
            segment,
            // What the switch does not reduce is refused in either mode.
            wire::lane_in(op, dtype, a.float)
                .map_or_else(|| lane(op, dtype).map_err(anyhow::Error::msg), Ok)?,
        )
        .map_err(|e| anyhow::anyhow!("--{}: {e}", e.field()))?;
        Ok(Member {
            bind,
            index,
            op,
            dtype,
            segment,
            members,
            shape,
        })
    }
}

/// Settles this member, starts the worker, runs the allreduces and reports them; a result
/// `--verify` finds wrong ends the process with status 2.
pub fn run(a: AllreduceArgs) -> Result<()> {
    let file = ParamsFile::read(a.params.as_deref())?;
    let me = Member::settle(&a, &file)?;
    let w = start::worker(&a, file, &me)?;
    let n = a.size / me.dtype.size();
    let runs = timed::run(&w, &a, &me, n);
    if a.leave && runs.is_err() {
        // A run that failed still leaves: its slots are of no use to anyone.
        let _ = w.leave();
    }
    let runs = runs?;
    let check = report::verify(&a, &me, n, &runs.first);
    report::print(&a, &me, runs, &check)?;
    if a.leave {
        w.leave()?;
    }
    if a.verify && !check.verified {
        std::process::exit(2);
    }
    Ok(())
}
