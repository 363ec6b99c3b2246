//! The layout of an aggregation slot. Each slot of the `SLOTS` map holds a spin lock and two
//! shadow copies that alternate between successive uses, so a finished result stays
//! available for a member whose copy was lost while the others have already moved on. The
//! state machine that drives them is in the XDP crate (`dataplane-ebpf/xdp/src/slot.rs`).

use crate::wire::MAX_PAYLOAD;

/// 64-bit words of aggregation data per shadow copy.
pub const SLOT_WORDS: usize = MAX_PAYLOAD / 8;

/// Slots the switch has, shared by all jobs; the control plane hands out ranges.
pub const MAX_SLOTS: u32 = 2048;

/// The state of one shadow copy.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShadowState {
    /// Never used, or released by the control plane.
    Empty = 0,
    /// Some members' contributions are in.
    Filling = 1,
    /// Every member's contribution is in; `data` holds the result.
    Done = 2,
}

impl ShadowState {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Empty),
            1 => Some(Self::Filling),
            2 => Some(Self::Done),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Filling => "filling",
            Self::Done => "done",
        }
    }
}

/// One of a slot's two shadow copies: the round it holds and its data.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ShadowCopy {
    /// The round this copy holds: the message and the segment within it.
    pub message: u32,
    pub segment: u32,
    /// Members whose contribution has been added.
    pub seen: u64,
    /// A [`ShadowState`].
    pub state: u32,
    /// Elements in this round's segment.
    pub count: u32,
    /// Block exponent of the data (block floating point lanes).
    pub exponent: i32,
    /// Sticky `enc_flags` of the contributions (non-finite input, overflow).
    pub flags: u32,
    /// The round's op and data type, fixed by its first contribution: every message
    /// carries its own, and a contribution that disagrees is refused.
    pub op: u8,
    pub dtype: u8,
    pub _pad: [u8; 6],
    pub data: [u64; SLOT_WORDS],
}

/// Bytes of a shadow copy in front of its data.
pub const COPY_HEADER: usize = 40;

const _: () = assert!(core::mem::size_of::<ShadowCopy>() == COPY_HEADER + MAX_PAYLOAD);

/// User-space image of a `SLOTS` entry: the kernel's `Slot` (XDP crate) has a
/// `bpf_spin_lock` (a u32) where this has `lock`; [`SLOT_SIZE`] ties the two.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotImage {
    pub lock: u32,
    pub _pad: u32,
    pub shadow: [ShadowCopy; 2],
}

/// Bytes of one `SLOTS` entry, in the kernel and in user space alike.
pub const SLOT_SIZE: usize = 8 + 2 * (COPY_HEADER + MAX_PAYLOAD);

const _: () = assert!(core::mem::size_of::<SlotImage>() == SLOT_SIZE);

#[cfg(feature = "aya")]
unsafe impl aya::Pod for SlotImage {}
