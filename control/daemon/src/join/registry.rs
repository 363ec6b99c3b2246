//! The joined jobs: a job created by a join, its members, its level, and where it is in its
//! life ([`Lifecycle`]: pending, joining its parent, running by a [`Route`]).

use std::{
    net::SocketAddrV4,
    sync::{Arc, Mutex},
    time::{Instant, SystemTime},
};

use xagg_api::{JobSpec, MemberSpec, ParentSpec, RingSpec};
use xagg_common::{
    job::MemberAddr,
    wire::{DType, Op},
    JobShape,
};
use xagg_join::{JobKey, JoinReply, JoinRequest, Levels, Path, Secret};

use super::table::JobTable;
use crate::{Error, Result};

/// The op and type a joined job's dataplane entry names. A join does not state them (its
/// shape is members, slots and segment bytes): each message carries its own pair, which
/// the switch takes whatever it is, so the job's pair only sets the lanes its entry counts
/// a segment's bytes in. Once joins state a pair, it goes where these are passed.
pub(super) const JOINED_OP: Op = Op::Sum;
pub(super) const JOINED_DTYPE: DType = DType::I32;

/// Bytes per element of `op` over `dtype` on the wire (its lane's).
/// A member of a joined job as its hello showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Member {
    pub(super) addr: MemberAddr,
    /// The hello token it was learned from (a join retried with the same token reuses it).
    pub(super) hello: u64,
    pub(super) left: bool,
    /// With levels: the first rank it stands for and how many.
    pub(super) stands_for: Option<(u32, u32)>,
    /// Seconds since the Unix epoch of its lease's last renewal (its join, a renewal, a
    /// status query, or a round of its job moving on).
    pub(super) renewed_unix_s: u64,
}

/// How a joined job's members stand for its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// A job without levels: its members are its ranks.
    Flat,
    /// A level whose members are ranks (a host's) of a job of `ranks` ranks in all: with
    /// fewer members than that, it needs its parent.
    Fixed { ranks: u32 },
    /// An open level (a parent's): members are whoever joins, ordered by the first rank
    /// each stands for, complete when their weights add up to `ranks`.
    Open { ranks: u32 },
}

impl Level {
    /// The level a join names: a level of the job gathered by its children
    /// (`levels.open`) is open, its members counted by weight.
    pub(super) fn of(req: &JoinRequest) -> Self {
        match req.levels {
            None => Self::Flat,
            Some(l) if l.open => Self::Open { ranks: l.ranks },
            Some(l) => Self::Fixed { ranks: l.ranks },
        }
    }

    /// With levels: the job's ranks in all.
    pub(super) fn ranks(self) -> Option<u32> {
        match self {
            Self::Flat => None,
            Self::Fixed { ranks } | Self::Open { ranks } => Some(ranks),
        }
    }

    pub(super) fn is_open(self) -> bool {
        matches!(self, Self::Open { .. })
    }
}

/// Where a joined job is in its life: pending until its members are in, then (a level
/// whose ranks are not all here) joining its parent, then running.
#[derive(Clone, Debug)]
pub(super) enum Lifecycle {
    /// Gathering its members; not in the dataplane.
    Pending,
    /// Its level joins its parent's daemon (or a ring of the job's hosts) on a thread of
    /// its own, standing for `stand`, which an open level's new members change; not in
    /// the dataplane until that join settles.
    JoiningParent { stand: Arc<Mutex<Levels>> },
    /// In the dataplane (every member in), its results or partials going by `route`.
    Running { route: Route },
}

/// Where a running job's aggregates go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// The job's root: results go back to its members.
    Root,
    /// An inner level of the job's tree: partials go to its parent's job.
    Parent(ParentSpec),
    /// A host in a ring of the job's hosts, and why the tree failed.
    Ring { ring: RingSpec, why: String },
}

impl Route {
    /// Which way the job runs, as joins are told (none at the root).
    pub(super) fn path(&self) -> Option<Path> {
        match self {
            Self::Root => None,
            Self::Parent(_) => Some(Path::Tree),
            Self::Ring { why, .. } => Some(Path::Ring { why: why.clone() }),
        }
    }
}

/// A job created by a join.
#[derive(Clone, Debug)]
pub(super) struct Joined {
    pub(super) key: JobKey,
    pub(super) secret: Secret,
    pub(super) credential: String,
    pub(super) shape: JobShape,
    pub(super) id: u32,
    pub(super) level: Level,
    pub(super) members: Vec<Option<Member>>,
    pub(super) state: Lifecycle,
    /// Seconds since the Unix epoch when it was created.
    pub(super) created_unix_s: u64,
    /// Seconds since the Unix epoch of its last progress (a round moving on): its idle
    /// timer, kept across a restart of the daemon.
    pub(super) active_unix_s: u64,
    pub(super) since: Instant,
    /// The job's slots as last seen (`Dataplane::activity`).
    pub(super) activity: Option<u64>,
    /// The daemon that places the job's hosts in a ring (its ranks named it).
    pub(super) coordinator: Option<SocketAddrV4>,
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Joined {
    /// A job as the join `req` creates it, with wire id `id`: no member in yet.
    pub(super) fn new(req: &JoinRequest, secret: Secret, credential: String, id: u32) -> Self {
        let level = Level::of(req);
        // An open level's members are added as they join.
        let places = if level.is_open() {
            0
        } else {
            req.shape.members()
        };
        Self {
            key: req.key,
            secret,
            credential,
            shape: req.shape,
            id,
            level,
            members: vec![None; places],
            state: Lifecycle::Pending,
            created_unix_s: unix_now(),
            active_unix_s: 0,
            since: Instant::now(),
            activity: None,
            coordinator: None,
        }
    }

    /// Whether the dataplane has it (every rank joined).
    pub(super) fn running(&self) -> bool {
        matches!(self.state, Lifecycle::Running { .. })
    }

    /// Which way it runs (with levels, once running).
    pub(super) fn path(&self) -> Option<Path> {
        match &self.state {
            Lifecycle::Running { route } => route.path(),
            _ => None,
        }
    }

    /// Where its aggregates go, as listings say it: `members`, `parent` (with its member
    /// index there) or `ring` (with why); empty until it runs.
    pub(super) fn route_listing(&self) -> (&'static str, Option<u8>, Option<String>) {
        match &self.state {
            Lifecycle::Pending => ("", None, None),
            Lifecycle::JoiningParent { .. } => ("joining its parent", None, None),
            Lifecycle::Running { route } => match route {
                Route::Root => ("members", None, None),
                Route::Parent(p) => ("parent", Some(p.member), None),
                Route::Ring { why, .. } => ("ring", None, Some(why.clone())),
            },
        }
    }

    pub(super) fn missing(&self) -> Vec<u8> {
        (0..self.members.len() as u8)
            .filter(|&r| self.members[usize::from(r)].is_none_or(|m| m.left))
            .collect()
    }

    /// Ranks the members present stand for (with levels).
    pub(super) fn weight_in(&self) -> u32 {
        self.stand().weight
    }

    /// Whether every member is in: every rank of this level, or (open) members standing
    /// for all the job's ranks.
    pub(super) fn complete(&self) -> bool {
        match self.level {
            Level::Open { ranks } => self.weight_in() == ranks,
            Level::Flat | Level::Fixed { .. } => self.missing().is_empty(),
        }
    }

    /// Whether this level's members stand for fewer ranks than the job has: it needs its
    /// parent.
    pub(super) fn needs_parent(&self) -> bool {
        matches!(self.level, Level::Fixed { ranks } if ranks as usize > self.members.len())
    }

    /// What this level stands for at its parent: the lowest first rank and the weights of
    /// its members present.
    pub(super) fn stand(&self) -> Levels {
        let present = || {
            self.members
                .iter()
                .flatten()
                .filter(|m| !m.left)
                .filter_map(|m| m.stands_for)
        };
        Levels {
            ranks: self.level.ranks().unwrap_or(0),
            first: present().map(|s| s.0).min().unwrap_or(0),
            weight: present().map(|s| s.1).sum(),
            coordinator: None,
            open: true,
        }
    }

    /// The index of the member standing for ranks from `first` (an open level's).
    pub(super) fn standing_for(&self, first: u32) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.is_some_and(|m| m.stands_for.is_some_and(|s| s.0 == first)))
    }

    /// An open level's members in the order of the ranks they stand for: their indices.
    pub(super) fn order_by_first(&mut self) {
        self.members
            .sort_by_key(|m| m.and_then(|m| m.stands_for).map_or(u32::MAX, |s| s.0));
    }

    /// What a pending job waits for, beyond the ranks `missing` names (`up`: an open level
    /// joining its parent).
    pub(super) fn waiting(&self, up: bool) -> Option<String> {
        if up {
            Some("this level's parent (its job there gathers the job's other ranks)".into())
        } else if let Level::Open { ranks: n } = self.level {
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

    /// Whether its members are ranks, which hold leases (an open level's are daemons).
    pub(super) fn leased(&self) -> bool {
        !self.level.is_open()
    }

    /// The members whose leases ran out at `unix` (`lease_s` without renewal): their ranks.
    pub(super) fn lapsed(&self, unix: u64, lease_s: u64) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&r| {
                self.members[r]
                    .is_some_and(|m| !m.left && unix.saturating_sub(m.renewed_unix_s) > lease_s)
            })
            .collect()
    }

    /// The ranks that left it (only a running job keeps them: a pending one forgets them).
    pub(super) fn left(&self) -> Vec<u8> {
        (0..self.members.len() as u8)
            .filter(|&r| self.members[usize::from(r)].is_some_and(|m| m.left))
            .collect()
    }

    /// Seconds from `unix` until the first lease of a member still in runs out.
    pub(super) fn lease_ends(&self, unix: u64, lease_s: u64) -> Option<u64> {
        self.members
            .iter()
            .flatten()
            .filter(|m| !m.left)
            .map(|m| (m.renewed_unix_s + lease_s).saturating_sub(unix))
            .min()
    }

    /// Every member present renewed at `unix`.
    pub(super) fn renew_all(&mut self, unix: u64) {
        for m in self.members.iter_mut().flatten() {
            m.renewed_unix_s = m.renewed_unix_s.max(unix);
        }
    }

    /// The answer to a join of member `member` once the job runs.
    pub(super) fn ready(&self, member: u8, dp: &impl JobTable, lease_s: u64) -> JoinReply {
        let base = dp
            .jobs()
            .ok()
            .and_then(|jobs| jobs.into_iter().find(|(id, _)| *id == self.id))
            .map_or(0, |(_, base)| base);
        JoinReply::Ready {
            job: self.id,
            member,
            slot_base: base,
            slots: self.shape.slots() as u32,
            path: self.path(),
            lease_s: self.leased().then_some(lease_s as u32),
        }
    }
}

/// Adds a job whose ranks are all in to the dataplane, reducing `op` over `dtype` (its
/// segments of `segment_bytes` counted in their elements), its aggregates going by `route`.
pub(super) fn activate(
    dp: &mut impl JobTable,
    j: &Joined,
    route: &Route,
    op: Op,
    dtype: DType,
) -> Result<()> {
    let elements = j
        .shape
        .segment_elements(xagg_api::lane(op, dtype)?)
        .map_err(Error::Shape)?;
    let members = j
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // A rank that left while the level joined its parent.
            let a = m.ok_or(Error::MemberLeft(i))?.addr;
            Ok(MemberSpec {
                interface: dp.port_named(a.ifindex).ok_or(Error::PortGone(a.ifindex))?,
                mac: xagg_linux::iface::fmt_mac(&a.mac),
                addr: SocketAddrV4::new(a.ip.into(), u16::from_be_bytes(a.port)),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (parent, ring) = match route {
        Route::Root => (None, None),
        Route::Parent(p) => (Some(p.clone()), None),
        Route::Ring { ring, .. } => (None, Some(ring.clone())),
    };
    let spec = JobSpec {
        id: j.id,
        op,
        dtype,
        segment: elements as u16,
        slots: j.shape.slots() as u32,
        members,
        slot_base: None,
        parent,
        ring,
    };
    dp.add_job(&spec)
}
