//! Seeing inside: counters per job and per member (exact against what ran), the
//! Prometheus endpoint scraped over HTTP during an allreduce, and the live view `xagg top`
//! driven in a terminal (tmux), its screen read back.

use std::{
    io::{Read, Write},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use xagg_api::{Request, Response};
use xagg_lab::lab::SWITCH_IP;
use xagg_tests::*;

const METRICS_PORT: u16 = 9464;

/// `GET /metrics` from inside the switch's namespace, where the daemon listens.
fn scrape(sw: &TestSwitch) -> String {
    let ns = sw.lab.switch_ns();
    std::thread::scope(|s| {
        s.spawn(|| {
            xagg_linux::iface::enter_netns(&ns).unwrap();
            let mut c = std::net::TcpStream::connect((SWITCH_IP, METRICS_PORT)).unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nhost: xagg\r\nconnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            // The format written is OpenMetrics (`_total` samples, `# EOF`): said so.
            let (head, body) = out.split_once("\r\n\r\n").unwrap();
            assert!(
                head.lines().any(|l| l.eq_ignore_ascii_case(
                    "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
                )),
                "{head}"
            );
            assert!(body.trim_end().ends_with("# EOF"), "{body}");
            let types = strict_types(body);
            for (family, kind) in [
                ("xagg_switch_packets", "counter"),
                ("xagg_job_packets", "counter"),
                ("xagg_member_contributions", "counter"),
                ("xagg_jobs", "gauge"),
                ("xagg_slots_used", "gauge"),
            ] {
                assert!(
                    types.contains(&format!("{family} {kind}")),
                    "{family} is not a {kind} to the parser: {types}"
                );
            }
            out
        })
        .join()
        .unwrap()
    })
}

/// The families and their types as Prometheus' own OpenMetrics parser reads `body`
/// (`prometheus_client`, strict: a malformed line, a missing `# EOF` or a sample of no
/// family fails it), one "name type" a line.
fn strict_types(body: &str) -> String {
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\nfor f in parse(sys.stdin.read()): print(f.name, f.type)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with prometheus_client (cargo xtask test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refuses the endpoint's text: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The value of the metric line starting with `prefix` (name and labels).
fn metric(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn job_counters(sw: &TestSwitch, id: u32) -> xagg_api::JobCounters {
    match sw.api(Request::JobCounters { id }) {
        Response::JobCounters { job } => job,
        r => panic!("{r:?}"),
    }
}

#[test]
fn counters_metrics_and_the_live_view() {
    if !require_root("counters_metrics_and_the_live_view") {
        return;
    }
    let sw = TestSwitch::start("xob", 3, |c| {
        c.daemon.metrics = Some((SWITCH_IP, METRICS_PORT).into());
    });
    assert!(matches!(
        sw.add_job(5, 860, 32, &[0, 1, 2]),
        Response::Job { .. }
    ));
    assert!(matches!(
        sw.add_job_on(6, 860, 32, &[0, 1], 47806),
        Response::Job { .. }
    ));

    // Exact, without loss: every member contributes each segment once; the last of each
    // round completes it.
    let elems = 860 * 100;
    sw.allreduce(&Allreduce {
        job: 5,
        message: 0,
        segment: 860,
        slots: 32,
        workers: &[0, 1, 2],
        port: 47801,
        elems,
        seed: 1,
    });
    let c = job_counters(&sw, 5);
    assert_eq!(c.counters.get("complete"), Some(&100), "{c:?}");
    assert_eq!(c.counters.get("contribution"), Some(&200), "{c:?}");
    for m in &c.members {
        assert_eq!((m.contributions, m.retransmissions), (100, 0), "{c:?}");
    }
    assert!(
        job_counters(&sw, 6).counters.is_empty(),
        "job 6 ran nothing"
    );
    eprintln!("job 5 after one allreduce of 100 segments: {c:?}");

    // Results dropped at the switch: retransmissions show per member, answered with the
    // stored results.
    assert!(matches!(
        sw.api(Request::Inject {
            drop_contribution: 0.0,
            drop_result: 0.05
        }),
        Response::Ok
    ));
    sw.allreduce(&Allreduce {
        job: 5,
        message: 1,
        segment: 860,
        slots: 32,
        workers: &[0, 1, 2],
        port: 47801,
        elems,
        seed: 2,
    });
    assert!(matches!(
        sw.api(Request::Inject {
            drop_contribution: 0.0,
            drop_result: 0.0
        }),
        Response::Ok
    ));
    let c = job_counters(&sw, 5);
    assert_eq!(c.counters.get("complete"), Some(&200), "{c:?}");
    let again: u64 = c.members.iter().map(|m| m.retransmissions).sum();
    assert!(
        again > 0 && c.counters.get("result_replay").copied().unwrap_or(0) > 0,
        "{c:?}"
    );
    for m in &c.members {
        assert_eq!(m.contributions, 200, "{c:?}");
    }

    // Scraped while an allreduce runs: per-job and per-member series, no slot labels.
    let stop = AtomicBool::new(false);
    let during = std::thread::scope(|s| {
        let sw = &sw;
        let stop = &stop;
        let runner = s.spawn(move || {
            let mut m = 2;
            while !stop.load(Ordering::Relaxed) {
                sw.allreduce(&Allreduce {
                    job: 5,
                    message: m,
                    segment: 860,
                    slots: 32,
                    workers: &[0, 1, 2],
                    port: 47801,
                    elems,
                    seed: 3,
                });
                m += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let text = scrape(sw);
        // The live view under tmux, while the allreduces go on.
        let screen = live_view(sw);
        stop.store(true, Ordering::Relaxed);
        runner.join().unwrap();
        (text, screen)
    });
    let (text, screen) = during;
    let complete = metric(
        &text,
        r#"xagg_job_packets_total{job="5",outcome="complete"}"#,
    )
    .unwrap_or_else(|| panic!("no complete counter of job 5:\n{text}"));
    assert!(complete >= 200, "{complete}");
    assert!(
        metric(
            &text,
            r#"xagg_member_contributions_total{job="5",member="2",kind="new"}"#
        )
        .is_some_and(|v| v >= 200),
        "{text}"
    );
    assert!(
        metric(&text, "xagg_jobs ").is_some_and(|v| v == 2),
        "{text}"
    );
    assert!(metric(&text, r#"xagg_switch_packets_total{outcome="complete"}"#).is_some());
    assert!(!text.contains("slot="), "no per-slot labels");
    eprintln!("metrics during an allreduce: job 5 complete {complete}");

    // A stranger's packet of `kind` for `job` from its own `port`, and the log line naming
    // `reason` with its sender.
    let ns = sw.lab.worker_ns(2);
    let stranger = |kind: xagg_common::wire::Kind, job: u32, port: u16, reason: &str| {
        std::thread::scope(|t| {
            t.spawn(|| {
                xagg_linux::iface::enter_netns(&ns).unwrap();
                let h = xagg_common::wire::Header::builder(kind)
                    .job(job)
                    .member(0)
                    .count(4)
                    .build();
                let mut d = [0u8; xagg_common::wire::HEADER_LEN + 16];
                let n = xagg_common::wire::finish(&h, 16, &mut d).unwrap();
                let s = std::net::UdpSocket::bind((xagg_lab::lab::worker_ip(2), port)).unwrap();
                s.send_to(&d[..n], (SWITCH_IP, 47800)).unwrap();
            })
            .join()
            .unwrap();
        });
        let logged = eventually(reason, Duration::from_secs(5), || {
            let log = std::fs::read_to_string(&sw.log).unwrap_or_default();
            log.lines()
                .find(|l| l.contains(reason))
                .map(str::to_string)
                .ok_or(log)
        });
        assert!(logged.contains(&format!("10.77.0.13:{port}")), "{logged}");
        eprintln!("logged: {logged}");
    };
    // A contribution: dropped, counted switch-wide, and its sender logged.
    stranger(
        xagg_common::wire::Kind::Contribution,
        6,
        47899,
        "drop_not_member",
    );
    // A status query about a job the switch does not have: answered with a refusal, and
    // its sender logged as a drop's (before, only counted).
    stranger(
        xagg_common::wire::Kind::StatusQuery,
        77,
        47898,
        "drop_unknown_job",
    );

    assert!(screen.contains("xagg top"), "{screen}");
    let row = screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some("5"))
        .unwrap_or_else(|| panic!("no row for job 5:\n{screen}"));
    let rate: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(rate > 0.0, "job 5 completes segments while it runs: {row}");
    eprintln!("xagg top, read from tmux:\n{screen}");
}

/// `xagg allreduce --repeat` on a terminal shows its progress: member 0 of job 6 runs in
/// tmux while member 1 runs here.
#[test]
fn a_long_run_shows_its_progress() {
    if !require_root("a_long_run_shows_its_progress") {
        return;
    }
    let sw = TestSwitch::start("xoc", 2, |_| {});
    assert!(matches!(
        sw.add_job(6, 860, 32, &[0, 1]),
        Response::Job { .. }
    ));
    let session = "xagg-test-progress";
    let quiet = || std::process::Stdio::null();
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", session])
        .stderr(quiet())
        .status();
    let cmd = format!(
        "ip netns exec {} {} allreduce --switch {SWITCH_IP} --bind {}:47801 --job 6 --member 0 --members 2 --segment 860 --slots 32 --size 4KiB --repeat 150000; sleep 30",
        sw.lab.worker_ns(0),
        bin("xagg").display(),
        xagg_lab::lab::worker_ip(0)
    );
    assert!(Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "160",
            "-y",
            "20",
            &cmd
        ])
        .status()
        .unwrap()
        .success());
    let ns = sw.lab.worker_ns(1);
    let screen = std::thread::scope(|s| {
        let member = s.spawn(|| {
            xagg_linux::iface::enter_netns(&ns).unwrap();
            let p = xagg_worker::WorkerParams::new(
                std::net::SocketAddrV4::new(SWITCH_IP, 47800),
                std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(1), 47801),
                6,
                1,
                i32_shape(2, 32, 860),
            );
            let w = xagg_worker::Worker::new(p).unwrap();
            let mut v = vec![0i32; 1024];
            for _ in 0..150000 {
                w.allreduce(&mut v).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(1200));
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", session])
            .output()
            .unwrap();
        member.join().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", session])
        .stderr(quiet())
        .status();
    assert!(
        screen.contains("/150000 allreduces") && screen.contains("Gbit/s"),
        "{screen}"
    );
    eprintln!("progress on the terminal: {}", screen.trim());
}

/// Starts `xagg top` in a detached tmux session, lets it refresh, and returns its screen.
fn live_view(sw: &TestSwitch) -> String {
    let session = "xagg-test-top";
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", session])
        .status();
    let cmd = format!(
        "{} --socket {} top --interval-ms 300",
        bin("xagg").display(),
        sw.socket.display()
    );
    let ok = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "160",
            "-y",
            "40",
            &cmd,
        ])
        .status()
        .expect("tmux (installed by `cargo xtask setup`)");
    assert!(ok.success());
    std::thread::sleep(Duration::from_millis(1500));
    let out = Command::new("tmux")
        .args(["capture-pane", "-p", "-t", session])
        .output()
        .unwrap();
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", session])
        .status();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
