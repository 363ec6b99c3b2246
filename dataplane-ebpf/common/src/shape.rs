//! The shape of a job: how many members it has, how many slots it owns, and how long its
//! segments are. The daemon's job spec, the worker's parameters, the CLI, parameter files,
//! the demo, the bench and the tests all hold a job's shape as this one type, validated
//! here and nowhere else.
//!
//! The segment length is held in **payload bytes** (lanes on the wire), not elements: how
//! many elements a segment carries depends on the lane of the op and type reduced
//! ([`crate::wire::Lane`]), and one job may reduce several op/type pairs.

use core::fmt;

use crate::{
    slot::MAX_SLOTS,
    wire::{Lane, MAX_MEMBERS, MAX_PAYLOAD},
};

/// A job's member count, slot count and segment length, each within what one aggregation
/// point holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "ShapeFields", into = "ShapeFields")
)]
pub struct JobShape {
    members: u8,
    slots: u16,
    segment_bytes: u16,
}

/// What is wrong with a shape, and how to fix it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Outside 1..=[`MAX_MEMBERS`].
    Members(usize),
    /// Outside 1..=[`MAX_SLOTS`].
    Slots(usize),
    /// A segment of `elements` lanes of `lane_size` bytes does not fit one frame (or is
    /// empty).
    Segment { elements: usize, lane_size: usize },
    /// `bytes` of payload are not a whole number of `lane_size`-byte lanes.
    SegmentLanes { bytes: usize, lane_size: usize },
}

impl ShapeError {
    /// The field of a job spec (or the CLI flag) that is wrong.
    pub const fn field(&self) -> &'static str {
        match self {
            Self::Members(_) => "members",
            Self::Slots(_) => "slots",
            Self::Segment { .. } | Self::SegmentLanes { .. } => "segment",
        }
    }
}

impl core::error::Error for ShapeError {}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Members(n) => write!(f, "{n} members: a job has 1..={MAX_MEMBERS}"),
            Self::Slots(0) => write!(f, "0: a job needs at least one slot"),
            Self::Slots(n) => write!(
                f,
                "{n} slots: the switch has {MAX_SLOTS} in all, a job takes 1..={MAX_SLOTS}"
            ),
            Self::Segment {
                elements,
                lane_size,
            } => write!(
                f,
                "{elements} elements: choose 1..={} ({MAX_PAYLOAD} bytes of {lane_size}-byte lanes fit a 9000-byte MTU)",
                MAX_PAYLOAD / lane_size
            ),
            Self::SegmentLanes { bytes, lane_size } => write!(
                f,
                "{bytes} bytes is not a whole number of {lane_size}-byte lanes"
            ),
        }
    }
}

impl JobShape {
    /// A shape of `members` members, `slots` slots and segments of `segment_bytes` payload
    /// bytes (1..=[`MAX_PAYLOAD`]).
    pub const fn new(
        members: usize,
        slots: usize,
        segment_bytes: usize,
    ) -> Result<Self, ShapeError> {
        if members == 0 || members > MAX_MEMBERS {
            return Err(ShapeError::Members(members));
        }
        if slots == 0 || slots > MAX_SLOTS as usize {
            return Err(ShapeError::Slots(slots));
        }
        if segment_bytes == 0 || segment_bytes > MAX_PAYLOAD {
            return Err(ShapeError::Segment {
                elements: segment_bytes,
                lane_size: 1,
            });
        }
        Ok(Self {
            members: members as u8,
            slots: slots as u16,
            segment_bytes: segment_bytes as u16,
        })
    }

    /// A shape whose segments carry `elements` lanes of `lane` — how people state a
    /// segment length (`--segment 860` for i32).
    pub const fn with_elements(
        members: usize,
        slots: usize,
        elements: usize,
        lane: Lane,
    ) -> Result<Self, ShapeError> {
        let size = lane.size();
        if elements == 0 || elements > MAX_PAYLOAD / size {
            return Err(ShapeError::Segment {
                elements,
                lane_size: size,
            });
        }
        Self::new(members, slots, elements * size)
    }

    /// A shape with the longest segment one frame carries.
    pub const fn full(members: usize, slots: usize) -> Result<Self, ShapeError> {
        Self::new(members, slots, MAX_PAYLOAD)
    }

    pub const fn members(&self) -> usize {
        self.members as usize
    }

    /// The bitmap of all members: one bit per member index.
    pub const fn member_bits(&self) -> u64 {
        if self.members as usize >= 64 {
            u64::MAX
        } else {
            (1u64 << self.members) - 1
        }
    }

    pub const fn slots(&self) -> usize {
        self.slots as usize
    }

    /// Payload bytes of a full segment.
    pub const fn segment_bytes(&self) -> usize {
        self.segment_bytes as usize
    }

    /// Elements of `lane` in a full segment, if the segment is a whole number of them.
    pub const fn segment_elements(&self, lane: Lane) -> Result<usize, ShapeError> {
        let size = lane.size();
        if !(self.segment_bytes as usize).is_multiple_of(size) {
            return Err(ShapeError::SegmentLanes {
                bytes: self.segment_bytes as usize,
                lane_size: size,
            });
        }
        Ok(self.segment_bytes as usize / size)
    }
}

/// A shape as it is written (JSON, a state file): read through [`JobShape::new`], so a
/// shape read is a valid one.
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapeFields {
    members: usize,
    slots: usize,
    segment_bytes: usize,
}

#[cfg(feature = "serde")]
impl TryFrom<ShapeFields> for JobShape {
    type Error = ShapeError;
    fn try_from(f: ShapeFields) -> Result<Self, ShapeError> {
        Self::new(f.members, f.slots, f.segment_bytes)
    }
}

#[cfg(feature = "serde")]
impl From<JobShape> for ShapeFields {
    fn from(s: JobShape) -> Self {
        Self {
            members: s.members(),
            slots: s.slots(),
            segment_bytes: s.segment_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert_eq!(JobShape::new(0, 1, 8), Err(ShapeError::Members(0)));
        assert_eq!(JobShape::new(65, 1, 8), Err(ShapeError::Members(65)));
        assert_eq!(JobShape::new(2, 0, 8), Err(ShapeError::Slots(0)));
        assert_eq!(JobShape::new(2, 2049, 8), Err(ShapeError::Slots(2049)));
        assert!(JobShape::new(64, 2048, MAX_PAYLOAD).is_ok());
        let s = JobShape::with_elements(4, 128, 860, Lane::I32).unwrap();
        assert_eq!((s.members(), s.slots(), s.segment_bytes()), (4, 128, 3440));
        assert_eq!(s.segment_elements(Lane::I32), Ok(860));
        assert_eq!(s.segment_elements(Lane::I64), Ok(430));
        assert_eq!(s.member_bits(), 0b1111);
        let e = JobShape::with_elements(4, 1, 1117, Lane::I64).unwrap_err();
        assert_eq!(e.field(), "segment");
        assert_eq!(
            e,
            ShapeError::Segment {
                elements: 1117,
                lane_size: 8
            }
        );
        assert!(JobShape::with_elements(4, 1, 1116, Lane::I64).is_ok());
        let odd = JobShape::with_elements(4, 1, 5, Lane::I32).unwrap();
        assert!(odd.segment_elements(Lane::I64).is_err());
        assert_eq!(JobShape::full(64, 1).unwrap().member_bits(), u64::MAX);
    }
}
