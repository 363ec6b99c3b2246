//! The state file (`joined.json` in the state directory, 0600 in a 0700 directory): the
//! joined jobs and the generations of the job indices, so that a restart of the daemon
//! adopts them.
//!
//! Its layout is the one it has always had (the lifecycle as flags and the route's specs
//! beside them, the ranks each member stands for in a list beside the members), so a
//! daemon before or after a change of the registry reads the other's file.

use std::{collections::BTreeMap, net::SocketAddrV4, path::Path as FilePath};

use serde::{Deserialize, Serialize};
use xagg_api::{ParentSpec, RingSpec};
use xagg_common::{job::MemberAddr, JobShape};
use xagg_join::{JobKey, Path, Secret};

use super::registry::{Joined, Level, Lifecycle, Member, Route};
use crate::{Error, Result};

/// What the state file holds.
#[derive(Default, Serialize, Deserialize)]
pub(super) struct Saved {
    jobs: Vec<SavedJob>,
    pub(super) generations: BTreeMap<u16, u16>,
}

/// A joined job in the state file.
#[derive(Serialize, Deserialize)]
struct SavedJob {
    key: JobKey,
    /// Hex, only ever in the state file (mode 0600).
    secret: String,
    credential: String,
    #[serde(deserialize_with = "shape_or_open")]
    shape: JobShape,
    id: u32,
    members: Vec<Option<SavedMember>>,
    /// Whether the dataplane has it (every rank joined).
    ready: bool,
    created_unix_s: u64,
    #[serde(default)]
    active_unix_s: u64,
    /// With levels: the job's ranks in all.
    #[serde(default)]
    ranks: Option<u32>,
    /// With levels, per member: the first rank it stands for and how many.
    #[serde(default)]
    stands_for: Vec<Option<(u32, u32)>>,
    /// An open level.
    #[serde(default)]
    open: bool,
    /// Where this level's partials go (running as an inner level of the tree).
    #[serde(default)]
    parent: Option<ParentSpec>,
    /// Or this host's place in a ring of the job's hosts.
    #[serde(default)]
    ring: Option<RingSpec>,
    /// Which way the job runs (with levels).
    #[serde(default)]
    path: Option<Path>,
    #[serde(default)]
    coordinator: Option<SocketAddrV4>,
}

/// A saved job's shape. An open level's was saved with 0 members before its shape became
/// one member's (CHANGELOG.md, join protocol): read as one member, so a daemon upgraded
/// keeps the joined jobs of the one before.
fn shape_or_open<'de, D: serde::Deserializer<'de>>(d: D) -> Result<JobShape, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Fields {
        members: usize,
        slots: usize,
        segment_bytes: usize,
    }
    let f = Fields::deserialize(d)?;
    JobShape::new(f.members.max(1), f.slots, f.segment_bytes).map_err(serde::de::Error::custom)
}

/// A member in the state file.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct SavedMember {
    addr: Addr,
    hello: u64,
    left: bool,
}

/// [`MemberAddr`] in the state file.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Addr {
    ifindex: u32,
    ip: [u8; 4],
    mac: [u8; 6],
    port: [u8; 2],
}

impl Saved {
    pub(super) fn new<'a>(
        jobs: impl Iterator<Item = &'a Joined>,
        generations: BTreeMap<u16, u16>,
    ) -> Self {
        Self {
            jobs: jobs.map(SavedJob::from).collect(),
            generations,
        }
    }

    /// Reads the state file; none there is an empty one.
    pub(super) fn read(file: &FilePath) -> Result<Self> {
        match std::fs::read_to_string(file) {
            Ok(text) => Self::parse(&text).map_err(|e| Error::StateFile {
                file: file.to_owned(),
                error: Box::new(e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(error) => Err(Error::ReadState {
                file: file.to_owned(),
                error,
            }),
        }
    }

    pub(super) fn parse(text: &str) -> Result<Self> {
        Ok(serde_json::from_str(text)?)
    }

    pub(super) fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The joined jobs it holds (a job's timers start now).
    pub(super) fn jobs(&self) -> Result<Vec<Joined>> {
        self.jobs.iter().map(Joined::try_from).collect()
    }

    /// Writes it to `file` (0600 in a 0700 directory), replacing the file whole.
    pub(super) fn write(&self, file: &FilePath) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = file.parent().expect("a file in a directory");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let tmp = file.with_extension("json.new");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, self.to_json()?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    }
}

impl From<&Joined> for SavedJob {
    fn from(j: &Joined) -> Self {
        let route = match &j.state {
            Lifecycle::Running { route } => Some(route),
            Lifecycle::Pending | Lifecycle::JoiningParent { .. } => None,
        };
        Self {
            key: j.key,
            secret: j.secret.0.iter().map(|b| format!("{b:02x}")).collect(),
            credential: j.credential.clone(),
            shape: j.shape,
            id: j.id,
            members: j.members.iter().map(|m| m.map(SavedMember::from)).collect(),
            ready: route.is_some(),
            created_unix_s: j.created_unix_s,
            active_unix_s: j.active_unix_s,
            ranks: j.level.ranks(),
            stands_for: j
                .members
                .iter()
                .map(|m| m.and_then(|m| m.stands_for))
                .collect(),
            open: j.level.is_open(),
            parent: match route {
                Some(Route::Parent(p)) => Some(p.clone()),
                _ => None,
            },
            ring: match route {
                Some(Route::Ring { ring, .. }) => Some(ring.clone()),
                _ => None,
            },
            path: route.and_then(Route::path),
            coordinator: j.coordinator,
        }
    }
}

impl TryFrom<&SavedJob> for Joined {
    type Error = Error;

    fn try_from(s: &SavedJob) -> Result<Self> {
        let secret: Secret = s.secret.parse()?;
        let level = match (s.open, s.ranks) {
            (_, None) => Level::Flat,
            (false, Some(ranks)) => Level::Fixed { ranks },
            (true, Some(ranks)) => Level::Open { ranks },
        };
        let route = match (&s.parent, &s.ring) {
            (Some(p), _) => Route::Parent(p.clone()),
            (None, Some(ring)) => Route::Ring {
                ring: ring.clone(),
                why: match &s.path {
                    Some(Path::Ring { why }) => why.clone(),
                    _ => String::new(),
                },
            },
            (None, None) => Route::Root,
        };
        // A job joining its parent was written as pending: the join at its parent is
        // made again when its members say so.
        let state = if s.ready {
            Lifecycle::Running { route }
        } else {
            Lifecycle::Pending
        };
        let members = s
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.map(|m| Member {
                    addr: m.addr.into(),
                    hello: m.hello,
                    left: m.left,
                    stands_for: s.stands_for.get(i).copied().flatten(),
                    // Leases run again from a restart (`Joins::new`).
                    renewed_unix_s: 0,
                })
            })
            .collect();
        Ok(Self {
            key: s.key,
            secret,
            credential: s.credential.clone(),
            shape: s.shape,
            id: s.id,
            level,
            members,
            state,
            created_unix_s: s.created_unix_s,
            active_unix_s: s.active_unix_s,
            since: std::time::Instant::now(),
            activity: None,
            coordinator: s.coordinator,
        })
    }
}

impl From<Member> for SavedMember {
    fn from(m: Member) -> Self {
        Self {
            addr: m.addr.into(),
            hello: m.hello,
            left: m.left,
        }
    }
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
