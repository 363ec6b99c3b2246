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

#[derive(Serialize, Clone)]
pub struct CodecPoint {
    pub op: &'static str,
    pub dtype: &'static str,
    /// Buffer bytes encoded (or decoded) per second, in GB/s (1e9), one core.
    pub encode_gbps: f64,
    pub decode_gbps: f64,
}

/// Throughput of the worker-side conversions over a buffer cut into full segments, one
/// core, medians of several passes.
pub fn codecs(quick: bool) -> Vec<CodecPoint> {
    use xagg::codec;
    let bytes = if quick { 1 << 20 } else { 32 << 20 };
    let passes = if quick { 2 } else { 7 };
    let mut out = Vec::new();
    for (op, dtype) in [
        (Op::Sum, DType::I32),
        (Op::Avg, DType::I32),
        (Op::Sum, DType::F32),
        (Op::Max, DType::F32),
        (Op::Sum, DType::F16),
        (Op::Sum, DType::Bf16),
        (Op::Min, DType::Bf16),
    ] {
        let lane = xagg_common::wire::lane(op, dtype).unwrap();
        let seg = xagg_common::wire::max_elements(op, dtype);
        let src = xagg::data::generate(dtype, 1, 0, bytes / dtype.size());
        let mut lanes = vec![0u8; seg * lane.size()];
        let mut dst = vec![0u8; src.len()];
        let seg_bytes = seg * dtype.size();
        let time = |f: &mut dyn FnMut()| {
            let mut t: Vec<f64> = (0..passes)
                .map(|_| {
                    let s = std::time::Instant::now();
                    f();
                    s.elapsed().as_secs_f64()
                })
                .collect();
            t.sort_by(|a, b| a.total_cmp(b));
            bytes as f64 / t[t.len() / 2] / 1e9
        };
        let encode_gbps = time(&mut || {
            for chunk in src.chunks(seg_bytes) {
                let n = chunk.len() / dtype.size() * lane.size();
                std::hint::black_box(codec::encode(op, dtype, chunk, &mut lanes[..n]));
            }
        });
        let decode_gbps = time(&mut || {
            for chunk in dst.chunks_mut(seg_bytes) {
                let n = chunk.len() / dtype.size() * lane.size();
                codec::decode(op, dtype, 4, &lanes[..n], -10, chunk);
            }
            std::hint::black_box(&dst);
        });
        out.push(CodecPoint {
            op: op.name(),
            dtype: dtype.name(),
            encode_gbps,
            decode_gbps,
        });
    }
    out
}

pub fn run(a: BenchArgs) -> Result<()> {
    let points = dataplane(a.quick)?;
    let codec_points = codecs(a.quick);
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
    println!();
    println!("worker conversions, one core (GB/s of buffer):");
    println!("{:>5} {:>6} {:>8} {:>8}", "op", "dtype", "encode", "decode");
    for c in &codec_points {
        println!(
            "{:>5} {:>6} {:>8.2} {:>8.2}",
            c.op, c.dtype, c.encode_gbps, c.decode_gbps
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
        serde_json::to_string_pretty(
            &serde_json::json!({ "dataplane": points, "codecs": codec_points }),
        )?,
    )?;
    println!("figures written to {}", path.display());
    Ok(())
}
