//! Aggregation trees end to end: hosts reduce their ranks (namespaces behind the host,
//! like containers) and send one partial per segment to the switch, which delivers the
//! result back down; a spine over leaf switches does the same one level higher. Every
//! result is checked against the sum over all ranks.

use xagg_lab::tree::{Topology, TreeLab};
use xagg_tests::*;

fn run(prefix: &str, topology: Topology, sizes: &[usize], segment: usize) {
    let mut lab = TreeLab::create(prefix, topology, xagg_sys::EBPF_OBJECT).expect("the tree lab");
    lab.start_daemons().expect("a daemon per aggregation point");
    let slots = 16;
    lab.add_job(1, segment as u16, slots as u32)
        .expect("the job at every point");
    let before = lab.link_bytes().unwrap();
    let mut total = 0usize;
    for (m, &elems) in sizes.iter().enumerate() {
        lab.allreduce(1, m as u32, segment, slots, elems, 7 + m as u64, |p| {
            // More ranks than cores: no busy polling.
            p.spin = std::time::Duration::ZERO;
        })
        .unwrap_or_else(|e| {
            panic!(
                "{topology:?}, {elems} elements: {e:#}; counters {:?}",
                lab.counters()
            )
        });
        total += elems * 4;
    }
    let after = lab.link_bytes().unwrap();
    for ((name, tx0, rx0), (_, tx1, rx1)) in before.iter().zip(&after) {
        let (up, down) = (
            (tx1 - tx0) as f64 / total as f64,
            (rx1 - rx0) as f64 / total as f64,
        );
        eprintln!("{name}: up {up:.3}·S, down {down:.3}·S");
    }
    let counters = lab.counters();
    for (i, c) in counters.iter().enumerate() {
        eprintln!("point {i}: {c:?}");
    }
}

#[test]
fn hosts_under_a_switch() {
    if !require_root("hosts_under_a_switch") {
        return;
    }
    run(
        "th",
        Topology::Hosts { hosts: 2, ranks: 2 },
        &[1, 1000, 70_000],
        862,
    );
}
