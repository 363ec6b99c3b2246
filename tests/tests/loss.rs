//! Loss, duplicates and reordering, end to end in a netns lab: every allreduce stays
//! bit-exact, and the counters show both that the impairment happened and that the
//! recovery did.

use xagg_api::{Request, Response};
use xagg_common::wire;
use xagg_tests::*;

const WORKERS: [usize; 3] = [0, 1, 2];
/// Segments per worker in each allreduce (the last one short): enough that a 1 % drop
/// rate drops some (about 18 of 3 x 609 contributions or result copies).
const SEGMENTS: usize = 609;

fn delta(
    a: &std::collections::BTreeMap<String, u64>,
    b: &std::collections::BTreeMap<String, u64>,
    k: &str,
) -> u64 {
    b[k] - a[k]
}

#[test]
fn loss_duplicates_and_reordering_recover() {
    if !require_root("loss_duplicates_and_reordering_recover") {
        return;
    }
    recover("xtl", 860, false);
}

/// The same with segments of a 9000-byte MTU: multi-buffer contributions, results fanned
/// out by `xagg_fanout`, replays of multi-buffer results.
#[test]
fn loss_duplicates_and_reordering_recover_with_multi_buffer_segments() {
    if !require_root("loss_duplicates_and_reordering_recover_with_multi_buffer_segments") {
        return;
    }
    recover("xtj", (wire::MAX_PAYLOAD / 4) as u16, false);
}

/// The same with contributions steered to their slots' CPUs (every CPU), single-buffer
/// segments and multi-buffer ones: replays leave the cpumap's program as redirects, and
/// every steered contribution is folded exactly once.
#[test]
fn loss_duplicates_and_reordering_recover_when_steered() {
    if !require_root("loss_duplicates_and_reordering_recover_when_steered") {
        return;
    }
    recover("xtk", 860, true);
    recover("xtk", (wire::MAX_PAYLOAD / 4) as u16, true);
}

/// Job 1's counters, every name present.
fn job_counters(sw: &TestSwitch) -> std::collections::BTreeMap<String, u64> {
    match sw.api(Request::JobCounters { id: 1 }) {
        Response::JobCounters { job } => xagg_common::Counter::ALL
            .iter()
            .map(|c| {
                (
                    c.name().to_string(),
                    job.counters.get(c.name()).copied().unwrap_or(0),
                )
            })
            .collect(),
        r => panic!("{r:?}"),
    }
}

fn recover(prefix: &str, segment: u16, steer: bool) {
    let cpus = format!("0-{}", xagg_linux::cpus::available() - 1);
    let mut sw = TestSwitch::start(prefix, 3, |c| {
        if steer {
            c.switch.steer_cpus = Some(cpus);
        }
    });
    assert!(matches!(
        sw.add_job(1, segment, 64, &WORKERS),
        Response::Job { .. }
    ));
    let mut mid = 0;
    let mut run =
        |sw: &TestSwitch, what: &str, tweak: &(dyn Fn(&mut xagg_worker::WorkerParams) + Sync)| {
            let before = sw.counters();
            let job_before = job_counters(sw);
            let reps = sw.allreduce_with(
                &Allreduce {
                    job: 1,
                    message: mid,
                    segment: segment as usize,
                    slots: 64,
                    workers: &WORKERS,
                    port: 47801,
                    elems: SEGMENTS * segment as usize - 7,
                    seed: 1000 + mid as u64,
                },
                tweak,
            );
            mid += 1;
            let after = sw.counters();
            if steer {
                // The job's own row: a result copy dropped at the egress is nobody's fold.
                let job_after = job_counters(sw);
                let folded = folded(&job_after) - folded(&job_before);
                assert_eq!(delta(&job_before, &job_after, "steered"), folded, "{what}");
                assert!(folded > 0, "{what}");
            }
            let retx: u64 = reps.iter().map(|r| r.retransmissions).sum();
            let secs = reps.iter().map(|r| r.seconds).fold(0.0, f64::max);
            eprintln!("{what}: bit-exact, {retx} retransmissions, {secs:.3} s");
            (before, after, retx, reps)
        };

    for rate in [0.01, 0.05, 0.20] {
        assert!(matches!(
            sw.api(Request::Inject {
                drop_contribution: rate,
                drop_result: 0.0
            }),
            Response::Ok
        ));
        let (a, b, retx, _) = run(&sw, &format!("contributions dropped at {rate}"), &|_| {});
        assert!(
            delta(&a, &b, "inject_drop_contribution") > 0,
            "no contribution was dropped"
        );
        assert!(
            retx >= delta(&a, &b, "inject_drop_contribution"),
            "every drop needs a retransmission"
        );

        assert!(matches!(
            sw.api(Request::Inject {
                drop_contribution: 0.0,
                drop_result: rate
            }),
            Response::Ok
        ));
        let (a, b, retx, _) = run(&sw, &format!("results dropped at {rate}"), &|_| {});
        assert!(
            delta(&a, &b, "inject_drop_result") > 0,
            "no result was dropped"
        );
        assert!(
            retx > 0 && delta(&a, &b, "result_replay") > 0,
            "lost results come back as replays"
        );
    }
    assert!(matches!(
        sw.api(Request::Inject {
            drop_contribution: 0.0,
            drop_result: 0.0
        }),
        Response::Ok
    ));

    // Both directions at once.
    let both = Request::Inject {
        drop_contribution: 0.05,
        drop_result: 0.05,
    };
    assert!(matches!(sw.api(both), Response::Ok));
    let (a, b, retx, _) = run(&sw, "contributions and results dropped at 0.05", &|_| {});
    assert!(
        delta(&a, &b, "inject_drop_contribution") > 0
            && delta(&a, &b, "inject_drop_result") > 0
            && retx > 0
    );
    let off = Request::Inject {
        drop_contribution: 0.0,
        drop_result: 0.0,
    };
    assert!(matches!(sw.api(off), Response::Ok));

    // Duplicates from the worker's egress (tc, bpf_clone_redirect): never added twice.
    let impair = xagg_lab::Object::Test.read().unwrap();
    sw.lab.impair(&impair, 0.0, 0.05).unwrap();
    // (One datagram per send: the tc program sees a GSO burst as one packet.)
    let (a, b, _, _) = run(&sw, "contributions duplicated at 0.05", &|p| p.gso = false);
    let (_, duplicated) = sw.lab.impair_counts().unwrap();
    assert!(duplicated > 0, "no contribution was duplicated");
    assert!(
        delta(&a, &b, "drop_duplicate") + delta(&a, &b, "result_replay") > 0,
        "the switch saw the duplicates"
    );

    // Drops on the worker's egress, before the switch.
    sw.lab.impair(&impair, 0.05, 0.0).unwrap();
    let (_, _, retx, _) = run(
        &sw,
        "contributions dropped on worker egress at 0.05",
        &|p| p.gso = false,
    );
    let (dropped, _) = sw.lab.impair_counts().unwrap();
    assert!(dropped > 0 && retx > 0);
    sw.lab.impair(&impair, 0.0, 0.0).unwrap();

    // Reordered sends.
    let (_, _, _, reps) = run(&sw, "reordered", &|p| p.reorder = true);
    assert!(
        reps.iter().all(|r| r.reordered > 0),
        "the workers did not reorder"
    );

    // Retransmissions the switch already had are no fault: the daemon reports them (once
    // a minute) at INFO, never as a WARN.
    assert!(sw.counters()["drop_duplicate"] > 0);
    let log = std::fs::read_to_string(&sw.log).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reason=\"drop_duplicate\""))
        .collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains(" INFO ")),
        "{lines:?}"
    );
}

/// A member that never contributes: the others fail within the bound, with an error that
/// names the job, message, slots and the missing member; the slots are reclaimed by the
/// next allreduce.
#[test]
fn missing_member_fails_fast_with_a_clear_error() {
    if !require_root("missing_member_fails_fast_with_a_clear_error") {
        return;
    }
    let sw = TestSwitch::start("xtm", 3, |_| {});
    assert!(matches!(
        sw.add_job(2, 256, 8, &WORKERS),
        Response::Job { .. }
    ));
    let started = std::time::Instant::now();
    let err = std::thread::scope(|s| {
        let ns = sw.lab.worker_ns(0);
        s.spawn(move || {
            xagg_linux::iface::enter_netns(&ns).unwrap();
            let sw_addr = std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, 47800);
            let mut p = xagg_worker::WorkerParams::new(
                sw_addr,
                std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(0), 47801),
                2,
                0,
                i32_shape(WORKERS.len(), 8, 256),
            );
            // The give-up time at its default (10 s): the collective timeout, shorter,
            // ends the call at its own end (before, at the give-up time). The switch
            // answers that it waits for members 1 and 2: no waiting beyond.
            assert_eq!(p.give_up, std::time::Duration::from_secs(10));
            p.collective_timeout = std::time::Duration::from_secs(1);
            let w = xagg_worker::Worker::new(p).unwrap();
            let mut buf = vec![1i32; 4096];
            w.allreduce(&mut buf).unwrap_err()
        })
        .join()
        .unwrap()
    });
    let took = started.elapsed();
    let msg = err.to_string();
    eprintln!("failed after {took:?}: {msg}");
    assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
    assert!(msg.contains("job 2 message 0"), "{msg}");
    assert!(
        msg.contains("slot 0 segment 0 waits for members [1, 2]"),
        "{msg}"
    );
    match sw.api(Request::JobStatus { id: 2 }) {
        Response::JobStatus { slots } => {
            assert_eq!(slots.len(), 8);
            assert!(
                slots
                    .iter()
                    .all(|s| s.state == "filling" && s.missing == vec![1, 2]),
                "{slots:?}"
            );
        }
        r => panic!("{r:?}"),
    }
    // The next allreduce, of new processes that take up the job where it stands, skips
    // the message member 0 gave up on (before, they took it up, completed its rounds and
    // every one failed: "other members gave up on it"), reclaims its slots and completes.
    let before = sw.counters()["slot_reclaimed"];
    let reports = sw.allreduce_with(
        &Allreduce {
            job: 2,
            message: 1,
            segment: 256,
            slots: 8,
            workers: &WORKERS,
            port: 47801,
            elems: 4096,
            seed: 5,
        },
        |p| p.first_message = None,
    );
    assert_eq!(reports.len(), WORKERS.len());
    assert!(sw.counters()["slot_reclaimed"] > before);
}

/// A worker held off its CPU for far longer than its retransmission timeout while the
/// others complete its rounds — as where workers share a CPU — comes back to a receive
/// queue holding every result it waits for, and resends none of them: it takes what is
/// queued before it judges a contribution late. Judging after the first receive batch
/// resent about a window's worth. Exact count here, with AF_XDP and with a UDP socket: none.
#[test]
fn a_paused_worker_resends_nothing_already_answered() {
    use std::time::Duration;
    use xagg_common::{
        wire::{DType, Lane, Op},
        JobShape,
    };
    use xagg_lab::workers::{AllreduceRun, Pause};
    if !require_root("a_paused_worker_resends_nothing_already_answered") {
        return;
    }
    let segment = (wire::MAX_PAYLOAD / 4) as u16;
    let mut sw = TestSwitch::start("xtz", 2, |_| {});
    assert!(matches!(
        sw.add_job(1, segment, 128, &[0, 1]),
        Response::Job { .. }
    ));
    let shape = JobShape::with_elements(2, 128, segment as usize, Lane::I32).unwrap();
    let mut run = AllreduceRun::new(1, Op::Sum, DType::I32, shape, 64 << 20);
    run.repeat = 2;
    // Rounds the other member or the switch held up (their CPU taken by something else
    // for more than the 10 ms default floor, as on a loaded 2-core machine) are rightly
    // resent: a floor of 100 ms keeps those out of the count, while the 300 ms pause still
    // makes every round answered during it late.
    run.flags = vec!["--min-timeout-ms".into(), "100".into()];
    let pause = Duration::from_millis(300);
    run.pause = Some(Pause {
        member: 0,
        after: Duration::from_millis(40),
        length: pause,
    });
    // AF_XDP first: each worker attaches its own receive program.
    sw.lab.detach_hosts();
    for afxdp in [true, false] {
        if !afxdp {
            // A UDP socket behind veth needs the host program on the worker's end.
            sw.lab.attach_hosts().unwrap();
        }
        run.afxdp = afxdp;
        let reports = run.run(&sw.lab).unwrap();
        for r in &reports {
            assert!(
                r.verified,
                "member {}: result wrong (afxdp {afxdp})",
                r.member
            );
        }
        // The pause fell inside an allreduce with rounds in flight: some round trip (first
        // sends only) spans it.
        let longest = reports[0].round_trips.quantile(1.0).unwrap_or(0);
        assert!(
            longest >= pause.as_micros() as u64,
            "no round was in flight across the pause (afxdp {afxdp}): longest round trip \
             {longest} µs, allreduces {:?} s",
            reports[0].seconds_all
        );
        assert_eq!(
            reports[0].retransmissions, 0,
            "the paused worker resent rounds already answered (afxdp {afxdp}): {:?}",
            reports[0]
        );
        run.first_message += run.repeat;
    }
}
