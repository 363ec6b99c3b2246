//! The joins' timers, run once a second: pending jobs past the join timeout fail, jobs
//! whose ranks' leases ran out, idle open levels and jobs removed by hand go, jobs whose
//! parents took them run.

use std::time::{Duration, Instant};

use super::{
    registry::{unix_now, Level, Lifecycle},
    table::JobTable,
    Joins,
};

/// How often the idle timers of busy jobs are written to the state file at most.
const SAVE_IDLE_EVERY: Duration = Duration::from_secs(30);
/// How long the reason a pending job expired is kept for the joins still polling it.
const EXPIRED_KEPT: Duration = Duration::from_secs(600);

impl Joins {
    /// Once a second: pending jobs past the join timeout fail, jobs whose ranks' leases ran
    /// out, idle open levels and jobs removed by hand go, jobs whose parents took them run.
    pub fn tick(&mut self, dp: &mut impl JobTable) {
        self.settle_upstream(dp);
        // A level whose ranks were all in when its daemon stopped comes back pending (its
        // way up was a thread of the daemon gone): it goes up again. Before, it sat
        // "pending, waiting for []" until its join timeout.
        let stalled: Vec<_> = self
            .jobs
            .values()
            .filter(|j| matches!(j.state, Lifecycle::Pending) && j.complete() && j.needs_parent())
            .map(|j| j.key)
            .collect();
        for key in stalled {
            self.join_parent(key);
        }
        let now = Instant::now();
        self.expired
            .retain(|_, (_, t)| now.duration_since(*t) < EXPIRED_KEPT);
        let present: Vec<u32> = match dp.jobs() {
            Ok(j) => j.into_iter().map(|(id, _)| id).collect(),
            Err(_) => return,
        };
        let mut gone = Vec::new();
        let unix = unix_now();
        let mut moved = false;
        for j in self.jobs.values_mut() {
            if !j.running() {
                if now.duration_since(j.since) > self.join_timeout {
                    let missing = j.missing();
                    // Every rank here in, the level waited on its parent's job; an open
                    // level's members are whoever came, its missing ones hosts not yet in.
                    let whom = match (&j.state, j.level) {
                        (Lifecycle::JoiningParent { .. }, _) if j.complete() => {
                            "the parent's job: the job's other hosts did not all join there"
                                .into()
                        }
                        (_, Level::Open { ranks }) if missing.is_empty() => format!(
                            "the job's other hosts: the levels that joined stand for {} of its {ranks} ranks",
                            j.weight_in()
                        ),
                        _ => format!("ranks {missing:?}"),
                    };
                    gone.push((j.key, None, format!("timed out waiting for {whom}")));
                    self.expired.insert(
                        j.key,
                        (
                            format!(
                                "timed out after {} s waiting for {whom}",
                                self.join_timeout.as_secs()
                            ),
                            now,
                        ),
                    );
                }
                continue;
            }
            if !present.contains(&j.id) {
                gone.push((j.key, None, "removed from the dataplane by hand".into()));
                continue;
            }
            let Ok(a) = dp.activity(j.id) else { continue };
            // The first look after a start only takes the slots in: the idle timer read
            // from the state file goes on.
            if j.activity.is_some_and(|last| last != a) {
                j.active_unix_s = unix;
                // A round moving on is every member's word that it lives.
                j.renew_all(unix);
                moved = true;
            }
            j.activity = Some(a);
            if !j.leased() {
                // An open level's members are daemons, which renew nothing: its idle time.
                if unix.saturating_sub(j.active_unix_s) > self.idle_timeout.as_secs() {
                    gone.push((
                        j.key,
                        Some(j.id),
                        format!("idle for {} s", self.idle_timeout.as_secs()),
                    ));
                }
            } else {
                let lapsed = j.lapsed(unix, self.lease.as_secs());
                if !lapsed.is_empty() {
                    let (whose, process) = match &lapsed[..] {
                        [rank] => (format!("rank {rank}'s lease"), "its process is gone"),
                        ranks => (
                            format!("the leases of ranks {ranks:?}"),
                            "their processes are gone",
                        ),
                    };
                    gone.push((
                        j.key,
                        Some(j.id),
                        format!(
                            "{whose} ran out: no renewal for {} s ({process})",
                            self.lease.as_secs()
                        ),
                    ));
                }
            }
        }
        if gone.is_empty() {
            // The idle timers are written now and then, not on every round.
            if moved && self.saved.elapsed() > SAVE_IDLE_EVERY {
                self.save();
            }
            return;
        }
        for (key, id, why) in gone {
            self.remove(dp, &key, id, &why);
        }
        self.save();
    }
}
