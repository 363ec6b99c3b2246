//! The reductions, over 64-bit words of payload. Called with the slot's lock held, so
//! everything is inlined and loops have constant bounds.

use xagg_common::{
    slot::SLOT_WORDS,
    wire::{DType, Op},
    SlotVersion,
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

/// `v.data[i] = f(v.data[i], payload[i])` for each word of the round; with `write`, also
/// `payload[i] = v.data[i]`, turning the packet into the result.
macro_rules! fold_words {
    ($v:expr, $payload:expr, $end:expr, $words:expr, $write:expr, |$a:ident, $b:ident| $f:expr) => {{
        let mut i = 0usize;
        while i < SLOT_WORDS {
            if i >= $words {
                break;
            }
            let p = $payload + i * 8;
            if p + 8 > $end {
                break;
            }
            let $a = unsafe { *$v.data.get_unchecked(i) };
            let $b = unsafe { *(p as *const u64) };
            let r = $f;
            unsafe { *$v.data.get_unchecked_mut(i) = r };
            if $write {
                unsafe { *(p as *mut u64) = r };
            }
            i += 1;
        }
    }};
}

/// Folds the frame's payload into version `v` with the round's op.
#[inline(always)]
pub fn fold(v: &mut SlotVersion, payload: usize, end: usize, r: &Round, write: bool) {
    const SUM: u8 = Op::Sum as u8;
    const AND: u8 = Op::And as u8;
    const OR: u8 = Op::Or as u8;
    const XOR: u8 = Op::Xor as u8;
    const I32: u8 = DType::I32 as u8;
    const U32: u8 = DType::U32 as u8;
    const I64: u8 = DType::I64 as u8;
    let w = r.words;
    match (r.op, r.dtype) {
        (SUM, I32 | U32) => fold_words!(v, payload, end, w, write, |a, b| add_32x2(a, b)),
        (SUM, I64) => fold_words!(v, payload, end, w, write, |a, b| a.wrapping_add(b)),
        (AND, _) => fold_words!(v, payload, end, w, write, |a, b| a & b),
        (OR, _) => fold_words!(v, payload, end, w, write, |a, b| a | b),
        (XOR, _) => fold_words!(v, payload, end, w, write, |a, b| a ^ b),
        // The control plane admits no other combination.
        _ => {}
    }
}

/// The first contribution of a round: copied in as it is.
#[inline(always)]
pub fn copy_in(v: &mut SlotVersion, payload: usize, end: usize, words: usize) {
    fold_words!(v, payload, end, words, false, |_a, b| b);
}

/// The stored result, copied into the frame.
#[inline(always)]
pub fn copy_out(v: &mut SlotVersion, payload: usize, end: usize, words: usize) {
    fold_words!(v, payload, end, words, true, |a, _b| a);
}
