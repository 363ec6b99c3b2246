//! Types shared by the XDP dataplane and user space: the wire header, the map layouts, the
//! counter names and the order of rounds. Everything here is `#[repr(C)]` with explicit
//! padding, so the kernel and user space agree on every byte; sizes are asserted at compile
//! time.
#![no_std]

pub mod counter;
pub mod job;
pub mod round;
pub mod shape;
pub mod slot;
pub mod wire;

pub use counter::Counter;
pub use job::{Job, MemberAddr, Role};
pub use round::Round;
pub use shape::{JobShape, ShapeError};
pub use slot::{ShadowCopy, ShadowState};
pub use wire::{DType, Header, Kind, Op};

/// Version of the pinned maps' layout: the set of maps and the bytes of their keys and
/// values. The daemon pins it with the dataplane (the `LAYOUT` map) and adopts a pinned
/// dataplane only when it agrees. Bump it with any change a running dataplane would
/// misread; dataplanes pinned before the version existed count as 1. Version 2 added the
/// counters `drop_spoofed_source` and `drop_bad_checksum`; version 3 moved the op and data
/// type from the job to each round (the shadow copy holds them) and holds a job's segment
/// length in bytes; version 4 has the programs reduce the mean of i64 in two lanes (an
/// adopted dataplane keeps its programs, so their behaviour counts as part of the layout);
/// version 5 records joining members' hellos (the `HELLOS` map, the `hello` counter);
/// version 6 counts per job and member (`JOB_COUNTERS`); version 7 keeps the first sender
/// of each drop reason (`DROPS`); version 8 finds jobs by the dense index of their id in
/// an array (`JOBS`), checking its generation (`Job::generation`); version 10 holds
/// segments of up to 8936 bytes then (multi-buffer frames: the `STAGE` and `FOLDS` maps, a fold
/// program per op and lane, results fanned out by `xagg_fanout`); version 11 reads header
/// version 2 (a 16-bit block exponent) and folds doubles (`xagg_fold_sum_bfp64`); version
/// 12 has inner levels (`Role::Inner`: `Job::parent_job`, the `PARENTS` map, the slot
/// state `PartialSent` and its counters); version 14 reads header version 3 (the member's
/// cookie: 8928-byte segments), keeps each member's cookie (`COOKIES`), marks its own
/// multi-buffer results for `xagg_fanout` in their metadata, counts `drop_tagged`, and keeps
/// each port's share of hellos (`Hello` values, `HELLO_COUNTS`, `drop_hello_quota`).
pub const LAYOUT_VERSION: u32 = 14;
