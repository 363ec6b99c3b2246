//! The worker's AF_XDP receive path, end to end in a netns lab: results come in through
//! posted buffers, bit-exact, also when the switch drops results; the worker refuses an
//! interface that already carries another XDP program; ordinary traffic to a worker that
//! receives with AF_XDP still reaches its kernel.

use std::process::Command;

use xagg_api::{Request, Response};
use xagg_tests::*;

fn afxdp(p: &mut xagg_worker::WorkerParams) {
    p.afxdp = Some(xagg_objects::HOST);
}

#[test]
fn afxdp_receive_is_exact_and_recovers_lost_results() {
    if !require_root("afxdp_receive_is_exact_and_recovers_lost_results") {
        return;
    }
    let mut sw = TestSwitch::start("xtx", 3, |_| {});
    // Each worker attaches its own xagg_host (with its socket in the map).
    sw.lab.detach_hosts();
    let workers = [0, 1, 2];
    assert!(matches!(
        sw.add_job(4, 860, 64, &workers),
        Response::Job { .. }
    ));
    let job = Allreduce {
        job: 4,
        message: 0,
        segment: 860,
        slots: 64,
        workers: &workers,
        port: 47801,
        elems: 0,
        seed: 0,
    };
    let mut mid = 0;
    for elems in [1usize, 859, 861, (4 << 20) / 4 + 3] {
        let reps = sw.allreduce_with(
            &Allreduce {
                message: mid,
                elems,
                seed: 500 + mid as u64,
                ..job
            },
            afxdp,
        );
        mid += 1;
        assert_eq!(reps.len(), 3);
    }
    let c = sw.counters();
    assert_eq!(c["result_copy"], 3 * c["complete"], "{c:?}");

    // Results lost at the switch: the retransmitted contributions are answered with the
    // stored results, which come in through AF_XDP like the others.
    assert!(matches!(
        sw.api(Request::Inject {
            drop_contribution: 0.0,
            drop_result: 0.05
        }),
        Response::Ok
    ));
    let before = sw.counters();
    let reps = sw.allreduce_with(
        &Allreduce {
            message: mid,
            elems: (2 << 20) / 4,
            seed: 77,
            ..job
        },
        afxdp,
    );
    let after = sw.counters();
    let dropped = after["inject_drop_result"] - before["inject_drop_result"];
    let retx: u64 = reps.iter().map(|r| r.retransmissions).sum();
    eprintln!(
        "AF_XDP with 5 % of results dropped: bit-exact, {dropped} dropped, {retx} retransmissions"
    );
    assert!(dropped > 0, "no result was dropped");
    assert!(retx > 0, "a dropped result needs a retransmission");
}

/// UDP datagrams the kernel delivered to sockets in worker `w`'s namespace.
fn udp_in(sw: &TestSwitch, w: usize) -> u64 {
    xagg_lab::lab::in_netns(&sw.lab.worker_ns(w), || {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp")?;
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
        let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
        let at = names.split_whitespace().position(|k| k == "InDatagrams");
        Ok(values
            .split_whitespace()
            .nth(at.unwrap())
            .unwrap()
            .parse()?)
    })
    .unwrap()
}

/// Multi-buffer results (full segments of a 9000-byte MTU) come in through AF_XDP too, one
/// descriptor per buffer, joined by the worker: none reaches the UDP socket.
#[test]
fn afxdp_receives_multi_buffer_results() {
    if !require_root("afxdp_receives_multi_buffer_results") {
        return;
    }
    let mut sw = TestSwitch::start("xtb", 3, |_| {});
    sw.lab.detach_hosts();
    let workers = [0, 1, 2];
    let segment = xagg_common::wire::MAX_PAYLOAD / 4;
    assert!(matches!(
        sw.add_job(5, segment as u16, 64, &workers),
        Response::Job { .. }
    ));
    let before: Vec<u64> = workers.iter().map(|&w| udp_in(&sw, w)).collect();
    let elems = (4 << 20) / 4 + 3;
    let reps = sw.allreduce_with(
        &Allreduce {
            job: 5,
            message: 0,
            segment,
            slots: 64,
            workers: &workers,
            port: 47801,
            elems,
            seed: 9,
        },
        afxdp,
    );
    assert_eq!(reps.len(), 3);
    let segments = elems.div_ceil(segment) as u64;
    for (&w, b) in workers.iter().zip(before) {
        let through_socket = udp_in(&sw, w) - b;
        assert!(
            through_socket < segments / 10,
            "worker {w}: {through_socket} of {segments} results came through the UDP socket"
        );
    }
    let c = sw.counters();
    assert_eq!(c["result_copy"], 3 * c["complete"], "{c:?}");
}

#[test]
fn afxdp_refuses_a_taken_interface_and_lets_other_traffic_in() {
    if !require_root("afxdp_refuses_a_taken_interface_and_lets_other_traffic_in") {
        return;
    }
    let mut sw = TestSwitch::start("xty", 2, |_| {});
    let ns0 = sw.lab.worker_ns(0);
    let params = || {
        let mut p = xagg_worker::WorkerParams::new(
            std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, xagg_common::wire::DEFAULT_PORT),
            std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(0), 47801),
            1,
            0,
            i32_shape(2, 64, 860),
        );
        p.afxdp = Some(xagg_objects::HOST);
        p
    };
    // The lab's xagg_host sits on every worker's eth0: AF_XDP must not replace it.
    let err = xagg_lab::lab::in_netns(&ns0, || {
        Ok(xagg_worker::Worker::new(params())
            .err()
            .expect("a worker took an interface that carries another XDP program")
            .to_string())
    })
    .unwrap();
    assert!(
        err.contains("xagg host detach") && err.contains("eth0"),
        "the error should say which interface and how to free it: {err}"
    );

    sw.lab.detach_hosts();
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let ns0 = ns0.clone();
        s.spawn(move || {
            xagg_linux::iface::enter_netns(&ns0).unwrap();
            let w = xagg_worker::Worker::new(params()).expect("AF_XDP worker");
            ready_tx.send(()).unwrap();
            // Hold the worker (and its program) until the ping is done.
            let _ = done_rx.recv();
            drop(w);
        });
        ready_rx.recv().unwrap();
        let out = Command::new("ip")
            .args(["netns", "exec", &sw.lab.worker_ns(1)])
            .args(["ping", "-c", "2", "-i", "0.2", "-W", "2"])
            .arg(xagg_lab::lab::worker_ip(0).to_string())
            .output()
            .expect("ping");
        done_tx.send(()).unwrap();
        assert!(
            out.status.success(),
            "ping to a worker receiving with AF_XDP failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    });
    // With the worker gone its program is detached: the interface is free again.
    let out = Command::new("ip")
        .args(["-n", &sw.lab.worker_ns(0), "link", "show", "eth0"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("xdp"),
        "xagg_host stayed attached after the worker ended"
    );
}
