//! Worker-side conversions between a buffer's elements and the wire's lanes
//! (`xagg_common::wire::Lane`). BPF has no floating point, so floats become integers here:
//!
//! - integers travel as they are; `avg` over i32 and u32 travels widened to i64, and `avg`
//!   over i64 as two i64 lanes (high and low 32 bits), so the switch's sums are exact, and
//!   the worker divides;
//! - `sum` and `avg` of floats use **block floating point**: each packet carries one
//!   exponent `k` and signed 32-bit mantissas `m = round(x / 2^k)`, with `k` chosen so the
//!   largest magnitude of the segment maps to at most 2^24. The switch aligns two blocks to
//!   the larger exponent (an arithmetic shift of the smaller one) and adds; 2^24 x 64
//!   members < 2^31, so the sum never overflows; a job of more than 64 ranks (a tree)
//!   keeps a bit less per doubling ([`bfp_bits`]), so no level can overflow either.
//!   Doubles do the same with signed 64-bit mantissas (at most 2^56: 2^56 x 64 < 2^63);
//! - `min` and `max` of floats use an order-preserving map of the f32 bits to u32 keys
//!   (of the f64 bits to signed i64 keys for doubles): exact, infinities included.
//!
//! NaN (and, for sums, infinities) cannot be carried: the segment is flagged
//! (`ENC_NONFINITE`), the flag comes back with the result, and the worker reports it.
//! Buffers hold little-endian elements (the native layout of the hosts this runs on).

use half::{bf16, f16};
use multiversion::multiversion;
use xagg_common::wire::{lane_in, DType, Float, Lane, Op, ENC_NONFINITE, ENC_OVERFLOW};

/// Mantissa bits of block floating point.
pub const BFP_BITS: i32 = 24;
/// Mantissa bits of block floating point over doubles: three more than a double has, so
/// the elements below the segment's largest keep more of theirs.
pub const BFP64_BITS: i32 = 56;
/// The block exponent of a segment of zeros: below any other, so the switch shifts it away.
pub const ZERO_EXPONENT: i16 = i16::MIN;

/// Bytes one element of `dtype` takes in a buffer.
pub const fn native_size(dtype: DType) -> usize {
    dtype.size()
}

/// What encoding a segment produced besides its lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    pub exponent: i16,
    pub flags: u16,
    /// The exact lane's: every mantissa below 2^`magnitude` in magnitude.
    pub magnitude: u8,
}

/// Writes `x` rounded once (to nearest even) to `dtype`.
pub(crate) fn put(dtype: DType, x: f64, b: &mut [u8]) {
    match dtype {
        DType::F64 => b.copy_from_slice(&x.to_le_bytes()),
        DType::F32 => b.copy_from_slice(&(x as f32).to_le_bytes()),
        DType::F16 => b.copy_from_slice(&f16::from_f32(to_odd(x)).to_bits().to_le_bytes()),
        _ => b.copy_from_slice(&bf16::from_f32(to_odd(x)).to_bits().to_le_bytes()),
    }
}

/// `x` as an f32 rounded to odd: truncated, with the last bit set when anything was cut.
/// half's `from_f64` rounds to an f32 and then again (1 + 2^-11 + 2^-24 became 1 as an
/// f16, not 1 + 2^-10: the first rounding made it a midpoint); rounding to odd first keeps
/// the sign of what was cut, so the f32's rounding to f16 or bf16 (which keep at least
/// two bits fewer) is the one rounding of `x`. Written with selects, not branches, so
/// that a loop of it vectorises.
#[inline(always)]
fn to_odd(x: f64) -> f32 {
    let y = x as f32;
    let back = f64::from(y);
    // Rounded away from zero (past f32's range: to infinity): one step back.
    let t = y.to_bits() - u32::from(back.abs() > x.abs());
    f32::from_bits(if back == x || x.is_nan() {
        y.to_bits()
    } else {
        t | 1
    })
}

/// An f32 rounded to bf16 (to nearest, ties to even; NaN stays NaN): half's `from_f32`,
/// with selects for its branches so that a loop of it vectorises.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b + 0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if b & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// Elements of f16 a segment holds at most (in 32-bit lanes): what the conversions widen
/// to f32 on the stack, with half's vector conversions.
const HALVES: usize = xagg_common::wire::max_elements_in(Op::Max, DType::F16, Float::Fast);

/// The f16 elements of `src` widened exactly to f32 bytes in `wide` (twice `src`'s
/// length), a segment's worth at a time.
fn widen_halves(src: &[u8], wide: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    for (src, wide) in src.chunks(2 * HALVES).zip(wide.chunks_mut(4 * HALVES)) {
        let n = src.len() / 2;
        let mut h = [f16::ZERO; HALVES];
        let mut f = [0f32; HALVES];
        for (d, b) in h.iter_mut().zip(src.chunks_exact(2)) {
            *d = f16::from_bits(u16::from_le_bytes(b.try_into().unwrap()));
        }
        h[..n].convert_to_f32_slice(&mut f[..n]);
        for (d, x) in wide.chunks_exact_mut(4).zip(&f[..n]) {
            d.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Writes the f64 `values` rounded once to `dtype` into `dst` (f32, f16 or bf16), with
/// [`put`]'s rounding in loops that vectorise (f16 through half's vector conversion).
#[inline(always)]
fn put_all(dtype: DType, values: impl Iterator<Item = f64>, dst: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (x, d) in values.zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&(x as f32).to_le_bytes())
            }
        }
        DType::F16 => {
            use half::slice::HalfFloatSliceExt;
            let mut values = values;
            for dst in dst.chunks_mut(2 * HALVES) {
                let n = dst.len() / 2;
                let mut f = [0f32; HALVES];
                let mut h = [f16::ZERO; HALVES];
                for (d, x) in f[..n].iter_mut().zip(&mut values) {
                    *d = to_odd(x);
                }
                h[..n].convert_from_f32_slice(&f[..n]);
                for (d, x) in dst.chunks_exact_mut(2).zip(&h[..n]) {
                    d.copy_from_slice(&x.to_bits().to_le_bytes());
                }
            }
        }
        _ => {
            for (x, d) in values.zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&bf16_bits(to_odd(x)).to_le_bytes())
            }
        }
    }
}

/// 2^k as an f64 (k within f64's normal range, -1022..=1023).
fn pow2(k: i32) -> f64 {
    f64::from_bits(((1023 + k) as u64) << 52)
}

/// `x * 2^k` for any `k`, as two factors within f64's normal range: for an integer `x` the
/// first product is exact and the second rounds once (to a subnormal, zero or infinity
/// only when the value is one).
#[derive(Clone, Copy)]
struct Scale(f64, f64);

impl Scale {
    fn new(k: i32) -> Self {
        let k = k.clamp(-2000, 2000);
        let k1 = k.clamp(-1000, 1000);
        Self(pow2(k1), pow2(k - k1))
    }
    #[inline(always)]
    fn apply(self, x: f64) -> f64 {
        x * self.0 * self.1
    }
}

/// floor(log2 |x|) of a finite, non-zero x, subnormals included.
fn log2_floor(x: f64) -> i32 {
    let bits = x.to_bits() & !(1 << 63);
    let biased = (bits >> 52) as i32;
    if biased == 0 {
        // Subnormal: 2^-1074 times the fraction field.
        -1074 + 63 - bits.leading_zeros() as i32
    } else {
        biased - 1023
    }
}

/// Order-preserving key of an f64: signed order of keys = numeric order of values (the
/// bits of a negative value with all but the sign inverted). Its own inverse.
pub fn key64(bits: u64) -> i64 {
    let v = bits as i64;
    if v < 0 {
        v ^ i64::MAX
    } else {
        v
    }
}

/// Order-preserving key of an f32: unsigned order of keys = numeric order of values.
pub fn key(x: f32) -> u32 {
    let u = x.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

pub fn unkey(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
}

/// Block exponent for a segment whose largest magnitude is `max`, in mantissas of `bits`
/// bits: the smallest `k` with `max / 2^k < 2^bits` ([`ZERO_EXPONENT`] for zeros).
pub fn block_exponent(max: f64, bits: i32) -> i16 {
    if max == 0.0 {
        return ZERO_EXPONENT;
    }
    // max = f * 2^e with f in [1, 2): max / 2^(e + 1 - bits) < 2^bits.
    (log2_floor(max) + 1 - bits) as i16
}

/// Ranks a job may have for its float sums to keep at least 12 mantissa bits (f32, f16,
/// bf16; doubles keep 44).
pub const MAX_RANKS: usize = 1 << 18;

/// The mantissa bits of block floating point over `dtype` in a job of `ranks` ranks (all
/// its levels together): [`BFP_BITS`] ([`BFP64_BITS`] for doubles) up to 64 ranks, one
/// less per doubling beyond, so `ranks` mantissas add below 2^30 (2^62) wherever in a tree
/// they meet: no aggregation point ever rounds a sum, only aligns blocks.
pub const fn bfp_bits(dtype: DType, ranks: usize) -> i32 {
    let (base, lane) = match dtype {
        DType::F64 => (BFP64_BITS, 62),
        _ => (BFP_BITS, 30),
    };
    let headroom = usize::BITS - ranks.saturating_sub(1).leading_zeros();
    let bits = lane - headroom as i32;
    if bits < base {
        bits
    } else {
        base
    }
}

/// Encodes the `src` elements of `dtype` into `out` (count x lane size bytes) for `op` in
/// float mode `float`, in a job of `ranks` ranks.
pub fn encode(
    op: Op,
    dtype: DType,
    float: Float,
    ranks: usize,
    src: &[u8],
    out: &mut [u8],
) -> Encoded {
    if dtype == DType::F16 {
        // f16 widens to f32 exactly and travels in the same lanes (a segment on the
        // stack; a longer buffer, which the worker never encodes at once, on the heap).
        let (mut stack, mut heap) = ([0u8; 4 * HALVES], Vec::new());
        let wide = if src.len() <= 2 * HALVES {
            &mut stack[..2 * src.len()]
        } else {
            heap.resize(2 * src.len(), 0);
            &mut heap[..]
        };
        widen_halves(src, wide);
        return encode_elements(op, DType::F32, float, ranks, wide, out);
    }
    encode_elements(op, dtype, float, ranks, src, out)
}

/// The loops of each float lane are built twice, for the baseline and for AVX2 (the
/// compiler vectorises them; nothing fuses a multiply and an add, so both builds give the
/// same bits), and the AVX2 build is taken where the CPU has it: about twice the speed.
fn encode_elements(
    op: Op,
    dtype: DType,
    float: Float,
    ranks: usize,
    src: &[u8],
    out: &mut [u8],
) -> Encoded {
    let l = lane_in(op, dtype, float).expect("the job's op and type have a lane");
    let mut enc = Encoded::default();
    match l {
        Lane::I32 | Lane::U32 => out[..src.len()].copy_from_slice(src),
        Lane::I64Split => {
            for (s, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
                let x = i64::from_le_bytes(s.try_into().unwrap());
                o[..8].copy_from_slice(&(x >> 32).to_le_bytes());
                o[8..].copy_from_slice(&(x & 0xffff_ffff).to_le_bytes());
            }
        }
        Lane::I64 => match dtype {
            DType::I64 => out[..src.len()].copy_from_slice(src),
            DType::I32 => {
                for (s, o) in src.chunks_exact(4).zip(out.chunks_exact_mut(8)) {
                    o.copy_from_slice(
                        &(i32::from_le_bytes(s.try_into().unwrap()) as i64).to_le_bytes(),
                    );
                }
            }
            _ => {
                for (s, o) in src.chunks_exact(4).zip(out.chunks_exact_mut(8)) {
                    o.copy_from_slice(
                        &(u32::from_le_bytes(s.try_into().unwrap()) as u64).to_le_bytes(),
                    );
                }
            }
        },
        Lane::Bfp32 => enc = encode_bfp32(dtype, bfp_bits(dtype, ranks), src, out),
        Lane::Key32 => enc = encode_key32(dtype, src, out),
        Lane::Bfp64 => enc = bfp64_encode(src, out, bfp_bits(dtype, ranks)),
        Lane::Exact => enc = encode_exact(dtype, src, out),
        Lane::Exact128 => enc = exact128_encode(src, out),
        Lane::Key64 => {
            let mut nan = false;
            for (s, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
                let bits = u64::from_le_bytes(s.try_into().unwrap());
                nan |= f64::from_bits(bits).is_nan();
                o.copy_from_slice(&key64(bits).to_le_bytes());
            }
            if nan {
                enc.flags |= ENC_NONFINITE;
            }
        }
    }
    enc
}

/// The block lane of f32 and bf16 (f16 comes widened to f32, [`encode`]).
#[multiversion(targets("x86_64+avx2"))]
fn encode_bfp32(dtype: DType, bits: i32, src: &[u8], out: &mut [u8]) -> Encoded {
    match dtype {
        DType::F32 => bfp_encode_bits(src, out, bits, 4, |b| {
            u32::from_le_bytes(b.try_into().unwrap())
        }),
        _ => bfp_encode_bits(src, out, bits, 2, |b| bf16_bytes_to_f32(b).to_bits()),
    }
}

/// The key lane of f32 and bf16.
#[multiversion(targets("x86_64+avx2"))]
fn encode_key32(dtype: DType, src: &[u8], out: &mut [u8]) -> Encoded {
    match dtype {
        DType::F32 => key_encode(src, out, 4, |b| f32::from_le_bytes(b.try_into().unwrap())),
        _ => key_encode(src, out, 2, bf16_bytes_to_f32),
    }
}

/// The exact lane of f32 and bf16.
#[multiversion(targets("x86_64+avx2"))]
fn encode_exact(dtype: DType, src: &[u8], out: &mut [u8]) -> Encoded {
    match dtype {
        DType::F32 => exact_encode(src, out, 4, |b| u32::from_le_bytes(b.try_into().unwrap())),
        _ => exact_encode(src, out, 2, |b| bf16_bytes_to_f32(b).to_bits()),
    }
}

/// Block floating point over doubles: one exponent for the segment, 64-bit mantissas.
/// As [`bfp_encode_bits`]: the largest finite magnitude an integer maximum of the bits,
/// each mantissa read from a double's bits (no vector conversion to i64 before AVX-512).
#[multiversion(targets("x86_64+avx2"))]
fn bfp64_encode(src: &[u8], out: &mut [u8], bits: i32) -> Encoded {
    const INF: u64 = 0x7ff0_0000_0000_0000;
    const FRACTION: u64 = (1 << 52) - 1;
    let load = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    let mut enc = Encoded::default();
    let (mut top, mut nonfinite) = (0u64, false);
    for b in src.chunks_exact(8) {
        let a = load(b) & !(1 << 63);
        nonfinite |= a >= INF;
        top = top.max(if a < INF { a } else { 0 });
    }
    if nonfinite {
        enc.flags |= ENC_NONFINITE;
    }
    enc.exponent = block_exponent(f64::from_bits(top), bits);
    let n = src.len() / 8;
    if top == 0 {
        out[..n * 8].fill(0);
        return enc;
    }
    let scale = Scale::new(-(enc.exponent as i32));
    for (b, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        let x = load(b);
        // Scaling by a power of two is exact here (the value lands below 2^56 and above
        // f64's subnormals); the one rounding is to the integer.
        let v = scale.apply(f64::from_bits(x));
        let w = v.to_bits();
        // Below 2^51: rounded to even by 1.5 x 2^52, read from the fraction bits. From
        // 2^51 a double has at most one fraction bit, which is cut (at most half a unit
        // off, as rounding): the significand shifted by its exponent, from 1 right to 3
        // left.
        let small = (((v + ROUNDING).to_bits() & FRACTION) as i64) - (1 << 51);
        let shift = ((w >> 52) & 0x7ff) as i64 - 1075;
        let significand = (w & FRACTION) | (1 << 52);
        let large = if shift < 0 {
            significand >> 1
        } else {
            significand << (shift & 7)
        } as i64;
        let large = if w >> 63 != 0 { -large } else { large };
        let m = if w & !(1 << 63) < 0x4320_0000_0000_0000 {
            small
        } else {
            large
        };
        let m = if x & !(1 << 63) < INF { m } else { 0 };
        o.copy_from_slice(&m.to_le_bytes());
    }
    enc
}

/// bf16 is the high half of an f32.
#[inline(always)]
fn bf16_bytes_to_f32(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b.try_into().unwrap()) as u32) << 16)
}

/// 1.5 x 2^52: a double `v` with |v| < 2^51 plus this has no fraction bits, and the low
/// bits of its mantissa field hold `v` rounded to the nearest integer (ties to even) in
/// two's complement.
const ROUNDING: f64 = 6_755_399_441_055_744.0;

/// Block floating point over elements read as f32 bits (f32, bf16), in straight-line
/// integer and double arithmetic the compiler vectorises (the per-element encoder it
/// replaced was 5-20x slower): finite magnitudes order as their bits do, so the largest is
/// an integer maximum; `x * 2^-k` is exact in a double (an f32's range scaled by at most 2^172), and
/// adding 1.5 x 2^52 rounds it to the integer (ties to even) held in the sum's low bits.
#[inline(always)]
fn bfp_encode_bits(
    src: &[u8],
    out: &mut [u8],
    bits: i32,
    size: usize,
    load: impl Fn(&[u8]) -> u32,
) -> Encoded {
    const INF: u32 = 0x7f80_0000;
    let mut enc = Encoded::default();
    let (mut top, mut nonfinite) = (0u32, false);
    for b in src.chunks_exact(size) {
        let a = load(b) & 0x7fff_ffff;
        nonfinite |= a >= INF;
        top = top.max(if a < INF { a } else { 0 });
    }
    if nonfinite {
        enc.flags |= ENC_NONFINITE;
    }
    enc.exponent = block_exponent(f64::from(f32::from_bits(top)), bits);
    let n = src.len() / size;
    if top == 0 {
        // Zeros (and what cannot be carried) travel as zero mantissas.
        out[..n * 4].fill(0);
        return enc;
    }
    let scale = pow2(-(enc.exponent as i32));
    for (b, o) in src.chunks_exact(size).zip(out.chunks_exact_mut(4)) {
        let x = load(b);
        let v = f64::from(f32::from_bits(x)) * scale + ROUNDING;
        let m = if x & 0x7fff_ffff < INF {
            v.to_bits() as u32
        } else {
            0
        };
        o.copy_from_slice(&m.to_le_bytes());
    }
    enc
}

/// Bits the exact lane's mantissas may have: 63 and the sign.
pub const EXACT_BITS: i32 = 63;

/// The exact lane: every element an exact multiple of 2^k, k the lowest set bit's weight
/// over the segment, so the mantissas `x / 2^k` are integers that lose nothing. A segment
/// whose mantissas would need more than [`EXACT_BITS`] is flagged ([`ENC_OVERFLOW`]) and
/// travels as zeros; NaN and infinities are flagged as in every float lane. Works on the
/// f32 bits (`bits` of each element; f16 and bf16 widen exactly) with integer operations
/// and selects rather than branches, which the compiler turns into straight-line code.
#[inline(always)]
fn exact_encode(src: &[u8], out: &mut [u8], size: usize, bits: impl Fn(&[u8]) -> u32) -> Encoded {
    let mut enc = Encoded::default();
    // Per element: its magnitude's bits `a`; finite and non-zero when `a` is in
    // 1..0x7f80_0000; then `m * 2^(e - 150)` with `m` below 2^24 (no implicit bit for a
    // subnormal, whose `e` counts as 1).
    let parts = |a: u32| {
        let e = (a >> 23).max(1);
        let m = (a & 0x7f_ffff) | (((a >> 23) != 0) as u32) << 23;
        (e, m)
    };
    let (mut low, mut top, mut nonfinite) = (u32::MAX, 0u32, false);
    for b in src.chunks_exact(size) {
        let a = bits(b) & 0x7fff_ffff;
        nonfinite |= a >= 0x7f80_0000;
        let counts = a.wrapping_sub(1) < 0x7f7f_ffff;
        let (e, m) = parts(a);
        // Weights relative to 2^-150: the lowest set bit, and one past the highest.
        let lowest = e.wrapping_add(log2_below_2_24(m & m.wrapping_neg()));
        let highest = e.wrapping_add(1).wrapping_add(log2_below_2_24(m));
        low = low.min(if counts { lowest } else { u32::MAX });
        top = top.max(if counts { highest } else { 0 });
    }
    if nonfinite {
        enc.flags |= ENC_NONFINITE;
    }
    let n = src.len() / size;
    if low == u32::MAX || (top - low) as i32 > EXACT_BITS {
        if low != u32::MAX {
            enc.flags |= ENC_OVERFLOW;
        }
        out[..n * 8].fill(0);
        return enc;
    }
    enc.exponent = (low as i32 - 150) as i16;
    enc.magnitude = (top - low) as u8;
    for (b, o) in src.chunks_exact(size).zip(out.chunks_exact_mut(8)) {
        let x = bits(b);
        let a = x & 0x7fff_ffff;
        let counts = a.wrapping_sub(1) < 0x7f7f_ffff;
        let (e, m) = parts(a);
        // m * 2^(e - low): shifted left, or right over bits that are zero (by at most 23
        // for an element that counts).
        let (m, d) = (m as u64, e as i64 - low as i64);
        let v = (if d >= 0 {
            m << (d & 63)
        } else {
            m >> (-d & 63)
        }) as i64;
        let v = if counts { v } else { 0 };
        let v = if x >> 31 != 0 { -v } else { v };
        o.copy_from_slice(&v.to_le_bytes());
    }
    enc
}

/// floor(log2 m) for 0 < m < 2^24, read from the exponent of m as an f32 (exact): a
/// conversion vector units make, where they have no bit count.
#[inline(always)]
fn log2_below_2_24(m: u32) -> u32 {
    ((m as i32 as f32).to_bits() >> 23).wrapping_sub(127)
}

/// floor(log2 m) for 0 < m < 2^52: m set into the fraction of 2^52 (exactly 2^52 + m),
/// less 2^52, is m as a double.
#[inline(always)]
fn log2_to_2_52(m: u64) -> u64 {
    const TWO52: u64 = 0x4330_0000_0000_0000;
    let x = f64::from_bits(TWO52 | m) - f64::from_bits(TWO52);
    (x.to_bits() >> 52).wrapping_sub(1023)
}

/// Bits the 128-bit exact lane's mantissas may have: 127 and the sign.
pub const EXACT128_BITS: i32 = 127;

/// The exact lane of doubles: [`exact_encode`]'s scheme over a double's bits (11-bit
/// exponent, mantissas below 2^53), in 128-bit lanes (low word first).
#[multiversion(targets("x86_64+avx2"))]
fn exact128_encode(src: &[u8], out: &mut [u8]) -> Encoded {
    let bits = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    const INF: u64 = 0x7ff0_0000_0000_0000;
    let mut enc = Encoded::default();
    // `m * 2^(e - 1075)`, a subnormal's `e` counting as 1.
    let parts = |a: u64| {
        let e = (a >> 52).max(1);
        let m = (a & ((1 << 52) - 1)) | (((a >> 52) != 0) as u64) << 52;
        (e, m)
    };
    // In signed 64-bit arithmetic (the sign cleared): vector units compare 64-bit lanes
    // signed only, and the compiler leaves the unsigned loop scalar.
    let (mut low, mut top, mut nonfinite) = (i64::MAX, 0i64, false);
    for b in src.chunks_exact(8) {
        let a = (bits(b) & !(1 << 63)) as i64;
        nonfinite |= a >= INF as i64;
        let counts = a != 0 && a < INF as i64;
        let biased = a >> 52;
        let e = biased.max(1);
        let m = (a & ((1 << 52) - 1)) | i64::from(biased != 0) << 52;
        // The lowest set bit; 2^52 (a normal double with no fraction) is past the
        // conversion's range.
        let p = m & m.wrapping_neg();
        let lowest = e + if p == 1 << 52 {
            52
        } else {
            log2_to_2_52(p as u64) as i64
        };
        // A normal double's highest bit is its implicit one.
        let highest = e + if biased != 0 {
            53
        } else {
            log2_to_2_52(m as u64) as i64 + 1
        };
        low = low.min(if counts { lowest } else { i64::MAX });
        top = top.max(if counts { highest } else { 0 });
    }
    if nonfinite {
        enc.flags |= ENC_NONFINITE;
    }
    let n = src.len() / 8;
    if low == i64::MAX || (top - low) as i32 > EXACT128_BITS {
        if low != i64::MAX {
            enc.flags |= ENC_OVERFLOW;
        }
        out[..n * 16].fill(0);
        return enc;
    }
    enc.exponent = (low as i32 - 1075) as i16;
    enc.magnitude = (top - low) as u8;
    for (b, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
        let x = bits(b);
        let a = x & !(1 << 63);
        let counts = a.wrapping_sub(1) < INF - 1;
        let (e, m) = parts(a);
        // m * 2^(e - low) as two words: shifted left by up to 74, or right over bits
        // that are zero (by at most 52 for an element that counts).
        let d = e as i64 - low;
        let up = (d & 127) as u32;
        let down = (-d).clamp(0, 63) as u32;
        let (lo, hi) = if d < 0 {
            (m >> down, 0)
        } else if up < 64 {
            (m << up, (m >> 1) >> (63 - up))
        } else {
            (0, m << (up - 64))
        };
        let (lo, hi) = if counts { (lo, hi) } else { (0, 0) };
        // Negated in two's complement: each word inverted, the carry of the low word's +1.
        let (lo, hi) = if x >> 63 != 0 {
            ((!lo).wrapping_add(1), (!hi).wrapping_add((lo == 0) as u64))
        } else {
            (lo, hi)
        };
        o[..8].copy_from_slice(&lo.to_le_bytes());
        o[8..].copy_from_slice(&hi.to_le_bytes());
    }
    enc
}

/// Order-preserving keys; NaN is flagged.
#[inline(always)]
fn key_encode(src: &[u8], out: &mut [u8], size: usize, load: impl Fn(&[u8]) -> f32) -> Encoded {
    let mut nan = false;
    for (b, o) in src.chunks_exact(size).zip(out.chunks_exact_mut(4)) {
        let x = load(b);
        nan |= x.is_nan();
        o.copy_from_slice(&key(x).to_le_bytes());
    }
    Encoded {
        flags: if nan { ENC_NONFINITE } else { 0 },
        ..Encoded::default()
    }
}

/// Decodes a result's lanes (`payload`) into `dst`'s elements of `dtype`, `op` in float
/// mode `float`. `ranks` is the number of contributions in all levels (for `avg`, divided
/// once, here).
pub fn decode(
    (op, dtype, float): (Op, DType, Float),
    ranks: u32,
    payload: &[u8],
    exponent: i16,
    dst: &mut [u8],
) {
    let l = lane_in(op, dtype, float).expect("the job's op and type have a lane");
    let size = dtype.size();
    let n = dst.len() / size;
    let avg = op == Op::Avg;
    match l {
        Lane::I32 | Lane::U32 => dst.copy_from_slice(&payload[..dst.len()]),
        Lane::I64 if !avg => dst.copy_from_slice(&payload[..dst.len()]),
        Lane::I64Split => {
            // high * 2^32 + low, summed over at most MAX_RANKS ranks, fits an i128 exactly; the
            // mean of i64 values is an i64.
            for (p, d) in payload
                .chunks_exact(16)
                .take(n)
                .zip(dst.chunks_exact_mut(8))
            {
                let high = i64::from_le_bytes(p[..8].try_into().unwrap()) as i128;
                let low = i64::from_le_bytes(p[8..].try_into().unwrap()) as i128;
                let mean = ((high << 32) + low).div_euclid(ranks as i128);
                d.copy_from_slice(&(mean as i64).to_le_bytes());
            }
        }
        // The mean of i32 or u32 (an i64 lane is avg's only for them).
        Lane::I64 => decode_mean32(ranks, payload, dst),
        Lane::Bfp64 => decode_bfp64(dtype, avg, ranks, payload, exponent, dst),
        Lane::Exact => decode_exact(dtype, avg, ranks, payload, exponent, dst),
        Lane::Exact128 => decode_exact128(dtype, avg, ranks, payload, exponent, dst),
        Lane::Key64 => {
            for (p, d) in payload.chunks_exact(8).take(n).zip(dst.chunks_exact_mut(8)) {
                let k = i64::from_le_bytes(p.try_into().unwrap());
                d.copy_from_slice(&(key64(k as u64) as u64).to_le_bytes());
            }
        }
        Lane::Bfp32 => decode_bfp32(dtype, avg, ranks, payload, exponent, dst),
        Lane::Key32 => decode_key32(dtype, payload, dst),
    }
}

/// The means of i32 or u32 elements from their sums (i64 lanes), rounded toward negative
/// infinity (floor), in doubles the compiler vectorises (an i64 division per element ran
/// at 0.6 GB/s): a sum of at most [`MAX_RANKS`] 32-bit values is below 2^50, where a double
/// holds it exactly, converts it through [`ROUNDING`]'s bits, and the floor of the
/// correctly rounded quotient is the floor of the exact one (a quotient short of an
/// integer by at least 1/ranks stays short of it below 2^53).
#[multiversion(targets("x86_64+avx2"))]
fn decode_mean32(ranks: u32, payload: &[u8], dst: &mut [u8]) {
    let bias = ROUNDING.to_bits() as i64;
    let ranks = f64::from(ranks);
    for (p, d) in payload.chunks_exact(8).zip(dst.chunks_exact_mut(4)) {
        let sum =
            f64::from_bits(i64::from_le_bytes(p.try_into().unwrap()).wrapping_add(bias) as u64)
                - ROUNDING;
        let mean = ((sum / ranks).floor() + ROUNDING).to_bits() as i64 - bias;
        // The low 32 bits: the i32's or the u32's two's complement.
        d.copy_from_slice(&(mean as u32).to_le_bytes());
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn decode_bfp64(
    dtype: DType,
    avg: bool,
    ranks: u32,
    payload: &[u8],
    exponent: i16,
    dst: &mut [u8],
) {
    let n = dst.len() / dtype.size();
    // The 62-bit sum rounds once to a double, scaling is exact (but into the
    // subnormals), and avg's division rounds once more.
    let scale = Scale::new(exponent as i32);
    for (p, d) in payload.chunks_exact(8).take(n).zip(dst.chunks_exact_mut(8)) {
        let m = i64::from_le_bytes(p.try_into().unwrap()) as f64;
        let x = if avg {
            double_mean(scale, m, ranks as f64)
        } else {
            scale.apply(m)
        };
        d.copy_from_slice(&x.to_le_bytes());
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn decode_exact(
    dtype: DType,
    avg: bool,
    ranks: u32,
    payload: &[u8],
    exponent: i16,
    dst: &mut [u8],
) {
    let n = dst.len() / dtype.size();
    // The exact sum (or mean), rounded once: rounded to odd in a double first (53 bits,
    // more than two past any of the types', so the type's rounding to nearest is the one
    // rounding of the exact value), scaled exactly (the exponents of these lanes keep
    // it far from a double's subnormals), then rounded to the type (f16 and bf16 to odd
    // in an f32 first, [`put_all`]). A pure function of the sum: the same bits on every
    // rank, every run.
    let scale = Scale::new(exponent as i32);
    let sums = payload
        .chunks_exact(8)
        .take(n)
        .map(|p| i64::from_le_bytes(p.try_into().unwrap()));
    if avg {
        put_all(
            dtype,
            sums.map(|m| scale.apply(mean_to_odd(i128::from(m), ranks, 64))),
            dst,
        )
    } else {
        put_all(dtype, sums.map(|m| scale.apply(i64_to_odd(m))), dst)
    }
}

/// `m` as a double rounded to odd: its top 53 bits, the last one set when anything was
/// cut. The two halves convert exactly, and their sum's rounding error is exact (Knuth's
/// two-sum), which says which way the sum rounded; selects, not branches, so that a loop
/// of it vectorises.
#[inline(always)]
fn i64_to_odd(m: i64) -> f64 {
    // Through 32-bit conversions, which vector units have (the low half offset into
    // i32's range and back, exactly).
    let hi = f64::from((m >> 32) as i32) * 4_294_967_296.0;
    let lo = f64::from((m as u32 ^ 0x8000_0000) as i32) + 2_147_483_648.0;
    let s = hi + lo;
    let b = s - hi;
    let err = (hi - (s - b)) + (lo - b);
    // Rounded away from zero: one step back, then the last bit set.
    let t = s.to_bits() - u64::from((err < 0.0) == (s > 0.0));
    f64::from_bits(if err == 0.0 { s.to_bits() } else { t | 1 })
}

/// `m / ranks` as a double rounded to odd: the quotient of `m * 2^shift` in integers (its
/// remainder kept as the cut bits' witness; `shift` leaves it 55 bits or more, and
/// `m * 2^shift` within i128), converted as [`i64_to_odd`] converts.
fn mean_to_odd(m: i128, ranks: u32, shift: u32) -> f64 {
    let num = m << shift;
    let (q, r) = (num / i128::from(ranks), num % i128::from(ranks));
    let y = q as f64;
    // `y as i128` saturates only at 2^127, past any quotient here: the test still says
    // the conversion was inexact, and the step back is right.
    let back = y as i128;
    let exact = back == q && r == 0;
    let away = back.unsigned_abs() > q.unsigned_abs();
    let t = y.to_bits() - u64::from(away);
    f64::from_bits(if exact { y.to_bits() } else { t | 1 }) * 2f64.powi(-(shift as i32))
}

/// `m / ranks` rounded to the nearest double (ties to even): the quotient of `|m|`
/// shifted to 55 bits or more, doubled, its last bit set when the division left a
/// remainder (then no midpoint of doubles lies between it and the exact quotient), and
/// converted to the nearest (u128's conversion rounds correctly).
fn mean_to_nearest(m: i128, ranks: u32) -> f64 {
    let a = m.unsigned_abs();
    let shift = 74u32.saturating_sub(128 - a.leading_zeros());
    let num = a << shift;
    let (q, r) = (num / u128::from(ranks), num % u128::from(ranks));
    let y = ((q << 1) | u128::from(r != 0)) as f64 * 2f64.powi(-(shift as i32) - 1);
    if m < 0 {
        -y
    } else {
        y
    }
}

/// A mean of doubles, `sum * 2^k / ranks`: scaled first, as the sum's one rounding
/// wants, unless the scaled sum passes a double's range where the mean does not.
#[inline(always)]
fn double_mean(scale: Scale, sum: f64, ranks: f64) -> f64 {
    let scaled = scale.apply(sum);
    if scaled.is_finite() {
        scaled / ranks
    } else {
        scale.apply(sum / ranks)
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn decode_exact128(
    dtype: DType,
    avg: bool,
    ranks: u32,
    payload: &[u8],
    exponent: i16,
    dst: &mut [u8],
) {
    let n = dst.len() / dtype.size();
    // The exact sum rounded once to a double (an i128 converts to the nearest), scaled
    // exactly but into the subnormals; a mean divided in integers and rounded once the
    // same way ([`decode_exact`]).
    let scale = Scale::new(exponent as i32);
    let words = payload.chunks_exact(16).take(n).map(|p| {
        (
            i64::from_le_bytes(p[..8].try_into().unwrap()),
            i64::from_le_bytes(p[8..].try_into().unwrap()),
        )
    });
    let out = dst.chunks_exact_mut(8);
    if avg {
        for ((lo, hi), d) in words.zip(out) {
            let m = (i128::from(hi) << 64) | i128::from(lo as u64);
            d.copy_from_slice(&scale.apply(mean_to_nearest(m, ranks)).to_le_bytes());
        }
    } else {
        for ((lo, hi), d) in words.zip(out) {
            // A sum within 64 bits (values of a few magnitudes: the common case) converts
            // as an i64, to the same nearest double; a wider one through i128's
            // conversion, a library call.
            let m = if hi == lo >> 63 {
                lo as f64
            } else {
                ((i128::from(hi) << 64) | i128::from(lo as u64)) as f64
            };
            d.copy_from_slice(&scale.apply(m).to_le_bytes());
        }
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn decode_bfp32(
    dtype: DType,
    avg: bool,
    ranks: u32,
    payload: &[u8],
    exponent: i16,
    dst: &mut [u8],
) {
    let n = dst.len() / dtype.size();
    let scale = Scale::new(exponent as i32);
    let mantissas = payload
        .chunks_exact(4)
        .take(n)
        .map(|p| f64::from(i32::from_le_bytes(p.try_into().unwrap())));
    if avg {
        let div = ranks as f64;
        put_all(dtype, mantissas.map(|m| scale.apply(m) / div), dst)
    } else {
        // A sum is not divided (by 1: the same bits, at a division's cost).
        put_all(dtype, mantissas.map(|m| scale.apply(m)), dst)
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn decode_key32(dtype: DType, payload: &[u8], dst: &mut [u8]) {
    let n = dst.len() / dtype.size();
    // The result is one of the inputs: converting back is exact.
    let values = payload
        .chunks_exact(4)
        .take(n)
        .map(|p| unkey(u32::from_le_bytes(p.try_into().unwrap())));
    match dtype {
        DType::F32 => {
            for (x, d) in values.zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&x.to_le_bytes())
            }
        }
        DType::F16 => put_all(dtype, values.map(f64::from), dst),
        _ => {
            for (x, d) in values.zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes())
            }
        }
    }
}

/// Fills a segment of `dst` with NaN (a float segment the switch flagged non-finite).
pub fn fill_nan(dtype: DType, dst: &mut [u8]) {
    for e in dst.chunks_exact_mut(dtype.size()) {
        put(dtype, f64::NAN, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift64 stream from `seed`: the tests' reproducible random bits.
    fn xorshift(mut z: u64) -> impl FnMut() -> u64 {
        move || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        }
    }

    /// The encoders as they were, element by element: the specification the straight-line
    /// ones are checked against.
    mod per_element {
        use super::super::*;

        /// The largest finite magnitude of the `size`-byte elements of `src`, and the encoding's
        /// flags: NaN or an infinity flagged (they do not count in the maximum).
        fn finite_max(src: &[u8], size: usize, load: impl Fn(&[u8]) -> f64) -> (f64, Encoded) {
            let mut enc = Encoded::default();
            let mut max = 0f64;
            let mut finite = true;
            for b in src.chunks_exact(size) {
                let x = load(b);
                finite &= x.is_finite();
                max = max.max(x.abs());
            }
            if !finite {
                enc.flags |= ENC_NONFINITE;
                max = src
                    .chunks_exact(size)
                    .map(&load)
                    .filter(|x| x.is_finite())
                    .fold(0f64, |a, x| a.max(x.abs()));
            }
            (max, enc)
        }

        /// Rounds to the nearest integer, ties to even, for |v| < 2^51: adding and subtracting
        /// 1.5 * 2^52 leaves no fraction bits (a library `round` call per element is 10x slower).
        fn round_even(v: f64) -> f64 {
            (v + ROUNDING) - ROUNDING
        }

        /// Block floating point: one exponent for the segment, 32-bit mantissas.
        pub fn bfp_encode(
            src: &[u8],
            out: &mut [u8],
            bits: i32,
            size: usize,
            load: impl Fn(&[u8]) -> f32,
        ) -> Encoded {
            let (max, mut enc) = finite_max(src, size, |b| load(b) as f64);
            enc.exponent = block_exponent(max, bits);
            let scale = Scale::new(-(enc.exponent as i32));
            for (b, o) in src.chunks_exact(size).zip(out.chunks_exact_mut(4)) {
                let x = load(b);
                let m = if x.is_finite() {
                    round_even(scale.apply(x as f64)) as i32
                } else {
                    0
                };
                o.copy_from_slice(&m.to_le_bytes());
            }
            enc
        }

        pub fn exact_encode(
            src: &[u8],
            out: &mut [u8],
            size: usize,
            bits: impl Fn(&[u8]) -> u32,
        ) -> Encoded {
            let mut enc = Encoded::default();
            // Per element: its magnitude's bits `a`; finite and non-zero when `a` is in
            // 1..0x7f80_0000; then `m * 2^(e - 150)` with `m` below 2^24 (no implicit bit for a
            // subnormal, whose `e` counts as 1).
            let parts = |a: u32| {
                let e = (a >> 23).max(1);
                let m = (a & 0x7f_ffff) | (((a >> 23) != 0) as u32) << 23;
                (e, m)
            };
            let (mut low, mut top, mut nonfinite) = (u32::MAX, 0u32, false);
            for b in src.chunks_exact(size) {
                let a = bits(b) & 0x7fff_ffff;
                nonfinite |= a >= 0x7f80_0000;
                let counts = a.wrapping_sub(1) < 0x7f7f_ffff;
                let (e, m) = parts(a);
                // Weights relative to 2^-150: the lowest set bit, and one past the highest.
                let lowest = e + (m | 1 << 31).trailing_zeros();
                let highest = e + 32 - m.leading_zeros();
                low = low.min(if counts { lowest } else { u32::MAX });
                top = top.max(if counts { highest } else { 0 });
            }
            if nonfinite {
                enc.flags |= ENC_NONFINITE;
            }
            let n = src.len() / size;
            if low == u32::MAX || (top - low) as i32 > EXACT_BITS {
                if low != u32::MAX {
                    enc.flags |= ENC_OVERFLOW;
                }
                out[..n * 8].fill(0);
                return enc;
            }
            enc.exponent = (low as i32 - 150) as i16;
            enc.magnitude = (top - low) as u8;
            for (b, o) in src.chunks_exact(size).zip(out.chunks_exact_mut(8)) {
                let x = bits(b);
                let a = x & 0x7fff_ffff;
                let counts = a.wrapping_sub(1) < 0x7f7f_ffff;
                let (e, m) = parts(a);
                // m's bits below 2^(low - e) are zero: shifted out first, the rest shifted left.
                let t = (m | 1 << 31).trailing_zeros();
                let v = ((m >> t) as i64) << ((e + t).wrapping_sub(low) & 63);
                let v = if counts { v } else { 0 };
                let v = if x >> 31 != 0 { -v } else { v };
                o.copy_from_slice(&v.to_le_bytes());
            }
            enc
        }

        pub fn exact128_encode(src: &[u8], out: &mut [u8]) -> Encoded {
            let bits = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
            const INF: u64 = 0x7ff0_0000_0000_0000;
            let mut enc = Encoded::default();
            // `m * 2^(e - 1075)`, a subnormal's `e` counting as 1.
            let parts = |a: u64| {
                let e = (a >> 52).max(1);
                let m = (a & ((1 << 52) - 1)) | (((a >> 52) != 0) as u64) << 52;
                (e, m)
            };
            let (mut low, mut top, mut nonfinite) = (u64::MAX, 0u64, false);
            for b in src.chunks_exact(8) {
                let a = bits(b) & !(1 << 63);
                nonfinite |= a >= INF;
                let counts = a.wrapping_sub(1) < INF - 1;
                let (e, m) = parts(a);
                let lowest = e + (m | 1 << 63).trailing_zeros() as u64;
                let highest = e + 64 - m.leading_zeros() as u64;
                low = low.min(if counts { lowest } else { u64::MAX });
                top = top.max(if counts { highest } else { 0 });
            }
            if nonfinite {
                enc.flags |= ENC_NONFINITE;
            }
            let n = src.len() / 8;
            if low == u64::MAX || (top - low) as i32 > EXACT128_BITS {
                if low != u64::MAX {
                    enc.flags |= ENC_OVERFLOW;
                }
                out[..n * 16].fill(0);
                return enc;
            }
            enc.exponent = (low as i32 - 1075) as i16;
            enc.magnitude = (top - low) as u8;
            for (b, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
                let x = bits(b);
                let a = x & !(1 << 63);
                let counts = a.wrapping_sub(1) < INF - 1;
                let (e, m) = parts(a);
                let t = (m | 1 << 63).trailing_zeros() as u64;
                let v = ((m >> t) as i128) << ((e + t).wrapping_sub(low) & 127);
                let v = if counts { v } else { 0 };
                let v = if x >> 63 != 0 { -v } else { v };
                o.copy_from_slice(&v.to_le_bytes());
            }
            enc
        }

        /// Block floating point over doubles: one exponent for the segment, 64-bit mantissas.
        pub fn bfp64_encode(src: &[u8], out: &mut [u8], bits: i32) -> Encoded {
            let load = |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap());
            let (max, mut enc) = finite_max(src, 8, load);
            enc.exponent = block_exponent(max, bits);
            let scale = Scale::new(-(enc.exponent as i32));
            for (b, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
                let x = load(b);
                // Scaling by a power of two is exact here (the value lands below 2^56 and above
                // f64's subnormals); the one rounding is to the integer.
                let m = if x.is_finite() {
                    let v = scale.apply(x);
                    // Past 2^51 a double has at most one fraction bit: truncating it errs by at
                    // most half a unit, as rounding does.
                    if v.abs() < 2f64.powi(51) {
                        round_even(v) as i64
                    } else {
                        v as i64
                    }
                } else {
                    0
                };
                o.copy_from_slice(&m.to_le_bytes());
            }
            enc
        }
    }

    /// f16 and bf16 from a double round once: to the nearest value of the type, ties to
    /// the even one — checked against the two neighbours of each result.
    #[test]
    fn halves_round_once_from_a_double() {
        fn check(dtype: DType, x: f64) {
            let mut b = [0u8; 2];
            put(dtype, x, &mut b);
            let bits = u16::from_le_bytes(b);
            let value = |bits: u16| match dtype {
                DType::F16 => f16::from_bits(bits).to_f64(),
                _ => bf16::from_bits(bits).to_f64(),
            };
            let r = value(bits);
            assert!(r.is_finite(), "{dtype:?} {x:e}: {r}");
            for n in [bits.wrapping_add(1), bits.wrapping_sub(1)] {
                let v = value(n);
                if !v.is_finite() || (v.signum() != r.signum() && v != 0.0) {
                    continue;
                }
                let (d, dn) = ((r - x).abs(), (v - x).abs());
                assert!(
                    d < dn || (d == dn && bits % 2 == 0),
                    "{dtype:?} {x:e}: got {r:e} ({bits:#06x}), {v:e} is nearer or the even tie"
                );
            }
        }
        // The midpoints and just past them, where a rounding to f32 first went wrong:
        // 1 + 2^-11 + 2^-24 (f16) and 1 + 2^-8 + 2^-25 (bf16) among them.
        for (dtype, half_ulp) in [(DType::F16, -11), (DType::Bf16, -8)] {
            for k in [-30, -29, -25, -24, -23, -20] {
                for base in [1.0, 1.5, -1.0, 3.0, 1000.0] {
                    for past in [1.0, -1.0] {
                        let x = base * (1.0 + 2f64.powi(half_ulp)) + past * base * 2f64.powi(k);
                        check(dtype, x);
                    }
                }
            }
            check(dtype, 1.0 + 2f64.powi(half_ulp));
        }
        assert_eq!(
            {
                let mut b = [0u8; 2];
                put(DType::F16, 1.0 + 2f64.powi(-11) + 2f64.powi(-24), &mut b);
                f16::from_le_bytes(b).to_f64()
            },
            1.0 + 2f64.powi(-10)
        );
        // Random doubles over the types' ranges, f16's subnormals included.
        let mut z = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            z = z
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = f64::from_bits((z >> 12) | 0x3ff0_0000_0000_0000) - 1.0;
            let e = ((z >> 4) % 60) as i32 - 40;
            let x = (1.0 + m) * 2f64.powi(e) * if z & 1 == 0 { 1.0 } else { -1.0 };
            check(DType::F16, x.clamp(-65000.0, 65000.0));
            check(DType::Bf16, x);
        }
    }

    /// The straight-line block encoding of f32 and bf16 gives the same mantissas, exponent
    /// and flags as the per-element one it replaced, on every kind of value: zeros of both
    /// signs, subnormals, the largest finite, infinities and NaN among random values of
    /// every magnitude, for 2 ranks and for as many as keep 12 bits.
    #[test]
    fn straight_line_block_encoding_matches_per_element() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        let specials = [
            0u32,
            0x8000_0000,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0x3f80_0000,
            0x3f00_0000,
        ];
        for round in 0..4000 {
            let len = 1 + (next() % 300) as usize;
            // One in eight segments of one magnitude band, the rest spread over all.
            let band = (next() % 254) as u32;
            let bits: Vec<u32> = (0..len)
                .map(|_| {
                    let r = next();
                    match r % 16 {
                        0 => specials[(r >> 8) as usize % specials.len()],
                        1..=3 => {
                            ((band.min(253) + (r >> 40) as u32 % 3) << 23)
                                | (r as u32 & 0x807f_ffff)
                        }
                        _ if round % 8 == 0 => 0,
                        _ => (r >> 16) as u32,
                    }
                })
                .collect();
            for (ranks, dtype) in [(2, DType::F32), (4096, DType::F32), (2, DType::Bf16)] {
                let b = bfp_bits(dtype, ranks);
                let src: Vec<u8> = match dtype {
                    DType::F32 => bits.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    _ => bits
                        .iter()
                        .flat_map(|x| ((x >> 16) as u16).to_le_bytes())
                        .collect(),
                };
                let (mut new, mut old) = (vec![7u8; len * 4], vec![9u8; len * 4]);
                let (e_new, e_old) = match dtype {
                    DType::F32 => (
                        bfp_encode_bits(&src, &mut new, b, 4, |b| {
                            u32::from_le_bytes(b.try_into().unwrap())
                        }),
                        per_element::bfp_encode(&src, &mut old, b, 4, |b| {
                            f32::from_le_bytes(b.try_into().unwrap())
                        }),
                    ),
                    _ => (
                        bfp_encode_bits(&src, &mut new, b, 2, |b| bf16_bytes_to_f32(b).to_bits()),
                        per_element::bfp_encode(&src, &mut old, b, 2, bf16_bytes_to_f32),
                    ),
                };
                assert!(e_new == e_old, "{dtype:?} {ranks} ranks, round {round}");
                assert!(new == old, "{dtype:?} {ranks} ranks, round {round}");
            }
        }
    }

    /// The halves' vector paths give the per-element bits: f16 widened by half's vector
    /// conversion encodes as each element widened alone does (a buffer longer than a
    /// segment too), and every float result
    /// decodes as [`put`] (half's own rounding to f16 and bf16) writes each value, for
    /// sums and means, in the block and exact lanes.
    #[test]
    fn vector_paths_of_the_halves_give_the_per_element_bits() {
        let mut next = xorshift(0x0123_4567_89ab_cdefu64);
        for round in 0..300 {
            // The first buffer longer than a segment (widened on the heap, in pieces).
            let n = if round == 0 {
                2 * HALVES + 7
            } else {
                1 + (next() % HALVES as u64) as usize
            };
            let src: Vec<u8> = (0..n).flat_map(|_| (next() as u16).to_le_bytes()).collect();
            // Each element widened alone, by half's conversion of one value.
            let one_by_one: Vec<u8> = src
                .chunks_exact(2)
                .flat_map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes())
                .collect();
            for (op, float) in [
                (Op::Sum, Float::Fast),
                (Op::Max, Float::Fast),
                (Op::Sum, Float::Exact),
            ] {
                let width = lane_in(op, DType::F16, float).unwrap().size();
                if round > 0 && n > xagg_common::wire::MAX_PAYLOAD / width {
                    continue;
                }
                let (mut v, mut e) = (vec![1u8; n * width], vec![2u8; n * width]);
                let a = encode(op, DType::F16, float, 3, &src, &mut v);
                let b = encode_elements(op, DType::F32, float, 3, &one_by_one, &mut e);
                assert!(
                    (a, &v) == (b, &e),
                    "encode f16 {op:?} {float:?}, {n} elements"
                );
            }
            for dtype in [DType::F32, DType::F16, DType::Bf16] {
                // The exact lanes' results: `exact_results_are_rounded_once`.
                for (op, float) in [(Op::Sum, Float::Fast), (Op::Avg, Float::Fast)] {
                    let width = lane_in(op, dtype, float).unwrap().size();
                    let n = if round == 0 {
                        n
                    } else {
                        n.min(xagg_common::wire::MAX_PAYLOAD / width)
                    };
                    // Lanes of every size, or all of one sign and modest size.
                    let lanes: Vec<u8> = (0..n)
                        .flat_map(|_| {
                            let r = next();
                            let r = if round % 2 == 0 {
                                r
                            } else {
                                r >> (40 + r % 24)
                            };
                            r.to_le_bytes()[..width].to_vec()
                        })
                        .collect();
                    let exponent = (next() % 300) as i16 - 200;
                    let mut got = vec![0u8; n * dtype.size()];
                    decode((op, dtype, float), 3, &lanes, exponent, &mut got);
                    let scale = Scale::new(exponent as i32);
                    let div = if op == Op::Avg { 3.0 } else { 1.0 };
                    for (i, (p, g)) in lanes
                        .chunks_exact(width)
                        .zip(got.chunks_exact(dtype.size()))
                        .enumerate()
                    {
                        let m = f64::from(i32::from_le_bytes(p.try_into().unwrap()));
                        let mut want = vec![0u8; dtype.size()];
                        put(dtype, scale.apply(m) / div, &mut want);
                        assert!(g == &want[..], "{dtype:?} {op:?} {float:?} element {i}");
                    }
                }
            }
        }
    }

    /// The straight-line exact and double encoders give the bits the per-element ones
    /// gave, on random bits (NaN, infinities, subnormals, zeros among them) and on
    /// segments of one sign and a few exponents (the lanes' common case).
    #[test]
    fn straight_line_exact_and_double_encoders_match_per_element() {
        let mut next = xorshift(0x5851_f42d_4c95_7f2du64);
        let mut carried = [0usize; 2];
        for round in 0..3000 {
            let n = 1 + (next() % 1116) as usize;
            // A third of the segments random bits (most too wide: flagged); the rest within
            // a few exponents (the lanes' common case), their fractions random, of a few
            // bits, or none (powers of two), with zeros, and now and then a subnormal, an
            // infinity or a NaN.
            let wide = round % 3 == 0;
            let base = next() & (0x7fe << 52);
            let words: Vec<u64> = (0..n)
                .map(|_| {
                    let r = next();
                    if wide {
                        return r;
                    }
                    let fraction = match r % 4 {
                        0 => 0,
                        1 => ((r >> 12) & 0xf) << (48 - (r >> 16) % 12 * 4),
                        _ => r & ((1 << 52) - 1),
                    };
                    let exponent = base.wrapping_add(((r >> 56) % 6) << 52) & (0x7ff << 52);
                    match (r >> 8) % 64 {
                        0 => (r & 1) << 63,
                        1 if round % 4 == 1 => {
                            [1, 0x000f_ffff_ffff_ffff, 0x7ff0 << 48, 0x7ff8 << 48]
                                [(r >> 20) as usize % 4]
                        }
                        _ => (r & (1 << 63)) | exponent | fraction,
                    }
                })
                .collect();
            let doubles: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let floats: Vec<u8> = words
                .iter()
                .flat_map(|w| ((w >> 32) as u32).to_le_bytes())
                .collect();
            // Both filled alike: a lane left unwritten by both is no difference.
            let (mut a, mut b) = (vec![0xa5u8; n * 16], vec![0xa5u8; n * 16]);
            let f32_bits = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
            let e = exact_encode(&floats, &mut a, 4, f32_bits);
            assert!(
                (e, &a) == (per_element::exact_encode(&floats, &mut b, 4, f32_bits), &b),
                "exact f32, round {round}"
            );
            carried[0] += usize::from(e.flags & ENC_OVERFLOW == 0);
            let e = exact128_encode(&doubles, &mut a);
            assert!(
                (e, &a) == (per_element::exact128_encode(&doubles, &mut b), &b),
                "exact f64, round {round}"
            );
            carried[1] += usize::from(e.flags & ENC_OVERFLOW == 0);
            for bits in [BFP64_BITS, bfp_bits(DType::F64, 4096)] {
                assert!(
                    (bfp64_encode(&doubles, &mut a, bits), &a)
                        == (per_element::bfp64_encode(&doubles, &mut b, bits), &b),
                    "block f64, round {round}"
                );
            }
        }
        // The narrow segments fit the exact lanes: the comparison is of integers, not
        // only of flagged segments' zeros.
        assert!(
            carried.iter().all(|&c| c > 1500),
            "segments carried: {carried:?}"
        );
    }

    /// A double's exact sum within 64 bits decodes through an i64's conversion, a wider
    /// one through i128's: each to the double i128's conversion gives, then scaled (and
    /// divided for a mean) as before; an exact mean is the double nearest the exact one. A
    /// mean whose sum passes a double's range, in both lanes of doubles, is the finite
    /// mean (it was infinity).
    #[test]
    fn double_exact_sums_decode_as_their_i128() {
        // 2^100 (+ a little) x 2^924 passes 2^1024; a third of it does not.
        let sum = (1i128 << 100) + 12_345;
        for (float, lanes) in [
            (Float::Exact, sum.to_le_bytes().to_vec()),
            (Float::Fast, ((sum >> 40) as i64).to_le_bytes().to_vec()),
        ] {
            let k = if float == Float::Exact { 924 } else { 964 };
            let mut got = [[0u8; 8]; 2];
            decode((Op::Sum, DType::F64, float), 3, &lanes, k, &mut got[0]);
            decode((Op::Avg, DType::F64, float), 3, &lanes, k, &mut got[1]);
            let (s, mean) = (f64::from_le_bytes(got[0]), f64::from_le_bytes(got[1]));
            assert_eq!(s, f64::INFINITY, "{float:?} sum");
            let x = if float == Float::Exact {
                sum as f64
            } else {
                ((sum >> 40) as i64) as f64
            };
            assert_eq!(mean, x / 3.0 * 2f64.powi(k as i32), "{float:?} mean");
            assert!(mean.is_finite(), "{float:?} mean {mean}");
        }
        let mut next = xorshift(0x1234_5678_9abc_def1u64);
        // Whether `r` is the double nearest `m * 2^k / n` (ties to even), against its
        // neighbours in integer arithmetic; false where the integers would not fit.
        fn nearest(r: f64, m: i128, k: i32, n: i128) -> bool {
            let parts = |x: f64| {
                let b = x.to_bits();
                let e = ((b >> 52) & 0x7ff) as i32;
                let f = (b & ((1 << 52) - 1)) as i128 | if e != 0 { 1 << 52 } else { 0 };
                let f = if b >> 63 != 0 { -f } else { f };
                (f, e.max(1) - 1075)
            };
            let (f, e) = parts(r);
            // |n x - m 2^k| in units of 2^(low), for x = f 2^e.
            let distance = |f: i128, e: i32| -> Option<i128> {
                let low = e.min(k);
                let a = (f * n).checked_mul(1i128.checked_shl((e - low) as u32)?)?;
                let b = m.checked_mul(1i128.checked_shl((k - low) as u32)?)?;
                Some((a - b).abs())
            };
            let Some(d) = distance(f, e) else {
                return false;
            };
            for x in [r.next_up(), r.next_down()] {
                let (g, h) = parts(x);
                let Some(dn) = distance(g, h) else {
                    return false;
                };
                assert!(
                    d < dn || (d == dn && f % 2 == 0),
                    "{m} x 2^{k} / {n}: gave {r:e}, {x:e} is nearer or the even tie"
                );
            }
            true
        }
        let mut means = 0;
        for round in 0..400 {
            let n = 1 + (next() % 558) as usize;
            let sums: Vec<i128> = (0..n)
                .map(|_| {
                    let (a, b) = (next(), next());
                    let wide = ((a as i128) << 64) | b as i128;
                    // Narrow (sign-extended 64-bit), at the edge, or wide.
                    match a % 4 {
                        0 => wide >> (64 + a % 64),
                        1 => i128::from(b as i64),
                        2 => [
                            i128::from(i64::MIN),
                            i128::from(i64::MAX),
                            i128::from(i64::MIN) - 1,
                            i128::from(i64::MAX) + 1,
                        ][(b % 4) as usize],
                        _ => wide >> (a % 80),
                    }
                })
                .collect();
            let lanes: Vec<u8> = sums.iter().flat_map(|v| v.to_le_bytes()).collect();
            let exponent = (next() % 2000) as i16 - 1100;
            for op in [Op::Sum, Op::Avg] {
                let mut got = vec![0u8; n * 8];
                decode(
                    (op, DType::F64, Float::Exact),
                    3,
                    &lanes,
                    exponent,
                    &mut got,
                );
                let scale = Scale::new(exponent as i32);
                for (v, g) in sums.iter().zip(got.chunks_exact(8)) {
                    let got = f64::from_le_bytes(g.try_into().unwrap());
                    if op == Op::Avg {
                        // Into the subnormals the scaling rounds again (as for sums).
                        if got.abs() >= f64::MIN_POSITIVE {
                            means += usize::from(nearest(got, *v, exponent.into(), 3));
                        }
                        continue;
                    }
                    let want = scale.apply(*v as f64);
                    assert!(
                        got.to_bits() == want.to_bits(),
                        "round {round} {op:?}: {v} gave {got:e}, not {want:e}"
                    );
                }
            }
        }
        assert!(means > 10_000, "{means} means checked");
    }

    /// The exact lane's sum (or mean of 3 ranks) `m * 2^k (/ 3)` decodes to the value of
    /// the type nearest to it (ties to even), checked against the result's neighbours in
    /// integer arithmetic: random sums of up to 62 bits across the types' ranges, and
    /// sums a hair past a midpoint, which a rounding to a double first makes a tie (1 +
    /// 2^-8 + 2^-60 summed as bf16 gave 1).
    #[test]
    fn exact_results_are_rounded_once() {
        let mut next = xorshift(0xdead_beef_0bad_cafeu64);
        // x * 2^(64 - k) * ranks as an integer, where x * 2^(64 - k) is one.
        let units = |x: f64, k: i32, ranks: i128| -> Option<i128> {
            let b = x.to_bits();
            let e = ((b >> 52) & 0x7ff) as i32;
            let f = (b & ((1 << 52) - 1)) as i128 | if e != 0 { 1 << 52 } else { 0 };
            let shift = e.max(1) - 1075 + 64 - k;
            let v = f.checked_mul(ranks)?;
            let v = if shift >= 0 {
                v.checked_shl(shift as u32).filter(|w| w >> shift == v)?
            } else if v & ((1 << -shift) - 1) == 0 {
                v >> -shift
            } else {
                return None;
            };
            Some(if b >> 63 != 0 { -v } else { v })
        };
        let mut checked = 0;
        for round in 0..20_000u32 {
            let dtype = [DType::F32, DType::F16, DType::Bf16][round as usize % 3];
            let (bits, low, high) = match dtype {
                DType::F32 => (24, -125, 126),
                DType::F16 => (11, -20, 14),
                _ => (8, -125, 126),
            };
            let r = next();
            let length = 20 + (r % 43) as u32;
            let m = if round % 4 == 0 {
                // Just past (or at) a midpoint of the type's values.
                let top = 1i64 << (length - 1);
                top + (1 << (length - 1 - bits)) + (r >> 62) as i64 % 2
            } else {
                ((r >> 2) as i64 >> (62 - length)) | 1 << (length - 1)
            };
            // A mean a third of a unit past a midpoint: 3 times the midpoint, and 1 or 2.
            let m3 = if round % 4 == 0 && length < 62 {
                3 * m + 1 + (r >> 61) as i64 % 2
            } else {
                m
            };
            let (m, m3) = if r & 2 != 0 { (-m, -m3) } else { (m, m3) };
            let target = low + ((r >> 20) % (high - low) as u64) as i32;
            let k = target - length as i32 + 1;
            for (op, ranks, m) in [(Op::Sum, 1i128, m), (Op::Avg, 3, m3)] {
                let mut got = vec![0u8; dtype.size()];
                decode(
                    (op, dtype, Float::Exact),
                    3,
                    &m.to_le_bytes(),
                    k as i16,
                    &mut got,
                );
                let value = |bits: u16| match dtype {
                    DType::F16 => f16::from_bits(bits).to_f64(),
                    _ => bf16::from_bits(bits).to_f64(),
                };
                let (r, up, down) = match dtype {
                    DType::F32 => {
                        let b = u32::from_le_bytes(got[..4].try_into().unwrap());
                        let v = |b: u32| f64::from(f32::from_bits(b));
                        (v(b), v(b.wrapping_add(1)), v(b.wrapping_sub(1)))
                    }
                    _ => {
                        let b = u16::from_le_bytes(got[..2].try_into().unwrap());
                        (value(b), value(b.wrapping_add(1)), value(b.wrapping_sub(1)))
                    }
                };
                let want = i128::from(m) << 64;
                let Some(at) = units(r, k, ranks) else {
                    continue;
                };
                let even = match dtype {
                    DType::F32 => u32::from_le_bytes(got[..4].try_into().unwrap()) % 2 == 0,
                    _ => u16::from_le_bytes(got[..2].try_into().unwrap()) % 2 == 0,
                };
                let d = (at - want).abs();
                for n in [up, down] {
                    if !n.is_finite() || (n != 0.0 && n.signum() != r.signum()) {
                        continue;
                    }
                    let Some(other) = units(n, k, ranks) else {
                        continue;
                    };
                    let dn = (other - want).abs();
                    assert!(
                        d < dn || (d == dn && even),
                        "{dtype:?} {op:?}: {m} x 2^{k} / {ranks} gave {r:e}; {n:e} is nearer or the even tie"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 30_000, "{checked} results checked");
    }

    /// Up to 64 ranks keep 24 (56) mantissa bits; beyond, one less per doubling, so the
    /// sum of every rank's largest mantissa stays below 2^30 (2^62) at any level.
    #[test]
    fn mantissa_bits_leave_room_for_every_rank() {
        for (ranks, f32_bits, f64_bits) in [
            (1, 24, 56),
            (2, 24, 56),
            (64, 24, 56),
            (65, 23, 55),
            (128, 23, 55),
            (4096, 18, 50),
        ] {
            assert_eq!(bfp_bits(DType::F32, ranks), f32_bits, "{ranks} ranks");
            assert_eq!(bfp_bits(DType::Bf16, ranks), f32_bits, "{ranks} ranks");
            assert_eq!(bfp_bits(DType::F64, ranks), f64_bits, "{ranks} ranks");
            assert!((ranks as u128) << f32_bits <= 1 << 30);
            assert!((ranks as u128) << f64_bits <= 1 << 62);
        }
        assert_eq!(bfp_bits(DType::F32, MAX_RANKS), 12);
    }

    #[test]
    fn integer_means_are_the_floor_of_the_exact_quotient() {
        let mut next = xorshift(0x0123_4567_89ab_cdefu64);
        for ranks in [1u32, 2, 3, 7, 64, 1000, 65_537, MAX_RANKS as u32] {
            let r = i64::from(ranks);
            for dtype in [DType::I32, DType::U32] {
                // The sums `ranks` values of the type can make: their ends, the multiples
                // of `ranks` and their neighbours, and random ones between.
                let (lo, hi) = match dtype {
                    DType::I32 => (i64::from(i32::MIN) * r, i64::from(i32::MAX) * r),
                    _ => (0, i64::from(u32::MAX) * r),
                };
                let mut sums = vec![lo, lo + 1, hi - 1, hi, 0, 1, -1, r, -r, r - 1, 1 - r];
                for _ in 0..20_000 {
                    let m = lo + (next() % (hi - lo + 1) as u64) as i64;
                    sums.extend([m, m - m.rem_euclid(r), m - m.rem_euclid(r) - 1]);
                }
                sums.retain(|m| (lo..=hi).contains(m));
                let payload: Vec<u8> = sums.iter().flat_map(|m| m.to_le_bytes()).collect();
                let mut got = vec![0u8; sums.len() * 4];
                decode((Op::Avg, dtype, Float::Fast), ranks, &payload, 0, &mut got);
                for (m, g) in sums.iter().zip(got.chunks_exact(4)) {
                    let want = m.div_euclid(r) as u32;
                    assert_eq!(
                        u32::from_le_bytes(g.try_into().unwrap()),
                        want,
                        "{dtype} sum {m} over {ranks} ranks"
                    );
                }
            }
        }
    }

    #[test]
    fn keys_preserve_order() {
        let xs = [
            f32::NEG_INFINITY,
            -1e30,
            -1.5,
            -0.0,
            0.0,
            1e-40,
            2.0,
            3e38,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(key(w[0]) <= key(w[1]), "{} {}", w[0], w[1]);
        }
        for x in xs {
            assert_eq!(unkey(key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn block_exponent_keeps_the_max_within_its_bits() {
        for (bits, max) in [1.0f64, 0.75, 3.0, 1e-30, 6e37, 1e-45, f32::MAX as f64]
            .into_iter()
            .map(|m| (BFP_BITS, m))
            .chain(
                [1.0, 0.75, 1e-300, 5e-324, 2.2e-308, f64::MAX, 1e300]
                    .into_iter()
                    .map(|m| (BFP64_BITS, m)),
            )
        {
            let k = block_exponent(max, bits) as i32;
            let m = Scale::new(-k).apply(max);
            assert!(
                m < 2f64.powi(bits) && m >= 2f64.powi(bits - 1),
                "{max}: {m} (k = {k})"
            );
        }
        assert_eq!(block_exponent(0.0, BFP_BITS), ZERO_EXPONENT);
    }

    #[test]
    fn keys64_preserve_order() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.5,
            -5e-324,
            -0.0,
            0.0,
            5e-324,
            2.0,
            f64::MAX,
            f64::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(
                key64(w[0].to_bits()) < key64(w[1].to_bits()),
                "{} {}",
                w[0],
                w[1]
            );
        }
        for x in xs {
            assert_eq!(key64(key64(x.to_bits()) as u64) as u64, x.to_bits());
        }
    }

    #[test]
    fn double_roundtrip_one_member() {
        let xs: Vec<f64> = vec![1.0, -2.5, 1e-3, 123.456, 0.0, 1.0 / 3.0];
        let src: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut lanes = vec![0u8; src.len()];
        let e = encode(Op::Sum, DType::F64, Float::Fast, 2, &src, &mut lanes);
        let mut dst = vec![0u8; src.len()];
        decode(
            (Op::Sum, DType::F64, Float::Fast),
            1,
            &lanes,
            e.exponent,
            &mut dst,
        );
        for (i, x) in xs.iter().enumerate() {
            let y = f64::from_le_bytes(dst[i * 8..i * 8 + 8].try_into().unwrap());
            assert!((y - x).abs() <= 123.456 * 2f64.powi(-55), "{x} -> {y}");
        }
        // Segments of tiny (subnormal) and huge values keep their bits too.
        for x in [5e-324f64, 3e-310, 1.7e308] {
            let src = [x.to_le_bytes(), (-x).to_le_bytes()].concat();
            let e = encode(Op::Sum, DType::F64, Float::Fast, 2, &src, &mut lanes[..16]);
            decode(
                (Op::Sum, DType::F64, Float::Fast),
                1,
                &lanes[..16],
                e.exponent,
                &mut dst[..16],
            );
            assert_eq!(dst[..16], src[..], "{x}");
        }
    }

    #[test]
    fn float_roundtrip_one_member() {
        let xs: Vec<f32> = vec![1.0, -2.5, 1e-3, 123.456, 0.0];
        let src: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut lanes = vec![0u8; xs.len() * 4];
        let e = encode(Op::Sum, DType::F32, Float::Fast, 2, &src, &mut lanes);
        let mut dst = vec![0u8; src.len()];
        decode(
            (Op::Sum, DType::F32, Float::Fast),
            1,
            &lanes,
            e.exponent,
            &mut dst,
        );
        for (i, x) in xs.iter().enumerate() {
            let y = f32::from_le_bytes(dst[i * 4..i * 4 + 4].try_into().unwrap());
            assert!((y - x).abs() <= 123.456 * 2f32.powi(-23), "{x} -> {y}");
        }
    }

    #[test]
    fn nan_is_flagged() {
        let src: Vec<u8> = [1.0f32, f32::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut lanes = vec![0u8; 8];
        assert_eq!(
            encode(Op::Sum, DType::F32, Float::Fast, 2, &src, &mut lanes).flags,
            ENC_NONFINITE
        );
        assert_eq!(
            encode(Op::Max, DType::F32, Float::Fast, 2, &src, &mut lanes).flags,
            ENC_NONFINITE
        );
        let src: Vec<u8> = [1.0f32, f32::INFINITY]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            encode(Op::Sum, DType::F32, Float::Fast, 2, &src, &mut lanes).flags,
            ENC_NONFINITE
        );
        assert_eq!(
            encode(Op::Max, DType::F32, Float::Fast, 2, &src, &mut lanes).flags,
            0,
            "max carries infinities exactly"
        );
    }
}

#[cfg(test)]
mod exact_tests {
    use super::*;

    /// The switch's exact fold, as a host makes it ([`crate::fold`]): lanes and exponent.
    fn fold(blocks: &[(Vec<u8>, Encoded)], width: usize) -> (Vec<u8>, i16) {
        let (lanes, k, _) = crate::fold::exact(blocks, width, blocks.len());
        (lanes, k)
    }

    #[test]
    fn exact_lane_of_doubles_gives_the_exact_sum_rounded_once() {
        for op in [Op::Sum, Op::Avg] {
            for seed in 0..50u64 {
                let inputs: Vec<Vec<u8>> = (0..4)
                    .map(|m| crate::data::generate(DType::F64, seed, m, 64))
                    .collect();
                let blocks: Vec<(Vec<u8>, Encoded)> = inputs
                    .iter()
                    .map(|src| {
                        let mut out = vec![0u8; 64 * 16];
                        let e = encode(op, DType::F64, Float::Exact, 4, src, &mut out);
                        assert_eq!(e.flags, 0);
                        (out, e)
                    })
                    .collect();
                let (sum, k) = fold(&blocks, 16);
                let mut got = vec![0u8; 64 * 8];
                decode((op, DType::F64, Float::Exact), 4, &sum, k, &mut got);
                assert!(
                    got == crate::data::exact_float_sum(op, DType::F64, &inputs),
                    "{op} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn exact_lane_gives_the_exact_sum_rounded_once() {
        for (op, dtype) in [
            (Op::Sum, DType::F32),
            (Op::Avg, DType::F32),
            (Op::Sum, DType::Bf16),
        ] {
            for seed in 0..50u64 {
                let inputs: Vec<Vec<u8>> = (0..4)
                    .map(|m| crate::data::generate(dtype, seed, m, 64))
                    .collect();
                let blocks: Vec<(Vec<u8>, Encoded)> = inputs
                    .iter()
                    .map(|src| {
                        let mut out = vec![0u8; 64 * 8];
                        let e = encode(op, dtype, Float::Exact, 4, src, &mut out);
                        (out, e)
                    })
                    .collect();
                let (sum, k) = fold(&blocks, 8);
                let mut got = vec![0u8; 64 * dtype.size()];
                decode((op, dtype, Float::Exact), 4, &sum, k, &mut got);
                let want = crate::data::exact_float_sum(op, dtype, &inputs);
                for i in 0..64 {
                    let s = dtype.size();
                    assert_eq!(
                        got[i * s..i * s + s],
                        want[i * s..i * s + s],
                        "{op} {dtype} seed {seed} element {i}: inputs {:?}",
                        inputs
                            .iter()
                            .map(|b| &b[i * s..i * s + s])
                            .collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}
