//! The job API: what a job is to a user (a [`JobSpec`]: its id, op, data type, segment
//! length, slots and members) and its validation into the dataplane's [`Job`] entry. The
//! daemon, the CLI and job files all speak `JobSpec`.

use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};
use xagg_common::{
    job::{MemberAddr, Role},
    wire::{DType, Op, MAX_MEMBERS},
    Job,
};

use crate::iface;

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

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Job id (`jid` in packets), unique on the switch.
    pub id: u32,
    #[serde(default = "default_op")]
    pub op: String,
    #[serde(default = "default_dtype")]
    pub dtype: String,
    /// Elements per segment.
    pub segment: u16,
    /// Slots the job gets: the most segments each member has in flight.
    pub slots: u32,
    /// Members in member-index order.
    pub members: Vec<MemberSpec>,
    /// Slot range given by the switch; ignored when adding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_base: Option<u32>,
}

fn default_op() -> String {
    "sum".into()
}
fn default_dtype() -> String {
    "i32".into()
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

pub fn parse_op(s: &str) -> Result<Op, String> {
    Op::ALL.into_iter().find(|o| o.name() == s).ok_or_else(|| {
        format!("unknown op `{s}`: use one of sum, min, max, avg, prod, and, or, xor")
    })
}

pub fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("unknown dtype `{s}`: use one of i32, u32, i64, f32, f16, bf16"))
}

/// Whether the dataplane reduces `op` over `dtype`: every op over integers; sum, min,
/// max and avg over floats (a product of block floating point numbers would need the
/// exponents added and the mantissas renormalised per element, and bitwise ops have no
/// meaning for floats).
pub fn supported(op: Op, dtype: DType) -> bool {
    xagg_common::wire::lane(op, dtype).is_some()
}

impl JobSpec {
    /// Checks the spec and builds the `JOBS` entry, resolving interfaces in the calling
    /// thread's network namespace. `slot_base` is where the switch placed the job.
    pub fn to_job(&self, slot_base: u32) -> Result<Job, JobError> {
        let op = parse_op(&self.op).map_err(|e| bad("op", e))?;
        let dtype = parse_dtype(&self.dtype).map_err(|e| bad("dtype", e))?;
        if !supported(op, dtype) {
            return Err(bad(
                "op",
                format!(
                    "{} over {} is not supported: integers (i32, u32, i64) take sum, min, max, avg, prod, and, or, xor; floats (f32, f16, bf16) take sum, min, max, avg",
                    op.name(),
                    dtype.name()
                ),
            ));
        }
        let max = xagg_common::wire::max_elements(op, dtype);
        if self.segment == 0 || self.segment as usize > max {
            return Err(bad(
                "segment",
                format!(
                    "{} elements: choose 1..={max} ({} bytes of {} over {} fit one XDP frame)",
                    self.segment,
                    xagg_common::wire::MAX_PAYLOAD,
                    op.name(),
                    dtype.name()
                ),
            ));
        }
        if self.slots == 0 {
            return Err(bad("slots", "0: a job needs at least one slot"));
        }
        if self.members.is_empty() || self.members.len() > MAX_MEMBERS {
            return Err(bad(
                "members",
                format!(
                    "{} members: a job has 1..={MAX_MEMBERS}",
                    self.members.len()
                ),
            ));
        }
        let mut job = Job {
            members: Job::members_bitmap(self.members.len()),
            slot_base,
            slot_count: self.slots,
            op: op as u8,
            dtype: dtype as u8,
            role: Role::Root as u8,
            _pad0: 0,
            seg_elems: self.segment,
            _pad1: 0,
            parent: MemberAddr::default(),
            member: [MemberAddr::default(); MAX_MEMBERS],
        };
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
        Ok(job)
    }

    /// The spec back from a `JOBS` entry (interfaces by name, resolved in this namespace).
    pub fn from_job(id: u32, job: &Job) -> Self {
        let n = job.members.count_ones() as usize;
        let members = job.member[..n]
            .iter()
            .map(|m| MemberSpec {
                interface: nix::net::if_::if_indextoname(m.ifindex)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| format!("ifindex {}", m.ifindex)),
                mac: iface::fmt_mac(&m.mac),
                addr: SocketAddrV4::new(Ipv4Addr::from(m.ip), u16::from_be_bytes(m.port)),
            })
            .collect();
        Self {
            id,
            op: Op::from_u8(job.op).map_or("?", Op::name).into(),
            dtype: DType::from_u8(job.dtype).map_or("?", DType::name).into(),
            segment: job.seg_elems,
            slots: job.slot_count,
            members,
            slot_base: Some(job.slot_base),
        }
    }
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

    #[test]
    fn errors_name_the_field() {
        let spec = JobSpec {
            id: 1,
            op: "mean".into(),
            dtype: "i32".into(),
            segment: 256,
            slots: 8,
            members: vec![],
            slot_base: None,
        };
        let e = spec.to_job(0).unwrap_err();
        assert_eq!(e.field, "op");
        assert!(e.problem.contains("use one of"), "{e}");
        let spec = JobSpec {
            op: "sum".into(),
            segment: 5000,
            ..spec
        };
        assert_eq!(spec.to_job(0).unwrap_err().field, "segment");
        let spec = JobSpec {
            segment: 256,
            ..spec
        };
        assert_eq!(spec.to_job(0).unwrap_err().field, "members");
        // Outside the op x type matrix: refused, with the matrix in the message.
        for (op, dtype) in [("prod", "f32"), ("xor", "bf16"), ("and", "f16")] {
            let bad = JobSpec {
                op: op.into(),
                dtype: dtype.into(),
                ..spec.clone()
            };
            let e = bad.to_job(0).unwrap_err();
            assert_eq!(e.field, "op");
            assert!(
                e.problem
                    .contains("floats (f32, f16, bf16) take sum, min, max, avg"),
                "{e}"
            );
        }
        // The largest segment depends on the lane: 431 for i64 and for the mean of i32.
        let wide = JobSpec {
            op: "avg".into(),
            segment: 432,
            ..spec.clone()
        };
        assert!(wide.to_job(0).unwrap_err().problem.contains("1..=431"));
    }
}
