//! The reductions, over 64-bit words of payload: two 32-bit lanes or one 64-bit lane per
//! word. Called with the slot's lock held, so everything is inlined and loops have
//! constant bounds. The payload is read where it is ([`Words`]): in the frame's one
//! buffer, or staged out of a multi-buffer frame.

use core::cell::Cell;

use xagg_common::{
    slot::{Fold, EMPTY_TOP, LANE_SIGN, SLOT_WORDS},
    wire::{DType, BUFFER_PAYLOAD, DTYPE_EXACT, ENC_OVERFLOW},
    ShadowCopy,
};

use crate::slot::Round;

/// Words of the longest payload veth keeps in one buffer: the direct path's limit.
pub const BUFFER_WORDS: usize = BUFFER_PAYLOAD / 8;

/// A round's payload, word by word.
pub trait Words {
    /// The most words it can hold: the loops' constant bound.
    const MAX: usize;
    /// Whether word `i` is there: the check the verifier needs before each access.
    fn has(&self, i: usize) -> bool;
    /// Whether all of words `0..BUFFER_WORDS` are there: one check for a whole buffer.
    fn has_buffer(&self) -> bool;
    /// # Safety
    /// `has(i)` holds, or `has_buffer()` and `i < BUFFER_WORDS`.
    unsafe fn get(&self, i: usize) -> u64;
    /// # Safety
    /// As for [`Words::get`].
    unsafe fn set(&self, i: usize, w: u64);
}

/// The payload in the frame's (first and only) buffer, at `payload..end`.
pub struct InFrame {
    pub payload: usize,
    pub end: usize,
}

impl Words for InFrame {
    // Longer payloads are staged: the direct path's loops stay short for the verifier.
    const MAX: usize = BUFFER_WORDS;
    #[inline(always)]
    fn has(&self, i: usize) -> bool {
        self.payload + i * 8 + 8 <= self.end
    }

    #[inline(always)]
    fn has_buffer(&self) -> bool {
        self.payload + BUFFER_WORDS * 8 <= self.end
    }

    #[inline(always)]
    unsafe fn get(&self, i: usize) -> u64 {
        unsafe { *((self.payload + i * 8) as *const u64) }
    }

    #[inline(always)]
    unsafe fn set(&self, i: usize, w: u64) {
        unsafe { *((self.payload + i * 8) as *mut u64) = w };
    }
}

/// The payload copied out of a multi-buffer frame into a per-CPU buffer (and the result
/// written there, to be copied back).
pub struct Staged(pub *mut [u64; SLOT_WORDS]);

impl Words for Staged {
    const MAX: usize = SLOT_WORDS;
    #[inline(always)]
    fn has(&self, _i: usize) -> bool {
        // The loops' own bound (SLOT_WORDS) keeps every index inside the buffer.
        true
    }

    #[inline(always)]
    fn has_buffer(&self) -> bool {
        true
    }

    #[inline(always)]
    unsafe fn get(&self, i: usize) -> u64 {
        unsafe { *(*self.0).get_unchecked(i) }
    }

    #[inline(always)]
    unsafe fn set(&self, i: usize, w: u64) {
        unsafe { *(*self.0).get_unchecked_mut(i) = w };
    }
}

/// Wrapping sum of the two 32-bit lanes of `a` and `b` at once: the low 31 bits of each
/// lane add without crossing into the next lane, and bit 31 of each lane is the xor of
/// both operands' bit 31 and the carry into it.
#[inline(always)]
fn add_32x2(a: u64, b: u64) -> u64 {
    ((a & !LANE_SIGN) + (b & !LANE_SIGN)) ^ ((a ^ b) & LANE_SIGN)
}

/// `f` applied to the low and the high 32-bit lanes.
#[inline(always)]
fn lanes(a: u64, b: u64, f: impl Fn(u32, u32) -> u32) -> u64 {
    let lo = f(a as u32, b as u32) as u64;
    let hi = f((a >> 32) as u32, (b >> 32) as u32) as u64;
    hi << 32 | lo
}

/// Arithmetic shift right of both signed 32-bit lanes by `s` (0..=31).
#[inline(always)]
fn sar_32x2(x: u64, s: u32) -> u64 {
    lanes(x, 0, |a, _| ((a as i32) >> s) as u32)
}

/// `v.data[i] = f(v.data[i], payload word i)` for each of the round's `words`; with
/// `write`, also the payload word = `v.data[i]`.
#[inline(always)]
fn fold_words<W: Words>(
    v: &mut ShadowCopy,
    src: &W,
    words: usize,
    write: bool,
    f: impl Fn(u64, u64) -> u64,
) {
    let mut fold_word = |i: usize| {
        let r = f(unsafe { *v.data.get_unchecked(i) }, unsafe { src.get(i) });
        unsafe { *v.data.get_unchecked_mut(i) = r };
        if write {
            unsafe { src.set(i, r) };
        }
    };
    // A full buffer: one bounds check for the whole payload instead of one per word (the
    // verifier accepts the accesses at offsets below the checked length).
    if words == BUFFER_WORDS && src.has_buffer() {
        let mut i = 0usize;
        // Four words per iteration: a quarter of the loop's own work per word.
        while i + 4 <= BUFFER_WORDS {
            let mut k = 0;
            while k < 4 {
                fold_word(i + k);
                k += 1;
            }
            i += 4;
        }
        while i < BUFFER_WORDS {
            fold_word(i);
            i += 1;
        }
        return;
    }
    let mut i = 0usize;
    while i < W::MAX {
        if i >= words || !src.has(i) {
            break;
        }
        fold_word(i);
        i += 1;
    }
}

/// Folds the payload into shadow copy `v` with fold `F` (a [`Fold`]), turning the payload
/// into the result with `write`.
#[inline(always)]
pub fn fold<const F: u32, W: Words>(v: &mut ShadowCopy, src: &W, r: &Round, write: bool) {
    const SUM32: u32 = Fold::Sum32 as u32;
    const SUM64: u32 = Fold::Sum64 as u32;
    const SUM_BFP: u32 = Fold::SumBfp as u32;
    const SUM_BFP64: u32 = Fold::SumBfp64 as u32;
    const MIN_I32: u32 = Fold::MinI32 as u32;
    const MIN_I64: u32 = Fold::MinI64 as u32;
    const PROD32: u32 = Fold::Prod32 as u32;
    const PROD64: u32 = Fold::Prod64 as u32;
    const AND: u32 = Fold::And as u32;
    const SUM_EXACT: u32 = Fold::SumExact as u32;
    const SUM_EXACT128: u32 = Fold::SumExact128 as u32;
    const MOVE: u32 = Fold::Move as u32;
    let w = r.words;
    match F {
        SUM32 => sum_32(v, src, w, write),
        SUM64 => fold_words(v, src, w, write, |a, b| a.wrapping_add(b)),
        SUM_BFP => {
            let (sa, sb) = align(v, r, 31);
            fold_words(v, src, w, write, |a, b| {
                add_32x2(sar_32x2(a, sa), sar_32x2(b, sb))
            });
        }
        SUM_BFP64 => {
            let (sa, sb) = align(v, r, 63);
            fold_words(v, src, w, write, |a, b| {
                ((a as i64 >> sa).wrapping_add(b as i64 >> sb)) as u64
            });
        }
        // The groups' programs (`Fold::program`) take what tells their folds apart from
        // the round, as masks: a constant would have the compiler branch on it per word.
        MIN_I32 => {
            let [signed, max] = r.masks;
            fold_words(v, src, w, write, |a, b| {
                pick(a, b, lt_32x2(a ^ signed, b ^ signed) ^ max)
            });
        }
        MIN_I64 => {
            let [sign, max] = r.masks;
            fold_words(v, src, w, write, |a, b| {
                pick(a, b, lt_i64(a, b, sign) ^ max)
            });
        }
        PROD32 => fold_words(v, src, w, write, |a, b| {
            lanes(a, b, |x, y| x.wrapping_mul(y))
        }),
        PROD64 => fold_words(v, src, w, write, |a, b| a.wrapping_mul(b)),
        AND => {
            // a | b is (a & b) | (a ^ b).
            let [and, xor] = r.masks;
            fold_words(v, src, w, write, |a, b| (a & b & and) | ((a ^ b) & xor));
        }
        SUM_EXACT => {
            let (sa, sb) = align_exact(v, r, 63);
            // The sums' magnitudes, ored, by the completing contribution only (`write`, a
            // constant once inlined): what a complete copy holds is exact, so its
            // magnitude is a pure function of the inputs (a level above checks its bound
            // with it, not with each level's headroom added up).
            let seen = Cell::new(0u64);
            fold_words(v, src, w, write, |a, b| {
                let s = (a << sa).wrapping_add(b << sb);
                if write {
                    seen.set(seen.get() | (s ^ ((s as i64 >> 63) as u64)));
                }
                s
            });
            if write {
                settle_top(v, bit_length(seen.get()));
            }
        }
        SUM_EXACT128 => {
            let (sa, sb) = align_exact(v, r, 127);
            let m = fold_pairs(v, src, w, write, sa, sb);
            if write {
                settle_top(v, m);
            }
        }
        MOVE => {
            // The root's payload is stored; another member's completing frame gets the
            // stored data if it has room for it (none: a header-only completion). A mask,
            // not a branch per word: the verifier walks one path.
            let data = 0u64.wrapping_sub((r.data != 0) as u64);
            if r.data != 0 || write {
                fold_words(v, src, w, write, |a, b| (b & data) | (a & !data));
            }
        }
        // `Fold` has no other value.
        _ => {}
    }
}

/// `x` where `mask` is all ones, `y` where it is zero: a select without a branch (the
/// target has no conditional move, and a branch per lane multiplies the states the
/// verifier walks).
#[inline(always)]
fn pick(x: u64, y: u64, mask: u64) -> u64 {
    y ^ ((x ^ y) & mask)
}

/// The borrows out of the top bits of `x - y` (as the sign bits of a word): where `x < y`
/// unsigned, given `d`, the difference whose top bits are those of the subtraction.
#[inline(always)]
fn borrows(x: u64, y: u64, d: u64) -> u64 {
    (!x & y) | ((!x | y) & d)
}

/// All ones in each unsigned 32-bit lane where `x`'s is below `y`'s, else zero: both
/// lanes at once, by word arithmetic a compiler does not turn back into compares (and so
/// into branches).
#[inline(always)]
fn lt_32x2(x: u64, y: u64) -> u64 {
    // Each lane's difference, no borrow crossing into the lane above.
    let d = ((x | LANE_SIGN).wrapping_sub(y & !LANE_SIGN)) ^ ((x ^ !y) & LANE_SIGN);
    let lt = borrows(x, y, d) & LANE_SIGN;
    lt | (lt - (lt >> 31))
}

/// All ones if `x < y` as signed 64-bit values, else zero: the sign of `x - y`, corrected
/// where the subtraction overflows. `sign` is the sign bit, taken from the round: with a
/// constant, a compiler sees the compare in it and makes it a branch again.
#[inline(always)]
fn lt_i64(x: u64, y: u64, sign: u64) -> u64 {
    let d = x.wrapping_sub(y);
    ((((d ^ ((x ^ y) & (d ^ x))) & sign) as i64) >> 63) as u64
}

/// Aligns two blocks of block floating point to the larger exponent: the right shifts of
/// the stored mantissas and of the payload's (at most `max`, a lane's bits less one), with
/// the copy's exponent raised to the larger one.
#[inline(always)]
fn align(v: &mut ShadowCopy, r: &Round, max: i32) -> (u32, u32) {
    if r.exponent > v.exponent {
        let s = (r.exponent - v.exponent).min(max) as u32;
        v.exponent = r.exponent;
        (s, 0)
    } else {
        (0, (v.exponent - r.exponent).min(max) as u32)
    }
}

/// Aligns two blocks of the exact lane to the smaller exponent: the left shifts of the
/// stored values and of the payload's, which lose nothing while the sum fits (checked from
/// the headers' magnitudes alone: [`ENC_OVERFLOW`] where it would not). A block of zeros
/// (magnitude 0) changes nothing; a copy of zeros so far takes the payload's exponent.
#[inline(always)]
fn align_exact(v: &mut ShadowCopy, r: &Round, max: i32) -> (u32, u32) {
    if r.magnitude == 0 {
        // The payload's words are zero: shifted or not, they add nothing.
        return (0, 0);
    }
    let top = r.exponent + r.magnitude as i32;
    if v.top == EMPTY_TOP {
        v.exponent = r.exponent;
        v.top = top as i16;
        check_fits(v, r);
        return (0, 0);
    }
    let (sa, sb) = if r.exponent < v.exponent {
        let s = v.exponent - r.exponent;
        v.exponent = r.exponent;
        (s, 0)
    } else {
        (0, r.exponent - v.exponent)
    };
    if top > v.top as i32 {
        v.top = top as i16;
    }
    check_fits(v, r);
    (sa.min(max) as u32, sb.min(max) as u32)
}

/// Flags a copy whose sum of the round's members may not fit its signed lane (64 bits, or
/// 128 for doubles; the dtype tells): each value lies in [-2^`top`, 2^`top`), so the sum
/// of 2^`headroom` of them in [-2^(top + headroom), 2^(top + headroom)), in units of
/// 2^`exponent`. The lanes add modulo 2^64 (2^128), so only the sum's bound matters, not
/// the order partial sums meet in: the flag is a pure function of the inputs.
#[inline(always)]
pub fn check_fits(v: &mut ShadowCopy, r: &Round) {
    let bits = if r.dtype & !DTYPE_EXACT == DType::F64 as u8 {
        127
    } else {
        63
    };
    if v.top != EMPTY_TOP && v.top as i32 + r.headroom as i32 - v.exponent > bits {
        v.flags |= ENC_OVERFLOW as u32;
    }
}

/// `x << s` of a 128-bit value in two words (low, high), `s` in 0..=127, without branches:
/// a branch per element multiplies the states the verifier walks past its budget.
#[inline(always)]
fn shl_128(lo: u64, hi: u64, s: u32) -> (u64, u64) {
    let t = s & 63;
    let low = lo << t;
    // The bits of `lo` that cross into the high word; `lo >> 1 >> (63 - t)` is 0 at t = 0.
    let high = (hi << t) | ((lo >> 1) >> (63 - t));
    // All ones from a shift of 64 on: the low word moves up whole.
    let far = 0u64.wrapping_sub((s >> 6) as u64 & 1);
    (low & !far, (high & !far) | (low & far))
}

/// One element of [`fold_pairs`]: words `i` (low) and `i + 1` (high). A function, not a
/// closure, so that it is inlined: nothing may be called under the slot's lock.
#[inline(always)]
fn fold_pair<W: Words>(
    v: &mut ShadowCopy,
    src: &W,
    i: usize,
    write: bool,
    (sa, sb): (u32, u32),
    seen: &mut (u64, u64),
) {
    let (alo, ahi) = shl_128(
        unsafe { *v.data.get_unchecked(i) },
        unsafe { *v.data.get_unchecked(i + 1) },
        sa,
    );
    let (blo, bhi) = shl_128(unsafe { src.get(i) }, unsafe { src.get(i + 1) }, sb);
    let lo = alo.wrapping_add(blo);
    // The carry out of the low words, from their top bits (no compare: no branch).
    let carry = ((alo & blo) | ((alo | blo) & !lo)) >> 63;
    let hi = ahi.wrapping_add(bhi).wrapping_add(carry);
    unsafe {
        *v.data.get_unchecked_mut(i) = lo;
        *v.data.get_unchecked_mut(i + 1) = hi;
    }
    if write {
        let sign = (hi as i64 >> 63) as u64;
        seen.0 |= hi ^ sign;
        seen.1 |= lo ^ sign;
        unsafe {
            src.set(i, lo);
            src.set(i + 1, hi);
        }
    }
}

/// The exact sum over 128-bit lanes (words 2i and 2i + 1: low, high): the stored value
/// shifted left by `sa`, the payload's by `sb`, added with the carry; with `write`, the
/// payload becomes the sum and the sums' magnitude (bits of the largest) is returned.
#[inline(always)]
fn fold_pairs<W: Words>(
    v: &mut ShadowCopy,
    src: &W,
    words: usize,
    write: bool,
    sa: u32,
    sb: u32,
) -> i32 {
    // The sums' high and low words, each xored with its sign and ored.
    let mut seen = (0u64, 0u64);
    if words == BUFFER_WORDS && src.has_buffer() {
        let mut i = 0usize;
        while i + 2 <= BUFFER_WORDS {
            fold_pair(v, src, i, write, (sa, sb), &mut seen);
            i += 2;
        }
    } else {
        let mut i = 0usize;
        while i + 2 <= W::MAX {
            if i + 2 > words || !src.has(i + 1) {
                break;
            }
            fold_pair(v, src, i, write, (sa, sb), &mut seen);
            i += 2;
        }
    }
    if seen.0 != 0 {
        64 + bit_length(seen.0)
    } else {
        bit_length(seen.1)
    }
}

/// Bits of `x` up to its highest set bit (0 for 0), without loops: the BPF target has no
/// instruction for it.
#[inline(always)]
pub fn bit_length(mut x: u64) -> i32 {
    let mut n = 0;
    for s in [32, 16, 8, 4, 2, 1] {
        if x >> s != 0 {
            n += s;
            x >>= s;
        }
    }
    n + x as i32
}

/// A complete copy's `top`: its exact sum lies in [-2^m, 2^m) of its exponent's units.
#[inline(always)]
fn settle_top(v: &mut ShadowCopy, m: i32) {
    v.top = if m == 0 {
        EMPTY_TOP
    } else {
        (v.exponent + m) as i16
    };
}

/// The sum of 32-bit integer lanes, two per word: the commonest fold, and the bench's floor
/// (`xagg_floor` runs it alone).
#[inline(always)]
pub fn sum_32<W: Words>(v: &mut ShadowCopy, src: &W, words: usize, write: bool) {
    fold_words(v, src, words, write, add_32x2);
}

/// The first contribution of a round: copied in as it is.
#[inline(always)]
pub fn copy_in<W: Words>(v: &mut ShadowCopy, src: &W, words: usize) {
    fold_words(v, src, words, false, |_a, b| b);
}

/// The stored result, copied into the payload.
#[inline(always)]
pub fn copy_out<W: Words>(v: &mut ShadowCopy, src: &W, words: usize) {
    fold_words(v, src, words, true, |a, _b| a);
}
