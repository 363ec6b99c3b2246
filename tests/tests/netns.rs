//! End-to-end tests in a veth/netns lab: workers allreduce through the XDP switch run by
//! the daemon; results are checked bit-exactly against a locally computed wrapping sum.

use std::{
    io::{Read, Write},
    net::{SocketAddrV4, TcpListener, TcpStream},
    process::Command,
};

use xagg_api::Response;
use xagg_lab::lab;
use xagg_tests::*;

#[test]
fn two_workers_uneven_sizes() {
    if !require_root("two_workers_uneven_sizes") {
        return;
    }
    let sw = TestSwitch::start("xt2", 2, |_| {});
    assert!(matches!(
        sw.add_job(1, 256, 16, &[0, 1]),
        Response::Job { .. }
    ));
    // Not a multiple of the segment (256): short last segments, odd element counts.
    for (k, elems) in [1usize, 3, 255, 257, 256 * 16 + 1, 100_003]
        .into_iter()
        .enumerate()
    {
        let reps = sw.allreduce(&Allreduce {
            job: 1,
            message: k as u32,
            segment: 256,
            slots: 16,
            workers: &[0, 1],
            port: 47801,
            elems,
            seed: 100 + k as u64,
        });
        assert_eq!(reps.len(), 2);
    }
    let c = sw.counters();
    assert!(
        c["complete"] > 0 && c["result_copy"] == 2 * c["complete"],
        "{c:?}"
    );
}

#[test]
fn four_workers_large_buffer() {
    if !require_root("four_workers_large_buffer") {
        return;
    }
    let sw = TestSwitch::start("xt4", 4, |_| {});
    assert!(matches!(
        sw.add_job(9, 860, 64, &[0, 1, 2, 3]),
        Response::Job { .. }
    ));
    let elems = (16 << 20) / 4 + 5; // 16 MiB and a short last segment
    let reps = sw.allreduce(&Allreduce {
        job: 9,
        message: 0,
        segment: 860,
        slots: 64,
        workers: &[0, 1, 2, 3],
        port: 47801,
        elems,
        seed: 42,
    });
    let slowest = reps.iter().map(|r| r.seconds).fold(0.0, f64::max);
    eprintln!("4 workers x 16 MiB: slowest {slowest:.3} s");
    let c = sw.counters();
    let segs = elems.div_ceil(860) as u64;
    assert_eq!(c["complete"], segs, "{c:?}");
    assert_eq!(c["result_copy"], 4 * segs, "{c:?}");
    for bad in [
        "drop_not_member",
        "drop_unknown_job",
        "drop_slot_range",
        "drop_bad_length",
        "redirect_error",
        "egress_no_member",
    ] {
        assert_eq!(c[bad], 0, "{bad}: {c:?}");
    }
}

/// A lab at the MTU of most Ethernet networks: the longest segment a 1500-byte packet
/// carries goes through, one element more is refused with the largest that fits.
#[test]
fn standard_ethernet_mtu() {
    if !require_root("standard_ethernet_mtu") {
        return;
    }
    let sw = TestSwitch::start_with_mtu("xtm", 2, 1500, |_| {});
    let longest = (xagg_common::wire::payload_for_mtu(1500) / 4) as u16;
    assert_eq!(longest, 358);
    match sw.add_job(2, longest + 1, 16, &[0, 1]) {
        Response::Error { message } => assert!(
            message.contains("MTU of 1500") && message.contains("at most 358 elements"),
            "{message}"
        ),
        r => panic!("a segment past the MTU was taken: {r:?}"),
    }
    assert!(matches!(
        sw.add_job(1, longest, 64, &[0, 1]),
        Response::Job { .. }
    ));
    let elems = (1 << 20) / 4 + 3;
    sw.allreduce(&Allreduce {
        job: 1,
        message: 0,
        segment: longest as usize,
        slots: 64,
        workers: &[0, 1],
        port: 47801,
        elems,
        seed: 7,
    });
    let c = sw.counters();
    assert_eq!(c["complete"], elems.div_ceil(358) as u64, "{c:?}");
}

/// Ping and TCP between workers cross the switch's bridge while the programs are attached.
#[test]
fn ordinary_traffic_passes() {
    if !require_root("ordinary_traffic_passes") {
        return;
    }
    let sw = TestSwitch::start("xto", 2, |_| {});
    let before = sw.counters()["pass"];
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &sw.lab.worker_ns(0),
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
        ])
        .arg(lab::worker_ip(1).to_string())
        .output()
        .expect("ping");
    assert!(
        out.status.success(),
        "ping across the switch failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The switch itself answers too (its address is on the bridge).
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &sw.lab.worker_ns(1),
            "ping",
            "-c",
            "1",
            "-W",
            "2",
        ])
        .arg(lab::SWITCH_IP.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "ping to the switch failed");

    let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7) as u8).collect();
    let got = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let ns1 = sw.lab.worker_ns(1);
        let server = s.spawn(move || {
            xagg_linux::iface::enter_netns(&ns1).unwrap();
            let l = TcpListener::bind(SocketAddrV4::new(lab::worker_ip(1), 5001)).unwrap();
            tx.send(()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut v = Vec::new();
            c.read_to_end(&mut v).unwrap();
            v
        });
        rx.recv().unwrap();
        let ns0 = sw.lab.worker_ns(0);
        let payload = &payload;
        s.spawn(move || {
            xagg_linux::iface::enter_netns(&ns0).unwrap();
            let mut c = TcpStream::connect(SocketAddrV4::new(lab::worker_ip(1), 5001)).unwrap();
            c.write_all(payload).unwrap();
        })
        .join()
        .unwrap();
        server.join().unwrap()
    });
    assert_eq!(got, payload, "TCP across the switch corrupted or lost data");
    assert!(
        sw.counters()["pass"] > before,
        "the switch program saw the ordinary traffic and passed it"
    );
}
