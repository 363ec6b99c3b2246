//! Contributions to the same slot processed by two CPUs at the same moment: every round
//! must complete exactly once with the exact sum (the slot's spin lock at work).

use std::sync::Barrier;

use aya::programs::{TestRun, TestRunOptions, Xdp};
use nix::sched::{sched_setaffinity, CpuSet};
use xagg_common::{
    wire::{DType, Header, Kind, Op, FLAG_SHADOW, PAYLOAD_OFFSET},
    Counter,
};
use xagg_tests::*;

const ROUNDS: u32 = 3000;
const ELEMS: usize = 860;

fn values(m: u32, k: u32) -> Vec<i32> {
    (0..ELEMS)
        .map(|i| xagg_worker::data::element(k as u64, m, i))
        .collect()
}

#[test]
#[expect(
    clippy::needless_range_loop,
    reason = "round k indexes both threads' results"
)]
fn two_cpus_one_slot() {
    if !require_root("two_cpus_one_slot") || !require_cpus("two_cpus_one_slot", 2) {
        return;
    }
    // The first two CPUs this process may run on, one per contributing thread.
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .take(2)
        .collect();
    let mut sw = load_switch();
    sw.add_job(5, job(2, Op::Sum, DType::I32, ELEMS as u16, 0, 4));
    let frames: Vec<[Vec<u8>; 2]> = (0..ROUNDS)
        .map(|k| {
            [0u8, 1].map(|m| {
                let flags = if (k / 4) % 2 == 1 { FLAG_SHADOW } else { 0 };
                let h = Header::builder(Kind::Contribution)
                    .op(Op::Sum)
                    .dtype(DType::I32)
                    .job(5)
                    .message(0)
                    .segment(k)
                    .slot((k % 4) as u16)
                    .member(m)
                    .flags(flags)
                    .count(ELEMS as u16)
                    .build();
                frame(&member(m), PORT, &contribution(h, &values(m as u32, k)))
            })
        })
        .collect();
    let prog: &Xdp = sw.ebpf.program("xagg_switch").unwrap().try_into().unwrap();
    let barrier = Barrier::new(2);
    let results: Vec<Vec<(u32, u32, Vec<u8>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2usize)
            .map(|m| {
                let (frames, barrier, cpus) = (&frames, &barrier, &cpus);
                s.spawn(move || {
                    let mut set = CpuSet::new();
                    set.set(cpus[m]).unwrap();
                    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
                    let mut out = Vec::new();
                    for (k, f) in frames.iter().enumerate() {
                        barrier.wait();
                        let mut buf = vec![0u8; f[m].len() + 64];
                        let mut o = TestRunOptions::new();
                        o.data_in = Some(&f[m]);
                        o.data_out = Some(&mut buf);
                        let r = prog.test_run(o).unwrap();
                        buf.truncate(r.data_size_out as usize);
                        out.push((k as u32, r.return_value, buf));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut completions = 0;
    for k in 0..ROUNDS as usize {
        let acts = [results[0][k].1, results[1][k].1];
        let done: Vec<usize> = (0..2).filter(|&m| acts[m] == XDP_REDIRECT).collect();
        assert_eq!(
            done.len(),
            1,
            "round {k}: actions {acts:?}: exactly one contribution completes"
        );
        assert!(acts.contains(&XDP_DROP), "round {k}: {acts:?}");
        let out = &results[done[0]][k].2;
        let want: Vec<i32> = values(0, k as u32)
            .iter()
            .zip(values(1, k as u32))
            .map(|(a, b)| a.wrapping_add(b))
            .collect();
        let got: Vec<i32> = out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4 * ELEMS]
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, want, "round {k}: wrong sum");
        completions += 1;
    }
    assert_eq!(completions, ROUNDS);
    assert_eq!(sw.counter(Counter::Complete), ROUNDS as u64);
    assert_eq!(
        sw.counter(Counter::DropDuplicate) + sw.counter(Counter::SlotReclaimed),
        0
    );
}
