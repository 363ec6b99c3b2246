//! The daemon: pinning and adoption across restarts, detaching, and clear errors.

use std::{process::Command, time::Duration};

use xagg_api::{Request, Response};
use xagg_common::wire::{DType, Op};
use xagg_lab::switch::Daemon;
use xagg_tests::*;

fn has_xdp(sw: &TestSwitch, port: &str) -> bool {
    let out = xagg_lab::lab::ip(&["-n", &sw.lab.switch_ns(), "link", "show", port]).unwrap();
    out.contains("xdp")
}

/// A full segment (multi-buffer frames, results through `xagg_fanout`), in i32.
const FULL: u16 = (xagg_common::wire::MAX_PAYLOAD / 4) as u16;

#[test]
fn restart_adopts_the_pinned_dataplane() {
    if !require_root("restart_adopts_the_pinned_dataplane") {
        return;
    }
    let mut sw = TestSwitch::start("xtr", 2, |_| {});
    assert!(matches!(
        sw.add_job(4, FULL, 8, &[0, 1]),
        Response::Job { .. }
    ));
    sw.allreduce(&Allreduce {
        job: 4,
        message: 0,
        segment: FULL as usize,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 10_000,
        seed: 1,
    });
    let before = sw.counters();
    assert!(sw.stop_daemon(Signal::SIGTERM).success());
    // The dataplane keeps aggregating with no daemon at all: full segments need the
    // pinned fold table and the fan-out's pinned tc links too.
    assert!(has_xdp(&sw, "swp0") && sw.pin.join("maps/JOBS").exists());
    assert!(sw.pin.join("maps/FOLDS").exists() && sw.pin.join("links/fanout/swp0").exists());
    // Every result delivered at once: without the fan-out each would come back only as
    // the answer to a retransmission.
    let no_retransmission = |reps: Vec<xagg_worker::Report>| {
        assert_eq!(reps.iter().map(|r| r.retransmissions).sum::<u64>(), 0);
    };
    let full = Allreduce {
        job: 4,
        message: 1,
        segment: FULL as usize,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 10_000,
        seed: 2,
    };
    no_retransmission(sw.allreduce(&full));
    // SIGKILL leaves it running too.
    sw.start_daemon();
    assert!(sw.stop_daemon(Signal::SIGKILL).code().is_none());
    no_retransmission(sw.allreduce(&Allreduce {
        message: 2,
        seed: 3,
        ..full
    }));
    sw.start_daemon();
    match sw.api(Request::Status) {
        Response::Status {
            adopted,
            pinned,
            jobs,
            ..
        } => assert!(adopted && pinned && jobs == 1),
        r => panic!("{r:?}"),
    }
    match sw.api(Request::ListJobs) {
        Response::Jobs { jobs } => {
            assert_eq!(jobs.len(), 1);
            assert_eq!(
                (
                    jobs[0].id,
                    jobs[0].segment,
                    jobs[0].slots,
                    jobs[0].members.len()
                ),
                (4, FULL, 8, 2)
            );
            assert_eq!(jobs[0].members[1].interface, "swp1");
        }
        r => panic!("{r:?}"),
    }
    let after = sw.counters();
    assert!(
        after["complete"] > before["complete"],
        "counters continue: {before:?} -> {after:?}"
    );
}

#[test]
fn detach_on_exit_and_detach_command() {
    if !require_root("detach_on_exit_and_detach_command") {
        return;
    }
    let mut sw = TestSwitch::start("xtd", 2, |c| c.daemon.detach_on_exit = true);
    assert!(has_xdp(&sw, "swp0"));
    assert!(!sw.pin.exists(), "detach_on_exit pins nothing");
    let locks = |sw: &TestSwitch| {
        [
            std::path::PathBuf::from(format!("{}.lock", sw.socket.display())),
            sw.state_dir().join("xaggd.lock"),
            xagg_daemon::owner::dataplane_lock(&sw.pin),
        ]
    };
    assert!(
        locks(&sw)[..2].iter().all(|l| l.exists()),
        "locks held while it runs"
    );
    assert!(sw.stop_daemon(Signal::SIGINT).success());
    assert!(
        !has_xdp(&sw, "swp0") && !has_xdp(&sw, "swp1"),
        "programs detached on exit"
    );
    // (A daemon that detaches on exit claims no pinned dataplane.)
    let left: Vec<_> = locks(&sw)
        .into_iter()
        .take(2)
        .filter(|l| l.exists())
        .collect();
    assert!(
        left.is_empty(),
        "a stopped daemon leaves no lock file: {left:?}"
    );

    // Pinned (default), then `xagg detach`: the daemon stops, the programs and pins go.
    sw.write_config(&sw.default_config()).unwrap();
    sw.start_daemon();
    assert!(has_xdp(&sw, "swp0") && sw.pin.exists());
    // Through a socket no daemon answers at, naming the running daemon's pins: refused,
    // naming that daemon's socket, and nothing removed under it (before: its pins went,
    // and it went on taking jobs on a dataplane that was gone).
    let out = Command::new(bin("xagg"))
        .args([
            "--socket",
            "/run/xagg-test-nobody.sock",
            "detach",
            "--pin-path",
        ])
        .arg(&sw.pin)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains("runs the dataplane pinned at")
            && said.contains(&format!("`xagg --socket {} detach`", sw.socket.display())),
        "{said}"
    );
    assert!(sw.pin.exists() && has_xdp(&sw, "swp0"), "nothing detached");
    let out = Command::new(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .arg("detach")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Back once the daemon has stopped: no lock file, and a daemon can start at once.
    let left: Vec<_> = locks(&sw).into_iter().filter(|l| l.exists()).collect();
    assert!(
        left.is_empty(),
        "`xagg detach` returned before the daemon stopped: {left:?}"
    );
    let status = sw.daemon.take().unwrap().wait().unwrap();
    assert!(status.success());
    assert!(!sw.pin.exists(), "pins removed");
    assert!(!has_xdp(&sw, "swp0"), "programs detached");
    // The fan-out's tc program went with them, and on kernels with tcx (6.6 on) nothing
    // else was put on the ports: no clsact qdisc left.
    let tcx = {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 6)
    };
    let qdiscs = Command::new("ip")
        .args([
            "netns",
            "exec",
            &sw.lab.switch_ns(),
            "tc",
            "qdisc",
            "show",
            "dev",
            "swp0",
        ])
        .output()
        .unwrap();
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout);
    assert_eq!(!qdiscs.contains("clsact"), tcx, "{qdiscs}");
}

#[test]
fn clear_errors() {
    if !require_root("clear_errors") {
        return;
    }
    let sw = TestSwitch::start("xte", 2, |_| {});
    let err = |r: Response| match r {
        Response::Error { message } => message,
        r => panic!("expected an error, got {r:?}"),
    };
    assert!(matches!(
        sw.add_job(1, 256, 2000, &[0, 1]),
        Response::Job { .. }
    ));
    // Slot exhaustion: refused, never shared.
    let m = err(sw.add_job(2, 256, 100, &[0, 1]));
    assert!(
        m.contains("needs 100 slots") && m.contains("remove a job"),
        "{m}"
    );
    let m = err(sw.add_job(1, 256, 8, &[0, 1]));
    assert!(m.contains("already exists"), "{m}");
    let m = err(sw.add_job(3, 4000, 8, &[0, 1]));
    assert!(m.contains("segment") && m.contains("1..=2232"), "{m}");
    let m = err(sw.add_job(3, 256, 8, &[0, 0]));
    assert!(
        m.contains("members[1].interface") && m.contains("own switch port"),
        "{m}"
    );
    let mut bad = sw.lab.members().unwrap();
    bad[0].interface = "nope0".into();
    let m = err(sw.api(Request::AddJob {
        job: xagg_api::JobSpec {
            id: 3,
            op: Op::Sum,
            dtype: DType::I32,
            segment: 256,
            slots: 8,
            members: bad,
            slot_base: None,
            parent: None,
            ring: None,
        },
    }));
    assert!(
        m.contains("members[0].interface") && m.contains("nope0"),
        "{m}"
    );
    let m = err(sw.api(Request::RemoveJob { id: 77 }));
    assert!(m.contains("no job 77"), "{m}");
    // Removing the big job frees its slots.
    assert!(matches!(sw.api(Request::RemoveJob { id: 1 }), Response::Ok));
    assert!(matches!(
        sw.add_job(2, 256, 100, &[0, 1]),
        Response::Job { .. }
    ));

    // A bad configuration file names the key and the fix.
    let cfg = std::env::temp_dir().join("xagg-bad.toml");
    std::fs::write(
        &cfg,
        "[switch]\nports = [\"swp0\"]\naddress = \"10.77.0.1\"\nxdp_mode = \"turbo\"\n",
    )
    .unwrap();
    let out = Command::new(bin("xaggd"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("switch.xdp_mode") && e.contains("\"native\""),
        "{e}"
    );
}

/// The daemon stopped gracefully and killed in the middle of an allreduce: the allreduce
/// completes bit-exactly, the job is still there, the counters continue.
#[test]
fn restart_during_an_allreduce() {
    if !require_root("restart_during_an_allreduce") {
        return;
    }
    let mut sw = TestSwitch::start("xtk", 2, |_| {});
    assert!(matches!(
        sw.add_job(6, 860, 64, &[0, 1]),
        Response::Job { .. }
    ));
    // Long enough (about 2 s here) for two restarts to happen while it runs.
    let elems = (512 << 20) / 4;
    let complete = |sw: &TestSwitch| sw.counters()["complete"];
    let daemon = sw.daemon.take().unwrap();
    let sw_ref = &sw;
    let last = std::thread::scope(|s| {
        let sw = sw_ref;
        let run = s.spawn(|| {
            // The helper verifies the result bit-exactly.
            sw.allreduce(&Allreduce {
                job: 6,
                message: 0,
                segment: 860,
                slots: 64,
                workers: &[0, 1],
                port: 47801,
                elems,
                seed: 9,
            });
        });
        // Wait until the allreduce is under way.
        while complete(sw) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let socket = sw.socket.clone();
        let log = sw.log.clone();
        let config = sw.config.clone();
        let mid_run = xagg_api::call(&socket, &Request::Counters).unwrap();
        assert!(daemon.stop(Signal::SIGTERM).unwrap().success());
        let start = |_: ()| Daemon::start(&config, &log, &socket).unwrap();
        let daemon = start(());
        assert!(daemon.stop(Signal::SIGKILL).unwrap().code().is_none());
        let daemon = start(());
        assert!(
            !run.is_finished(),
            "the allreduce ended before the restarts: make it longer"
        );
        run.join().expect("the allreduce completes across restarts");
        let after = xagg_api::call(&socket, &Request::Counters).unwrap();
        match (mid_run, after) {
            (Response::Counters { counters: a }, Response::Counters { counters: b }) => {
                assert!(b["complete"] > a["complete"], "counters continue");
                assert_eq!(b["complete"], elems.div_ceil(860) as u64);
            }
            r => panic!("{r:?}"),
        }
        daemon
    });
    sw.daemon = Some(last);
    match sw.api(Request::ListJobs) {
        Response::Jobs { jobs } => {
            assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![6])
        }
        r => panic!("{r:?}"),
    }
}

/// A dataplane pinned by a build with another map layout is refused, with the command
/// that replaces it; one with this build's layout is adopted. One pinned before layouts
/// were versioned (no `LAYOUT` map) has layout 1, older than this build's: refused too.
#[test]
fn pinned_layout_is_checked_on_adoption() {
    if !require_root("pinned_layout_is_checked_on_adoption") {
        return;
    }
    let mut sw = TestSwitch::start("xtv", 2, |_| {});
    assert!(matches!(
        sw.add_job(3, 256, 4, &[0, 1]),
        Response::Job { .. }
    ));
    assert!(sw.stop_daemon(Signal::SIGTERM).success());
    let layout_pin = sw.pin.join("maps/LAYOUT");
    let set_layout = |v: u32| {
        let md = aya::maps::MapData::from_pin(&layout_pin).unwrap();
        let mut m: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(aya::maps::Map::from_map_data(md).unwrap()).unwrap();
        m.set(0, v, 0).unwrap();
    };
    let refused = |sw: &TestSwitch| {
        Daemon::start(&sw.config, &sw.log, &sw.socket)
            .err()
            .expect("a dataplane of another layout is refused")
            .to_string()
    };
    set_layout(99);
    let e = refused(&sw);
    assert!(
        e.contains("map layout 99") && e.contains("xaggd --reload"),
        "{e}"
    );
    // That `--reload` with the metrics endpoint's port taken: refused at the bind, before
    // the old dataplane is removed (before, it went first, and its jobs with it).
    let config = sw.default_config();
    let mut taken = config.clone();
    let metrics = std::net::SocketAddr::from((xagg_lab::lab::SWITCH_IP, 9109));
    taken.daemon.metrics = Some(metrics);
    sw.write_config(&taken).unwrap();
    let holder = xagg_lab::lab::in_netns(&sw.lab.switch_ns(), || {
        Ok(std::net::TcpListener::bind(metrics)?)
    })
    .unwrap();
    let (ok, out) = xaggd(&["--reload"], &sw.config);
    assert!(
        !ok && out.contains("the running dataplane was kept"),
        "{out}"
    );
    assert!(
        layout_pin.exists(),
        "the pinned dataplane was removed: {out}"
    );
    drop(holder);
    sw.write_config(&config).unwrap();
    // The layout agrees again: adopted, job and all.
    set_layout(xagg_common::LAYOUT_VERSION);
    sw.start_daemon();
    match sw.api(Request::Status) {
        Response::Status { adopted, jobs, .. } => assert!(adopted && jobs == 1),
        r => panic!("{r:?}"),
    }
    sw.allreduce(&Allreduce {
        job: 3,
        message: 0,
        segment: 256,
        slots: 4,
        workers: &[0, 1],
        port: 47801,
        elems: 5000,
        seed: 4,
    });
    assert!(sw.stop_daemon(Signal::SIGTERM).success());
    // A port taken out of the configuration: the pinned dataplane is refused, and the port
    // left is not said to hold some other tool's program.
    let all_ports = sw.default_config();
    let mut fewer = all_ports.clone();
    fewer.switch.ports.truncate(1);
    sw.write_config(&fewer).unwrap();
    let (ok, out) = xaggd(&["--check"], &sw.config);
    assert!(!ok, "{out}");
    let port = &fewer.switch.ports[0];
    assert!(
        out.contains(&format!(
            "warning port {port}: MTU 9000, an XDP program in native mode, most likely the dataplane pinned at {}, which this configuration cannot adopt",
            sw.pin.display()
        )) && !out.contains("that no dataplane pinned at"),
        "{out}"
    );
    sw.write_config(&all_ports).unwrap();
    // Pinned by a build from before the layout version: no LAYOUT map at all.
    std::fs::remove_file(&layout_pin).unwrap();
    let e = refused(&sw);
    assert!(e.contains("map layout 1,"), "{e}");
}

/// What an operator trying things by hand runs into: the socket from the environment,
/// the switch's addresses in `status --json`, a second daemon on the same socket refused
/// naming the first, a member behind an interface that is not a port refused, and output
/// piped into a reader that goes away ending quietly.
#[test]
fn operators_are_told_what_is_wrong() {
    if !require_root("operators_are_told_what_is_wrong") {
        return;
    }
    let sw = TestSwitch::start("xtu", 2, |c| {
        c.daemon.metrics = Some("10.77.0.1:9799".parse().unwrap())
    });
    let out = Command::new(bin("xagg"))
        .env("XAGG_SOCKET", &sw.socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["address"], "10.77.0.1");
    assert_eq!(v["udp_port"], 47800);
    assert_eq!(v["xdp_mode"], "native");
    assert_eq!(v["pin_path"], sw.pin.display().to_string());
    assert_eq!(v["mac"].as_str().map(str::len), Some(17));
    assert_eq!(v["metrics"], "10.77.0.1:9799");
    assert!(v.get("listen").is_none(), "{v}");

    // Fault injection says what it set, and `xagg status` says it is on until it is off.
    let xagg = |args: &[&str]| {
        let out = Command::new(bin("xagg"))
            .arg("--socket")
            .arg(&sw.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let on = "fault injection: ON, dropping 5.0 % of contributions and 0.0 % of result copies";
    assert!(xagg(&["inject", "--drop-contrib", "0.05"]).contains(on));
    assert!(xagg(&["status"]).contains(on));
    assert!(xagg(&["inject"]).contains("fault injection: off"));
    assert!(!xagg(&["status"]).contains("fault injection"));
    // A `job add` missing flags and with a malformed member: all said at once.
    let out = Command::new(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .args(["job", "add", "--id", "9", "--member", "swp0,zz,10.77.0.11"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains("--segment, --slots are required (or --file); --member #0: `10.77.0.11` is not IP:UDPPORT"),
        "{said}"
    );
    // A job nothing has been sent on: its status and tree say so, not a bare header.
    sw.add_job(9, 256, 8, &[0, 1]);
    assert!(xagg(&["job", "status", "9"])
        .contains("job 9: no slot holds a round: nothing in flight, nothing waited for"));
    assert!(xagg(&["job", "tree", "9"])
        .contains("this level's counters: none yet (no packet of this job has come in)"));
    // Where the daemon listens, or that it does not.
    let status = xagg(&["status"]);
    assert!(
        status.contains("network listener: off (daemon.listen)")
            && status.contains("metrics: http://10.77.0.1:9799/metrics"),
        "{status}"
    );

    // A second daemon with the same configuration: refused, naming the first.
    let first = sw.daemon.as_ref().unwrap().pid();
    let out = Command::new(bin("xaggd"))
        .arg("--config")
        .arg(&sw.config)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains(&format!(
                "another xaggd (pid {first}, API socket {}) already serves",
                sw.socket.display()
            ))
            && e.contains(&format!("`kill {first}`")),
        "{e}"
    );
    assert!(
        matches!(sw.api(Request::Status), Response::Status { .. }),
        "the first still serves"
    );

    // A member behind the bridge rather than a switch port.
    let mut members = sw.lab.members().unwrap();
    members[0].interface = "br0".into();
    let r = sw.api(Request::AddJob {
        job: xagg_api::JobSpec {
            id: 3,
            op: Op::Sum,
            dtype: DType::I32,
            segment: 256,
            slots: 8,
            members,
            slot_base: None,
            parent: None,
            ring: None,
        },
    });
    match r {
        Response::Error { message } => assert!(
            message.contains("members[0].interface")
                && message.contains("not a port of this switch"),
            "{message}"
        ),
        r => panic!("{r:?}"),
    }

    // `xagg counters | head -0`: the reader is gone before anything is written.
    let mut child = Command::new(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .arg("counters")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!e.contains("panicked"), "{e}");
}

/// A segment the links cannot carry in one packet is refused where the job is created and
/// where a worker starts, saying which segment fits.
#[test]
fn segments_must_fit_the_mtu() {
    if !require_root("segments_must_fit_the_mtu") {
        return;
    }
    let sw = TestSwitch::start("xtw", 2, |_| {});
    xagg_lab::lab::ip(&[
        "-n",
        &sw.lab.switch_ns(),
        "link",
        "set",
        "swp1",
        "mtu",
        "1500",
    ])
    .unwrap();
    match sw.add_job(3, 860, 8, &[0, 1]) {
        Response::Error { message } => assert!(
            message.contains("3506-byte packets")
                && message.contains("port swp1 has an MTU of 1500")
                && message.contains("at most 358 elements"),
            "{message}"
        ),
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        sw.add_job(3, 358, 8, &[0, 1]),
        Response::Job { .. }
    ));
    // The worker's own link.
    let ns = sw.lab.worker_ns(0);
    xagg_lab::lab::ip(&["-n", &ns, "link", "set", "eth0", "mtu", "1500"]).unwrap();
    let e = xagg_lab::lab::in_netns(&ns, || {
        let p = xagg_worker::WorkerParams::new(
            std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, 47800),
            std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(0), 47801),
            4,
            0,
            i32_shape(2, 8, 860),
        );
        Ok(xagg_worker::Worker::new(p).err().map(|e| e.to_string()))
    })
    .unwrap()
    .expect("a worker on a 1500-byte link refuses 3440-byte segments");
    assert!(
        e.contains("eth0 has an MTU of 1500") && e.contains("at most 1432 bytes"),
        "{e}"
    );
}

/// `xagg detach --pin-path` never detaches another switch than the one named, and a
/// daemon that fails to start leaves no pins behind.
#[test]
fn detach_names_its_switch_and_failed_starts_leave_no_pins() {
    if !require_root("detach_names_its_switch_and_failed_starts_leave_no_pins") {
        return;
    }
    let sw = TestSwitch::start("xtz", 1, |_| {});
    let out = Command::new(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .args(["detach", "--pin-path", "/sys/fs/bpf/xagg-test-elsewhere"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains(&format!("pins its dataplane at {}", sw.pin.display()))
            && e.contains("nothing detached"),
        "{e}"
    );
    assert!(
        matches!(sw.api(Request::Status), Response::Status { .. }),
        "still serving"
    );

    let mut cfg = sw.default_config();
    cfg.switch.ports = vec!["nope0".into()];
    cfg.daemon.socket = std::env::temp_dir().join("xagg-test-xtz/other.sock");
    cfg.daemon.state_dir = std::env::temp_dir().join("xagg-test-xtz/other-state");
    cfg.daemon.pin_path = "/sys/fs/bpf/xagg-test-xtz-failed".into();
    let path = std::env::temp_dir().join("xagg-test-xtz/failing.toml");
    let _ = std::fs::remove_dir_all(&cfg.daemon.state_dir);
    std::fs::write(&path, cfg.to_toml()).unwrap();
    let out = Command::new(bin("xaggd"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("nope0"), "{e}");
    assert!(
        !cfg.daemon.pin_path.exists(),
        "a failed start left pins behind"
    );
    assert!(
        !cfg.daemon.state_dir.exists(),
        "a failed start left the state directory it made"
    );
}

/// A daemon started under `ip netns exec` (a mount namespace of its own, where its pins
/// vanish with it) warns that it does.
#[test]
fn a_daemon_in_a_private_mount_namespace_warns() {
    if !require_root("a_daemon_in_a_private_mount_namespace_warns") {
        return;
    }
    let sw = TestSwitch::start("xtq", 1, |_| {});
    let mut cfg = sw.default_config();
    cfg.switch.netns = None;
    cfg.daemon.socket = std::env::temp_dir().join("xagg-test-xtq/private.sock");
    cfg.daemon.state_dir = std::env::temp_dir().join("xagg-test-xtq/private-state");
    cfg.daemon.pin_path = "/sys/fs/bpf/xagg-test-xtq-private".into();
    let dir = std::env::temp_dir().join("xagg-test-xtq");
    let (path, log) = (dir.join("private.toml"), dir.join("private.log"));
    std::fs::write(&path, cfg.to_toml()).unwrap();
    // The lab's daemon holds swp0: this one only needs to start far enough to warn.
    let mut child = Command::new("ip")
        .args(["netns", "exec", &sw.lab.switch_ns()])
        .arg(bin("xaggd"))
        .arg("--config")
        .arg(&path)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = eventually("the daemon warns or exits", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("mount namespace of its own") || child.try_wait().unwrap().is_some() {
            Ok(text)
        } else {
            Err(text)
        }
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains("mount namespace of its own") && text.contains("switch.netns"),
        "{text}"
    );
}

/// The configuration the service steps of docs/daemon.md write, its placeholders (the
/// ports and the address) made the lab's.
fn documented_config(ports: &[String]) -> String {
    let block = doc_block("daemon.md", "toml", "state_dir = ");
    let text: String = block.lines().map(|l| format!("{}\n", l.trim())).collect();
    let ports: Vec<String> = ports.iter().map(|p| format!("{p:?}")).collect();
    let placeholders = r#"["enp1s0f0", "enp1s0f1", "enp2s0f0", "enp2s0f1"]"#;
    assert!(
        text.contains(placeholders) && text.contains("\"192.168.50.1\""),
        "{text}"
    );
    text.replace(placeholders, &format!("[{}]", ports.join(", ")))
        .replace(
            "\"192.168.50.1\"",
            &format!("\"{}\"", xagg_lab::lab::SWITCH_IP),
        )
}

/// `xaggd` with `args`, its success and what it printed (both streams).
fn xaggd(args: &[&str], config: &std::path::Path) -> (bool, String) {
    let out = Command::new(bin("xaggd"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The operator's daemon: one per pinned dataplane and per state directory as well as per
/// socket, each refusal naming the holder and how to stop it without dropping its jobs;
/// the XDP mode in use per port; `--check` on the documented example and on broken files;
/// starts that fail before attaching attach nothing, and one that fails after attaching
/// (the configuration's jobs want more slots than the switch has) leaves no program, pin
/// or socket behind.
#[test]
fn one_daemon_per_dataplane_checked_before_it_attaches() {
    if !require_root("one_daemon_per_dataplane_checked_before_it_attaches") {
        return;
    }
    let mut sw = TestSwitch::start("xtk", 2, |_| {});
    let dir = std::env::temp_dir().join("xagg-test-xtk");
    let first = sw.daemon.as_ref().unwrap().pid();
    let write = |name: &str, cfg: &xagg_daemon::config::Config| {
        let path = dir.join(name);
        std::fs::write(&path, cfg.to_toml()).unwrap();
        path
    };

    // The mode each port's program is in, as the kernel says, next to the configured one.
    let out = Command::new(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ports: swp0 (XDP native), swp1 (XDP native)"),
        "{text}"
    );
    match sw.api(Request::Status) {
        Response::Status { xdp_in_use, .. } => assert_eq!(xdp_in_use, ["native", "native"]),
        r => panic!("{r:?}"),
    }
    let log = std::fs::read_to_string(&sw.log).unwrap();
    assert!(
        log.contains("port swp0: XDP attached in native mode"),
        "{log}"
    );

    // A second daemon on the same pin path (its own socket and state directory), then on
    // the same state directory (its own socket and pin path): both refused.
    let mut other = sw.default_config();
    other.daemon.socket = dir.join("second.sock");
    other.daemon.state_dir = dir.join("second-state");
    let (ok, e) = xaggd(&[], &write("same-pin.toml", &other));
    assert!(
        !ok && e.contains(&format!(
            "another xaggd (pid {first}, API socket {}) already runs the dataplane pinned at {}",
            sw.socket.display(),
            sw.pin.display()
        )) && e.contains(&format!("`kill {first}`"))
            && e.contains("daemon.pin_path"),
        "{e}"
    );
    let mut other = sw.default_config();
    other.daemon.socket = dir.join("second.sock");
    other.daemon.pin_path = "/sys/fs/bpf/xagg-test-xtk-second".into();
    let (ok, e) = xaggd(&[], &write("same-state.toml", &other));
    assert!(
        !ok && e.contains("already keeps its joined jobs in the state directory"),
        "{e}"
    );
    assert!(!other.daemon.pin_path.exists() && !dir.join("second.sock").exists());
    match sw.api(Request::Status) {
        Response::Status { pinned, .. } => assert!(pinned, "the first is untouched"),
        r => panic!("{r:?}"),
    }
    // Checking the running daemon's own file: no error, the holder named.
    let (ok, out) = xaggd(&["--check"], &sw.config);
    assert!(
        ok && out.contains("refused until that one stops")
            && out.contains("the pinned dataplane's program in native mode"),
        "{out}"
    );

    // The ports freed: the documented example checks clean against them.
    sw.stop_daemon(Signal::SIGTERM);
    xagg_daemon::dataplane::unpin(&sw.pin).unwrap();
    assert!(!has_xdp(&sw, "swp0"));
    let ports = sw.default_config().switch.ports;
    let example = dir.join("documented.toml");
    std::fs::write(&example, documented_config(&ports)).unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &sw.lab.switch_ns()])
        .arg(bin("xaggd"))
        .arg("--check")
        .arg("--config")
        .arg(&example)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("no errors")
            && text.contains("port swp1: MTU 9000, no XDP program yet"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Broken files: `--check` names each problem, and a start with them attaches nothing.
    let key = dir.join("team.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let joinable = |c: &mut xagg_daemon::config::Config, key_file: &std::path::Path| {
        c.daemon.listen = Some((xagg_lab::lab::SWITCH_IP, 47900).into());
        c.credentials = vec![xagg_daemon::config::CredentialSection {
            name: "team".into(),
            key_file: key_file.into(),
            slot_quota: 64,
        }];
    };
    let mut missing_key = sw.default_config();
    joinable(&mut missing_key, &dir.join("missing.key"));
    let mut elsewhere = sw.default_config();
    joinable(&mut elsewhere, &key);
    elsewhere.daemon.listen = Some("10.99.0.1:47900".parse().unwrap());
    let mut not_here = sw.default_config();
    not_here.switch.address = "10.77.9.9".parse().unwrap();
    let mut no_bpffs = sw.default_config();
    no_bpffs.daemon.pin_path = dir.join("pins");
    let broken = [
        (missing_key, "missing.key"),
        (elsewhere, "cannot bind daemon.listen = 10.99.0.1:47900"),
        (not_here, "switch.address 10.77.9.9 is on no interface here"),
        (no_bpffs, "is not in a bpffs"),
    ];
    for (i, (cfg, says)) in broken.iter().enumerate() {
        let path = write(&format!("broken-{i}.toml"), cfg);
        let (ok, out) = xaggd(&["--check"], &path);
        assert!(
            !ok && out.contains(says) && out.contains("a start would fail"),
            "{out}"
        );
        let (ok, e) = xaggd(&[], &path);
        assert!(
            !ok && e.contains(says) && e.contains("nothing was attached"),
            "{e}"
        );
        assert!(!has_xdp(&sw, "swp0") && !sw.pin.exists() && !sw.socket.exists());
    }
    // Warnings: a key file others can read; an address no interface answers ARP for.
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut open_key = sw.default_config();
    joinable(&mut open_key, &key);
    open_key.switch.mac = Some("02:00:00:00:00:01".into());
    open_key.switch.address = "10.77.9.9".parse().unwrap();
    let (ok, out) = xaggd(&["--check"], &write("warnings.toml", &open_key));
    assert!(
        ok && out.contains(&format!(
            "is mode 0644, so other users of this host can read the key: `chmod 0600 {}`",
            key.display()
        )) && out.contains("ip neigh replace 10.77.9.9 lladdr 02:00:00:00:00:01"),
        "{out}"
    );

    // Two jobs that want more slots than the switch has: found only when the second is
    // placed, after the ports were attached; the start is undone.
    let mut greedy = sw.default_config();
    for id in [1, 2] {
        greedy.jobs.push(
            sw.job_spec(id, Op::Sum, DType::I32, 256, 1100, &[0, 1], 47801)
                .unwrap(),
        );
    }
    let path = write("greedy.toml", &greedy);
    let (ok, out) = xaggd(&["--check"], &path);
    assert!(ok, "each job is well formed: {out}");
    let (ok, e) = xaggd(&[], &path);
    assert!(
        !ok && e.contains("XDP attached in native mode")
            && e.contains("[[job]] id 2")
            && e.contains("detached again"),
        "{e}"
    );
    assert!(
        !has_xdp(&sw, "swp0") && !has_xdp(&sw, "swp1"),
        "programs left"
    );
    assert!(
        !sw.pin.exists() && !sw.socket.exists(),
        "pins or socket left"
    );
}

/// `xagg host attach|detach`: the rank's end of a veth behind a switch port gets
/// `xagg_host` pinned by the product command (the lab attaches every rank's end that way),
/// which outlives the command; attaching again says so; an interface running another
/// program (a switch port) is refused, saying how to free it; a namespace can be named by
/// a process in it; detach leaves no program and no pin.
#[test]
fn the_host_end_is_a_product_command() {
    if !require_root("the_host_end_is_a_product_command") {
        return;
    }
    let mut sw = TestSwitch::start("xth", 2, |_| {});
    let host = |args: &[&str]| {
        let out = Command::new(bin("xagg"))
            .arg("host")
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let w0 = sw.lab.worker_ns(0);
    let in_w0 = |args: &[&str]| xagg_lab::lab::ip(&[&["-n", &w0][..], args].concat()).unwrap();
    let inode = std::fs::metadata(format!("/run/netns/{w0}")).unwrap();
    let pin = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/xagg-host/{}/eth0",
        std::os::unix::fs::MetadataExt::ino(&inode)
    ));
    // The lab attached it with the command, which has exited: pinned, and results arrive.
    assert!(pin.join("link").exists() && in_w0(&["link", "show", "eth0"]).contains("xdp"));
    assert!(matches!(
        sw.add_job(3, 256, 8, &[0, 1]),
        Response::Job { .. }
    ));
    let run = Allreduce {
        job: 3,
        message: 0,
        segment: 256,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 4096,
        seed: 7,
    };
    sw.allreduce(&run);
    let (ok, out) = host(&["attach", "eth0", "--netns", &w0]);
    assert!(
        ok && out.contains("is attached to eth0 in network namespace") && out.contains("already"),
        "{out}"
    );
    // A switch port runs the switch's program: refused, with the way to free it.
    let (ok, e) = host(&["attach", "swp0", "--netns", &sw.lab.switch_ns()]);
    assert!(
        !ok && e.contains(
            "swp0 already runs an XDP program (native mode) that is not a pinned xagg_host"
        ) && e.contains("ip link set dev swp0 xdp off"),
        "{e}"
    );
    assert!(has_xdp(&sw, "swp0"), "the switch's program is untouched");
    // Detached, then attached again through a process of the namespace (a container's).
    let (ok, out) = host(&["detach", "eth0", "--netns", &w0]);
    assert!(ok && out.contains("detached"), "{out}");
    assert!(!pin.exists() && !in_w0(&["link", "show", "eth0"]).contains("xdp"));
    let (ok, e) = host(&["detach", "eth0", "--netns", &w0]);
    assert!(!ok && e.contains("no xagg_host is pinned for eth0"), "{e}");
    let mut holder = Command::new("ip")
        .args(["netns", "exec", &w0, "sleep", "30"])
        .spawn()
        .unwrap();
    let pid = holder.id();
    eventually(
        "the process is in the namespace",
        Duration::from_secs(5),
        || {
            let ino = std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
            if ino.as_ref().ok() == Some(&std::os::unix::fs::MetadataExt::ino(&inode)) {
                Ok(())
            } else {
                Err(ino.ok())
            }
        },
    );
    let (ok, out) = host(&["attach", "eth0", "--netns-pid", &pid.to_string()]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        ok && out.contains("(native XDP)") && pin.join("link").exists(),
        "{out}"
    );
    sw.allreduce(&Allreduce {
        message: 1,
        seed: 8,
        ..run
    });
    // A namespace deleted before its end was detached leaves the pin; detaching by its
    // name then removes the pins of every namespace that no longer exists.
    let gone = "xth-gone";
    let _ = xagg_lab::lab::ip(&["netns", "del", gone]);
    xagg_lab::lab::ip(&["netns", "add", gone]).unwrap();
    xagg_lab::lab::ip(&[
        "-n", gone, "link", "add", "v0", "type", "veth", "peer", "v1",
    ])
    .unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(format!("/run/netns/{gone}")).unwrap(),
    );
    let (ok, out) = host(&["attach", "v0", "--netns", gone]);
    let left = std::path::PathBuf::from(format!("/sys/fs/bpf/xagg-host/{ino}"));
    assert!(ok && left.exists(), "{out}");
    xagg_lab::lab::ip(&["netns", "del", gone]).unwrap();
    let (ok, out) = host(&["detach", "v0", "--netns", gone]);
    assert!(ok && out.contains("no longer exists"), "{out}");
    assert!(
        !left.exists(),
        "the pin of the namespace that went is removed"
    );
    assert!(pin.join("link").exists(), "a live namespace's pin stays");

    // A host daemon attaches the ends its configuration names at start; one whose
    // namespace is not there yet is said, and the daemon serves on.
    let w1 = sw.lab.worker_ns(1);
    let (ok, out) = host(&["detach", "eth0", "--netns", &w1]);
    assert!(ok, "{out}");
    let mut cfg = sw.default_config();
    for ns in [w1.as_str(), "xth-not-yet"] {
        cfg.host_ends.push(xagg_daemon::config::HostEndSection {
            iface: "eth0".into(),
            netns: ns.into(),
        });
    }
    sw.write_config(&cfg).unwrap();
    sw.stop_daemon(Signal::SIGTERM);
    sw.start_daemon();
    let log = std::fs::read_to_string(&sw.log).unwrap();
    assert!(
        log.contains(&format!(
            "host end eth0 in network namespace {w1}: xagg_host attached (native XDP)"
        )),
        "{log}"
    );
    assert!(
        log.contains("host end eth0 in network namespace xth-not-yet")
            && log.contains("xagg host attach eth0 --netns xth-not-yet"),
        "{log}"
    );
    sw.allreduce(&Allreduce {
        message: 2,
        seed: 9,
        ..run
    });
}
