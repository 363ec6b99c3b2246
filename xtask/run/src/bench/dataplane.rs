//! The switch program's cost per packet: each of its paths timed with BPF_PROG_RUN
//! (kernel-measured, JIT-compiled), as medians over many runs.
//!
//! BPF_PROG_RUN reruns a frame against live map state, so each path is set up explicitly:
//! - `pass`: a non-collective frame, `repeat` 10000 (stateless);
//! - `duplicate`: a contribution whose member is already in the slot, `repeat` 10000;
//! - `first`, `accumulate`, `complete`: a 64-member job; every round on a slot is one
//!   `first` (copied into the empty version), 62 `accumulate` and one `complete`, each a
//!   `repeat` 1 run, so every sample is a real state transition. A repeat-1 run includes the
//!   kernel's clock reads (tens of ns).

use anyhow::{Context, Result};
use serde::Serialize;
use xagg_common::wire::{DType, Header, Kind, Op, FLAG_SHADOW};
use xagg_lab::testrun::{
    contribution, frame, job, member, Floor, Switch, PORT, XDP_DROP, XDP_PASS, XDP_REDIRECT,
};
use xagg_lab::Object;

use super::{cpu, report::median};

#[derive(Serialize, Clone)]
pub struct DataplanePoint {
    pub path: &'static str,
    pub elements: usize,
    pub ns_per_packet: f64,
    pub ns_per_kib: f64,
}

/// Slots of the measured jobs.
const SLOTS: u32 = 4;

fn point(path: &'static str, elements: usize, ns: f64) -> DataplanePoint {
    DataplanePoint {
        path,
        elements,
        ns_per_packet: ns,
        ns_per_kib: ns / (elements as f64 * 4.0 / 1024.0),
    }
}

/// Each path at 256, 512, the longest single-buffer and the longest segment.
pub fn dataplane(quick: bool) -> Result<Vec<DataplanePoint>> {
    let mut each = compare(quick, &[Object::Switch.read()?])?;
    Ok(each.remove(0))
}

/// [`dataplane`] for each of `objects` (switch objects of one layout version), run
/// interleaved: every round of a slot and every repeated call goes to each object in turn,
/// so each path of each object is timed under the same conditions on a VM whose speed
/// drifts from one second to the next. The floors are shared.
pub fn compare(quick: bool, objects: &[Vec<u8>]) -> Result<Vec<Vec<DataplanePoint>>> {
    let mut floor = Floor::load(&Object::Test.read()?);
    let rounds = if quick { 8 } else { 200 };
    let calls = if quick { 3 } else { 25 };
    let mut out: Vec<Vec<DataplanePoint>> = vec![Vec::new(); objects.len()];
    // The longest single-buffer segment on veth, and the longest (multi-buffer) one, whose
    // frame the floor cannot read (it adds from the first buffer only).
    let buffer = xagg_common::wire::BUFFER_PAYLOAD / 4;
    // Each object loaded once (a load is seconds of verification), a job and slots of
    // its own per length.
    let mut switches: Vec<Switch> = objects.iter().map(|o| Switch::load(o)).collect();
    for (k, elements) in [256usize, 512, buffer, DType::I32.max_elements()]
        .into_iter()
        .enumerate()
    {
        let multi = elements > buffer;
        let jid = 1 + k as u32;
        for sw in &mut switches {
            let spec = job(
                64,
                Op::Sum,
                DType::I32,
                elements as u16,
                k as u32 * SLOTS,
                SLOTS,
            );
            sw.add_job(jid, spec);
        }
        let values: Vec<i32> = (0..elements as i32)
            .map(|i| i.wrapping_mul(2_654_435_761u32 as i32))
            .collect();
        let contrib = |m: u8, round: u32| contribution_frame(jid, m, round, &values);

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
        // Per object: first, accumulate, complete, duplicate, pass.
        let mut paths: Vec<[Vec<f64>; 5]> = vec![Default::default(); objects.len()];
        for r in 0..rounds {
            for (sw, [first, acc, complete, ..]) in switches.iter_mut().zip(&mut paths) {
                for m in 0..64u8 {
                    let run = sw.run(&contrib(m, r));
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
        }
        // A duplicate: member 0 again while the round (sid `rounds`) is filling.
        let dup = contrib(0, rounds);
        let other = frame(&member(0), 53, &[0u8; 64]);
        for sw in &mut switches {
            sw.run(&dup);
        }
        for _ in 0..calls {
            for (sw, [.., dups, passes]) in switches.iter_mut().zip(&mut paths) {
                dups.push(sw.run_repeat(&dup, 10_000).duration.as_nanos() as f64);
                let r = sw.run_repeat(&other, 10_000);
                anyhow::ensure!(r.action == XDP_PASS, "a non-collective frame not passed");
                passes.push(r.duration.as_nanos() as f64);
            }
        }
        let floors = (!multi).then(|| floor_ns.map(median));
        for (out, [first, acc, complete, dups, passes]) in out.iter_mut().zip(paths) {
            if let Some([add, write]) = floors {
                out.push(point("floor: add", elements, add));
                out.push(point("floor: add, write", elements, write));
            }
            out.push(point("pass", elements, median(passes)));
            out.push(point("first", elements, median(first)));
            out.push(point("accumulate", elements, median(acc)));
            out.push(point("complete", elements, median(complete)));
            out.push(point("duplicate", elements, median(dups)));
        }
    }
    Ok(out)
}

/// Float sums in the switch in each float mode: `accumulate` of full segments in a job of
/// 8 members, ns per packet and per KiB of the buffer's own elements (the exact lanes carry
/// an f32 in 8 bytes and an f64 in 16, so a KiB of buffer takes twice the packets).
pub fn float_sums(quick: bool) -> Result<Vec<DataplanePoint>> {
    use xagg_common::wire::{self, Float};
    const MEMBERS: u8 = 8;
    let mut sw = Switch::load(&Object::Switch.read()?);
    let rounds = if quick { 4 } else { 100 };
    let mut out = Vec::new();
    for (k, (path, dtype, float)) in [
        ("f32 sum, fast", DType::F32, Float::Fast),
        ("f32 sum, exact", DType::F32, Float::Exact),
        ("f64 sum, fast", DType::F64, Float::Fast),
        ("f64 sum, exact", DType::F64, Float::Exact),
    ]
    .into_iter()
    .enumerate()
    {
        // A job and slots of its own per case, on one loaded switch.
        let jid = 1 + k as u32;
        let elements = wire::max_elements_in(Op::Sum, dtype, float);
        let lane = wire::lane_in(Op::Sum, dtype, float).context("a float sum's lane")?;
        sw.add_job(
            jid,
            job(
                MEMBERS as usize,
                Op::Sum,
                dtype,
                wire::max_elements(Op::Sum, dtype) as u16,
                k as u32 * SLOTS,
                SLOTS,
            ),
        );
        // Each member's segment, encoded once; every round sends the same.
        let segments: Vec<(Vec<u8>, xagg_worker::codec::Encoded)> = (0..MEMBERS)
            .map(|m| {
                let src = xagg_worker::data::generate(dtype, 1, m.into(), elements);
                let mut lanes = vec![0u8; elements * lane.size()];
                let enc = xagg_worker::codec::encode(
                    Op::Sum,
                    dtype,
                    float,
                    MEMBERS.into(),
                    &src,
                    &mut lanes,
                );
                (lanes, enc)
            })
            .collect();
        let mut acc = Vec::new();
        for r in 0..rounds {
            for m in 0..MEMBERS {
                let (lanes, enc) = &segments[m as usize];
                let h = Header::builder(Kind::Contribution)
                    .op(Op::Sum)
                    .dtype(dtype)
                    .job(jid)
                    .segment(r)
                    .slot((r % SLOTS) as u16)
                    .member(m)
                    .flags(if (r / SLOTS) % 2 == 1 { FLAG_SHADOW } else { 0 })
                    .float(float)
                    .count(elements as u16)
                    .exponent(enc.exponent)
                    .enc_flags(enc.flags)
                    .magnitude(enc.magnitude)
                    .build();
                let mut udp = vec![0u8; wire::HEADER_LEN + wire::payload_len(lanes.len(), 1)];
                wire::encode(&h, lanes, &mut udp).context("encoding a contribution")?;
                let run = sw.run(&frame(&member(m), PORT, &udp));
                if (1..MEMBERS - 1).contains(&m) {
                    anyhow::ensure!(run.action == XDP_DROP, "{path}: member {m} not accumulated");
                    acc.push(run.duration.as_nanos() as f64);
                }
            }
        }
        let ns = median(acc);
        out.push(DataplanePoint {
            path,
            elements,
            ns_per_packet: ns,
            ns_per_kib: ns / (elements as f64 * dtype.size() as f64 / 1024.0),
        });
    }
    Ok(out)
}

/// Two CPUs contributing at the same instant (repeat-1 runs behind a barrier, each thread
/// pinned to its CPU), 860 i32 per packet, every slot taking two contributions (one `first`,
/// one `complete`): either both CPUs on the same slot each round — its lock and its cache
/// lines go back and forth — or each CPU on slots of its own. The difference is what keeping
/// CPUs off each other's slots would save per packet.
pub fn contention(quick: bool) -> Result<Vec<DataplanePoint>> {
    use aya::programs::{TestRun, TestRunOptions, Xdp};
    if cpu::count() < 2 {
        eprintln!("contention: SKIPPED, this machine has one CPU and the measurement needs two");
        return Ok(Vec::new());
    }
    let object = Object::Switch.read()?;
    let elements = xagg_common::wire::BUFFER_PAYLOAD / 4;
    let rounds = if quick { 50 } else { 2000 };
    let values: Vec<i32> = (0..elements as i32).collect();
    let mut sw = Switch::load(&object);
    // Job 1: both CPUs on one slot; jobs 2 and 3: a job (and its slots) per CPU.
    for (jid, base) in [(1u32, 0u32), (2, 4), (3, 8)] {
        sw.add_job(
            jid,
            job(2, Op::Sum, DType::I32, elements as u16, base, SLOTS),
        );
    }
    let contrib = |jid: u32, m: u8, r: u32| contribution_frame(jid, m, r, &values);
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
                        cpu::pin_self(t)?;
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

/// Member `m`'s contribution of `values` (i32 sum) to round `round` of job `jid`, as the
/// frame the member sends: segment `round` of message 0, in slot `round` mod [`SLOTS`], its
/// shadow copy every other time round the slots (as the workers' schedule takes them).
fn contribution_frame(jid: u32, m: u8, round: u32, values: &[i32]) -> Vec<u8> {
    let shadow = (round / SLOTS) % 2 == 1;
    let h = Header::builder(Kind::Contribution)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(jid)
        .message(0)
        .segment(round)
        .slot((round % SLOTS) as u16)
        .member(m)
        .flags(if shadow { FLAG_SHADOW } else { 0 })
        .count(values.len() as u16)
        .build();
    frame(&member(m), PORT, &contribution(h, values))
}
