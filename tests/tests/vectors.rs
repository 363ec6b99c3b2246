//! The test vectors of docs/protocol.md, against the user-space encoder and decoder and
//! against the XDP program's parser.

use xagg_common::{
    slot::ShadowState,
    wire::{DType, Float, Header, Kind, Op, FLAG_LAST, FLAG_SHADOW, HEADER_LEN, PAYLOAD_OFFSET},
    Counter,
};
use xagg_tests::*;

/// The hex block following `<!-- vector: NAME -->` in docs/protocol.md.
fn vector(name: &str) -> Vec<u8> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .unwrap();
    let marker = format!("<!-- vector: {name} -->");
    let at = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("vector {name} missing from protocol.md"));
    let block = doc[at..]
        .split("```")
        .nth(1)
        .expect("code block after the marker");
    block
        .lines()
        .skip(1)
        .flat_map(|l| l.split_whitespace())
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

fn vector1_header(kind: Kind) -> Header {
    Header::builder(kind)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(7)
        .message(1)
        .segment(2)
        .slot(3)
        .member(1)
        .flags(FLAG_SHADOW | FLAG_LAST)
        .count(3)
        .cookie(0x0123_4567_89ab_cdef)
        .build()
}

#[test]
fn encoder_matches_vectors() {
    let values = [1i32, -2, 0x0102_0304];
    assert_eq!(
        contribution(vector1_header(Kind::Contribution), &values),
        vector("contribution")
    );
    assert_eq!(
        contribution(vector1_header(Kind::Result), &values),
        vector("result")
    );
    assert_eq!(
        frame(&member(1), PORT, &vector("contribution")),
        vector("frame")
    );
}

#[test]
fn decoder_matches_vectors() {
    let v = vector("contribution");
    let h = Header::from_bytes(&v).unwrap();
    assert_eq!(h, vector1_header(Kind::Contribution));
    assert_eq!(
        (
            h.job(),
            h.message(),
            h.segment(),
            h.slot(),
            h.member,
            h.count(),
            h.shadow()
        ),
        (7, 1, 2, 3, 1, 3, 1)
    );
    let vals: Vec<i32> = v[HEADER_LEN..HEADER_LEN + 12]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, [1, -2, 0x0102_0304]);
    assert_eq!(
        Header::from_bytes(&vector("result")).unwrap().kind,
        Kind::Result as u8
    );
}

#[test]
fn xdp_parser_matches_vectors() {
    if !require_root("xdp_parser_matches_vectors") {
        return;
    }
    let mut sw = load_switch();
    sw.add_job(7, job(2, Op::Sum, DType::I32, 8, 100, 4));
    let r = sw.run(&vector("frame"));
    assert_eq!(r.action, XDP_DROP);
    assert_eq!(sw.counter(Counter::Contribution), 1);
    let s = sw.slot(103);
    let v = &s.shadow[1];
    assert_eq!(
        (v.state, v.message, v.segment, v.count, v.seen),
        (ShadowState::Filling as u32, 1, 2, 3, 0b10)
    );
    assert_eq!(
        v.data[0],
        u64::from_le_bytes(
            vector("contribution")[HEADER_LEN..HEADER_LEN + 8]
                .try_into()
                .unwrap()
        )
    );
    // Member 0 completes it: the result frame carries vector 2's header and the sum.
    let mut h = vector1_header(Kind::Contribution);
    h.member = 0;
    let r = sw.run(&frame(&member(0), PORT, &contribution(h, &[10, 20, 30])));
    assert_eq!(r.action, XDP_REDIRECT);
    let mut want = vector("result");
    want[18] = 0;
    want[HEADER_LEN..HEADER_LEN + 12]
        .copy_from_slice(&[11i32, 18, 0x0102_0304 + 30].map(i32::to_le_bytes).concat());
    assert_eq!(&r.out[PAYLOAD_OFFSET - HEADER_LEN..], &want[..]);
}

/// Vector 4: a hello, against the encoder, the decoder and the switch program (which
/// records it under its token).
#[test]
fn hello_matches_its_vector() {
    let token = 0x0102_0304_0506_0708u64;
    let mut out = [0u8; HEADER_LEN + xagg_common::wire::STATUS_PAYLOAD];
    let n = xagg_common::wire::finish(
        &xagg_common::wire::hello(token),
        xagg_common::wire::STATUS_PAYLOAD,
        &mut out,
    )
    .unwrap();
    assert_eq!(out[..n].to_vec(), vector("hello"));
    let bytes = vector("hello");
    let p = xagg_common::wire::decode(&bytes).expect("a hello decodes");
    assert_eq!(p.header.kind, Kind::Hello as u8);
    assert_eq!(xagg_common::wire::hello_token(&p.header), token);
    if !require_root("hello_matches_its_vector") {
        return;
    }
    let mut sw = load_switch();
    assert_eq!(
        sw.run(&frame(&member(1), PORT, &vector("hello"))).action,
        XDP_DROP
    );
    assert_eq!(sw.counter(Counter::Hello), 1);
    assert_eq!(sw.hellos.get(&token, 0).unwrap().addr.ip, member(1).ip);
}

/// Vector 5: an f64 sum, against the worker's encoding and the decoder; the 16-bit
/// exponent decodes back to the values.
#[test]
fn f64_matches_its_vector() {
    let values = [1.0f64, -0.5];
    let src: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut lanes = [0u8; 16];
    let enc = xagg_worker::codec::encode(Op::Sum, DType::F64, Float::Fast, 2, &src, &mut lanes);
    // Vector 1's coordinates, with this type, count and exponent.
    let mut h = vector1_header(Kind::Contribution);
    h.dtype = DType::F64 as u8;
    h.set_count(2);
    h.set_exponent(enc.exponent);
    h.set_enc_flags(enc.flags);
    let mut out = [0u8; HEADER_LEN + 16];
    let n = xagg_common::wire::encode(&h, &lanes, &mut out).unwrap();
    assert_eq!(out[..n].to_vec(), vector("f64"));
    let v = vector("f64");
    let p = xagg_common::wire::decode(&v).unwrap();
    assert_eq!(p.header.exponent(), -55);
    let mut back = [0u8; 16];
    xagg_worker::codec::decode(
        (Op::Sum, DType::F64, Float::Fast),
        1,
        p.payload,
        -55,
        &mut back,
    );
    assert_eq!(back.to_vec(), src);
}

/// Vector 6: a header-only contribution to an all-gather, against the encoder and the
/// decoder; through the switch program it joins its round (counted as a contribution,
/// nothing stored), the root's data then sent pending, and the last member's header-only
/// contribution completes the round with a header-only result.
#[test]
fn gather_matches_its_vector() {
    use xagg_common::wire::{Collective, FLAG_HEADER_ONLY, FLAG_PENDING};
    let h = Header::builder(Kind::Contribution)
        .op(Op::Or)
        .dtype(DType::U32)
        .job(7)
        .message(1)
        .segment(2)
        .slot(3)
        .member(1)
        .flags(FLAG_SHADOW | FLAG_LAST | FLAG_HEADER_ONLY)
        .count(3)
        .collective(Collective::AllGather, 2)
        .cookie(0x0123_4567_89ab_cdef)
        .build();
    assert_eq!(h.to_bytes().to_vec(), vector("gather"));
    let bytes = vector("gather");
    let p = xagg_common::wire::decode(&bytes).expect("a header-only contribution decodes");
    assert_eq!(
        (p.header.collective(), p.header.root(), p.payload.len()),
        (2, 2, 0)
    );
    if !require_root("gather_matches_its_vector") {
        return;
    }
    let mut sw = load_switch();
    sw.add_job(7, job(3, Op::Or, DType::U32, 8, 100, 4));
    let r = sw.run(&frame(&member(1), PORT, &vector("gather")));
    assert_eq!((r.action, sw.counter(Counter::Contribution)), (XDP_DROP, 1));
    // The root's data: stored and sent to every member, marked pending.
    let mut root = h;
    root.member = 2;
    root.flags = FLAG_SHADOW | FLAG_LAST;
    let r = sw.run(&frame(&member(2), PORT, &contribution(root, &[10, 20, 30])));
    assert_eq!(r.action, XDP_REDIRECT);
    let out = Header::from_bytes(&r.out[PAYLOAD_OFFSET - HEADER_LEN..]).unwrap();
    assert_eq!(
        (out.kind, out.flags & FLAG_PENDING),
        (Kind::Result as u8, FLAG_PENDING)
    );
    assert_eq!(
        &r.out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 12],
        &[10i32, 20, 30].map(i32::to_le_bytes).concat()[..]
    );
    // Member 0's header-only contribution completes it: a header-only completion.
    let mut last = h;
    last.member = 0;
    let r = sw.run(&frame(&member(0), PORT, &last.to_bytes()));
    assert_eq!((r.action, sw.counter(Counter::Complete)), (XDP_REDIRECT, 1));
    let out = Header::from_bytes(&r.out[PAYLOAD_OFFSET - HEADER_LEN..]).unwrap();
    assert_eq!(
        out.flags & (FLAG_PENDING | FLAG_HEADER_ONLY),
        FLAG_HEADER_ONLY
    );
    assert_eq!(r.out.len(), PAYLOAD_OFFSET);
    // A header-only contribution from the root, or to an allreduce, is refused.
    let mut bad = h;
    bad.member = 2;
    bad.set_segment(9);
    let r = sw.run(&frame(&member(2), PORT, &bad.to_bytes()));
    assert_eq!(
        (r.action, sw.counter(Counter::DropBadLength)),
        (XDP_DROP, 1)
    );
}
