//! A job as the dataplane sees it: the value of the `JOBS` map, keyed by job id. The
//! control plane writes it once when the job is added; the XDP programs only read it.

use crate::{
    shape::JobShape,
    wire::{self, DType, Op, MAX_MEMBERS},
};

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

/// A joining member's hello as the switch recorded it (the `HELLOS` map's value, keyed by
/// the hello's token): where it came from, and when (`bpf_ktime_get_ns`, the monotonic
/// clock), so the daemon can sweep the ones nobody claimed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Hello {
    pub addr: MemberAddr,
    pub seen_ns: u64,
}

const _: () = assert!(core::mem::size_of::<Hello>() == 24);

/// Hellos the switch keeps from one port until the daemon takes or sweeps them: a flood
/// of tokens from one port fills its own share only, never another port's.
pub const HELLOS_PER_PORT: u32 = 64;
/// Hello records in all: every port's share (64 ports), with room for the few a race
/// between CPUs lets past a share.
pub const MAX_HELLOS: usize = 64 * HELLOS_PER_PORT as usize + 256;
/// How long a hello nobody claimed is kept (a joining worker sends its hello just before
/// its join, and again with each retry).
pub const HELLO_TTL_NS: u64 = 10_000_000_000;

/// Jobs an aggregation point holds at most.
pub const MAX_JOBS: usize = 256;

/// A wire job id is a dense index (low 16 bits, below [`MAX_JOBS`]: the job's entry in
/// `JOBS` and its row of per-job counters) and a generation (high 16 bits), counted up
/// when an index is given to another job, so a stale id names no job.
pub const fn job_index(id: u32) -> u32 {
    id & 0xffff
}

/// The generation of wire job id `id` (see [`job_index`]).
pub const fn job_generation(id: u32) -> u16 {
    (id >> 16) as u16
}

/// The wire job id of `index` and `generation`.
pub const fn job_id(index: u32, generation: u16) -> u32 {
    ((generation as u32) << 16) | (index & 0xffff)
}

/// What an aggregation point does with a complete segment.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The top of the tree: broadcast the result to every member.
    Root = 0,
    /// An inner level (a host reducing its local ranks, a lower switch): send the partial
    /// result to `Job::parent` and hand the final result it gets back to the members.
    Inner = 1,
    /// A host in a ring of hosts (no aggregating switch): each segment's chain starts at
    /// host `segment mod ring_size`; a host adds its ranks' partial to its predecessor's
    /// and passes it to its successor (`Job::parent`); the chain's last host holds the
    /// result, and the result goes round once more so every host delivers it.
    Ring = 2,
}

/// The `JOBS` map value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// One bit per member the aggregation point waits for.
    pub members: u64,
    /// First slot of the job's contiguous slot range in the global `SLOTS` map.
    pub slot_base: u32,
    /// Slots in the range; a packet's slot must be below this.
    pub slot_count: u32,
    /// The op and data type the job was created with: what its members reduce unless a
    /// message says otherwise, kept for listings. The switch checks each round's own.
    pub op: u8,
    pub dtype: u8,
    pub role: u8,
    /// The job's index ([`job_index`]; below [`MAX_JOBS`] = 256), kept here so the fast
    /// path finds the job's counters without the id.
    pub index: u8,
    /// Most payload bytes one segment carries (the job's segment length): a segment holds
    /// as many lanes of its message's op and type as fit.
    pub segment_bytes: u16,
    /// The generation of the job's wire id ([`job_generation`]): a packet naming the job's
    /// index with another generation names a job that is gone.
    pub generation: u16,
    /// When `role` is `Inner`: the job's wire id at the parent and this aggregation
    /// point's member index there — what a partial's header carries upward. When `Ring`:
    /// the successor's wire id and this host's member index there.
    pub parent_job: u32,
    pub parent_member: u8,
    /// When `role` is `Ring`: the hosts in the ring, this host's place in it, and the
    /// member index its predecessor's partials carry here (its entry in `member`, not a
    /// bit of `members`: results go to the ranks only).
    pub ring_size: u8,
    pub ring_position: u8,
    pub predecessor: u8,
    /// When `role` is `Ring`: the predecessor's wire id of the job (what a result passed
    /// back to it carries), as `parent_job` is the successor's. Each level numbers its
    /// jobs itself: a frame leaving for another point carries that point's id.
    pub predecessor_job: u32,
    /// Zero: keeps the entry free of padding (a map value is copied byte for byte).
    pub reserved: u32,
    /// When `role` is `Inner`: the parent's port (the uplink) and addresses. Partials go
    /// there, and results are taken only from there.
    pub parent: MemberAddr,
    /// Member table, indexed by member index.
    pub member: [MemberAddr; MAX_MEMBERS],
}

const _: () = assert!(core::mem::size_of::<Job>() == 40 + 16 + 16 * MAX_MEMBERS);

impl Job {
    /// The entry of a job of `shape` whose members reduce `op` over `dtype` unless a
    /// message says otherwise, its slots from `slot_base`, members' addresses still empty
    /// (the caller fills in `member`). `None` if the switch does not reduce `op` over
    /// `dtype`: callers check it first, with a message of their own.
    pub const fn new(shape: &JobShape, op: Op, dtype: DType, slot_base: u32) -> Option<Self> {
        if wire::lane(op, dtype).is_none() {
            return None;
        }
        Some(Self {
            members: shape.member_bits(),
            slot_base,
            slot_count: shape.slots() as u32,
            op: op as u8,
            dtype: dtype as u8,
            role: Role::Root as u8,
            index: 0,
            segment_bytes: shape.segment_bytes() as u16,
            generation: 0,
            parent_job: 0,
            parent_member: 0,
            ring_size: 0,
            ring_position: 0,
            predecessor: 0,
            predecessor_job: 0,
            reserved: 0,
            parent: MemberAddr {
                ifindex: 0,
                ip: [0; 4],
                mac: [0; 6],
                port: [0; 2],
            },
            member: [MemberAddr {
                ifindex: 0,
                ip: [0; 4],
                mac: [0; 6],
                port: [0; 2],
            }; MAX_MEMBERS],
        })
    }

    /// The job's wire id here.
    pub const fn wire_id(&self) -> u32 {
        job_id(self.index as u32, self.generation)
    }

    /// The wire id results for this job arrive with: the parent's job's at an inner
    /// level; at a ring host its own (its neighbours address it by its id).
    pub const fn upstream_job(&self) -> u32 {
        if self.role == Role::Ring as u8 {
            self.wire_id()
        } else {
            self.parent_job
        }
    }

    /// Members in the job.
    pub const fn member_count(&self) -> usize {
        self.members.count_ones() as usize
    }

    /// Where a ring job's chain for `segment` starts and ends: (first host, last host).
    pub const fn ring_chain(&self, segment: u32) -> (u8, u8) {
        let h = if self.ring_size == 0 {
            1
        } else {
            self.ring_size as u32
        };
        let start = segment % h;
        (start as u8, ((start + h - 1) % h) as u8)
    }

    /// Whether this ring host passes a result of `segment` it got from its successor back
    /// to its predecessor: unless the predecessor is the chain's end, which made it.
    pub const fn ring_passes_back(&self, segment: u32) -> bool {
        let h = if self.ring_size == 0 {
            1
        } else {
            self.ring_size as u32
        };
        let (_, end) = self.ring_chain(segment);
        (self.ring_position as u32 + h - 1) % h != end as u32
    }

    /// Whether this ring host passes `segment`'s result on to its successor: every host
    /// but the one before the chain's end (which already has it).
    pub const fn ring_forwards(&self, segment: u32) -> bool {
        let h = if self.ring_size == 0 {
            1
        } else {
            self.ring_size as u32
        };
        let (_, end) = self.ring_chain(segment);
        (self.ring_position as u32 + 1) % h != end as u32
    }
}

/// The member indices whose bits are set in a membership bitmap, in order.
pub fn members_of(bits: u64) -> impl Iterator<Item = u8> {
    (0..64u8).filter(move |i| bits & (1u64 << i) != 0)
}

/// The `EGRESS` value of a ring host's uplink: a result copy leaving there goes to the
/// successor (`Job::parent`) when [`Job::ring_forwards`] says so.
pub const EGRESS_SUCCESSOR: u32 = u32::MAX;

/// Key of the `EGRESS` map: which member of job `job` is reached through port `ifindex`.
/// The devmap egress program uses it to address each broadcast copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EgressKey {
    pub job: u32,
    pub ifindex: u32,
}

/// Switch-wide settings, the single entry of the `SWITCH` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SwitchConfig {
    /// The switch's own IPv4 address: collective packets are addressed to it and results
    /// come from it.
    pub ip: [u8; 4],
    /// UDP port of the collective protocol (network byte order): results come from it.
    pub port: [u8; 2],
    /// Source MAC of results.
    pub mac: [u8; 6],
    /// Collective ports: `port` and the `ports - 1` after it take contributions, hellos and
    /// queries (0 counts as 1). Workers send each slot's contributions to `port + slot %
    /// ports`, so that a NIC's flow rules on the destination port can give each slot one
    /// receive queue.
    pub ports: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<SwitchConfig>() == 16);

impl SwitchConfig {
    /// Whether UDP port `dst` (network byte order) is one of the collective ports.
    #[inline(always)]
    pub fn takes_port(&self, dst: [u8; 2]) -> bool {
        let offset = u16::from_be_bytes(dst).wrapping_sub(u16::from_be_bytes(self.port));
        offset < u16::from(self.ports.max(1))
    }
}

/// Collective ports a switch can have ([`SwitchConfig::ports`]).
pub const MAX_SWITCH_PORTS: u8 = 64;

/// CPUs the `CPUS` cpumap can steer to: its keys are CPU numbers.
pub const MAX_CPUS: usize = 256;

/// Where contributions are folded, the single entry of the `STEER` map: with `count` CPUs,
/// every contribution to the switch's slot `i` (its index in `SLOTS`) is handed to CPU
/// `cpu[i % count]` through the `CPUS` cpumap and folded there, so that each slot's state
/// stays in one CPU's cache and its lock is never contended; with none, each is folded on
/// the CPU it came in on.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steer {
    pub count: u32,
    pub cpu: [u32; MAX_STEER],
}

/// CPUs a switch can steer to.
pub const MAX_STEER: usize = 64;

impl Default for Steer {
    fn default() -> Self {
        Self {
            count: 0,
            cpu: [0; MAX_STEER],
        }
    }
}

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
#[cfg(feature = "aya")]
pub fn probability_threshold(p: f64) -> u32 {
    (p.clamp(0.0, 1.0) * u32::MAX as f64) as u32
}

#[cfg(feature = "aya")]
mod pod {
    unsafe impl aya::Pod for super::Faults {}
    unsafe impl aya::Pod for super::Impair {}
    unsafe impl aya::Pod for super::Job {}
    unsafe impl aya::Pod for super::MemberAddr {}
    unsafe impl aya::Pod for super::Hello {}
    unsafe impl aya::Pod for super::EgressKey {}
    unsafe impl aya::Pod for super::SwitchConfig {}
    unsafe impl aya::Pod for super::Steer {}
}
