//! What a message reduces: the operations, the element types, and the lane each pair
//! travels in on the wire (its encoding and element size).

use super::MAX_PAYLOAD;

/// Reduction operations. Only the ones the dataplane implements are accepted by the
/// control plane when a job is created.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum = 1,
    Min = 2,
    Max = 3,
    Avg = 4,
    Prod = 5,
    And = 6,
    Or = 7,
    Xor = 8,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::Sum,
        Op::Min,
        Op::Max,
        Op::Avg,
        Op::Prod,
        Op::And,
        Op::Or,
        Op::Xor,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Sum),
            2 => Some(Self::Min),
            3 => Some(Self::Max),
            4 => Some(Self::Avg),
            5 => Some(Self::Prod),
            6 => Some(Self::And),
            7 => Some(Self::Or),
            8 => Some(Self::Xor),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
            Self::Prod => "prod",
            Self::And => "and",
            Self::Or => "or",
            Self::Xor => "xor",
        }
    }
}

impl core::str::FromStr for Op {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or(UnknownName::OP)
    }
}

impl core::fmt::Display for Op {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an op (or a data type): its message lists the valid ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownName {
    pub what: &'static str,
    pub valid: &'static str,
}

impl UnknownName {
    pub const OP: Self = Self {
        what: "op",
        valid: "sum, min, max, avg, prod, and, or, xor",
    };
    pub const DTYPE: Self = Self {
        what: "dtype",
        valid: "i32, u32, i64, f32, f16, bf16, f64",
    };
    pub const COLLECTIVE: Self = Self {
        what: "collective",
        valid: "allreduce, reduce_scatter, all_gather, broadcast, reduce",
    };
    pub const FLOAT: Self = Self {
        what: "float mode",
        valid: "fast, exact",
    };
}

impl core::error::Error for UnknownName {}

impl core::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "unknown {}: use one of {}", self.what, self.valid)
    }
}

/// Element data types on the wire.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    I32 = 1,
    U32 = 2,
    I64 = 3,
    F32 = 4,
    F16 = 5,
    Bf16 = 6,
    F64 = 7,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::F64,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::I32),
            2 => Some(Self::U32),
            3 => Some(Self::I64),
            4 => Some(Self::F32),
            5 => Some(Self::F16),
            6 => Some(Self::Bf16),
            7 => Some(Self::F64),
            _ => None,
        }
    }

    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::F64 => 8,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::I64 => "i64",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::F64 => "f64",
        }
    }

    /// Most elements of this type one segment can carry when each travels in `size()`
    /// bytes; see [`max_elements`] for a job's op.
    pub const fn max_elements(self) -> usize {
        MAX_PAYLOAD / self.size()
    }
}

impl core::str::FromStr for DType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or(UnknownName::DTYPE)
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// How elements of a job travel and are reduced: the wire encoding chosen by the job's op
/// and data type. The switch works on lanes only; the worker library converts.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Signed 32-bit integers.
    I32 = 1,
    /// Unsigned 32-bit integers.
    U32 = 2,
    /// Signed 64-bit integers (also the widened sums of `avg` over i32 and u32).
    I64 = 3,
    /// Block floating point: signed 32-bit mantissas scaled by 2^`exponent` of the packet;
    /// the switch aligns blocks to the larger exponent before adding.
    Bfp32 = 4,
    /// Order-preserving unsigned 32-bit keys of floats (min and max).
    Key32 = 5,
    /// The mean of i64: each element as two signed 64-bit lanes, its high 32 bits (signed)
    /// and its low 32 bits (unsigned), so the switch's wrapping sums of both are exact for
    /// any 64 members and the worker divides the 128-bit sum once.
    I64Split = 6,
    /// Block floating point of doubles: signed 64-bit mantissas scaled by 2^`exponent`.
    Bfp64 = 7,
    /// Order-preserving signed 64-bit keys of doubles (min and max): the switch takes the
    /// signed min or max, as of i64.
    Key64 = 8,
    /// Exact sums of f32, f16 and bf16: each element an exact signed 64-bit multiple of
    /// 2^`exponent` (the packet's; [`Header::magnitude`](super::Header) bounds them); the
    /// switch aligns every block to the smallest exponent seen, with left shifts, which
    /// lose nothing, so its sum is the exact sum whatever the arrival order or level. A sum
    /// too wide for the lanes is flagged ([`ENC_OVERFLOW`]), never rounded.
    Exact = 9,
    /// Exact sums of doubles: the same in signed 128-bit lanes (16 bytes an element, the
    /// low 64-bit word first), room for a double's 53 bits and 70 binary orders between
    /// the members' values.
    Exact128 = 10,
}

impl Lane {
    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Self::I64 | Self::Bfp64 | Self::Key64 | Self::Exact => 8,
            Self::I64Split | Self::Exact128 => 16,
            _ => 4,
        }
    }

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::I32),
            2 => Some(Self::U32),
            3 => Some(Self::I64),
            4 => Some(Self::Bfp32),
            5 => Some(Self::Key32),
            6 => Some(Self::I64Split),
            7 => Some(Self::Bfp64),
            8 => Some(Self::Key64),
            9 => Some(Self::Exact),
            10 => Some(Self::Exact128),
            _ => None,
        }
    }
}

/// The wire encoding of `op` over `dtype` in float mode `float`: sums of f32, f16 and bf16
/// in the exact mode travel in [`Lane::Exact`], of doubles in [`Lane::Exact128`]; everything
/// else as [`lane`] says.
pub const fn lane_in(op: Op, dtype: DType, float: Float) -> Option<Lane> {
    match (float, op, dtype) {
        (Float::Exact, Op::Sum | Op::Avg, DType::F32 | DType::F16 | DType::Bf16) => {
            Some(Lane::Exact)
        }
        (Float::Exact, Op::Sum | Op::Avg, DType::F64) => Some(Lane::Exact128),
        _ => lane(op, dtype),
    }
}

/// How a message's float sums travel: block floating point (fast: one exponent per
/// segment, a bound on the error, the result dependent on the order contributions meet),
/// or exact (twice the bytes of f32 on the wire; the sum of exactly the inputs, the same
/// whatever the order; a segment too wide for the lanes flagged; doubles in 128-bit
/// lanes, twice their bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Float {
    #[default]
    Fast,
    Exact,
}

impl Float {
    /// The header flags of a message in this mode.
    pub const fn flags(self) -> u8 {
        match self {
            Self::Fast => 0,
            Self::Exact => super::FLAG_EXACT,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Exact => "exact",
        }
    }

    /// The mode a header's flags say.
    pub const fn of_flags(flags: u8) -> Self {
        if flags & super::FLAG_EXACT != 0 {
            Self::Exact
        } else {
            Self::Fast
        }
    }
}

impl core::str::FromStr for Float {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        [Self::Fast, Self::Exact]
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or(UnknownName::FLOAT)
    }
}

impl core::fmt::Display for Float {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The wire encoding of `op` over `dtype` in the fast float mode, or `None` if the switch
/// does not reduce it (products and bitwise ops of floats).
pub const fn lane(op: Op, dtype: DType) -> Option<Lane> {
    match (op, dtype) {
        (Op::Avg, DType::I32 | DType::U32) => Some(Lane::I64),
        (Op::Avg, DType::I64) => Some(Lane::I64Split),
        (_, DType::I32) => Some(Lane::I32),
        (_, DType::U32) => Some(Lane::U32),
        (_, DType::I64) => Some(Lane::I64),
        (Op::Sum | Op::Avg, DType::F64) => Some(Lane::Bfp64),
        (Op::Min | Op::Max, DType::F64) => Some(Lane::Key64),
        (Op::Sum | Op::Avg, _) => Some(Lane::Bfp32),
        (Op::Min | Op::Max, _) => Some(Lane::Key32),
        _ => None,
    }
}

/// `enc_flags` bit: some member's segment held NaN or an infinity that the encoding cannot
/// carry; the switch keeps it sticky in the slot and returns it with the result.
pub const ENC_NONFINITE: u16 = 1 << 0;
/// `enc_flags` bit: a sum too wide for its lanes ([`Lane::Exact`]: the members' blocks span
/// more binary orders than 64 bits hold); set by the member whose own segment does not fit,
/// or by the aggregation point where the aligned sum would not; sticky like
/// [`ENC_NONFINITE`], so every member finds it in the result of that segment.
pub const ENC_OVERFLOW: u16 = 1 << 1;
/// `enc_flags` bit: in a member's contribution sent again, the member gave up on the round
/// (its collective timeout passed); the switch keeps it in a round still filling (or
/// waiting for its parent, and sends it up with the partial) and returns it with the
/// result, so every member fails that call, the late one included. A round already
/// complete is answered with its result instead, and the call succeeds everywhere.
pub const ENC_WITHDRAWN: u16 = 1 << 2;

/// Most elements one segment of `op` over `dtype` carries.
pub const fn max_elements(op: Op, dtype: DType) -> usize {
    max_elements_in(op, dtype, Float::Fast)
}

/// Most elements one segment of `op` over `dtype` carries in float mode `float`.
pub const fn max_elements_in(op: Op, dtype: DType, float: Float) -> usize {
    match lane_in(op, dtype, float) {
        Some(l) => MAX_PAYLOAD / l.size(),
        None => 0,
    }
}
