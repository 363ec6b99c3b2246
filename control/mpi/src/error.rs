//! Why a communicator is not made a job: what went wrong on this rank, or on the first
//! rank it went wrong on.

use std::ffi::c_int;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings, or this rank's placement in the job.
    #[error(transparent)]
    Settings(#[from] xagg_worker::Error),
    #[error(transparent)]
    Join(#[from] xagg_worker::AllreduceError),
    #[error("rank {rank}'s daemon address did not arrive whole")]
    DaemonAddress { rank: usize },
    /// What failed on the first failing rank, as that rank said it (its text is all that
    /// crosses between ranks).
    #[error("rank {rank}: {reason}")]
    Rank { rank: c_int, reason: String },
}
