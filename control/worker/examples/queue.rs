//! A completion queue: one thread submits a stream of requests, another takes their
//! completions as they end, whichever ends first. Every member runs this with its own
//! `XAGG_*` environment (`WorkerParams::from_env`).

use xagg_common::wire::Op;
use xagg_worker::{Buffer, CompletionQueue, Worker, WorkerParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let worker = Worker::new(WorkerParams::from_env()?)?;
    let me = worker.params().member as i32;
    let n = worker.params().shape.members() as i32;
    let queue = CompletionQueue::new();

    // The requests of one job are submitted by one thread, in the same order on every
    // member; completions are taken by another.
    let submitted: Vec<u64> = (0..16)
        .map(|k| {
            let len = 1000 * (k + 1);
            let data = vec![me + k as i32; len];
            queue.submit(&worker, Op::Sum, Buffer::from(data))
        })
        .collect::<Result<_, _>>()?;

    let taker = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let mut order = Vec::new();
            while let Some(done) = queue.wait() {
                let report = done.status.expect("allreduce");
                let k = (report.bytes / 4 / 1000 - 1) as i32;
                let sum = done.buffer.into_vec::<i32>().unwrap();
                assert!(sum.iter().all(|&x| x == n * k + n * (n - 1) / 2));
                order.push(done.id);
            }
            order
        })
    };
    let order = taker.join().unwrap();
    assert_eq!(order.len(), submitted.len());
    println!(
        "member {me}: {} completions from the queue, all verified",
        order.len()
    );
    Ok(())
}
