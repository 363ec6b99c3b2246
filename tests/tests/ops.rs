//! Every op over every data type the switch takes, through the switch program
//! (BPF_PROG_RUN), with the worker library's encodings: random inputs at several segment
//! lengths and member counts, checked against the documented semantics.

use xagg_common::{
    wire::{
        self, DType, Float, Header, Kind, Op, ENC_NONFINITE, ENC_OVERFLOW, HEADER_LEN,
        PAYLOAD_OFFSET,
    },
    Counter,
};
use xagg_tests::*;
use xagg_worker::{codec, data};

/// Runs one segment of `inputs` (one buffer per member) through the switch as job `jid` on
/// slot 0, round `sid`, and decodes the result. Returns the result and its `enc_flags`.
fn reduce(
    sw: &mut Switch,
    jid: u32,
    sid: u32,
    op: Op,
    dtype: DType,
    inputs: &[Vec<u8>],
) -> (Vec<u8>, u16) {
    let order: Vec<usize> = (0..inputs.len()).collect();
    reduce_in(sw, jid, sid, (op, dtype, Float::Fast), inputs, &order)
}

/// [`reduce`] in float mode `float`, the members' contributions arriving in `order`.
fn reduce_in(
    sw: &mut Switch,
    jid: u32,
    sid: u32,
    (op, dtype, float): (Op, DType, Float),
    inputs: &[Vec<u8>],
    order: &[usize],
) -> (Vec<u8>, u16) {
    let n = inputs[0].len() / dtype.size();
    let lane = wire::lane_in(op, dtype, float).unwrap();
    let mut last = None;
    for (k, &m) in order.iter().enumerate() {
        let src = &inputs[m];
        let mut lanes = vec![0u8; n * lane.size()];
        let enc = codec::encode(op, dtype, float, inputs.len(), src, &mut lanes);
        let mut h = Header::builder(Kind::Contribution)
            .op(op)
            .dtype(dtype)
            .job(jid)
            .message(0)
            .segment(sid)
            .slot(0)
            .member(m as u8)
            .flags(if sid % 2 == 1 { 1 } else { 0 })
            .float(float)
            .count(n as u16)
            .magnitude(enc.magnitude)
            .build();
        h.set_exponent(enc.exponent);
        h.set_enc_flags(enc.flags);
        let mut udp = vec![0u8; HEADER_LEN + wire::payload_len(lanes.len(), 1)];
        wire::encode(&h, &lanes, &mut udp).unwrap();
        let f = frame(&member(m as u8), PORT, &udp);
        let r = sw.run(&f);
        // A single-buffer result is broadcast through the devmap; a multi-buffer one
        // (past 3520 bytes of frame) is passed to the kernel for `xagg_fanout`.
        let want = match (k + 1 == inputs.len(), f.len() > 3520) {
            (false, _) => XDP_DROP,
            (true, false) => XDP_REDIRECT,
            (true, true) => XDP_PASS,
        };
        assert_eq!(
            r.action,
            want,
            "{} over {} ({float}): member {m}",
            op.name(),
            dtype.name()
        );
        last = Some(r.out);
    }
    let out = last.unwrap();
    let h = Header::from_bytes(&out[PAYLOAD_OFFSET - HEADER_LEN..]).unwrap();
    let mut result = vec![0u8; n * dtype.size()];
    codec::decode(
        (op, dtype, float),
        inputs.len() as u32,
        &out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + n * lane.size()],
        h.exponent(),
        &mut result,
    );
    (result, h.enc_flags())
}

#[test]
fn every_op_and_type_through_the_switch() {
    if !require_root("every_op_and_type_through_the_switch") {
        return;
    }
    let mut sw = load_switch();
    let mut jid = 0;
    let mut cases = 0;
    for op in Op::ALL {
        for dtype in DType::ALL {
            if wire::lane(op, dtype).is_none() {
                continue;
            }
            let max = wire::max_elements(op, dtype);
            for members in [2usize, 3, 5] {
                jid += 1;
                sw.add_job(jid, job(members, op, dtype, max as u16, 0, 1));
                let mut worst = 0f64;
                // The longest single-buffer segment, and the longest segment.
                let buffer = wire::BUFFER_PAYLOAD / wire::lane(op, dtype).unwrap().size();
                for (sid, len) in [1usize, 7, 64, buffer, max].into_iter().enumerate() {
                    let seed = jid as u64 * 1000 + sid as u64;
                    // Uniform over each type's range: sums of i64 leave i64 all the time,
                    // and their means are still exact.
                    let inputs: Vec<Vec<u8>> = (0..members)
                        .map(|m| data::generate(dtype, seed, m as u32, len))
                        .collect();
                    let (result, flags) = reduce(&mut sw, jid, sid as u32, op, dtype, &inputs);
                    assert_eq!(flags & (ENC_NONFINITE | ENC_OVERFLOW), 0);
                    worst = worst.max(
                        data::check(op, dtype, len, &inputs, &result)
                            .unwrap_or_else(|e| panic!("{members} members, {len} elements: {e}")),
                    );
                    cases += 1;
                }
                if worst > 0.0 {
                    eprintln!(
                        "{:>4} {:>4} x{members}: largest float error {:.3} of its bound",
                        op.name(),
                        dtype.name(),
                        worst
                    );
                }
                sw.remove_job(jid);
            }
        }
    }
    eprintln!("{cases} cases");
    assert_eq!(
        sw.counter(Counter::DropBadOp) + sw.counter(Counter::DropBadLength),
        0
    );
}

fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), n) }.to_vec()
}

#[test]
fn edge_cases() {
    if !require_root("edge_cases") {
        return;
    }
    let mut sw = load_switch();
    let mut jid = 100;
    let mut run = |op: Op, dtype: DType, inputs: Vec<Vec<u8>>| {
        jid += 1;
        sw.add_job(
            jid,
            job(
                inputs.len(),
                op,
                dtype,
                wire::max_elements(op, dtype) as u16,
                0,
                1,
            ),
        );
        reduce(&mut sw, jid, 0, op, dtype, &inputs)
    };
    // Integer overflow wraps for sum and prod.
    let (r, _) = run(
        Op::Sum,
        DType::I32,
        vec![bytes(&[i32::MAX, i32::MIN, -1]), bytes(&[1, -1, i32::MIN])],
    );
    assert_eq!(r, bytes(&[i32::MIN, i32::MAX, i32::MAX]));
    let (r, _) = run(
        Op::Prod,
        DType::I64,
        vec![bytes(&[i64::MAX, 1 << 40]), bytes(&[2i64, 1 << 40])],
    );
    assert_eq!(r, bytes(&[-2i64, 0]));
    let (r, _) = run(
        Op::Sum,
        DType::U32,
        vec![bytes(&[u32::MAX]), bytes(&[2u32])],
    );
    assert_eq!(r, bytes(&[1u32]));
    // The mean of i32 is exact even where the sum leaves i32, rounded toward -inf.
    let (r, _) = run(
        Op::Avg,
        DType::I32,
        vec![bytes(&[i32::MAX, -3, 5]), bytes(&[i32::MAX, 0, 6])],
    );
    assert_eq!(r, bytes(&[i32::MAX, -2, 5]));
    // The mean of i64 is exact where the sum leaves i64, rounded toward -inf.
    let (r, flags) = run(
        Op::Avg,
        DType::I64,
        vec![
            bytes(&[i64::MAX, i64::MIN, i64::MAX, -3]),
            bytes(&[1i64, i64::MIN, i64::MAX, 0]),
        ],
    );
    assert_eq!(r, bytes(&[1i64 << 62, i64::MIN, i64::MAX, -2]));
    assert_eq!(flags & ENC_OVERFLOW, 0);
    // Min and max of every pair of extremes (32-bit values two to a word: the pairs fall
    // in both of a word's lanes).
    fn extremes<T: Copy + Ord>(
        run: &mut impl FnMut(Op, DType, Vec<Vec<u8>>) -> (Vec<u8>, u16),
        dtype: DType,
        values: &[T],
    ) {
        let (a, b): (Vec<T>, Vec<T>) = values
            .iter()
            .flat_map(|&x| values.iter().map(move |&y| (x, y)))
            .unzip();
        for (op, pick) in [(Op::Min, Ord::min as fn(T, T) -> T), (Op::Max, Ord::max)] {
            let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| pick(x, y)).collect();
            let (r, _) = run(op, dtype, vec![bytes(&a), bytes(&b)]);
            assert_eq!(r, bytes(&want), "{} over {}", op.name(), dtype.name());
        }
    }
    let i32s = [i32::MIN, i32::MIN + 1, -2, -1, 0, 1, i32::MAX - 1, i32::MAX];
    extremes(&mut run, DType::I32, &i32s);
    let u32s = [
        0u32,
        1,
        0x7fff_ffff,
        0x8000_0000,
        0x8000_0001,
        u32::MAX - 1,
        u32::MAX,
    ];
    extremes(&mut run, DType::U32, &u32s);
    let i64s = [
        i64::MIN,
        i64::MIN + 1,
        -(1 << 32),
        -1,
        0,
        1,
        // Equal high halves, low halves on either side of bit 31.
        0x7fff_ffff,
        0x8000_0000,
        1 << 32,
        i64::MAX - 1,
        i64::MAX,
    ];
    extremes(&mut run, DType::I64, &i64s);
    // Extremes for min and max.
    let (r, _) = run(
        Op::Min,
        DType::I64,
        vec![bytes(&[i64::MIN, 0]), bytes(&[i64::MAX, -1])],
    );
    assert_eq!(r, bytes(&[i64::MIN, -1]));
    let (r, _) = run(
        Op::Max,
        DType::U32,
        vec![bytes(&[u32::MAX, 0]), bytes(&[0u32, 0])],
    );
    assert_eq!(r, bytes(&[u32::MAX, 0]));
    let (r, _) = run(
        Op::Max,
        DType::F32,
        vec![
            bytes(&[f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE]),
            bytes(&[-f32::MAX, 0.0f32, 1e-45]),
        ],
    );
    assert_eq!(r, bytes(&[-f32::MAX, 0.0, f32::MIN_POSITIVE]));
    // All-equal inputs: the mean is the value, exactly (a block of one magnitude loses
    // nothing: 24 mantissa bits are what f32 has).
    for x in [0.1f32, -7.25, 3e-20, 1e30] {
        let (r, _) = run(Op::Avg, DType::F32, vec![bytes(&[x]); 4]);
        assert_eq!(r, bytes(&[x]));
    }
    // Doubles: min and max exact over the extremes, subnormals and signed zeros.
    let (r, _) = run(
        Op::Max,
        DType::F64,
        vec![
            bytes(&[f64::NEG_INFINITY, -0.0, 5e-324, -f64::MAX]),
            bytes(&[-f64::MAX, 0.0f64, -5e-324, f64::NEG_INFINITY]),
        ],
    );
    assert_eq!(r, bytes(&[-f64::MAX, 0.0, 5e-324, -f64::MAX]));
    let (r, _) = run(
        Op::Min,
        DType::F64,
        vec![bytes(&[f64::INFINITY, -0.0]), bytes(&[f64::MAX, 0.0f64])],
    );
    assert_eq!(r, bytes(&[f64::MAX, -0.0]));
    // The mean of equal doubles is the value, bit for bit, at every magnitude (a block
    // of one magnitude keeps all 53 bits; subnormals too).
    for x in [0.1f64, -7.25e-300, 1.0 / 3.0, 1e300, 3e-320] {
        let (r, _) = run(Op::Avg, DType::F64, vec![bytes(&[x]); 4]);
        assert_eq!(r, bytes(&[x]), "{x}");
    }
    // Segments of doubles far below f32's range (subnormal ones too) sum exactly where
    // their bits fit one block: the exponent has 16 bits.
    let (r, _) = run(
        Op::Sum,
        DType::F64,
        vec![bytes(&[1e-310f64, -3e-310]), bytes(&[2e-310f64, 1e-310])],
    );
    assert_eq!(r, bytes(&[1e-310f64 + 2e-310, -2e-310]));
    let (r, _) = run(
        Op::Sum,
        DType::F64,
        vec![
            bytes(&[2.5e-200f64, 1.0e-200]),
            bytes(&[2.5e-200f64, -3.0e-200]),
        ],
    );
    assert_eq!(r, bytes(&[5e-200f64, -2e-200]));
    // Overflow is infinity; NaN is flagged.
    let (r, _) = run(
        Op::Sum,
        DType::F64,
        vec![bytes(&[f64::MAX]), bytes(&[f64::MAX])],
    );
    assert_eq!(r, bytes(&[f64::INFINITY]));
    let (_, flags) = run(
        Op::Sum,
        DType::F64,
        vec![bytes(&[1.0f64, f64::NAN]), bytes(&[1.0f64, 2.0])],
    );
    assert_eq!(flags & ENC_NONFINITE, ENC_NONFINITE);
    // NaN and infinities in a sum are flagged, never turned into numbers.
    let (_, flags) = run(
        Op::Sum,
        DType::F32,
        vec![bytes(&[1.0f32, f32::NAN]), bytes(&[1.0f32, 2.0])],
    );
    assert_eq!(flags & ENC_NONFINITE, ENC_NONFINITE);
    let (_, flags) = run(
        Op::Sum,
        DType::Bf16,
        vec![bytes(&[half::bf16::INFINITY]), bytes(&[half::bf16::ONE])],
    );
    assert_eq!(flags & ENC_NONFINITE, ENC_NONFINITE);
    let (_, flags) = run(
        Op::Min,
        DType::F16,
        vec![bytes(&[half::f16::NAN]), bytes(&[half::f16::ONE])],
    );
    assert_eq!(flags & ENC_NONFINITE, ENC_NONFINITE);
    // A sum of the largest floats overflows to infinity in the result, as in IEEE.
    let (r, _) = run(
        Op::Sum,
        DType::F32,
        vec![bytes(&[f32::MAX]), bytes(&[f32::MAX])],
    );
    assert_eq!(r, bytes(&[f32::INFINITY]));
    // One element, five members.
    let (r, _) = run(
        Op::Sum,
        DType::F16,
        (0..5).map(|_| bytes(&[half::f16::from_f32(0.5)])).collect(),
    );
    assert_eq!(r, bytes(&[half::f16::from_f32(2.5)]));
}

/// A job's segment as the harness states it (in the fast lane's 4-byte elements): a full
/// payload, which holds half as many of the exact lane's.
const FULL_F32: u16 = (wire::MAX_PAYLOAD / 4) as u16;

/// Every permutation of `0..n`, in lexicographic order.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for first in 0..n {
        for rest in permutations(n - 1) {
            let mut p = vec![first];
            p.extend(rest.into_iter().map(|r| if r >= first { r + 1 } else { r }));
            all.push(p);
        }
    }
    all
}

/// The exact float lane: the switch's sum is the exact sum of the inputs, rounded once,
/// whatever the order the contributions arrive in — where the fast lane's depends on it
/// (the blocks 1, 1 and 2^24 give 2^24 + 2 in one order and 2^24 in another); a sum too
/// wide for the lanes, within one member's segment or across members, is flagged; a
/// contribution in the other lane is refused for the round.
#[test]
fn exact_float_sums_are_the_same_in_every_order() {
    if !require_root("exact_float_sums_are_the_same_in_every_order") {
        return;
    }
    let mut sw = load_switch();
    let f32s = |v: &[f32]| bytes(v);
    // 1, 1 and 2^24 from three members: every arrival order.
    let inputs = vec![f32s(&[1.0]), f32s(&[1.0]), f32s(&[16_777_216.0])];
    let want = f32s(&[16_777_218.0]);
    let mut fast = std::collections::BTreeSet::new();
    for (i, order) in permutations(3).into_iter().enumerate() {
        let jid = 200 + i as u32;
        sw.add_job(jid, job(3, Op::Sum, DType::F32, FULL_F32, 0, 1));
        let (r, flags) = reduce_in(
            &mut sw,
            jid,
            0,
            (Op::Sum, DType::F32, Float::Exact),
            &inputs,
            &order,
        );
        assert_eq!((r, flags), (want.clone(), 0), "exact lane, order {order:?}");
        let (r, _) = reduce_in(
            &mut sw,
            jid,
            1,
            (Op::Sum, DType::F32, Float::Fast),
            &inputs,
            &order,
        );
        fast.insert(f32::from_le_bytes(r[..4].try_into().unwrap()).to_bits());
        sw.remove_job(jid);
    }
    assert!(
        fast.len() > 1,
        "the fast lane's sum depends on the order (that is why the exact lane exists)"
    );

    // Gradient-like data, 4 members, f32, f16, bf16 and f64, sum and avg: every order gives
    // the same bits, the exact sum rounded once.
    // Job ids stay below the harness's 256; a job added again starts from cleared slots.
    let jid = 210;
    for (op, dtype) in [
        (Op::Sum, DType::F32),
        (Op::Avg, DType::F32),
        (Op::Sum, DType::F16),
        (Op::Sum, DType::Bf16),
        (Op::Sum, DType::F64),
        (Op::Avg, DType::F64),
    ] {
        let max = wire::max_elements_in(op, dtype, Float::Exact);
        // 8 bytes an element, 16 for doubles.
        assert_eq!(max * dtype.size().max(4), wire::MAX_PAYLOAD / 2);
        for len in [1usize, 64, max] {
            let inputs: Vec<Vec<u8>> = (0..4)
                .map(|m| data::generate(dtype, len as u64 ^ dtype as u64, m, len))
                .collect();
            let mut first: Option<Vec<u8>> = None;
            for order in permutations(4).into_iter().step_by(5) {
                sw.add_job(
                    jid,
                    job(4, op, dtype, wire::max_elements(op, dtype) as u16, 0, 1),
                );
                let (r, flags) =
                    reduce_in(&mut sw, jid, 0, (op, dtype, Float::Exact), &inputs, &order);
                sw.remove_job(jid);
                assert_eq!(flags, 0, "{op} over {dtype}, {len}");
                match &first {
                    None => first = Some(r),
                    Some(f) => {
                        assert!(f == &r, "{op} over {dtype}, {len}: order {order:?} differs")
                    }
                }
            }
            let r = first.unwrap();
            assert!(
                r == data::exact_float_sum(op, dtype, &inputs),
                "{op} over {dtype}, {len}: not the exact sum rounded once"
            );
            data::check(op, dtype, len, &inputs, &r)
                .unwrap_or_else(|e| panic!("{op} over {dtype}, {len}: {e}"));
        }
    }

    let mut run = |inputs: Vec<Vec<u8>>| {
        sw.add_job(jid, job(inputs.len(), Op::Sum, DType::F32, FULL_F32, 0, 1));
        let order: Vec<usize> = (0..inputs.len()).collect();
        reduce_in(
            &mut sw,
            jid,
            0,
            (Op::Sum, DType::F32, Float::Exact),
            &inputs,
            &order,
        )
    };
    // Across members: 1 and 2^-60 fit (a sum of 62 bits), 1 and 2^-70 do not.
    let (r, flags) = run(vec![f32s(&[1.0]), f32s(&[2f32.powi(-60)])]);
    assert_eq!((r, flags), (f32s(&[1.0]), 0));
    let (_, flags) = run(vec![f32s(&[1.0]), f32s(&[2f32.powi(-70)])]);
    assert_eq!(flags & ENC_OVERFLOW, ENC_OVERFLOW, "flagged by the switch");
    // Within one member's segment: 1e30 beside 1e-30 does not fit 63 bits.
    let (_, flags) = run(vec![f32s(&[1e30, 1e-30]), f32s(&[1.0, 1.0])]);
    assert_eq!(flags & ENC_OVERFLOW, ENC_OVERFLOW, "flagged by the member");
    // Zeros beside anything, and all zeros.
    let (r, flags) = run(vec![f32s(&[0.0, 0.0]), f32s(&[3e-40, 0.0])]);
    assert_eq!((r, flags), (f32s(&[3e-40, 0.0]), 0));
    // Doubles: 1 and 2^-70 fit 128-bit lanes (the fast lane's 56-bit block loses the
    // small one); 1 beside 2^-130 in one segment does not fit.
    let mut run64 = |inputs: Vec<Vec<u8>>| {
        sw.add_job(jid, job(inputs.len(), Op::Sum, DType::F64, 1116, 0, 1));
        let order: Vec<usize> = (0..inputs.len()).collect();
        reduce_in(
            &mut sw,
            jid,
            0,
            (Op::Sum, DType::F64, Float::Exact),
            &inputs,
            &order,
        )
    };
    let tiny = 2f64.powi(-70);
    let (r, flags) = run64(vec![bytes(&[1.0f64, tiny]), bytes(&[tiny, tiny])]);
    assert_eq!((r, flags), (bytes(&[1.0 + tiny, 2.0 * tiny]), 0));
    let (_, flags) = run64(vec![
        bytes(&[1.0f64, 2f64.powi(-130)]),
        bytes(&[1.0f64, 1.0]),
    ]);
    assert_eq!(flags & ENC_OVERFLOW, ENC_OVERFLOW, "flagged by the member");

    // A round started in one lane refuses the other's contribution.
    sw.add_job(jid, job(2, Op::Sum, DType::F32, FULL_F32, 0, 1));
    let before = sw.counter(Counter::DropBadOp);
    for (m, float) in [(0u8, Float::Fast), (1, Float::Exact)] {
        let lane = wire::lane_in(Op::Sum, DType::F32, float).unwrap();
        let lanes = vec![0u8; 4 * lane.size()];
        let h = Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::F32)
            .job(jid)
            .member(m)
            .float(float)
            .count(4)
            .build();
        let mut udp = vec![0u8; HEADER_LEN + wire::payload_len(lanes.len(), 1)];
        wire::encode(&h, &lanes, &mut udp).unwrap();
        sw.run(&frame(&member(m), PORT, &udp));
    }
    assert_eq!(sw.counter(Counter::DropBadOp), before + 1);
}
