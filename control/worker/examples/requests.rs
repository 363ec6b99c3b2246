//! Several requests in flight on one job: messages of different ops and types pipelined,
//! one with separate input and output, one over memory the program already owns; waited
//! for in reverse order. Every member runs this with its own `XAGG_*` environment
//! (`WorkerParams::from_env`).

use xagg_common::wire::{DType, Op};
use xagg_worker::{Buffer, Worker, WorkerParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let worker = Worker::new(WorkerParams::from_env()?)?;
    let me = worker.params().member as usize;
    let n = worker.params().shape.members();

    // Three messages in flight at once, each with its own op and type.
    let grads: Vec<f32> = (0..100_000)
        .map(|i| (i % 7) as f32 * 0.5 + me as f32)
        .collect();
    let grads = worker.submit(Op::Sum, Buffer::from(grads))?;
    let steps = worker.submit(Op::Max, Buffer::from(vec![me as i64; 1000]))?;
    let flags = worker.submit(Op::Or, Buffer::from(vec![1u32 << me; 64]))?;

    // Separate input and output: the input comes back unchanged.
    let counts = worker.submit_separate(
        Op::Sum,
        Buffer::from(vec![me as i32 + 1; 5000]),
        Buffer::from(vec![0i32; 5000]),
    )?;

    // Memory owned elsewhere (here a Vec; in a binding, a NumPy array or a tensor), used
    // without a copy: the buffer keeps its owner alive until the completion hands it back.
    let mut owned = vec![me as f32; 4096];
    let (ptr, len) = (owned.as_mut_ptr().cast::<u8>(), owned.len() * 4);
    // Safety: the owner moves into the buffer, and nothing else touches it meanwhile.
    let shared = unsafe { Buffer::from_raw(ptr, len, DType::F32, owned) };
    let shared = worker.submit(Op::Min, shared)?;

    // Completions in any order: each hands its buffers back.
    let done = shared.wait();
    done.status?;
    let owned = done.buffer.into_owner().downcast::<Vec<f32>>().unwrap();
    assert!(owned.iter().all(|&x| x == 0.0));

    let done = counts.wait();
    let report = done.status?;
    let counts = done.buffer.into_vec::<i32>().unwrap();
    assert!(counts.iter().all(|&x| x as usize == n * (n + 1) / 2));
    let input = done.input.unwrap().into_vec::<i32>().unwrap();
    assert!(input.iter().all(|&x| x as usize == me + 1));
    println!(
        "counts: {} bytes by the {:?} path",
        report.bytes, report.path
    );

    let flags = flags.wait().buffer.into_vec::<u32>().unwrap();
    assert!(flags.iter().all(|&x| x == ((1u64 << n) - 1) as u32));
    let steps = steps.wait().buffer.into_vec::<i64>().unwrap();
    assert!(steps.iter().all(|&x| x as usize == n - 1));
    let done = grads.wait();
    done.status?;
    let grads = done.buffer.into_vec::<f32>().unwrap();
    let members = n as f32;
    for (i, &x) in grads.iter().enumerate() {
        let want = members * (i % 7) as f32 * 0.5 + members * (members - 1.0) / 2.0;
        assert_eq!(x, want, "element {i}");
    }
    println!("member {me}: 5 requests in flight together, all verified");
    Ok(())
}
