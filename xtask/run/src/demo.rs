//! The main job: a netns lab, the daemon, one job, N workers allreducing through the XDP
//! switch, verification, goodput and counters, and clean-up whatever happens.

use std::{
    path::Path,
    sync::atomic::{AtomicI32, Ordering},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use xagg_api::Response;
use xagg_common::{
    wire::{self, DType, Op},
    JobShape,
};
use xagg_lab::Object;
use xagg_lab::{
    lab::{self, Lab, SWITCH_IP},
    placement::{Cpus, Placement},
    switch::LabSwitch,
    workers::AllreduceRun,
};
use xagg_worker::report::RunReport;

use xtask::build::target_dir;

/// Names of the demo's namespaces, pins and socket start with this.
pub const PREFIX: &str = "xagg";
pub const JOB_ID: u32 = 1;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Workers (one network namespace each).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Bytes each worker allreduces (suffixes: KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, default_value = "64MiB", value_parser = xagg_worker::parse_size)]
    pub size: usize,
    /// Reduction: sum | min | max | avg | prod | and | or | xor.
    #[arg(long, default_value = "sum")]
    pub op: Op,
    /// Element type: i32 | u32 | i64 | f32 | f64 | f16 | bf16.
    #[arg(long, default_value = "i32")]
    pub dtype: DType,
    /// Elements per segment; by default as many as the lab's MTU carries for the op and
    /// type (2232 for i32 sum at 9000; 860 or fewer keep frames single-buffer on veth).
    #[arg(long)]
    pub segment: Option<u16>,
    /// MTU of every lab link: 9000 (jumbo frames) by default, 1500 as on most Ethernet
    /// networks. Segments stop at 8928 bytes (the switch's slots) whatever the MTU.
    #[arg(long, default_value_t = xagg_lab::lab::MTU)]
    pub mtu: usize,
    /// Slots of the job: segments in flight per worker.
    #[arg(long, default_value_t = 128)]
    pub slots: u32,
    /// Impair the network: "drop-contrib=F,drop-result=F,dup-contrib=F" (fractions, each
    /// key optional). Contributions and results are dropped by the switch's fault
    /// injection, duplicates made on each worker's egress by a tc program.
    #[arg(long, value_parser = parse_inject)]
    pub inject: Option<Inject>,
    /// Workers send their segments out of order.
    #[arg(long)]
    pub reorder: bool,
    /// Workers receive results with their UDP sockets instead of AF_XDP (where each
    /// worker attaches xagg_host to its interface).
    #[arg(long)]
    pub no_afxdp: bool,
    /// Write the run's figures as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// CPUs of the switch, as on a switch host: its ports' packet processing (threaded
    /// NAPI, where the switch's XDP programs run) pinned to them, e.g. `1` or `2-5`.
    #[arg(long, value_name = "CPUS")]
    pub switch_cpus: Option<Cpus>,
    /// CPUs of the workers: their processes and their interfaces' packet processing
    /// pinned to them, e.g. `0`.
    #[arg(long, value_name = "CPUS")]
    pub worker_cpus: Option<Cpus>,
    /// Fold each slot's contributions on one of the switch's CPUs (`--switch-cpus`, or
    /// every CPU), however they come in (`switch.steer_cpus`).
    #[arg(long)]
    pub steer: bool,
    /// Run an unmodified MPI program under mpirun instead, one rank per worker, with
    /// libxagg_mpi.so preloaded: a C (.c) or Fortran (.f90, .F90) source, compiled here; without
    /// a file, tests/mpi/check.c (every served type and op, checked).
    #[arg(long, num_args = 0..=1, default_missing_value = "tests/mpi/check.c")]
    pub mpi: Option<std::path::PathBuf>,
    /// The lab's shape. Every shape but flat runs a daemon per aggregation point and
    /// reports the bytes each link carried.
    #[arg(long, value_enum, default_value_t = crate::topology::TopologyName::Flat)]
    pub topology: crate::topology::TopologyName,
    /// Train a PyTorch DDP model through the "xagg" backend instead, launched by torchrun
    /// (one node per worker namespace): a script, by default tests/python/ddp_check.py.
    #[arg(long, num_args = 0..=1, default_missing_value = "tests/python/ddp_check.py")]
    pub ddp: Option<std::path::PathBuf>,
}

impl Default for DemoArgs {
    /// The command line's defaults.
    fn default() -> Self {
        Self {
            workers: 4,
            size: 64 << 20,
            op: Op::Sum,
            dtype: DType::I32,
            segment: None,
            mtu: xagg_lab::lab::MTU,
            slots: 128,
            inject: None,
            reorder: false,
            no_afxdp: false,
            json: None,
            switch_cpus: None,
            worker_cpus: None,
            steer: false,
            topology: crate::topology::TopologyName::Flat,
            mpi: None,
            ddp: None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Inject {
    pub drop_contrib: f64,
    pub drop_result: f64,
    pub dup_contrib: f64,
}

fn parse_inject(s: &str) -> Result<Inject, String> {
    let mut i = Inject::default();
    for kv in s.split(',').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}`: write KEY=FRACTION, e.g. drop-contrib=0.05"))?;
        let f: f64 = v
            .parse()
            .map_err(|_| format!("`{v}` is not a fraction (0..1)"))?;
        if !(0.0..=1.0).contains(&f) {
            return Err(format!("{k}={v}: a fraction is between 0 and 1"));
        }
        match k {
            "drop-contrib" => i.drop_contrib = f,
            "drop-result" => i.drop_result = f,
            "dup-contrib" => i.dup_contrib = f,
            _ => {
                return Err(format!(
                    "unknown key `{k}`: use drop-contrib, drop-result, dup-contrib"
                ))
            }
        }
    }
    Ok(i)
}

/// Where the demo's and the bench's switch keeps its files and pins.
pub fn switch_dir() -> std::path::PathBuf {
    target_dir().join("lab")
}
fn pin_dir() -> std::path::PathBuf {
    format!("/sys/fs/bpf/{PREFIX}-lab").into()
}

/// The daemon of a demo or bench run, for the Ctrl-C handler (0: none).
static DAEMON_PID: AtomicI32 = AtomicI32::new(0);

/// Starts the daemon on `lab` (pinned under the demo's pin directory).
pub use xagg_lab::switch::{credential_env, CREDENTIAL, LISTEN};

/// The lab's switch, folding each slot's contributions on one of `steer` (none: where they
/// come in).
pub fn start_switch(lab: Lab, steer: &[usize]) -> Result<LabSwitch> {
    // Ranks may also join jobs by themselves (the MPI library's runs).
    let mut joinable = Ok(());
    let sw = LabSwitch::start(lab, switch_dir(), pin_dir(), |c| {
        joinable = xagg_lab::switch::joinable(c, &switch_dir());
        if !steer.is_empty() {
            let cpus: Vec<String> = steer.iter().map(usize::to_string).collect();
            c.switch.steer_cpus = Some(cpus.join(","));
        }
    })?;
    joinable?;
    if let Some(d) = &sw.daemon {
        DAEMON_PID.store(d.pid().as_raw(), Ordering::SeqCst);
    }
    Ok(sw)
}

/// The CPUs `--steer` folds on: the switch's, or every CPU where it has none of its own.
pub fn steer_cpus(steer: bool, placement: &Placement) -> Vec<usize> {
    match (steer, placement.switch_cpus.is_empty()) {
        (false, _) => Vec::new(),
        (true, false) => placement.switch_cpus.clone(),
        (true, true) => (0..xagg_linux::cpus::available()).collect(),
    }
}

/// Removes everything the demo creates: daemon, pins, namespaces (also what a crashed
/// earlier run left).
pub fn clean_up() {
    let pid = DAEMON_PID.swap(0, Ordering::SeqCst);
    if pid != 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = xagg_daemon::dataplane::unpin(&pin_dir());
    lab::destroy(PREFIX);
    crate::topology::clean_up();
}

/// Removes the lab on Ctrl-C.
pub fn on_interrupt() -> Result<()> {
    ctrlc::set_handler(|| {
        eprintln!("\ninterrupted: removing the lab");
        clean_up();
        std::process::exit(130);
    })?;
    Ok(())
}

pub fn run(a: DemoArgs) -> Result<()> {
    if !a.size.is_multiple_of(a.dtype.size()) {
        bail!(
            "--size {} is not a whole number of {} elements ({} bytes each)",
            a.size,
            a.dtype,
            a.dtype.size()
        );
    }
    on_interrupt()?;
    let r = match (&a.mpi, &a.ddp, a.topology) {
        (Some(program), None, crate::topology::TopologyName::Hosts) => {
            compile_mpi(program).and_then(|(dir, binary)| {
                crate::topology::run_mpi(a.topology, a.mtu, &dir, &binary)
            })
        }
        (Some(_), _, t) | (_, Some(_), t) if t != crate::topology::TopologyName::Flat => {
            Err(anyhow::anyhow!(
                "--ddp runs on the flat lab, --mpi on the flat lab or --topology hosts: drop --topology {}",
                format!("{t:?}").to_lowercase()
            ))
        }
        (Some(program), _, _) => run_mpi(a.workers, a.mtu, program),
        (None, Some(script), _) => run_ddp(a.workers, a.mtu, script),
        (None, None, t) => match t.topology() {
            Some(t) => crate::topology::run(&a, t),
            None => run_inner(&a),
        },
    };
    clean_up();
    r
}

/// A lab whose ranks join jobs by themselves: every worker's end running the host program
/// (ranks receive on plain UDP sockets, which on veth needs it), the daemon listening.
fn joinable_lab(n: usize, mtu: usize) -> Result<LabSwitch> {
    println!("lab: switch namespace {PREFIX}-sw (br0 {SWITCH_IP}/24, ports swp0..swp{}), {n} worker namespaces", n - 1);
    let mut lab = Lab::with_mtu(PREFIX, n, mtu)?;
    lab.attach_hosts()?;
    start_switch(lab, &[])
}

/// Prints what the switch aggregated since `before` (its counters then).
fn aggregated(sw: &LabSwitch, before: &std::collections::BTreeMap<String, u64>) -> Result<()> {
    let after = sw.counters()?;
    let grew = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    println!(
        "switch: {} contributions aggregated into {} results",
        grew("contribution"),
        grew("complete")
    );
    Ok(())
}

/// An MPI program through the switch: the lab, the daemon listening for joins, mpirun
/// with the library preloaded; prints the command, the program's output and the
/// library's summary.
fn run_mpi(n: usize, mtu: usize, program: &std::path::Path) -> Result<()> {
    let (dir, binary) = compile_mpi(program)?;
    let sw = joinable_lab(n, mtu)?;
    let agent = xagg_lab::mpi::agent(&sw.lab, &dir)?;
    let lib = xagg_lab::bin("libxagg_mpi.so");
    let mut env = vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("XAGG_DAEMON", LISTEN.to_string()),
    ];
    env.extend(credential_env());
    println!(
        "mpirun -np {n} --host <the workers' addresses> -x LD_PRELOAD={} -x XAGG_DAEMON={} -x XAGG_CREDENTIAL={} -x XAGG_CREDENTIAL_FILE={} {}",
        lib.display(),
        LISTEN,
        CREDENTIAL.0,
        env[3].1,
        binary.display()
    );
    let before = sw.counters()?;
    let o = xagg_lab::mpi::run(&sw.lab, &agent, n, &env, &binary.display().to_string())?;
    print!("{}", String::from_utf8_lossy(&o.stdout));
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    aggregated(&sw, &before)?;
    anyhow::ensure!(o.status.success(), "the MPI program failed: {}", o.status);
    Ok(())
}

/// Compiles the MPI program `program` (a path from the repository's root) into
/// `target/demo-mpi`: that directory and the binary.
pub fn compile_mpi(program: &std::path::Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let source = xtask::build::root().join(program);
    let dir = target_dir().join("demo-mpi");
    std::fs::create_dir_all(&dir)?;
    let stem = source
        .file_stem()
        .context("--mpi: name a .c, .f90 or .F90 file")?;
    let binary = dir.join(stem);
    xagg_lab::mpi::compile(&source, &binary, &[])?;
    Ok((dir, binary))
}

/// A DDP script through the "xagg" backend: the lab, the daemon listening for joins,
/// torchrun on every worker namespace; prints the command, the script's output, the
/// backend's summary and the switch's counters.
fn run_ddp(n: usize, mtu: usize, script: &std::path::Path) -> Result<()> {
    let script = xtask::build::root().join(script);
    let sw = joinable_lab(n, mtu)?;
    let mut env = xagg_lab::python::base_env();
    env.push(("XAGG_DAEMON", LISTEN.to_string()));
    env.extend(credential_env());
    let out = target_dir().join("demo-ddp.pt");
    let args = ["xagg", "20", out.to_str().context("a UTF-8 path")?];
    println!(
        "XAGG_DAEMON={LISTEN} XAGG_CREDENTIAL={} XAGG_CREDENTIAL_FILE={} torchrun --nnodes {n} --nproc_per_node 1 --node_rank <i> --master_addr {} {} {}",
        CREDENTIAL.0,
        credential_env()[1].1,
        lab::worker_ip(0),
        script.display(),
        args.join(" ")
    );
    let before = sw.counters()?;
    let outputs = xagg_lab::python::torchrun(&sw.lab, n, 29400, &env, &script, &args)?;
    for o in &outputs {
        print!("{}", String::from_utf8_lossy(&o.stdout));
    }
    eprint!("{}", String::from_utf8_lossy(&outputs[0].stderr));
    aggregated(&sw, &before)?;
    for (i, o) in outputs.iter().enumerate() {
        anyhow::ensure!(
            o.status.success(),
            "rank {i} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// The placement `--switch-cpus` and `--worker-cpus` ask for.
pub fn placement(switch: &Option<Cpus>, workers: &Option<Cpus>) -> Result<Placement> {
    let list = |c: &Option<Cpus>| c.clone().unwrap_or_default().0;
    Placement::new(list(switch), list(workers))
}

fn run_inner(a: &DemoArgs) -> Result<()> {
    let n = a.workers;
    let lane = xagg_api::lane(a.op, a.dtype)?;
    let segment = a
        .segment
        .map_or(wire::payload_for_mtu(a.mtu) / lane.size(), usize::from);
    let shape = JobShape::with_elements(n, a.slots as usize, segment, lane)
        .map_err(|e| anyhow::anyhow!("--{}: {e}", e.field()))?;
    let (op, dtype) = (a.op.name(), a.dtype.name());
    println!("lab: switch namespace {PREFIX}-sw (br0 {SWITCH_IP}/24, ports swp0..swp{}), {n} worker namespaces", n - 1);
    let mut lab = Lab::with_mtu(PREFIX, n, a.mtu)?;
    if a.no_afxdp {
        lab.attach_hosts()?;
    }
    if let Some(i) = a.inject.filter(|i| i.dup_contrib > 0.0) {
        lab.impair(&Object::Test.read()?, 0.0, i.dup_contrib)?;
    }
    let placement = placement(&a.switch_cpus, &a.worker_cpus)?;
    let sw = start_switch(lab, &steer_cpus(a.steer, &placement))?;
    placement.pin_switch(&sw.lab)?;
    let spec = sw.job_spec(
        JOB_ID,
        a.op,
        a.dtype,
        segment as u16,
        a.slots,
        &(0..n).collect::<Vec<_>>(),
        lab::WORKER_PORT,
    )?;
    match sw.add_job(spec)? {
        Response::Job { job } => println!("{}", job.added()),
        r => bail!("adding the job: {r:?}"),
    }
    if let Some(i) = a.inject {
        match sw.api(xagg_api::Request::Inject {
            drop_contribution: i.drop_contrib,
            drop_result: i.drop_result,
        })? {
            Response::Ok => {}
            r => bail!("fault injection: {r:?}"),
        }
        println!("impairment: {i:?}");
    }

    println!(
        "{n} workers allreduce {} of {dtype} each ({op}) through the XDP switch ...",
        human(a.size)
    );
    let mut run = AllreduceRun::new(JOB_ID, a.op, a.dtype, shape, a.size);
    // A common start a little ahead, so every worker has its data ready before the clock.
    run.head_start_ns = 1_000_000_000;
    run.afxdp = !a.no_afxdp;
    run.placement = placement.clone();
    if a.reorder {
        run.flags.push("--reorder".into());
    }
    // The tc duplication sees a GSO burst as one packet: send datagrams one by one.
    if a.inject.is_some_and(|i| i.dup_contrib > 0.0) {
        run.flags.push("--no-gso".into());
    }
    let drops_before = sw.lab.drops()?;
    let per_worker: Vec<RunReport> = run
        .run(&sw.lab)
        .with_context(|| format!("daemon log in {}", sw.log.display()))?;
    let seconds = per_worker.iter().map(|w| w.seconds).fold(0.0, f64::max);
    let verified = per_worker.iter().all(|w| w.verified);
    let retransmissions: u64 = per_worker.iter().map(|w| w.retransmissions).sum();
    let goodput = a.size as f64 * 8.0 / seconds / 1e9;
    let counters: Value = serde_json::to_value(sw.counters()?)?;
    let (_, duplicated) = sw.lab.impair_counts()?;
    let drops = sw.lab.drops()?.since(drops_before);

    println!();
    println!(
        "{:>6} {:>9} {:>14} {:>9} {:>8}",
        "member", "seconds", "goodput Gbit/s", "verified", "retrans"
    );
    for w in &per_worker {
        println!(
            "{:>6} {:>9.3} {:>14.2} {:>9} {:>8}",
            w.member, w.seconds, w.goodput_gbps, w.verified, w.retransmissions
        );
    }
    println!();
    println!("switch counters:");
    if let Some(m) = counters.as_object() {
        for (k, v) in m.iter().filter(|(_, v)| v.as_u64() != Some(0)) {
            println!("  {k:>24} {v}");
        }
    }
    println!();
    println!(
        "{op} allreduce of {} of {dtype} x {n} workers: {seconds:.3} s (slowest worker), goodput {goodput:.2} Gbit/s, result {}",
        human(a.size),
        match (verified, a.dtype) {
            (false, _) => "WRONG".to_string(),
            (true, DType::F32 | DType::F16 | DType::Bf16 | DType::F64) if matches!(a.op, Op::Sum | Op::Avg) => format!(
                "VERIFIED on every worker within the block floating point bound (largest error {:.2} of it)",
                per_worker.iter().map(|w| w.float_error_of_bound).fold(0.0, f64::max)
            ),
            _ => "VERIFIED bit-exact on every worker".to_string(),
        }
    );
    if retransmissions > 0 || a.inject.is_some() {
        println!("recovery: {retransmissions} retransmissions; {duplicated} contributions duplicated on worker egress");
        println!(
            "interfaces dropped: switch ports {} received, {} sent; workers {} received, {} sent",
            drops.switch_rx, drops.switch_tx, drops.workers_rx, drops.workers_tx
        );
    }
    let report = json!({
        "workers": n,
        "bytes_per_worker": a.size,
        "op": op,
        "dtype": dtype,
        "segment_elements": segment,
        "mtu": a.mtu,
        "slots": a.slots,
        "placement": placement,
        "interface_drops": drops,
        "seconds": seconds,
        "goodput_gbps": goodput,
        "verified": verified,
        "retransmissions": retransmissions,
        "impairment": a.inject.map(|i| json!({
            "drop_contrib": i.drop_contrib, "drop_result": i.drop_result, "dup_contrib": i.dup_contrib,
            "contributions_dropped": counters["inject_drop_contribution"],
            "results_dropped": counters["inject_drop_result"],
            "contributions_duplicated": duplicated,
        })),
        "reorder": a.reorder,
        "per_worker": per_worker.iter().map(|w| json!({
            "member": w.member, "seconds": w.seconds, "goodput_gbps": w.goodput_gbps, "verified": w.verified,
        })).collect::<Vec<_>>(),
        "counters": counters,
    });
    if let Some(p) = &a.json {
        write_json(p, &report)?;
        println!("figures written to {}", p.display());
    }
    if std::env::var_os("XAGG_DEMO_PAUSE").is_some() {
        eprintln!("paused (XAGG_DEMO_PAUSE): press Enter to clean up");
        let _ = std::io::stdin().read_line(&mut String::new());
    }
    if !verified {
        bail!("the result was wrong on at least one worker");
    }
    Ok(())
}

pub fn write_json(p: &Path, v: &Value) -> Result<()> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(p, serde_json::to_string_pretty(v)?)?;
    Ok(())
}

pub fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::DemoArgs;

    #[derive(Parser)]
    struct Demo {
        #[command(flatten)]
        args: DemoArgs,
    }

    /// `DemoArgs::default()` is what the command line gives without flags.
    #[test]
    fn the_default_is_the_command_lines() {
        let p = Demo::parse_from(["demo"]).args;
        let d = DemoArgs::default();
        assert_eq!(
            (p.workers, p.size, p.op, p.dtype, p.segment, p.slots),
            (d.workers, d.size, d.op, d.dtype, d.segment, d.slots)
        );
        assert_eq!(
            (
                p.reorder,
                p.no_afxdp,
                p.topology,
                p.inject.is_none(),
                p.json,
                p.mpi,
                p.ddp
            ),
            (
                d.reorder,
                d.no_afxdp,
                d.topology,
                d.inject.is_none(),
                d.json,
                d.mpi,
                d.ddp
            )
        );
    }
}
