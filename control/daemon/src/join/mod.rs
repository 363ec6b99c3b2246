//! Jobs workers join over the network (the protocol: `xagg_join`): nonces, the joins'
//! checks (the job's secret, an admission credential and its slot quota to create a job,
//! the shape every rank must agree on, the hello that names the member's port and
//! addresses), the pending jobs and their timeout, leaving, idle jobs, and the state file
//! that carries all of it across a restart of the daemon.
//!
//! **Levels.** A join carrying `Levels` belongs to a job with levels. At a host, the
//! job's members are the host's ranks (`shape.members` is the host's local size); once
//! they are all in, if the job has more ranks than that, the daemon joins its parent's
//! daemon (`[parent]` in its configuration) as one member standing for them, and adds the
//! job as an inner level when the parent's job runs. At the parent (a join with a shape
//! of 0 members) the level is *open*: members are whoever joins, ordered by the first rank
//! each stands for, and the job runs when their weights add up to the job's ranks. An open
//! level whose daemon has a parent (a leaf switch under a spine) cannot know how many
//! members it will have: unless its first members already stand for every rank, it joins
//! its parent at once, standing for the ranks its members do so far, and says so again
//! whenever a member joins; it runs when its parent's job does (the parent's weights then
//! add up to the job's ranks, so no member can be missing below).
//!
//! The parts: `table` (what the joins need of the dataplane), `registry` (a joined
//! job and its lifecycle), `admission` (nonces, credentials, quotas, room on the
//! switch), `joining` (a join's steps), `upward` (a level's join at its parent),
//! `ring` (the ring's coordinator), `timers` (the join and idle timeouts) and
//! `state_file`.

mod admission;
mod joining;
mod registry;
mod ring;
mod state_file;
mod table;
#[cfg(test)]
mod tests;
mod timers;
mod upward;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddrV4,
    path::PathBuf,
    time::{Duration, Instant},
};

use log::{info, warn};
use xagg_api::JoinListing;
use xagg_join::{JobKey, JoinReply, JoinRequest, MemberReply, MemberRequest, NonceReply, Proof};

pub use self::table::JobTable;
use self::{
    admission::{Credential, Nonces},
    registry::{unix_now, Joined, Lifecycle, Route},
    ring::RingState,
    state_file::Saved,
    upward::{ParentLink, Upstream},
};
use crate::{config::Config, Error, Result};

pub struct Joins {
    jobs: BTreeMap<JobKey, Joined>,
    nonces: Nonces,
    credentials: Vec<Credential>,
    generations: BTreeMap<u16, u16>,
    /// Pending jobs that failed (timed out, or their parent refused them): why, and when.
    expired: HashMap<JobKey, (String, Instant)>,
    state_file: PathBuf,
    /// When the state file was last written.
    saved: Instant,
    join_timeout: Duration,
    idle_timeout: Duration,
    /// How long a rank's membership lasts unrenewed.
    lease: Duration,
    switch: SocketAddrV4,
    /// Its collective ports from `switch`'s on, told with nonces.
    switch_ports: u8,
    /// The switch's MAC, told with nonces (a child addresses its partials to it).
    mac: Option<String>,
    parent: Option<ParentLink>,
    /// The joins at parents as they end.
    upstream: Upstream,
    /// Jobs this daemon coordinates, by key.
    rings: HashMap<JobKey, RingState>,
}

fn refused(reason: impl std::fmt::Display) -> JoinReply {
    JoinReply::Refused {
        reason: reason.to_string(),
    }
}

/// Warns when the state directory lets others in: it is made 0700, but one that was there
/// keeps its mode, and its listing (which jobs, when) is nobody else's business.
fn warn_if_open(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::metadata(dir) else {
        return;
    };
    let mode = m.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        warn!(
            "daemon.state_dir {} is mode {mode:04o}: other users can look into it (the joined jobs' state file itself is 0600); `chmod 0700 {}`",
            dir.display(),
            dir.display()
        );
    }
}

/// The state file read as a start reads it, before anything is attached: how many
/// joined jobs it keeps.
pub fn check_state(cfg: &Config) -> Result<usize> {
    let file = cfg.daemon.state_dir.join("joined.json");
    let saved = Saved::read(&file)?;
    let jobs = saved.jobs().map_err(|e| Error::StateFile {
        file,
        error: Box::new(e),
    })?;
    Ok(jobs.len())
}

impl Joins {
    /// Reads the credentials' keys and the state file, keeping the joined jobs the
    /// dataplane still has (and the pending ones, their timers started again).
    pub fn new(cfg: &Config, switch: SocketAddrV4, dp: &impl JobTable) -> Result<Self> {
        let mut credentials = Vec::new();
        for c in &cfg.credentials {
            credentials.push(Credential {
                name: c.name.clone(),
                key: c.key()?,
                slot_quota: c.slot_quota,
            });
        }
        let state_file = cfg.daemon.state_dir.join("joined.json");
        warn_if_open(&cfg.daemon.state_dir);
        let saved = Saved::read(&state_file)?;
        let present: Vec<u32> = dp.jobs()?.into_iter().map(|(id, _)| id).collect();
        let mut jobs = BTreeMap::new();
        // Jobs gone from the dataplane whose point stood for its ranks at a parent: they
        // leave it once the parent's link is known (below).
        let mut dropped = Vec::new();
        for mut j in saved.jobs().map_err(|e| Error::StateFile {
            file: state_file.clone(),
            error: Box::new(e),
        })? {
            let now = unix_now();
            if j.active_unix_s == 0 {
                j.active_unix_s = now;
            }
            // Its ranks could not renew while the daemon was down: their leases run again
            // from the start (a rank gone meanwhile is found one lease from now).
            j.renew_all(now);
            if j.running() && !present.contains(&j.id) {
                warn!(
                    "joined job {} ({}) is gone from the dataplane: dropped",
                    j.id, j.key
                );
                if let Lifecycle::Running {
                    route: Route::Parent(p),
                } = &j.state
                {
                    dropped.push((j.key, j.secret, p.member));
                }
                continue;
            }
            info!(
                "joined job {} ({}) kept from {}: {}",
                j.id,
                j.key,
                state_file.display(),
                if j.running() { "running" } else { "pending" }
            );
            jobs.insert(j.key, j);
        }
        let mut joins = Self {
            jobs,
            nonces: Nonces::default(),
            credentials,
            generations: saved.generations,
            expired: HashMap::new(),
            state_file,
            saved: Instant::now(),
            join_timeout: Duration::from_secs(cfg.daemon.join_timeout_s),
            idle_timeout: Duration::from_secs(cfg.daemon.idle_timeout_s),
            lease: Duration::from_secs(cfg.daemon.lease_s),
            switch,
            switch_ports: cfg.switch.udp_ports,
            mac: None,
            parent: None,
            upstream: Upstream::default(),
            rings: HashMap::new(),
        };
        if let Some(p) = &cfg.parent {
            let daemon = match (p.daemon, cfg.parent_credential()?) {
                (Some(d), Some(c)) => Some((d, c.name.clone(), c.key()?)),
                _ => None,
            };
            joins.parent = Some(ParentLink {
                interface: p.interface.clone(),
                daemon,
                ring_after: Duration::from_millis(p.ring_after_ms),
            });
        }
        for (key, secret, member) in dropped {
            joins.leave_parent(key, secret, member);
        }
        joins.save();
        Ok(joins)
    }

    /// The switch's MAC, told with each nonce.
    pub fn with_mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = Some(xagg_linux::iface::fmt_mac(&mac));
        self
    }

    /// Writes the state file now (the daemon stops: the idle timers as they are).
    pub fn flush(&mut self) {
        self.save();
    }

    /// Writes the state file, replacing it whole.
    fn save(&mut self) {
        self.saved = Instant::now();
        let saved = Saved::new(self.jobs.values(), self.generations.clone());
        if let Err(e) = saved.write(&self.state_file) {
            warn!(
                "cannot write {}: {e}: joined jobs will not survive a restart",
                self.state_file.display()
            );
        }
    }

    /// A new single-use nonce, and where the switch takes hellos.
    /// A nonce for a join, with where to send hellos and the longest segment
    /// `segment_bytes` this daemon's ports carry.
    pub fn nonce(&mut self, segment_bytes: Option<u32>) -> NonceReply {
        NonceReply {
            nonce: self.nonces.issue(),
            switch: self.switch,
            mac: self.mac.clone(),
            switch_ports: self.switch_ports,
            segment_bytes,
        }
    }

    /// Handles a join; nothing changes unless it is valid.
    pub fn join(&mut self, dp: &mut impl JobTable, req: &JoinRequest) -> JoinReply {
        let existed = self.jobs.contains_key(&req.key);
        let r = self.try_join(dp, req);
        if let JoinReply::Refused { reason } = &r {
            warn!(
                "join of rank {} to job {} refused: {reason}",
                req.rank, req.key
            );
            // A job this join created goes with its refusal (e.g. its hello came from a
            // port that is not the switch's).
            if !existed && self.jobs.remove(&req.key).is_some() {
                self.save();
            }
        }
        r
    }

    /// A member leaving, renewing its lease, or asking for its job's state (`action`:
    /// "leave", "renew", "status").
    pub fn member(
        &mut self,
        dp: &mut impl JobTable,
        action: &str,
        req: &MemberRequest,
    ) -> MemberReply {
        let no = |reason: String| MemberReply::Refused { reason };
        if let Err(e) = self.nonces.spend(&req.nonce) {
            return no(e.to_string());
        }
        let Some(j) = self.jobs.get_mut(&req.key) else {
            return no("no job has this key".into());
        };
        let proven = MemberRequest::action(action, &req.gone);
        if !Proof::member(&j.secret, &proven, &req.nonce, &req.key, req.rank).matches(&req.proof) {
            return no("the proof does not match the job's secret".into());
        }
        let rank = usize::from(req.rank);
        if rank >= j.members.len() {
            return no(format!(
                "rank {rank}: the job has {} members",
                j.members.len()
            ));
        }
        let lease_s = self.lease.as_secs();
        if action == "renew" || action == "status" {
            match &mut j.members[rank] {
                Some(m) if !m.left => m.renewed_unix_s = unix_now(),
                _ if action == "renew" => {
                    return no(format!(
                    "rank {rank} is not a member of job {} (it left, or never joined): join again",
                    j.id
                ))
                }
                _ => {}
            }
        }
        if action == "renew" {
            return MemberReply::Renewed {
                lease_s: lease_s as u32,
            };
        }
        if action == "status" {
            let waiting = if j.running() {
                dp.waiting(j.id)
            } else {
                Vec::new()
            };
            return MemberReply::Status {
                job: j.id,
                ready: j.running(),
                missing: j.missing(),
                waiting,
            };
        }
        match (&j.state, &mut j.members[rank]) {
            (Lifecycle::Running { .. }, Some(m)) => m.left = true,
            (Lifecycle::Running { .. }, None) => {}
            // A pending job forgets the rank: it must join again.
            (Lifecycle::Pending | Lifecycle::JoiningParent { .. }, m) => *m = None,
        }
        info!("job {} ({}): rank {rank} left", j.id, j.key);
        // Ranks it found gone leave with it: a killed rank renews nothing, and its job need
        // not hold its slots for a lease once the others are gone too. (Only a member, with
        // the secret, can say so, of its own job — which it could end anyway.)
        let mut found = Vec::new();
        if j.running() {
            for &g in &req.gone {
                if let Some(Some(m)) = j.members.get_mut(usize::from(g)) {
                    if !m.left {
                        m.left = true;
                        found.push(g);
                    }
                }
            }
        }
        if !found.is_empty() {
            info!(
                "job {} ({}): rank {rank} found the process of ranks {found:?} gone (their responders refuse connections): they are counted as left",
                j.id, j.key
            );
        }
        let (id, key, running) = (j.id, j.key, j.running());
        if j.members.iter().all(|m| m.is_none_or(|m| m.left)) {
            self.remove(dp, &key, running.then_some(id), "every rank left");
        } else if running && j.level.is_open() {
            // A level below (a host standing for its ranks) leaves only once its own job
            // is gone there (its ranks left, or one's lease ran out). Rounds still waiting
            // for it can never complete, and the other levels' ranks, which no responder
            // of the gone rank reaches, would wait for it until their collective timeout:
            // the job goes, and their next status query is refused.
            let stuck: Vec<_> = dp
                .waiting(id)
                .into_iter()
                .filter(|(.., missing)| missing.contains(&req.rank))
                .collect();
            if let Some((_, message, segment, _)) = stuck.first() {
                let why = format!(
                    "member {rank} (a level below, standing for its ranks) left while {} of its rounds waited for it (message {message} segment {segment} the first): none can complete",
                    stuck.len()
                );
                self.remove(dp, &key, Some(id), &why);
            }
        }
        self.save();
        MemberReply::Left
    }

    /// Forgets job `key`, and takes it out of the dataplane if `id` says it is there.
    fn remove(&mut self, dp: &mut impl JobTable, key: &JobKey, id: Option<u32>, why: &str) {
        if let Some(id) = id {
            if let Err(e) = dp.remove_job(id) {
                warn!("removing job {id}: {e}");
            }
        }
        if let Some(j) = self.jobs.remove(key) {
            info!("job {} ({key}) removed: {why}", j.id);
            // This point no longer stands for its ranks at the parent: its place there
            // goes too, or the parent's job would hold its slots until its idle timeout.
            if let Lifecycle::Running {
                route: Route::Parent(p),
            } = &j.state
            {
                self.leave_parent(j.key, j.secret, p.member);
            }
        }
    }

    /// The joined jobs, for listings.
    pub fn listing(&self) -> Vec<JoinListing> {
        let unix = registry::unix_now();
        self.jobs
            .values()
            .map(|j| {
                let (route, parent_member, why) = j.route_listing();
                JoinListing {
                    key: j.key.to_string(),
                    id: j.id,
                    credential: j.credential.clone(),
                    members: j.members.len(),
                    slots: j.shape.slots(),
                    segment_bytes: j.shape.segment_bytes(),
                    ready: j.running(),
                    present: (0..j.members.len() as u8)
                        .filter(|r| !j.missing().contains(r))
                        .collect(),
                    missing: j.missing(),
                    waited_s: if j.running() {
                        0.0
                    } else {
                        j.since.elapsed().as_secs_f64()
                    },
                    route: route.to_string(),
                    parent_member,
                    why,
                    left: j.left(),
                    lease_ends_s: j
                        .leased()
                        .then(|| j.lease_ends(unix, self.lease.as_secs()))
                        .flatten(),
                }
            })
            .collect()
    }
}
