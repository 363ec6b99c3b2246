//! Types shared by the XDP dataplane and user space: the wire header, the map layouts and
//! the counter names. Everything here is `#[repr(C)]` with explicit padding, so the kernel
//! and user space agree on every byte; sizes are asserted at compile time.
#![no_std]

pub mod counter;
pub mod job;
pub mod slot;
pub mod wire;

pub use counter::Counter;
pub use job::{Job, MemberAddr, Role};
pub use slot::{SlotVersion, VersionState};
pub use wire::{DType, Header, Kind, Op};
