//! A job as the dataplane sees it: the value of the `JOBS` map, keyed by job id. The
//! control plane writes it once when the job is added; the XDP programs only read it.

use crate::wire::MAX_MEMBERS;

/// Where a member is reached from this aggregation point: the port (interface) it is
/// behind and its Ethernet, IPv4 and UDP addresses. Addresses are kept in network byte
/// order, exactly as they appear in packets.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemberAddr {
    pub ifindex: u32,
    pub ip: [u8; 4],
    pub mac: [u8; 6],
    pub port: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<MemberAddr>() == 16);

/// What an aggregation point does with a complete segment.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The top of the tree: broadcast the result to every member.
    Root = 0,
    /// An inner level (a host reducing its local ranks, a lower switch): send the partial
    /// result to `Job::parent` and hand the final result it gets back to the members.
    /// Reserved: the control plane refuses it until hierarchical jobs exist.
    Inner = 1,
}

/// The `JOBS` map value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// One bit per member the aggregation point waits for.
    pub members: u64,
    /// First slot of the job's contiguous slot range in the global `SLOTS` map.
    pub slot_base: u32,
    /// Slots in the range; a packet's `seg` must be below this.
    pub slot_count: u32,
    pub op: u8,
    pub dtype: u8,
    pub role: u8,
    pub _pad0: u8,
    /// Most elements one segment carries (the job's segment length).
    pub seg_elems: u16,
    pub _pad1: u16,
    /// Where the partial result goes next when `role` is `Inner`.
    pub parent: MemberAddr,
    /// Member table, indexed by member index.
    pub member: [MemberAddr; MAX_MEMBERS],
}

const _: () = assert!(core::mem::size_of::<Job>() == 24 + 16 + 16 * MAX_MEMBERS);

impl Job {
    /// Bitmap with the low `n` bits set.
    pub const fn members_bitmap(n: usize) -> u64 {
        if n >= 64 {
            u64::MAX
        } else {
            (1u64 << n) - 1
        }
    }
}

/// Key of the `EGRESS` map: which member of job `jid` is reached through port `ifindex`.
/// The devmap egress program uses it to address each broadcast copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EgressKey {
    pub jid: u32,
    pub ifindex: u32,
}

/// Switch-wide settings, the single entry of the `SWITCH` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SwitchConfig {
    /// The switch's own IPv4 address: collective packets are addressed to it and results
    /// come from it.
    pub ip: [u8; 4],
    /// UDP port of the collective protocol (network byte order).
    pub port: [u8; 2],
    /// Source MAC of results.
    pub mac: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<SwitchConfig>() == 12);

/// Fault injection, the single entry of the `FAULTS` map: each field is a probability
/// scaled to 2^32 (0 = off). Set through the daemon; off by default.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Faults {
    /// Incoming contributions dropped at the switch.
    pub drop_contribution: u32,
    /// Result copies dropped, per member, as they leave the switch.
    pub drop_result: u32,
}

/// Impairment of a worker's outgoing contributions by the tc program `xagg_impair`, the
/// single entry of its `IMPAIR` map: probabilities scaled to 2^32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Impair {
    pub drop: u32,
    pub duplicate: u32,
    /// The collective UDP port (network byte order): only packets to it are impaired.
    pub port: [u8; 2],
    pub _pad: [u8; 2],
}

/// Probability `p` (0..=1) as a threshold for `bpf_get_prandom_u32() < threshold`.
#[cfg(feature = "user")]
pub fn probability_threshold(p: f64) -> u32 {
    (p.clamp(0.0, 1.0) * u32::MAX as f64) as u32
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::Faults {}
    unsafe impl aya::Pod for super::Impair {}
    unsafe impl aya::Pod for super::Job {}
    unsafe impl aya::Pod for super::MemberAddr {}
    unsafe impl aya::Pod for super::EgressKey {}
    unsafe impl aya::Pod for super::SwitchConfig {}
}
