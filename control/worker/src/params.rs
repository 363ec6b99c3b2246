//! What a worker needs to know to take part in a job: where the switch is, who it is in
//! the job, the job's shape, and how it sends, receives and waits.

use std::{net::SocketAddrV4, time::Duration};

use xagg_common::{
    wire::{self, Collective, DType, Float, Lane, Op},
    JobShape,
};

use crate::AllreduceError;

/// The default lower bound of the retransmission timeout ([`WorkerParams::min_timeout`]).
pub const MIN_TIMEOUT: Duration = Duration::from_millis(10);

/// [`WorkerParams::collective_timeout`]'s default: 30 minutes, as Gloo's and NCCL's.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Where a rank is in a job of two levels: its host's member index at the top (the
/// parent) and its own member index at its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub host: u8,
    pub member: u8,
}

#[derive(Clone, Debug)]
pub struct WorkerParams {
    /// The switch's address and collective UDP port.
    pub switch: SocketAddrV4,
    /// This member's own address and UDP port, as registered in the job.
    pub bind: SocketAddrV4,
    pub job: u32,
    pub member: u8,
    pub op: Op,
    pub dtype: DType,
    /// The job's members, slots and segment length.
    pub shape: JobShape,
    /// Ranks in the whole job, every level of its tree (or ring) together; `None`: the
    /// job's members (a flat job). Float sums scale their mantissas for it, and `avg`
    /// divides by it.
    pub ranks: Option<usize>,
    /// This member's rank among those `ranks` (the launcher's numbering, which the
    /// collectives' blocks follow); `None`: its member index (a flat job).
    pub rank: Option<usize>,
    /// Behind a host level under the job's top: every rank's place, in rank order
    /// ([`Place`]). With it the collectives besides allreduce take each level at their
    /// own bytes (a segment's root named at both levels); without it (or on a ring of
    /// hosts) each is made as an allreduce of the whole message.
    pub places: Option<Vec<Place>>,
    /// Which way the job's results are made (told by the join), and why: reported with
    /// every completion.
    pub path: crate::Path,
    pub path_why: Option<String>,
    /// Collective ports of the switch from `switch`'s on: slot `s`'s contributions go to
    /// the `s % switch_ports`-th (`switch.udp_ports`; a join learns it). Results and
    /// replies come from `switch`.
    pub switch_ports: u8,
    /// First retransmission timeout (before any round trip is measured); then adapted to
    /// the measured round trip.
    pub timeout: Duration,
    /// Lower bound of the adapted timeout: absorbs scheduling delays when workers
    /// outnumber cores, and rounds whose time varies with the segment (a ring's chain
    /// starts at a different host for each).
    pub min_timeout: Duration,
    /// Upper bound of the retransmission timeout.
    pub max_timeout: Duration,
    /// How long the switch may stay silent (no result, no status reply) before a request
    /// fails ([`crate::AllreduceError::NoSwitch`]; with peers, recovered from them).
    pub give_up: Duration,
    /// How long a request waits while the switch answers that it waits for other members
    /// (a slow rank: a checkpoint, an evaluation) before it fails naming them
    /// ([`crate::AllreduceError::Timeout`]); as NCCL's and Gloo's, minutes by default.
    pub collective_timeout: Duration,
    /// Test option: send segments out of order (each burst of sends is shuffled).
    pub reorder: bool,
    /// Send bursts of segments with UDP GSO (one system call for up to 18 full segments)
    /// instead of one datagram per call.
    pub gso: bool,
    /// Receive with UDP GRO: results that arrive together are read with one call.
    pub gro: bool,
    /// Receive results with AF_XDP (`xagg_host` steers them into posted buffers) instead of
    /// the UDP socket: the object holding `xagg_host` (a binary's `xagg_objects::HOST`). The
    /// worker attaches it to the interface holding its address, which must carry no other
    /// XDP program. Needs the `afxdp` feature.
    pub afxdp: Option<xagg_linux::XdpObject>,
    /// How long a worker waiting on results polls for them, yielding the CPU in between,
    /// before it sleeps: waking a sleeping process costs tens of µs, more than a small
    /// allreduce's round trip or the gap between two bursts of results of a large one.
    pub spin: Duration,
    /// Message id of the first allreduce; later ones count up. Every member of a job must
    /// use the same ids, and a job's ids must grow (ids wrap by serial-number arithmetic).
    /// `None`: learned from the switch ([`crate::Worker::sync`]) — the message in progress
    /// on the job, or the one after the newest.
    pub first_message: Option<u32>,
    /// How float sums travel ([`Float`]): the fast lane (one exponent per segment, a bound
    /// on the error) or the exact one (the sum of exactly the inputs, the same bits
    /// whatever the order; twice f32's bytes). Every member of a job must use the same:
    /// the switch refuses a contribution in the other lane (`drop_bad_op`).
    pub float: Float,
    /// The daemon this member joined its job through (`None`: a job added by hand), for
    /// what a refusal means: a joined job gone from the switch was removed by that daemon.
    pub joined_through: Option<std::net::SocketAddr>,
}

impl WorkerParams {
    /// Member `member` of job `job` of `shape`, reducing i32 sums, with the library's
    /// defaults for everything else.
    pub fn new(
        switch: SocketAddrV4,
        bind: SocketAddrV4,
        job: u32,
        member: u8,
        shape: JobShape,
    ) -> Self {
        Self {
            switch,
            bind,
            job,
            member,
            op: Op::Sum,
            dtype: DType::I32,
            shape,
            ranks: None,
            rank: None,
            places: None,
            path: crate::Path::Switch,
            path_why: None,
            switch_ports: 1,
            timeout: Duration::from_millis(20),
            min_timeout: MIN_TIMEOUT,
            max_timeout: Duration::from_millis(500),
            give_up: Duration::from_secs(10),
            collective_timeout: COLLECTIVE_TIMEOUT,
            reorder: false,
            gso: true,
            gro: true,
            afxdp: None,
            spin: Duration::from_micros(100),
            first_message: None,
            float: Float::Fast,
            joined_through: None,
        }
    }

    /// Parameters from the environment, as a launcher sets them for each rank:
    /// `XAGG_SWITCH` (the switch's IPv4 address, `:port` optional), `XAGG_BIND` (this
    /// member's IPv4 address and UDP port, as registered in the job), `XAGG_JOB`,
    /// `XAGG_MEMBER` (this member's index), `XAGG_MEMBERS`, and optionally `XAGG_SLOTS`
    /// (default 128), `XAGG_SEGMENT_BYTES` (default: the most a packet carries) and
    /// `XAGG_GIVE_UP_MS` (default 10000).
    pub fn from_env() -> Result<Self, AllreduceError> {
        fn var<T: std::str::FromStr>(name: &str, example: &str) -> Result<T, AllreduceError> {
            let v = std::env::var(name).map_err(|_| {
                AllreduceError::Invalid(format!("{name} is not set: e.g. {name}={example}"))
            })?;
            v.trim().parse().map_err(|_| {
                AllreduceError::Invalid(format!("{name}={v} is not valid: e.g. {name}={example}"))
            })
        }
        fn optional<T: std::str::FromStr>(
            name: &str,
            example: &str,
        ) -> Result<Option<T>, AllreduceError> {
            match std::env::var_os(name) {
                None => Ok(None),
                Some(_) => var(name, example).map(Some),
            }
        }
        let switch = std::env::var("XAGG_SWITCH").unwrap_or_default();
        let switch = match switch.parse::<SocketAddrV4>() {
            Ok(a) => a,
            Err(_) => SocketAddrV4::new(var("XAGG_SWITCH", "10.77.0.1")?, wire::DEFAULT_PORT),
        };
        let members: usize = var("XAGG_MEMBERS", "4")?;
        let slots = optional("XAGG_SLOTS", "128")?.unwrap_or(128);
        let shape = match optional("XAGG_SEGMENT_BYTES", "3440")? {
            Some(bytes) => JobShape::new(members, slots, bytes),
            None => JobShape::full(members, slots),
        }
        .map_err(|e| AllreduceError::Invalid(format!("the job's shape from XAGG_*: {e}")))?;
        let mut p = Self::new(
            switch,
            var("XAGG_BIND", "10.77.0.11:47801")?,
            var("XAGG_JOB", "1")?,
            var("XAGG_MEMBER", "0")?,
            shape,
        );
        if let Some(ms) = optional::<u64>("XAGG_GIVE_UP_MS", "10000")? {
            p.give_up = Duration::from_millis(ms);
        }
        if let Some(f) = optional::<Float>("XAGG_FLOAT", "exact")? {
            p.float = f;
        }
        Ok(p)
    }

    /// The wire lane of the job's op and type, checked against the shape: what every
    /// segment's payload is made of.
    pub fn lane(&self) -> Result<Lane, AllreduceError> {
        let lane = wire::lane_in(self.op, self.dtype, self.float).ok_or_else(|| {
            AllreduceError::Invalid(format!(
                "{} over {} is not supported (floats take sum, min, max, avg)",
                self.op, self.dtype
            ))
        })?;
        self.shape
            .segment_elements(lane)
            .map_err(|e| AllreduceError::Invalid(format!("segment of the job: {e}")))?;
        if usize::from(self.member) >= self.shape.members() {
            return Err(AllreduceError::Invalid(format!(
                "member {} of a job of {} members: member indices are 0..{}",
                self.member,
                self.shape.members(),
                self.shape.members()
            )));
        }
        let ranks = self.ranks();
        if ranks < self.shape.members() || ranks > crate::codec::MAX_RANKS {
            return Err(AllreduceError::Invalid(format!(
                "{ranks} ranks in a job of {} members here: a job has at least its members and at most {} ranks",
                self.shape.members(),
                crate::codec::MAX_RANKS
            )));
        }
        if let Some(rank) = self.rank.filter(|&r| r >= ranks) {
            return Err(AllreduceError::Invalid(format!(
                "rank {rank} of a job of {ranks} ranks: ranks are 0 to {}",
                ranks.saturating_sub(1)
            )));
        }
        Ok(lane)
    }

    /// Ranks in the whole job ([`WorkerParams::ranks`], or the members).
    pub fn ranks(&self) -> usize {
        self.ranks.unwrap_or(self.shape.members())
    }

    /// This member's rank in the whole job ([`WorkerParams::rank`], or its member index).
    pub fn rank_in_job(&self) -> usize {
        self.rank.unwrap_or(usize::from(self.member))
    }

    /// This member as its messages name it: its member index in a flat job, else its rank
    /// and its member index where it contributes (two ranks on two hosts may share one).
    pub fn who(&self) -> String {
        match self.rank {
            Some(rank) if self.ranks.is_some() => {
                format!("rank {rank} (member {} at its host)", self.member)
            }
            _ => format!("member {}", self.member),
        }
    }

    /// The places of the job's ranks, where the collectives take the levels by them: a
    /// tree of hosts under the top, one place per rank, this member's its own.
    pub fn levels_by_place(&self) -> Option<&[Place]> {
        let places = self.places.as_deref()?;
        let me = places.get(self.rank?)?;
        (self.path != crate::Path::Ring && places.len() == self.ranks() && me.member == self.member)
            .then_some(places)
    }

    /// The root `root` (a rank) of a segment of `collective` as this member's aggregation
    /// point knows it, and as the point above it does (`relay`; 0 for a flat job or an
    /// allreduce): behind a host level its member index there or
    /// [`wire::ROOT_ELSEWHERE`], and its host's index at the top (a gather's marked
    /// [`wire::ROOT_HOST`]: the host's other ranks need the data too). Also whether this
    /// member is a gather's rank beside its root on their host, which sends room for the
    /// root's data: the host's partial up is the last of its ranks' contributions, which
    /// must hold it.
    pub fn wire_root(&self, collective: Collective, root: u8) -> (u8, u8, bool) {
        let places = match self.levels_by_place() {
            Some(places) if collective != Collective::Allreduce => places,
            _ => return (root, 0, false),
        };
        let gathers = collective.gathers();
        let (at, me) = (places[usize::from(root)], places[self.rank_in_job()]);
        let here = at.host == me.host;
        let above = if here {
            at.member
        } else {
            wire::ROOT_ELSEWHERE
        };
        let relay = at.host | if gathers { wire::ROOT_HOST } else { 0 };
        (above, relay, gathers && here && at.member != self.member)
    }
}
