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
    Shape,
};

use crate::{AllreduceError, WorkerParams};

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

/// What a joined worker keeps to leave its job.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    daemon: SocketAddr,
    key: JobKey,
    secret: Secret,
    rank: u8,
}

fn join_error(e: String) -> AllreduceError {
    AllreduceError::Join(e)
}

/// Joins the job; returns the worker's parameters (job id, member index, the switch) and
/// its data socket, from which the hellos went.
pub(crate) fn join(
    j: &JoinParams,
) -> Result<(WorkerParams, std::net::UdpSocket, Membership), AllreduceError> {
    let client = Client::new(j.daemon);
    let sock = std::net::UdpSocket::bind(j.bind)?;
    // Port 0 in `j.bind` lets the system choose: the member is where the socket is.
    let bind = match sock.local_addr()? {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => {
            return Err(AllreduceError::Invalid(format!(
                "{a}: members are IPv4 addresses"
            )))
        }
    };
    let joined = client
        .join(&sock, j.timeout, |nonce, token| {
            JoinRequest::new(
                j.key,
                &j.secret,
                Shape::from(j.shape),
                j.rank,
                token,
                nonce,
                j.credential
                    .as_ref()
                    .map(|(name, key)| (name.as_str(), key)),
                j.levels,
            )
        })
        .map_err(join_error)?;
    let mut p = WorkerParams::new(joined.at.switch, bind, joined.job, joined.member, j.shape);
    p.first_message = None;
    p.ranks = j.levels.map(|l| l.ranks as usize);
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
    };
    Ok((p, sock, m))
}

impl Membership {
    /// Leaves the job: when every rank has left, the daemon removes it.
    pub(crate) fn leave(&self) -> Result<(), AllreduceError> {
        let client = Client::new(self.daemon);
        let n = client.nonce().map_err(join_error)?;
        let req = MemberRequest::new(self.key, &self.secret, "leave", self.rank, n.nonce);
        match client
            .post::<MemberReply>("/v1/leave", &req)
            .map_err(join_error)?
        {
            MemberReply::Left => Ok(()),
            MemberReply::Refused { reason } => Err(AllreduceError::Join(format!(
                "the daemon refused to let this rank leave: {reason}"
            ))),
            other => Err(AllreduceError::Join(format!("unexpected answer {other:?}"))),
        }
    }

    /// The job's state as the daemon sees it.
    pub(crate) fn status(&self) -> Result<MemberReply, AllreduceError> {
        let client = Client::new(self.daemon);
        let n = client.nonce().map_err(join_error)?;
        let req = MemberRequest::new(self.key, &self.secret, "status", self.rank, n.nonce);
        client.post("/v1/joined/status", &req).map_err(join_error)
    }
}
