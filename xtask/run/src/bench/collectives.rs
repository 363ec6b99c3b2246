//! The collectives besides allreduce, end to end (`cargo xtask bench --collectives`):
//! reduce-scatter, all-gather, broadcast and reduce through the switch (`xagg allreduce
//! --collective`, its workers on AF_XDP as the allreduce runs'), the switch's allreduce of
//! the same S beside them, and Open MPI's and Gloo's same call (`xtask/mpi/allreduce.c`
//! and `xtask/python/allreduce.py` with `BENCH_COLLECTIVE`; for a reduce-scatter, which
//! torch 1.13's Gloo lacks, Gloo's allreduce with the block kept) on the same lab; the
//! bytes each rank sent and received over S.

use anyhow::Result;
use xagg_common::wire::Collective;
use xagg_lab::lab::Lab;

use super::{
    end_to_end::{add_job, iterations, switch_point, switch_run},
    frameworks::{mpi_collective, mpi_setup, torch_runs, BenchDtype},
    report::round_line,
    run_point::{median_point, RunPoint},
};

/// The collectives timed, allreduce first (the reference).
pub const ALL: [Collective; 5] = [
    Collective::Allreduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::Reduce,
];

/// What [`collectives`] runs.
pub struct Runs<'a> {
    pub quick: bool,
    pub workers: &'a [usize],
    pub sizes: &'a [usize],
    pub rounds: usize,
    pub segment: usize,
    pub mtu: usize,
    pub slots: u32,
    pub placement: xagg_lab::placement::Placement,
    /// Also Open MPI's program with the MPI library preloaded (`mpi+xagg`), each collective.
    pub mpi_on_switch: bool,
    /// The PyTorch backend's and Gloo's runs.
    pub torch: bool,
    /// The drop-ins' runs' element type (`--dtype`): other than int32, the switch's own
    /// runs (int32) are left out, and the MPI runs too for the half types.
    pub dtype: BenchDtype,
}

/// Every collective at every worker count and size, through the switch, then Open MPI,
/// then Gloo, in rounds (each figure the median over them).
pub fn collectives(r: &Runs) -> Result<Vec<RunPoint>> {
    let mpi_bin = mpi_setup()?;
    let mut all: Vec<RunPoint> = Vec::new();
    for round in 0..r.rounds.max(1) {
        for &n in r.workers {
            let lab = Lab::with_mtu(crate::demo::PREFIX, n, r.mtu)?;
            let mut sw = crate::demo::start_switch(lab, &[])?;
            r.placement.pin_switch(&sw.lab)?;
            add_job(&sw, crate::demo::JOB_ID, r.segment, r.slots)?;
            let mut mid = 0u32;
            // Whole blocks of the elements for every member.
            let whole = r.dtype.wire().size().max(4) * n;
            for c in ALL.iter().copied().filter(|_| r.dtype == BenchDtype::Int32) {
                for &size in r.sizes {
                    // Whole blocks of i32 for every member.
                    let bytes = size / whole * whole;
                    let it = iterations(bytes, r.quick);
                    let mut run = switch_run(n, crate::demo::JOB_ID, bytes, r.segment, r.slots)?;
                    run.repeat = it as u32;
                    run.first_message = mid;
                    run.placement = r.placement.clone();
                    run.afxdp = true;
                    run.flags.extend(["--collective".into(), c.name().into()]);
                    let mut p = switch_point(&sw.lab, &run)?;
                    p.collective = Some(c.name());
                    mid += it as u32;
                    round_line(round, &p);
                    all.push(p);
                }
            }
            // Open MPI's ranks receive on sockets: on veth that needs the host program.
            // Then the MPI library's same calls (`XAGG_ROUTE` as the bench is run with:
            // `all` for the switch's path at every size).
            sw.lab.attach_hosts()?;
            let systems = std::iter::once("openmpi").chain(r.mpi_on_switch.then_some("mpi+xagg"));
            for system in systems.filter(|_| r.dtype.in_mpi()) {
                for c in ALL {
                    for &size in r.sizes {
                        let bytes = size / whole * whole;
                        let it = iterations(bytes, r.quick);
                        let p = mpi_collective(
                            &sw.lab,
                            &mpi_bin,
                            bytes,
                            it,
                            system,
                            Some(c.name()),
                            r.dtype,
                        )?;
                        round_line(round, &p);
                        all.push(p);
                    }
                }
            }
            for c in ALL.iter().skip(1).filter(|_| r.torch) {
                let sizes: Vec<usize> = r.sizes.iter().map(|&s| s / whole * whole).collect();
                let it = |bytes| iterations(bytes, r.quick);
                // The PyTorch backend's same call (through the switch), and Gloo's (for
                // a reduce-scatter, which torch 1.13's Gloo lacks, a program's stand-in:
                // an allreduce, its block kept).
                for system in ["torch+xagg", "gloo"] {
                    for p in torch_runs(&sw.lab, system, &sizes, it, Some(c.name()), r.dtype)? {
                        round_line(round, &p);
                        all.push(p);
                    }
                }
            }
            sw.lab.detach_hosts();
        }
    }
    // The rounds' medians, point by point.
    let mut merged: Vec<RunPoint> = Vec::new();
    for p in &all {
        if merged.iter().any(|m| same(m, p)) {
            continue;
        }
        merged.push(median_point(all.iter().filter(|q| same(q, p)).collect()));
    }
    Ok(merged)
}

fn same(a: &RunPoint, b: &RunPoint) -> bool {
    a.system == b.system
        && a.workers == b.workers
        && a.bytes == b.bytes
        && a.collective == b.collective
}

/// The point of `system`'s `collective` at `n` workers and `bytes`.
fn point<'a>(
    points: &'a [RunPoint],
    system: &str,
    collective: &str,
    n: usize,
    bytes: usize,
) -> Option<&'a RunPoint> {
    points.iter().find(|p| {
        p.system == system && p.collective == Some(collective) && p.workers == n && p.bytes == bytes
    })
}

/// The MPI library's time per call (preloaded into Open MPI's program) against Open MPI's
/// own, per collective: what `XAGG_ROUTE`'s defaults are read from.
fn library_table(points: &[RunPoint], dtype: &str) {
    let lib: Vec<&RunPoint> = points.iter().filter(|p| p.system == "mpi+xagg").collect();
    if lib.is_empty() {
        return;
    }
    println!();
    println!("the MPI library (preloaded, its path as run: {}), {dtype}, time µs (the slowest rank's, median) / Open MPI's, x:",
        lib[0].path.unwrap_or("?"));
    print!("{:>3} {:>9} |", "n", "bytes");
    for c in ALL {
        print!(" {:>24} |", c.name());
    }
    println!();
    let mut keys: Vec<(usize, usize)> = lib.iter().map(|p| (p.workers, p.bytes)).collect();
    keys.sort_unstable();
    keys.dedup();
    for (n, bytes) in keys {
        print!("{n:>3} {bytes:>9} |");
        for c in ALL {
            let at = |system: &str| point(points, system, c.name(), n, bytes);
            match (at("mpi+xagg"), at("openmpi")) {
                (Some(l), Some(o)) => print!(
                    " {:>8.1} / {:>8.1} {:>5.2} |",
                    l.latency_us,
                    o.latency_us,
                    l.latency_us / o.latency_us
                ),
                _ => print!(" {:>24} |", "-"),
            }
        }
        println!();
    }
}

/// A table per collective: its time through the switch against the switch's allreduce of
/// the same S and against Open MPI's and Gloo's same call, the PyTorch backend's time
/// (through the switch) against Gloo's, and the bytes each rank sent and received over S
/// (means over the ranks).
pub fn tables(points: &[RunPoint], dtype: BenchDtype) {
    let dtype = dtype.name();
    let find = |system: &str, c: &str, n: usize, bytes: usize| point(points, system, c, n, bytes);
    for c in ALL.iter().skip(1) {
        println!();
        println!(
            "{c}, {dtype} (sum where it reduces): time µs (the slowest rank's, median) | x the switch's allreduce of the same S | x Open MPI's, Gloo's same call | bytes sent and received per rank / S (mean over the ranks):"
        );
        println!(
            "{:>3} {:>9} | {:>10} {:>10} {:>10} {:>10} {:>10} | {:>6} {:>6} {:>6} {:>8} | {:>5} {:>5} {:>5} {:>5}",
            "n",
            "bytes",
            "switch",
            "allreduce",
            "openmpi",
            "gloo",
            "torch",
            "x ar",
            "x ompi",
            "x gloo",
            "torch/gl",
            "tx",
            "rx",
            "o tx",
            "o rx"
        );
        for p in points
            .iter()
            .filter(|p| p.system == "switch" && p.collective == Some(c.name()))
        {
            let ar = find("switch", "allreduce", p.workers, p.bytes);
            let o = find("openmpi", c.name(), p.workers, p.bytes);
            let g = find("gloo", c.name(), p.workers, p.bytes);
            // The PyTorch backend's same call, through the switch.
            let tx = find("torch+xagg", c.name(), p.workers, p.bytes);
            let t = |q: Option<&RunPoint>| q.map_or(f64::NAN, |q| q.latency_us);
            println!(
                "{:>3} {:>9} | {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} | {:>6.2} {:>6.2} {:>6.2} {:>8.2} | {:>5.3} {:>5.3} {:>5.3} {:>5.3}{}",
                p.workers,
                p.bytes,
                p.latency_us,
                t(ar),
                t(o),
                t(g),
                t(tx),
                p.latency_us / t(ar),
                p.latency_us / t(o),
                p.latency_us / t(g),
                t(tx) / t(g),
                p.wire_ratio,
                p.rx_ratio.unwrap_or(f64::NAN),
                o.map_or(f64::NAN, |o| o.wire_ratio),
                o.and_then(|o| o.rx_ratio).unwrap_or(f64::NAN),
                if p.verified && [o, g, tx].iter().all(|q| q.is_none_or(|q| q.verified)) { "" } else { "  NOT VERIFIED" }
            );
        }
    }
    library_table(points, dtype);
}
