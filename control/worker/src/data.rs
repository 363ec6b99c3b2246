//! Deterministic test data: what member `m` of a run with seed `s` contributes, so every
//! worker can compute the expected result of an allreduce on its own and verify it.

/// splitmix64: a fast, well-mixed hash of a counter.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of member `member`'s buffer.
#[inline]
pub fn element(seed: u64, member: u32, i: usize) -> i32 {
    mix(seed ^ ((member as u64) << 40) ^ i as u64) as i32
}

pub fn fill(seed: u64, member: u32, buf: &mut [i32]) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = element(seed, member, i);
    }
}

/// The wrapping sum over `members` members, element by element.
pub fn expected_sum(seed: u64, members: u32, len: usize) -> Vec<i32> {
    let mut out = vec![0i32; len];
    for m in 0..members {
        for (i, x) in out.iter_mut().enumerate() {
            *x = x.wrapping_add(element(seed, m, i));
        }
    }
    out
}

/// One member's call of `collective` (root `root`) over a message of `elems` i32 in a job
/// of `n` ranks, the data of seed `seed`, sum where it reduces: the input (if any), the
/// output as the call starts, and the output it must end with (`Worker::submit_collective`'s
/// buffers; blocks of `elems / n`).
pub struct CollectiveCase {
    pub input: Option<Vec<i32>>,
    pub output: Vec<i32>,
    pub expected: Vec<i32>,
}

impl CollectiveCase {
    pub fn new(
        collective: crate::Collective,
        root: usize,
        member: usize,
        n: usize,
        elems: usize,
        seed: u64,
    ) -> Self {
        use crate::Collective as C;
        let data = |m: usize| {
            let mut v = vec![0i32; elems];
            fill(seed, m as u32, &mut v);
            v
        };
        let block = elems / n;
        let own = member * block..(member + 1) * block;
        let sum = || expected_sum(seed, n as u32, elems);
        let mine = data(member);
        let (input, output, expected) = match collective {
            C::Allreduce => (Some(mine), vec![0; elems], sum()),
            C::ReduceScatter => (Some(mine), vec![0; block], sum()[own].to_vec()),
            C::AllGather => (
                Some(mine[own].to_vec()),
                vec![0; elems],
                (0..n)
                    .flat_map(|k| data(k)[k * block..(k + 1) * block].to_vec())
                    .collect(),
            ),
            C::Broadcast if member == root => (None, mine.clone(), mine),
            C::Broadcast => (None, vec![0; elems], data(root)),
            C::Reduce if member == root => (Some(mine.clone()), mine, sum()),
            C::Reduce => (Some(mine.clone()), mine.clone(), mine),
        };
        Self {
            input,
            output,
            expected,
        }
    }
}

use half::{bf16, f16};
use xagg_common::wire::{DType, Op};

use crate::{codec, Error};

/// Member `member`'s buffer of `n` elements of `dtype` (little-endian bytes). Integers are
/// uniform over their range; floats look like gradients: mostly small values around zero,
/// one in a hundred large, some exact zeros.
pub fn generate(dtype: DType, seed: u64, member: u32, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let r = mix(seed ^ ((member as u64) << 40) ^ i as u64);
        match dtype {
            DType::I32 | DType::U32 => out.extend_from_slice(&(r as u32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&r.to_le_bytes()),
            _ => {
                let unit = (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                let x = match r % 100 {
                    0 => unit * 100.0,
                    1..=4 => 0.0,
                    _ => unit * 1e-3,
                };
                if dtype == DType::F64 {
                    out.extend_from_slice(&x.to_le_bytes());
                    continue;
                }
                let x = x as f32;
                match dtype {
                    DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
                    DType::F16 => out.extend_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
                    _ => out.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
                }
            }
        }
    }
    out
}

fn as_f64(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F64 => f64::from_le_bytes(b[..8].try_into().unwrap()),
        DType::F32 => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DType::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
        _ => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
    }
}

/// The sum of `xs` rounded once: Neumaier's compensated sum, whose error (a few ulps of
/// the ulps) is far below any bound checked here; a plain f64 sum of doubles adds errors
/// of the bound's size (as the reference in `ops.rs`, it put the largest measured error of
/// an f64 mean at 0.93 of the bound instead of 0.35).
fn exact_sum(xs: &[f64]) -> f64 {
    let (mut s, mut c) = (0f64, 0f64);
    for &x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    s + c
}

/// The bits the exact float lane must give for `op` (sum or avg) over the float `inputs`
/// (one buffer per member): each element's exact sum — the members' values as integers
/// times 2^k, k the smallest of their exponents, summed in i128 (exact while they span
/// under 70 binary orders) — rounded once to `dtype` (f32 and f64 straight from the
/// integer; f16 and bf16 from its f64, exact below 2^53), avg's f64 divided once more. Computed
/// apart from the codec's arithmetic, as the tests' reference.
pub fn exact_float_sum(op: Op, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let size = dtype.size();
    let n = inputs[0].len() / size;
    let mut out = Vec::with_capacity(n * size);
    // x * 2^k for any k an f32 sum reaches, as two factors within f64's normal range.
    let scale = |x: f64, k: i32| x * 2f64.powi(k / 2) * 2f64.powi(k - k / 2);
    for i in 0..n {
        // Each value as (sign, integer mantissa, exponent): a double's 53 bits, or
        // an f32's 24 (f16 and bf16 widen to f32 exactly).
        let parts: Vec<(bool, i128, i32)> = inputs
            .iter()
            .map(|b| as_f64(dtype, &b[i * size..]))
            .filter(|x| *x != 0.0)
            .map(|x| {
                let bits = x.to_bits();
                let (biased, fraction) = (
                    ((bits >> 52) & 0x7ff) as i32,
                    (bits & ((1 << 52) - 1)) as i128,
                );
                let (m, e) = if biased == 0 {
                    (fraction, -1074)
                } else {
                    (fraction | 1 << 52, biased - 1075)
                };
                (x < 0.0, m, e)
            })
            .collect();
        let k = parts.iter().map(|p| p.2).min().unwrap_or(0);
        let acc: i128 = parts
            .iter()
            .map(|&(neg, m, e)| if neg { -(m << (e - k)) } else { m << (e - k) })
            .sum();
        match (dtype, op) {
            (DType::F32, Op::Sum) => {
                out.extend_from_slice(&(scale((acc as f32) as f64, k) as f32).to_le_bytes())
            }
            _ => {
                let div = if op == Op::Avg {
                    inputs.len() as f64
                } else {
                    1.0
                };
                let x = scale(acc as f64, k) / div;
                let mut b = [0u8; 8];
                let b = &mut b[..dtype.size()];
                crate::codec::put(dtype, x, b);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

/// Relative rounding of a value converted to `dtype`, and the smallest step near zero. A
/// double result is rounded twice (the sum of mantissas to a double, then avg's division):
/// a whole ulp.
fn rounding(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (2f64.powi(-52), 2f64.powi(-1074)),
        DType::F32 => (2f64.powi(-24), 2f64.powi(-149)),
        DType::F16 => (2f64.powi(-11), 2f64.powi(-24)),
        _ => (2f64.powi(-8), 2f64.powi(-133)),
    }
}

/// Checks `result` (the allreduce of `inputs`, one buffer per member, cut into segments of
/// `segment` elements) against the documented semantics of `op` over `dtype`: exact for
/// integers and for min/max of floats; for sums and means of floats within the block
/// floating point bound of docs/types.md against an f64 reference. Returns the first
/// mismatch, or the largest float error relative to its bound.
pub fn check(
    op: Op,
    dtype: DType,
    segment: usize,
    inputs: &[Vec<u8>],
    result: &[u8],
) -> Result<f64, Error> {
    check_levels(op, dtype, segment, inputs, result, 1)
}

/// [`check`] for a job whose `inputs.len()` ranks are reduced by `points` aggregation
/// points (a tree: every host and switch; a ring: every host): the float bound grows by
/// three blocks' worth per point (docs/types.md).
pub fn check_levels(
    op: Op,
    dtype: DType,
    segment: usize,
    inputs: &[Vec<u8>],
    result: &[u8],
    points: usize,
) -> Result<f64, Error> {
    let size = dtype.size();
    let n = result.len() / size;
    let members = inputs.len();
    let int = |m: usize, i: usize| -> i128 {
        let b = &inputs[m][i * size..i * size + size];
        match dtype {
            DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as i128,
            DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as i128,
            _ => i64::from_le_bytes(b.try_into().unwrap()) as i128,
        }
    };
    let bits = (size * 8) as u32;
    let wrap = |v: i128| -> i128 {
        let m = v.rem_euclid(1i128 << bits);
        if dtype != DType::U32 && m >= 1i128 << (bits - 1) {
            m - (1i128 << bits)
        } else {
            m
        }
    };
    let mut worst = 0f64;
    for i in 0..n {
        let got = &result[i * size..i * size + size];
        if matches!(dtype, DType::I32 | DType::U32 | DType::I64) {
            let g = match dtype {
                DType::I32 => i32::from_le_bytes(got.try_into().unwrap()) as i128,
                DType::U32 => u32::from_le_bytes(got.try_into().unwrap()) as i128,
                _ => i64::from_le_bytes(got.try_into().unwrap()) as i128,
            };
            let vals = (0..members).map(|m| int(m, i));
            let want = match op {
                Op::Sum => wrap(vals.sum()),
                Op::Prod => vals.fold(1i128, |a, b| wrap(a * b)),
                Op::Min => vals.min().unwrap(),
                Op::Max => vals.max().unwrap(),
                Op::Avg => vals.sum::<i128>().div_euclid(members as i128),
                Op::And => wrap(vals.fold(-1i128, |a, b| a & b)),
                Op::Or => wrap(vals.fold(0i128, |a, b| a | b)),
                Op::Xor => wrap(vals.fold(0i128, |a, b| a ^ b)),
            };
            let want = if dtype == DType::U32 {
                want.rem_euclid(1 << 32)
            } else {
                want
            };
            if g != want {
                return Err(Error::WrongInteger {
                    element: i,
                    got: g,
                    want,
                    op,
                    dtype,
                });
            }
            continue;
        }
        let g = as_f64(dtype, got);
        let vals: Vec<f64> = (0..members)
            .map(|m| as_f64(dtype, &inputs[m][i * size..]))
            .collect();
        match op {
            Op::Min | Op::Max => {
                let want = if op == Op::Min {
                    vals.iter().cloned().fold(f64::INFINITY, f64::min)
                } else {
                    vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                };
                if g != want {
                    return Err(Error::WrongFloat {
                        element: i,
                        got: g,
                        want,
                        op,
                        dtype,
                    });
                }
            }
            _ => {
                // The switch's final block exponent: the largest of the members' blocks.
                let s0 = i / segment * segment;
                let s1 = (s0 + segment).min(n);
                let k = (0..members)
                    .map(|m| {
                        let max = (s0..s1)
                            .map(|j| as_f64(dtype, &inputs[m][j * size..]).abs())
                            .fold(0.0, f64::max);
                        codec::block_exponent(max, codec::bfp_bits(dtype, members)) as i32
                    })
                    .max()
                    .unwrap();
                let mut want = exact_sum(&vals);
                let mut bound = (1.5 * members as f64 + 3.0 * points as f64 - 1.0) * 2f64.powi(k);
                if op == Op::Avg {
                    want /= members as f64;
                    bound /= members as f64;
                }
                // Then one rounding to the type, of a value within `bound` of the sum.
                let (rel, tiny) = rounding(dtype);
                bound += rel * (want.abs() + bound) + tiny;
                let err = (g - want).abs();
                if err.is_nan() || err > bound {
                    return Err(Error::AboveBound {
                        element: i,
                        got: g,
                        want,
                        error: err,
                        bound,
                        exponent: k,
                        op,
                        dtype,
                    });
                }
                worst = worst.max(err / bound);
            }
        }
    }
    Ok(worst)
}
