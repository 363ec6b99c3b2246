//! The main job: a netns lab, the daemon, one job, N workers allreducing through the XDP
//! switch, verification, goodput and counters, and clean-up whatever happens.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use xagg::lab::{self, Lab, SWITCH_IP, WORKER_PORT};
use xagg_common::wire::{self, DType, Op};

use crate::build::{ebpf_object, release_bin, target_dir};

/// Names of the demo's namespaces, pins and socket start with this.
pub const PREFIX: &str = "xagg";
pub const JOB_ID: u32 = 1;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Workers (one network namespace each).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Bytes each worker allreduces (suffixes: KiB, MiB, GiB, KB, MB, GB).
    #[arg(long, default_value = "64MiB", value_parser = xagg::parse_size)]
    pub size: usize,
    /// Reduction: sum | min | max | avg | prod | and | or | xor.
    #[arg(long, default_value = "sum", value_parser = xagg::job::parse_op)]
    pub op: Op,
    /// Element type: i32 | u32 | i64 | f32 | f16 | bf16.
    #[arg(long, default_value = "i32", value_parser = xagg::job::parse_dtype)]
    pub dtype: DType,
    /// Elements per segment; by default as many as one XDP frame carries for the op and
    /// type (862 for i32 sum).
    #[arg(long)]
    pub segment: Option<u16>,
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
    pub json: Option<PathBuf>,
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

static DAEMON_PID: AtomicU32 = AtomicU32::new(0);

fn pin_dir() -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/{PREFIX}-lab"))
}
fn socket() -> PathBuf {
    PathBuf::from(format!("/run/xagg/{PREFIX}-lab.sock"))
}

/// Stops the daemon and removes the dataplane's pins, leaving the lab.
pub fn clean_up_switch() {
    let pid = DAEMON_PID.swap(0, Ordering::SeqCst);
    if pid != 0 {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let _ = xagg::dataplane::unpin(&pin_dir());
}

/// Removes everything the demo creates: daemon, pins, namespaces.
pub fn clean_up() {
    let pid = DAEMON_PID.swap(0, Ordering::SeqCst);
    if pid != 0 {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let _ = xagg::dataplane::unpin(&pin_dir());
    let _ = std::fs::remove_file(socket());
    lab::destroy(PREFIX);
}

pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
        DAEMON_PID.store(0, Ordering::SeqCst);
    }
}

pub fn run(a: DemoArgs) -> Result<()> {
    if !a.size.is_multiple_of(4) {
        bail!(
            "--size {} is not a whole number of i32 elements (a multiple of 4 bytes)",
            a.size
        );
    }
    ctrlc::set_handler(|| {
        eprintln!("\ninterrupted: removing the lab");
        clean_up();
        std::process::exit(130);
    })?;
    let r = run_inner(&a);
    clean_up();
    r
}

pub fn xagg(args: &[&str]) -> Result<String> {
    let out = Command::new(release_bin("xagg"))
        .arg("--socket")
        .arg(socket())
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "xagg {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run_inner(a: &DemoArgs) -> Result<()> {
    let n = a.workers;
    let segment = a
        .segment
        .unwrap_or(wire::max_elements(a.op, a.dtype) as u16);
    let (op, dtype) = (a.op.name(), a.dtype.name());
    println!("lab: switch namespace {PREFIX}-sw (br0 {SWITCH_IP}/24, ports swp0..swp{}), {n} worker namespaces", n - 1);
    let mut lab = Lab::create(PREFIX, n)?;
    let object = std::fs::read(ebpf_object()).context("reading the XDP object")?;
    if a.no_afxdp {
        lab.attach_hosts(&object)?;
    }

    let _daemon = start_switch(&lab)?;

    let mut add = vec![
        "job".to_string(),
        "add".into(),
        "--id".into(),
        JOB_ID.to_string(),
        "--op".into(),
        op.into(),
        "--dtype".into(),
        dtype.into(),
        "--segment".into(),
        segment.to_string(),
        "--slots".into(),
        a.slots.to_string(),
    ];
    for m in lab.members()? {
        add.push("--member".into());
        add.push(format!("{},{},{}", m.interface, m.mac, m.addr));
    }
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    print!("{}", xagg(&add)?);
    if let Some(i) = a.inject {
        xagg(&[
            "inject",
            "--drop-contrib",
            &i.drop_contrib.to_string(),
            "--drop-result",
            &i.drop_result.to_string(),
        ])?;
        if i.dup_contrib > 0.0 {
            lab.impair(&object, 0.0, i.dup_contrib)?;
        }
        println!("impairment: {i:?}");
    }

    // A common start a little ahead, so every worker has its data ready before the clock.
    let start_ns = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64
        + 1_000_000_000
        + crate::bench::head_start_ns(a.size, n);
    println!(
        "{n} workers allreduce {} of {dtype} each ({op}) through the XDP switch ...",
        human(a.size)
    );
    let workers: Vec<Child> = (0..n)
        .map(|i| {
            Command::new("ip")
                .args(["netns", "exec", &lab.worker_ns(i)])
                .arg(release_bin("xagg"))
                .args(["allreduce", "--switch", &SWITCH_IP.to_string()])
                .args(["--bind", &format!("{}:{WORKER_PORT}", lab::worker_ip(i))])
                .args(["--job", &JOB_ID.to_string(), "--member", &i.to_string()])
                .args(["--op", op, "--dtype", dtype])
                .args([
                    "--segment",
                    &segment.to_string(),
                    "--slots",
                    &a.slots.to_string(),
                ])
                .args([
                    "--size",
                    &a.size.to_string(),
                    "--seed",
                    "7",
                    "--members",
                    &n.to_string(),
                    "--verify",
                ])
                .args(["--start-at", &start_ns.to_string(), "--json"])
                .args(a.reorder.then_some("--reorder"))
                .args((!a.no_afxdp).then_some("--afxdp"))
                // The tc duplication sees a GSO burst as one packet: send datagrams one by one.
                .args(a.inject.filter(|i| i.dup_contrib > 0.0).map(|_| "--no-gso"))
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a worker")
        })
        .collect::<Result<_>>()?;
    let mut per_worker = Vec::new();
    let mut failed = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        let out = w.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<Value>(text.trim()) {
            Ok(v) if out.status.success() || out.status.code() == Some(2) => per_worker.push(v),
            _ => failed.push(format!("worker {i} ({})", out.status)),
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} failed; daemon log in {}",
            failed.join(", "),
            target_dir().join("lab/xaggd.log").display()
        );
    }
    let seconds = per_worker
        .iter()
        .filter_map(|w| w["seconds"].as_f64())
        .fold(0.0, f64::max);
    let verified = per_worker
        .iter()
        .all(|w| w["verified"].as_bool() == Some(true));
    let retransmissions: u64 = per_worker
        .iter()
        .filter_map(|w| w["retransmissions"].as_u64())
        .sum();
    let goodput = a.size as f64 * 8.0 / seconds / 1e9;
    let counters: Value = serde_json::from_str(&xagg(&["counters", "--json"])?)?;
    let (_, duplicated) = lab.impair_counts()?;

    println!();
    println!(
        "{:>6} {:>9} {:>14} {:>9} {:>8}",
        "member", "seconds", "goodput Gbit/s", "verified", "retrans"
    );
    for w in &per_worker {
        println!(
            "{:>6} {:>9.3} {:>14.2} {:>9} {:>8}",
            w["member"],
            w["seconds"].as_f64().unwrap_or(0.0),
            w["goodput_gbps"].as_f64().unwrap_or(0.0),
            w["verified"],
            w["retransmissions"]
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
            (true, DType::F32 | DType::F16 | DType::Bf16) if matches!(a.op, Op::Sum | Op::Avg) => format!(
                "VERIFIED on every worker within the block floating point bound (largest error {:.2} of it)",
                per_worker.iter().filter_map(|w| w["float_error_of_bound"].as_f64()).fold(0.0, f64::max)
            ),
            _ => "VERIFIED bit-exact on every worker".to_string(),
        }
    );
    if retransmissions > 0 || a.inject.is_some() {
        println!("recovery: {retransmissions} retransmissions; {duplicated} contributions duplicated on worker egress");
    }
    let report = json!({
        "workers": n,
        "bytes_per_worker": a.size,
        "op": op,
        "dtype": dtype,
        "segment_elements": segment,
        "slots": a.slots,
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
            "member": w["member"], "seconds": w["seconds"], "goodput_gbps": w["goodput_gbps"], "verified": w["verified"],
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

/// Starts xaggd on the lab's switch (pinned under the demo's pin directory) and waits for
/// its API.
pub fn start_switch(lab: &Lab) -> Result<Daemon> {
    let n = lab.workers;
    let _ = xagg::dataplane::unpin(&pin_dir());
    let cfg_path = target_dir().join("lab").join(format!("{PREFIX}.toml"));
    std::fs::create_dir_all(cfg_path.parent().unwrap())?;
    let ports: Vec<String> = (0..n).map(|i| format!("\"{}\"", Lab::port(i))).collect();
    std::fs::write(
        &cfg_path,
        format!(
            "[switch]\nports = [{}]\naddress = \"{SWITCH_IP}\"\nnetns = \"{}\"\nxdp_mode = \"native\"\n\n[daemon]\nsocket = \"{}\"\npin_path = \"{}\"\n",
            ports.join(", "),
            lab.switch_ns(),
            socket().display(),
            pin_dir().display()
        ),
    )?;
    let log = std::fs::File::create(target_dir().join("lab").join("xaggd.log"))?;
    let child = Command::new(release_bin("xaggd"))
        .arg("--config")
        .arg(&cfg_path)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting xaggd")?;
    DAEMON_PID.store(child.id(), Ordering::SeqCst);
    let daemon = Daemon(child);
    wait_for_daemon()?;
    Ok(daemon)
}

pub fn write_json(p: &Path, v: &Value) -> Result<()> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(p, serde_json::to_string_pretty(v)?)?;
    Ok(())
}

fn wait_for_daemon() -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if xagg(&["status"]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "xaggd did not come up; its log is in {}",
        target_dir().join("lab/xaggd.log").display()
    )
}

pub fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
