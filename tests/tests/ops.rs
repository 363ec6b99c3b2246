//! Every op over every data type the switch takes, through the switch program
//! (BPF_PROG_RUN), with the worker library's encodings: random inputs at several segment
//! lengths and member counts, checked against the documented semantics.

use xagg_common::{
    wire::{
        self, DType, Header, Kind, Op, ENC_NONFINITE, ENC_OVERFLOW, HEADER_LEN, PAYLOAD_OFFSET,
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
    let n = inputs[0].len() / dtype.size();
    let lane = wire::lane(op, dtype).unwrap();
    let mut last = None;
    for (m, src) in inputs.iter().enumerate() {
        let mut lanes = vec![0u8; n * lane.size()];
        let enc = codec::encode(op, dtype, inputs.len(), src, &mut lanes);
        let mut h = Header::builder(Kind::Contribution)
            .op(op)
            .dtype(dtype)
            .job(jid)
            .message(0)
            .segment(sid)
            .slot(0)
            .member(m as u8)
            .flags(if sid % 2 == 1 { 1 } else { 0 })
            .count(n as u16)
            .build();
        h.set_exponent(enc.exponent);
        h.set_enc_flags(enc.flags);
        let mut udp = vec![0u8; HEADER_LEN + wire::payload_len(lanes.len(), 1)];
        wire::encode(&h, &lanes, &mut udp).unwrap();
        let f = frame(&member(m as u8), PORT, &udp);
        let r = sw.run(&f);
        // A single-buffer result is broadcast through the devmap; a multi-buffer one
        // (past 3520 bytes of frame) is passed to the kernel for `xagg_fanout`.
        let want = match (m + 1 == inputs.len(), f.len() > 3520) {
            (false, _) => XDP_DROP,
            (true, false) => XDP_REDIRECT,
            (true, true) => XDP_PASS,
        };
        assert_eq!(
            r.action,
            want,
            "{} over {}: member {m}",
            op.name(),
            dtype.name()
        );
        last = Some(r.out);
    }
    let out = last.unwrap();
    let h = Header::from_bytes(&out[PAYLOAD_OFFSET - HEADER_LEN..]).unwrap();
    let mut result = vec![0u8; n * dtype.size()];
    codec::decode(
        op,
        dtype,
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
