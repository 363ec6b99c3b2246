//! A level's join at its parent: a job whose ranks here are all in (or an open level under
//! a parent, from its first member) joins the parent's daemon as one member standing for
//! them, on a thread of its own ([`Upward`]); when that join settles, the job runs as an
//! inner level of the tree, or as a host of a ring the coordinator placed it in, or fails.

use std::{
    net::SocketAddrV4,
    sync::{
        mpsc::{Receiver, Sender},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use log::{info, warn};
use xagg_api::{Neighbour, ParentSpec, RingSpec};
use xagg_common::JobShape;
use xagg_join::{
    CredentialKey, JobKey, JoinReply, JoinRequest, Levels, MemberReply, MemberRequest, RingHost,
    RingReply, RingRequest, Secret,
};

use super::{
    registry::{activate, unix_now, Lifecycle, Route, JOINED_DTYPE, JOINED_OP},
    table::JobTable,
    Joins,
};
use crate::{Error, Result};

/// The uplink a daemon joins its jobs' levels through (`[parent]`): the parent's daemon
/// and a credential there, unless no aggregating switch is above.
#[derive(Clone)]
pub(super) struct ParentLink {
    pub(super) interface: String,
    pub(super) daemon: Option<(std::net::SocketAddr, String, CredentialKey)>,
    pub(super) ring_after: Duration,
}

/// How a job's join at its parent ended: the job (its key, and its wire id here, so a
/// newer job of the same key is not taken for it) and its route, or why it has none.
pub(super) struct Settled {
    pub(super) key: JobKey,
    pub(super) id: u32,
    /// The job's secret, to leave the parent's job if this one went meanwhile.
    pub(super) secret: Secret,
    pub(super) route: Result<Route>,
}

/// The joins at parents ending: their threads send, [`Joins::tick`] receives.
pub(super) struct Upstream {
    pub(super) done: Sender<Settled>,
    pub(super) settled: Receiver<Settled>,
}

impl Default for Upstream {
    fn default() -> Self {
        let (done, settled) = std::sync::mpsc::channel();
        Self { done, settled }
    }
}

impl Joins {
    /// Joins the parent's daemon for job `key`, whose ranks here are all in, on a thread
    /// of its own (once) — or, if the parent cannot take it and the ranks named a
    /// coordinator, the ring the coordinator places the hosts in; [`Joins::tick`] adds the
    /// job when either is settled.
    pub(super) fn join_parent(&mut self, key: JobKey) {
        let Some(j) = self.jobs.get_mut(&key) else {
            return;
        };
        match &j.state {
            // An open level's new member: the join under way says so from its next round.
            Lifecycle::JoiningParent { stand } => {
                *stand.lock().unwrap_or_else(|e| e.into_inner()) = j.stand();
                return;
            }
            Lifecycle::Running { .. } => return,
            Lifecycle::Pending => {}
        }
        let levels = j.stand();
        let stand = Arc::new(Mutex::new(levels));
        j.state = Lifecycle::JoiningParent {
            stand: stand.clone(),
        };
        let done = self.upstream.done.clone();
        let Some(link) = self.parent.clone() else {
            let _ = done.send(Settled {
                key,
                id: j.id,
                secret: j.secret,
                route: Err(Error::NoParent {
                    ranks: j.level.ranks().unwrap_or(0),
                    members: j.members.len(),
                }),
            });
            return;
        };
        let up_job = Upward {
            link,
            id: j.id,
            local: self.switch,
            mac: self.mac.clone().unwrap_or_default(),
            key,
            secret: j.secret,
            // One member, itself, at the level its children gather.
            shape: JobShape::new(1, j.shape.slots(), j.shape.segment_bytes())
                .expect("a smaller valid shape"),
            stand,
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
        let (id, secret) = (j.id, j.secret);
        std::thread::spawn(move || {
            let route = up_job.run();
            // The daemon may have stopped meanwhile: nobody to tell.
            let _ = done.send(Settled {
                key,
                id,
                secret,
                route,
            });
        });
    }

    /// Adds the jobs whose parents took them, and drops those refused there.
    pub(super) fn settle_upstream(&mut self, dp: &mut impl JobTable) {
        let settled: Vec<Settled> = self.upstream.settled.try_iter().collect();
        for Settled {
            key,
            id,
            secret,
            route,
        } in settled
        {
            let Some(j) = self
                .jobs
                .get_mut(&key)
                .filter(|j| j.id == id && matches!(j.state, Lifecycle::JoiningParent { .. }))
            else {
                // The job here went (timed out, or its ranks left) while its level joined
                // the parent, and the parent's job then took it: that job would run with a
                // member nobody feeds, its other hosts' rounds waiting on it. Its place
                // there goes, unless a newer job of the key here holds it again.
                if let (Ok(Route::Parent(p)), false) = (&route, self.jobs.contains_key(&key)) {
                    info!(
                        "job {id} ({key}): its parent took it after it went here; leaving member {} of job {} there",
                        p.member, p.job
                    );
                    self.leave_parent(key, secret, p.member);
                }
                continue;
            };
            if j.level.is_open() {
                j.order_by_first();
            }
            let activated = route
                .and_then(|route| activate(dp, j, &route, JOINED_OP, JOINED_DTYPE).map(|()| route));
            match activated {
                Ok(route) => {
                    match &route {
                        Route::Parent(p) => info!(
                            "job {} ({key}): running, member {} of job {} at the parent",
                            j.id, p.member, p.job
                        ),
                        Route::Ring { ring, why } => info!(
                            "job {} ({key}): running round a ring of {} hosts, at place {} ({})",
                            j.id, ring.size, ring.position, why
                        ),
                        Route::Root => {}
                    }
                    j.state = Lifecycle::Running { route };
                    j.activity = None;
                    j.active_unix_s = unix_now();
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

    /// Leaves the parent's job, where this point is member `member` of job `key`, on a
    /// thread of its own (nothing here waits for the parent's daemon, which may be gone).
    /// A parent that does not answer is asked again every [`LEAVE_RETRY`] until it does or
    /// [`LEAVE_GIVE_UP`] has passed (its idle timer removes the job by then): else a parent
    /// down for a moment kept the job, and its slots, until that timer.
    pub(super) fn leave_parent(&self, key: JobKey, secret: Secret, member: u8) {
        let Some((daemon, ..)) = self.parent.as_ref().and_then(|l| l.daemon.clone()) else {
            return;
        };
        std::thread::spawn(move || {
            let client = xagg_join::client::Client::new(daemon);
            let since = std::time::Instant::now();
            loop {
                let reply = client.nonce().and_then(|n| {
                    let req = MemberRequest::new(key, &secret, "leave", member, n.nonce);
                    client.post::<MemberReply>("/v1/leave", &req)
                });
                match reply {
                    Ok(MemberReply::Left) => {
                        info!("job {key}: left the parent's job at {daemon}")
                    }
                    Ok(other) => {
                        warn!("job {key}: leaving the parent's job at {daemon}: {other:?}")
                    }
                    Err(e) if since.elapsed() < LEAVE_GIVE_UP => {
                        warn!(
                            "job {key}: leaving the parent's job at {daemon}: {e}; asking again in {} s",
                            LEAVE_RETRY.as_secs()
                        );
                        std::thread::sleep(LEAVE_RETRY);
                        continue;
                    }
                    Err(e) => warn!(
                        "job {key}: leaving the parent's job at {daemon}: {e}; given up after {} s (its idle timer removes it)",
                        LEAVE_GIVE_UP.as_secs()
                    ),
                }
                return;
            }
        });
    }
}

/// How often a leave the parent did not answer is asked again, and for how long.
const LEAVE_RETRY: Duration = Duration::from_secs(5);
const LEAVE_GIVE_UP: Duration = Duration::from_secs(600);

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
    shape: JobShape,
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
    fn run(&self) -> Result<Route> {
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
            (None, None) => return Err(Error::NowhereToJoin),
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
                        let mac = at.mac.ok_or(Error::NoParentMac)?;
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
                            return Err(Error::ParentRefused { reason });
                        }
                        failed = Some(format!("the parent refused the job: {reason}"));
                    }
                    Ok(_) => unanswered = None,
                    Err(e) => {
                        let since = *unanswered.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.link.ring_after {
                            let why = Error::ParentSilent {
                                after: self.link.ring_after,
                                error: e,
                            };
                            if coordinator.is_none() {
                                return Err(why);
                            }
                            failed = Some(why.to_string());
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
                        return Ok(Route::Ring {
                            ring: RingSpec {
                                interface: self.link.interface.clone(),
                                size,
                                position,
                                predecessor: neighbour(predecessor, 0),
                                successor: neighbour(successor, member),
                            },
                            why,
                        });
                    }
                    Ok(RingReply::Refused { reason }) => {
                        return Err(Error::CoordinatorRefused { reason })
                    }
                    Ok(RingReply::Tree | RingReply::Pending { .. }) => {}
                    Err(e) => warn!("job {}: the coordinator: {e}", self.key),
                }
            }
            if start.elapsed() > self.timeout {
                return Err(match failed {
                    Some(why) => Error::NoRing {
                        timeout: self.timeout,
                        why,
                    },
                    None => Error::ParentNotRunning {
                        timeout: self.timeout,
                    },
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A UDP socket on this point's collective address, for hellos to the parent: shared
/// (SO_REUSEADDR, SO_REUSEPORT) by the jobs joining at once. Nothing arrives on it:
/// collective packets are taken by the XDP programs at the ports.
fn hello_socket(local: SocketAddrV4) -> Result<std::net::UdpSocket> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fail = |errno: nix::Error| Error::HelloSocket { local, errno };
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
