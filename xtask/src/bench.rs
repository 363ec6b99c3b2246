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
use xagg_common::{
    wire::{DType, Header, Kind, Lane, Op, FLAG_SHADOW},
    JobShape,
};
use xagg_daemon::api::Response;
use xagg_lab::{
    lab::Lab,
    switch::LabSwitch,
    testrun::{
        contribution, frame, job, member, Floor, Switch, PORT, XDP_DROP, XDP_PASS, XDP_REDIRECT,
    },
    workers::AllreduceRun,
};
use xagg_worker::report::CpuWindow;

use crate::build::{ebpf_object, ebpf_test_object, target_dir};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Fewer samples: checks that the benchmark runs, not for figures.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the figures (JSON); default target/bench/bench.json.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to draw goodput against size (SVG); default target/bench/goodput.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Worker counts of the end-to-end runs.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub workers: Vec<usize>,
    /// Buffer sizes of the end-to-end runs (suffixes: KiB, MiB).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,16MiB,64MiB", value_parser = xagg_worker::parse_size)]
    pub sizes: Vec<usize>,
    /// Only the switch program's per-packet costs and the conversions.
    #[arg(long)]
    pub dataplane_only: bool,
    /// Leave out the switch's capacity (for quicker end-to-end comparisons).
    #[arg(long)]
    pub no_capacity: bool,
    /// End to end, the switch alone (no Open MPI runs): for profiles and A/B runs.
    #[arg(long)]
    pub switch_only: bool,
    /// i32 elements per segment of the switch's end-to-end runs; by default as many as the
    /// lab's MTU carries (2232 at 9000: multi-buffer frames on veth; 860 is the largest
    /// single-buffer veth frame).
    #[arg(long)]
    pub segment: Option<usize>,
    /// MTU of the end-to-end runs' lab links (both systems): 9000, jumbo frames, by
    /// default; 1500 as on most Ethernet networks. Segments stop at 8928 bytes (the
    /// switch's slots) whatever the MTU.
    #[arg(long, default_value_t = xagg_lab::lab::MTU)]
    pub mtu: usize,
    /// Slots (segments in flight per worker) of the switch's end-to-end runs.
    #[arg(long, default_value_t = SLOTS)]
    pub slots: u32,
    /// Allreduces per end-to-end point, instead of 200 up to 64 KiB, 20 up to 1 MiB and 5
    /// above (e.g. many, to profile the steady state).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// End-to-end rounds, the systems alternating on the same lab; each figure is the
    /// median over the rounds (the VM drifts by a fifth from one run to the next).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Measure each lever of the switch's end-to-end speed on and off instead (4 workers,
    /// 64 MiB): segment length, slots in flight, UDP GSO, UDP GRO, AF_XDP receive.
    #[arg(long)]
    pub levers: bool,
    /// Measure the send path instead: contributions sent with UDP GSO (as the workers do)
    /// and with AF_XDP, CPU per contribution on each side (4 members, full segments).
    #[arg(long)]
    pub send_path: bool,
}

/// (lever, setting, segment, slots, AF_XDP receive, extra worker flags)
type Lever = (
    &'static str,
    &'static str,
    usize,
    u32,
    bool,
    &'static [&'static str],
);

#[derive(Serialize, Clone, Debug)]
pub struct LeverPoint {
    pub lever: &'static str,
    pub setting: String,
    pub goodput_gbps: f64,
    pub cpu_s_per_gib: f64,
}

/// Each lever off and on, the others at their defaults.
pub fn levers(quick: bool) -> Result<Vec<LeverPoint>> {
    let object = std::fs::read(ebpf_object()).context("reading the XDP object")?;
    let n = 4;
    let bytes = if quick { 1 << 20 } else { 64 << 20 };
    let it = iterations(bytes, quick);
    let mut sw = crate::demo::start_switch(Lab::create(crate::demo::PREFIX, n)?)?;
    // Receiving with the UDP socket needs the lab's host programs; with AF_XDP each worker
    // attaches its own, so in each round the socket settings run first.
    let settings: [Lever; 11] = [
        ("gro", "off", SEGMENT, SLOTS, false, &["--no-gro"]),
        ("gro", "on", SEGMENT, SLOTS, false, &[]),
        ("afxdp", "off (socket)", SEGMENT, SLOTS, false, &[]),
        ("afxdp", "on", SEGMENT, SLOTS, true, &[]),
        ("segment", "256 elements", 256, SLOTS, true, &[]),
        ("segment", "860 elements", 860, SLOTS, true, &[]),
        ("segment", "2232 elements", 2232, SLOTS, true, &[]),
        ("slots", "16", SEGMENT, 16, true, &[]),
        ("slots", "128", SEGMENT, 128, true, &[]),
        ("gso", "off", SEGMENT, SLOTS, true, &["--no-gso"]),
        ("gso", "on", SEGMENT, SLOTS, true, &[]),
    ];
    for (k, &(_, _, segment, slots, _, _)) in settings.iter().enumerate() {
        add_job(&sw, 100 + k as u32, segment, slots)?;
    }
    // Runs on this VM vary by a fifth from one to the next: every setting runs in each of
    // `rounds` rounds, and its median counts.
    let rounds = if quick { 1 } else { 3 };
    let mut samples: Vec<Vec<RunPoint>> = vec![Vec::new(); settings.len()];
    for round in 0..rounds {
        sw.lab.attach_hosts(&object)?;
        let mut hosts = true;
        for (k, &(lever, setting, segment, slots, afxdp, extra)) in settings.iter().enumerate() {
            if afxdp && hosts {
                sw.lab.detach_hosts();
                hosts = false;
            }
            let id = 100 + k as u32;
            let mut run = switch_run(n, id, bytes, segment, slots)?;
            run.repeat = it as u32;
            run.first_message = (round * it) as u32;
            run.afxdp = afxdp;
            run.flags = extra.iter().map(|f| f.to_string()).collect();
            run.flags.push("--cpu-windows".into());
            let r = switch_point(&sw.lab, &run)?;
            anyhow::ensure!(r.verified, "lever {lever} {setting}: result wrong");
            eprintln!(
                "round {round} lever {lever:>8} {setting:>13}: {:.2} Gbit/s, {:.2} CPU s/GiB",
                r.goodput_gbps,
                r.cpu_total()
            );
            samples[k].push(r);
        }
        sw.lab.detach_hosts();
    }
    let mut out = Vec::new();
    for (&(lever, setting, ..), runs) in settings.iter().zip(samples) {
        let p = LeverPoint {
            lever,
            setting: setting.into(),
            goodput_gbps: median(runs.iter().map(|r| r.goodput_gbps).collect()),
            cpu_s_per_gib: median(runs.iter().map(RunPoint::cpu_total).collect()),
        };
        println!(
            "lever {lever:>8} {setting:>13}: {:.2} Gbit/s, {:.2} CPU s/GiB (median of {rounds})",
            p.goodput_gbps, p.cpu_s_per_gib
        );
        out.push(p);
    }
    Ok(out)
}

#[derive(Serialize, Clone)]
pub struct DataplanePoint {
    pub path: &'static str,
    pub elements: usize,
    pub ns_per_packet: f64,
    pub ns_per_kib: f64,
}

fn point(path: &'static str, elements: usize, ns: f64) -> DataplanePoint {
    DataplanePoint {
        path,
        elements,
        ns_per_packet: ns,
        ns_per_kib: ns / (elements as f64 * 4.0 / 1024.0),
    }
}

/// Two CPUs contributing at the same instant (repeat-1 runs behind a barrier, each thread
/// pinned to its CPU), 860 i32 per packet, every slot taking two contributions (one `first`,
/// one `complete`): either both CPUs on the same slot each round — its lock and its cache
/// lines go back and forth — or each CPU on slots of its own. The difference is what keeping
/// CPUs off each other's slots would save per packet.
pub fn contention(quick: bool) -> Result<Vec<DataplanePoint>> {
    use aya::programs::{TestRun, TestRunOptions, Xdp};
    use nix::sched::{sched_setaffinity, CpuSet};
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("contention: SKIPPED, this machine has one CPU and the measurement needs two");
        return Ok(Vec::new());
    }
    let object = std::fs::read(ebpf_object()).context("reading the XDP object")?;
    let elements = xagg_common::wire::BUFFER_PAYLOAD / 4;
    let rounds = if quick { 50 } else { 2000 };
    let values: Vec<i32> = (0..elements as i32).collect();
    let mut sw = Switch::load(&object);
    // Job 1: both CPUs on one slot; jobs 2 and 3: a job (and its slots) per CPU.
    for (jid, base) in [(1u32, 0u32), (2, 4), (3, 8)] {
        sw.add_job(jid, job(2, Op::Sum, DType::I32, elements as u16, base, 4));
    }
    let contrib = |jid: u32, m: u8, r: u32| {
        let flags = if (r / 4) % 2 == 1 { FLAG_SHADOW } else { 0 };
        let h = Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(jid)
            .message(0)
            .segment(r)
            .slot((r % 4) as u16)
            .member(m)
            .flags(flags)
            .count(elements as u16)
            .build();
        frame(&member(m), PORT, &contribution(h, &values))
    };
    // For each of the two threads, per round, the frames it sends in order.
    type Plan = [Vec<Vec<Vec<u8>>>; 2];
    let shared: Plan = [0u8, 1].map(|m| (0..rounds).map(|r| vec![contrib(1, m, r)]).collect());
    let own: Plan = [2u32, 3].map(|jid| {
        (0..rounds)
            .map(|r| vec![contrib(jid, 0, r), contrib(jid, 1, r)])
            .collect()
    });
    let prog: &Xdp = sw
        .ebpf
        .program("xagg_switch")
        .context("no xagg_switch")?
        .try_into()?;
    let run = |plan: &Plan, rounds: std::ops::Range<usize>| -> Result<Vec<f64>> {
        let barrier = std::sync::Barrier::new(2);
        let times: Vec<Vec<f64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2usize)
                .map(|t| {
                    let (plan, barrier) = (&plan[t][rounds.clone()], &barrier);
                    s.spawn(move || -> Result<Vec<f64>> {
                        let mut set = CpuSet::new();
                        set.set(t)?;
                        sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
                        let mut out = Vec::new();
                        let mut buf = vec![0u8; 4096];
                        for round in plan {
                            barrier.wait();
                            for f in round {
                                let mut o = TestRunOptions::new();
                                o.data_in = Some(f);
                                o.data_out = Some(&mut buf);
                                let r = prog.test_run(o)?;
                                anyhow::ensure!(
                                    r.return_value == XDP_DROP || r.return_value == XDP_REDIRECT,
                                    "contention run: action {}",
                                    r.return_value
                                );
                                out.push(r.duration.as_nanos() as f64);
                            }
                        }
                        Ok(out)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("bench thread"))
                .collect::<Result<_>>()
        })?;
        Ok(times.concat())
    };
    // Alternating blocks, so both see the same conditions on a VM whose CPUs vary.
    let blocks = if quick { 1 } else { 10 };
    let per = rounds as usize / blocks;
    let (mut one, mut apart) = (Vec::new(), Vec::new());
    for b in 0..blocks {
        one.extend(run(&shared, b * per..(b + 1) * per)?);
        apart.extend(run(&own, b * per..(b + 1) * per)?);
    }
    let (one, apart) = (median(one), median(apart));
    Ok(vec![
        point("two CPUs, one slot", elements, one),
        point("two CPUs, own slots", elements, apart),
    ])
}

pub fn dataplane(quick: bool) -> Result<Vec<DataplanePoint>> {
    let object =
        std::fs::read(ebpf_object()).context("reading the XDP object (cargo xtask build)")?;
    let test_object = std::fs::read(ebpf_test_object())
        .context("reading the test programs' object (cargo xtask build)")?;
    let mut floor = Floor::load(&test_object);
    let rounds = if quick { 8 } else { 200 };
    let calls = if quick { 3 } else { 25 };
    let mut out = Vec::new();
    // The longest single-buffer segment on veth, and the longest (multi-buffer) one, whose
    // frame the floor cannot read (it adds from the first buffer only).
    let buffer = xagg_common::wire::BUFFER_PAYLOAD / 4;
    for elements in [256usize, 512, buffer, DType::I32.max_elements()] {
        let multi = elements > buffer;
        let mut sw = Switch::load(&object);
        const JID: u32 = 1;
        sw.add_job(JID, job(64, Op::Sum, DType::I32, elements as u16, 0, 4));
        let values: Vec<i32> = (0..elements as i32)
            .map(|i| i.wrapping_mul(2_654_435_761u32 as i32))
            .collect();
        let contrib = |m: u8, sid: u32, slot: u16, epoch: bool| {
            let flags = if epoch { FLAG_SHADOW } else { 0 };
            let h = Header::builder(Kind::Contribution)
                .op(Op::Sum)
                .dtype(DType::I32)
                .job(JID)
                .message(0)
                .segment(sid)
                .slot(slot)
                .member(m)
                .flags(flags)
                .count(elements as u16)
                .build();
            frame(&member(m), PORT, &contribution(h, &values))
        };

        // The floors, each run once next to every switch run, so both see the same
        // conditions on a VM whose speed drifts.
        let floor_frame = |kind: Kind| {
            let h = Header::builder(kind)
                .op(Op::Sum)
                .dtype(DType::I32)
                .count(elements as u16)
                .build();
            frame(&member(0), PORT, &contribution(h, &values))
        };
        let floors = [floor_frame(Kind::Contribution), floor_frame(Kind::Result)];
        let mut floor_ns = [Vec::new(), Vec::new()];
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
                            run.action == if multi { XDP_PASS } else { XDP_REDIRECT },
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
                for (f, ns) in floors.iter().zip(&mut floor_ns).filter(|_| !multi) {
                    let run = floor.run(f);
                    anyhow::ensure!(run.action == XDP_DROP, "the floor refused its frame");
                    ns.push(run.duration.as_nanos() as f64);
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
        let [add, write] = floor_ns;
        if !multi {
            out.push(point("floor: add", elements, median(add)));
            out.push(point("floor: add, write", elements, median(write)));
        }
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
    use xagg_worker::codec;
    let bytes = if quick { 1 << 20 } else { 32 << 20 };
    let passes = if quick { 2 } else { 7 };
    let mut out = Vec::new();
    for (op, dtype) in [
        (Op::Sum, DType::I32),
        (Op::Avg, DType::I32),
        (Op::Sum, DType::F32),
        (Op::Max, DType::F32),
        (Op::Sum, DType::F64),
        (Op::Sum, DType::F16),
        (Op::Sum, DType::Bf16),
        (Op::Min, DType::Bf16),
    ] {
        let lane = xagg_common::wire::lane(op, dtype).unwrap();
        let seg = xagg_common::wire::max_elements(op, dtype);
        let src = xagg_worker::data::generate(dtype, 1, 0, bytes / dtype.size());
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
                std::hint::black_box(codec::encode(op, dtype, 4, chunk, &mut lanes[..n]));
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
    if a.send_path {
        let r = crate::capacity::send_path(a.quick);
        crate::demo::clean_up();
        let points = r?;
        return write_figures(
            a.json,
            "send_path",
            serde_json::json!({ "send_path": points }),
        );
    }
    if a.levers {
        let r = levers(a.quick);
        crate::demo::clean_up();
        let points = r?;
        return write_figures(a.json, "levers", serde_json::json!({ "levers": points }));
    }
    let segment = a
        .segment
        .unwrap_or(xagg_common::wire::payload_for_mtu(a.mtu) / 4);
    let capacity = if a.dataplane_only || a.no_capacity {
        Vec::new()
    } else {
        let r = crate::capacity::run(a.quick, &a.workers);
        crate::demo::clean_up();
        r?
    };
    let mut points = dataplane(a.quick)?;
    points.extend(contention(a.quick)?);
    let codec_points = codecs(a.quick);
    println!(
        "switch program, BPF_PROG_RUN (median ns; {}):",
        if a.quick { "quick" } else { "full" }
    );
    println!(
        "{:>20} {:>9} {:>12} {:>10} {:>8}",
        "path", "elements", "ns/packet", "ns/KiB", "x floor"
    );
    for p in &points {
        // Accumulate against the add alone; complete against the add that writes the frame.
        let floor = match p.path {
            "accumulate" => Some("floor: add"),
            "complete" => Some("floor: add, write"),
            _ => None,
        }
        .and_then(|f| {
            points
                .iter()
                .find(|q| q.path == f && q.elements == p.elements)
        })
        .map_or(String::new(), |f| {
            format!("{:.2}", p.ns_per_packet / f.ns_per_packet)
        });
        println!(
            "{:>20} {:>9} {:>12.0} {:>10.0} {:>8}",
            p.path, p.elements, p.ns_per_packet, p.ns_per_kib, floor
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
    let runs = if a.dataplane_only {
        Vec::new()
    } else {
        let sizes: Vec<usize> = if a.quick {
            a.sizes.iter().copied().filter(|&s| s <= 1 << 20).collect()
        } else {
            a.sizes.clone()
        };
        let r = end_to_end(&E2e {
            quick: a.quick,
            workers: &a.workers,
            sizes: &sizes,
            mpi: !a.switch_only,
            iterations: a.iterations,
            rounds: a.rounds,
            segment,
            mtu: a.mtu,
            slots: a.slots,
        });
        crate::demo::clean_up();
        r?
    };
    if !runs.is_empty() {
        println!();
        println!("allreduce, i32 sum, same lab (MTU {}, segments of {segment} elements), same data (goodput Gbit/s | latency µs | bytes sent per worker / S):", a.mtu);
        println!(
            "{:>3} {:>9} | {:>8} {:>8} {:>6} | {:>9} {:>9} {:>6} | {:>6} {:>6}",
            "n", "bytes", "switch", "openmpi", "x", "switch", "openmpi", "x", "switch", "ompi"
        );
        let pairs = pairs_of(&runs, "switch", "openmpi");
        for &(r, m) in &pairs {
            println!(
                "{:>3} {:>9} | {:>8.2} {:>8.2} {:>6.2} | {:>9.1} {:>9.1} {:>6.2} | {:>6.3} {:>6.3}{}",
                r.workers, r.bytes, r.goodput_gbps, m.goodput_gbps, r.goodput_gbps / m.goodput_gbps, r.latency_us, m.latency_us,
                r.latency_us / m.latency_us, r.wire_ratio, m.wire_ratio,
                if r.verified && m.verified { "" } else { "  NOT VERIFIED" }
            );
        }
        println!();
        println!("CPU s per GiB over exactly the timed windows, machine-wide (total = process + softirq | busy CPUs):");
        println!(
            "{:>3} {:>9} | {:>22} | {:>22} | {:>6} | {:>5} {:>5}",
            "n", "bytes", "switch", "openmpi", "x", "busy", "busy"
        );
        for &(r, m) in &pairs {
            let (Some(c), Some(d)) = (&r.cpu, &m.cpu) else {
                continue;
            };
            println!(
                "{:>3} {:>9} | {:>6.2} = {:>5.2} + {:>5.2} | {:>6.2} = {:>5.2} + {:>5.2} | {:>6.2} | {:>5.2} {:>5.2}",
                r.workers, r.bytes, c.total_s_per_gib, c.process_s_per_gib, c.softirq_s_per_gib,
                d.total_s_per_gib, d.process_s_per_gib, d.softirq_s_per_gib,
                c.total_s_per_gib / d.total_s_per_gib, c.busy_cpus, d.busy_cpus
            );
        }
        for (system, baseline, title, a_name, b_name) in [
            ("mpi+xagg", "openmpi", "an MPI program's MPI_Allreduce (xtask/mpi/allreduce.c), libxagg_mpi.so preloaded | the same binary alone", "preload", "openmpi"),
            ("torch+xagg", "gloo", "PyTorch's dist.all_reduce (xtask/python/allreduce.py), the xagg backend | Gloo", "xagg", "gloo"),
        ] {
            let pairs = pairs_of(&runs, system, baseline);
            if pairs.is_empty() {
                continue;
            }
            println!();
            println!("{title} (goodput Gbit/s | latency µs):");
            println!(
                "{:>3} {:>9} | {:>8} {:>8} {:>6} | {:>9} {:>9} {:>6}",
                "n", "bytes", a_name, b_name, "x", a_name, b_name, "x"
            );
            for &(r, m) in &pairs {
                println!(
                    "{:>3} {:>9} | {:>8.2} {:>8.2} {:>6.2} | {:>9.1} {:>9.1} {:>6.2}{}",
                    r.workers, r.bytes, r.goodput_gbps, m.goodput_gbps, r.goodput_gbps / m.goodput_gbps,
                    r.latency_us, m.latency_us, r.latency_us / m.latency_us,
                    if r.verified && m.verified { "" } else { "  NOT VERIFIED" }
                );
            }
        }
        let plot = a
            .plot
            .clone()
            .unwrap_or_else(|| target_dir().join("bench/goodput.svg"));
        draw(&runs, &plot)?;
        println!("plot written to {}", plot.display());
        anyhow::ensure!(
            runs.iter().all(|r| r.verified),
            "a run's result was wrong: its figures do not count"
        );
    }
    write_figures(
        a.json,
        "bench",
        serde_json::json!({
            "lab": { "mtu": a.mtu, "segment_elements": segment, "slots": a.slots },
            "runs": runs,
            "dataplane": points,
            "codecs": codec_points,
            "capacity": capacity,
        }),
    )
}

/// Writes `figures` to `json`, or by default to `target/bench/<name>.json`.
fn write_figures(json: Option<PathBuf>, name: &str, figures: serde_json::Value) -> Result<()> {
    let path = json.unwrap_or_else(|| target_dir().join(format!("bench/{name}.json")));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(&figures)?)?;
    println!("figures written to {}", path.display());
    Ok(())
}

/// The points of `system` with `baseline`'s at the same worker count and size.
fn pairs_of<'a>(
    runs: &'a [RunPoint],
    system: &str,
    baseline: &str,
) -> Vec<(&'a RunPoint, &'a RunPoint)> {
    runs.iter()
        .filter(|r| r.system == system)
        .filter_map(|r| {
            runs.iter()
                .find(|m| m.system == baseline && m.workers == r.workers && m.bytes == r.bytes)
                .map(|m| (r, m))
        })
        .collect()
}

/// One end-to-end measurement (the JSON's `runs`).
#[derive(Serialize, Clone, Debug)]
pub struct RunPoint {
    pub system: &'static str,
    pub workers: usize,
    pub bytes: usize,
    pub dtype: &'static str,
    /// S x 8 / t / 1e9, t the median over iterations of the slowest worker's time.
    pub goodput_gbps: f64,
    /// The median t, in µs (the latency at 4 KiB).
    pub latency_us: f64,
    /// Bytes each worker sent (interface tx counters) / S.
    pub wire_ratio: f64,
    /// CPU over exactly the timed windows (runs of 1 MiB and more).
    pub cpu: Option<CpuFigures>,
    pub iterations: usize,
    /// Rounds whose medians these figures are (`--rounds`).
    pub rounds: usize,
    pub verified: bool,
}

/// Machine-wide CPU seconds per GiB reduced (S x allreduces), counted over exactly the
/// timed windows: each allreduce from the earliest member's start to the latest member's
/// result, summed over the allreduces.
#[derive(Serialize, Clone, Debug)]
pub struct CpuFigures {
    /// Everything: the workers' processes and the kernel's network work.
    pub total_s_per_gib: f64,
    /// Process context (user and kernel mode): the workers, their system calls and the
    /// send path that runs inside them.
    pub process_s_per_gib: f64,
    /// Interrupt and softirq context: receive processing, where the switch's XDP
    /// programs run (and, for Open MPI, the bridge and TCP receive).
    pub softirq_s_per_gib: f64,
    /// Busy CPUs on average over the windows (at most the machine's CPU count).
    pub busy_cpus: f64,
    /// The windows' total length, seconds.
    pub window_s: f64,
}

impl CpuFigures {
    fn new(windows: &[CpuWindow], bytes: usize) -> Option<Self> {
        if windows.is_empty() {
            return None;
        }
        let gib = bytes as f64 * windows.len() as f64 / (1u64 << 30) as f64;
        let (mut user, mut system, mut softirq, mut secs) = (0.0, 0.0, 0.0, 0.0);
        for w in windows {
            let (u, s, q) = w.cpu();
            user += u;
            system += s;
            softirq += q;
            secs += w.seconds();
        }
        Some(Self {
            total_s_per_gib: (user + system + softirq) / gib,
            process_s_per_gib: (user + system) / gib,
            softirq_s_per_gib: softirq / gib,
            busy_cpus: (user + system + softirq) / secs,
            window_s: secs,
        })
    }
}

/// The per-allreduce windows of several members merged: allreduce k's window runs from
/// the earliest member's start to the latest member's end.
fn merge_windows(members: &[&[CpuWindow]]) -> Vec<CpuWindow> {
    let k = members.iter().map(|w| w.len()).min().unwrap_or(0);
    (0..k)
        .map(|i| {
            members
                .iter()
                .map(|w| w[i])
                .reduce(CpuWindow::union)
                .expect("at least one member")
        })
        .collect()
}

/// Sizes whose runs record CPU windows: the readings delay the next allreduce by some µs,
/// which would show in small-message latency.
const CPU_WINDOWS_FROM: usize = 1 << 20;

impl RunPoint {
    /// Total CPU s per GiB over the timed windows (NaN where not recorded).
    fn cpu_total(&self) -> f64 {
        self.cpu.as_ref().map_or(f64::NAN, |c| c.total_s_per_gib)
    }
}

fn iterations(bytes: usize, quick: bool) -> usize {
    match (bytes, quick) {
        (b, false) if b <= 64 << 10 => 200,
        (b, false) if b <= 1 << 20 => 20,
        (_, false) => 5,
        (b, true) if b <= 64 << 10 => 20,
        _ => 2,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn run_point(
    system: &'static str,
    workers: usize,
    bytes: usize,
    times: Vec<f64>,
    tx_per_worker: f64,
    windows: &[CpuWindow],
    verified: bool,
) -> RunPoint {
    let iterations = times.len();
    let t = median(times);
    RunPoint {
        system,
        workers,
        bytes,
        dtype: "i32",
        goodput_gbps: bytes as f64 * 8.0 / t / 1e9,
        latency_us: t * 1e6,
        wire_ratio: tx_per_worker / (bytes as f64 * iterations as f64),
        cpu: CpuFigures::new(windows, bytes),
        iterations,
        rounds: 1,
        verified,
    }
}

/// The switch: n workers (CLI processes, one per namespace) allreduce `bytes` of i32
/// `iterations` times from a common start; `mid` is the job's next message id.
/// An allreduce of `bytes` of i32 (sum) on job `job` of `n` members.
fn switch_run(
    n: usize,
    job: u32,
    bytes: usize,
    segment: usize,
    slots: u32,
) -> Result<AllreduceRun> {
    let shape = JobShape::with_elements(n, slots as usize, segment, Lane::I32)?;
    Ok(AllreduceRun::new(job, Op::Sum, DType::I32, shape, bytes))
}

/// Runs `run` on the lab's workers: the slowest worker's time per allreduce, bytes sent
/// per worker, machine-wide CPU, and whether every result was right.
fn switch_point(lab: &Lab, run: &AllreduceRun) -> Result<RunPoint> {
    let n = lab.workers;
    let outs = run.run(lab)?;
    let times: Vec<f64> = (0..run.repeat as usize)
        .map(|k| {
            outs.iter()
                .map(|w| w.seconds_all.get(k).copied().unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max)
        })
        .collect();
    let tx = outs.iter().map(|w| w.tx_bytes as f64).sum::<f64>() / n as f64;
    let windows: Vec<&[CpuWindow]> = outs.iter().map(|w| &w.cpu_windows[..]).collect();
    let verified = outs.iter().all(|w| w.verified);
    Ok(run_point(
        "switch",
        n,
        run.bytes,
        times,
        tx,
        &merge_windows(&windows),
        verified,
    ))
}

pub const SLOTS: u32 = 128;
/// i32 elements per segment of the end-to-end runs unless `--segment` says otherwise: a full
/// segment, the fastest at 4 and 8 workers (docs/bench.md).
pub const SEGMENT: usize = xagg_common::wire::MAX_PAYLOAD / 4;

/// Open MPI's MPI_Allreduce over TCP on the same lab, every XDP program detached
/// (`xagg_lab::mpi::run`: one rank per worker namespace).
/// With `preload`, the same binary with `libxagg_mpi.so` preloaded, joining the lab's
/// switch (system `mpi+xagg`).
fn mpi_run(
    lab: &Lab,
    mpi_bin: &std::path::Path,
    bytes: usize,
    iterations: usize,
    preload: bool,
) -> Result<RunPoint> {
    let n = lab.workers;
    let env = if preload {
        vec![
            (
                "LD_PRELOAD",
                xagg_lab::bin("libxagg_mpi.so").display().to_string(),
            ),
            ("XAGG_DAEMON", crate::demo::LISTEN.to_string()),
            ("XAGG_CREDENTIAL", crate::demo::credential_env()),
        ]
    } else {
        Vec::new()
    };
    let agent = xagg_lab::mpi::agent(lab, &target_dir().join("bench"))?;
    let program = format!(
        "{bin} {bytes} {iterations} 7{cpu}",
        bin = mpi_bin.display(),
        cpu = if bytes >= CPU_WINDOWS_FROM {
            " cpu"
        } else {
            ""
        },
    );
    let o = xagg_lab::mpi::run(lab, &agent, n, &env, &program)?;
    if preload {
        // Every allreduce through the switch, or the figures are Open MPI's.
        let err = String::from_utf8_lossy(&o.stderr);
        let served = err
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix("xagg: rank 0: ")?;
                let (n, rest) = rest.split_once(" allreduces through the switch")?;
                let failed = rest.split(", ").nth(1)?.split(' ').next()?;
                Some((n.parse::<usize>().ok()?, failed.parse::<usize>().ok()?))
            })
            .with_context(|| format!("no summary from the MPI library: {err}"))?;
        anyhow::ensure!(
            served.0 >= iterations && served.1 == 0,
            "the preloaded MPI program did not reduce through the switch ({} through it, {} by Open MPI after a failure): {err}",
            served.0,
            served.1
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().find(|l| l.starts_with('{')).with_context(|| {
        format!(
            "mpirun printed no result: {text} {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })?;
    json_point(if preload { "mpi+xagg" } else { "openmpi" }, n, line)
}

/// PyTorch's `dist.all_reduce` through `backend` ("xagg": the switch; "gloo": PyTorch's
/// own, on the plain bridge), every size in one run of `xtask/python/allreduce.py` per rank
/// (system `torch+xagg` or `gloo`).
fn torch_runs(
    lab: &Lab,
    backend: &str,
    sizes: &[usize],
    iterations: impl Fn(usize) -> usize,
) -> Result<Vec<RunPoint>> {
    let n = lab.workers;
    let mut env = xagg_lab::python::base_env();
    env.extend([
        ("MASTER_ADDR", xagg_lab::lab::worker_ip(0).to_string()),
        ("MASTER_PORT", "29600".to_string()),
        ("XAGG_DAEMON", crate::demo::LISTEN.to_string()),
        ("XAGG_CREDENTIAL", crate::demo::credential_env()),
    ]);
    let script = crate::build::root().join("xtask/python/allreduce.py");
    let points: Vec<String> = sizes
        .iter()
        .map(|&b| format!("{b}:{}", iterations(b)))
        .collect();
    let outputs = xagg_lab::python::ranks(lab, n, &env, |_| {
        let mut a = vec![
            script.display().to_string(),
            backend.to_string(),
            "7".into(),
        ];
        a.extend(points.iter().cloned());
        a
    })?;
    for (i, o) in outputs.iter().enumerate() {
        anyhow::ensure!(
            o.status.success(),
            "PyTorch's allreduce on {backend}, rank {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let err = String::from_utf8_lossy(&outputs[0].stderr);
    if backend == "xagg" {
        // Every allreduce through the switch, or the figures are Gloo's.
        anyhow::ensure!(
            err.contains("allreduces through the switch, 0 made by Gloo")
                && !err.contains("allreduces go to Gloo"),
            "PyTorch's allreduce through the xagg backend did not go through the switch: {err}"
        );
    }
    let system = if backend == "xagg" {
        "torch+xagg"
    } else {
        "gloo"
    };
    String::from_utf8_lossy(&outputs[0].stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|line| json_point(system, n, line))
        .collect()
}

/// A point from one line of JSON of the MPI program or the PyTorch script: `bytes`,
/// `seconds` (each iteration's slowest rank), `tx_bytes_per_rank`, `verified`, and
/// optionally `cpu_windows`.
fn json_point(system: &'static str, workers: usize, line: &str) -> Result<RunPoint> {
    let v: serde_json::Value = serde_json::from_str(line)?;
    let times: Vec<f64> = v["seconds"]
        .as_array()
        .context("seconds")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    Ok(run_point(
        system,
        workers,
        v["bytes"].as_u64().context("bytes")? as usize,
        times,
        v["tx_bytes_per_rank"].as_f64().unwrap_or(0.0),
        &serde_json::from_value::<Vec<CpuWindow>>(v["cpu_windows"].clone()).unwrap_or_default(),
        v["verified"].as_bool() == Some(true),
    ))
}

/// Builds the MPI baseline (`cargo xtask setup` installs Open MPI).
fn mpi_setup() -> Result<PathBuf> {
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join("mpi_allreduce");
    xagg_lab::mpi::compile(
        &crate::build::root().join("xtask/mpi/allreduce.c"),
        &bin,
        &[],
    )?;
    Ok(bin)
}

/// Both systems on the same lab topology, for each worker count and size.
/// What [`end_to_end`] runs.
pub struct E2e<'a> {
    pub quick: bool,
    pub workers: &'a [usize],
    pub sizes: &'a [usize],
    /// Open MPI's runs besides the switch's.
    pub mpi: bool,
    /// Allreduces per point instead of the size's default.
    pub iterations: Option<usize>,
    /// Rounds, each the switch's runs then Open MPI's on the same lab: every figure is the
    /// median over the rounds, so both systems see the VM's drift alike.
    pub rounds: usize,
    /// i32 elements per segment of the switch's runs.
    pub segment: usize,
    /// The lab links' MTU.
    pub mtu: usize,
    /// Slots of the switch's runs.
    pub slots: u32,
}

/// Both systems on the same lab topology, for each worker count and size.
pub fn end_to_end(e: &E2e) -> Result<Vec<RunPoint>> {
    let iterations = |bytes| e.iterations.unwrap_or_else(|| iterations(bytes, e.quick));
    let mpi_bin = mpi_setup()?;
    let mut runs = Vec::new();
    for &n in e.workers {
        let mut lab = Lab::with_mtu(crate::demo::PREFIX, n, e.mtu)?;
        let mut rounds: Vec<Vec<RunPoint>> = Vec::new();
        for round in 0..e.rounds.max(1) {
            let mut this = Vec::new();
            // Switch workers receive with AF_XDP: each attaches its own xagg_host.
            let sw = crate::demo::start_switch(lab)?;
            add_job(&sw, crate::demo::JOB_ID, e.segment, e.slots)?;
            let mut mid = 0u32;
            for &bytes in e.sizes {
                let it = iterations(bytes);
                let mut run = switch_run(n, crate::demo::JOB_ID, bytes, e.segment, e.slots)?;
                run.repeat = it as u32;
                run.first_message = mid;
                if bytes >= CPU_WINDOWS_FROM {
                    run.flags.push("--cpu-windows".into());
                }
                let r = switch_point(&sw.lab, &run)?;
                mid += it as u32;
                report(round, &r);
                this.push(r);
            }
            // The same MPI program as Open MPI's runs, with the MPI library preloaded:
            // its MPI_Allreduce through the switch.
            // Its ranks receive on plain UDP sockets, which on veth needs the host program.
            let mut sw = sw;
            if e.mpi {
                let object =
                    std::fs::read(crate::build::ebpf_object()).context("reading the XDP object")?;
                sw.lab.attach_hosts(&object)?;
            }
            for &bytes in e.sizes.iter().filter(|_| e.mpi) {
                let r = mpi_run(&sw.lab, &mpi_bin, bytes, iterations(bytes), true)?;
                report(round, &r);
                this.push(r);
            }
            if e.mpi {
                for r in torch_runs(&sw.lab, "xagg", e.sizes, iterations)? {
                    report(round, &r);
                    this.push(r);
                }
            }
            sw.lab.detach_hosts();
            // Open MPI runs over the plain bridge: the switch's programs detached.
            lab = sw.stop()?;
            for &bytes in e.sizes.iter().filter(|_| e.mpi) {
                let r = mpi_run(&lab, &mpi_bin, bytes, iterations(bytes), false)?;
                report(round, &r);
                this.push(r);
            }
            if e.mpi {
                for r in torch_runs(&lab, "gloo", e.sizes, iterations)? {
                    report(round, &r);
                    this.push(r);
                }
            }
            rounds.push(this);
        }
        // Point k of every round is the same system and size.
        for k in 0..rounds[0].len() {
            runs.push(median_point(rounds.iter().map(|r| &r[k]).collect()));
        }
    }
    Ok(runs)
}

fn report(round: usize, r: &RunPoint) {
    eprintln!(
        "round {round} {:<7} n={} {:>9} B: {:7.3} Gbit/s, {:8.1} µs, wire {:.3} S, {:.2} CPU s/GiB{}",
        r.system,
        r.workers,
        r.bytes,
        r.goodput_gbps,
        r.latency_us,
        r.wire_ratio,
        r.cpu_total(),
        if r.verified { "" } else { "  NOT VERIFIED" }
    );
}

/// The rounds of one point merged: each figure the median over the rounds; verified only
/// if every round was.
fn median_point(points: Vec<&RunPoint>) -> RunPoint {
    let m = |f: fn(&RunPoint) -> f64| median(points.iter().map(|p| f(p)).collect());
    let cpu = points.iter().all(|p| p.cpu.is_some()).then(|| {
        let c = |f: fn(&CpuFigures) -> f64| {
            median(
                points
                    .iter()
                    .filter_map(|p| p.cpu.as_ref().map(f))
                    .collect(),
            )
        };
        CpuFigures {
            total_s_per_gib: c(|c| c.total_s_per_gib),
            process_s_per_gib: c(|c| c.process_s_per_gib),
            softirq_s_per_gib: c(|c| c.softirq_s_per_gib),
            busy_cpus: c(|c| c.busy_cpus),
            window_s: c(|c| c.window_s),
        }
    });
    RunPoint {
        goodput_gbps: m(|p| p.goodput_gbps),
        latency_us: m(|p| p.latency_us),
        wire_ratio: m(|p| p.wire_ratio),
        cpu,
        rounds: points.len(),
        verified: points.iter().all(|p| p.verified),
        ..points[0].clone()
    }
}

/// Adds job `id` (i32 sum) over every worker of the lab.
pub fn add_job(sw: &LabSwitch, id: u32, segment: usize, slots: u32) -> Result<()> {
    let workers: Vec<usize> = (0..sw.lab.workers).collect();
    let spec = sw.job_spec(
        id,
        Op::Sum,
        DType::I32,
        segment as u16,
        slots,
        &workers,
        xagg_lab::lab::WORKER_PORT,
    )?;
    match sw.add_job(spec)? {
        Response::Job { .. } => Ok(()),
        r => anyhow::bail!("adding job {id}: {r:?}"),
    }
}

/// Goodput against buffer size, one line per system and worker count.
fn draw(runs: &[RunPoint], path: &std::path::Path) -> Result<()> {
    use plotters::prelude::*;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = runs.iter().map(|r| r.goodput_gbps).fold(0.0, f64::max) * 1.15;
    let xs: Vec<f64> = runs.iter().map(|r| (r.bytes as f64).log2()).collect();
    let (x0, x1) = (
        xs.iter().cloned().fold(f64::INFINITY, f64::min),
        xs.iter().cloned().fold(0.0, f64::max),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "allreduce goodput, i32 sum, netns lab (2 cores)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x0 - 0.3..x1 + 0.3, 0.0..max)?;
    chart
        .configure_mesh()
        .x_desc("bytes per worker")
        .y_desc("goodput, Gbit/s")
        .x_label_formatter(&|x| crate::demo::human(2f64.powf(x.round()) as usize))
        .draw()?;
    let mut workers: Vec<usize> = runs.iter().map(|r| r.workers).collect();
    workers.sort();
    workers.dedup();
    for (i, system) in ["switch", "openmpi"].into_iter().enumerate() {
        for (j, &n) in workers.iter().enumerate() {
            let color = Palette99::pick(i * 4 + j).to_rgba();
            let pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.system == system && r.workers == n)
                .map(|r| ((r.bytes as f64).log2(), r.goodput_gbps))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(format!("{system}, {n} workers"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
