//! BPF_PROG_RUN table tests of `xagg_switch`: each row is a description, an input frame,
//! the expected action, the counter it must bump, and where they matter what the output
//! frame and the slots must hold after it. A table runs its rows in order: each builds on
//! the slot state the rows before it left.

use xagg_common::{
    job::job_id,
    slot::ShadowState,
    wire::{self, DType, Header, Kind, Op, FLAG_SHADOW, PAYLOAD_OFFSET},
    Counter,
};
use xagg_tests::*;

/// The main table's job, and the elements of its segments.
const JID: u32 = 7;
const ELEMENTS: u16 = 256;

fn header(job: u32, member: u8, slot: u16, segment: u32, count: u16) -> Header {
    Header::builder(Kind::Contribution)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(job)
        .message(1)
        .segment(segment)
        .slot(slot)
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

/// Member `m`'s contribution to job 7, sent from `sender`'s addresses.
fn contrib_from(sender: u8, m: u8, slot: u16, segment: u32, vals: &[i32]) -> Vec<u8> {
    let h = header(JID, m, slot, segment, vals.len() as u16);
    frame(&member(sender), PORT, &contribution(h, vals))
}

/// Member `m`'s contribution to job 7.
fn contrib(m: u8, slot: u16, segment: u32, vals: &[i32]) -> Vec<u8> {
    contrib_from(m, m, slot, segment, vals)
}

/// Member 2's contribution to slot 2, segment 0 of job 7, its header edited by `edit`.
fn edited(edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut h = header(JID, 2, 2, 0, ELEMENTS);
    edit(&mut h);
    let vals = values(2, ELEMENTS.into());
    frame(&member(2), PORT, &contribution(h, &vals))
}

/// Member `m`'s contribution to slot 2 of job 7 on shadow copy 1.
fn on_shadow_1(m: u8, segment: u32, vals: &[i32]) -> Vec<u8> {
    let mut h = header(JID, m, 2, segment, vals.len() as u16);
    h.flags = FLAG_SHADOW;
    frame(&member(m), PORT, &contribution(h, vals))
}

/// `frame` cut to its first `len` bytes.
fn cut(mut frame: Vec<u8>, len: usize) -> Vec<u8> {
    frame.truncate(len);
    frame
}

/// An ARP request from member 1.
fn arp() -> Vec<u8> {
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&member(1).mac);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    arp
}

#[test]
fn switch_program_table() {
    if !require_root("switch_program_table") {
        return;
    }
    use {After::Unchanged, Counter::*, ShadowState::*};
    let mut sw = load_switch();
    let n = ELEMENTS as usize;
    // Job 7: three members, slots 10..14 of the switch.
    sw.add_job(JID, job(3, Op::Sum, DType::I32, ELEMENTS, 10, 4));
    let v = |m: u8| values(m, n);
    let full = contrib(2, 2, 0, &v(2));
    // A table, one row to a line or two: rustfmt would spread each over six.
    #[rustfmt::skip]
    let rows = [
        // First contribution: copied into slot 10+2, shadow copy 0; the neighbour slot
        // untouched.
        row("first contribution", contrib(0, 2, 0, &v(0)), XDP_DROP, Contribution)
            .after([copy(12, 0, Filling, 0, 0b001, n), copy(13, 0, Empty, 0, 0, 0)]),
        // Middle contribution: added.
        row("middle contribution", contrib(1, 2, 0, &v(1)), XDP_DROP, Contribution)
            .after([copy(12, 0, Filling, 0, 0b011, n)]),
        // Duplicate from member 1: never added twice.
        row("duplicate", contrib(1, 2, 0, &v(1)), XDP_DROP, DropDuplicate)
            .after([Unchanged(12)]),
        // Non-member: member index 5 of a 3-member job.
        row("non-member index", contrib(5, 2, 0, &v(2)), XDP_DROP, DropNotMember)
            .after([Unchanged(12)]),
        // Spoofed: claims member 2 but comes from member 0's addresses.
        row("spoofed member", contrib_from(0, 2, 2, 0, &v(2)), XDP_DROP, DropNotMember)
            .after([Unchanged(12)]),
        row("unknown job", edited(|h| h.set_job(99)), XDP_DROP, DropUnknownJob)
            .after([Unchanged(12)]),
        // Slot outside the job's range (4 slots: slot 4 would be slot 14, another job's).
        row("slot out of range", contrib(2, 4, 0, &v(2)), XDP_DROP, DropSlotRange)
            .after([Unchanged(12)]),
        // Truncated inside the collective header.
        row("truncated", cut(full.clone(), PAYLOAD_OFFSET - 5), XDP_DROP, DropTruncated)
            .after([Unchanged(12)]),
        // Wrong version, wrong op, bad count, bad length.
        row("bad version", edited(|h| h.version = 9), XDP_DROP, DropBadVersion)
            .after([Unchanged(12)]),
        row("op mismatch", edited(|h| h.op = Op::Xor as u8), XDP_DROP, DropBadOp)
            .after([Unchanged(12)]),
        row("count above segment", contrib(2, 2, 0, &values(2, n + 2)), XDP_DROP, DropBadCount)
            .after([Unchanged(12)]),
        row("payload shorter than count", cut(full.clone(), full.len() - 8), XDP_DROP,
            DropTruncated)
            .after([Unchanged(12)]),
        row("payload longer than count", edited(|h| h.set_count(10)), XDP_DROP, DropBadLength)
            .after([Unchanged(12), copy(12, 0, Filling, 0, 0b011, n)]),
        // Non-collective traffic passes untouched: another UDP port, and ARP.
        row("other UDP port", frame(&member(2), 53, &[1, 2, 3, 4]), XDP_PASS, Pass)
            .out([Out::Untouched]),
        row("ARP", arp(), XDP_PASS, Pass)
            .out([Out::Untouched]),
        // The completing contribution: broadcast; the frame is the result, from the switch.
        row("completing contribution", full, XDP_REDIRECT, Complete)
            .out([
                payload(i32s(&sum(3, n))),
                Out::Kind(Kind::Result),
                Out::Round(JID, 1, 0, 2, ELEMENTS),
                Out::Bytes(26, SWITCH_IP.octets().into(), "result comes from the switch"),
                Out::Bytes(34, PORT.to_be_bytes().into(), "from the collective port"),
            ])
            .after([copy(12, 0, Done, 0, 0b111, n)]),
        // A retransmission to the finished shadow copy: the stored result, to that member
        // only.
        row("retransmission after completion", contrib(0, 2, 0, &v(0)), XDP_TX, ResultReplay)
            .out([
                payload(i32s(&sum(3, n))),
                Out::Bytes(0, member(0).mac.into(), "to member 0's MAC"),
                Out::Bytes(6, SWITCH_MAC.into(), "from the switch's MAC"),
                Out::Bytes(30, member(0).ip.into(), "to member 0's IP"),
                Out::Ipv4Checksum,
                Out::Bytes(40, vec![0, 0], "UDP checksum zero"),
            ]),
        // The next use of slot 12 goes to the other shadow copy; copy 0 keeps its result
        // meanwhile.
        row("next round, other shadow copy, short segment", on_shadow_1(0, 4, &[1, 2, 3]),
            XDP_DROP, Contribution)
            .after([copy(12, 1, Filling, 4, 0b001, 3), copy(12, 0, Done, 0, 0b111, n)]),
        // A late packet from an older round is stale, not a new round.
        row("stale round", on_shadow_1(1, 0, &[1, 2, 3]), XDP_DROP, DropStale)
            .after([Unchanged(12)]),
    ];
    run_table(&mut sw, &rows);
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
    let only = frame(&member(0), PORT, &contribution(h, &[-5]));
    #[rustfmt::skip]
    let rows = [
        row("the only member's contribution", only, XDP_REDIRECT, Counter::Complete)
            .out([payload(i32s(&[-5]))]),
    ];
    run_table(&mut sw, &rows);
}

/// Every message carries its op and type: the first contribution of a round fixes them, a
/// contribution of the same round that disagrees is dropped (`drop_bad_op`), and the next
/// round on the same shadow copy may reduce another pair. One job, created for i32 sums.
#[test]
fn op_and_type_are_fixed_per_round() {
    if !require_root("op_and_type_are_fixed_per_round") {
        return;
    }
    use {Counter::*, DType::*, Op::*};
    let mut sw = load_switch();
    sw.add_job(4, job(2, Sum, I32, 860, 0, 1));
    // Job 5's segments hold 10 i32 (40 bytes): a product of i64 carries 5 of its 8-byte
    // lanes, not 6.
    sw.add_job(5, job(2, Sum, I32, 10, 1, 1));
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
    let wide = |m: u8, n: usize| {
        let h = Header::builder(Kind::Contribution)
            .op(Prod)
            .dtype(I64)
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
    #[rustfmt::skip]
    let rows = [
        // Round (0, 0) starts as max over i32.
        row("round (0, 0) as max over i32", c(0, 0, Max, I32, 0, &[5, -3]), XDP_DROP, Contribution),
        // The same round as a sum: refused.
        row("the same round as sum", c(1, 0, Sum, I32, 0, &[1, 1]), XDP_DROP, DropBadOp),
        // As max over u32: refused too (the type is fixed as well).
        row("the same round as max over u32", c(1, 0, Max, U32, 0, &[1, 1]), XDP_DROP, DropBadOp),
        // As max over i32: completes with the maximum.
        row("the same round as max over i32", c(1, 0, Max, I32, 0, &[1, 7]), XDP_REDIRECT, Complete)
            .out([payload(i32s(&[5, 7]))]),
        // Message 1 on the other shadow copy reduces xor.
        row("message 1 as xor over u32", c(0, 1, Xor, U32, 1, &[0b1100]), XDP_DROP, Contribution),
        row("message 1 completing", c(1, 1, Xor, U32, 1, &[0b1010]), XDP_REDIRECT, Complete)
            .out([payload(i32s(&[0b0110]))]),
        // Job 5: a product of i64.
        row("6 lanes of i64 in 40 bytes", wide(0, 6), XDP_DROP, DropBadCount),
        row("5 lanes of i64", wide(0, 5), XDP_DROP, Contribution),
        row("5 lanes of i64, completing", wide(1, 5), XDP_REDIRECT, Complete)
            .out([payload(i64s(&[2 * 2]))]),
    ];
    run_table(&mut sw, &rows);
}

/// A job id is its dense index and a generation: an id of the index's earlier generation
/// names no job (a member of a removed job cannot reach the one that took its index).
#[test]
fn a_stale_job_id_names_no_job() {
    if !require_root("a_stale_job_id_names_no_job") {
        return;
    }
    use Counter::*;
    let mut sw = load_switch();
    let jid = job_id(3, 2);
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
    #[rustfmt::skip]
    let rows = [
        row("index 3, earlier generation 1", c(job_id(3, 1)), XDP_DROP, DropUnknownJob),
        row("index 3, earlier generation 0", c(3), XDP_DROP, DropUnknownJob),
        row("index 4, holding no job", c(job_id(4, 2)), XDP_DROP, DropUnknownJob),
        // Added: waits for member 1.
        row("the job's own id", c(jid), XDP_DROP, Contribution),
    ];
    run_table(&mut sw, &rows);
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
    use Counter::*;
    let mut sw = load_switch();
    let n = wire::MAX_PAYLOAD / 4;
    sw.add_job(8, job(2, Op::Sum, DType::I32, n as u16, 20, 2));
    // Another fold over 64-bit lanes: the max of i64, a full segment.
    let k = wire::MAX_PAYLOAD / 8;
    sw.add_job(9, job(2, Op::Max, DType::I64, k as u16, 30, 1));
    let contrib = |m: u8| {
        let h = header(8, m, 1, 0, n as u16);
        frame(&member(m), PORT, &contribution(h, &values(m, n)))
    };
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
        let bytes = i64s(&vals(m));
        let mut p = vec![0u8; wire::HEADER_LEN + bytes.len()];
        let len = wire::encode(&h, &bytes, &mut p).unwrap();
        p.truncate(len);
        frame(&member(m), PORT, &p)
    };
    let first = contrib(0);
    // Not a row's expectation but the rows' premise: they test nothing of several buffers
    // unless the frame spans them.
    assert!(first.len() > 3520, "a multi-buffer frame");
    let v = values(0, n);
    let last_word = (v[n - 2] as u32 as u64) | ((v[n - 1] as u32 as u64) << 32);
    let max: Vec<i64> = vals(0)
        .iter()
        .zip(vals(1))
        .map(|(a, b)| (*a).max(b))
        .collect();
    #[rustfmt::skip]
    let rows = [
        row("multi-buffer, first", first.clone(), XDP_DROP, Contribution)
            .after([
                copy(21, 0, ShadowState::Filling, 0, 0b01, n),
                After::Word(21, 0, n / 2 - 1, last_word, "the slot holds the last buffer's words"),
            ]),
        row("multi-buffer, completing", contrib(1), XDP_PASS, Complete)
            .out([
                Out::Len(first.len()),
                Out::Meta(own_result(8)),
                Out::Kind(Kind::Result),
                Out::Bytes(26, SWITCH_IP.octets().into(), "from the switch"),
                payload(i32s(&sum(2, n))),
            ]),
        row("multi-buffer, asked again", first, XDP_TX, ResultReplay)
            .out([
                payload(i32s(&sum(2, n))),
                Out::Bytes(30, member(0).ip.into(), "back to the member"),
            ]),
        row("i64 max, first", c64(0), XDP_DROP, Contribution),
        row("i64 max, completing", c64(1), XDP_PASS, Complete)
            .out([Out::Meta(own_result(9)), payload(i64s(&max))]),
    ];
    run_table(&mut sw, &rows);
}

/// A member giving up on a round (its contribution sent again, marked `ENC_WITHDRAWN`, at
/// its collective timeout): while the round fills, the switch keeps the mark — its status
/// reply says so, and the late member's contribution completes the round with a result
/// that carries it, so every member fails that call; a round complete before is answered
/// with its result, unmarked, and the call succeeds everywhere.
#[test]
fn a_member_giving_up_marks_the_round() {
    if !require_root("a_member_giving_up_marks_the_round") {
        return;
    }
    use Counter::*;
    let mut sw = load_switch();
    sw.add_job(JID, job(3, Op::Sum, DType::I32, ELEMENTS, 0, 4));
    let v = |m: u8| values(m, 4);
    let giving_up = |m: u8, slot: u16| {
        let mut h = header(JID, m, slot, 0, 4);
        h.set_enc_flags(wire::ENC_WITHDRAWN);
        frame(&member(m), PORT, &contribution(h, &v(m)))
    };
    let query = |m: u8, slot: u16| {
        let h = Header::builder(Kind::StatusQuery)
            .job(JID)
            .message(1)
            .slot(slot)
            .member(m)
            .build();
        frame(&member(m), PORT, &[&h.to_bytes()[..], &[0u8; 16]].concat())
    };
    // The header's enc_flags, big-endian, in the output frame.
    let flags = |f: u16| {
        Out::Bytes(
            PAYLOAD_OFFSET - wire::HEADER_LEN + 25,
            f.to_be_bytes().to_vec(),
            "enc_flags",
        )
    };
    #[rustfmt::skip]
    let rows = [
        row("member 0 on slot 0", contrib(0, 0, 0, &v(0)), XDP_DROP, Contribution),
        row("member 1 on slot 0", contrib(1, 0, 0, &v(1)), XDP_DROP, Contribution),
        row("member 0 gives up", giving_up(0, 0), XDP_DROP, DropDuplicate),
        row("member 0 asks", query(0, 0), XDP_TX, StatusReply)
            .out([Out::Status(ShadowState::Filling), flags(wire::ENC_WITHDRAWN)]),
        row("the late member 2 completes it", contrib(2, 0, 0, &v(2)), XDP_REDIRECT, Complete)
            .out([payload(i32s(&sum(3, 4))), flags(wire::ENC_WITHDRAWN)]),
        // Slot 1: complete before member 0 gives up.
        row("member 0 on slot 1", contrib(0, 1, 0, &v(0)), XDP_DROP, Contribution),
        row("member 1 on slot 1", contrib(1, 1, 0, &v(1)), XDP_DROP, Contribution),
        row("member 2 completes slot 1", contrib(2, 1, 0, &v(2)), XDP_REDIRECT, Complete)
            .out([flags(0)]),
        row("member 0 gives up too late", giving_up(0, 1), XDP_TX, ResultReplay)
            .out([payload(i32s(&sum(3, 4))), flags(0)]),
    ];
    run_table(&mut sw, &rows);
}
