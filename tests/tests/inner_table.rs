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

/// A status query or reply from `from`: its header and the 16 bytes after it.
fn status(from: &MemberAddr, h: Header, body: &[u8; 16]) -> Vec<u8> {
    frame(from, PORT, &[&h.to_bytes()[..], body].concat())
}

/// This level's contribution to the parent carrying `vals`: a contribution upward, in the
/// parent's job and member index; slot, message, count unchanged.
fn partial_to_parent(vals: &[i32]) -> Vec<Out> {
    vec![
        Out::Kind(Kind::Contribution),
        Out::Round(PARENT_JOB, 4, 0, 2, SEG),
        Out::Member(PARENT_MEMBER),
        Out::Bytes(0, parent().mac.into(), "to the parent's MAC"),
        Out::Bytes(6, SWITCH_MAC.into(), "from this level's MAC"),
        Out::Bytes(26, SWITCH_IP.octets().into(), "from this level"),
        Out::Bytes(30, parent().ip.into(), "to the parent's IP"),
        Out::Bytes(36, parent().port.into(), "to the parent's port"),
        Out::Ipv4Checksum,
        payload(i32s(vals)),
    ]
}

/// The switch program with this level's job: two members (ranks), slots 40..44.
fn two_ranks_inner() -> Switch {
    let mut sw = load_switch();
    sw.add_inner_job(
        JID,
        job(2, Op::Sum, DType::I32, SEG, 40, 4),
        parent(),
        PARENT_JOB,
        PARENT_MEMBER,
    );
    sw
}

#[test]
fn inner_level_table() {
    if !require_root("inner_level_table") {
        return;
    }
    use {Counter::*, ShadowState::*};
    let mut sw = two_ranks_inner();
    let n = SEG as usize;
    // Slot 2 (42 of the switch), shadow copy 0: its state and the members seen.
    let slot_2 = |state, seen| [After::State(42, 0, state), After::Seen(42, 0, seen)];
    let partial = partial(2, n);
    let result = final_result(n);
    let mut elsewhere = parent();
    elsewhere.port = 47999u16.to_be_bytes();
    // The partial's first four elements, two to a word of the slot.
    let word = |i: usize| partial[2 * i] as u32 as u64 | (partial[2 * i + 1] as u32 as u64) << 32;
    let mut newer = header(Kind::Contribution, JID, 0, 3, 0, SEG);
    newer.set_message(6);
    let abandoned = header(Kind::Result, PARENT_JOB, 0, 3, 0, SEG);
    let mut other_copy = header(Kind::Contribution, JID, 0, 2, 1, SEG);
    other_copy.flags = FLAG_SHADOW;
    let query = header(Kind::StatusQuery, JID, 0, 1, 0, 0);
    let mut forwardable = header(Kind::StatusQuery, JID, 1, 1, 0, 0);
    forwardable.flags |= wire::FLAG_FORWARD;
    // The parent's answer (it waits for its member 3).
    let mut reply = header(Kind::StatusReply, PARENT_JOB, PARENT_MEMBER, 1, 0, 0);
    reply.relay = 2;
    reply.status = Filling as u8;
    let view: [u8; 16] = [0b0111_u64.to_le_bytes(), 0b1111_u64.to_le_bytes()]
        .concat()
        .try_into()
        .unwrap();
    let mut not_in_job = reply;
    not_in_job.relay = 9;
    #[rustfmt::skip]
    let rows = [
        row("first contribution", contrib(0, 2, 0, &values(0, n)), XDP_DROP, Contribution)
            .after(slot_2(Filling, 0b01)),
        // The parent's result before the partial went up: not awaited.
        row("result before the partial", from_parent(&parent(), PARENT_JOB, 2, 0, &result),
            XDP_DROP, DropUnawaitedResult)
            .after(slot_2(Filling, 0b01)),
        // The last member: the partial goes up (out of the port it came in on: XDP_TX).
        row("completing contribution", contrib(1, 2, 0, &values(1, n)), XDP_TX, Partial)
            .out(partial_to_parent(&partial))
            .after(slot_2(PartialSent, 0b11)),
        // A member's resend while the partial is out: the partial again, to the parent —
        // never to the member.
        row("resend while PartialSent", contrib(0, 2, 0, &values(0, n)), XDP_TX, PartialResend)
            .out(partial_to_parent(&partial))
            .after(slot_2(PartialSent, 0b11)),
        // Results not from the parent.
        row("result from a member (spoofed)", from_parent(&member(1), PARENT_JOB, 2, 0, &result),
            XDP_DROP, DropNotParent),
        row("result from the parent's IP but another port",
            from_parent(&elsewhere, PARENT_JOB, 2, 0, &result), XDP_DROP, DropNotParent),
        row("result naming the local job id", from_parent(&parent(), JID, 2, 0, &result),
            XDP_DROP, DropNotParent),
        row("result for another segment", from_parent(&parent(), PARENT_JOB, 2, 1, &result),
            XDP_DROP, DropUnawaitedResult),
        row("result with another count",
            from_parent(&parent(), PARENT_JOB, 2, 0, &final_result(n - 2)), XDP_DROP,
            DropUnawaitedResult)
            .after(slot_2(PartialSent, 0b11))
            .after([
                After::Word(42, 0, 0, word(0), "refused results leave the partial"),
                After::Word(42, 0, 1, word(1), "refused results leave the partial"),
            ]),
        // The parent's result: stored over the partial, broadcast to the members.
        row("the parent's result", from_parent(&parent(), PARENT_JOB, 2, 0, &result),
            XDP_REDIRECT, ParentResult)
            .out([
                Out::Kind(Kind::Result),
                // Named by this level's id, which the members and the egress program know
                // it by.
                Out::Job(JID, "renamed on its way down"),
                Out::Bytes(26, SWITCH_IP.octets().into(), "from this level"),
                payload(i32s(&result)),
            ])
            .after(slot_2(Done, 0b11)),
        row("the parent's result again", from_parent(&parent(), PARENT_JOB, 2, 0, &result),
            XDP_DROP, DropUnawaitedResult),
        // A member's resend now: the parent's result, to that member.
        row("resend after the result", contrib(1, 2, 0, &values(1, n)), XDP_TX, ResultReplay)
            .out([payload(i32s(&result)), Out::Bytes(30, member(1).ip.into(), "to the member")]),
        // Slot 3: the partial goes out, then the members abandon the round (a failed
        // allreduce) and start a newer one on the same copy: reclaimed.
        row("slot 3, first", contrib(0, 3, 0, &values(0, n)), XDP_DROP, Contribution),
        row("slot 3, partial", contrib(1, 3, 0, &values(1, n)), XDP_TX, Partial),
        row("a newer round over PartialSent",
            frame(&member(0), PORT, &contribution(newer, &values(0, n))), XDP_DROP, SlotReclaimed)
            .after([After::State(43, 0, Filling)]),
        // The old round's result arrives late: not awaited any more.
        row("result of the abandoned round",
            frame(&parent(), PORT, &contribution(abandoned, &result)), XDP_DROP,
            DropUnawaitedResult),
        // The other shadow copy is independent: slot 2's copy 1 fills while copy 0 is done.
        row("the other copy", frame(&member(0), PORT, &contribution(other_copy, &values(0, n))),
            XDP_DROP, Contribution)
            .after(slot_2(Done, 0b11)),
        // A status query sees PartialSent (slot 3's copy 1 is empty; slot 1 sends a partial).
        row("slot 1, partial", contrib(0, 1, 0, &values(0, n)), XDP_DROP, Contribution),
        row("slot 1, the partial goes up", contrib(1, 1, 0, &values(1, n)), XDP_TX, Partial),
        row("status query", status(&member(0), query, &[0; 16]), XDP_TX, StatusReply)
            .out([Out::Status(PartialSent)]),
        // The same query, forwardable: it goes to the parent as this level's, the asker
        // kept (relay: 1 + member 1).
        row("forwardable status query while PartialSent",
            status(&member(1), forwardable, &[0; 16]), XDP_TX, StatusForward)
            .out([
                Out::Kind(Kind::StatusQuery),
                Out::Job(PARENT_JOB, "the parent's"),
                Out::Member(PARENT_MEMBER),
                Out::Relay(2),
                Out::Bytes(30, parent().ip.into(), "to the parent"),
            ]),
        // The parent's answer: handed to member 1 as the level above's.
        row("the parent's answer, relayed", status(&parent(), reply, &view), XDP_REDIRECT,
            StatusRelay)
            .out([
                Out::Kind(Kind::StatusReply),
                Out::Job(JID, "member 1's job here"),
                Out::Member(1),
                Out::Relay(0),
                Out::Above(1),
                Out::Bytes(30, member(1).ip.into(), "to member 1"),
                Out::Bytes(PAYLOAD_OFFSET, view.into(), "the parent's view, unchanged"),
            ]),
        // The same from anyone but the parent, or for a member not in the job: dropped.
        row("a relayed answer from a member", status(&member(0), reply, &view), XDP_DROP,
            DropNotParent),
        row("a relayed answer for a member not in the job", status(&parent(), not_in_job, &view),
            XDP_DROP, DropNotMember),
    ];
    run_table(&mut sw, &rows);
}

/// A host level's rows for the collectives besides allreduce (`slot.rs`, "At an inner
/// level"): the ranks name a segment's root here (or `ROOT_ELSEWHERE`) and at the parent
/// (`relay`), the partial carries the parent's, the parent's result the local one on its
/// way down; a header-only completion is taken for a reduce-scatter, and for a gather only
/// once the copy holds the data (sent pending from above, kept, passed on pending — also
/// for a round its ranks have not started here).
#[test]
fn inner_level_collectives_table() {
    if !require_root("inner_level_collectives_table") {
        return;
    }
    use wire::{Collective, FLAG_HEADER_ONLY, FLAG_PENDING, ROOT_ELSEWHERE, ROOT_HOST};
    use {Counter::*, ShadowState::*};
    let mut sw = two_ranks_inner();
    let n = SEG as usize;
    // A rank's contribution of `c` on `slot`, its root `root` here and `relay` above;
    // header-only without values.
    let part = |m: u8, slot: u16, c: Collective, root: u8, relay: u8, vals: &[i32]| {
        let mut h = header(Kind::Contribution, JID, m, slot, 0, SEG);
        h.status = c as u8;
        h.set_root(root);
        h.relay = relay;
        if vals.is_empty() {
            h.flags |= FLAG_HEADER_ONLY;
        }
        frame(&member(m), PORT, &contribution(h, vals))
    };
    // The parent's result of `c` on `slot`, naming its own root; header-only without
    // values, `pending` marked.
    let down = |slot: u16, c: Collective, root: u8, pending: bool, vals: &[i32]| {
        let mut h = header(Kind::Result, PARENT_JOB, 0, slot, 0, SEG);
        h.status = c as u8;
        h.set_root(root);
        if vals.is_empty() {
            h.flags |= FLAG_HEADER_ONLY;
        }
        if pending {
            h.flags |= FLAG_PENDING;
        }
        frame(&parent(), PORT, &contribution(h, vals))
    };
    let state = |slot: u32, state| [After::State(40 + slot, 0, state)];
    let sum = partial(2, n);
    let result = final_result(n);
    let data = values(5, n);
    let (rs, ag) = (Collective::ReduceScatter, Collective::AllGather);
    #[rustfmt::skip]
    let rows = [
        // Slot 0: a reduce-scatter whose segment member 1 owns, its host member 4 above.
        row("reduce-scatter, first", part(0, 0, rs, 1, 4, &values(0, n)), XDP_DROP, Contribution),
        row("reduce-scatter, the partial up naming the root above",
            part(1, 0, rs, 1, 4, &values(1, n)), XDP_TX, Partial)
            .out([Out::Kind(Kind::Contribution), Out::Above(4), Out::Relay(0),
                  Out::Member(PARENT_MEMBER), payload(i32s(&sum))]),
        row("reduce-scatter, the result naming the root here",
            down(0, rs, 4, false, &result), XDP_REDIRECT, ParentResult)
            .out([Out::Kind(Kind::Result), Out::Above(1), payload(i32s(&result))])
            .after(state(0, Done)),
        // Slot 1: the segment's root is another host's rank: its completion, header-only.
        row("reduce-scatter elsewhere, first", part(0, 1, rs, ROOT_ELSEWHERE, 7, &values(0, n)),
            XDP_DROP, Contribution),
        row("reduce-scatter elsewhere, the partial up", part(1, 1, rs, ROOT_ELSEWHERE, 7,
            &values(1, n)), XDP_TX, Partial)
            .out([Out::Above(7), payload(i32s(&sum))]),
        row("reduce-scatter elsewhere, a header-only completion", down(1, rs, 7, false, &[]),
            XDP_REDIRECT, ParentResult)
            .out([Out::Kind(Kind::Result), Out::Above(ROOT_ELSEWHERE), Out::Flags(FLAG_HEADER_ONLY)])
            .after(state(1, Done)),
        // Slot 2: an all-gather whose root is another host's rank: the ranks' headers, the
        // host's header-only partial up.
        row("all-gather elsewhere, first", part(0, 2, ag, ROOT_ELSEWHERE, ROOT_HOST | 7, &[]),
            XDP_DROP, Contribution),
        row("all-gather elsewhere, the partial up", part(1, 2, ag, ROOT_ELSEWHERE, ROOT_HOST | 7,
            &[]), XDP_TX, Partial)
            .out([Out::Above(ROOT_HOST | 7), Out::Flags(FLAG_HEADER_ONLY)]),
        // The completion before the data: the copy has none to give the ranks.
        row("all-gather, a completion without the data", down(2, ag, ROOT_HOST | 7, false, &[]),
            XDP_DROP, DropUnawaitedResult)
            .after(state(2, PartialSent)),
        row("all-gather, pending data without a payload", down(2, ag, ROOT_HOST | 7, true, &[]),
            XDP_DROP, DropUnawaitedResult),
        row("all-gather, the data sent pending", down(2, ag, ROOT_HOST | 7, true, &data),
            XDP_REDIRECT, ParentResult)
            .out([Out::Flags(FLAG_PENDING), Out::Above(ROOT_ELSEWHERE), payload(i32s(&data))])
            .after(state(2, PartialSent)),
        row("all-gather, then the completion", down(2, ag, ROOT_HOST | 7, false, &[]),
            XDP_REDIRECT, ParentResult)
            .out([Out::Flags(FLAG_HEADER_ONLY)])
            .after(state(2, Done)),
        // A rank that lost the data asks with room: the kept data.
        row("all-gather, a rank's resend with room", part(1, 2, ag, ROOT_ELSEWHERE,
            ROOT_HOST | 7, &vec![0; n]), XDP_TX, ResultReplay)
            .out([payload(i32s(&data))]),
        // Slot 3: the data before any rank of this host sent the round: the round starts.
        row("all-gather, data for a round not started here", down(3, ag, ROOT_HOST | 7, true,
            &data), XDP_REDIRECT, ParentResult)
            .after(state(3, Filling)),
        row("all-gather, its first rank", part(0, 3, ag, ROOT_ELSEWHERE, ROOT_HOST | 7, &[]),
            XDP_DROP, Contribution),
        // What a host does not take: a root that is no rank of it, an allreduce naming a
        // root above, a reduce-scatter without its payload.
        row("a root that is no member here", part(0, 4, rs, 9, 4, &values(0, n)), XDP_DROP,
            DropBadOp),
        row("an allreduce naming a root above", part(0, 4, Collective::Allreduce, 0, 4,
            &values(0, n)), XDP_DROP, DropBadOp),
        row("a reduce-scatter without its payload", part(0, 4, rs, 1, 4, &[]), XDP_DROP,
            DropBadLength),
    ];
    run_table(&mut sw, &rows);
}

/// A level with one member (a host with one rank) sends its partial at once; a result
/// for a root job (no parent) is refused.
#[test]
fn one_member_and_root_jobs() {
    if !require_root("one_member_and_root_jobs") {
        return;
    }
    use Counter::*;
    let mut sw = load_switch();
    let n = 5;
    sw.add_inner_job(
        JID,
        job(1, Op::Sum, DType::I32, SEG, 0, 4),
        parent(),
        PARENT_JOB,
        PARENT_MEMBER,
    );
    // A root job.
    sw.add_job(9, job(2, Op::Sum, DType::I32, SEG, 8, 4));
    #[rustfmt::skip]
    let rows = [
        row("one member", contrib(0, 2, 0, &values(0, n)), XDP_TX, Partial)
            .out([payload(i32s(&values(0, n)))]),
        row("result to a root job", from_parent(&parent(), 9, 0, 0, &values(0, n)), XDP_DROP,
            DropNotParent),
    ];
    run_table(&mut sw, &rows);
}

/// Multi-buffer segments (a full 8928-byte payload) take the same path: the partial and
/// its resend leave whole, the parent's result is stored and handed to the fan-out.
#[test]
fn inner_level_multi_buffer() {
    if !require_root("inner_level_multi_buffer") {
        return;
    }
    use Counter::*;
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
    // Not a row's expectation but the rows' premise: they test nothing of several buffers
    // unless the frame spans them.
    assert!(c(0).len() > 3520, "a multi-buffer frame");
    let h = header(Kind::Result, PARENT_JOB, 0, 2, 0, n as u16);
    let result = frame(&parent(), PORT, &contribution(h, &final_result(n)));
    #[rustfmt::skip]
    let rows = [
        row("multi-buffer, first", c(0), XDP_DROP, Contribution),
        row("multi-buffer, the whole partial", c(1), XDP_TX, Partial)
            .out([
                Out::Kind(Kind::Contribution),
                Out::Job(PARENT_JOB, "the parent's"),
                payload(i32s(&partial(2, n))),
            ]),
        row("multi-buffer, the partial resent whole", c(0), XDP_TX, PartialResend)
            .out([payload(i32s(&partial(2, n)))]),
        // To the fan-out, marked as this level's own result.
        row("multi-buffer, the parent's result", result, XDP_PASS, ParentResult)
            .out([
                Out::Meta(own_result(JID)),
                Out::Bytes(26, SWITCH_IP.octets().into(), "from this level"),
            ]),
        row("multi-buffer, the stored result", c(1), XDP_TX, ResultReplay)
            .out([payload(i32s(&final_result(n)))]),
    ];
    run_table(&mut sw, &rows);
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
    use Counter::*;
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
    // A partial to the successor, as its member 5, in its id of the job.
    let to_succ = |vals: &[i32]| {
        [
            Out::Kind(Kind::Contribution),
            Out::Job(SUCC_JOB, "the successor's"),
            Out::Member(5),
            Out::Bytes(30, succ.ip.into(), "to the successor"),
            payload(i32s(vals)),
        ]
    };
    let partial = partial(2, n);
    let result = |from: &MemberAddr| from_parent(from, JID, 0, 0, &final_result(n));
    #[rustfmt::skip]
    let rows = [
        // Segment 1 starts here: the rank's contribution is the whole partial.
        row("chain start: the rank", rank(1, 1), XDP_TX, Partial)
            .out(to_succ(&values(0, n))),
        row("chain start: nothing from the predecessor", from_pred(1, 1), XDP_DROP,
            DropNotMember),
        // Segment 2 ends here (starts at host 2): the predecessor's partial completes it.
        row("chain end: the rank", rank(2, 2), XDP_DROP, Contribution),
        row("chain end: the predecessor's partial", from_pred(2, 2), XDP_REDIRECT, Complete)
            .out([payload(i32s(&partial))])
            .after([After::State(2, 0, ShadowState::Done)]),
        // The predecessor asks again (its partial or our result was lost): the result, to it.
        row("chain end: the predecessor's resend", from_pred(2, 2), XDP_TX, ResultReplay)
            .out([
                Out::Kind(Kind::Result),
                Out::Job(PRED_JOB, "the predecessor's"),
                Out::Bytes(30, pred.ip.into(), "back to the predecessor"),
                payload(i32s(&partial)),
            ]),
        // Segment 0 passes through (starts at host 0, ends at host 2).
        row("middle: the predecessor's partial", from_pred(0, 0), XDP_DROP, Contribution),
        row("middle: the rank completes the partial", rank(0, 0), XDP_TX, Partial)
            .out(to_succ(&partial)),
        row("middle: the predecessor's resend goes on", from_pred(0, 0), XDP_TX, PartialResend)
            .out(to_succ(&partial)),
        row("a result from a stranger", result(&member(3)), XDP_DROP, DropNotParent),
        row("the result from the successor (answering a resend)", result(&succ), XDP_REDIRECT,
            ParentResult)
            .out([
                // Marked to go back to the predecessor, which may lack it too, not on.
                Out::Flags(wire::FLAG_BACKWARD),
                Out::Job(JID, "this host's until the egress renames it"),
            ]),
        row("the result from the predecessor, later", result(&pred), XDP_DROP,
            DropUnawaitedResult),
        row("the rank's resend: the result", rank(0, 0), XDP_TX, ResultReplay)
            .out([payload(i32s(&final_result(n)))]),
    ];
    run_table(&mut sw, &rows);
}
