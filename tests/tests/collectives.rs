//! Reduce-scatter, all-gather, broadcast and reduce through the switch, end to end in a
//! netns lab of 4 members, each keeping one worker across its calls as a program does:
//! every call exact (single- and multi-buffer segments, one element per block, blocks of a
//! segment and one element more, more segments than slots), each round completed once,
//! and under loss of contributions and of results at 1, 5 and 20 %.

use std::net::SocketAddrV4;

use xagg_api::{Request, Response};
use xagg_common::{
    wire::{self, Collective, Lane, Op, DEFAULT_PORT},
    JobShape,
};
use xagg_lab::lab;
use xagg_tests::*;
use xagg_worker::{Buffer, Report, Worker, WorkerParams};

const WORKERS: [usize; 4] = [0, 1, 2, 3];

/// The collectives with their roots (reduce-scatter and all-gather have an owner per
/// block instead).
const ALL: [(Collective, usize); 4] = [
    (Collective::ReduceScatter, 0),
    (Collective::AllGather, 0),
    (Collective::Broadcast, 2),
    (Collective::Reduce, 1),
];

/// One call: the collective, its root, the elements (i32) of its message, the data's seed.
type Call = (Collective, usize, usize, u64);

/// Bytes received and sent on the calling thread's network namespace's interfaces but
/// loopback.
fn link_bytes() -> (u64, u64) {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").expect("/proc net/dev");
    dev.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim() != "lo")
        .map(|(_, v)| {
            let f: Vec<u64> = v.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0], f[8])
        })
        .fold((0, 0), |(r, t), (a, b)| (r + a, t + b))
}

/// What one member's call did: its report, and the bytes its link received and sent.
struct Done {
    report: Report,
    received: u64,
    sent: u64,
}

/// Member `m`'s worker on job `job` (segments of `segment` elements) from message
/// `message`, in its namespace (the calling thread enters it), its parameters as `tweak`
/// leaves them.
fn member(
    sw: &TestSwitch,
    m: usize,
    (job, segment, message): (u32, usize, u32),
    tweak: impl FnOnce(&mut WorkerParams),
) -> Worker {
    let shape =
        JobShape::with_elements(WORKERS.len(), 64, segment, Lane::I32).expect("a valid shape");
    xagg_linux::iface::enter_netns(&sw.lab.worker_ns(m)).unwrap();
    let bind = SocketAddrV4::new(lab::worker_ip(m), 47801 + job as u16);
    let to = SocketAddrV4::new(lab::SWITCH_IP, DEFAULT_PORT);
    let mut p = WorkerParams::new(to, bind, job, m as u8, shape);
    p.first_message = Some(message);
    tweak(&mut p);
    Worker::new(p).expect("a worker")
}

/// Runs `calls` in order on every member at once, from message `message` of job `job`
/// (segments of `segment` elements), each member's result of each call checked against
/// what it must be; what each member's calls did.
fn run(sw: &TestSwitch, job: u32, segment: usize, message: u32, calls: &[Call]) -> Vec<Vec<Done>> {
    let n = WORKERS.len();
    // Every member takes its links' counts before any sends a call's first datagram and
    // after its own call ended, before any starts the next: each call's bytes its own.
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = WORKERS
            .iter()
            .map(|&m| {
                let barrier = &barrier;
                s.spawn(move || {
                    let w = member(sw, m, (job, segment, message), |_| {});
                    let mut reports = Vec::new();
                    for &(collective, root, elems, seed) in calls {
                        let xagg_worker::data::CollectiveCase {
                            input,
                            output,
                            expected,
                        } = xagg_worker::data::CollectiveCase::new(
                            collective, root, m, n, elems, seed,
                        );
                        let (rx, tx) = link_bytes();
                        barrier.wait();
                        let c = w
                            .submit_collective(
                                collective,
                                Op::Sum,
                                root,
                                input.map(Buffer::from),
                                Buffer::from(output),
                            )
                            .expect("submitted")
                            .wait();
                        let (rx2, tx2) = link_bytes();
                        barrier.wait();
                        let report = c.status.unwrap_or_else(|e| {
                            panic!("{collective} member {m}: {e}; counters {:?}", sw.counters())
                        });
                        let got: Vec<i32> = c.buffer.into_vec().expect("i32");
                        assert_eq!(got.len(), expected.len());
                        if let Some(i) = got.iter().zip(&expected).position(|(a, b)| a != b) {
                            panic!(
                                "{collective} of {elems} member {m}: element {i} is {} but must be {}",
                                got[i], expected[i]
                            );
                        }
                        reports.push(Done {
                            report,
                            received: rx2 - rx,
                            sent: tx2 - tx,
                        });
                    }
                    reports
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("member"))
            .collect()
    })
}

/// One collective of `elems` i32 on job `job` from message `message`, every member
/// serving its peers, with member `cut`'s results from the switch cut off (nftables)
/// before it starts: every member's result exact after [`Worker::recover`]; what each
/// recovered (`None`: it did not need to) and how many segments the call had.
#[allow(clippy::too_many_arguments)]
fn run_cut(
    sw: &TestSwitch,
    job: u32,
    segment: usize,
    message: u32,
    (collective, root): (Collective, usize),
    elems: usize,
    cut: usize,
) -> (Vec<Option<usize>>, usize) {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Barrier, Mutex,
    };
    let n = WORKERS.len();
    let secret = xagg_worker::Secret([5; 32]);
    let addresses = Mutex::new(vec![None; n]);
    let barrier = Barrier::new(n);
    let cut_off = AtomicBool::new(false);
    let ns = sw.lab.worker_ns(cut);
    let outcomes: Vec<(Option<usize>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = WORKERS
            .iter()
            .map(|&m| {
                let (barrier, addresses, cut_off, secret, ns) =
                    (&barrier, &addresses, &cut_off, &secret, &ns);
                s.spawn(move || {
                    let w = member(sw, m, (job, segment, message), |p| {
                        // A failure ends the test instead of leaving the others waiting.
                        p.collective_timeout = std::time::Duration::from_secs(30);
                        if m == cut {
                            p.give_up = std::time::Duration::from_secs(1);
                        }
                    });
                    // The job's state learnt before the cut.
                    serve_peers(&w, m, secret, addresses, barrier).expect("peers");
                    if m == cut {
                        let rule = format!(
                            "table inet xagg_cut {{\n chain input {{\n type filter hook input priority 0;\n ip saddr {} meta l4proto udp drop\n }}\n}}\n",
                            lab::SWITCH_IP
                        );
                        cut_off.store(nft(ns, &rule), Ordering::SeqCst);
                    }
                    barrier.wait();
                    if !cut_off.load(Ordering::SeqCst) {
                        return Err("nft (nftables) took no rule".to_string());
                    }
                    let case = xagg_worker::data::CollectiveCase::new(
                        collective, root, m, n, elems, 77,
                    );
                    let mut c = w
                        .submit_collective(
                            collective,
                            Op::Sum,
                            root,
                            case.input.map(Buffer::from),
                            Buffer::from(case.output),
                        )
                        .expect("submitted")
                        .wait();
                    let tried = w.recover(&mut c);
                    // Every worker (and its responder) kept until every member is done.
                    barrier.wait();
                    let report = c.status.map_err(|e| format!("member {m}: {e}"))?;
                    let got: Vec<i32> = c.buffer.into_vec().expect("i32");
                    if let Some(i) = got.iter().zip(&case.expected).position(|(a, b)| a != b) {
                        return Err(format!(
                            "member {m}: element {i} is {} but must be {}",
                            got[i], case.expected[i]
                        ));
                    }
                    Ok((tried.then_some(report.recovered), report.segments))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("member"))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| {
                panic!(
                    "{collective}, member {cut} cut off: {e}; counters {:?}",
                    sw.counters()
                )
            })
    });
    assert!(nft(&ns, "delete table inet xagg_cut\n"));
    let segments = outcomes[0].1;
    (outcomes.into_iter().map(|o| o.0).collect(), segments)
}

/// Message `message` of job `job` (segments of `segment` elements) as an allreduce of
/// `elems` i32 on every member, serving their peers, member `odd` making it with another
/// op (max, where the others sum) 300 ms after the others: each member's error, and how
/// long after its submit its call ended.
fn run_mismatched(
    sw: &TestSwitch,
    (job, segment, message): (u32, usize, u32),
    elems: usize,
    odd: usize,
) -> Vec<(xagg_worker::AllreduceError, std::time::Duration)> {
    use std::time::{Duration, Instant};
    let n = WORKERS.len();
    let secret = xagg_worker::Secret([6; 32]);
    let addresses = std::sync::Mutex::new(vec![None; n]);
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = WORKERS
            .iter()
            .map(|&m| {
                let (barrier, addresses, secret) = (&barrier, &addresses, &secret);
                s.spawn(move || {
                    let w = member(sw, m, (job, segment, message), |p| {
                        p.give_up = Duration::from_secs(1);
                        p.collective_timeout = Duration::from_secs(30);
                    });
                    serve_peers(&w, m, secret, addresses, barrier).expect("peers");
                    barrier.wait();
                    let op = if m == odd {
                        std::thread::sleep(Duration::from_millis(300));
                        Op::Max
                    } else {
                        Op::Sum
                    };
                    let t = Instant::now();
                    let c = w
                        .submit(op, Buffer::from(vec![m as i32; elems]))
                        .expect("submitted")
                        .wait();
                    let took = t.elapsed();
                    // Every responder kept until every member is done.
                    barrier.wait();
                    match c.status {
                        Ok(_) => panic!("member {m}: the mismatched allreduce succeeded"),
                        Err(e) => (e, took),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("member"))
            .collect()
    })
}

fn inject(sw: &TestSwitch, drop_contribution: f64, drop_result: f64) {
    assert!(matches!(
        sw.api(Request::Inject {
            drop_contribution,
            drop_result
        }),
        Response::Ok
    ));
}

#[test]
fn every_collective_exact_through_the_switch_and_under_loss() {
    if !require_root("every_collective_exact_through_the_switch_and_under_loss") {
        return;
    }
    let sw = TestSwitch::start("xco", WORKERS.len(), |_| {});
    // Job 1 in single-buffer segments, job 2 in full (multi-buffer) ones.
    let jobs = [(1u32, 860usize), (2, wire::MAX_PAYLOAD / 4)];
    for (job, segment) in jobs {
        assert!(matches!(
            sw.add_job_on(job, segment as u16, 64, &WORKERS, 47801 + job as u16),
            Response::Job { .. }
        ));
    }
    // Each job's next message id.
    let message = std::cell::Cell::new([0u32; 3]);
    let next = |job: u32, calls: usize| {
        let mut m = message.get();
        let first = m[job as usize];
        m[job as usize] += calls as u32;
        message.set(m);
        first
    };
    let phase = |what: &str, job: u32, segment: usize, calls: &[Call]| {
        let before = sw.counters();
        let reps = run(&sw, job, segment, next(job, calls.len()), calls);
        let after = sw.counters();
        let moved: Vec<(String, u64)> = after
            .iter()
            .filter(|(k, v)| before[*k] != **v)
            .map(|(k, v)| (k.clone(), v - before[k]))
            .collect();
        let d = move |k: &str| after[k] - before[k];
        let segments: u64 = reps[0].iter().map(|r| r.report.segments as u64).sum();
        let retx: u64 = reps
            .iter()
            .flatten()
            .map(|r| r.report.retransmissions)
            .sum();
        eprintln!(
            "{what}, job {job}: {} calls, {segments} segments exact, {retx} retransmissions (per member {:?})",
            calls.len(),
            reps.iter().map(|r| r.iter().map(|r| r.report.retransmissions).sum::<u64>()).collect::<Vec<_>>()
        );
        eprintln!("  counters moved: {moved:?}");
        (d, segments, retx, reps)
    };
    // Exact at sizes around the segments; each round completed once, every member in
    // once, where nothing was sent twice.
    for (job, segment) in jobs {
        let calls: Vec<Call> = ALL
            .iter()
            .flat_map(|&(c, root)| {
                [4, 4 * (segment + 1), 4 * 20 * segment + 12]
                    .map(|elems| (c, root, elems, elems as u64))
            })
            .collect();
        let (d, segments, _, reps) = phase("every collective", job, segment, &calls);
        // A contribution sent again is a duplicate or a replay, never counted here.
        assert_eq!(d("complete"), segments, "one completion per round");
        assert_eq!(
            d("contribution") + d("complete"),
            segments * WORKERS.len() as u64,
            "every member in once per round"
        );
        // Each member's link carries what the collective moves for it, and little more:
        // the largest call of each collective, S bytes over 4 members, against the table
        // of docs/protocol.md (the data; collective, UDP, IPv4 and Ethernet headers of
        // every frame are the rest, at most a tenth and 200 bytes a segment).
        for (i, &(c, root, elems, _)) in calls.iter().enumerate() {
            if elems < 4 * 20 * segment {
                continue;
            }
            let s = 4 * elems as u64;
            for (m, done) in reps.iter().map(|r| &r[i]).enumerate() {
                let owner = m == root;
                let (tx, rx) = match c {
                    Collective::ReduceScatter => (s, s / 4),
                    Collective::AllGather => (s / 4, 3 * s / 4),
                    Collective::Broadcast if owner => (s, 0),
                    Collective::Broadcast => (0, s),
                    Collective::Reduce if owner => (s, s),
                    Collective::Reduce => (s, 0),
                    Collective::Allreduce => unreachable!(),
                };
                let segs = done.report.segments as u64;
                let within =
                    |got: u64, data: u64| got >= data && got <= data + data / 10 + 200 * segs;
                eprintln!(
                    "  {c} of {s} bytes, member {m}: sent {:.3} S, received {:.3} S",
                    done.sent as f64 / s as f64,
                    done.received as f64 / s as f64
                );
                assert!(
                    within(done.sent, tx) && within(done.received, rx),
                    "{c} of {s} bytes, member {m}: sent {} and received {} bytes, the data {tx} and {rx}",
                    done.sent,
                    done.received
                );
            }
        }
    }
    // Loss of contributions and of results, each rate, each collective.
    for rate in [0.01, 0.05, 0.20] {
        for (dc, dr) in [(rate, 0.0), (0.0, rate)] {
            inject(&sw, dc, dr);
            for (job, segment) in jobs {
                let calls: Vec<Call> = ALL
                    .iter()
                    .map(|&(c, root)| (c, root, 4 * 30 * segment + 8, 7 + job as u64))
                    .collect();
                let what = format!("contributions dropped at {dc}, results at {dr}");
                let (d, _, retx, _) = phase(&what, job, segment, &calls);
                let dropped = d("inject_drop_contribution") + d("inject_drop_result");
                assert!(dropped > 0, "{what}: nothing was dropped");
                assert!(retx > 0, "{what}: the drops needed retransmissions");
            }
        }
    }
    inject(&sw, 0.0, 0.0);

    // A member's results cut off in the middle of each collective, three windows long:
    // it gives up on the switch and finishes every segment it gets from the peers (a
    // reduction's from every member's contribution, folded on the host), and the others,
    // which wait at the switch for its later rounds, finish theirs likewise; then every
    // collective through the switch again.
    let (job, segment) = jobs[0];
    let elems = WORKERS.len() * 48 * segment;
    for (c, root) in ALL {
        let cut = if c == Collective::Reduce { root } else { 3 };
        let (recovered, segments) = run_cut(&sw, job, segment, next(job, 1), (c, root), elems, cut);
        eprintln!("{c}, member {cut} cut off: {segments} segments, recovered {recovered:?}");
        let n = WORKERS.len();
        // The segments the cut member gets: its block's, every other block's, all, all.
        let gets = match c {
            Collective::ReduceScatter => segments / n,
            Collective::AllGather => segments - segments / n,
            _ => segments,
        };
        assert_eq!(
            recovered[cut],
            Some(gets),
            "{c}: the cut member took all it gets from the peers"
        );
        for (m, r) in recovered.iter().enumerate() {
            assert!(
                r.is_none_or(|r| r <= gets),
                "{c}: member {m} recovered {r:?}"
            );
        }
    }
    let calls: Vec<Call> = ALL
        .iter()
        .map(|&(c, root)| (c, root, 4 * segment + 8, 9))
        .collect();
    let (d, segments, _, _) = phase("after the cuts", job, segment, &calls);
    assert_eq!(
        d("complete"),
        segments,
        "one completion per round after the cuts"
    );

    // Calls that do not match (the last, left stuck at the switch: no call follows):
    // member 3 makes a max where the others sum. The switch refuses its contributions,
    // and it fails at its give-up time (1 s); the others, which the switch keeps waiting
    // for it, ask its responder and fail too, naming it and why — before, they waited
    // until its process ended or their collective timeout passed.
    let before = sw.counters();
    let ended = run_mismatched(&sw, (job, segment, next(job, 1)), 2 * segment, 3);
    let after = sw.counters();
    assert!(
        after["drop_bad_op"] > before["drop_bad_op"],
        "member 3 refused"
    );
    for (m, (e, took)) in ended.iter().enumerate() {
        eprintln!("mismatched calls, member {m}, after {took:?}: {e}");
        let why = e.to_string();
        if m == 3 {
            assert!(why.contains("the round began with another op"), "{why}");
        } else {
            assert!(
                matches!(e, xagg_worker::AllreduceError::MemberFailed { rank: 3, .. })
                    && why.contains("the round began with another op"),
                "member {m}: {why}"
            );
        }
        assert!(!e.recoverable(), "member {m}: {why}");
        assert!(took.as_secs_f64() < 6.0, "member {m} failed after {took:?}");
    }
}
