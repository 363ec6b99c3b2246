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
//! A joined job's wire id is a dense index (its low 16 bits, below 256) and a generation
//! (its high 16 bits), counted up each time the index is given again, so a stale id
//! never names a newer job. A job added by hand (`xagg job add --id N`) has index
//! `N mod 65536` and generation `N / 65536`; a joined job never takes an index a job
//! already has.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddrV4,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use log::{info, warn};
use serde::{Deserialize, Serialize};
use xagg_common::job::MemberAddr;
use xagg_join::{
    unseal, CredentialKey, JobKey, JoinReply, JoinRequest, Levels, MemberReply, MemberRequest,
    Nonce, NonceReply, Path, Proof, RingHost, RingReply, RingRequest, Secret, Shape, NONCE_TTL_S,
};

use crate::{
    config::Config,
    dataplane::Dataplane,
    job::{JobSpec, MemberSpec, Neighbour, ParentSpec, RingSpec},
};

/// What the join registry needs of the dataplane: the daemon's [`Dataplane`], or a
/// stand-in (the API's fuzz target).
pub trait JobTable {
    /// Takes the hello recorded under `token`.
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr>;
    /// The switch port with interface index `ifindex`.
    fn port_named(&self, ifindex: u32) -> Option<String>;
    fn free_slots(&self) -> Result<u32, String>;
    /// The jobs' wire ids and first slots.
    fn jobs(&self) -> Result<Vec<(u32, u32)>, String>;
    fn add_job(&mut self, spec: &JobSpec) -> Result<(), String>;
    fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<(), String>;
    fn remove_job(&mut self, id: u32) -> Result<(), String>;
    /// Job `id`'s busy slots waiting for members: (slot, message, segment, missing).
    fn waiting(&self, id: u32) -> Vec<(u32, u32, u32, Vec<u8>)>;
    /// A value that changes whenever a round of job `id` moves on.
    fn activity(&self, id: u32) -> Result<u64, String>;
}

impl JobTable for Dataplane {
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        Dataplane::take_hello(self, token)
    }
    fn port_named(&self, ifindex: u32) -> Option<String> {
        Dataplane::port_named(self, ifindex)
    }
    fn free_slots(&self) -> Result<u32, String> {
        Dataplane::free_slots(self).map_err(|e| e.to_string())
    }
    fn jobs(&self) -> Result<Vec<(u32, u32)>, String> {
        Dataplane::jobs(self)
            .map(|jobs| jobs.into_iter().map(|(id, j)| (id, j.slot_base)).collect())
            .map_err(|e| e.to_string())
    }
    fn add_job(&mut self, spec: &JobSpec) -> Result<(), String> {
        Dataplane::add_job(self, spec)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<(), String> {
        Dataplane::update_member(self, id, member, addr).map_err(|e| e.to_string())
    }
    fn remove_job(&mut self, id: u32) -> Result<(), String> {
        Dataplane::remove_job(self, id).map_err(|e| e.to_string())
    }
    fn waiting(&self, id: u32) -> Vec<(u32, u32, u32, Vec<u8>)> {
        Dataplane::job_status(self, id)
            .map(|s| {
                s.into_iter()
                    .filter(|s| !s.missing.is_empty())
                    .map(|s| (s.slot, s.message, s.segment, s.missing))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn activity(&self, id: u32) -> Result<u64, String> {
        Dataplane::activity(self, id).map_err(|e| e.to_string())
    }
}

/// Indices a joined job may take (the dataplane holds at most this many jobs).
const MAX_INDEX: u16 = 256;
/// Nonces handed out and not yet spent, at most: a client asking for more pushes the
/// oldest out.
const MAX_NONCES: usize = 4096;
/// How often the idle timers of busy jobs are written to the state file at most.
const SAVE_IDLE_EVERY: Duration = Duration::from_secs(30);
/// How long the reason a pending job expired is kept for the joins still polling it.
const EXPIRED_KEPT: Duration = Duration::from_secs(600);

/// A member of a joined job as its hello showed it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Member {
    addr: Addr,
    /// The hello token it was learned from (a join retried with the same token reuses it).
    hello: u64,
    left: bool,
}

/// [`MemberAddr`] in the state file.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Addr {
    ifindex: u32,
    ip: [u8; 4],
    mac: [u8; 6],
    port: [u8; 2],
}

impl From<MemberAddr> for Addr {
    fn from(a: MemberAddr) -> Self {
        Self {
            ifindex: a.ifindex,
            ip: a.ip,
            mac: a.mac,
            port: a.port,
        }
    }
}

impl From<Addr> for MemberAddr {
    fn from(a: Addr) -> Self {
        Self {
            ifindex: a.ifindex,
            ip: a.ip,
            mac: a.mac,
            port: a.port,
        }
    }
}

/// A job created by a join.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Joined {
    key: JobKey,
    /// Hex, only ever in the state file (mode 0600).
    secret: String,
    credential: String,
    shape: Shape,
    id: u32,
    members: Vec<Option<Member>>,
    /// Whether the dataplane has it (every rank joined).
    ready: bool,
    /// Seconds since the Unix epoch when it was created.
    created_unix_s: u64,
    /// Seconds since the Unix epoch of its last progress (a round moving on): its idle
    /// timer, kept across a restart of the daemon.
    #[serde(default)]
    active_unix_s: u64,
    #[serde(skip, default = "Instant::now")]
    since: Instant,
    /// The job's slots as last seen (`Dataplane::activity`).
    #[serde(skip)]
    activity: Option<u64>,
    /// With levels: the job's ranks in all.
    #[serde(default)]
    ranks: Option<u32>,
    /// With levels, per member: the first rank it stands for and how many.
    #[serde(default)]
    stands_for: Vec<Option<(u32, u32)>>,
    /// An open level (a parent's): members are whoever joins, complete when their weights
    /// add up to `ranks`.
    #[serde(default)]
    open: bool,
    /// Where this level's partials go, once its parent's job runs.
    #[serde(default)]
    parent: Option<ParentSpec>,
    /// Or this host's place in a ring of the job's hosts.
    #[serde(default)]
    ring: Option<RingSpec>,
    /// Which way the job runs (with levels).
    #[serde(default)]
    path: Option<Path>,
    /// The daemon that places the job's hosts in a ring (its ranks named it).
    #[serde(default)]
    coordinator: Option<SocketAddrV4>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Joined {
    fn secret(&self) -> Secret {
        self.secret.parse().expect("written from a Secret")
    }

    fn missing(&self) -> Vec<u8> {
        (0..self.members.len() as u8)
            .filter(|&r| self.members[usize::from(r)].is_none_or(|m| m.left))
            .collect()
    }

    /// Ranks the members present stand for (with levels).
    fn weight_in(&self) -> u32 {
        self.stand().weight
    }

    /// Whether every member is in: every rank of this level, or (open) members standing
    /// for all the job's ranks.
    fn complete(&self) -> bool {
        if self.open {
            self.ranks.is_some_and(|n| self.weight_in() == n)
        } else {
            self.missing().is_empty()
        }
    }

    /// Whether this level's members stand for fewer ranks than the job has: it needs its
    /// parent.
    fn needs_parent(&self) -> bool {
        !self.open && self.ranks.is_some_and(|n| n as usize > self.members.len())
    }

    /// What this level stands for at its parent: the lowest first rank and the weights of
    /// its members present.
    fn stand(&self) -> Levels {
        let present = || {
            self.members
                .iter()
                .zip(&self.stands_for)
                .filter(|(m, _)| m.is_some_and(|m| !m.left))
                .filter_map(|(_, s)| *s)
        };
        Levels {
            ranks: self.ranks.unwrap_or(0),
            first: present().map(|s| s.0).min().unwrap_or(0),
            weight: present().map(|s| s.1).sum(),
            coordinator: None,
        }
    }

    /// An open level's members in the order of the ranks they stand for: their indices.
    fn order_by_first(&mut self) {
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        order.sort_by_key(|&i| self.stands_for[i].map_or(u32::MAX, |s| s.0));
        self.members = order.iter().map(|&i| self.members[i]).collect();
        self.stands_for = order.iter().map(|&i| self.stands_for[i]).collect();
    }

    /// What a pending job waits for, beyond the ranks `missing` names (`up`: an open level
    /// joining its parent).
    fn waiting(&self, up: bool) -> Option<String> {
        if up {
            Some("this level's parent (its job there gathers the job's other ranks)".into())
        } else if self.open {
            let n = self.ranks.unwrap_or(0);
            Some(format!(
                "members standing for {} more of the job's {n} ranks",
                n - self.weight_in()
            ))
        } else if self.needs_parent() && self.missing().is_empty() {
            Some("this level's parent (its job there gathers the other hosts)".into())
        } else {
            None
        }
    }
}

/// The uplink a daemon joins its jobs' levels through (`[parent]`): the parent's daemon
/// and a credential there, unless no aggregating switch is above.
#[derive(Clone)]
struct ParentLink {
    interface: String,
    daemon: Option<(std::net::SocketAddr, String, CredentialKey)>,
    ring_after: Duration,
}

/// Where a level's job goes: its parent's job, or a ring of the job's hosts.
enum Route {
    Parent(ParentSpec),
    Ring(RingSpec, String),
}

/// A job's join at its parent, made on a thread of its own: running (with what the level
/// stands for, which an open level's new members change), or its outcome.
enum Upstream {
    Joining(Arc<Mutex<Levels>>),
    Done(Result<Route, String>),
}

/// A coordinator's view of a job's hosts: where each is, and why the tree failed (once
/// one host says so, the job goes round the ring).
#[derive(Default)]
struct RingState {
    hosts: Vec<RingHost>,
    failed: Option<String>,
}

/// A joined job as `xagg job status` and `GET /v1/joins` show it (no secret).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JoinListing {
    pub key: String,
    pub id: u32,
    pub credential: String,
    pub members: usize,
    pub slots: usize,
    pub segment_bytes: usize,
    pub ready: bool,
    /// Ranks in (joined and not left), and ranks the job waits for.
    pub present: Vec<u8>,
    pub missing: Vec<u8>,
    pub waited_s: f64,
}

/// What the state file holds.
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    jobs: Vec<Joined>,
    generations: BTreeMap<u16, u16>,
}

pub struct Joins {
    jobs: BTreeMap<JobKey, Joined>,
    nonces: HashMap<Nonce, Instant>,
    credentials: Vec<(String, CredentialKey, u32)>,
    generations: BTreeMap<u16, u16>,
    /// Pending jobs that failed (timed out, or their parent refused them): why, and when.
    expired: HashMap<JobKey, (String, Instant)>,
    state_file: PathBuf,
    /// When the state file was last written.
    saved: Instant,
    join_timeout: Duration,
    idle_timeout: Duration,
    switch: SocketAddrV4,
    /// The switch's MAC, told with nonces (a child addresses its partials to it).
    mac: Option<String>,
    parent: Option<ParentLink>,
    /// Joins at the parent under way or done, by job key.
    upstream: Arc<Mutex<HashMap<JobKey, Upstream>>>,
    /// Jobs this daemon coordinates, by key.
    rings: HashMap<JobKey, RingState>,
}

fn refused(reason: impl Into<String>) -> JoinReply {
    JoinReply::Refused {
        reason: reason.into(),
    }
}

impl Joins {
    /// Reads the credentials' keys and the state file, keeping the joined jobs the
    /// dataplane still has (and the pending ones, their timers started again).
    pub fn new(cfg: &Config, switch: SocketAddrV4, dp: &impl JobTable) -> Result<Self, String> {
        let mut credentials = Vec::new();
        for c in &cfg.credentials {
            credentials.push((c.name.clone(), c.key()?, c.slot_quota));
        }
        let state_file = cfg.daemon.state_dir.join("joined.json");
        let saved: Saved = match std::fs::read_to_string(&state_file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{}: {e}: move it away to start without the joined jobs it holds",
                    state_file.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved::default(),
            Err(e) => return Err(format!("reading {}: {e}", state_file.display())),
        };
        let present: Vec<u32> = dp.jobs()?.into_iter().map(|(id, _)| id).collect();
        let mut jobs = BTreeMap::new();
        for mut j in saved.jobs {
            if j.active_unix_s == 0 {
                j.active_unix_s = unix_now();
            }
            if j.ready && !present.contains(&j.id) {
                warn!(
                    "joined job {} ({}) is gone from the dataplane: dropped",
                    j.id, j.key
                );
                continue;
            }
            info!(
                "joined job {} ({}) kept from {}: {}",
                j.id,
                j.key,
                state_file.display(),
                if j.ready { "running" } else { "pending" }
            );
            jobs.insert(j.key, j);
        }
        let mut joins = Self {
            jobs,
            nonces: HashMap::new(),
            credentials,
            generations: saved.generations,
            expired: HashMap::new(),
            state_file,
            saved: Instant::now(),
            join_timeout: Duration::from_secs(cfg.daemon.join_timeout_s),
            idle_timeout: Duration::from_secs(cfg.daemon.idle_timeout_s),
            switch,
            mac: None,
            parent: None,
            upstream: Arc::default(),
            rings: HashMap::new(),
        };
        if let Some(p) = &cfg.parent {
            let daemon = match (p.daemon, &p.credential, &p.key_file) {
                (None, _, _) => None,
                (Some(d), Some(name), Some(key_file)) => {
                    let key = crate::config::CredentialSection {
                        name: name.clone(),
                        key_file: key_file.clone(),
                        slot_quota: 0,
                    }
                    .key()?;
                    Some((d, name.clone(), key))
                }
                (Some(d), _, _) => {
                    return Err(format!(
                        "[parent] daemon = {d} needs credential and key_file: the admission credential this daemon creates jobs with there"
                    ))
                }
            };
            joins.parent = Some(ParentLink {
                interface: p.interface.clone(),
                daemon,
                ring_after: Duration::from_millis(p.ring_after_ms),
            });
        }
        joins.save();
        Ok(joins)
    }

    /// The switch's MAC, told with each nonce.
    pub fn with_mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = Some(xagg_sys::iface::fmt_mac(&mac));
        self
    }

    /// Writes the state file now (the daemon stops: the idle timers as they are).
    pub fn flush(&mut self) {
        self.save();
    }

    /// Writes the state file (0600 in a 0700 directory), replacing it whole.
    fn save(&mut self) {
        self.saved = Instant::now();
        let saved = Saved {
            jobs: self.jobs.values().cloned().collect(),
            generations: self.generations.clone(),
        };
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            let dir = self.state_file.parent().expect("a file in a directory");
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            let tmp = self.state_file.with_extension("json.new");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            std::io::Write::write_all(&mut f, serde_json::to_string(&saved)?.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.state_file)
        };
        if let Err(e) = write() {
            warn!(
                "cannot write {}: {e}: joined jobs will not survive a restart",
                self.state_file.display()
            );
        }
    }

    /// A new single-use nonce, and where the switch takes hellos.
    pub fn nonce(&mut self) -> NonceReply {
        let now = Instant::now();
        let ttl = Duration::from_secs(NONCE_TTL_S);
        self.nonces.retain(|_, t| now.duration_since(*t) < ttl);
        if self.nonces.len() >= MAX_NONCES {
            if let Some(oldest) = self.nonces.iter().min_by_key(|(_, t)| **t).map(|(n, _)| *n) {
                self.nonces.remove(&oldest);
            }
        }
        let nonce = Nonce::random();
        self.nonces.insert(nonce, now);
        NonceReply {
            nonce,
            switch: self.switch,
            mac: self.mac.clone(),
        }
    }

    fn spend(&mut self, nonce: &Nonce) -> Result<(), String> {
        match self.nonces.remove(nonce) {
            Some(t) if t.elapsed() < Duration::from_secs(NONCE_TTL_S) => Ok(()),
            _ => Err(
                "unknown, spent or expired nonce: get a fresh one (GET /v1/nonce) for each request"
                    .into(),
            ),
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

    fn try_join(&mut self, dp: &mut impl JobTable, req: &JoinRequest) -> JoinReply {
        // A level of the job gathered by its children: its members are counted by weight.
        let open = req.levels.is_some() && req.shape.members == 0;
        let checked = Shape {
            members: req.shape.members.max(usize::from(open)),
            ..req.shape
        };
        if let Err(e) = checked.job_shape() {
            return refused(format!("the job's shape: {e}"));
        }
        if let Some(l) = req.levels {
            if l.weight == 0
                || l.ranks < l.weight
                || (!open && (l.ranks as usize) < req.shape.members)
            {
                return refused(format!(
                    "levels: {} ranks in all, this member standing for {} from rank {}, {} members here: a member stands for 1 or more of the job's ranks, and the job has at least its members",
                    l.ranks, l.weight, l.first, req.shape.members
                ));
            }
        }
        if !req.shape.segment_bytes.is_multiple_of(4) {
            return refused(format!(
                "the job's shape: segment_bytes = {} is not a multiple of 4",
                req.shape.segment_bytes
            ));
        }
        if !open && usize::from(req.rank) >= req.shape.members {
            return refused(format!(
                "rank {} of a job of {} members: ranks are 0..{}",
                req.rank, req.shape.members, req.shape.members
            ));
        }
        if let Err(e) = self.spend(&req.nonce) {
            return refused(e);
        }
        if !self.jobs.contains_key(&req.key) {
            if let Some((why, _)) = self.expired.get(&req.key) {
                return refused(format!(
                    "the job {why} and was removed (its slots are free): start all ranks again, with a new key"
                ));
            }
            if let Err(e) = self.create(dp, req) {
                return refused(e);
            }
        }
        let j = self.jobs.get(&req.key).expect("exists or created");
        if !Proof::join(&j.secret(), req).matches(&req.proof) {
            return refused("the join's proof does not match the job's secret");
        }
        if j.shape != req.shape || j.ranks != req.levels.map(|l| l.ranks) {
            return refused(format!(
                "the job has {} members, {} slots, {}-byte segments and {:?} ranks in all; this join says {}, {}, {} and {:?}: every rank must give the same shape",
                j.shape.members,
                j.shape.slots,
                j.shape.segment_bytes,
                j.ranks,
                req.shape.members,
                req.shape.slots,
                req.shape.segment_bytes,
                req.levels.map(|l| l.ranks)
            ));
        }
        // An open level's member is found by the first rank it stands for, or by its
        // hellos' token (a level below that says again what it stands for).
        let rank = match req.levels.filter(|_| j.open) {
            Some(l) => match j
                .stands_for
                .iter()
                .position(|s| s.is_some_and(|s| s.0 == l.first))
                .or_else(|| {
                    j.members
                        .iter()
                        .position(|m| m.is_some_and(|m| m.hello == req.hello && !m.left))
                }) {
                Some(i) if j.ready && j.stands_for[i] != Some((l.first, l.weight)) => {
                    return refused(format!(
                        "the job runs with this member standing for {:?} (first rank, ranks), not {:?}",
                        j.stands_for[i],
                        (l.first, l.weight)
                    ))
                }
                Some(i) => i,
                None if j.ready => {
                    return refused(format!(
                        "the job runs without a member standing for rank {}",
                        l.first
                    ))
                }
                None => {
                    let j = self.jobs.get_mut(&req.key).expect("exists");
                    j.members.push(None);
                    j.stands_for.push(None);
                    j.members.len() - 1
                }
            },
            None => usize::from(req.rank),
        };
        let j = self.jobs.get(&req.key).expect("exists");
        // The member's port and addresses, from its hello (or the one it already gave).
        let known = j.members[rank].filter(|m| m.hello == req.hello);
        let addr: MemberAddr = match known {
            Some(m) => m.addr.into(),
            None => match dp.take_hello(req.hello) {
                Some(a) => a,
                None => return JoinReply::NoHello,
            },
        };
        let Some(port) = dp.port_named(addr.ifindex) else {
            return refused(format!(
                "the hello came in on interface index {}, which is not a port of this switch",
                addr.ifindex
            ));
        };
        if let Some(other) = j.members.iter().enumerate().position(|(r, m)| {
            r != rank && m.is_some_and(|m| !m.left && m.addr.ifindex == addr.ifindex)
        }) {
            return refused(format!(
                "rank {other} of this job is already behind port {port}: one member per switch port (several ranks behind one port need host-level aggregation)"
            ));
        }
        let gone_up = self.going_up(&req.key);
        let has_parent = self.parent.as_ref().is_some_and(|p| p.daemon.is_some());
        let j = self.jobs.get_mut(&req.key).expect("exists");
        // The dataplane first: a refusal changes nothing.
        if j.ready {
            if let Err(e) = dp.update_member(j.id, rank, addr) {
                return refused(e);
            }
        }
        j.members[rank] = Some(Member {
            addr: addr.into(),
            hello: req.hello,
            left: false,
        });
        if let Some(l) = req.levels {
            if j.coordinator.is_none() {
                j.coordinator = l.coordinator;
            }
            if j.stands_for.len() < j.members.len() {
                j.stands_for.resize(j.members.len(), None);
            }
            j.stands_for[rank] = Some((l.first, l.weight));
            if j.open && j.weight_in() > l.ranks {
                j.members[rank] = None;
                j.stands_for[rank] = None;
                return refused(format!(
                    "members here already stand for {} of the job's {} ranks: this one's {} would be too many",
                    j.weight_in(),
                    l.ranks,
                    l.weight
                ));
            }
        }
        // An open level below a parent goes up unless its first members stand for every
        // rank (or it has gone up already).
        let up = !j.ready && j.open && has_parent && (!j.complete() || gone_up);
        let reply = if j.ready {
            info!(
                "job {} ({}): rank {rank} joined again, behind {port}",
                j.id, j.key
            );
            ready(j, rank as u8, dp)
        } else if up || (j.complete() && j.needs_parent()) {
            let waiting = j.waiting(up);
            let since = j.since;
            self.join_parent(req.key);
            JoinReply::Pending {
                missing: Vec::new(),
                waited_s: since.elapsed().as_secs_f64(),
                waiting,
            }
        } else if j.complete() {
            if j.open {
                j.order_by_first();
            }
            let rank = match req.levels.filter(|_| j.open) {
                Some(l) => j
                    .stands_for
                    .iter()
                    .position(|s| s.is_some_and(|s| s.0 == l.first))
                    .unwrap_or(rank),
                None => rank,
            };
            let j = j.clone();
            match activate(dp, &j) {
                Ok(()) => {
                    let jm = self.jobs.get_mut(&req.key).expect("exists");
                    jm.ready = true;
                    jm.activity = None;
                    jm.active_unix_s = unix_now();
                    info!(
                        "job {} ({}): all {} members in, running",
                        jm.id,
                        jm.key,
                        jm.members.len()
                    );
                    ready(jm, rank as u8, dp)
                }
                Err(e) => {
                    self.jobs.remove(&req.key);
                    self.save();
                    return refused(format!("the switch cannot take the job: {e}"));
                }
            }
        } else {
            info!("job {} ({}): rank {rank} in, behind {port}", j.id, j.key);
            JoinReply::Pending {
                missing: j.missing(),
                waited_s: j.since.elapsed().as_secs_f64(),
                waiting: j.waiting(up),
            }
        };
        self.save();
        reply
    }

    /// Creates the job a join names, if it may: its admission proves a credential, whose
    /// quota and the switch's free slots and job indices must have room.
    fn create(&mut self, dp: &impl JobTable, req: &JoinRequest) -> Result<(), String> {
        let Some(a) = &req.admission else {
            return Err("no job has this key, and the join carries no admission to create one (the first rank to join needs the admission credential)".into());
        };
        let Some((name, cred, quota)) = self.credentials.iter().find(|c| c.0 == a.credential)
        else {
            return Err(format!("unknown credential `{}`", a.credential));
        };
        if !Proof::admission(cred, &req.nonce, &req.key, &req.shape).matches(&a.proof) {
            return Err(format!(
                "the admission proof does not match credential `{name}`"
            ));
        }
        let secret = unseal(&a.secret, cred, &req.nonce, &req.key);
        if !Proof::join(&secret, req).matches(&req.proof) {
            return Err("the join's proof does not match the secret it carries".into());
        }
        let used: usize = self
            .jobs
            .values()
            .filter(|j| j.credential == *name)
            .map(|j| j.shape.slots)
            .sum();
        if used + req.shape.slots > *quota as usize {
            return Err(format!(
                "credential `{name}` holds {used} of its {quota} slots; this job needs {}",
                req.shape.slots
            ));
        }
        let free = dp.free_slots()? as usize;
        let reserved: usize = self
            .jobs
            .values()
            .filter(|j| !j.ready)
            .map(|j| j.shape.slots)
            .sum();
        if free < reserved + req.shape.slots {
            return Err(format!(
                "the switch is full: {} slots free (after the jobs still gathering their ranks), this job needs {}",
                free.saturating_sub(reserved),
                req.shape.slots
            ));
        }
        let taken: Vec<u16> = dp
            .jobs()?
            .iter()
            .map(|(id, _)| *id as u16)
            .chain(self.jobs.values().map(|j| j.id as u16))
            .collect();
        let Some(index) = (1..MAX_INDEX).find(|i| !taken.contains(i)) else {
            return Err(format!(
                "the switch is full: all {MAX_INDEX} job indices are taken"
            ));
        };
        let generation = self.generations.entry(index).or_insert(0);
        *generation = generation.wrapping_add(1);
        let id = (u32::from(*generation) << 16) | u32::from(index);
        let joined = Joined {
            key: req.key,
            secret: hex_secret(&secret),
            credential: name.clone(),
            shape: req.shape,
            id,
            members: vec![None; req.shape.members],
            stands_for: vec![None; req.shape.members],
            ranks: req.levels.map(|l| l.ranks),
            open: req.levels.is_some() && req.shape.members == 0,
            parent: None,
            ring: None,
            path: None,
            coordinator: None,
            ready: false,
            created_unix_s: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            since: Instant::now(),
            activity: None,
            active_unix_s: 0,
        };
        info!(
            "job {id} ({}) created by credential `{name}`: {} members, {} slots, {}-byte segments",
            req.key, req.shape.members, req.shape.slots, req.shape.segment_bytes
        );
        self.expired.remove(&req.key);
        self.jobs.insert(req.key, joined);
        Ok(())
    }

    /// A member leaving, or asking for its job's state (`action`: "leave", "status").
    pub fn member(
        &mut self,
        dp: &mut impl JobTable,
        action: &str,
        req: &MemberRequest,
    ) -> MemberReply {
        let no = |reason: String| MemberReply::Refused { reason };
        if let Err(e) = self.spend(&req.nonce) {
            return no(e);
        }
        let Some(j) = self.jobs.get_mut(&req.key) else {
            return no("no job has this key".into());
        };
        if !Proof::member(&j.secret(), action, &req.nonce, &req.key, req.rank).matches(&req.proof) {
            return no("the proof does not match the job's secret".into());
        }
        let rank = usize::from(req.rank);
        if rank >= j.shape.members {
            return no(format!(
                "rank {rank}: the job has {} members",
                j.shape.members
            ));
        }
        if action == "status" {
            let waiting = if j.ready {
                dp.waiting(j.id)
            } else {
                Vec::new()
            };
            return MemberReply::Status {
                job: j.id,
                ready: j.ready,
                missing: j.missing(),
                waiting,
            };
        }
        if j.ready {
            if let Some(m) = &mut j.members[rank] {
                m.left = true;
            }
        } else {
            // A pending job forgets the rank: it must join again.
            j.members[rank] = None;
        }
        info!("job {} ({}): rank {rank} left", j.id, j.key);
        if j.members.iter().all(|m| m.is_none_or(|m| m.left)) {
            let (id, key, ready) = (j.id, j.key, j.ready);
            self.remove(dp, &key, ready.then_some(id), "every rank left");
        }
        self.save();
        MemberReply::Left
    }

    fn remove(&mut self, dp: &mut impl JobTable, key: &JobKey, id: Option<u32>, why: &str) {
        if let Some(id) = id {
            if let Err(e) = dp.remove_job(id) {
                warn!("removing job {id}: {e}");
            }
        }
        if let Some(j) = self.jobs.remove(key) {
            info!("job {} ({key}) removed: {why}", j.id);
        }
    }

    /// Whether job `key`'s level has joined its parent (or tried to).
    fn going_up(&self, key: &JobKey) -> bool {
        self.upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// Joins the parent's daemon for job `key`, whose ranks here are all in, on a thread
    /// of its own (once) — or, if the parent cannot take it and the ranks named a
    /// coordinator, the ring the coordinator places the hosts in; [`Joins::tick`] adds the
    /// job when either is settled.
    fn join_parent(&mut self, key: JobKey) {
        let mut up = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
        let Some(j) = self.jobs.get(&key) else { return };
        match up.get(&key) {
            // An open level's new member: the join under way says so from its next round.
            Some(Upstream::Joining(stand)) => {
                *stand.lock().unwrap_or_else(|e| e.into_inner()) = j.stand();
                return;
            }
            Some(Upstream::Done(_)) => return,
            None => {}
        }
        let Some(link) = self.parent.clone() else {
            up.insert(
                key,
                Upstream::Done(Err(format!(
                    "has {} ranks but this daemon has {} of them and no [parent] to join for the rest",
                    j.ranks.unwrap_or(0),
                    j.members.len()
                ))),
            );
            return;
        };
        let levels = j.stand();
        let stand = Arc::new(Mutex::new(levels));
        let up_job = Upward {
            link,
            id: j.id,
            local: self.switch,
            mac: self.mac.clone().unwrap_or_default(),
            key,
            secret: j.secret(),
            shape: Shape {
                members: 0,
                ..j.shape
            },
            stand: stand.clone(),
            coordinator: j.coordinator,
            timeout: self.join_timeout,
        };
        info!(
            "job {} ({key}): {} of its ranks are in here; joining {}",
            j.id,
            levels.weight,
            match &up_job.link.daemon {
                Some((d, ..)) => format!("the parent at {d}"),
                None => "a ring of hosts (no parent configured)".into(),
            }
        );
        up.insert(key, Upstream::Joining(stand));
        let upstream = self.upstream.clone();
        std::thread::spawn(move || {
            let r = up_job.run();
            upstream
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, Upstream::Done(r));
        });
    }

    /// A host's word to this daemon as its job's coordinator: where the host is, and
    /// whether its parent failed it. Once a host's tree failed and every host is known,
    /// each is placed in a ring, in the order of the ranks they stand for.
    pub fn ring(&mut self, req: &RingRequest) -> RingReply {
        let no = |reason: String| RingReply::Refused { reason };
        if let Err(e) = self.spend(&req.nonce) {
            return no(e);
        }
        let Some(j) = self.jobs.get(&req.key) else {
            return RingReply::Pending {
                why: "the coordinator has not seen the job yet (its own ranks are still joining)"
                    .into(),
            };
        };
        if !Proof::ring(&j.secret(), req).matches(&req.proof) {
            return no("the proof does not match the job's secret".into());
        }
        let Some(ranks) = j.ranks else {
            return no("the job has no levels here".into());
        };
        let st = self.rings.entry(req.key).or_default();
        match st.hosts.iter_mut().find(|h| h.first == req.host.first) {
            Some(h) => *h = req.host.clone(),
            None => st.hosts.push(req.host.clone()),
        }
        if st.failed.is_none() {
            st.failed = req.failed.clone();
        }
        let Some(why) = st.failed.clone() else {
            return RingReply::Tree;
        };
        let weight: u32 = st.hosts.iter().map(|h| h.weight).sum();
        if weight < ranks {
            return RingReply::Pending {
                why: format!(
                    "the ring waits for hosts standing for {} more of {ranks} ranks",
                    ranks - weight
                ),
            };
        }
        st.hosts.sort_by_key(|h| h.first);
        let h = st.hosts.len();
        let at = st
            .hosts
            .iter()
            .position(|x| x.first == req.host.first)
            .expect("registered above");
        let successor = st.hosts[(at + 1) % h].clone();
        RingReply::Ring {
            size: h as u8,
            position: at as u8,
            predecessor: st.hosts[(at + h - 1) % h].clone(),
            // This host's partials arrive there after the successor's own ranks.
            member: successor.weight as u8,
            successor,
            why,
        }
    }

    /// Adds the jobs whose parents took them, and drops those refused there.
    fn settle_upstream(&mut self, dp: &mut impl JobTable) {
        let done: Vec<(JobKey, Result<Route, String>)> = {
            let mut up = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<JobKey> = up
                .iter()
                .filter(|(_, u)| matches!(u, Upstream::Done(_)))
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| match up.remove(&k) {
                    Some(Upstream::Done(r)) => Some((k, r)),
                    _ => None,
                })
                .collect()
        };
        for (key, r) in done {
            let Some(j) = self.jobs.get_mut(&key) else {
                continue;
            };
            if j.open {
                j.order_by_first();
            }
            let r = r.and_then(|route| {
                match route {
                    Route::Parent(p) => {
                        j.parent = Some(p);
                        j.path = Some(Path::Tree);
                    }
                    Route::Ring(ring, why) => {
                        j.ring = Some(ring);
                        j.path = Some(Path::Ring { why });
                    }
                }
                activate(dp, j)
            });
            match r {
                Ok(()) => {
                    j.ready = true;
                    j.activity = None;
                    j.active_unix_s = unix_now();
                    match (&j.parent, &j.ring) {
                        (Some(p), _) => info!(
                            "job {} ({key}): running, member {} of job {} at the parent",
                            j.id, p.member, p.job
                        ),
                        (None, Some(r)) => info!(
                            "job {} ({key}): running round a ring of {} hosts, at place {} ({:?})",
                            j.id, r.size, r.position, j.path
                        ),
                        (None, None) => {}
                    }
                }
                Err(e) => {
                    warn!("job {} ({key}) cannot run: {e}", j.id);
                    self.expired
                        .insert(key, (format!("failed at its parent: {e}"), Instant::now()));
                    self.remove(dp, &key, None, "its parent did not take it");
                }
            }
            self.save();
        }
    }

    /// Once a second: pending jobs past the join timeout fail, idle jobs and jobs removed
    /// by hand go, jobs whose parents took them run.
    pub fn tick(&mut self, dp: &mut impl JobTable) {
        self.settle_upstream(dp);
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
            if !j.ready {
                if now.duration_since(j.since) > self.join_timeout {
                    let missing = j.missing();
                    gone.push((
                        j.key,
                        None,
                        format!("timed out waiting for ranks {missing:?}"),
                    ));
                    self.expired.insert(
                        j.key,
                        (
                            format!(
                                "timed out after {} s waiting for ranks {missing:?}",
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
                moved = true;
            }
            j.activity = Some(a);
            if unix.saturating_sub(j.active_unix_s) > self.idle_timeout.as_secs() {
                gone.push((
                    j.key,
                    Some(j.id),
                    format!("idle for {} s", self.idle_timeout.as_secs()),
                ));
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

    /// The joined jobs, for listings.
    pub fn listing(&self) -> Vec<JoinListing> {
        self.jobs
            .values()
            .map(|j| JoinListing {
                key: j.key.to_string(),
                id: j.id,
                credential: j.credential.clone(),
                members: j.shape.members,
                slots: j.shape.slots,
                segment_bytes: j.shape.segment_bytes,
                ready: j.ready,
                present: (0..j.shape.members as u8)
                    .filter(|r| !j.missing().contains(r))
                    .collect(),
                missing: j.missing(),
                waited_s: if j.ready {
                    0.0
                } else {
                    j.since.elapsed().as_secs_f64()
                },
            })
            .collect()
    }
}

/// A level's way up, tried on a thread of its own.
struct Upward {
    link: ParentLink,
    /// The job's wire id here.
    id: u32,
    /// This point's collective address and MAC.
    local: SocketAddrV4,
    mac: String,
    key: JobKey,
    secret: Secret,
    shape: Shape,
    /// What the level stands for, as of now.
    stand: Arc<Mutex<Levels>>,
    coordinator: Option<SocketAddrV4>,
    timeout: Duration,
}

impl Upward {
    /// Joins the parent's daemon: hellos from this point's collective address (they leave
    /// through the uplink, so the parent records the port it is behind), then joins until
    /// the parent's job runs. Meanwhile, with a coordinator, tells it where this host is
    /// and whether the parent failed it (refused the job, or no answer for `ring_after`,
    /// or none configured); when the coordinator says ring, the ring it is.
    fn run(&self) -> Result<Route, String> {
        let sock = hello_socket(self.local)?;
        let hello = xagg_join::client::Hello::new()?;
        let coordinator = self
            .coordinator
            .map(|c| xagg_join::client::Client::new(c.into()));
        let parent = self
            .link
            .daemon
            .as_ref()
            .map(|(d, name, cred)| (xagg_join::client::Client::new(*d), name, cred));
        let mut failed = match (&parent, &coordinator) {
            (None, Some(_)) => {
                Some("no aggregating switch is configured above the hosts".to_string())
            }
            (None, None) => {
                return Err("no [parent] daemon to join, and no coordinator for a ring".into())
            }
            _ => None,
        };
        let start = Instant::now();
        let mut unanswered: Option<Instant> = None;
        loop {
            let levels = *self.stand.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some((client, name, cred)), None) = (&parent, &failed) {
                let request = |nonce, token| {
                    JoinRequest::new(
                        self.key,
                        &self.secret,
                        self.shape,
                        0,
                        token,
                        nonce,
                        Some((name.as_str(), cred)),
                        Some(levels),
                    )
                };
                match client.join_once(&sock, &hello, request) {
                    Ok((JoinReply::Ready { job, member, .. }, at)) => {
                        let mac = at
                            .mac
                            .ok_or("the parent's daemon does not tell its MAC (an older xaggd)")?;
                        return Ok(Route::Parent(ParentSpec {
                            interface: self.link.interface.clone(),
                            mac,
                            addr: at.switch,
                            job,
                            member,
                        }));
                    }
                    Ok((JoinReply::Refused { reason }, _)) => {
                        if coordinator.is_none() {
                            return Err(format!("the parent refused it: {reason}"));
                        }
                        failed = Some(format!("the parent refused the job: {reason}"));
                    }
                    Ok(_) => unanswered = None,
                    Err(e) => {
                        let since = *unanswered.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.link.ring_after {
                            let why = format!(
                                "the parent did not answer for {:?}: {e}",
                                self.link.ring_after
                            );
                            if coordinator.is_none() {
                                return Err(why);
                            }
                            failed = Some(why);
                        }
                    }
                }
            }
            if let Some(c) = &coordinator {
                let host = RingHost {
                    addr: self.local,
                    mac: self.mac.clone(),
                    first: levels.first,
                    weight: levels.weight,
                    job: self.id,
                };
                let reply = c.nonce().and_then(|n| {
                    let req =
                        RingRequest::new(self.key, &self.secret, n.nonce, host, failed.clone());
                    c.post::<RingReply>("/v1/ring", &req)
                });
                match reply {
                    Ok(RingReply::Ring {
                        size,
                        position,
                        predecessor,
                        successor,
                        member,
                        why,
                    }) => {
                        let neighbour = |h: RingHost, member: u8| Neighbour {
                            mac: h.mac,
                            addr: h.addr,
                            member,
                            job: Some(h.job),
                        };
                        return Ok(Route::Ring(
                            RingSpec {
                                interface: self.link.interface.clone(),
                                size,
                                position,
                                predecessor: neighbour(predecessor, 0),
                                successor: neighbour(successor, member),
                            },
                            why,
                        ));
                    }
                    Ok(RingReply::Refused { reason }) => {
                        return Err(format!("the coordinator refused the ring: {reason}"))
                    }
                    Ok(RingReply::Tree | RingReply::Pending { .. }) => {}
                    Err(e) => warn!("job {}: the coordinator: {e}", self.key),
                }
            }
            if start.elapsed() > self.timeout {
                return Err(match failed {
                    Some(why) => format!("the ring did not form within {:?} ({why})", self.timeout),
                    None => format!("the parent's job did not run within {:?}", self.timeout),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A UDP socket on this point's collective address, for hellos to the parent: shared
/// (SO_REUSEADDR, SO_REUSEPORT) by the jobs joining at once. Nothing arrives on it:
/// collective packets are taken by the XDP programs at the ports.
fn hello_socket(local: SocketAddrV4) -> Result<std::net::UdpSocket, String> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fail = |e: nix::Error| format!("a socket on {local} for hellos to the parent: {e}");
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(fail)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(fail)?;
    setsockopt(&fd, sockopt::ReusePort, &true).map_err(fail)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(local),
    )
    .map_err(fail)?;
    Ok(std::net::UdpSocket::from(fd))
}

fn hex_secret(s: &Secret) -> String {
    s.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn ready(j: &Joined, rank: u8, dp: &impl JobTable) -> JoinReply {
    let base = dp
        .jobs()
        .ok()
        .and_then(|jobs| jobs.into_iter().find(|(id, _)| *id == j.id))
        .map_or(0, |(_, base)| base);
    JoinReply::Ready {
        job: j.id,
        member: rank,
        slot_base: base,
        slots: j.shape.slots as u32,
        path: j.path.clone(),
    }
}

/// Adds a job whose ranks are all in to the dataplane.
fn activate(dp: &mut impl JobTable, j: &Joined) -> Result<(), String> {
    let members = j
        .members
        .iter()
        .map(|m| {
            let a = m.expect("every rank in").addr;
            Ok(MemberSpec {
                interface: dp
                    .port_named(a.ifindex)
                    .ok_or_else(|| format!("interface index {} is no longer a port", a.ifindex))?,
                mac: xagg_sys::iface::fmt_mac(&a.mac),
                addr: SocketAddrV4::new(a.ip.into(), u16::from_be_bytes(a.port)),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let spec = JobSpec {
        id: j.id,
        op: xagg_common::wire::Op::Sum,
        dtype: xagg_common::wire::DType::I32,
        segment: (j.shape.segment_bytes / 4) as u16,
        slots: j.shape.slots as u32,
        members,
        slot_base: None,
        parent: j.parent.clone(),
        ring: j.ring.clone(),
    };
    dp.add_job(&spec)
}
