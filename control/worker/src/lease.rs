//! A joined rank's lease: the daemon keeps the rank's membership while it renews it, so a
//! rank idle for minutes (a checkpoint, an evaluation) keeps its job, and a job whose
//! ranks' processes are gone is removed one lease after their last renewal. A thread
//! renews it every third of the lease for as long as the worker lives; it also takes a
//! leave handed to it, so a rank moving to another way of reducing leaves without waiting
//! for the daemon's answer.

use std::{
    sync::mpsc::{self, RecvTimeoutError, Sender},
    thread::JoinHandle,
    time::Duration,
};

use xagg_join::MemberReply;

use crate::join::Membership;

/// What the lease's thread is told.
enum Word {
    /// Leave the job, then stop.
    Leave,
}

/// The thread renewing a rank's lease; dropping it stops the renewals (without leaving).
pub(crate) struct Lease {
    tell: Option<Sender<Word>>,
    thread: Option<JoinHandle<()>>,
}

impl Lease {
    /// Renews `member`'s lease of `lease_s` seconds every third of it.
    pub(crate) fn start(member: Membership, lease_s: u32) -> std::io::Result<Self> {
        let every = Duration::from_secs(u64::from(lease_s.max(3))) / 3;
        let (tell, heard) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("xagg-lease".into())
            .spawn(move || loop {
                match heard.recv_timeout(every) {
                    Err(RecvTimeoutError::Timeout) => {
                        // The daemon no longer knows the rank: nothing left to renew. (A
                        // daemon restarting or out of reach runs its leases again from its
                        // start, so the next renewal in time is enough.)
                        if let Ok(MemberReply::Refused { .. }) = member.renew() {
                            return;
                        }
                    }
                    Ok(Word::Leave) => {
                        let _ = member.leave();
                        return;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            })?;
        Ok(Self {
            tell: Some(tell),
            thread: Some(thread),
        })
    }

    /// Hands the leave to the thread: the caller does not wait for the daemon. Dropping
    /// the lease later waits for it (a process that exits right after still leaves).
    pub(crate) fn leave_soon(&mut self) {
        if let Some(t) = &self.tell {
            let _ = t.send(Word::Leave);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Closing the channel stops the thread at once.
        self.tell.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
