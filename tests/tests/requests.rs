//! Requests with completions, in a netns lab: the worker library's examples run verbatim
//! on every member; many requests in flight on two jobs at once through one completion
//! queue, with different op/type pairs on one job; and every completion status produced
//! for real — a member killed mid-allreduce, a cancelled request, no switch, a refusal,
//! non-finite input, an invalid buffer.

use std::{
    collections::BTreeMap,
    net::SocketAddrV4,
    process::{Command, Stdio},
    time::Duration,
};

use xagg_api::Response;
use xagg_common::wire::{self, DType, Float, Op};
use xagg_lab::lab::{worker_ip, SWITCH_IP};
use xagg_tests::*;
use xagg_worker::{data, AllreduceError, Buffer, CompletionQueue, Worker, WorkerParams};

const MEMBERS: usize = 3;

/// Member `w`'s parameters for job `job` on UDP port `port` (slots 32, full segments).
fn params(job: u32, w: usize, port: u16) -> WorkerParams {
    WorkerParams::new(
        SocketAddrV4::new(SWITCH_IP, wire::DEFAULT_PORT),
        SocketAddrV4::new(worker_ip(w), port),
        job,
        w as u8,
        i32_shape(MEMBERS, 32, 860),
    )
}

/// The `XAGG_*` environment of member `w` of job `job` (see `WorkerParams::from_env`).
fn env(job: u32, w: usize, port: u16) -> Vec<(String, String)> {
    [
        ("XAGG_SWITCH", SWITCH_IP.to_string()),
        ("XAGG_BIND", format!("{}:{port}", worker_ip(w))),
        ("XAGG_JOB", job.to_string()),
        ("XAGG_MEMBER", w.to_string()),
        ("XAGG_MEMBERS", MEMBERS.to_string()),
        ("XAGG_SLOTS", "32".into()),
        ("XAGG_SEGMENT_BYTES", "3440".into()),
        ("XAGG_GIVE_UP_MS", "1500".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Runs example `name` of the worker library on every member at once, with each member's
/// environment changed by `tweak`; returns each member's standard output, failing on a
/// non-zero exit.
fn run_example(
    sw: &TestSwitch,
    name: &str,
    job: u32,
    port: u16,
    tweak: impl Fn(&mut Vec<(String, String)>),
) -> Vec<String> {
    let children: Vec<_> = (0..MEMBERS)
        .map(|w| {
            let mut e = env(job, w, port);
            tweak(&mut e);
            Command::new("ip")
                .args(["netns", "exec", &sw.lab.worker_ns(w)])
                .arg(bin(&format!("examples/{name}")))
                .envs(e)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting example {name}: {e}"))
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(w, c)| {
            let out = c.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr),
            );
            assert!(
                out.status.success(),
                "example {name} on member {w}: {}\n{stdout}\n{stderr}",
                out.status
            );
            stdout
        })
        .collect()
}

#[test]
fn requests_and_completions() {
    if !require_root("requests_and_completions") {
        return;
    }
    let mut sw = TestSwitch::start("xrq", MEMBERS, |_| {});
    let all: Vec<usize> = (0..MEMBERS).collect();
    for (job, port) in [
        (60, 47860),
        (61, 47861),
        (62, 47862),
        (63, 47863),
        (64, 47864),
        (65, 47865),
    ] {
        assert!(
            matches!(
                sw.add_job_on(job, 860, 32, &all, port),
                Response::Job { .. }
            ),
            "job {job}"
        );
    }

    // The library's documented examples, verbatim, one after the other on one job: each
    // process takes the job up where the last left it.
    for (name, says) in [
        ("blocking", "4194304 bytes in"),
        ("requests", "5 requests in flight together, all verified"),
        ("queue", "16 completions from the queue, all verified"),
        ("statuses", "done by the Switch path"),
    ] {
        for (w, out) in run_example(&sw, name, 60, 47860, |_| {}).iter().enumerate() {
            assert!(out.contains(says), "example {name}, member {w}: {out}");
        }
        eprintln!("example {name}: ran on {MEMBERS} members");
    }
    // The same example reads the failures: a job the switch does not have, no switch.
    for out in run_example(&sw, "statuses", 99, 47860, |_| {}) {
        assert!(out.contains("the switch has no job 99"), "{out}");
    }
    for out in run_example(&sw, "statuses", 60, 47860, |e| {
        e[0].1 = "10.77.0.250".into();
    }) {
        assert!(out.contains("unreachable: 10.77.0.250:47800"), "{out}");
    }
    eprintln!("statuses: refused and unreachable as the example prints them");

    many_requests_on_two_jobs(&sw);
    cancelled_and_timed_out(&sw);
    killed_member(&sw);
    every_member_killed_then_started_again(&sw);
    invalid_and_non_finite(&sw);
    unanswered_queries_are_paced(&mut sw);
}

/// A worker whose replies never arrive — behind veth, its end without the host program, as
/// a rank in a container whose host end nobody attached — asks the switch for its job's
/// state at first once per copy of each slot, then at most 20 times a second; and still
/// gives up at its give-up time, naming the switch. (It asked about every copy again each
/// retransmission timeout: 64 queries every 20 ms here.)
fn unanswered_queries_are_paced(sw: &mut TestSwitch) {
    sw.lab.detach_hosts();
    let give_up = Duration::from_secs(3);
    let before = sw.counters()["status_reply"];
    let started = std::time::Instant::now();
    let e = xagg_lab::lab::in_netns(&sw.lab.worker_ns(0), || {
        let mut p = params(60, 0, 47860);
        p.give_up = give_up;
        let w = Worker::new(p)?;
        let mut buf = vec![1i32; 1024];
        Ok(w.allreduce(&mut buf).expect_err("no reply can arrive"))
    })
    .unwrap();
    let waited = started.elapsed();
    let queries = sw.counters()["status_reply"] - before;
    assert!(
        matches!(e, AllreduceError::NoSwitch { .. }),
        "{e} (after {waited:?})"
    );
    assert!(
        waited >= give_up && waited < give_up + Duration::from_millis(700),
        "gave up after {waited:?}"
    );
    // A first round of 2 x 32, then 20 a second.
    let bound = 2 * 32 + (20.0 * waited.as_secs_f64()).ceil() as u64;
    assert!(
        queries >= 2 * 32 && queries <= bound,
        "{queries} queries in {waited:?} (at most {bound})"
    );
}

/// Per member, one completion queue over two jobs: job 61 gets eight messages of different
/// op/type pairs from one thread, job 62 four from another, all in flight together.
fn many_requests_on_two_jobs(sw: &TestSwitch) {
    let pairs61 = [
        (Op::Sum, DType::F32),
        (Op::Max, DType::Bf16),
        (Op::Avg, DType::I32),
        (Op::Prod, DType::I64),
        (Op::Min, DType::F16),
        (Op::Xor, DType::U32),
        (Op::Avg, DType::F16),
        (Op::Sum, DType::I32),
    ];
    let pairs62 = [
        (Op::Min, DType::I32),
        (Op::Sum, DType::Bf16),
        (Op::Or, DType::I64),
        (Op::Max, DType::F32),
    ];
    // Lengths differ per message, so small ones can end before big ones submitted earlier.
    let len = |k: usize| [40_000, 3, 90_001, 1, 20_011, 860, 7, 50_000][k % 8];
    let input = |job: u32, k: usize, dtype: DType, m: u32| {
        data::generate(dtype, u64::from(job) * 100 + k as u64, m, len(k))
    };
    type Done = (u32, usize, Vec<u8>);
    let results: Vec<(Vec<Done>, Vec<u64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..MEMBERS)
            .map(|w| {
                let (ns, pairs61, pairs62) = (sw.lab.worker_ns(w), &pairs61, &pairs62);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let queue = CompletionQueue::new();
                    let jobs = [
                        (Worker::new(params(61, w, 47861)).unwrap(), &pairs61[..]),
                        (Worker::new(params(62, w, 47862)).unwrap(), &pairs62[..]),
                    ];
                    let mut ids = BTreeMap::new();
                    std::thread::scope(|t| {
                        let submitters: Vec<_> = jobs
                            .iter()
                            .map(|(worker, pairs)| {
                                let queue = queue.clone();
                                t.spawn(move || {
                                    let job = worker.params().job;
                                    pairs
                                        .iter()
                                        .enumerate()
                                        .map(|(k, &(op, dtype))| {
                                            let bytes = input(job, k, dtype, w as u32);
                                            // Safety: the Vec moves into the buffer.
                                            let mut bytes = bytes;
                                            let (ptr, n) = (bytes.as_mut_ptr(), bytes.len());
                                            let buffer =
                                                unsafe { Buffer::from_raw(ptr, n, dtype, bytes) };
                                            let id = queue.submit(worker, op, buffer).unwrap();
                                            (id, (job, k))
                                        })
                                        .collect::<Vec<_>>()
                                })
                            })
                            .collect();
                        for h in submitters {
                            ids.extend(h.join().unwrap());
                        }
                    });
                    let mut done = Vec::new();
                    let mut order = Vec::new();
                    while let Some(c) = queue.wait_timeout(Duration::from_secs(30)) {
                        let (job, k) = ids[&c.id];
                        c.status
                            .as_ref()
                            .unwrap_or_else(|e| panic!("member {w} job {job} message {k}: {e}"));
                        order.push(c.id);
                        let bytes = *c.buffer.into_owner().downcast::<Vec<u8>>().unwrap();
                        done.push((job, k, bytes));
                    }
                    assert_eq!(
                        queue.outstanding(),
                        0,
                        "member {w}: every request completed"
                    );
                    (done, order)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut out_of_order = 0;
    for (w, (done, order)) in results.iter().enumerate() {
        assert_eq!(done.len(), pairs61.len() + pairs62.len(), "member {w}");
        for (job, k, bytes) in done {
            let (op, dtype) = if *job == 61 { pairs61[*k] } else { pairs62[*k] };
            let inputs: Vec<Vec<u8>> = (0..MEMBERS as u32)
                .map(|m| input(*job, *k, dtype, m))
                .collect();
            let segment = wire::MAX_PAYLOAD / wire::lane(op, dtype).unwrap().size();
            data::check(op, dtype, segment, &inputs, bytes).unwrap_or_else(|e| {
                panic!("member {w}, job {job} message {k} ({op} over {dtype}): {e}")
            });
        }
        out_of_order += order.windows(2).filter(|p| p[1] < p[0]).count();
    }
    eprintln!(
        "two jobs, {} requests per member in flight through one queue, each verified; {out_of_order} completions came before an earlier-submitted one",
        pairs61.len() + pairs62.len()
    );
}

/// Member 2 cancels its request: it ends cancelled, and the others, waiting while the
/// switch says it waits for member 2, time out at the collective timeout naming it.
fn cancelled_and_timed_out(sw: &TestSwitch) {
    let statuses: Vec<AllreduceError> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..MEMBERS)
            .map(|w| {
                let ns = sw.lab.worker_ns(w);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let mut p = params(63, w, 47863);
                    p.give_up = Duration::from_millis(1000);
                    // The switch answers, waiting for member 2: the others wait this long.
                    p.collective_timeout = Duration::from_millis(2500);
                    let worker = Worker::new(p).unwrap();
                    let request = worker
                        .submit(Op::Sum, Buffer::from(vec![1i32; 1 << 20]))
                        .unwrap();
                    if w == 2 {
                        request.cancel();
                    }
                    let c = request.wait();
                    let input = c.buffer.into_vec::<i32>().unwrap();
                    assert_eq!(input.len(), 1 << 20, "the buffer comes back");
                    c.status.expect_err("no result without member 2")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        matches!(statuses[2], AllreduceError::Cancelled { job: 63, .. }),
        "{}",
        statuses[2]
    );
    for e in &statuses[..2] {
        let AllreduceError::Timeout { missing, .. } = e else {
            panic!("expected a timeout: {e}");
        };
        assert!(!missing.is_empty());
        assert!(
            missing
                .iter()
                .all(|m| m.members.as_deref() == Some(&[2][..])),
            "every slot waits for member 2: {e}"
        );
    }
    eprintln!("cancelled: {}\nthe others: {}", statuses[2], statuses[0]);
}

/// Member `w` of job `job` as an `xagg allreduce` process on UDP port `port`: 200
/// allreduces of 16 MiB (full segments, 32 slots), the switch's silence allowed a minute.
fn cli_member(sw: &TestSwitch, job: u32, w: usize, port: u16) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", &sw.lab.worker_ns(w)])
        .arg(bin("xagg"))
        .args(["allreduce", "--switch", &SWITCH_IP.to_string()])
        .args(["--bind", &format!("{}:{port}", worker_ip(w))])
        .args(["--job", &job.to_string(), "--member", &w.to_string()])
        .args([
            "--members",
            &MEMBERS.to_string(),
            "--segment",
            "860",
            "--slots",
            "32",
        ])
        .args(["--size", &(16usize << 20).to_string(), "--repeat", "200"])
        .args(["--give-up-ms", "60000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Member 2, an `xagg allreduce` process, is killed in the middle of a run: the others
/// time out at the collective timeout, naming it.
fn killed_member(sw: &TestSwitch) {
    let size = 16usize << 20;
    let mut victim = cli_member(sw, 64, 2, 47864);
    let statuses: Vec<AllreduceError> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|w| {
                let ns = sw.lab.worker_ns(w);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let mut p = params(64, w, 47864);
                    p.give_up = Duration::from_millis(1000);
                    p.collective_timeout = Duration::from_millis(2500);
                    let worker = Worker::new(p).unwrap();
                    let mut buf = vec![0u8; size];
                    for _ in 0..200 {
                        if let Err(e) = worker.allreduce_bytes(&mut buf) {
                            return e;
                        }
                    }
                    panic!("member {w}: 200 allreduces completed although member 2 was killed");
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(victim.id() as i32),
            Signal::SIGKILL,
        )
        .unwrap();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let _ = victim.wait();
    for e in &statuses {
        let AllreduceError::Timeout { missing, .. } = e else {
            panic!("expected a timeout: {e}");
        };
        assert!(
            missing
                .iter()
                .any(|m| m.members.as_deref() == Some(&[2][..])),
            "a slot waits for member 2: {e}"
        );
    }
    eprintln!("killed member: {}", statuses[0]);
}

/// Every member, an `xagg allreduce` process each, killed in the middle of a message
/// (member 2 first, so that message's later rounds wait for it), then started again
/// without a message id, as an operator restarts a job after a host died: the new
/// processes pass over the message whose first rounds' results are gone and take up the
/// next, exact, nothing stale. Before, they took it up from its first segment, which the
/// switch dropped as stale, and waited until their collective timeout.
fn every_member_killed_then_started_again(sw: &TestSwitch) {
    let kill = |c: &mut std::process::Child| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), Signal::SIGKILL).unwrap();
        let _ = c.wait();
    };
    let complete = || sw.counters()["complete"];
    let at_start = complete();
    let mut old: Vec<_> = (0..MEMBERS).map(|w| cli_member(sw, 65, w, 47865)).collect();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while complete() < at_start + 500 {
        assert!(
            std::time::Instant::now() < until,
            "the first run made no progress"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(&mut old[2]);
    std::thread::sleep(Duration::from_millis(300));
    kill(&mut old[0]);
    kill(&mut old[1]);
    let before = sw.counters();
    let elems = 100_000;
    let want = data::expected_sum(91, MEMBERS as u32, elems);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..MEMBERS)
            .map(|w| {
                let (ns, want) = (sw.lab.worker_ns(w), &want);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let mut p = params(65, w, 47865);
                    p.collective_timeout = Duration::from_secs(10);
                    let worker = Worker::new(p).unwrap();
                    let mut buf = vec![0i32; elems];
                    data::fill(91, w as u32, &mut buf);
                    worker
                        .allreduce(&mut buf)
                        .unwrap_or_else(|e| panic!("member {w}, started again: {e}"));
                    assert!(&buf == want, "member {w}, started again: wrong result");
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    let stale = sw.counters()["drop_stale"] - before["drop_stale"];
    assert_eq!(stale, 0, "rounds sent with a message passed over");
    eprintln!("every member killed, started again: exact, nothing stale");
}

/// Errors of the request itself come back at submit; non-finite input with the completion.
fn invalid_and_non_finite(sw: &TestSwitch) {
    let ns = sw.lab.worker_ns(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            xagg_linux::iface::enter_netns(&ns).unwrap();
            let worker = Worker::new(params(62, 0, 47869)).unwrap();
            let mut six = vec![0u8; 6];
            let odd = unsafe { Buffer::from_raw(six.as_mut_ptr(), 6, DType::I32, ()) };
            let e = worker.submit(Op::Sum, odd).err().expect("6 bytes of i32");
            assert!(e.to_string().contains("not a whole number of i32"), "{e}");
            let e = worker
                .submit_separate(
                    Op::Sum,
                    Buffer::from(vec![1i32; 8]),
                    Buffer::from(vec![0i32; 7]),
                )
                .err()
                .expect("lengths differ");
            assert!(e.to_string().contains("differ in length"), "{e}");
            let e = worker
                .submit(Op::Xor, Buffer::from(vec![1.0f32; 8]))
                .err()
                .expect("xor over f32");
            assert!(e.to_string().contains("not supported"), "{e}");
        })
        .join()
        .unwrap();
    });
    // NaN in one member's input: every member's completion says which segments.
    let statuses = flagged(sw, Float::Fast, |w| {
        let mut v = vec![1.0f32; 2000];
        if w == 1 {
            v[1500] = f32::NAN;
        }
        v
    });
    for (w, (r, e)) in statuses.iter().enumerate() {
        assert!(r[1500].is_nan() && r[0] == 3.0, "member {w}");
        assert!(
            matches!(e, AllreduceError::NonFinite { segments, .. } if segments == &[1]),
            "{e}"
        );
    }
    eprintln!("non-finite: {}", statuses[0].1);
    // Exact float sums: values too far apart for the lanes in segment 0 (10^-20 next to
    // 10^10): every member's completion names it, and its elements are NaN, as a non-finite
    // segment's are (before: numbers decoded from lanes that had overflowed, e.g. -4.0
    // where 4.0 is the sum); the other segments exact.
    let statuses = flagged(sw, Float::Exact, |w| {
        let mut v = vec![1.0f32; 2000];
        v[0] = 1e10;
        v[1] = 1e-20 * (w + 1) as f32;
        v
    });
    for (w, (r, e)) in statuses.iter().enumerate() {
        assert!(
            r[0].is_nan() && r[1].is_nan() && r[1999] == 3.0,
            "member {w}: {:?} ... {}",
            &r[..3],
            r[1999]
        );
        assert!(
            matches!(e, AllreduceError::Overflow { segments, .. } if segments == &[0]),
            "{e}"
        );
    }
    eprintln!("too wide: {}", statuses[0].1);
}

/// Every member sums its `input(w)` of f32 in float mode `float` on job 62 at once: each
/// one's result and the error its completion must carry (the input flagged).
fn flagged(
    sw: &TestSwitch,
    float: Float,
    input: impl Fn(usize) -> Vec<f32> + Sync,
) -> Vec<(Vec<f32>, AllreduceError)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..MEMBERS)
            .map(|w| {
                let (ns, input) = (sw.lab.worker_ns(w), &input);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let mut p = params(62, w, 47862);
                    p.float = float;
                    let worker = Worker::new(p).unwrap();
                    let c = worker
                        .submit(Op::Sum, Buffer::from(input(w)))
                        .unwrap()
                        .wait();
                    let r = c.buffer.into_vec::<f32>().unwrap();
                    (r, c.status.expect_err("a flagged input"))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
