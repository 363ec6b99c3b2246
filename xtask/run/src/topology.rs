//! `cargo xtask demo --topology NAME`: an allreduce through an aggregation tree or a ring
//! of hosts in a netns lab (`xagg_lab::tree`), verified on every rank, with its goodput
//! and the bytes each link carried each way.

use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use xagg_common::{
    wire::{self, DType, Op},
    Role,
};
use xagg_lab::tree::{Child, Topology, TreeLab};

use crate::demo::{human, DemoArgs, JOB_ID, PREFIX};

/// The lab's shapes, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyName {
    /// Every worker behind its own switch port (`--workers` of them).
    Flat,
    /// 4 hosts of 4 ranks under one switch; each host reduces its
    /// ranks and sends one partial per segment.
    Hosts,
    /// A spine over 2 leaf switches, each over 2 hosts of 2 ranks.
    Tree,
    /// 4 hosts of 2 ranks in a ring on a plain bridge: no aggregating switch.
    Ring,
    /// 2 hosts of 2 ranks under one switch, and 2 ranks on the switch's own ports beside
    /// them (processes their host's XDP cannot see join the switch directly).
    Mixed,
}

impl TopologyName {
    pub fn topology(self) -> Option<Topology> {
        match self {
            Self::Flat => None,
            Self::Hosts => Some(Topology::Hosts { hosts: 4, ranks: 4 }),
            Self::Tree => Some(Topology::Tree {
                leaves: 2,
                hosts: 2,
                ranks: 2,
            }),
            Self::Ring => Some(Topology::Ring { hosts: 4, ranks: 2 }),
            Self::Mixed => Some(Topology::Mixed {
                hosts: 2,
                ranks: 2,
                direct: 2,
            }),
        }
    }
}

/// Removes what a topology run leaves (pins and namespaces), also after a crash.
pub fn clean_up() {
    for i in 0..64 {
        let _ = xagg_daemon::dataplane::unpin(std::path::Path::new(&format!(
            "/sys/fs/bpf/xagg-{PREFIX}-a{i}"
        )));
    }
    xagg_lab::tree::destroy(PREFIX);
}

pub fn run(a: &DemoArgs, topology: Topology) -> Result<()> {
    if (a.op, a.dtype) != (Op::Sum, DType::I32) {
        bail!("--topology runs a sum of i32 (verified against an exact reference): drop --op and --dtype");
    }
    if a.inject.is_some_and(|i| i.dup_contrib > 0.0) || a.reorder {
        bail!("--topology takes --inject drop-contrib and drop-result (at every level), not dup-contrib or --reorder");
    }
    let segment = a.segment.map_or(
        wire::payload_for_mtu(a.mtu) / DType::I32.size(),
        usize::from,
    );
    let elems = a.size / 4;
    let mut lab = TreeLab::with_mtu(PREFIX, topology, a.mtu)?;
    lab.start_daemons()?;
    lab.add_job(JOB_ID, segment as u16, a.slots)?;
    describe(&lab);
    if let Some(i) = a.inject {
        let levels = lab
            .points
            .iter()
            .map(|p| p.level(&lab.points))
            .max()
            .unwrap_or(0);
        for l in 0..=levels {
            lab.inject(l, i.drop_contrib, i.drop_result)?;
        }
        println!("impairment at every level: {i:?}");
    }
    let n = lab.ranks.len();
    println!(
        "{n} ranks allreduce {} of i32 each (sum), {segment} elements per segment ...",
        human(a.size)
    );
    let before = lab.link_bytes()?;
    let start = Instant::now();
    let reports = lab.allreduce(0, elems, 42, |_| {})?;
    let wall = start.elapsed().as_secs_f64();
    let after = lab.link_bytes()?;
    let slowest = reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let retransmissions: u64 = reports.iter().map(|r| r.retransmissions).sum();
    let gbps = (a.size * 8) as f64 / slowest / 1e9;
    println!(
        "sum allreduce of {} of i32 x {n} ranks: {slowest:.3} s (slowest rank; {wall:.3} s with start-up), goodput {gbps:.2} Gbit/s, {retransmissions} retransmissions, result VERIFIED bit-exact on every rank",
        human(a.size)
    );
    println!(
        "bytes each link carried, over S = {} (up = towards the root):",
        human(a.size)
    );
    let s = a.size as f64;
    let mut links = Vec::new();
    for ((name, tx0, rx0), (_, tx1, rx1)) in before.iter().zip(&after) {
        let (up, down) = ((tx1 - tx0) as f64 / s, (rx1 - rx0) as f64 / s);
        println!("  {name:<22} up {up:.3}·S  down {down:.3}·S");
        links.push(json!({"link": name, "up": up, "down": down}));
    }
    for (i, c) in lab.counters().iter().enumerate() {
        if c.is_empty() {
            continue;
        }
        let get = |k: &str| c.get(k).copied().unwrap_or(0);
        println!(
            "  point {i}: {} contributions, {} results completed, {} partials sent ({} again), {} results from above",
            get("contribution"),
            get("complete"),
            get("partial"),
            get("partial_resend"),
            get("parent_result")
        );
    }
    if let Some(path) = &a.json {
        let v = json!({
            "topology": format!("{topology:?}"),
            "ranks": n,
            "bytes": a.size,
            "segment": segment,
            "seconds": slowest,
            "goodput_gbps": gbps,
            "retransmissions": retransmissions,
            "links": links,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

/// Prints the lab: each aggregation point, its level and role, and its members.
/// An MPI program (compiled into `dir`) through the lab's hosts: each host's daemon
/// listening for its ranks' joins and joining the switch's, mpirun with the library
/// preloaded and each rank naming its host's daemon; prints the command, the program's
/// output, the library's summary and what each point aggregated.
pub fn run_mpi(
    name: TopologyName,
    mtu: usize,
    dir: &std::path::Path,
    binary: &std::path::Path,
) -> Result<()> {
    let topology = name.topology().expect("a lab of hosts");
    let mut lab = TreeLab::with_mtu(PREFIX, topology, mtu)?;
    lab.start_joinable()?;
    describe(&lab);
    let hosts = xagg_lab::mpi::tree_hosts(&lab);
    let agent = xagg_lab::mpi::hosts_agent(&hosts, dir, "rsh-agent-demo-hosts")?;
    let lib = xagg_lab::bin("libxagg_mpi.so");
    let mut env = vec![("LD_PRELOAD", lib.display().to_string())];
    env.extend(crate::demo::credential_env());
    println!(
        "mpirun -np {} --host <the ranks' addresses> -x LD_PRELOAD={} -x XAGG_CREDENTIAL={} -x XAGG_CREDENTIAL_FILE={} {}  (each rank's XAGG_DAEMON: its host's daemon, {})",
        hosts.len(),
        lib.display(),
        env[1].1,
        env[2].1,
        binary.display(),
        lab.points
            .iter()
            .filter(|p| p.parent.is_some())
            .map(|p| p.listener().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let before = lab.counters();
    let o = xagg_lab::mpi::run_on_hosts(&hosts, &agent, &env, &binary.display().to_string())?;
    print!("{}", String::from_utf8_lossy(&o.stdout));
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    let after = lab.counters();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let grew = |c: &str| a.get(c).copied().unwrap_or(0) - b.get(c).copied().unwrap_or(0);
        println!(
            "point {i}: {} contributions, {} partials sent up, {} results",
            grew("contribution") + grew("complete") + grew("partial"),
            grew("partial"),
            grew("complete") + grew("parent_result")
        );
    }
    anyhow::ensure!(o.status.success(), "the MPI program failed: {}", o.status);
    Ok(())
}

fn describe(lab: &TreeLab) {
    println!("lab ({:?}):", lab.topology);
    for (i, p) in lab.points.iter().enumerate() {
        let role = match (p.aggregates, p.parent) {
            (false, _) => "a plain bridge: no aggregation".to_string(),
            (true, None) => format!("{:?} (the root)", Role::Root),
            (true, Some((q, m))) if lab.points[q].aggregates => {
                format!("{:?}: member {m} of point {q}", Role::Inner)
            }
            (true, Some(_)) => format!("{:?} host", Role::Ring),
        };
        let members: Vec<String> = p
            .children
            .iter()
            .map(|c| match c {
                Child::Point(q) => format!("point {q}"),
                Child::Rank(r) => format!("rank {r}"),
            })
            .collect();
        println!(
            "  point {i}: {} {} (level {}), {role}; members {}",
            p.ns,
            p.ip,
            p.level(&lab.points),
            members.join(", ")
        );
    }
}
