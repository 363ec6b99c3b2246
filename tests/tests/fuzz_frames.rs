//! A million random and mutated frames through the switch program (BPF_PROG_RUN) while it
//! holds live jobs. Afterwards every slot no accepted contribution touched is byte for byte
//! as before, the jobs are unchanged, and the touched slots are consistent.

use std::collections::BTreeSet;

use xagg_common::{
    job::MemberAddr,
    slot::{ShadowState, SlotImage},
    wire::{DType, Header, Kind, Op, FLAG_SHADOW, HEADER_LEN},
    Counter,
};
use xagg_tests::*;

const FRAMES: usize = 1_000_000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        xagg_worker::data::mix(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Changes 1-4 bytes among the first 90 (the headers), or cuts or extends the frame.
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    if rng.below(2) == 0 {
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(f.len().min(90));
            f[at] = rng.next() as u8;
        }
    } else {
        let len = (14 + rng.below(f.len() + 2)).min(3520);
        f.resize(len, rng.next() as u8);
    }
}

fn same(a: &SlotImage, b: &SlotImage) -> bool {
    a.shadow.iter().zip(&b.shadow).all(|(x, y)| {
        (x.state, x.seen, x.message, x.segment, x.count)
            == (y.state, y.seen, y.message, y.segment, y.count)
            && x.data == y.data
    })
}

#[test]
fn million_hostile_frames_change_nothing_else() {
    if !require_root("million_hostile_frames_change_nothing_else") {
        return;
    }
    let mut sw = load_switch();
    // (jid, members, op, dtype, seg_elems, slot_base, slots)
    let jobs = [
        (1u32, 3usize, Op::Sum, DType::I32, 256u16, 0u32, 8u32),
        (2, 2, Op::Xor, DType::I64, 64, 8, 4),
        (3, 4, Op::Sum, DType::U32, 860, 12, 8),
    ];
    for &(jid, n, op, dt, seg, base, count) in &jobs {
        sw.add_job(jid, job(n, op, dt, seg, base, count));
    }
    let template = |rng: &mut Rng| -> Vec<u8> {
        let &(jid, n, op, dt, seg, _, slots) = &jobs[rng.below(jobs.len())];
        let m = rng.below(n) as u8;
        let count = 1 + rng.below(seg as usize);
        let flags = if rng.below(2) == 1 { FLAG_SHADOW } else { 0 };
        let h = Header::builder(Kind::Contribution)
            .op(op)
            .dtype(dt)
            .job(jid)
            .message(rng.below(3) as u32)
            .segment(rng.below(4) as u32)
            .slot(rng.below(slots as usize) as u16)
            .member(m)
            .flags(flags)
            .count(count as u16)
            .build();
        let elems = count * dt.size() / 4;
        let values: Vec<i32> = (0..elems).map(|_| rng.next() as i32).collect();
        frame(&member(m), PORT, &contribution(h, &values))
    };
    // Live state first: some rounds filling, some done.
    let mut rng = Rng(7);
    for _ in 0..200 {
        let f = template(&mut rng);
        sw.run(&f);
    }
    let before: Vec<_> = (0..24).map(|i| sw.slot(i)).collect();
    let jobs_before: Vec<_> = jobs.iter().map(|j| sw.job(j.0).member).collect();
    let accepted = |sw: &Switch| {
        sw.counter(Counter::Contribution)
            + sw.counter(Counter::Complete)
            + sw.counter(Counter::SlotReclaimed)
    };

    // Phase 1, hostile frames only: random bytes, random bytes behind a valid header, and
    // contributions from a host that is no member (claiming a member's index), mutated or
    // cut. Nothing may change.
    let spoofer = MemberAddr {
        ip: [10, 0, 0, 99],
        mac: [2, 0, 0, 0, 0, 99],
        ..member(0)
    };
    let hostile = |rng: &mut Rng, i: usize| -> Vec<u8> {
        match i % 3 {
            // (BPF_PROG_RUN takes 14..=3520 bytes: an Ethernet header up to one page.)
            0 => (0..14 + rng.below(200)).map(|_| rng.next() as u8).collect(),
            1 => {
                let body: Vec<u8> = (0..rng.below(3478)).map(|_| rng.next() as u8).collect();
                frame(&member(rng.below(4) as u8), PORT, &body)
            }
            _ => {
                let mut f = template(rng);
                f[6..12].copy_from_slice(&spoofer.mac);
                f[26..30].copy_from_slice(&spoofer.ip);
                mutate(rng, &mut f);
                f
            }
        }
    };
    let start = accepted(&sw);
    for i in 0..FRAMES / 2 {
        let f = hostile(&mut rng, i);
        sw.run(&f);
    }
    assert_eq!(accepted(&sw), start, "a hostile frame was accepted");
    for i in 0..24u32 {
        assert!(
            same(&before[i as usize], &sw.slot(i)),
            "slot {i} changed by hostile frames"
        );
    }

    // Phase 2: members' contributions mutated or cut. Those that stay valid are accepted
    // and may change their own slot; nothing else may change.
    let mut touched = BTreeSet::new();
    let mut n_accepted = 0u64;
    let mut last = accepted(&sw);
    for _ in 0..FRAMES / 2 {
        let mut f = template(&mut rng);
        mutate(&mut rng, &mut f);
        let r = sw.run(&f);
        if r.action == XDP_DROP || r.action == XDP_REDIRECT {
            let now = accepted(&sw);
            if now != last {
                n_accepted += now - last;
                last = now;
                let h = Header::from_bytes(&f[42..42 + HEADER_LEN]).unwrap();
                let j = jobs
                    .iter()
                    .find(|j| j.0 == h.job())
                    .expect("accepted for a live job");
                touched.insert(j.5 + h.slot() as u32);
            }
        }
    }
    eprintln!("{FRAMES} frames: half hostile, none accepted; of the mutated members' contributions {n_accepted} accepted as contributions, touching slots {touched:?}");
    let jobs_after: Vec<_> = jobs.iter().map(|j| sw.job(j.0).member).collect();
    assert_eq!(jobs_before, jobs_after, "job entries changed");
    for i in 0..24u32 {
        let (a, b) = (&before[i as usize], sw.slot(i));
        if !touched.contains(&i) {
            assert!(
                same(a, &b),
                "slot {i} changed without an accepted contribution"
            );
            continue;
        }
        let j = jobs
            .iter()
            .find(|j| (j.5..j.5 + j.6).contains(&i))
            .expect("touched slot belongs to a job");
        for v in &b.shadow {
            assert!(v.state <= ShadowState::Done as u32);
            assert_eq!(
                v.seen & !((1u64 << j.1) - 1),
                0,
                "slot {i}: a non-member bit set"
            );
            assert!(
                v.count <= j.4 as u32,
                "slot {i}: count above the segment length"
            );
        }
    }
    for i in 20..24 {
        assert!(
            !touched.contains(&i) && sw.slot(i).shadow.iter().all(|v| v.state == 0),
            "slot {i} of no job touched"
        );
    }
}
