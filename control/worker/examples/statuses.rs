//! What a completion says, for each way a request can end. Every member runs this with
//! its own `XAGG_*` environment (`WorkerParams::from_env`); it prints one line.

use xagg_common::wire::Op;
use xagg_worker::{AllreduceError, Buffer, Worker, WorkerParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let worker = Worker::new(WorkerParams::from_env()?)?;
    let grads = vec![1.5f32; 1 << 16];
    // Errors of the request itself come back at once.
    let request = match worker.submit(Op::Xor, Buffer::from(grads.clone())) {
        Err(AllreduceError::Invalid(why)) => {
            eprintln!("refused at submit: {why}");
            worker.submit(Op::Sum, Buffer::from(grads))?
        }
        other => other?,
    };
    // Everything else comes with the completion, which hands the buffer back.
    let done = request.wait();
    match &done.status {
        Ok(report) => println!(
            "done by the {:?} path in {:.6} s",
            report.path, report.seconds
        ),
        Err(AllreduceError::Timeout { missing, .. }) => {
            println!("timed out; the switch says:");
            for m in missing {
                println!("  {m}");
            }
        }
        Err(AllreduceError::NoSwitch { switch, .. }) => println!("unreachable: {switch}"),
        Err(AllreduceError::Refused { reason, .. }) => println!("refused: {reason}"),
        Err(AllreduceError::NonFinite { segments, .. }) => {
            println!("non-finite input in segments {segments:?}")
        }
        Err(AllreduceError::Overflow { segments, .. }) => {
            println!("too wide for the lanes in segments {segments:?}")
        }
        Err(AllreduceError::GivenUp { segments, .. }) => {
            println!("other members gave up on segments {segments:?}")
        }
        Err(AllreduceError::Cancelled { .. }) => println!("cancelled"),
        Err(AllreduceError::Io(e)) => println!("socket error: {e}"),
        Err(AllreduceError::Join(why)) => println!("join failed: {why}"),
        Err(AllreduceError::Invalid(why)) => println!("invalid: {why}"),
        Err(AllreduceError::AfXdp(why)) => println!("AF_XDP receive: {why}"),
        // Only with peers (`Worker::serve_peers`, `Worker::recover`).
        Err(AllreduceError::Withdrawn { .. }) => println!("to be recovered from peers"),
        Err(AllreduceError::Abandoned { segments, .. }) => {
            println!("no rank holds segments {segments:?}: made another way")
        }
        Err(AllreduceError::MemberGone { rank, .. }) => {
            println!("rank {rank}'s process is gone")
        }
        Err(AllreduceError::MemberFailed { rank, reason, .. }) => {
            println!("rank {rank}'s call failed: {reason}")
        }
    }
    // After a failure the buffer holds results for the segments that completed.
    let _buffer = done.buffer.into_vec::<f32>().unwrap();
    Ok(())
}
