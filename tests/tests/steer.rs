//! Steering (`switch.steer_cpus`): each slot's contributions are folded on one CPU, however
//! they came in, through the cpumap's program; the results are exact and every steered
//! contribution is folded exactly once, on the CPU it was steered to.

use std::collections::BTreeMap;

use aya::maps::{Map, MapData, PerCpuArray};
use xagg_api::{Request, Response};
use xagg_common::{wire, Counter};
use xagg_tests::*;

const WORKERS: [usize; 3] = [0, 1, 2];

/// The switch's counters per CPU, read from its pinned map.
fn per_cpu(pin: &str) -> BTreeMap<u32, Vec<u64>> {
    let md = MapData::from_pin(format!("{pin}/maps/COUNTERS")).expect("the pinned COUNTERS");
    let map: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(Map::from_map_data(md).unwrap()).unwrap();
    Counter::ALL
        .iter()
        .map(|&c| (c as u32, map.get(&(c as u32), 0).unwrap().to_vec()))
        .collect()
}

#[test]
fn contributions_are_folded_on_the_cpu_they_are_steered_to() {
    if !require_root("contributions_are_folded_on_the_cpu_they_are_steered_to") {
        return;
    }
    // The last CPU: the ports' packet processing runs on every CPU, the folds on this one.
    let cpu = xagg_linux::cpus::available() - 1;
    let sw = TestSwitch::start("xts", 3, |c| c.switch.steer_cpus = Some(cpu.to_string()));
    match sw.api(Request::Status) {
        Response::Status { steer_cpus, .. } => assert_eq!(steer_cpus, vec![cpu]),
        r => panic!("{r:?}"),
    }
    // Single-buffer segments (results broadcast by the devmap from the cpumap's program)
    // and multi-buffer ones (results passed to the fan-out), two jobs.
    let multi = (wire::MAX_PAYLOAD / 4) as u16;
    for (job, segment) in [(1, 860u16), (2, multi)] {
        assert!(matches!(
            sw.add_job(job, segment, 32, &WORKERS),
            Response::Job { .. }
        ));
    }
    let pin = "/sys/fs/bpf/xagg-test-xts";
    let before = per_cpu(pin);
    for (job, segment) in [(1, 860usize), (2, multi as usize)] {
        sw.allreduce(&Allreduce {
            job,
            message: 0,
            segment,
            slots: 32,
            workers: &WORKERS,
            port: 47801,
            elems: 200 * segment - 3,
            seed: 11 + job as u64,
        });
    }
    let after = per_cpu(pin);
    let delta = |c: Counter, on: usize| after[&(c as u32)][on] - before[&(c as u32)][on];
    let total = |c: Counter| {
        (0..after[&(c as u32)].len())
            .map(|i| delta(c, i))
            .sum::<u64>()
    };
    let folded: u64 = FOLDED.iter().map(|&c| total(c)).sum();
    // 200 segments per member per job, each contribution steered once and folded once.
    assert_eq!(total(Counter::Steered), folded);
    assert!(total(Counter::Steered) >= 2 * 3 * 200, "{folded}");
    assert_eq!(total(Counter::Complete), 2 * 200);
    for c in FOLDED {
        assert_eq!(delta(c, cpu), total(c), "{c:?} counted off CPU {cpu}");
    }
}

/// Steering by destination port (`switch.udp_ports`), for a NIC's flow rules: each worker
/// sends slot s's contributions to the switch's port + s % 4 — exactly, counted on its way
/// out — and the switch takes all four ports; the port after them is not its own.
#[test]
fn each_slot_goes_to_the_switch_port_of_its_lane() {
    if !require_root("each_slot_goes_to_the_switch_port_of_its_lane") {
        return;
    }
    const LANES: u16 = 4;
    const SEGMENTS: usize = 103;
    let sw = TestSwitch::start("xtp", 3, |c| c.switch.udp_ports = LANES as u8);
    assert!(matches!(
        sw.add_job(1, 860, 16, &WORKERS),
        Response::Job { .. }
    ));
    // Counted on every worker's way out (impaired at rate 0).
    let mut sw = sw;
    sw.lab
        .impair(&xagg_lab::Object::Test.read().unwrap(), 0.0, 0.0)
        .unwrap();
    let base = wire::DEFAULT_PORT;
    let before = sw.counters();
    let reps = sw.allreduce_with(
        &Allreduce {
            job: 1,
            message: 0,
            segment: 860,
            slots: 16,
            workers: &WORKERS,
            port: 47801,
            elems: SEGMENTS * 860 - 5,
            seed: 21,
        },
        |p| {
            p.switch_ports = LANES as u8;
            // One datagram per send, so tc counts datagrams; a timeout no hiccup reaches,
            // so that every contribution is sent once.
            p.gso = false;
            p.min_timeout = std::time::Duration::from_millis(200);
        },
    );
    assert_eq!(reps[0].retransmissions, 0);
    let after = sw.counters();
    let taken = |k: &str| after[k] - before[k];
    assert_eq!(
        taken("contribution") + taken("complete"),
        3 * SEGMENTS as u64
    );
    // Message 0 puts segment s on slot s % 16, whose lane is s % 4; three workers, each of
    // which first asked the switch about both copies of its 16 slots on the first port.
    let sent = sw.lab.sent_by_port().unwrap();
    let want: Vec<u64> = (0..8)
        .map(|lane| {
            let contributions = (0..SEGMENTS)
                .filter(|s| lane < LANES as usize && s % LANES as usize == lane)
                .count() as u64;
            let queries = if lane == 0 { 2 * 16 } else { 0 };
            3 * (contributions + queries)
        })
        .collect();
    assert_eq!(sent, want, "contributions per destination port");

    // A status query of member 0 is answered on the last lane's port, and not taken on
    // the port after it.
    let query = {
        let h = xagg_common::Header::builder(xagg_common::Kind::StatusQuery)
            .job(1)
            .member(0)
            .slot(0)
            .build();
        let mut q = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
        let n = wire::finish(&h, wire::STATUS_PAYLOAD, &mut q).unwrap();
        q[..n].to_vec()
    };
    for (port, replies) in [(base + LANES - 1, 1), (base + LANES, 0)] {
        let before = sw.counters();
        xagg_lab::lab::in_netns(&sw.lab.worker_ns(0), || {
            let s = std::net::UdpSocket::bind((xagg_lab::lab::worker_ip(0), 47801))?;
            s.send_to(&query, (xagg_lab::lab::SWITCH_IP, port))?;
            Ok(())
        })
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let after = sw.counters();
        assert_eq!(
            after["status_reply"] - before["status_reply"],
            replies,
            "a query to port {port}"
        );
    }
}
