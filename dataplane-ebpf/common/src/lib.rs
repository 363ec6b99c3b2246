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

/// Version of the pinned maps' layout: the set of maps, the bytes of their keys and values,
/// and the programs' behaviour. The daemon pins it with the dataplane (the `LAYOUT` map) and
/// adopts a pinned dataplane only when it agrees; dataplanes pinned before the version
/// existed count as 1. Bump it with any change a running dataplane would misread, and say
/// what changed in `CHANGELOG.md`.
pub const LAYOUT_VERSION: u32 = 18;

/// The mark `xagg_switch` writes in front of a multi-buffer result of its own (in the
/// frame's XDP metadata, followed by the job's wire id) for `xagg_fanout`, which copies only
/// frames so marked.
pub const OWN_RESULT: u32 = 0x7861_7272;
