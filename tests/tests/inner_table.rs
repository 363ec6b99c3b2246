//! BPF_PROG_RUN table of an inner level (`Role::Inner`: a host reducing its ranks, a lower
//! switch): every row of the inner-level table in `dataplane-ebpf/xdp/src/slot.rs` — the
//! partial goes to the parent, never to a member; a resend re-sends it; the parent's
//! result is taken only from the parent, only for a round that sent its partial, and is
//! what members get from then on.

use xagg_common::{
    job::MemberAddr,
    slot::ShadowState,
    wire::{self, DType, Header, Kind, Op, FLAG_SHADOW, PAYLOAD_OFFSET},
    Counter,
};
use xagg_lab::testrun::{SWITCH_IP, SWITCH_MAC};
use xagg_tests::*;

/// This level's job, and its id and member index at the parent.
const JID: u32 = 3;
/// A ring host's neighbours' ids of its job: each host numbers its jobs itself.
const PRED_JOB: u32 = 0x0004_0008;
const SUCC_JOB: u32 = 0x0003_0007;
const PARENT_JOB: u32 = 0x0002_0005;
const PARENT_MEMBER: u8 = 6;
const SEG: u16 = 128;

/// The parent, behind BPF_PROG_RUN's ingress port (loopback) like the members.
fn parent() -> MemberAddr {
    MemberAddr {
        ifindex: 1,
        ip: [10, 0, 9, 1],
        mac: [0x02, 0, 0, 0, 9, 1],
        port: wire::DEFAULT_PORT.to_be_bytes(),
    }
}

fn header(kind: Kind, job: u32, member: u8, slot: u16, segment: u32, count: u16) -> Header {
    Header::builder(kind)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(job)
        .message(4)
        .segment(segment)
        .slot(slot)
        .member(member)
        .count(count)
        .build()
}

fn values(member: u8, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| (i as i32 - 40) * 7919 + member as i32 * 1_000_003)
        .collect()
}

fn partial(members: u8, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| (0..members).fold(0i32, |s, m| s.wrapping_add(values(m, n)[i])))
        .collect()
}

/// What the parent sends down: another job's whole result (here: the partial times 3, as
/// if two more hosts had added as much).
fn final_result(n: usize) -> Vec<i32> {
    partial(2, n).iter().map(|v| v.wrapping_mul(3)).collect()
}

fn contrib(m: u8, slot: u16, segment: u32, vals: &[i32]) -> Vec<u8> {
    let h = header(Kind::Contribution, JID, m, slot, segment, vals.len() as u16);
    frame(&member(m), PORT, &contribution(h, vals))
}

fn from_parent(from: &MemberAddr, job: u32, slot: u16, segment: u32, vals: &[i32]) -> Vec<u8> {
    let h = header(Kind::Result, job, 0, slot, segment, vals.len() as u16);
    frame(from, PORT, &contribution(h, vals))
}

/// Checks that `out` is this level's contribution to the parent carrying `vals`.
fn is_partial(out: &[u8], vals: &[i32], what: &str) {
    let h = Header::from_bytes(&out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(
        h.kind,
        Kind::Contribution as u8,
        "{what}: a contribution upward"
    );
    assert_eq!(
        (h.job(), h.member, h.slot(), h.message(), h.count()),
        (PARENT_JOB, PARENT_MEMBER, 2, 4, SEG),
        "{what}: the parent's job and member index; slot, message, count unchanged"
    );
    assert_eq!(&out[0..6], &parent().mac, "{what}: to the parent's MAC");
    assert_eq!(&out[6..12], &SWITCH_MAC, "{what}: from this level's MAC");
    assert_eq!(&out[26..30], &SWITCH_IP.octets(), "{what}: from this level");
    assert_eq!(&out[30..34], &parent().ip, "{what}: to the parent's IP");
    assert_eq!(&out[36..38], &parent().port, "{what}: to the parent's port");
    assert_eq!(
        ipv4_checksum(&out[14..34]),
        0,
        "{what}: valid IPv4 checksum"
    );
    assert_eq!(payload_i32(out, vals.len()), vals, "{what}: the partial");
}

#[test]
fn inner_level_table() {
    if !require_root("inner_level_table") {
        return;
    }
    let mut sw = load_switch();
    let n = SEG as usize;
    // Two members (ranks), slots 40..44.
    sw.add_inner_job(
        JID,
        job(2, Op::Sum, DType::I32, SEG, 40, 4),
        parent(),
        PARENT_JOB,
        PARENT_MEMBER,
    );
    let state = |sw: &Switch| {
        let s = sw.slot(42).shadow[0];
        (ShadowState::from_u32(s.state).unwrap(), s.seen)
    };

    check(
        &mut sw,
        &Case {
            what: "first contribution",
            frame: contrib(0, 2, 0, &values(0, n)),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    assert_eq!(state(&sw), (ShadowState::Filling, 0b01));
    // The parent's result before the partial went up: not awaited.
    check(
        &mut sw,
        &Case {
            what: "result before the partial",
            frame: from_parent(&parent(), PARENT_JOB, 2, 0, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );
    assert_eq!(state(&sw), (ShadowState::Filling, 0b01));

    // The last member: the partial goes up (out of the port it came in on: XDP_TX).
    let r = check(
        &mut sw,
        &Case {
            what: "completing contribution",
            frame: contrib(1, 2, 0, &values(1, n)),
            action: XDP_TX,
            counter: Counter::Partial,
        },
    );
    is_partial(&r.out, &partial(2, n), "partial");
    assert_eq!(state(&sw), (ShadowState::PartialSent, 0b11));

    // A member's resend while the partial is out: the partial again, to the parent —
    // never to the member.
    let r = check(
        &mut sw,
        &Case {
            what: "resend while PartialSent",
            frame: contrib(0, 2, 0, &values(0, n)),
            action: XDP_TX,
            counter: Counter::PartialResend,
        },
    );
    is_partial(&r.out, &partial(2, n), "partial again");
    assert_eq!(state(&sw), (ShadowState::PartialSent, 0b11));

    // Results not from the parent.
    check(
        &mut sw,
        &Case {
            what: "result from a member (spoofed)",
            frame: from_parent(&member(1), PARENT_JOB, 2, 0, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
    let mut elsewhere = parent();
    elsewhere.port = 47999u16.to_be_bytes();
    check(
        &mut sw,
        &Case {
            what: "result from the parent's IP but another port",
            frame: from_parent(&elsewhere, PARENT_JOB, 2, 0, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
    check(
        &mut sw,
        &Case {
            what: "result naming the local job id",
            frame: from_parent(&parent(), JID, 2, 0, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
    check(
        &mut sw,
        &Case {
            what: "result for another segment",
            frame: from_parent(&parent(), PARENT_JOB, 2, 1, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );
    check(
        &mut sw,
        &Case {
            what: "result with another count",
            frame: from_parent(&parent(), PARENT_JOB, 2, 0, &final_result(n - 2)),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );
    assert_eq!(state(&sw), (ShadowState::PartialSent, 0b11));
    assert_eq!(
        &sw.slot(42).shadow[0].data[..2],
        &[
            partial(2, n)[0] as u32 as u64 | (partial(2, n)[1] as u32 as u64) << 32,
            partial(2, n)[2] as u32 as u64 | (partial(2, n)[3] as u32 as u64) << 32
        ],
        "refused results leave the partial"
    );

    // The parent's result: stored over the partial, broadcast to the members.
    let r = check(
        &mut sw,
        &Case {
            what: "the parent's result",
            frame: from_parent(&parent(), PARENT_JOB, 2, 0, &final_result(n)),
            action: XDP_REDIRECT,
            counter: Counter::ParentResult,
        },
    );
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(h.kind, Kind::Result as u8);
    // Named by this level's id, which the members and the egress program know it by.
    assert_eq!(h.job(), JID, "the job renamed on its way down");
    assert_eq!(&r.out[26..30], &SWITCH_IP.octets(), "from this level");
    assert_eq!(payload_i32(&r.out, n), final_result(n));
    assert_eq!(state(&sw), (ShadowState::Done, 0b11));
    check(
        &mut sw,
        &Case {
            what: "the parent's result again",
            frame: from_parent(&parent(), PARENT_JOB, 2, 0, &final_result(n)),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );
    // A member's resend now: the parent's result, to that member.
    let r = check(
        &mut sw,
        &Case {
            what: "resend after the result",
            frame: contrib(1, 2, 0, &values(1, n)),
            action: XDP_TX,
            counter: Counter::ResultReplay,
        },
    );
    assert_eq!(payload_i32(&r.out, n), final_result(n));
    assert_eq!(&r.out[30..34], &member(1).ip, "to the member");

    // Slot 3: the partial goes out, then the members abandon the round (a failed
    // allreduce) and start a newer one on the same copy: reclaimed.
    check(
        &mut sw,
        &Case {
            what: "slot 3, first",
            frame: contrib(0, 3, 0, &values(0, n)),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    check(
        &mut sw,
        &Case {
            what: "slot 3, partial",
            frame: contrib(1, 3, 0, &values(1, n)),
            action: XDP_TX,
            counter: Counter::Partial,
        },
    );
    let mut h = header(Kind::Contribution, JID, 0, 3, 0, SEG);
    h.set_message(6);
    check(
        &mut sw,
        &Case {
            what: "a newer round over PartialSent",
            frame: frame(&member(0), PORT, &contribution(h, &values(0, n))),
            action: XDP_DROP,
            counter: Counter::SlotReclaimed,
        },
    );
    assert_eq!(
        ShadowState::from_u32(sw.slot(43).shadow[0].state),
        Some(ShadowState::Filling)
    );
    // The old round's result arrives late: not awaited any more.
    let h = header(Kind::Result, PARENT_JOB, 0, 3, 0, SEG);
    check(
        &mut sw,
        &Case {
            what: "result of the abandoned round",
            frame: frame(&parent(), PORT, &contribution(h, &final_result(n))),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );

    // The other shadow copy is independent: slot 2's copy 1 fills while copy 0 is done.
    let mut h = header(Kind::Contribution, JID, 0, 2, 1, SEG);
    h.flags = FLAG_SHADOW;
    check(
        &mut sw,
        &Case {
            what: "the other copy",
            frame: frame(&member(0), PORT, &contribution(h, &values(0, n))),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    assert_eq!(state(&sw), (ShadowState::Done, 0b11));

    // A status query sees PartialSent (slot 3's copy 1 is empty; slot 1 sends a partial).
    check(
        &mut sw,
        &Case {
            what: "slot 1, partial",
            frame: contrib(0, 1, 0, &values(0, n)),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    sw.run(&contrib(1, 1, 0, &values(1, n)));
    let q = header(Kind::StatusQuery, JID, 0, 1, 0, 0);
    let mut p = vec![0u8; wire::HEADER_LEN + 16];
    p[..wire::HEADER_LEN].copy_from_slice(&q.to_bytes());
    let r = check(
        &mut sw,
        &Case {
            what: "status query",
            frame: frame(&member(0), PORT, &p),
            action: XDP_TX,
            counter: Counter::StatusReply,
        },
    );
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(h.status, ShadowState::PartialSent as u8);

    // The same query, forwardable: it goes to the parent as this level's, the asker kept.
    let mut q = header(Kind::StatusQuery, JID, 1, 1, 0, 0);
    q.flags |= wire::FLAG_FORWARD;
    p[..wire::HEADER_LEN].copy_from_slice(&q.to_bytes());
    let r = check(
        &mut sw,
        &Case {
            what: "forwardable status query while PartialSent",
            frame: frame(&member(1), PORT, &p),
            action: XDP_TX,
            counter: Counter::StatusForward,
        },
    );
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(
        (h.kind, h.job(), h.member, h.relay),
        (Kind::StatusQuery as u8, PARENT_JOB, PARENT_MEMBER, 2),
        "this level's query to the parent, for member 1"
    );
    assert_eq!(&r.out[30..34], &parent().ip, "to the parent");
    // The parent's answer (it waits for its member 3): handed to member 1 as the level
    // above's.
    let mut reply = header(Kind::StatusReply, PARENT_JOB, PARENT_MEMBER, 1, 0, 0);
    reply.relay = 2;
    reply.status = ShadowState::Filling as u8;
    p[..wire::HEADER_LEN].copy_from_slice(&reply.to_bytes());
    p[wire::HEADER_LEN..wire::HEADER_LEN + 8].copy_from_slice(&0b0111_u64.to_le_bytes());
    p[wire::HEADER_LEN + 8..].copy_from_slice(&0b1111_u64.to_le_bytes());
    let r = check(
        &mut sw,
        &Case {
            what: "the parent's answer, relayed",
            frame: frame(&parent(), PORT, &p),
            action: XDP_REDIRECT,
            counter: Counter::StatusRelay,
        },
    );
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(
        (h.kind, h.job(), h.member, h.relay, h.above),
        (Kind::StatusReply as u8, JID, 1, 0, 1),
        "member 1's job here, marked as the level above's"
    );
    assert_eq!(&r.out[30..34], &member(1).ip, "to member 1");
    assert_eq!(
        &r.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 16],
        &p[wire::HEADER_LEN..],
        "the parent's view, unchanged"
    );
    // The same from anyone but the parent, or for a member not in the job: dropped.
    check(
        &mut sw,
        &Case {
            what: "a relayed answer from a member",
            frame: frame(&member(0), PORT, &p),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
    let mut bad = reply;
    bad.relay = 9;
    p[..wire::HEADER_LEN].copy_from_slice(&bad.to_bytes());
    check(
        &mut sw,
        &Case {
            what: "a relayed answer for a member not in the job",
            frame: frame(&parent(), PORT, &p),
            action: XDP_DROP,
            counter: Counter::DropNotMember,
        },
    );
}

/// A level with one member (a host with one rank) sends its partial at once; a result
/// for a root job (no parent) is refused.
#[test]
fn one_member_and_root_jobs() {
    if !require_root("one_member_and_root_jobs") {
        return;
    }
    let mut sw = load_switch();
    let n = 5;
    sw.add_inner_job(
        JID,
        job(1, Op::Sum, DType::I32, SEG, 0, 4),
        parent(),
        PARENT_JOB,
        PARENT_MEMBER,
    );
    let r = check(
        &mut sw,
        &Case {
            what: "one member",
            frame: contrib(0, 2, 0, &values(0, n)),
            action: XDP_TX,
            counter: Counter::Partial,
        },
    );
    assert_eq!(payload_i32(&r.out, n), values(0, n));
    sw.add_job(9, job(2, Op::Sum, DType::I32, SEG, 8, 4));
    check(
        &mut sw,
        &Case {
            what: "result to a root job",
            frame: from_parent(&parent(), 9, 0, 0, &values(0, n)),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
}

/// Multi-buffer segments (a full 8928-byte payload) take the same path: the partial and
/// its resend leave whole, the parent's result is stored and handed to the fan-out.
#[test]
fn inner_level_multi_buffer() {
    if !require_root("inner_level_multi_buffer") {
        return;
    }
    let mut sw = load_switch();
    let n = wire::MAX_PAYLOAD / 4;
    sw.add_inner_job(
        JID,
        job(2, Op::Sum, DType::I32, n as u16, 0, 4),
        parent(),
        PARENT_JOB,
        PARENT_MEMBER,
    );
    let c = |m: u8| {
        let h = header(Kind::Contribution, JID, m, 2, 0, n as u16);
        frame(&member(m), PORT, &contribution(h, &values(m, n)))
    };
    assert!(c(0).len() > 3520, "a multi-buffer frame");
    assert_eq!(sw.run(&c(0)).action, XDP_DROP);
    let r = sw.run(&c(1));
    assert_eq!(r.action, XDP_TX);
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!((h.kind, h.job()), (Kind::Contribution as u8, PARENT_JOB));
    assert_eq!(payload_i32(&r.out, n), partial(2, n), "the whole partial");
    let again = sw.run(&c(0));
    assert_eq!(again.action, XDP_TX);
    assert_eq!(payload_i32(&again.out, n), partial(2, n), "resent whole");
    let h = header(Kind::Result, PARENT_JOB, 0, 2, 0, n as u16);
    let result = frame(&parent(), PORT, &contribution(h, &final_result(n)));
    let r = sw.run(&result);
    assert_eq!(r.action, XDP_PASS, "to the fan-out");
    assert_eq!(r.meta.len(), 8, "marked as this level's own result");
    assert_eq!(&r.out[26..30], &SWITCH_IP.octets(), "from this level");
    let replay = sw.run(&c(1));
    assert_eq!(replay.action, XDP_TX);
    assert_eq!(
        payload_i32(&replay.out, n),
        final_result(n),
        "the stored result"
    );
}

/// A ring host (position 1 of 3, one rank): for each segment the chain starts at host
/// `segment mod 3`. Where it starts here, the rank's contribution is the partial and the
/// predecessor has no say; where it ends here, the predecessor's partial completes the
/// result; in between, the partial goes on. Results come from either neighbour.
#[test]
fn ring_host_table() {
    if !require_root("ring_host_table") {
        return;
    }
    let mut sw = load_switch();
    let n = 16;
    let pred = member(1);
    let succ = parent();
    sw.add_ring_job(
        JID,
        job(1, Op::Sum, DType::I32, SEG, 0, 4),
        (pred, succ),
        (PRED_JOB, SUCC_JOB),
        (3, 1),
        5,
    );
    let rank = |slot: u16, segment: u32| contrib(0, slot, segment, &values(0, n));
    // The predecessor's partial: member index 1 here (after the one rank).
    let from_pred = |slot: u16, segment: u32| {
        let h = header(Kind::Contribution, JID, 1, slot, segment, n as u16);
        frame(&pred, PORT, &contribution(h, &values(1, n)))
    };
    let to_succ = |out: &[u8], vals: &[i32], what: &str| {
        let h = Header::from_bytes(&out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
        assert_eq!(
            (h.kind, h.job(), h.member),
            (Kind::Contribution as u8, SUCC_JOB, 5),
            "{what}: a partial, as the successor's member 5, in its id of the job"
        );
        assert_eq!(&out[30..34], &succ.ip, "{what}: to the successor");
        assert_eq!(payload_i32(out, n), vals, "{what}");
    };

    // Segment 1 starts here: the rank's contribution is the whole partial.
    let r = check(
        &mut sw,
        &Case {
            what: "chain start: the rank",
            frame: rank(1, 1),
            action: XDP_TX,
            counter: Counter::Partial,
        },
    );
    to_succ(&r.out, &values(0, n), "chain start");
    check(
        &mut sw,
        &Case {
            what: "chain start: nothing from the predecessor",
            frame: from_pred(1, 1),
            action: XDP_DROP,
            counter: Counter::DropNotMember,
        },
    );

    // Segment 2 ends here (starts at host 2): the predecessor's partial completes it.
    check(
        &mut sw,
        &Case {
            what: "chain end: the rank",
            frame: rank(2, 2),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    let r = check(
        &mut sw,
        &Case {
            what: "chain end: the predecessor's partial",
            frame: from_pred(2, 2),
            action: XDP_REDIRECT,
            counter: Counter::Complete,
        },
    );
    assert_eq!(payload_i32(&r.out, n), partial(2, n), "the result");
    assert_eq!(
        ShadowState::from_u32(sw.slot(2).shadow[0].state),
        Some(ShadowState::Done)
    );
    // The predecessor asks again (its partial or our result was lost): the result, to it.
    let r = check(
        &mut sw,
        &Case {
            what: "chain end: the predecessor's resend",
            frame: from_pred(2, 2),
            action: XDP_TX,
            counter: Counter::ResultReplay,
        },
    );
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(
        (h.kind, h.job()),
        (Kind::Result as u8, PRED_JOB),
        "in the predecessor's id"
    );
    assert_eq!(&r.out[30..34], &pred.ip, "back to the predecessor");
    assert_eq!(payload_i32(&r.out, n), partial(2, n));

    // Segment 0 passes through (starts at host 0, ends at host 2).
    check(
        &mut sw,
        &Case {
            what: "middle: the predecessor's partial",
            frame: from_pred(0, 0),
            action: XDP_DROP,
            counter: Counter::Contribution,
        },
    );
    let r = check(
        &mut sw,
        &Case {
            what: "middle: the rank completes the partial",
            frame: rank(0, 0),
            action: XDP_TX,
            counter: Counter::Partial,
        },
    );
    to_succ(&r.out, &partial(2, n), "middle");
    let r = check(
        &mut sw,
        &Case {
            what: "middle: the predecessor's resend goes on",
            frame: from_pred(0, 0),
            action: XDP_TX,
            counter: Counter::PartialResend,
        },
    );
    to_succ(&r.out, &partial(2, n), "middle, again");
    let result = |from: &MemberAddr| from_parent(from, JID, 0, 0, &final_result(n)[..n]);
    check(
        &mut sw,
        &Case {
            what: "a result from a stranger",
            frame: result(&member(3)),
            action: XDP_DROP,
            counter: Counter::DropNotParent,
        },
    );
    let r = check(
        &mut sw,
        &Case {
            what: "the result from the successor (answering a resend)",
            frame: result(&succ),
            action: XDP_REDIRECT,
            counter: Counter::ParentResult,
        },
    );
    // Marked to go back to the predecessor, which may lack it too, not on.
    let h = Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..]).unwrap();
    assert_eq!(h.flags & wire::FLAG_BACKWARD, wire::FLAG_BACKWARD);
    assert_eq!(
        h.job(),
        JID,
        "named by this host's id until the egress renames it"
    );
    check(
        &mut sw,
        &Case {
            what: "the result from the predecessor, later",
            frame: result(&pred),
            action: XDP_DROP,
            counter: Counter::DropUnawaitedResult,
        },
    );
    let r = check(
        &mut sw,
        &Case {
            what: "the rank's resend: the result",
            frame: rank(0, 0),
            action: XDP_TX,
            counter: Counter::ResultReplay,
        },
    );
    assert_eq!(payload_i32(&r.out, n), final_result(n)[..n].to_vec());
}
