//! The layout of an aggregation slot. Each slot of the `SLOTS` map holds a spin lock and two
//! shadow copies that alternate between successive uses, so a finished result stays
//! available for a member whose copy was lost while the others have already moved on. The
//! state machine that drives them is in the XDP crate (`dataplane-ebpf/xdp/src/slot.rs`).

use crate::wire::{Lane, Op, MAX_PAYLOAD};

/// 64-bit words of aggregation data per shadow copy.
pub const SLOT_WORDS: usize = MAX_PAYLOAD / 8;

/// In a copy's `flags`, above the wire's 16 bits: a gather's copy holds its round's data
/// (its root's, or at a host level the parent's), so the host may complete its ranks'
/// round on a header-only completion from above.
pub const COPY_HAS_DATA: u32 = 1 << 16;

/// Slots the switch has, shared by all jobs; the control plane hands out ranges.
pub const MAX_SLOTS: u32 = 2048;

/// How a round's contributions combine: one per op and lane the switch reduces, each run by
/// a program of its own or of its group ([`Fold::program`]: `xagg_fold_*`, reached by a tail
/// call through the `FOLDS` map at this index), so each program's loops over a whole segment
/// fit the verifier's budget.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// Wrapping sum of 32-bit lanes, signed or not.
    Sum32 = 0,
    /// Wrapping sum of 64-bit lanes (i64, the widened mean of 32-bit integers, the split
    /// mean of i64).
    Sum64,
    /// Sum of block-floating-point mantissas, aligned to the larger exponent.
    SumBfp,
    /// The same over 64-bit mantissas (doubles).
    SumBfp64,
    MinI32,
    /// Minimum of unsigned 32-bit lanes (u32, and the order-preserving keys of floats).
    MinU32,
    /// Minimum of signed 64-bit lanes (i64, and the order-preserving keys of doubles).
    MinI64,
    MaxI32,
    MaxU32,
    MaxI64,
    /// Wrapping product of 32-bit lanes, signed or not.
    Prod32,
    Prod64,
    And,
    Or,
    Xor,
    /// Exact sum of 64-bit mantissas, aligned to the smaller exponent by left shifts.
    SumExact,
    /// The same over 128-bit mantissas (doubles).
    SumExact128,
    /// No reduction: a gather's round (all-gather, broadcast) stores its root's payload
    /// as it is, whatever its lanes hold.
    Move,
}

impl Fold {
    pub const COUNT: usize = 18;

    pub const ALL: [Fold; Self::COUNT] = [
        Self::Sum32,
        Self::Sum64,
        Self::SumBfp,
        Self::SumBfp64,
        Self::MinI32,
        Self::MinU32,
        Self::MinI64,
        Self::MaxI32,
        Self::MaxU32,
        Self::MaxI64,
        Self::Prod32,
        Self::Prod64,
        Self::And,
        Self::Or,
        Self::Xor,
        Self::SumExact,
        Self::SumExact128,
        Self::Move,
    ];

    /// The fold of `op` over `lane`, if the switch reduces it.
    pub const fn of(op: Op, lane: Lane) -> Option<Self> {
        use Lane::*;
        Some(match (op, lane) {
            (Op::Sum, I32 | U32) => Self::Sum32,
            (Op::Sum | Op::Avg, I64) | (Op::Avg, I64Split) => Self::Sum64,
            (Op::Sum | Op::Avg, Bfp32) => Self::SumBfp,
            (Op::Sum | Op::Avg, Bfp64) => Self::SumBfp64,
            (Op::Sum | Op::Avg, Exact) => Self::SumExact,
            (Op::Sum | Op::Avg, Exact128) => Self::SumExact128,
            (Op::Min, I32) => Self::MinI32,
            (Op::Min, U32 | Key32) => Self::MinU32,
            (Op::Min, I64 | Key64) => Self::MinI64,
            (Op::Max, I32) => Self::MaxI32,
            (Op::Max, U32 | Key32) => Self::MaxU32,
            (Op::Max, I64 | Key64) => Self::MaxI64,
            (Op::Prod, I32 | U32) => Self::Prod32,
            (Op::Prod, I64) => Self::Prod64,
            (Op::And, _) => Self::And,
            (Op::Or, _) => Self::Or,
            (Op::Xor, _) => Self::Xor,
            _ => return None,
        })
    }

    /// The name of the program that runs this fold. Folds that differ only in constants
    /// share one (min and max of 32-bit lanes, signed or not; of 64-bit lanes; and, or and
    /// xor), telling them apart by the round's [`Fold::masks`]: each program costs a daemon's
    /// start its verification (0.1–0.3 s of CPU), whatever it folds.
    pub const fn program(self) -> &'static str {
        match self {
            Self::Sum32 => "xagg_fold_sum32",
            Self::Sum64 => "xagg_fold_sum64",
            Self::SumBfp => "xagg_fold_sum_bfp",
            Self::SumBfp64 => "xagg_fold_sum_bfp64",
            Self::MinI32 | Self::MinU32 | Self::MaxI32 | Self::MaxU32 => "xagg_fold_order32",
            Self::MinI64 | Self::MaxI64 => "xagg_fold_order64",
            Self::Prod32 => "xagg_fold_prod32",
            Self::Prod64 => "xagg_fold_prod64",
            Self::And | Self::Or | Self::Xor => "xagg_fold_bitwise",
            Self::SumExact => "xagg_fold_sum_exact",
            Self::SumExact128 => "xagg_fold_sum_exact128",
            Self::Move => "xagg_fold_move",
        }
    }
}

/// The sign bits of the two 32-bit lanes of a 64-bit word: a fold's lane arithmetic keeps
/// them from carrying into the next lane, and [`Fold::masks`] flips them to order signed
/// lanes.
pub const LANE_SIGN: u64 = 0x8000_0000_8000_0000;

impl Fold {
    /// What tells apart the folds that share a program ([`Fold::program`]), as whole-word
    /// masks it applies without a branch. Min and max over 32-bit lanes: the lanes' sign
    /// bits where they are signed (flipped, they order as unsigned ones), and all ones for
    /// max; over 64-bit lanes: the sign bit, and all ones for max; and, or, xor: the masks
    /// of `a & b` and of `a ^ b` (or takes both). Read from the round, not written in as
    /// constants, because a compiler turns a compare it can see into a branch per word.
    pub const fn masks(self) -> [u64; 2] {
        const ALL: u64 = u64::MAX;
        const SIGN: u64 = 1 << 63;
        match self {
            Self::MinI32 => [LANE_SIGN, 0],
            Self::MaxI32 => [LANE_SIGN, ALL],
            Self::MinU32 => [0, 0],
            Self::MaxU32 => [0, ALL],
            Self::MinI64 => [SIGN, 0],
            Self::MaxI64 => [SIGN, ALL],
            Self::And => [ALL, 0],
            Self::Or => [ALL, ALL],
            Self::Xor => [0, ALL],
            _ => [0, 0],
        }
    }

    /// The name of the fold's program for steered contributions (run by the cpumap on the
    /// slot's CPU), in the `FOLDS_STEERED` program array at the same index.
    pub const fn steered_program(self) -> &'static str {
        match self {
            Self::Sum32 => "xagg_cpu_sum32",
            Self::Sum64 => "xagg_cpu_sum64",
            Self::SumBfp => "xagg_cpu_sum_bfp",
            Self::SumBfp64 => "xagg_cpu_sum_bfp64",
            Self::MinI32 | Self::MinU32 | Self::MaxI32 | Self::MaxU32 => "xagg_cpu_order32",
            Self::MinI64 | Self::MaxI64 => "xagg_cpu_order64",
            Self::Prod32 => "xagg_cpu_prod32",
            Self::Prod64 => "xagg_cpu_prod64",
            Self::And | Self::Or | Self::Xor => "xagg_cpu_bitwise",
            Self::SumExact => "xagg_cpu_sum_exact",
            Self::SumExact128 => "xagg_cpu_sum_exact128",
            Self::Move => "xagg_cpu_move",
        }
    }
}

/// Where `xagg_deliver` (an inner level's program for its parent's results) sits in the
/// `FOLDS` program array, after the folds.
pub const DELIVER: u32 = Fold::COUNT as u32;

/// Its program's name.
pub const DELIVER_PROGRAM: &str = "xagg_deliver";

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
    /// At an inner level (`Role::Inner`): every member's contribution is in, `data` holds
    /// their partial, sent to the parent; the parent's result will be stored over it.
    PartialSent = 3,
}

impl ShadowState {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Empty),
            1 => Some(Self::Filling),
            2 => Some(Self::Done),
            3 => Some(Self::PartialSent),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Filling => "filling",
            Self::Done => "done",
            Self::PartialSent => "partial_sent",
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
    /// Sticky `enc_flags` of the contributions (non-finite input, overflow), and above
    /// their 16 bits [`COPY_HAS_DATA`].
    pub flags: u32,
    /// The round's op and data type, fixed by its first contribution: every message
    /// carries its own, and a contribution that disagrees is refused.
    pub op: u8,
    /// With [`DTYPE_EXACT`](crate::wire::DTYPE_EXACT) for a round in the exact lane.
    pub dtype: u8,
    /// Exact lane: every value the data sums so far is below 2^`top` in magnitude (once
    /// complete: the sum itself is), [`EMPTY_TOP`] while all of them are zero.
    pub top: i16,
    /// The round's [`Collective`](crate::wire::Collective) and root, fixed by its first
    /// contribution like the op.
    pub collective: u8,
    pub root: u8,
    pub _pad: [u8; 2],
    pub data: [u64; SLOT_WORDS],
}

/// [`ShadowCopy::top`] of a copy whose values are all zero.
pub const EMPTY_TOP: i16 = i16::MIN;

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
