//! The layout of one version of an aggregation slot. Each slot of the `SLOTS` map holds a
//! spin lock and two versions (shadow copies) that alternate between successive uses, so a
//! finished result stays available for a member whose copy was lost while the others have
//! already moved on. The state machine that drives them is in the XDP crate (`slot.rs`).

use crate::wire::MAX_PAYLOAD;

/// 64-bit words of aggregation data per slot version.
pub const SLOT_WORDS: usize = MAX_PAYLOAD / 8;

/// Slots the switch has, shared by all jobs; the control plane hands out ranges.
pub const MAX_SLOTS: u32 = 2048;

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionState {
    /// Never used, or released by the control plane.
    Empty = 0,
    /// Some members' contributions are in.
    Filling = 1,
    /// Every member's contribution is in; `data` holds the result.
    Done = 2,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotVersion {
    /// The round this version holds: message id and sequence id of its segment.
    pub mid: u32,
    pub sid: u32,
    /// Members whose contribution has been added.
    pub seen: u64,
    /// A `VersionState`.
    pub state: u32,
    /// Elements in this round's segment.
    pub count: u32,
    /// Block exponent of the data (block floating point lanes).
    pub exponent: i32,
    /// Sticky `enc_flags` of the contributions (non-finite input, overflow).
    pub flags: u32,
    pub data: [u64; SLOT_WORDS],
}

const _: () = assert!(core::mem::size_of::<SlotVersion>() == 32 + MAX_PAYLOAD);

/// User-space image of a `SLOTS` entry (the kernel side has a `bpf_spin_lock` where this has
/// `lock`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotImage {
    pub lock: u32,
    pub _pad: u32,
    pub ver: [SlotVersion; 2],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for SlotImage {}
