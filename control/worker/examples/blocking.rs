//! One blocking allreduce: the buffer is reduced in place, and the call returns when the
//! result is complete. Every member runs this with its own `XAGG_*` environment
//! (`WorkerParams::from_env`).

use xagg_worker::{Worker, WorkerParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let worker = Worker::new(WorkerParams::from_env()?)?;
    let members = worker.params().shape.members() as i32;
    let mut grads = vec![1i32; 1 << 20];
    let report = worker.allreduce(&mut grads)?;
    assert!(grads.iter().all(|&x| x == members));
    println!(
        "{} bytes in {:.6} s by the {:?} path",
        report.bytes, report.seconds, report.path
    );
    Ok(())
}
