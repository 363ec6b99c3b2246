//! The worker's conversions (encode into lanes, decode from them), one core.

use serde::Serialize;
use xagg_common::wire::{DType, Float, Op};

use super::report::median;

#[derive(Serialize, Clone)]
pub struct CodecPoint {
    pub op: &'static str,
    pub dtype: &'static str,
    /// The float mode (`fast` or `exact`: the lane a float sum travels in).
    pub float: &'static str,
    /// Buffer bytes encoded (or decoded) per second, in GB/s (1e9), one core.
    pub encode_gbps: f64,
    pub decode_gbps: f64,
}

/// Throughput of the worker-side conversions over a buffer cut into full segments, one
/// core, medians of several passes.
pub fn codecs(quick: bool) -> Vec<CodecPoint> {
    use xagg_worker::codec;
    let bytes = if quick { 1 << 20 } else { 32 << 20 };
    let passes = if quick { 2 } else { 7 };
    let mut out = Vec::new();
    for (op, dtype, float) in [
        (Op::Sum, DType::I32, Float::Fast),
        (Op::Avg, DType::I32, Float::Fast),
        (Op::Sum, DType::F32, Float::Fast),
        (Op::Sum, DType::F32, Float::Exact),
        (Op::Max, DType::F32, Float::Fast),
        (Op::Sum, DType::F64, Float::Fast),
        (Op::Sum, DType::F64, Float::Exact),
        (Op::Sum, DType::F16, Float::Fast),
        (Op::Sum, DType::Bf16, Float::Fast),
        (Op::Sum, DType::Bf16, Float::Exact),
        (Op::Min, DType::Bf16, Float::Fast),
    ] {
        let lane = xagg_common::wire::lane_in(op, dtype, float).unwrap();
        let seg = xagg_common::wire::max_elements_in(op, dtype, float);
        let src = xagg_worker::data::generate(dtype, 1, 0, bytes / dtype.size());
        let mut lanes = vec![0u8; seg * lane.size()];
        let mut dst = vec![0u8; src.len()];
        let seg_bytes = seg * dtype.size();
        let time = |f: &mut dyn FnMut()| {
            let t: Vec<f64> = (0..passes)
                .map(|_| {
                    let s = std::time::Instant::now();
                    f();
                    s.elapsed().as_secs_f64()
                })
                .collect();
            bytes as f64 / median(t) / 1e9
        };
        let encode_gbps = time(&mut || {
            for chunk in src.chunks(seg_bytes) {
                let n = chunk.len() / dtype.size() * lane.size();
                std::hint::black_box(codec::encode(op, dtype, float, 4, chunk, &mut lanes[..n]));
            }
        });
        let decode_gbps = time(&mut || {
            for chunk in dst.chunks_mut(seg_bytes) {
                let n = chunk.len() / dtype.size() * lane.size();
                codec::decode((op, dtype, float), 4, &lanes[..n], -10, chunk);
            }
            std::hint::black_box(&dst);
        });
        out.push(CodecPoint {
            op: op.name(),
            dtype: dtype.name(),
            float: float.name(),
            encode_gbps,
            decode_gbps,
        });
    }
    out
}
