//! The switch's folds, made on a host: a segment of a reduce-scatter or reduce that its
//! owner lost when the switch stopped answering, made from every member's contribution
//! ([`crate::peers`]). Each contribution is encoded as its member sends it and the lanes
//! are folded as `dataplane-ebpf/xdp/src/reduce.rs` folds them, in rank order: integer
//! folds and the exact float lanes give the switch's bits, whatever order it met them in;
//! block floating point (the fast float mode) gives the result of that order, one of
//! the results the switch could have given.

use xagg_common::{
    slot::Fold,
    wire::{Lane, ENC_OVERFLOW},
};

use crate::{codec, Reduction};

/// A folded segment: its lanes, the exponent they are scaled by, and the flags the
/// switch would have set on its result.
#[derive(Debug, PartialEq, Eq)]
pub struct Folded {
    pub lanes: Vec<u8>,
    pub exponent: i16,
    pub flags: u16,
}

/// Folds the members' contributions to one segment (`inputs`, each its elements as the
/// member holds them, in rank order) as the switch does, in a job of `ranks` ranks.
pub fn fold(r: Reduction, ranks: usize, inputs: &[&[u8]]) -> Folded {
    let elements = inputs.first().map_or(0, |i| i.len() / r.dtype.size());
    let mut flags = 0u16;
    let encoded: Vec<(Vec<u8>, codec::Encoded)> = inputs
        .iter()
        .map(|src| {
            let mut lanes = vec![0u8; elements * r.lane.size()];
            let e = codec::encode(r.op, r.dtype, r.float, ranks, src, &mut lanes);
            flags |= e.flags;
            (lanes, e)
        })
        .collect();
    let fold = Fold::of(r.op, r.lane).expect("the job's op and lane have a fold");
    let (lanes, exponent, overflow) = match fold {
        Fold::SumBfp => blocks(&encoded, 4, 31),
        Fold::SumBfp64 => blocks(&encoded, 8, 63),
        Fold::SumExact => exact(&encoded, 8, inputs.len()),
        Fold::SumExact128 => exact(&encoded, 16, inputs.len()),
        f => (lanes(f, r.lane, &encoded), 0, false),
    };
    if overflow {
        flags |= ENC_OVERFLOW;
    }
    Folded {
        lanes,
        exponent,
        flags,
    }
}

/// The integer folds, lane by lane: their result does not depend on the order.
fn lanes(f: Fold, lane: Lane, encoded: &[(Vec<u8>, codec::Encoded)]) -> Vec<u8> {
    let mut acc = encoded[0].0.clone();
    let wide = lane.size() >= 8 && !matches!(f, Fold::And | Fold::Or | Fold::Xor);
    for (b, _) in &encoded[1..] {
        if wide {
            for (a, b) in acc.chunks_exact_mut(8).zip(b.chunks_exact(8)) {
                let (x, y) = (word(a) as i64, word(b) as i64);
                let v = match f {
                    Fold::Sum64 => x.wrapping_add(y),
                    Fold::MinI64 => x.min(y),
                    Fold::MaxI64 => x.max(y),
                    Fold::Prod64 => x.wrapping_mul(y),
                    _ => unreachable!("{f:?} over 64-bit lanes"),
                };
                a.copy_from_slice(&v.to_le_bytes());
            }
            continue;
        }
        for (a, b) in acc.chunks_exact_mut(4).zip(b.chunks_exact(4)) {
            let x = u32::from_le_bytes(a[..].try_into().expect("4 bytes"));
            let y = u32::from_le_bytes(b.try_into().expect("4 bytes"));
            let v = match f {
                Fold::Sum32 => x.wrapping_add(y),
                Fold::MinI32 => (x as i32).min(y as i32) as u32,
                Fold::MaxI32 => (x as i32).max(y as i32) as u32,
                Fold::MinU32 => x.min(y),
                Fold::MaxU32 => x.max(y),
                Fold::Prod32 => x.wrapping_mul(y),
                Fold::And => x & y,
                Fold::Or => x | y,
                Fold::Xor => x ^ y,
                _ => unreachable!("{f:?} over 32-bit lanes"),
            };
            a.copy_from_slice(&v.to_le_bytes());
        }
    }
    acc
}

fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// Block floating point, in the order given: each block aligned to the larger exponent
/// by arithmetic right shifts (at most `max`), mantissas of `width` bytes added wrapping.
fn blocks(encoded: &[(Vec<u8>, codec::Encoded)], width: usize, max: i32) -> (Vec<u8>, i16, bool) {
    let mut acc = encoded[0].0.clone();
    let mut exponent = encoded[0].1.exponent as i32;
    for (b, e) in &encoded[1..] {
        let (sa, sb) = if e.exponent as i32 > exponent {
            let s = (e.exponent as i32 - exponent).min(max) as u32;
            exponent = e.exponent as i32;
            (s, 0)
        } else {
            (0, (exponent - e.exponent as i32).min(max) as u32)
        };
        for (a, b) in acc.chunks_exact_mut(width).zip(b.chunks_exact(width)) {
            if width == 4 {
                let x = i32::from_le_bytes(a[..].try_into().expect("4 bytes")) >> sa;
                let y = i32::from_le_bytes(b.try_into().expect("4 bytes")) >> sb;
                a.copy_from_slice(&x.wrapping_add(y).to_le_bytes());
            } else {
                let x = (word(a) as i64) >> sa;
                let y = (word(b) as i64) >> sb;
                a.copy_from_slice(&x.wrapping_add(y).to_le_bytes());
            }
        }
    }
    (acc, exponent as i16, false)
}

/// The exact lanes (`width` 8 or 16 bytes): every block of nonzero values aligned to the
/// smallest exponent by left shifts and added; flagged where the sum of `members` values
/// may not fit the lane, as the switch checks it from the blocks' magnitudes.
pub(crate) fn exact(
    encoded: &[(Vec<u8>, codec::Encoded)],
    width: usize,
    members: usize,
) -> (Vec<u8>, i16, bool) {
    let nonzero = || encoded.iter().filter(|(_, e)| e.magnitude > 0);
    let Some(k) = nonzero().map(|(_, e)| e.exponent as i32).min() else {
        return (encoded[0].0.clone(), encoded[0].1.exponent, false);
    };
    let top = nonzero()
        .map(|(_, e)| e.exponent as i32 + e.magnitude as i32)
        .max()
        .expect("a nonzero block");
    let bits = width as i32 * 8 - 1;
    let headroom = usize::BITS as i32 - members.saturating_sub(1).leading_zeros() as i32;
    let overflow = top + headroom - k > bits;
    let elements = encoded[0].0.len() / width;
    let mut acc = vec![0i128; elements];
    for (b, e) in nonzero() {
        let s = ((e.exponent as i32 - k).min(bits)) as u32;
        for (a, lane) in acc.iter_mut().zip(b.chunks_exact(width)) {
            *a = if width == 8 {
                let m = (word(lane) << s) as i64;
                (*a as i64).wrapping_add(m) as i128
            } else {
                let m = i128::from_le_bytes(lane.try_into().expect("16 bytes")) << s;
                a.wrapping_add(m)
            };
        }
    }
    let lanes = acc
        .iter()
        .flat_map(|a| a.to_le_bytes()[..width].to_vec())
        .collect();
    (lanes, k as i16, overflow)
}

#[cfg(test)]
mod tests {
    use xagg_common::wire::{lane_in, DType, Float, Op};

    use super::*;
    use crate::data;

    fn reduction(op: Op, dtype: DType, float: Float) -> Reduction {
        Reduction {
            op,
            dtype,
            float,
            lane: lane_in(op, dtype, float).expect("a lane"),
        }
    }

    fn decoded(r: Reduction, ranks: usize, inputs: &[Vec<u8>]) -> Vec<u8> {
        let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
        let f = fold(r, ranks, &refs);
        let mut out = vec![0u8; inputs[0].len()];
        codec::decode(
            (r.op, r.dtype, r.float),
            ranks as u32,
            &f.lanes,
            f.exponent,
            &mut out,
        );
        out
    }

    #[test]
    fn integer_folds_are_the_elementwise_reductions() {
        let inputs: Vec<Vec<u8>> = (0..3)
            .map(|m| data::generate(DType::I32, 7, m, 100))
            .collect();
        let values = |b: &Vec<u8>| -> Vec<i32> {
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let v: Vec<Vec<i32>> = inputs.iter().map(values).collect();
        for (op, f) in [
            (
                Op::Sum,
                (|a: i32, b: i32| a.wrapping_add(b)) as fn(i32, i32) -> i32,
            ),
            (Op::Min, |a, b| a.min(b)),
            (Op::Max, |a, b| a.max(b)),
            (Op::Prod, |a, b| a.wrapping_mul(b)),
            (Op::Xor, |a, b| a ^ b),
        ] {
            let got = values(&decoded(reduction(op, DType::I32, Float::Fast), 3, &inputs));
            let want: Vec<i32> = (0..100).map(|i| f(f(v[0][i], v[1][i]), v[2][i])).collect();
            assert_eq!(got, want, "{op}");
        }
    }

    #[test]
    fn exact_float_sums_are_the_exact_sum_rounded_once() {
        for (dtype, op) in [
            (DType::F32, Op::Sum),
            (DType::F32, Op::Avg),
            (DType::Bf16, Op::Sum),
            (DType::F64, Op::Sum),
        ] {
            for seed in 0..20 {
                let inputs: Vec<Vec<u8>> =
                    (0..4).map(|m| data::generate(dtype, seed, m, 64)).collect();
                assert_eq!(
                    decoded(reduction(op, dtype, Float::Exact), 4, &inputs),
                    data::exact_float_sum(op, dtype, &inputs),
                    "{op} {dtype} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn fast_float_sums_stay_within_the_block_rounding() {
        let inputs: Vec<Vec<u8>> = (0..4)
            .map(|m| data::generate(DType::F32, 3, m, 64))
            .collect();
        let got = decoded(reduction(Op::Sum, DType::F32, Float::Fast), 4, &inputs);
        let want = data::exact_float_sum(Op::Sum, DType::F32, &inputs);
        for (g, w) in got.chunks_exact(4).zip(want.chunks_exact(4)) {
            let (g, w) = (
                f32::from_le_bytes(g.try_into().unwrap()),
                f32::from_le_bytes(w.try_into().unwrap()),
            );
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "{g} against {w}");
        }
    }

    #[test]
    fn exact_sums_too_wide_for_the_lanes_are_flagged() {
        let big = |x: f32| -> Vec<u8> { x.to_le_bytes().to_vec() };
        let r = reduction(Op::Sum, DType::F32, Float::Exact);
        let f = fold(r, 2, &[&big(1e30), &big(1e-30)]);
        assert_eq!(f.flags & ENC_OVERFLOW, ENC_OVERFLOW);
        let f = fold(r, 2, &[&big(1.5), &big(2.25)]);
        assert_eq!(f.flags, 0);
    }
}
