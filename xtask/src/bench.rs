//! Benchmarks. The dataplane part times each path of the switch program with BPF_PROG_RUN
//! (kernel-measured, JIT-compiled), as medians over many runs.
//!
//! BPF_PROG_RUN reruns a frame against live map state, so each path is set up explicitly:
//! - `pass`: a non-collective frame, `repeat` 10000 (stateless);
//! - `duplicate`: a contribution whose member is already in the slot, `repeat` 10000;
//! - `first`, `accumulate`, `complete`: a 64-member job; every round on a slot is one
//!   `first` (copied into the empty version), 62 `accumulate` and one `complete`, each a
//!   `repeat` 1 run, so every sample is a real state transition. A repeat-1 run includes the
//!   kernel's clock reads (tens of ns).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use xagg::testrun::{
    contribution, frame, job, member, Switch, PORT, XDP_DROP, XDP_PASS, XDP_REDIRECT,
};
use xagg_common::wire::{DType, Header, Kind, Op, FLAG_EPOCH};

use crate::build::{ebpf_object, target_dir};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Fewer samples: checks that the benchmark runs, not for figures.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the figures (JSON).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize, Clone)]
pub struct DataplanePoint {
    pub path: &'static str,
    pub elements: usize,
    pub ns_per_packet: f64,
    pub ns_per_kib: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn point(path: &'static str, elements: usize, ns: f64) -> DataplanePoint {
    DataplanePoint {
        path,
        elements,
        ns_per_packet: ns,
        ns_per_kib: ns / (elements as f64 * 4.0 / 1024.0),
    }
}

pub fn dataplane(quick: bool) -> Result<Vec<DataplanePoint>> {
    let object =
        std::fs::read(ebpf_object()).context("reading the XDP object (cargo xtask build)")?;
    let rounds = if quick { 8 } else { 200 };
    let calls = if quick { 3 } else { 25 };
    let mut out = Vec::new();
    for elements in [256usize, DType::I32.max_elements()] {
        let mut sw = Switch::load(&object);
        const JID: u32 = 1;
        sw.jobs
            .insert(
                JID,
                job(64, Op::Sum as u8, DType::I32 as u8, elements as u16, 0, 4),
                0,
            )
            .context("adding the bench job")?;
        let values: Vec<i32> = (0..elements as i32)
            .map(|i| i.wrapping_mul(2_654_435_761u32 as i32))
            .collect();
        let contrib = |m: u8, sid: u32, slot: u16, epoch: bool| {
            let flags = if epoch { FLAG_EPOCH } else { 0 };
            let h = Header::new(
                Kind::Contribution,
                Op::Sum,
                DType::I32,
                JID,
                0,
                sid,
                slot,
                m,
                flags,
                elements as u16,
            );
            frame(&member(m), PORT, &contribution(h, &values))
        };

        let (mut first, mut acc, mut complete) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (slot, epoch) = ((r % 4) as u16, (r / 4) % 2 == 1);
            for m in 0..64u8 {
                let run = sw.run(&contrib(m, r, slot, epoch));
                let ns = run.duration.as_nanos() as f64;
                match m {
                    0 => first.push(ns),
                    63 => {
                        anyhow::ensure!(
                            run.action == XDP_REDIRECT,
                            "round {r}: the last member did not complete"
                        );
                        complete.push(ns)
                    }
                    _ => {
                        anyhow::ensure!(
                            run.action == XDP_DROP,
                            "round {r}: member {m} not accumulated"
                        );
                        acc.push(ns)
                    }
                }
            }
        }
        // A duplicate: member 0 again while the round (sid `rounds`) is filling.
        let dup = contrib(0, rounds, 0, (rounds / 4) % 2 == 1);
        sw.run(&dup);
        let dups: Vec<f64> = (0..calls)
            .map(|_| sw.run_repeat(&dup, 10_000).duration.as_nanos() as f64)
            .collect();
        let other = frame(&member(0), 53, &[0u8; 64]);
        let passes: Vec<f64> = (0..calls)
            .map(|_| {
                let r = sw.run_repeat(&other, 10_000);
                assert_eq!(r.action, XDP_PASS);
                r.duration.as_nanos() as f64
            })
            .collect();
        out.push(point("pass", elements, median(passes)));
        out.push(point("first", elements, median(first)));
        out.push(point("accumulate", elements, median(acc)));
        out.push(point("complete", elements, median(complete)));
        out.push(point("duplicate", elements, median(dups)));
    }
    Ok(out)
}

pub fn run(a: BenchArgs) -> Result<()> {
    let points = dataplane(a.quick)?;
    println!(
        "switch program, BPF_PROG_RUN (median ns; {}):",
        if a.quick { "quick" } else { "full" }
    );
    println!(
        "{:>11} {:>9} {:>12} {:>10}",
        "path", "elements", "ns/packet", "ns/KiB"
    );
    for p in &points {
        println!(
            "{:>11} {:>9} {:>12.0} {:>10.0}",
            p.path, p.elements, p.ns_per_packet, p.ns_per_kib
        );
    }
    let path = a
        .json
        .unwrap_or_else(|| target_dir().join("bench/bench.json"));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({ "dataplane": points }))?,
    )?;
    println!("figures written to {}", path.display());
    Ok(())
}
