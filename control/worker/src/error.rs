//! What can go wrong in an allreduce, and what the switch said about it.

use std::{io, time::Duration};

/// A segment whose result never came, and what the switch said about its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub slot: usize,
    pub segment: u32,
    /// Members the switch still waits for in this round: empty if the switch completed
    /// it (and so sent the result, which did not arrive); `None` if the switch did not
    /// answer, or holds another round in the slot (see `answered`).
    pub members: Option<Vec<u8>>,
    /// Whether the switch answered the status query at all.
    pub answered: bool,
    /// Whether the aggregation point (a host, a lower switch) has every member's
    /// contribution and sent its partial up: the level above has not answered.
    pub above: bool,
    /// What the level above waits for in this round, when it answered the query the
    /// aggregation point forwarded: its members still missing (empty: it completed the
    /// round, and its result did not come down).
    pub above_members: Option<Vec<u8>>,
}

impl Missing {
    /// Whether everything there is to learn about this segment is in: the aggregation
    /// point's answer, and for a round it sent up, the level above's.
    pub fn complete(&self) -> bool {
        self.answered && (!self.above || self.above_members.is_some())
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (slot, segment) = (self.slot, self.segment);
        match (&self.members, self.answered) {
            (Some(m), _) if m.is_empty() && self.above => match &self.above_members {
                Some(up) if up.is_empty() => write!(
                    f,
                    "slot {slot} segment {segment}: the level above completed it, and its result did not come down to this rank's aggregation point"
                ),
                Some(up) => write!(
                    f,
                    "slot {slot} segment {segment}: this rank's aggregation point sent its partial up; the level above waits for its members {up:?}"
                ),
                None => write!(
                f,
                    "slot {slot} segment {segment}: this rank's aggregation point has every member's contribution and sent its partial up; the level above has not answered (a member missing there, or the parent gone)"
                ),
            },
            (Some(m), _) if m.is_empty() => write!(
                f,
                "slot {slot} segment {segment}: the switch completed it and sent the result, which never arrived here (a packet filter on this host? on veth, this host's end of the link must run an XDP program: the lab's xagg_host, or receive with --afxdp)"
            ),
            (Some(m), _) => write!(f, "slot {slot} segment {segment} waits for members {m:?}"),
            (None, true) => write!(
                f,
                "slot {slot} segment {segment}: the switch holds another round there; no contribution of this one reached it"
            ),
            (None, false) => write!(
                f,
                "slot {slot} segment {segment}: no status reply from the switch"
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
    #[error("job {job}: no status reply from the switch at {switch} within {waited:?}: is the switch up, with job {job} on it and this member registered at this address and port? (on veth, replies are also lost when this host's end of the link runs no XDP program: the lab's xagg_host, or receive with --afxdp)")]
    NoSwitch {
        job: u32,
        switch: std::net::SocketAddrV4,
        waited: Duration,
    },
    /// Not marked as the error's source: the message carries it once already.
    #[error("job {job}: the switch refused this member: {reason}")]
    Refused { job: u32, reason: String },
    #[error("allreduce of job {job}{}: cancelled", message.map(|m| format!(" message {m}")).unwrap_or_default())]
    Cancelled { job: u32, message: Option<u32> },
    /// Joining the job failed: the daemon did not answer, or not every rank came.
    #[error("join: {0}")]
    Join(String),
    #[error("socket: {0}")]
    Io(io::Error),
    #[error("{0}")]
    Invalid(String),
}

impl Clone for AllreduceError {
    fn clone(&self) -> Self {
        match self {
            Self::Timeout {
                job,
                message,
                waited,
                missing,
            } => Self::Timeout {
                job: *job,
                message: *message,
                waited: *waited,
                missing: missing.clone(),
            },
            Self::NonFinite {
                job,
                message,
                segments,
            } => Self::NonFinite {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
            Self::Overflow {
                job,
                message,
                segments,
            } => Self::Overflow {
                job: *job,
                message: *message,
                segments: segments.clone(),
            },
            Self::NoSwitch {
                job,
                switch,
                waited,
            } => Self::NoSwitch {
                job: *job,
                switch: *switch,
                waited: *waited,
            },
            Self::Refused { job, reason } => Self::Refused {
                job: *job,
                reason: reason.clone(),
            },
            Self::Cancelled { job, message } => Self::Cancelled {
                job: *job,
                message: *message,
            },
            // An OS error keeps its code; others their kind and text.
            Self::Io(e) => Self::Io(match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            }),
            Self::Invalid(s) => Self::Invalid(s.clone()),
            Self::Join(s) => Self::Join(s.clone()),
        }
    }
}

/// The first eight items, comma-separated, then "..." if there are more.
fn first_few<T: std::fmt::Display>(items: &[T]) -> String {
    let mut s: Vec<String> = items.iter().take(8).map(|x| x.to_string()).collect();
    if items.len() > 8 {
        s.push("...".into());
    }
    s.join(", ")
}

impl From<io::Error> for AllreduceError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}
