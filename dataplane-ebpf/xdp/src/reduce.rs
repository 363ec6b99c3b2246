//! The reductions, over 64-bit words of payload: two 32-bit lanes or one 64-bit lane per
//! word. Called with the slot's lock held, so everything is inlined and loops have
//! constant bounds.

use xagg_common::{
    slot::SLOT_WORDS,
    wire::{Lane, Op},
    ShadowCopy,
};

use crate::slot::Round;

/// Sign bits of the two i32 lanes of a word.
const LANE_SIGN: u64 = 0x8000_0000_8000_0000;

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

/// `v.data[i] = f(v.data[i], payload word i)`; with `write`, also the payload word =
/// `v.data[i]`. The caller has checked the payload word's bounds.
macro_rules! fold_word {
    ($v:expr, $payload:expr, $i:expr, $write:expr, |$a:ident, $b:ident| $f:expr) => {{
        let i = $i;
        let p = $payload + i * 8;
        let $a = unsafe { *$v.data.get_unchecked(i) };
        let $b = unsafe { *(p as *const u64) };
        let r = $f;
        unsafe { *$v.data.get_unchecked_mut(i) = r };
        if $write {
            unsafe { *(p as *mut u64) = r };
        }
    }};
}

/// [`fold_word!`] for each word of the round, turning the packet into the result with
/// `write`.
macro_rules! fold_words {
    ($v:expr, $payload:expr, $end:expr, $words:expr, $write:expr, |$a:ident, $b:ident| $f:expr) => {{
        let mut i = 0usize;
        while i < SLOT_WORDS {
            if i >= $words || $payload + i * 8 + 8 > $end {
                break;
            }
            fold_word!($v, $payload, i, $write, |$a, $b| $f);
            i += 1;
        }
    }};
}

/// [`fold_words!`] with a fast path for a full segment: one bounds check for the whole
/// payload instead of one per word (the verifier accepts the word accesses at offsets below
/// the checked length). Used for the commonest fold, the copies in and out, and nowhere
/// else, to keep the program within the verifier's instruction budget.
macro_rules! fold_words_fast {
    ($v:expr, $payload:expr, $end:expr, $words:expr, $write:expr, |$a:ident, $b:ident| $f:expr) => {{
        if $words == SLOT_WORDS && $payload + SLOT_WORDS * 8 <= $end {
            let mut i = 0usize;
            // Four words per iteration: a quarter of the loop's own work per word.
            while i + 4 <= SLOT_WORDS {
                let mut k = 0;
                while k < 4 {
                    fold_word!($v, $payload, i + k, $write, |$a, $b| $f);
                    k += 1;
                }
                i += 4;
            }
            while i < SLOT_WORDS {
                fold_word!($v, $payload, i, $write, |$a, $b| $f);
                i += 1;
            }
        } else {
            fold_words!($v, $payload, $end, $words, $write, |$a, $b| $f)
        }
    }};
}

/// Folds the frame's payload into shadow copy `v` with the round's op.
#[inline(always)]
pub fn fold(v: &mut ShadowCopy, payload: usize, end: usize, r: &Round, write: bool) {
    const SUM: u8 = Op::Sum as u8;
    const MIN: u8 = Op::Min as u8;
    const MAX: u8 = Op::Max as u8;
    const AVG: u8 = Op::Avg as u8;
    const PROD: u8 = Op::Prod as u8;
    const AND: u8 = Op::And as u8;
    const OR: u8 = Op::Or as u8;
    const XOR: u8 = Op::Xor as u8;
    const I32: u8 = Lane::I32 as u8;
    const U32: u8 = Lane::U32 as u8;
    const I64: u8 = Lane::I64 as u8;
    const BFP: u8 = Lane::Bfp32 as u8;
    const KEY: u8 = Lane::Key32 as u8;
    const I64_SPLIT: u8 = Lane::I64Split as u8;
    let w = r.words;
    match (r.op, r.lane) {
        (SUM, I32 | U32) => sum_32(v, payload, end, w, write),
        // The mean of i64 travels split in two lanes whose sums cannot overflow.
        (SUM | AVG, I64) | (AVG, I64_SPLIT) => {
            fold_words!(v, payload, end, w, write, |a, b| a.wrapping_add(b))
        }
        (SUM | AVG, BFP) => {
            // Align both blocks to the larger exponent, then add the mantissas.
            let (sa, sb) = if r.exponent > v.exponent {
                ((r.exponent - v.exponent).min(31) as u32, 0)
            } else {
                (0, (v.exponent - r.exponent).min(31) as u32)
            };
            fold_words!(v, payload, end, w, write, |a, b| add_32x2(
                sar_32x2(a, sa),
                sar_32x2(b, sb)
            ));
            if r.exponent > v.exponent {
                v.exponent = r.exponent;
            }
        }
        (MIN, I32) => fold_words!(v, payload, end, w, write, |a, b| lanes(
            a,
            b,
            |x, y| (x as i32).min(y as i32) as u32
        )),
        (MIN, U32 | KEY) => fold_words!(v, payload, end, w, write, |a, b| lanes(a, b, |x, y| x
            .min(y))),
        (MIN, I64) => fold_words!(v, payload, end, w, write, |a, b| (a as i64).min(b as i64)
            as u64),
        (MAX, I32) => fold_words!(v, payload, end, w, write, |a, b| lanes(
            a,
            b,
            |x, y| (x as i32).max(y as i32) as u32
        )),
        (MAX, U32 | KEY) => fold_words!(v, payload, end, w, write, |a, b| lanes(a, b, |x, y| x
            .max(y))),
        (MAX, I64) => fold_words!(v, payload, end, w, write, |a, b| (a as i64).max(b as i64)
            as u64),
        (PROD, I32 | U32) => fold_words!(v, payload, end, w, write, |a, b| lanes(a, b, |x, y| x
            .wrapping_mul(y))),
        (PROD, I64) => fold_words!(v, payload, end, w, write, |a, b| a.wrapping_mul(b)),
        (AND, _) => fold_words!(v, payload, end, w, write, |a, b| a & b),
        (OR, _) => fold_words!(v, payload, end, w, write, |a, b| a | b),
        (XOR, _) => fold_words!(v, payload, end, w, write, |a, b| a ^ b),
        // The control plane admits no other combination.
        _ => {}
    }
}

/// The sum of 32-bit integer lanes, two per word: the commonest fold, and the bench's floor
/// (`xagg_floor` runs it alone).
#[inline(always)]
pub fn sum_32(v: &mut ShadowCopy, payload: usize, end: usize, words: usize, write: bool) {
    fold_words_fast!(v, payload, end, words, write, |a, b| add_32x2(a, b));
}

/// The first contribution of a round: copied in as it is.
#[inline(always)]
pub fn copy_in(v: &mut ShadowCopy, payload: usize, end: usize, words: usize) {
    fold_words_fast!(v, payload, end, words, false, |_a, b| b);
}

/// The stored result, copied into the frame.
#[inline(always)]
pub fn copy_out(v: &mut ShadowCopy, payload: usize, end: usize, words: usize) {
    fold_words_fast!(v, payload, end, words, true, |a, _b| a);
}
