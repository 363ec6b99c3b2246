//! xagg — the aggregation switch's command line: jobs, counters, detaching, and running an
//! allreduce as a worker.

mod top;

use std::{
    net::SocketAddrV4,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::Deserialize;
use xagg_common::{
    wire::{DType, Op, DEFAULT_PORT},
    JobShape,
};
use xagg_daemon::{
    api::{call, Request, Response},
    config::{DEFAULT_PIN_PATH, DEFAULT_SOCKET},
    job::{lane, JobSpec, MemberSpec},
};
use xagg_worker::{
    report::{CpuSample, CpuWindow, RunReport},
    Worker, WorkerParams,
};

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
    Job(JobCmd),
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
    /// and of result copies. `--drop-contrib 0 --drop-result 0` turns it off.
    Inject {
        #[arg(long, default_value_t = 0.0)]
        drop_contrib: f64,
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
    Allreduce(Box<AllreduceArgs>),
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

#[derive(Subcommand)]
enum JobCmd {
    /// Add a job, from flags or from a TOML file of its fields (docs/job.toml).
    Add(JobAddArgs),
    /// Remove a job; its slots are cleared and freed.
    Remove { id: u32 },
    /// List the jobs on the switch.
    List {
        #[arg(long)]
        json: bool,
    },
    /// A job's busy slots and the members each still waits for; without an id, the jobs
    /// workers joined over the network, pending (which ranks are missing) or running.
    Status {
        id: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// A job's place in its tree or ring as this daemon sees it: its role, its members,
    /// the aggregation point above it (or its ring neighbours) and how it reaches them,
    /// and this level's counters.
    Tree { id: u32 },
}

#[derive(clap::Args)]
struct JobAddArgs {
    /// Job file (TOML); flags given as well override its fields.
    #[arg(long)]
    file: Option<PathBuf>,
    #[arg(long)]
    id: Option<u32>,
    /// sum | min | max | avg | prod | and | or | xor
    #[arg(long)]
    op: Option<Op>,
    /// i32 | u32 | i64 | f32 | f64 | f16 | bf16
    #[arg(long)]
    dtype: Option<DType>,
    /// Elements per segment.
    #[arg(long)]
    segment: Option<u16>,
    /// Slots (segments in flight per member).
    #[arg(long)]
    slots: Option<u32>,
    /// A member, in member-index order: PORT,MAC,IP:UDPPORT (repeat the flag).
    #[arg(long = "member", value_name = "PORT,MAC,IP:UDPPORT")]
    members: Vec<String>,
}

#[derive(clap::Args)]
struct AllreduceArgs {
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
    /// An admission credential's name, to create the job if this rank joins first.
    #[arg(long, env = "XAGG_CREDENTIAL")]
    credential: Option<String>,
    /// The file holding that credential's key.
    #[arg(long, env = "XAGG_CREDENTIAL_FILE")]
    credential_file: Option<PathBuf>,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 60)]
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
    #[arg(long)]
    job: Option<u32>,
    #[arg(long)]
    member: Option<u8>,
    /// The job's op (default sum): sum | min | max | avg | prod | and | or | xor.
    #[arg(long)]
    op: Option<Op>,
    /// The job's data type (default i32): i32 | u32 | i64 | f32 | f64 | f16 | bf16.
    #[arg(long)]
    dtype: Option<DType>,
    /// The job's segment length in elements.
    #[arg(long)]
    segment: Option<usize>,
    /// The job's slot count.
    #[arg(long)]
    slots: Option<usize>,
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
    /// Without it the worker takes up the job where it stands: the message in progress,
    /// or the one after the newest the switch holds.
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
    /// posted buffers instead of the UDP socket.
    #[arg(long)]
    afxdp: bool,
    /// Waiting on results, poll this many µs for them, yielding the CPU, before sleeping
    /// (0: sleep at once).
    #[arg(long, default_value_t = 100)]
    spin_us: u64,
    /// Give up after this many milliseconds without a result.
    #[arg(long, default_value_t = 10_000)]
    give_up_ms: u64,
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
    xagg_daemon::names::deserialize(d).map(Some)
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
    match cli.cmd {
        Cmd::Job(JobCmd::Add(a)) => {
            let spec = job_spec(a)?;
            match call(&cli.socket, &Request::AddJob { job: spec })? {
                Response::Job { job } => {
                    let base = job.slot_base.unwrap_or(0);
                    println!(
                        "job {} added: {} members, {} {}, {} elements per segment, slots {}..{}",
                        job.id,
                        job.members.len(),
                        job.op,
                        job.dtype,
                        job.segment,
                        base,
                        base + job.slots
                    );
                    Ok(())
                }
                r => answer(r),
            }
        }
        Cmd::Job(JobCmd::Remove { id }) => answer(call(&cli.socket, &Request::RemoveJob { id })?),
        Cmd::Job(JobCmd::List { json }) => match call(&cli.socket, &Request::ListJobs)? {
            Response::Jobs { jobs } if json => {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
                Ok(())
            }
            Response::Jobs { jobs } => {
                println!(
                    "{:>6} {:>4} {:>5} {:>8} {:>11} {:>7}  level",
                    "job", "op", "dtype", "segment", "slots", "members"
                );
                for j in jobs {
                    let base = j.slot_base.unwrap_or(0);
                    println!(
                        "{:>6} {:>4} {:>5} {:>8} {:>11} {:>7}  {}",
                        j.id,
                        j.op,
                        j.dtype,
                        j.segment,
                        format!("{}..{}", base, base + j.slots),
                        j.members.len(),
                        level(&j)
                    );
                }
                Ok(())
            }
            r => answer(r),
        },
        Cmd::Job(JobCmd::Tree { id }) => tree(&cli.socket, id),
        Cmd::Job(JobCmd::Status { id: None, json }) => match call(&cli.socket, &Request::Joins)? {
            Response::Joins { joins } if json => {
                println!("{}", serde_json::to_string_pretty(&joins)?);
                Ok(())
            }
            Response::Joins { joins } => {
                if joins.is_empty() {
                    println!(
                        "no jobs joined over the network (jobs added by hand: `xagg job list`)"
                    );
                }
                for j in joins {
                    println!(
                        "job {} ({:#x}) key {}: {} members, {} slots, {}-byte segments, credential {}: {}",
                        j.id, j.id, j.key, j.members, j.slots, j.segment_bytes, j.credential,
                        if j.ready {
                            "running".to_string()
                        } else {
                            format!("pending for {:.0} s, ranks in {:?}, waiting for {:?}", j.waited_s, j.present, j.missing)
                        }
                    );
                }
                Ok(())
            }
            r => answer(r),
        },
        Cmd::Job(JobCmd::Status { id: Some(id), json }) => {
            match call(&cli.socket, &Request::JobStatus { id })? {
                r @ Response::JobStatus { .. } if json => {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                    Ok(())
                }
                Response::JobStatus { slots } => {
                    println!(
                        "{:>5} {:>6} {:>8} {:>8} {:>8} {:>6}  missing members",
                        "slot", "shadow", "state", "message", "segment", "count"
                    );
                    for s in slots {
                        println!(
                            "{:>5} {:>6} {:>8} {:>8} {:>8} {:>6}  {:?}",
                            s.slot, s.shadow, s.state, s.message, s.segment, s.count, s.missing
                        );
                    }
                    Ok(())
                }
                r => answer(r),
            }
        }
        Cmd::Inject {
            drop_contrib,
            drop_result,
        } => answer(call(
            &cli.socket,
            &Request::Inject {
                drop_contribution: drop_contrib,
                drop_result,
            },
        )?),
        Cmd::Counters { json } => match call(&cli.socket, &Request::Counters)? {
            Response::Counters { counters } if json => {
                println!("{}", serde_json::to_string_pretty(&counters)?);
                Ok(())
            }
            Response::Counters { counters } => {
                for (k, v) in counters {
                    println!("{k:>18} {v}");
                }
                Ok(())
            }
            r => answer(r),
        },
        Cmd::Status { json } => match call(&cli.socket, &Request::Status)? {
            r @ Response::Status { .. } if json => {
                println!("{}", serde_json::to_string_pretty(&r)?);
                Ok(())
            }
            Response::Status {
                ports,
                pinned,
                adopted,
                jobs,
                slots_total,
                slots_used,
                address,
                udp_port,
                mac,
                xdp_mode,
                pin_path,
            } => {
                println!("switch: {address}:{udp_port}, MAC {mac}, XDP mode {xdp_mode}");
                println!("ports: {}", ports.join(", "));
                if let Some(p) = pin_path {
                    println!("pinned at: {}", p.display());
                }
                println!(
                    "dataplane: {}{}",
                    if pinned {
                        "pinned (outlives the daemon)"
                    } else {
                        "detached when the daemon exits"
                    },
                    if adopted {
                        ", adopted from an earlier daemon"
                    } else {
                        ""
                    }
                );
                println!("jobs: {jobs}, slots used: {slots_used} of {slots_total}");
                Ok(())
            }
            r => answer(r),
        },
        Cmd::Detach { pin_path } => match call(&cli.socket, &Request::Status) {
            Ok(Response::Status {
                pin_path: theirs,
                ports,
                ..
            }) => {
                if let Some(mine) = &pin_path {
                    if theirs.as_ref() != Some(mine) {
                        bail!(
                            "the daemon at {} pins its dataplane at {}, not {}: nothing detached. Pass the --socket of the daemon that pins at {}, or stop it and run this again",
                            cli.socket.display(),
                            theirs.as_ref().map_or("nothing (it detaches on exit)".into(), |p| p.display().to_string()),
                            mine.display(),
                            mine.display()
                        );
                    }
                }
                answer(call(&cli.socket, &Request::Detach)?)?;
                println!(
                    "detached the dataplane on {}{} and stopped the daemon at {}",
                    ports.join(", "),
                    theirs.map_or(String::new(), |p| format!(", pinned at {}", p.display())),
                    cli.socket.display()
                );
                Ok(())
            }
            Ok(r) => answer(r),
            Err(_) => {
                let pin_path = pin_path.unwrap_or_else(|| DEFAULT_PIN_PATH.into());
                if xagg_daemon::dataplane::unpin(&pin_path)? {
                    println!(
                        "no daemon answered; removed the pinned dataplane at {}",
                        pin_path.display()
                    );
                } else {
                    println!(
                        "nothing to detach: no daemon answered and {} does not exist",
                        pin_path.display()
                    );
                }
                Ok(())
            }
        },
        Cmd::Allreduce(a) => allreduce(*a),
        Cmd::Top { interval_ms, count } => {
            top::run(&cli.socket, Duration::from_millis(interval_ms), count)
        }
        Cmd::Keygen { secret_file } => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&secret_file)
                .with_context(|| {
                    format!(
                        "creating {} (it must not exist: a secret is never overwritten)",
                        secret_file.display()
                    )
                })?;
            let secret = xagg_worker::Secret::random();
            let hex: String = secret.0.iter().map(|b| format!("{b:02x}")).collect();
            f.write_all(hex.as_bytes())?;
            println!("{}", xagg_worker::JobKey::random());
            Ok(())
        }
    }
}

fn answer(r: Response) -> Result<()> {
    match r {
        Response::Ok => Ok(()),
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer from the daemon: {other:?}"),
    }
}

fn job_spec(a: JobAddArgs) -> Result<JobSpec> {
    let mut spec: JobSpec = match &a.file {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("job file {}", p.display()))?
        }
        None => JobSpec {
            id: a.id.context("--id is required (or --file)")?,
            op: Op::Sum,
            dtype: DType::I32,
            segment: a.segment.context("--segment is required (or --file)")?,
            slots: a.slots.context("--slots is required (or --file)")?,
            members: Vec::new(),
            slot_base: None,
            parent: None,
            ring: None,
        },
    };
    if let Some(v) = a.id {
        spec.id = v;
    }
    if let Some(v) = a.op {
        spec.op = v;
    }
    if let Some(v) = a.dtype {
        spec.dtype = v;
    }
    if let Some(v) = a.segment {
        spec.segment = v;
    }
    if let Some(v) = a.slots {
        spec.slots = v;
    }
    if !a.members.is_empty() {
        spec.members = a
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| parse_member(m).with_context(|| format!("--member #{i}")))
            .collect::<Result<_>>()?;
    }
    Ok(spec)
}

fn parse_member(s: &str) -> Result<MemberSpec> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != 3 {
        bail!("`{s}`: write PORT,MAC,IP:UDPPORT, e.g. swp0,02:00:00:00:00:01,10.0.0.11:47801");
    }
    let addr = parts[2]
        .parse()
        .map_err(|_| anyhow::anyhow!("`{}` is not IP:UDPPORT", parts[2]))?;
    Ok(MemberSpec {
        interface: parts[0].into(),
        mac: parts[1].into(),
        addr,
    })
}

fn parse_switch(s: &str) -> Result<SocketAddrV4> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let ip = s
        .parse()
        .map_err(|_| anyhow::anyhow!("--switch `{s}`: write IP or IP:PORT"))?;
    Ok(SocketAddrV4::new(ip, DEFAULT_PORT))
}

fn allreduce(a: AllreduceArgs) -> Result<()> {
    let f: ParamsFile = match &a.params {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("params file {}", p.display()))?,
        None => ParamsFile::default(),
    };
    let bind = a
        .bind
        .or(f.bind)
        .context("--bind is required (this member's IP:PORT as registered in the job)")?;
    let member = a
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
        lane(op, dtype).map_err(anyhow::Error::msg)?,
    )
    .map_err(|e| anyhow::anyhow!("--{}: {e}", e.field()))?;
    let (w, mut p) = if let Some(daemon) = a.join {
        let read_hex = |path: &PathBuf, what: &str| -> Result<String> {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the {what} from {}", path.display()))
        };
        let secret: xagg_worker::Secret = read_hex(
            a.secret_file
                .as_ref()
                .context("--secret-file is required with --join (write one with `xagg keygen`)")?,
            "job's secret",
        )?
        .parse()
        .map_err(anyhow::Error::msg)?;
        let credential = match (&a.credential, &a.credential_file) {
            (Some(name), Some(file)) => Some((
                name.clone(),
                read_hex(file, "credential's key")?
                    .parse()
                    .map_err(anyhow::Error::msg)?,
            )),
            (None, None) => None,
            _ => bail!("--credential and --credential-file go together"),
        };
        let j = xagg_worker::JoinParams {
            daemon,
            key: a
                .key
                .context("--key is required with --join (from `xagg keygen`)")?,
            secret,
            rank: member,
            shape,
            bind,
            credential,
            timeout: Duration::from_secs(a.join_timeout_s),
            levels: None,
        };
        let w = Worker::join_with(j, |p| settings(p, &a, op, dtype))?;
        let p = w.params().clone();
        (Some(w), p)
    } else {
        let switch = parse_switch(
            &a.switch
                .clone()
                .or(f.switch)
                .context("--switch is required (the switch's IP[:PORT]), or --join")?,
        )?;
        let job = a.job.or(f.job).context("--job is required, or --join")?;
        (None, WorkerParams::new(switch, bind, job, member, shape))
    };
    settings(&mut p, &a, op, dtype);
    let size = dtype.size();
    if !a.size.is_multiple_of(size) {
        bail!(
            "--size {} is not a whole number of {dtype} elements ({size} bytes each)",
            a.size
        );
    }
    let leave = a.leave;
    let w = match w {
        Some(w) => w,
        None => Worker::new(p)?,
    };
    // Before any clock starts: which shadow copy each slot takes next, from the switch.
    w.sync()?;
    let n = a.size / size;
    // Every repeat allreduces the same data; the first result is verified once every clock
    // has stopped, so neither the data generation nor the check counts in time or CPU.
    let data = xagg_worker::data::generate(dtype, a.seed, member as u32, n);
    let mut buf = data.clone();
    let mut first = Vec::new();
    let mut reports = Vec::new();
    let iface = xagg_sys::iface::holding(*bind.ip()).ok().flatten();
    let tx = |i: &Option<String>| -> u64 {
        i.as_ref()
            .and_then(|i| {
                std::fs::read_to_string(format!("/sys/class/net/{i}/statistics/tx_bytes")).ok()
            })
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut tx0 = 0;
    // A long run shows its progress on a terminal (never in --json output).
    let bar = (!a.json && a.repeat > 1 && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| {
            indicatif::ProgressBar::new(u64::from(a.repeat)).with_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} allreduces, {msg}, {eta} left",
                )
                .expect("a valid template"),
            )
        });
    let mut windows = Vec::new();
    for r in 0..a.repeat {
        buf.copy_from_slice(&data);
        let common = match (a.start_at, r) {
            (Some(t), 0) => Some(wait_until(t)),
            _ => None,
        };
        // Read before the clock starts, so the reading is outside the window.
        let window_start = a.cpu_windows.then(cpu_sample);
        let started = common.unwrap_or_else(std::time::Instant::now);
        if r == 0 {
            tx0 = tx(&iface);
        }
        let mut rep = w.allreduce_bytes(&mut buf)?;
        // Wall time from the common start, so the slowest worker defines the run.
        rep.seconds = started.elapsed().as_secs_f64();
        if let Some(start) = window_start {
            windows.push(CpuWindow {
                start,
                end: cpu_sample(),
            });
        }
        rep.goodput_gbps = a.size as f64 * 8.0 / rep.seconds / 1e9;
        if r == 0 {
            first = buf.clone();
        }
        if let Some(b) = &bar {
            b.set_message(format!("{:.2} Gbit/s", rep.goodput_gbps));
            b.inc(1);
        }
        reports.push(rep);
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let tx_bytes = tx(&iface) - tx0;
    let mut verified = true;
    let mut worst_float_error = 0f64;
    if a.verify {
        let inputs: Vec<Vec<u8>> = (0..members as u32)
            .map(|k| xagg_worker::data::generate(dtype, a.seed, k, n))
            .collect();
        match xagg_worker::data::check(op, dtype, segment, &inputs, &first) {
            Ok(e) => worst_float_error = e,
            Err(e) => {
                eprintln!("member {member}: result wrong: {e}");
                verified = false;
            }
        }
    }
    let secs: f64 = reports.iter().map(|r| r.seconds).sum();
    let retx: u64 = reports.iter().map(|r| r.retransmissions).sum();
    let last = reports.last().cloned().unwrap_or_default();
    if a.json {
        let out = RunReport {
            member,
            bytes: a.size,
            repeat: a.repeat,
            seconds: last.seconds,
            seconds_all: reports.iter().map(|r| r.seconds).collect(),
            goodput_gbps: last.goodput_gbps,
            retransmissions: retx,
            reordered: reports.iter().map(|r| r.reordered).sum(),
            refused: reports.iter().map(|r| r.refused).sum(),
            lost_sends: reports.iter().map(|r| r.lost_sends).sum(),
            verified: a.verify && verified,
            op: op.to_string(),
            dtype: dtype.to_string(),
            float_error_of_bound: worst_float_error,
            cpu_windows: windows,
            tx_bytes,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "member {member}: {} x {} bytes in {:.3} s, last {:.3} s = {:.2} Gbit/s, {retx} retransmissions{}",
            a.repeat, a.size, secs, last.seconds, last.goodput_gbps,
            if a.verify { if verified { ", result verified" } else { ", RESULT WRONG" } } else { "" }
        );
    }
    if leave {
        w.leave()?;
    }
    if a.verify && !verified {
        std::process::exit(2);
    }
    Ok(())
}

/// The worker's settings from the flags.
fn settings(p: &mut WorkerParams, a: &AllreduceArgs, op: Op, dtype: DType) {
    p.op = op;
    p.dtype = dtype;
    if a.mid.is_some() {
        p.first_message = a.mid;
    }
    p.give_up = Duration::from_millis(a.give_up_ms);
    p.reorder = a.reorder;
    p.gso = !a.no_gso;
    p.gro = !a.no_gro;
    p.afxdp = a.afxdp;
    p.spin = Duration::from_micros(a.spin_us);
}

/// The machine's CPU counters and the wall clock, now.
fn cpu_sample() -> CpuSample {
    use procfs::CurrentSI;
    let wall_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let Ok(stat) = procfs::KernelStats::current() else {
        return CpuSample {
            wall_ns,
            ..Default::default()
        };
    };
    let t = stat.total;
    let s = |ticks: u64| ticks as f64 / procfs::ticks_per_second() as f64;
    CpuSample {
        wall_ns,
        user: s(t.user + t.nice),
        system: s(t.system),
        softirq: s(t.irq.unwrap_or(0) + t.softirq.unwrap_or(0)),
    }
}

/// Sleeps until `ns` (since the Unix epoch) and returns that moment as an Instant.
fn wait_until(ns: u64) -> std::time::Instant {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
        return std::time::Instant::now();
    }
    // Late: the clock still runs from the common start, so the set-up that made this
    // worker late counts against the run instead of flattering it.
    let late = Duration::from_nanos(now - ns);
    eprintln!(
        "warning: ready {:.1} ms after the common start (--start-at): give the workers a longer head start",
        late.as_secs_f64() * 1e3
    );
    std::time::Instant::now() - late
}

/// A job's level in a few words: root, an inner level and its parent, or a ring host.
fn level(j: &xagg_daemon::job::JobSpec) -> String {
    match (&j.parent, &j.ring) {
        (Some(p), _) => format!("inner: member {} of job {} at {}", p.member, p.job, p.addr),
        (None, Some(r)) => format!("ring: place {} of {}", r.position, r.size),
        (None, None) => "root".into(),
    }
}

/// `xagg job tree ID`: the job's place in its tree or ring, from this daemon.
fn tree(socket: &std::path::Path, id: u32) -> Result<()> {
    let Response::Jobs { jobs } = call(socket, &Request::ListJobs)? else {
        bail!("the daemon did not list its jobs");
    };
    let Some(j) = jobs.into_iter().find(|j| j.id == id) else {
        bail!("no job {id} on this daemon: `xagg job list` shows its jobs");
    };
    let here = match call(socket, &Request::Status)? {
        Response::Status {
            address, udp_port, ..
        } => format!("{address}:{udp_port}"),
        _ => "this switch".into(),
    };
    println!(
        "job {id}, answered by the daemon at {} (aggregation point {here})",
        socket.display()
    );
    println!("  level: {}", level(&j));
    for (i, m) in j.members.iter().enumerate() {
        println!(
            "  member {i}: {} on port {} ({})",
            m.addr, m.interface, m.mac
        );
    }
    match (&j.parent, &j.ring) {
        (Some(p), _) => println!(
            "  partials go up through port {} to {} ({}), as member {} of its job {}; its daemon shows that level (`xagg job tree {}` there)",
            p.interface, p.addr, p.mac, p.member, p.job, p.job
        ),
        (None, Some(r)) => println!(
            "  ring of {} hosts through port {}: predecessor {} ({}), successor {} ({}, where this host is member {}); each segment's chain starts at host segment mod {}",
            r.size, r.interface, r.predecessor.addr, r.predecessor.mac, r.successor.addr,
            r.successor.mac, r.successor.member, r.size
        ),
        (None, None) => println!("  the root: results go to the members"),
    }
    if let Response::JobCounters { job } = call(socket, &Request::JobCounters { id })? {
        let c: Vec<String> = job
            .counters
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("  this level's counters: {}", c.join(", "));
    }
    Ok(())
}
