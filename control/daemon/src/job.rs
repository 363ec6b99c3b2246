//! The job API: what a job is to a user (a [`JobSpec`]: its id, op, data type, segment
//! length, slots and members) and its validation into the dataplane's [`Job`] entry. The
//! daemon, the CLI and job files all speak `JobSpec`; its shape (members, slots, segment
//! length) is a [`JobShape`], validated there.

use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};
use xagg_common::{
    job::{MemberAddr, Role},
    wire::{self, DType, Lane, Op},
    Job, JobShape,
};
use xagg_sys::iface;

/// A member of a job as the switch reaches it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    /// The switch port the member is behind.
    pub interface: String,
    /// The member's MAC address (results are addressed to it).
    pub mac: String,
    /// The member's IPv4 address and UDP port.
    pub addr: SocketAddrV4,
}

/// A job: a group of members with slots. Its `op` and `dtype` are what its members reduce
/// unless a message says otherwise; the switch takes any supported pair per message, and
/// `segment` counts lanes of the job's `op` and `dtype` (a message of another pair carries
/// as many of its lanes as fit the same bytes).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Job id, unique on the switch.
    pub id: u32,
    #[serde(default = "default_op", with = "crate::names")]
    pub op: Op,
    #[serde(default = "default_dtype", with = "crate::names")]
    pub dtype: DType,
    /// Elements per segment (lanes of the op and type: see [`JobSpec::shape`]).
    pub segment: u16,
    /// Slots the job gets: the most segments each member has in flight.
    pub slots: u32,
    /// Members in member-index order.
    pub members: Vec<MemberSpec>,
    /// Slot range given by the switch; ignored when adding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_base: Option<u32>,
    /// Where this aggregation point sends its partials, if it is an inner level of the
    /// job's tree (a host reducing its ranks, a lower switch); none at the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentSpec>,
    /// This host's place in a ring of hosts, if the job runs without an aggregating
    /// switch; none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingSpec>,
}

/// A host's place in a ring: its neighbours, reached through one port. Each segment's
/// chain of partials starts at host `segment mod size`, so each host sends about
/// 2(size-1)/size of the data each way.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RingSpec {
    /// The port both neighbours are behind.
    pub interface: String,
    /// Hosts in the ring, and this host's place (0..size).
    pub size: u8,
    pub position: u8,
    /// The host before this one: its partials arrive as member `members.len()` here.
    pub predecessor: Neighbour,
    /// The host after this one: partials go there, as its member `member`.
    pub successor: Neighbour,
}

/// A ring neighbour's collective addresses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Neighbour {
    pub mac: String,
    pub addr: SocketAddrV4,
    /// This host's member index at the successor (the successor's own rank count);
    /// ignored for the predecessor.
    #[serde(default)]
    pub member: u8,
    /// The neighbour's wire id of the job, which frames sent to it carry: each host
    /// numbers its jobs itself. None: this job's own id (every host configured with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u32>,
}

/// An inner level's parent: the aggregation point above it, and the job there that this
/// point is a member of. Segment length and slots must be the parent job's: slot indices
/// pass through the levels unchanged.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ParentSpec {
    /// This point's uplink: the port the parent is behind. Results are taken only from it.
    pub interface: String,
    /// The parent's MAC address (partials are addressed to it).
    pub mac: String,
    /// The parent's collective IPv4 address and UDP port.
    pub addr: SocketAddrV4,
    /// The job's id at the parent.
    pub job: u32,
    /// This point's member index in the parent's job.
    pub member: u8,
}

fn default_op() -> Op {
    Op::Sum
}
fn default_dtype() -> DType {
    DType::I32
}

/// A field that is wrong, with how to fix it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("job {field}: {problem}")]
pub struct JobError {
    pub field: String,
    pub problem: String,
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> JobError {
    JobError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The wire lane of `op` over `dtype`, or why the switch does not reduce it: every op over
/// integers; sum, min, max and avg over floats (a product of block floating point numbers
/// would need the exponents added and the mantissas renormalised per element, and bitwise
/// ops have no meaning for floats).
pub fn lane(op: Op, dtype: DType) -> Result<Lane, String> {
    wire::lane(op, dtype).ok_or_else(|| {
        format!(
            "{op} over {dtype} is not supported: integers (i32, u32, i64) take sum, min, max, avg, prod, and, or, xor; floats (f32, f64, f16, bf16) take sum, min, max, avg"
        )
    })
}

impl JobSpec {
    /// The job's shape: its members, slots and segment length.
    pub fn shape(&self) -> Result<JobShape, JobError> {
        let lane = lane(self.op, self.dtype).map_err(|e| bad("op", e))?;
        JobShape::with_elements(
            self.members.len(),
            self.slots as usize,
            usize::from(self.segment),
            lane,
        )
        .map_err(|e| bad(e.field(), e.to_string()))
    }

    /// Checks the spec and builds the `JOBS` entry, resolving interfaces in the calling
    /// thread's network namespace. `slot_base` is where the switch placed the job.
    pub fn to_job(&self, slot_base: u32) -> Result<Job, JobError> {
        let shape = self.shape()?;
        let mut job = Job::new(&shape, self.op, self.dtype, slot_base)
            .expect("the shape is whole lanes of a supported op and type");
        for (i, m) in self.members.iter().enumerate() {
            let field = format!("members[{i}]");
            let ifindex = iface::ifindex(&m.interface).map_err(|e| {
                bad(
                    format!("{field}.interface"),
                    format!("{e:#}: name a switch port of this switch"),
                )
            })?;
            let mac = iface::parse_mac(&m.mac).map_err(|e| bad(format!("{field}.mac"), e))?;
            if m.addr.ip().is_unspecified() || m.addr.port() == 0 {
                return Err(bad(
                    format!("{field}.addr"),
                    format!(
                        "`{}`: give the member's own IPv4 address and UDP port",
                        m.addr
                    ),
                ));
            }
            // Results are addressed per port: two members behind one port would get one copy.
            if let Some(j) = self.members[..i]
                .iter()
                .position(|o| o.interface == m.interface)
            {
                return Err(bad(
                    format!("{field}.interface"),
                    format!(
                        "`{}` is also members[{j}]'s port: each member of a job must be behind its own switch port",
                        m.interface
                    ),
                ));
            }
            job.member[i] = MemberAddr {
                ifindex,
                ip: m.addr.ip().octets(),
                mac,
                port: m.addr.port().to_be_bytes(),
            };
        }
        if let Some(p) = &self.parent {
            let ifindex = iface::ifindex(&p.interface).map_err(|e| {
                bad(
                    "parent.interface",
                    format!("{e:#}: name the port of this switch the parent is behind"),
                )
            })?;
            let mac = iface::parse_mac(&p.mac).map_err(|e| bad("parent.mac", e))?;
            if p.addr.ip().is_unspecified() || p.addr.port() == 0 {
                return Err(bad(
                    "parent.addr",
                    format!(
                        "`{}`: give the parent's collective IPv4 address and UDP port",
                        p.addr
                    ),
                ));
            }
            // The uplink tells results coming down from contributions coming up.
            if let Some(i) = self.members.iter().position(|m| m.interface == p.interface) {
                return Err(bad(
                    "parent.interface",
                    format!(
                        "`{}` is also members[{i}]'s port: the parent must be behind a port of its own (the uplink)",
                        p.interface
                    ),
                ));
            }
            if usize::from(p.member) >= wire::MAX_MEMBERS {
                return Err(bad(
                    "parent.member",
                    format!(
                        "{}: a member index is below {}",
                        p.member,
                        wire::MAX_MEMBERS
                    ),
                ));
            }
            job.role = Role::Inner as u8;
            job.parent = MemberAddr {
                ifindex,
                ip: p.addr.ip().octets(),
                mac,
                port: p.addr.port().to_be_bytes(),
            };
            job.parent_job = p.job;
            job.parent_member = p.member;
        }
        if let Some(r) = &self.ring {
            if self.parent.is_some() {
                return Err(bad(
                    "ring",
                    "a job has a parent or a ring, not both: drop one of them",
                ));
            }
            if r.size == 0 || r.position >= r.size {
                return Err(bad(
                    "ring.position",
                    format!(
                        "{} of {}: a ring has 1 or more hosts, each at a place below its size",
                        r.position, r.size
                    ),
                ));
            }
            let ifindex = iface::ifindex(&r.interface).map_err(|e| {
                bad(
                    "ring.interface",
                    format!("{e:#}: name the port of this host the ring's neighbours are behind"),
                )
            })?;
            if let Some(i) = self.members.iter().position(|m| m.interface == r.interface) {
                return Err(bad(
                    "ring.interface",
                    format!(
                        "`{}` is also members[{i}]'s port: the neighbours must be behind a port of their own",
                        r.interface
                    ),
                ));
            }
            let predecessor = self.members.len();
            if predecessor >= wire::MAX_MEMBERS {
                return Err(bad(
                    "members",
                    format!(
                        "a ring host takes at most {} ranks: its predecessor needs a member index too",
                        wire::MAX_MEMBERS - 1
                    ),
                ));
            }
            let neighbour = |n: &Neighbour, field: &str| -> Result<MemberAddr, JobError> {
                let mac =
                    iface::parse_mac(&n.mac).map_err(|e| bad(format!("ring.{field}.mac"), e))?;
                if n.addr.ip().is_unspecified() || n.addr.port() == 0 {
                    return Err(bad(
                        format!("ring.{field}.addr"),
                        format!(
                            "`{}`: give the neighbour's collective IPv4 address and UDP port",
                            n.addr
                        ),
                    ));
                }
                Ok(MemberAddr {
                    ifindex,
                    ip: n.addr.ip().octets(),
                    mac,
                    port: n.addr.port().to_be_bytes(),
                })
            };
            job.role = Role::Ring as u8;
            job.parent = neighbour(&r.successor, "successor")?;
            job.parent_job = r.successor.job.unwrap_or(self.id);
            job.predecessor_job = r.predecessor.job.unwrap_or(self.id);
            job.parent_member = r.successor.member;
            job.member[predecessor] = neighbour(&r.predecessor, "predecessor")?;
            job.predecessor = predecessor as u8;
            job.ring_size = r.size;
            job.ring_position = r.position;
        }
        Ok(job)
    }

    /// The spec back from a `JOBS` entry (interfaces by name, resolved in this namespace).
    pub fn from_job(id: u32, job: &Job) -> Self {
        // The daemon wrote both; an entry it cannot read is not one of its own.
        let op = Op::from_u8(job.op).unwrap_or(Op::Sum);
        let dtype = DType::from_u8(job.dtype).unwrap_or(DType::I32);
        let lane = wire::lane(op, dtype).unwrap_or(Lane::I32);
        let members = job.member[..job.member_count()]
            .iter()
            .map(|m| MemberSpec {
                interface: port_name(m.ifindex),
                mac: iface::fmt_mac(&m.mac),
                addr: SocketAddrV4::new(Ipv4Addr::from(m.ip), u16::from_be_bytes(m.port)),
            })
            .collect();
        Self {
            id,
            op,
            dtype,
            segment: (usize::from(job.segment_bytes) / lane.size()) as u16,
            slots: job.slot_count,
            members,
            slot_base: Some(job.slot_base),
            ring: (job.role == Role::Ring as u8).then(|| {
                let neighbour = |m: &MemberAddr, member: u8, job: u32| Neighbour {
                    mac: iface::fmt_mac(&m.mac),
                    addr: SocketAddrV4::new(Ipv4Addr::from(m.ip), u16::from_be_bytes(m.port)),
                    member,
                    job: (job != id).then_some(job),
                };
                RingSpec {
                    interface: port_name(job.parent.ifindex),
                    size: job.ring_size,
                    position: job.ring_position,
                    predecessor: neighbour(
                        &job.member[usize::from(job.predecessor) & 63],
                        0,
                        job.predecessor_job,
                    ),
                    successor: neighbour(&job.parent, job.parent_member, job.parent_job),
                }
            }),
            parent: (job.role == Role::Inner as u8).then(|| ParentSpec {
                interface: port_name(job.parent.ifindex),
                mac: iface::fmt_mac(&job.parent.mac),
                addr: SocketAddrV4::new(
                    Ipv4Addr::from(job.parent.ip),
                    u16::from_be_bytes(job.parent.port),
                ),
                job: job.parent_job,
                member: job.parent_member,
            }),
        }
    }
}

/// A port's name in this namespace (its index if it has none).
fn port_name(ifindex: u32) -> String {
    nix::net::if_::if_indextoname(ifindex)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("ifindex {ifindex}"))
}

/// First free range of `want` slots in `0..total`, given the ranges in use.
pub fn allocate_slots(used: &[(u32, u32)], want: u32, total: u32) -> Option<u32> {
    let mut ranges = used.to_vec();
    ranges.sort();
    let mut start = 0u32;
    for (base, count) in ranges {
        if base >= start && base - start >= want {
            return Some(start);
        }
        start = start.max(base + count);
    }
    (total.checked_sub(start)? >= want).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit() {
        assert_eq!(allocate_slots(&[], 10, 100), Some(0));
        assert_eq!(allocate_slots(&[(0, 10)], 10, 100), Some(10));
        assert_eq!(allocate_slots(&[(0, 10), (20, 5)], 10, 100), Some(10));
        assert_eq!(allocate_slots(&[(0, 10), (15, 5)], 10, 100), Some(20));
        assert_eq!(allocate_slots(&[(0, 95)], 10, 100), None);
        assert_eq!(allocate_slots(&[], 101, 100), None);
    }

    /// The documented job file reads as the job it describes.
    #[test]
    fn the_example_job_file_reads() {
        let spec: JobSpec = toml::from_str(include_str!("../../../docs/job.toml")).unwrap();
        assert_eq!(
            (spec.id, spec.op, spec.dtype, spec.segment, spec.slots),
            (1, Op::Sum, DType::I32, 860, 128)
        );
        assert_eq!(spec.members.len(), 2);
        assert_eq!(spec.members[1].addr.to_string(), "10.77.0.12:47801");
        assert_eq!(spec.shape().unwrap().segment_bytes(), 3440);
    }

    #[test]
    fn errors_name_the_field() {
        // An unknown op is refused where the spec is read, with the valid ones.
        let e = toml::from_str::<JobSpec>(
            "id = 1\nop = \"mean\"\nsegment = 256\nslots = 8\nmembers = []\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("op") && e.contains("use one of sum, min"), "{e}");
        let e = serde_json::from_str::<JobSpec>(
            r#"{"id":1,"dtype":"f128","segment":256,"slots":8,"members":[]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("use one of i32, u32"), "{e}");
        let spec = JobSpec {
            id: 1,
            op: Op::Sum,
            dtype: DType::I32,
            segment: 5000,
            slots: 8,
            members: vec![],
            slot_base: None,
            parent: None,
            ring: None,
        };
        assert_eq!(spec.to_job(0).unwrap_err().field, "segment");
        let spec = JobSpec {
            segment: 256,
            ..spec
        };
        assert_eq!(spec.to_job(0).unwrap_err().field, "members");
        let one = MemberSpec {
            interface: "lo".into(),
            mac: "02:00:00:00:00:01".into(),
            addr: "10.0.0.1:1".parse().unwrap(),
        };
        let spec = JobSpec {
            members: vec![one],
            ..spec
        };
        // Outside the op x type matrix: refused, with the matrix in the message.
        for (op, dtype) in [
            (Op::Prod, DType::F32),
            (Op::Xor, DType::Bf16),
            (Op::And, DType::F16),
            (Op::Prod, DType::F64),
        ] {
            let bad = JobSpec {
                op,
                dtype,
                ..spec.clone()
            };
            let e = bad.to_job(0).unwrap_err();
            assert_eq!(e.field, "op");
            assert!(
                e.problem
                    .contains("floats (f32, f64, f16, bf16) take sum, min, max, avg"),
                "{e}"
            );
        }
        // The largest segment depends on the lane: 1116 for i64 and for the mean of i32.
        let wide = JobSpec {
            op: Op::Avg,
            segment: 1117,
            ..spec.clone()
        };
        assert!(wide.to_job(0).unwrap_err().problem.contains("1..=1116"));
        let none = JobSpec {
            slots: 0,
            ..spec.clone()
        };
        assert_eq!(none.to_job(0).unwrap_err().field, "slots");
        // Keys and names as they were: `op` and `dtype` by name, `segment` in elements.
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            (
                json["op"].as_str(),
                json["dtype"].as_str(),
                json["segment"].as_u64()
            ),
            (Some("sum"), Some("i32"), Some(256))
        );
    }
}
