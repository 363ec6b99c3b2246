//! Joining a job over the network (the protocol: `xagg_join`): the worker opens its data
//! socket, sends hellos from it to the switch (which records the port and addresses they
//! came from), and joins through the daemon's network listener until every rank is in.
//! A plain blocking HTTP client: no runtime, nothing left running between calls.

use std::{
    net::{SocketAddr, SocketAddrV4},
    time::Duration,
};

use xagg_common::JobShape;
use xagg_join::{
    client::Client, CredentialKey, JobKey, JoinRequest, Levels, MemberReply, MemberRequest, Secret,
};

use crate::{AllreduceError, Error, WorkerParams};

/// What a rank needs to join a job.
#[derive(Clone, Debug)]
pub struct JoinParams {
    /// The daemon's network listener (`daemon.listen`).
    pub daemon: SocketAddr,
    /// The job's key and secret, chosen by the launcher and shared by its ranks.
    pub key: JobKey,
    pub secret: Secret,
    /// This rank (its member index) and the job's shape, the same on every rank.
    pub rank: u8,
    pub shape: JobShape,
    /// This member's data address: its IPv4 address and a UDP port (0: any free one).
    pub bind: SocketAddrV4,
    /// An admission credential (name, key), to create the job if this rank is the first.
    pub credential: Option<(String, CredentialKey)>,
    /// How long to wait for every rank.
    pub timeout: Duration,
    /// In a job with levels: the job's ranks in all and this rank's place among them
    /// (`rank` and `shape` are then this host's: its local rank and local size).
    pub levels: Option<Levels>,
}

/// Where a rank stands in its job: its member index and the members of the job at the
/// daemon it joins, and, when the job's ranks join several daemons (one per host, each
/// reducing its own ranks), the job's levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub member: u8,
    pub members: usize,
    pub levels: Option<Levels>,
    /// With levels, where every rank is, when every rank's daemon is known
    /// ([`WorkerParams::places`](crate::WorkerParams::places)).
    pub places: Option<Vec<crate::Place>>,
}

impl Placement {
    /// Rank `rank` of `size`, every rank at one daemon: a job of one level.
    pub fn flat(rank: usize, size: usize) -> Result<Self, Error> {
        Self::check(rank, size)?;
        if size > xagg_common::wire::MAX_MEMBERS {
            return Err(Error::TooManyMembers { ranks: size });
        }
        Ok(Self {
            member: rank as u8,
            members: size,
            levels: None,
            places: None,
        })
    }

    /// From every rank's daemon, in rank order (the same list on every rank, e.g.
    /// gathered by the launcher's own collective): the ranks that join one daemon are one
    /// host's, numbered there in rank order; rank 0's daemon coordinates a ring, should
    /// no switch take the job. All at one daemon: [`Placement::flat`].
    pub fn by_daemon(daemons: &[SocketAddr], rank: usize) -> Result<Self, Error> {
        let size = daemons.len();
        Self::check(rank, size)?;
        let mine = daemons[rank];
        if daemons.iter().all(|d| *d == mine) {
            return Self::flat(rank, size);
        }
        let local = |r: usize, at: &SocketAddr| daemons[..r].iter().filter(|d| *d == at).count();
        let coordinator = match daemons[0] {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(daemon) => return Err(Error::CoordinatorNotIpv4 { daemon }),
        };
        // The top numbers the hosts by the lowest rank each stands for; a host numbers
        // its ranks in rank order.
        let firsts: Vec<usize> = (0..size)
            .filter(|&r| !daemons[..r].contains(&daemons[r]))
            .collect();
        let places = daemons
            .iter()
            .enumerate()
            .map(|(r, d)| crate::Place {
                host: firsts.iter().position(|&f| daemons[f] == *d).unwrap_or(0) as u8,
                member: local(r, d) as u8,
            })
            .collect();
        Ok(Self {
            places: Some(places),
            ..Self::local(
                rank,
                size,
                local(rank, &mine),
                local(size, &mine),
                Some(coordinator),
            )?
        })
    }

    /// From the launcher's local rank and size (this host's ranks: `LOCAL_RANK` and
    /// `LOCAL_WORLD_SIZE` under torchrun, `OMPI_COMM_WORLD_LOCAL_RANK` and
    /// `OMPI_COMM_WORLD_LOCAL_SIZE` under Open MPI), and the daemon that coordinates a ring
    /// (rank 0's host's). A host of every rank: [`Placement::flat`].
    pub fn local(
        rank: usize,
        size: usize,
        local_rank: usize,
        local_size: usize,
        coordinator: Option<SocketAddrV4>,
    ) -> Result<Self, Error> {
        Self::check(rank, size)?;
        if local_size == 0 || local_rank >= local_size || local_size > size {
            return Err(Error::LocalRank {
                local_rank,
                local_size,
                size,
            });
        }
        if local_size == size {
            return Self::flat(local_rank, size);
        }
        let placed = Self::flat(local_rank, local_size)?;
        Ok(Self {
            levels: Some(Levels {
                ranks: size as u32,
                first: rank as u32,
                weight: 1,
                coordinator,
                open: false,
            }),
            ..placed
        })
    }

    fn check(rank: usize, size: usize) -> Result<(), Error> {
        if rank >= size || size > crate::codec::MAX_RANKS {
            return Err(Error::Rank { rank, size });
        }
        Ok(())
    }
}

/// What a joined worker keeps to renew its lease and leave its job.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    daemon: SocketAddr,
    key: JobKey,
    secret: Secret,
    rank: u8,
    /// Its lease's length, if the daemon keeps leases.
    pub(crate) lease_s: Option<u32>,
    /// The job's ranks this worker found gone (bit r: rank r), told to the daemon when it
    /// leaves; shared with the engine, which finds them.
    pub(crate) gone: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Joins the job; returns the worker's parameters (job id, member index, the switch) and
/// its data socket, from which the hellos went.
pub(crate) fn join(
    j: &JoinParams,
) -> Result<(WorkerParams, std::net::UdpSocket, Membership), AllreduceError> {
    let client = Client::new(j.daemon);
    let sock = crate::error::bind_udp(j.bind)?;
    // Port 0 in `j.bind` lets the system choose: the member is where the socket is.
    let bind = match sock.local_addr()? {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => {
            return Err(AllreduceError::Invalid(format!(
                "{a}: members are IPv4 addresses"
            )))
        }
    };
    let joined = client.join(&sock, j.timeout, |nonce, token| {
        JoinRequest::new(
            j.key,
            &j.secret,
            j.shape,
            j.rank,
            token,
            nonce,
            j.credential
                .as_ref()
                .map(|(name, key)| (name.as_str(), key)),
            j.levels,
        )
    })?;
    let mut p = WorkerParams::new(joined.at.switch, bind, joined.job, joined.member, j.shape);
    p.first_message = None;
    p.joined_through = Some(j.daemon);
    p.switch_ports = joined.at.switch_ports;
    p.ranks = j.levels.map(|l| l.ranks as usize);
    p.rank = j.levels.map(|l| l.first as usize);
    (p.path, p.path_why) = match joined.path {
        None => (crate::Path::Switch, None),
        Some(xagg_join::Path::Tree) => (crate::Path::Tree, None),
        Some(xagg_join::Path::Ring { why }) => (crate::Path::Ring, Some(why)),
    };
    let m = Membership {
        daemon: j.daemon,
        key: j.key,
        secret: j.secret,
        rank: j.rank,
        lease_s: joined.lease_s,
        gone: Default::default(),
    };
    Ok((p, sock, m))
}

impl Membership {
    /// Leaves the job: when every rank has left, the daemon removes it.
    pub(crate) fn leave(&self) -> Result<(), AllreduceError> {
        let client = Client::new(self.daemon);
        let n = client.nonce()?;
        let mask = self.gone.load(std::sync::atomic::Ordering::SeqCst);
        let gone = (0..64u8).filter(|r| mask & (1 << r) != 0).collect();
        let req =
            MemberRequest::reporting(self.key, &self.secret, "leave", self.rank, n.nonce, gone);
        let failed = match client.post::<MemberReply>("/v1/leave", &req)? {
            MemberReply::Left => return Ok(()),
            MemberReply::Refused { reason } => Error::LeaveRefused { reason },
            other => Error::UnexpectedAnswer {
                answer: format!("{other:?}"),
            },
        };
        Err(AllreduceError::Join(failed.into()))
    }

    /// Renews the lease: the daemon keeps the membership for another lease from now.
    pub(crate) fn renew(&self) -> Result<MemberReply, AllreduceError> {
        let client = Client::new(self.daemon);
        let n = client.nonce()?;
        let req = MemberRequest::new(self.key, &self.secret, "renew", self.rank, n.nonce);
        Ok(client.post("/v1/joined/renew", &req)?)
    }

    /// The job's state as the daemon sees it.
    pub(crate) fn status(&self) -> Result<MemberReply, AllreduceError> {
        let client = Client::new(self.daemon);
        let n = client.nonce()?;
        let req = MemberRequest::new(self.key, &self.secret, "status", self.rank, n.nonce);
        Ok(client.post("/v1/joined/status", &req)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranks_at_one_daemon_make_a_job_of_one_level() {
        let all = [d("10.0.0.1:47900"); 4];
        for r in 0..4 {
            assert_eq!(
                Placement::by_daemon(&all, r).unwrap(),
                Placement {
                    member: r as u8,
                    members: 4,
                    levels: None,
                    places: None,
                }
            );
        }
    }

    #[test]
    fn ranks_are_grouped_by_their_daemon_in_rank_order() {
        let (a, b) = (d("10.0.0.2:47900"), d("10.0.0.3:47900"));
        // Hosts need not hold consecutive ranks.
        let daemons = [a, b, a, b, b];
        let placed: Vec<Placement> = (0..5)
            .map(|r| Placement::by_daemon(&daemons, r).unwrap())
            .collect();
        let members: Vec<(u8, usize)> = placed.iter().map(|p| (p.member, p.members)).collect();
        assert_eq!(members, [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
        for (r, p) in placed.iter().enumerate() {
            let l = p.levels.unwrap();
            assert_eq!((l.ranks, l.first, l.weight), (5, r as u32, 1));
            assert_eq!(l.coordinator, Some("10.0.0.2:47900".parse().unwrap()));
            // Host a is the top's member 0 (its lowest rank is 0), b member 1.
            let places: Vec<(u8, u8)> = p
                .places
                .as_ref()
                .unwrap()
                .iter()
                .map(|p| (p.host, p.member))
                .collect();
            assert_eq!(places, [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]);
        }
    }

    #[test]
    fn a_launchers_local_rank_and_size() {
        let c = Some("10.0.0.2:47900".parse().unwrap());
        let p = Placement::local(5, 8, 1, 4, c).unwrap();
        assert_eq!((p.member, p.members), (1, 4));
        assert_eq!(p.levels.unwrap().first, 5);
        // One host of every rank: no levels.
        assert_eq!(Placement::local(2, 4, 2, 4, c).unwrap().levels, None);
        for (rank, size, lr, ls) in [(4, 4, 0, 1), (0, 4, 2, 2), (0, 4, 0, 0), (0, 4, 0, 5)] {
            let e = Placement::local(rank, size, lr, ls, c)
                .unwrap_err()
                .to_string();
            assert!(e.contains("rank"), "{e}");
        }
        // More ranks than a host (or a one-level job) can have at its daemon.
        let e = Placement::flat(0, 300).unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
        assert!(Placement::local(0, 1000, 0, 10, c).is_ok());
    }
}
