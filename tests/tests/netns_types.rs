//! A representative subset of ops and types end to end in a netns lab, through the worker
//! library's codecs and the live switch (broadcast, egress rewrite and all).

use xagg_api::{Request, Response};
use xagg_common::{
    wire::{self, DType, Op},
    JobShape,
};
use xagg_tests::*;
use xagg_worker::{self as worker, data};

#[test]
fn ops_and_types_end_to_end() {
    if !require_root("ops_and_types_end_to_end") {
        return;
    }
    let sw = TestSwitch::start("xty", 3, |_| {});
    let workers = [0usize, 1, 2];
    let cases = [
        (Op::Sum, DType::F32),
        (Op::Max, DType::Bf16),
        (Op::Avg, DType::I32),
        (Op::Prod, DType::I64),
        (Op::Min, DType::F16),
        (Op::Xor, DType::U32),
        (Op::Avg, DType::F16),
        (Op::Sum, DType::F64),
        (Op::Min, DType::F64),
    ];
    for (j, (op, dtype)) in cases.into_iter().enumerate() {
        let id = 20 + j as u32;
        let segment = wire::max_elements(op, dtype);
        let mut members = sw.lab.members().unwrap();
        for m in &mut members {
            m.addr.set_port(47820 + j as u16);
        }
        let spec = xagg_api::JobSpec {
            id,
            op,
            dtype,
            segment: segment as u16,
            slots: 32,
            members,
            slot_base: None,
            parent: None,
            ring: None,
        };
        assert!(matches!(
            sw.api(Request::AddJob { job: spec }),
            Response::Job { .. }
        ));
        let n = 100_003;
        let inputs: Vec<Vec<u8>> = (0..3)
            .map(|m| data::generate(dtype, id as u64, m, n))
            .collect();
        let results: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = workers
                .iter()
                .map(|&w| {
                    let (ns, mut buf) = (sw.lab.worker_ns(w), inputs[w].clone());
                    s.spawn(move || {
                        xagg_linux::iface::enter_netns(&ns).unwrap();
                        let sw_addr = std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, 47800);
                        let bind = std::net::SocketAddrV4::new(
                            xagg_lab::lab::worker_ip(w),
                            47820 + j as u16,
                        );
                        let lane = wire::lane(op, dtype).unwrap();
                        let shape = JobShape::with_elements(3, 32, segment, lane).unwrap();
                        let mut p = worker::WorkerParams::new(sw_addr, bind, id, w as u8, shape);
                        (p.op, p.dtype) = (op, dtype);
                        let mut wk = worker::Worker::new(p).unwrap();
                        typed_allreduce(&mut wk, dtype, &mut buf)
                            .unwrap_or_else(|e| panic!("{} over {}: {e}", op.name(), dtype.name()));
                        buf
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (w, r) in results.iter().enumerate() {
            let worst = data::check(op, dtype, segment, &inputs, r)
                .unwrap_or_else(|e| panic!("worker {w}: {e}"));
            eprintln!(
                "{} over {}: worker {w} ok (float error {worst:.3} of bound)",
                op.name(),
                dtype.name()
            );
        }
    }
}

/// `Worker::allreduce::<T>` over the bytes of `buf` as a `Vec<T>` of the job's type: the
/// generic call exists for every element type.
fn typed_allreduce(
    wk: &mut worker::Worker,
    dtype: DType,
    buf: &mut [u8],
) -> Result<worker::Report, worker::AllreduceError> {
    fn typed<T: worker::Element + Default>(
        wk: &mut worker::Worker,
        buf: &mut [u8],
    ) -> Result<worker::Report, worker::AllreduceError> {
        let size = std::mem::size_of::<T>();
        let mut v: Vec<T> = buf
            .chunks_exact(size)
            // Safety: every bit pattern is a valid element of these plain types.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<T>()) })
            .collect();
        let r = wk.allreduce(&mut v)?;
        for (c, x) in buf.chunks_exact_mut(size).zip(&v) {
            // Safety: as above, and `c` holds exactly one element.
            unsafe { std::ptr::write_unaligned(c.as_mut_ptr().cast::<T>(), *x) };
        }
        Ok(r)
    }
    match dtype {
        DType::I32 => typed::<i32>(wk, buf),
        DType::U32 => typed::<u32>(wk, buf),
        DType::I64 => typed::<i64>(wk, buf),
        DType::F32 => typed::<f32>(wk, buf),
        DType::F16 => typed::<half::f16>(wk, buf),
        DType::Bf16 => typed::<half::bf16>(wk, buf),
        DType::F64 => typed::<f64>(wk, buf),
    }
}

/// One job reduces a different op/type pair in each message: the pairs of
/// `ops_and_types_end_to_end`, one after the other, all on job 40 created for i32 sums.
#[test]
fn one_job_reduces_a_different_pair_each_message() {
    if !require_root("one_job_reduces_a_different_pair_each_message") {
        return;
    }
    let sw = TestSwitch::start("xtp", 3, |_| {});
    assert!(matches!(
        sw.add_job_on(40, 860, 32, &[0, 1, 2], 47840),
        Response::Job { .. }
    ));
    let pairs = [
        (Op::Sum, DType::F32),
        (Op::Max, DType::Bf16),
        (Op::Avg, DType::I32),
        (Op::Prod, DType::I64),
        (Op::Min, DType::F16),
        (Op::Xor, DType::U32),
        (Op::Avg, DType::F16),
        (Op::Avg, DType::F64),
        (Op::Sum, DType::I32),
    ];
    let n = 20_011;
    let inputs: Vec<Vec<Vec<u8>>> = pairs
        .iter()
        .enumerate()
        .map(|(k, &(_, dtype))| {
            (0..3)
                .map(|m| data::generate(dtype, 40 + k as u64, m, n))
                .collect()
        })
        .collect();
    let results: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3usize)
            .map(|w| {
                let (ns, inputs, pairs) = (sw.lab.worker_ns(w), &inputs, &pairs);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let sw_addr = std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, 47800);
                    let bind = std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(w), 47840);
                    let p = worker::WorkerParams::new(
                        sw_addr,
                        bind,
                        40,
                        w as u8,
                        i32_shape(3, 32, 860),
                    );
                    let wk = worker::Worker::new(p).unwrap();
                    pairs
                        .iter()
                        .enumerate()
                        .map(|(k, &(op, dtype))| {
                            let mut buf = inputs[k][w].clone();
                            wk.allreduce_bytes_as(op, dtype, &mut buf)
                                .unwrap_or_else(|e| panic!("{op} over {dtype}: {e}"));
                            buf
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, &(op, dtype)) in pairs.iter().enumerate() {
        // A segment holds as many lanes of the pair as fit the job's 3440 bytes.
        let segment = wire::MAX_PAYLOAD / wire::lane(op, dtype).unwrap().size();
        for (w, r) in results.iter().enumerate() {
            data::check(op, dtype, segment, &inputs[k], &r[k])
                .unwrap_or_else(|e| panic!("worker {w}, {op} over {dtype}: {e}"));
        }
    }
    eprintln!(
        "job 40: {} pairs, one per message, each verified",
        pairs.len()
    );
}
