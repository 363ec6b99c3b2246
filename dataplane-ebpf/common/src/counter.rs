//! Named counters of the dataplane: one per-CPU array indexed by these, summed by the
//! control plane. Every packet the switch program sees bumps exactly one of the ingress
//! counters (a steered contribution two: `steered` where it came in, its outcome where it
//! is folded), and every broadcast copy one of the egress counters.

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Not a collective packet: passed to the kernel untouched.
    Pass = 0,
    /// A contribution was added to its slot.
    Contribution,
    /// A contribution completed its slot; the result was broadcast (a multi-buffer one
    /// passed to `xagg_fanout`, which copies it to each member).
    Complete,
    /// A member re-sent a contribution to a finished slot version: the stored result went
    /// back to that member only.
    ResultReplay,
    /// A contribution from a member whose contribution this round already holds.
    DropDuplicate,
    /// A contribution for an older round than the one its slot version holds.
    DropStale,
    /// A contribution started a new round over a version still filling an older round,
    /// which its members abandoned (a failed or aborted allreduce): the slot is reclaimed.
    SlotReclaimed,
    DropUnknownJob,
    /// Sender is not a member of the job, or not at the port and addresses registered.
    DropNotMember,
    DropBadVersion,
    /// A packet kind the switch does not take (e.g. a result sent to the switch).
    DropBadKind,
    /// An op or data type the switch does not reduce, or not the one its round started
    /// with.
    DropBadOp,
    /// Element count of zero, or more lanes than the job's segment length holds.
    DropBadCount,
    /// Lengths disagree: the payload and the element count, the UDP length and the IPv4
    /// total length, or a frame longer than its IPv4 total length.
    DropBadLength,
    /// `seg` outside the job's slot range.
    DropSlotRange,
    /// Frame ends inside a header, or before the end its IPv4 total length gives.
    DropTruncated,
    /// IPv4 with options, or a first fragment, addressed to the collective port.
    DropBadIp,
    /// A result copy sent out of a port, addressed to its member (by `xagg_result` for a
    /// broadcast, by `xagg_fanout` for a multi-buffer result).
    ResultCopy,
    /// A broadcast copy reached a port with no member of the job: dropped.
    EgressNoMember,
    /// The dataplane could not hand a packet on: a redirect, a copy to a member, or the
    /// tail call into the fold program of the packet's op and lane (a dataplane loaded
    /// without its fold programs) failed.
    RedirectError,
    /// A member asked for a slot version's state and got it back.
    StatusReply,
    /// Fault injection: a contribution dropped on purpose.
    InjectDropContribution,
    /// Fault injection: a result copy (broadcast or replay) dropped on purpose.
    InjectDropResult,
    /// A frame entering a switch port claims the switch's own MAC or IPv4 address as its
    /// source (a forged result, or an ARP message claiming the switch's address), untagged
    /// or behind VLAN tags.
    DropSpoofedSource,
    /// An IPv4 header checksum that does not add up, on a datagram to the collective port.
    DropBadChecksum,
    /// A joining member's hello, recorded for the daemon.
    Hello,
    /// A datagram to the collective port longer than the largest segment's packet
    /// (`wire::MAX_IP_PACKET`, 8994 bytes).
    DropOversize,
    /// At an inner level: a contribution completed its slot, and the partial went to the
    /// parent.
    Partial,
    /// At an inner level: a member re-sent a contribution while the slot waits for the
    /// parent's result: the partial went to the parent again (recovering its loss).
    PartialResend,
    /// At an inner level: the parent's result for a round whose partial was sent, stored
    /// and delivered to every member.
    ParentResult,
    /// A result that does not come from its job's parent, on the uplink, from the
    /// parent's addresses (or names no job with a parent).
    DropNotParent,
    /// A parent's result for a round the slot is not waiting for: a duplicate, or a round
    /// whose partial was never sent.
    DropUnawaitedResult,
    /// At an inner level: a member's status query for a round waiting on the parent,
    /// forwarded to the parent.
    StatusForward,
    /// At an inner level: the parent's answer to a forwarded status query, handed to the
    /// member that asked.
    StatusRelay,
    /// A VLAN-tagged frame (802.1Q or 802.1ad, up to [`MAX_TAGS`] deep) addressed to the
    /// switch's collective address and port: members send untagged, so it is not theirs;
    /// or a frame with more tags than the switch reads, which it cannot judge.
    DropTagged,
    /// A hello with a new token from a port that already has its share of hellos waiting
    /// (`job::HELLOS_PER_PORT`): not recorded.
    DropHelloQuota,
    /// A contribution handed to the CPU that owns its slot (`switch.steer_cpus`): counted
    /// on the port it came in on; what came of it is counted again where it is folded.
    Steered,
}

/// VLAN tags the switch reads through to find a frame's addresses (802.1ad + 802.1Q is
/// two); a frame with more is dropped as [`Counter::DropTagged`].
pub const MAX_TAGS: usize = 4;

/// Per-member counters of a job's row: contributions that were new at the switch, and
/// ones that were not (retransmissions: a duplicate while the round fills, or one answered
/// with the stored result).
pub const MEMBER_COUNTERS: usize = 2;
pub const MEMBER_NEW: usize = 0;
pub const MEMBER_AGAIN: usize = 1;

/// Counters in a job's row of `JOB_COUNTERS`: every [`Counter`] for the job's packets,
/// then [`MEMBER_COUNTERS`] per member.
pub const JOB_ROW: usize = Counter::COUNT + MEMBER_COUNTERS * crate::wire::MAX_MEMBERS;

/// Where counter `c` of the job with index `row` ([`crate::job::job_index`]) is in
/// `JOB_COUNTERS`.
pub const fn job_row(row: u32, c: Counter) -> u32 {
    (row as usize * JOB_ROW + c as usize) as u32
}

/// Where member `m`'s per-member counter `k` of job index `row` is in `JOB_COUNTERS`.
pub const fn member_row(row: u32, m: usize, k: usize) -> u32 {
    (row as usize * JOB_ROW + Counter::COUNT + m * MEMBER_COUNTERS + k) as u32
}

impl Counter {
    pub const COUNT: usize = 37;

    pub const ALL: [Counter; Self::COUNT] = [
        Counter::Pass,
        Counter::Contribution,
        Counter::Complete,
        Counter::ResultReplay,
        Counter::DropDuplicate,
        Counter::DropStale,
        Counter::SlotReclaimed,
        Counter::DropUnknownJob,
        Counter::DropNotMember,
        Counter::DropBadVersion,
        Counter::DropBadKind,
        Counter::DropBadOp,
        Counter::DropBadCount,
        Counter::DropBadLength,
        Counter::DropSlotRange,
        Counter::DropTruncated,
        Counter::DropBadIp,
        Counter::ResultCopy,
        Counter::EgressNoMember,
        Counter::RedirectError,
        Counter::StatusReply,
        Counter::InjectDropContribution,
        Counter::InjectDropResult,
        Counter::DropSpoofedSource,
        Counter::DropBadChecksum,
        Counter::Hello,
        Counter::DropOversize,
        Counter::Partial,
        Counter::PartialResend,
        Counter::ParentResult,
        Counter::DropNotParent,
        Counter::DropUnawaitedResult,
        Counter::StatusForward,
        Counter::StatusRelay,
        Counter::DropTagged,
        Counter::DropHelloQuota,
        Counter::Steered,
    ];

    /// The counter's name in the CLI, the API and the docs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Contribution => "contribution",
            Self::Complete => "complete",
            Self::ResultReplay => "result_replay",
            Self::DropDuplicate => "drop_duplicate",
            Self::DropStale => "drop_stale",
            Self::SlotReclaimed => "slot_reclaimed",
            Self::DropUnknownJob => "drop_unknown_job",
            Self::DropNotMember => "drop_not_member",
            Self::DropBadVersion => "drop_bad_version",
            Self::DropBadKind => "drop_bad_kind",
            Self::DropBadOp => "drop_bad_op",
            Self::DropBadCount => "drop_bad_count",
            Self::DropBadLength => "drop_bad_length",
            Self::DropSlotRange => "drop_slot_range",
            Self::DropTruncated => "drop_truncated",
            Self::DropBadIp => "drop_bad_ip",
            Self::ResultCopy => "result_copy",
            Self::EgressNoMember => "egress_no_member",
            Self::RedirectError => "redirect_error",
            Self::StatusReply => "status_reply",
            Self::InjectDropContribution => "inject_drop_contribution",
            Self::InjectDropResult => "inject_drop_result",
            Self::DropSpoofedSource => "drop_spoofed_source",
            Self::DropBadChecksum => "drop_bad_checksum",
            Self::Hello => "hello",
            Self::DropOversize => "drop_oversize",
            Self::Partial => "partial",
            Self::PartialResend => "partial_resend",
            Self::ParentResult => "parent_result",
            Self::DropNotParent => "drop_not_parent",
            Self::DropUnawaitedResult => "drop_unawaited_result",
            Self::StatusForward => "status_forward",
            Self::StatusRelay => "status_relay",
            Self::DropTagged => "drop_tagged",
            Self::DropHelloQuota => "drop_hello_quota",
            Self::Steered => "steered",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_indexed_in_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{}", c.name());
        }
    }
}
