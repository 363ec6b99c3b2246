//! Steering (`switch.steer_cpus`): each slot's contributions are folded on one CPU, however
//! they came in, through the cpumap's program; the results are exact and every steered
//! contribution is folded exactly once, on the CPU it was steered to.

use std::collections::BTreeMap;

use aya::maps::{Map, MapData, PerCpuArray};
use xagg_api::{Request, Response};
use xagg_common::{wire, Counter};
use xagg_tests::*;

const WORKERS: [usize; 3] = [0, 1, 2];

/// What came of contributions, the counters a steered contribution bumps on the CPU that
/// folds it.
const OUTCOMES: [Counter; 6] = [
    Counter::Contribution,
    Counter::Complete,
    Counter::ResultReplay,
    Counter::DropDuplicate,
    Counter::DropStale,
    Counter::SlotReclaimed,
];

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
    let folded: u64 = OUTCOMES.iter().map(|&c| total(c)).sum();
    // 200 segments per member per job, each contribution steered once and folded once.
    assert_eq!(total(Counter::Steered), folded);
    assert!(total(Counter::Steered) >= 2 * 3 * 200, "{folded}");
    assert_eq!(total(Counter::Complete), 2 * 200);
    for c in OUTCOMES {
        assert_eq!(delta(c, cpu), total(c), "{c:?} counted off CPU {cpu}");
    }
}
