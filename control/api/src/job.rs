//! What a job is to a user: a [`JobSpec`] (its id, op, data type, segment length, slots
//! and members, and its parent or ring if it is an inner level or a ring host). The
//! daemon, the CLI and job files all speak `JobSpec`; its shape (members, slots, segment
//! length) is a [`JobShape`], validated there. Checking its ports and addresses and
//! building the dataplane's entry from it is the daemon's (`xagg_daemon::job`).

use std::net::SocketAddrV4;

use serde::{Deserialize, Serialize};
use xagg_common::{
    wire::{self, DType, Lane, Op},
    JobShape,
};

use crate::Error;

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

/// The wire lane of `op` over `dtype`, or why the switch does not reduce it: every op over
/// integers; sum, min, max and avg over floats (a product of block floating point numbers
/// would need the exponents added and the mantissas renormalised per element, and bitwise
/// ops have no meaning for floats).
pub fn lane(op: Op, dtype: DType) -> Result<Lane, Error> {
    wire::lane(op, dtype).ok_or(Error::Unsupported { op, dtype })
}

impl JobSpec {
    /// What an added job is, in a line: "job N added: M members, OP TYPE, ...".
    pub fn added(&self) -> String {
        let base = self.slot_base.unwrap_or(0);
        format!(
            "job {} added: {} members, {} {}, {} elements per segment, slots {}..{}",
            self.id,
            self.members.len(),
            self.op,
            self.dtype,
            self.segment,
            base,
            base + self.slots
        )
    }

    /// The job's shape: its members, slots and segment length.
    pub fn shape(&self) -> Result<JobShape, Error> {
        let lane = lane(self.op, self.dtype).map_err(|e| Error::job("op", e.to_string()))?;
        JobShape::with_elements(
            self.members.len(),
            self.slots as usize,
            usize::from(self.segment),
            lane,
        )
        .map_err(|e| Error::job(e.field(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field a spec's shape is refused for, and why.
    fn refused(spec: &JobSpec) -> (String, String) {
        match spec.shape() {
            Err(Error::Job { field, problem }) => (field, problem),
            other => panic!("{spec:?}: {other:?}"),
        }
    }

    /// An added job in a line, as the CLI and the demo print it.
    #[test]
    fn an_added_job_in_a_line() {
        let mut spec: JobSpec = toml::from_str(include_str!("../../../docs/job.toml")).unwrap();
        spec.slot_base = Some(256);
        assert_eq!(
            spec.added(),
            format!(
                "job 1 added: {} members, sum i32, 860 elements per segment, slots 256..384",
                spec.members.len()
            )
        );
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
        assert_eq!(refused(&spec).0, "segment");
        let spec = JobSpec {
            segment: 256,
            ..spec
        };
        assert_eq!(refused(&spec).0, "members");
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
            let (field, problem) = refused(&bad);
            assert_eq!(field, "op");
            assert!(
                problem.contains("floats (f32, f64, f16, bf16) take sum, min, max, avg"),
                "{problem}"
            );
        }
        // The largest segment depends on the lane: 1116 for i64 and for the mean of i32.
        let wide = JobSpec {
            op: Op::Avg,
            segment: 1117,
            ..spec.clone()
        };
        assert!(refused(&wide).1.contains("1..=1116"));
        let none = JobSpec {
            slots: 0,
            ..spec.clone()
        };
        assert_eq!(refused(&none).0, "slots");
        // The message is the field's and the problem's, as the daemon answers it.
        assert!(spec.shape().is_ok_and(|s| s.segment_bytes() == 1024));
        assert!(none
            .shape()
            .unwrap_err()
            .to_string()
            .starts_with("job slots: "));
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
