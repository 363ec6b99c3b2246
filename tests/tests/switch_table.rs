//! BPF_PROG_RUN table tests of `xagg_switch`: each case is a description, an input frame,
//! the expected action, the expected output frame where it matters, the counter it must
//! bump, and the slot state it must leave.

use xagg_common::{
    slot::ShadowState,
    wire::{self, DType, Header, Kind, Op, FLAG_SHADOW, PAYLOAD_OFFSET},
    Counter,
};
use xagg_tests::*;

const JID: u32 = 7;
const SEG: u16 = 256;

fn hdr(member: u8, seg: u16, sid: u32, count: u16) -> Header {
    Header::builder(Kind::Contribution)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(JID)
        .message(1)
        .segment(sid)
        .slot(seg)
        .member(member)
        .count(count)
        .build()
}

fn values(member: u8, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| (i as i32 + 1) * 1000 * (member as i32 + 1) - 7 + i32::MAX / 2)
        .collect()
}

fn sum(members: u8, n: usize) -> Vec<i32> {
    let mut s = vec![0i32; n];
    for m in 0..members {
        for (a, b) in s.iter_mut().zip(values(m, n)) {
            *a = a.wrapping_add(b);
        }
    }
    s
}

#[test]
fn switch_program_table() {
    if !require_root("switch_program_table") {
        return;
    }
    let mut sw = load_switch();
    let n = SEG as usize;
    // Job 7: three members, slots 10..14 of the switch.
    sw.add_job(JID, job(3, Op::Sum, DType::I32, SEG, 10, 4));
    let contrib = |m: u8, seg: u16, sid: u32, vals: &[i32]| {
        frame(
            &member(m),
            PORT,
            &contribution(hdr(m, seg, sid, vals.len() as u16), vals),
        )
    };

    // First contribution: copied into slot 10+2, version 0.
    check(
        &mut sw,
        &Case {
            what: "first contribution",
            frame: contrib(0, 2, 0, &values(0, n)),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    let s = sw.slot(12);
    assert_eq!(s.shadow[0].state, ShadowState::Filling as u32);
    assert_eq!(s.shadow[0].seen, 0b001);
    assert_eq!(s.shadow[0].count, n as u32);
    assert_eq!(
        sw.slot(13).shadow[0].state,
        ShadowState::Empty as u32,
        "neighbour slot untouched"
    );

    // Middle contribution: added.
    check(
        &mut sw,
        &Case {
            what: "middle contribution",
            frame: contrib(1, 2, 0, &values(1, n)),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    assert_eq!(sw.slot(12).shadow[0].seen, 0b011);

    // Duplicate from member 1: never added twice.
    let data_before = sw.slot(12).shadow[0].data;
    check(
        &mut sw,
        &Case {
            what: "duplicate",
            frame: contrib(1, 2, 0, &values(1, n)),
            action: XDP_DROP,
            counter: Counter::DropDuplicate,
        },
    );
    assert_eq!(
        sw.slot(12).shadow[0].data,
        data_before,
        "duplicate changed the slot"
    );

    // Non-member: member index 5 of a 3-member job.
    check(
        &mut sw,
        &Case {
            what: "non-member index",
            frame: contrib(5, 2, 0, &values(2, n)),
            action: XDP_DROP,
            counter: Counter::DropNotMember,
        },
    );
    // Spoofed: claims member 2 but comes from member 0's addresses.
    let spoof = frame(
        &member(0),
        PORT,
        &contribution(hdr(2, 2, 0, SEG), &values(2, n)),
    );
    check(
        &mut sw,
        &Case {
            what: "spoofed member",
            frame: spoof,
            action: XDP_DROP,
            counter: Counter::DropNotMember,
        },
    );
    // Unknown job.
    let mut h = hdr(2, 2, 0, SEG);
    h.set_job(99);
    check(
        &mut sw,
        &Case {
            what: "unknown job",
            frame: frame(&member(2), PORT, &contribution(h, &values(2, n))),
            action: XDP_DROP,
            counter: Counter::DropUnknownJob,
        },
    );
    // Slot outside the job's range (4 slots: seg 4 would be slot 14, another job's).
    check(
        &mut sw,
        &Case {
            what: "slot out of range",
            frame: contrib(2, 4, 0, &values(2, n)),
            action: XDP_DROP,
            counter: Counter::DropSlotRange,
        },
    );
    // Truncated inside the collective header.
    let mut t = contrib(2, 2, 0, &values(2, n));
    t.truncate(PAYLOAD_OFFSET - 5);
    check(
        &mut sw,
        &Case {
            what: "truncated",
            frame: t,
            action: XDP_DROP,
            counter: Counter::DropTruncated,
        },
    );
    // Wrong version, wrong op, bad count, bad length.
    let mut h = hdr(2, 2, 0, SEG);
    h.version = 9;
    check(
        &mut sw,
        &Case {
            what: "bad version",
            frame: frame(&member(2), PORT, &contribution(h, &values(2, n))),
            action: XDP_DROP,
            counter: Counter::DropBadVersion,
        },
    );
    let mut h = hdr(2, 2, 0, SEG);
    h.op = Op::Xor as u8;
    check(
        &mut sw,
        &Case {
            what: "op mismatch",
            frame: frame(&member(2), PORT, &contribution(h, &values(2, n))),
            action: XDP_DROP,
            counter: Counter::DropBadOp,
        },
    );
    check(
        &mut sw,
        &Case {
            what: "count above segment",
            frame: contrib(2, 2, 0, &values(2, n + 2)),
            action: XDP_DROP,
            counter: Counter::DropBadCount,
        },
    );
    let mut short = contrib(2, 2, 0, &values(2, n));
    let l = short.len();
    short.truncate(l - 8);
    check(
        &mut sw,
        &Case {
            what: "payload shorter than count",
            frame: short,
            action: XDP_DROP,
            counter: Counter::DropTruncated,
        },
    );
    let mut h = hdr(2, 2, 0, 10);
    h.set_count(10);
    check(
        &mut sw,
        &Case {
            what: "payload longer than count",
            frame: frame(&member(2), PORT, &contribution(h, &values(2, n))),
            action: XDP_DROP,
            counter: Counter::DropBadLength,
        },
    );
    assert_eq!(
        sw.slot(12).shadow[0].data,
        data_before,
        "a dropped packet changed the slot"
    );
    assert_eq!(sw.slot(12).shadow[0].seen, 0b011);

    // Non-collective traffic passes untouched: another UDP port, and ARP.
    let other = frame(&member(2), 53, &[1, 2, 3, 4]);
    let r = check(
        &mut sw,
        &Case {
            what: "other UDP port",
            frame: other.clone(),
            action: XDP_PASS,
            counter: Counter::Pass,
        },
    );
    assert_eq!(r.out, other);
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&member(1).mac);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    let r = check(
        &mut sw,
        &Case {
            what: "ARP",
            frame: arp.clone(),
            action: XDP_PASS,
            counter: Counter::Pass,
        },
    );
    assert_eq!(r.out, arp);

    // The completing contribution: broadcast; the frame is the result, from the switch.
    let r = check(
        &mut sw,
        &Case {
            what: "completing contribution",
            frame: contrib(2, 2, 0, &values(2, n)),
            action: XDP_REDIRECT,
            counter: Counter::Complete,
        },
    );
    assert_eq!(payload_i32(&r.out, n), sum(3, n), "result payload");
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(h.kind, Kind::Result as u8);
    assert_eq!(
        (h.job(), h.message(), h.segment(), h.slot(), h.count()),
        (JID, 1, 0, 2, SEG)
    );
    assert_eq!(
        &r.out[26..30],
        &SWITCH_IP.octets(),
        "result comes from the switch"
    );
    assert_eq!(
        &r.out[34..36],
        &PORT.to_be_bytes(),
        "from the collective port"
    );
    let s = sw.slot(12);
    assert_eq!(s.shadow[0].state, ShadowState::Done as u32);
    assert_eq!(s.shadow[0].seen, 0b111);

    // A retransmission to the finished version: the stored result, to that member only.
    let r = check(
        &mut sw,
        &Case {
            what: "retransmission after completion",
            frame: contrib(0, 2, 0, &values(0, n)),
            action: XDP_TX,
            counter: Counter::ResultReplay,
        },
    );
    assert_eq!(payload_i32(&r.out, n), sum(3, n));
    assert_eq!(&r.out[0..6], &member(0).mac, "to member 0's MAC");
    assert_eq!(&r.out[6..12], &SWITCH_MAC);
    assert_eq!(&r.out[30..34], &member(0).ip, "to member 0's IP");
    assert_eq!(ipv4_checksum(&r.out[14..34]), 0, "valid IPv4 checksum");
    assert_eq!(&r.out[40..42], &[0, 0], "UDP checksum zero");

    // The next use of slot 12 flips the epoch; version 0 keeps its result meanwhile.
    let mut h = hdr(0, 2, 4, 3);
    h.flags = FLAG_SHADOW;
    check(
        &mut sw,
        &Case {
            what: "next round, other version, short segment",
            frame: frame(&member(0), PORT, &contribution(h, &[1, 2, 3])),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    let s = sw.slot(12);
    assert_eq!(
        (s.shadow[1].state, s.shadow[1].count, s.shadow[1].segment),
        (ShadowState::Filling as u32, 3, 4)
    );
    assert_eq!(s.shadow[0].state, ShadowState::Done as u32);
    // A late packet from an older round is stale, not a new round.
    let mut h = hdr(1, 2, 0, 3);
    h.flags = FLAG_SHADOW;
    check(
        &mut sw,
        &Case {
            what: "stale round",
            frame: frame(&member(1), PORT, &contribution(h, &[1, 2, 3])),
            action: XDP_DROP,
            counter: Counter::DropStale,
        },
    );
}

/// A one-member job completes on its first contribution; a one-element buffer works.
#[test]
fn single_member_single_element() {
    if !require_root("single_member_single_element") {
        return;
    }
    let mut sw = load_switch();
    sw.add_job(3, job(1, Op::Sum, DType::I32, 64, 0, 1));
    let h = Header::builder(Kind::Contribution)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(3)
        .message(0)
        .segment(0)
        .slot(0)
        .member(0)
        .count(1)
        .build();
    let r = sw.run(&frame(&member(0), PORT, &contribution(h, &[-5])));
    assert_eq!(r.action, XDP_REDIRECT);
    assert_eq!(payload_i32(&r.out, 1), vec![-5]);
    assert_eq!(sw.counter(Counter::Complete), 1);
}

/// Every message carries its op and type: the first contribution of a round fixes them, a
/// contribution of the same round that disagrees is dropped (`drop_bad_op`), and the next
/// round on the same shadow copy may reduce another pair. One job, created for i32 sums.
#[test]
fn op_and_type_are_fixed_per_round() {
    if !require_root("op_and_type_are_fixed_per_round") {
        return;
    }
    let mut sw = load_switch();
    sw.add_job(4, job(2, Op::Sum, DType::I32, 860, 0, 1));
    let c = |m: u8, message: u32, op: Op, dtype: DType, shadow: u8, values: &[i32]| {
        let h = Header::builder(Kind::Contribution)
            .op(op)
            .dtype(dtype)
            .job(4)
            .message(message)
            .member(m)
            .shadow(shadow)
            .count(values.len() as u16)
            .build();
        frame(&member(m), PORT, &contribution(h, values))
    };
    let bad_op = sw.counter(Counter::DropBadOp);
    // Round (0, 0) starts as max over i32.
    assert_eq!(
        sw.run(&c(0, 0, Op::Max, DType::I32, 0, &[5, -3])).action,
        XDP_DROP
    );
    // The same round as a sum: refused.
    assert_eq!(
        sw.run(&c(1, 0, Op::Sum, DType::I32, 0, &[1, 1])).action,
        XDP_DROP
    );
    assert_eq!(sw.counter(Counter::DropBadOp), bad_op + 1);
    // As max over u32: refused too (the type is fixed as well).
    assert_eq!(
        sw.run(&c(1, 0, Op::Max, DType::U32, 0, &[1, 1])).action,
        XDP_DROP
    );
    assert_eq!(sw.counter(Counter::DropBadOp), bad_op + 2);
    // As max over i32: completes with the maximum.
    let r = sw.run(&c(1, 0, Op::Max, DType::I32, 0, &[1, 7]));
    assert_eq!(r.action, XDP_REDIRECT);
    assert_eq!(
        &r.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 8],
        &[5, 0, 0, 0, 7, 0, 0, 0]
    );
    // Message 1 on the other shadow copy reduces xor. Job 5's segments hold 10 i32 (40
    // bytes): a product of i64 carries 5 of its 8-byte lanes, not 6.
    let r1 = sw.run(&c(0, 1, Op::Xor, DType::U32, 1, &[0b1100]));
    let r2 = sw.run(&c(1, 1, Op::Xor, DType::U32, 1, &[0b1010]));
    assert_eq!((r1.action, r2.action), (XDP_DROP, XDP_REDIRECT));
    assert_eq!(
        &r2.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4],
        &[0b0110, 0, 0, 0]
    );
    let wide = |m: u8, n: usize| {
        let h = Header::builder(Kind::Contribution)
            .op(Op::Prod)
            .dtype(DType::I64)
            .job(5)
            .member(m)
            .count(n as u16)
            .build();
        let bytes: Vec<u8> = (0..n).flat_map(|i| (i as i64 + 2).to_le_bytes()).collect();
        let mut p = vec![0u8; wire::HEADER_LEN + bytes.len() + 8];
        let len = wire::encode(&h, &bytes, &mut p).unwrap();
        p.truncate(len);
        frame(&member(m), PORT, &p)
    };
    sw.add_job(5, job(2, Op::Sum, DType::I32, 10, 1, 1));
    let bad_count = sw.counter(Counter::DropBadCount);
    assert_eq!(sw.run(&wide(0, 6)).action, XDP_DROP);
    assert_eq!(sw.counter(Counter::DropBadCount), bad_count + 1);
    assert_eq!(sw.run(&wide(0, 5)).action, XDP_DROP);
    let r = sw.run(&wide(1, 5));
    assert_eq!(r.action, XDP_REDIRECT);
    assert_eq!(
        &r.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 8],
        &4i64.to_le_bytes()
    );
}

/// A job id is its dense index and a generation: an id of the index's earlier generation
/// names no job (a member of a removed job cannot reach the one that took its index).
#[test]
fn a_stale_job_id_names_no_job() {
    if !require_root("a_stale_job_id_names_no_job") {
        return;
    }
    let mut sw = load_switch();
    let jid = xagg_common::job::job_id(3, 2);
    sw.add_job(jid, job(2, Op::Sum, DType::I32, 4, 0, 1));
    let c = |id: u32| {
        let h = Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(id)
            .member(0)
            .count(4)
            .build();
        frame(&member(0), PORT, &contribution(h, &[1, 2, 3, 4]))
    };
    let unknown = sw.counter(Counter::DropUnknownJob);
    for stale in [
        xagg_common::job::job_id(3, 1),
        3,
        xagg_common::job::job_id(4, 2),
    ] {
        assert_eq!(sw.run(&c(stale)).action, XDP_DROP);
    }
    assert_eq!(sw.counter(Counter::DropUnknownJob), unknown + 3);
    assert_eq!(sw.counter(Counter::Contribution), 0);
    assert_eq!(
        sw.run(&c(jid)).action,
        XDP_DROP,
        "added: waits for member 1"
    );
    assert_eq!(sw.counter(Counter::Contribution), 1);
}

/// Segments past one XDP buffer (a 9000-byte MTU's full segment, which BPF_PROG_RUN splits
/// as veth does past 3520 bytes of frame): staged out of the frame, aggregated, and the
/// result written back over every buffer — passed to the kernel for `xagg_fanout`, or
/// sent back to a member that asks again.
#[test]
fn multi_buffer_segments() {
    if !require_root("multi_buffer_segments") {
        return;
    }
    let mut sw = load_switch();
    let n = wire::MAX_PAYLOAD / 4;
    sw.add_job(8, job(2, Op::Sum, DType::I32, n as u16, 20, 2));
    let contrib = |m: u8, vals: &[i32]| {
        let mut h = hdr(m, 1, 0, vals.len() as u16);
        h.set_job(8);
        frame(&member(m), PORT, &contribution(h, vals))
    };
    let first = contrib(0, &values(0, n));
    assert!(first.len() > 3520, "a multi-buffer frame");
    check(
        &mut sw,
        &Case {
            what: "multi-buffer, first",
            frame: first.clone(),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    let s = sw.slot(21);
    assert_eq!(s.shadow[0].state, ShadowState::Filling as u32);
    assert_eq!(s.shadow[0].count, n as u32);
    let last_word = s.shadow[0].data[n / 2 - 1];
    let v = values(0, n);
    assert_eq!(
        last_word,
        (v[n - 2] as u32 as u64) | ((v[n - 1] as u32 as u64) << 32),
        "the slot holds the last buffer's words"
    );
    let done = check(
        &mut sw,
        &Case {
            what: "multi-buffer, completing",
            frame: contrib(1, &values(1, n)),
            action: XDP_PASS,
            counter: Counter::Complete,
        },
    );
    // In front of the frame, the metadata marking it as the switch's own result for
    // `xagg_fanout` (BPF_PROG_RUN hands it back with the frame): the mark and the job.
    assert_eq!(done.out.len(), first.len());
    let mark = [0x7861_7272u32.to_ne_bytes(), 8u32.to_ne_bytes()].concat();
    assert_eq!(done.meta, mark, "marked as its own result of job 8");
    assert_eq!(
        done.out[PAYLOAD_OFFSET - wire::HEADER_LEN + 1],
        Kind::Result as u8
    );
    assert_eq!(
        &done.out[26..30],
        &xagg_lab::testrun::SWITCH_IP.octets(),
        "from the switch"
    );
    assert_eq!(payload_i32(&done.out, n), sum(2, n));
    let replay = check(
        &mut sw,
        &Case {
            what: "multi-buffer, asked again",
            frame: first,
            action: XDP_TX,
            counter: Counter::ResultReplay,
        },
    );
    assert_eq!(payload_i32(&replay.out, n), sum(2, n));
    assert_eq!(&replay.out[30..34], &member(0).ip, "back to the member");

    // Another fold over 64-bit lanes: the max of i64, a full segment.
    let k = wire::MAX_PAYLOAD / 8;
    sw.add_job(9, job(2, Op::Max, DType::I64, k as u16, 30, 1));
    let vals = |m: u8| -> Vec<i64> {
        (0..k as i64)
            .map(|i| if (i + m as i64) % 2 == 0 { i << 40 } else { -i })
            .collect()
    };
    let c64 = |m: u8| {
        let h = Header::builder(Kind::Contribution)
            .op(Op::Max)
            .dtype(DType::I64)
            .job(9)
            .member(m)
            .count(k as u16)
            .build();
        let bytes: Vec<u8> = vals(m).iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut p = vec![0u8; wire::HEADER_LEN + bytes.len()];
        let len = wire::encode(&h, &bytes, &mut p).unwrap();
        p.truncate(len);
        frame(&member(m), PORT, &p)
    };
    assert_eq!(sw.run(&c64(0)).action, XDP_DROP);
    let r = sw.run(&c64(1));
    assert_eq!(r.action, XDP_PASS);
    assert_eq!(r.meta.len(), 8, "marked as the switch's own result");
    let got: Vec<i64> = r.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 8 * k]
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<i64> = vals(0)
        .iter()
        .zip(vals(1))
        .map(|(a, b)| (*a).max(b))
        .collect();
    assert_eq!(got, want);
}
