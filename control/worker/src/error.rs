//! What can go wrong in an allreduce, and what the switch said about it.

use std::{io, time::Duration};

/// A segment whose result never came, and what the switch said about its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub slot: usize,
    pub segment: u32,
    /// Members the switch still waits for in this round; `None` if the switch did not
    /// answer, or holds another round in the slot (then nobody's contribution arrived, or
    /// the switch lost the job).
    pub members: Option<Vec<u8>>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.members {
            Some(m) => write!(
                f,
                "slot {} segment {} waits for members {:?}",
                self.slot, self.segment, m
            ),
            None => write!(
                f,
                "slot {} segment {}: no contribution of this round at the switch",
                self.slot, self.segment
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AllreduceError {
    #[error("allreduce of job {job} message {message} failed: no result for {waited:?}; {} segments missing: {}", missing.len(), first_few(missing))]
    Timeout {
        job: u32,
        message: u32,
        waited: Duration,
        missing: Vec<Missing>,
    },
    #[error("allreduce of job {job} message {message}: NaN or infinity in the input of {} segments ({}); their elements are NaN in the result", segments.len(), first_few(segments))]
    NonFinite {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
    #[error("allreduce of job {job} message {message}: the 64-bit sum overflowed in {} segments ({}), so their mean is wrong", segments.len(), first_few(segments))]
    Overflow {
        job: u32,
        message: u32,
        segments: Vec<u32>,
    },
    #[error("job {job}: no status reply from the switch at {switch} within {waited:?}: is the switch up, with job {job} on it and this member registered at this address and port?")]
    NoSwitch {
        job: u32,
        switch: std::net::SocketAddrV4,
        waited: Duration,
    },
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Invalid(String),
}

/// The first eight items, comma-separated, then "..." if there are more.
fn first_few<T: std::fmt::Display>(items: &[T]) -> String {
    let mut s: Vec<String> = items.iter().take(8).map(|x| x.to_string()).collect();
    if items.len() > 8 {
        s.push("...".into());
    }
    s.join(", ")
}
