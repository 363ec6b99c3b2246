//! `xagg allreduce`: allreduce a buffer through the switch as one member of a job, a job
//! added by hand or one joined over the network, and report the run.

use std::{
    net::SocketAddrV4,
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use xagg_common::{
    wire::{DType, Op, DEFAULT_PORT},
    JobShape,
};
use xagg_daemon::job::lane;
use xagg_worker::{
    report::{CpuSample, CpuWindow, RunReport},
    Worker, WorkerParams,
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

pub fn run(a: AllreduceArgs) -> Result<()> {
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
        let started = common.unwrap_or_else(Instant::now);
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
fn wait_until(ns: u64) -> Instant {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
        return Instant::now();
    }
    // Late: the clock still runs from the common start, so the set-up that made this
    // worker late counts against the run instead of flattering it.
    let late = Duration::from_nanos(now - ns);
    eprintln!(
        "warning: ready {:.1} ms after the common start (--start-at): give the workers a longer head start",
        late.as_secs_f64() * 1e3
    );
    Instant::now() - late
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
