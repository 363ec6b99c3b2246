//! Labs of aggregation trees: every aggregation point (a switch, or a host reducing its
//! own ranks) is a network namespace with a bridge of its ports and its own `xaggd`; every
//! rank is a namespace behind its host, like a container behind its host's veth.
//!
//! ```text
//!   {p}-r0: eth0 10.77.1.10 ─veth─ p0 ┐
//!   {p}-r1: eth0 10.77.1.11 ─veth─ p1 ├ br0 10.77.0.2 ({p}-a1, a host) up0 ─veth─ p0 ┐
//!   {p}-r2: ...                    p0 ┐                                              ├ br0 10.77.0.1 ({p}-a0, the switch)
//!   {p}-r3: ...                    p1 ├ br0 10.77.0.3 ({p}-a2, a host) up0 ─veth─ p1 ┘
//! ```
//! One layer-2 network (10.77.0.0/16) spans the bridges; the XDP programs take every
//! collective packet before the bridges see it. Each point's job names its children as
//! members and (below the root) its parent; ranks address their host. Every port that a
//! redirect or `XDP_TX` enters has an XDP program on its peer (the child's `up0`, the
//! rank's `xagg_host`). Everything is removed on drop.

use std::{collections::BTreeMap, net::Ipv4Addr, net::SocketAddrV4, path::PathBuf};

use anyhow::{bail, Context, Result};
use xagg_api::{JobSpec, MemberSpec, Neighbour, ParentSpec, Request, Response, RingSpec};
use xagg_common::{wire::DEFAULT_PORT, JobShape};
use xagg_daemon::config::{Config, DaemonSection, SwitchSection};
use xagg_worker::{data::CollectiveCase, Buffer, Collective, Report, Worker, WorkerParams};

use crate::{
    lab::{in_netns, ip, MTU, WORKER_PORT},
    switch::Daemon,
};

/// The lab topologies with aggregation below the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// `hosts` hosts of `ranks` ranks each under one switch.
    Hosts { hosts: usize, ranks: usize },
    /// A spine over `leaves` leaf switches, each over `hosts` hosts of `ranks` ranks.
    Tree {
        leaves: usize,
        hosts: usize,
        ranks: usize,
    },
    /// `hosts` hosts of `ranks` ranks each in a ring, on a plain bridge (no aggregating
    /// switch).
    Ring { hosts: usize, ranks: usize },
    /// `hosts` hosts of `ranks` ranks under one switch, and `direct` ranks on the switch's
    /// own ports beside them (processes a host's XDP cannot see join the switch directly).
    Mixed {
        hosts: usize,
        ranks: usize,
        direct: usize,
    },
}

impl Topology {
    /// Ranks in all.
    pub fn ranks(self) -> usize {
        match self {
            Self::Hosts { hosts, ranks } | Self::Ring { hosts, ranks } => hosts * ranks,
            Self::Mixed {
                hosts,
                ranks,
                direct,
            } => hosts * ranks + direct,
            Self::Tree {
                leaves,
                hosts,
                ranks,
            } => leaves * hosts * ranks,
        }
    }
}

/// What an aggregation point's member is.
#[derive(Clone, Copy, Debug)]
pub enum Child {
    Point(usize),
    Rank(usize),
}

/// An aggregation point: its namespace, address, children (its job's members, in member
/// order) and, below the root, its parent and its member index there.
pub struct Point {
    pub ns: String,
    pub ip: Ipv4Addr,
    pub children: Vec<Child>,
    pub parent: Option<(usize, u8)>,
    /// Whether an `xaggd` aggregates here (not for the ring's plain bridge).
    pub aggregates: bool,
    pub daemon: Option<Daemon>,
    pub dir: PathBuf,
    pub pin: PathBuf,
}

impl Point {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("xaggd.sock")
    }

    /// Where this point's daemon listens for joins, when joinable.
    pub fn listener(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, JOIN_PORT)
    }

    /// The job's shape as this point's ranks see it: its members, `slots` slots,
    /// segments of `segment` i32.
    pub fn shape(&self, segment: usize, slots: usize) -> Result<JobShape> {
        Ok(JobShape::with_elements(
            self.children.len(),
            slots,
            segment,
            xagg_common::wire::Lane::I32,
        )?)
    }

    pub fn level(&self, points: &[Point]) -> usize {
        match self.parent {
            None => 0,
            Some((p, _)) => points[p].level(points) + 1,
        }
    }
}

/// A rank: its namespace, address, host (a point) and member index there.
pub struct Rank {
    pub ns: String,
    pub ip: Ipv4Addr,
    pub host: usize,
    pub local: u8,
}

pub struct TreeLab {
    pub prefix: String,
    pub topology: Topology,
    /// Every link's MTU.
    pub mtu: usize,
    pub points: Vec<Point>,
    pub ranks: Vec<Rank>,
    /// The job [`TreeLab::add_job`] added: its id, segment length and slots.
    pub job: (u32, usize, usize),
    /// `xagg_host` on every rank's interface and the plain bridge's ports; dropping
    /// detaches.
    rank_programs: Vec<crate::lab::HostEnd>,
}

/// The port of a point facing its child `k`.
pub fn child_port(k: usize) -> String {
    format!("p{k}")
}

/// A point's port facing its parent.
pub const UPLINK: &str = "up0";

/// Where each point's daemon listens for joins (at the point's address).
pub const JOIN_PORT: u16 = 47900;

/// How long a host waits for its parent's answer before its job goes round the ring.
pub const RING_AFTER_MS: u64 = 2000;

impl TreeLab {
    /// Builds the namespaces and links of `topology` (removing any leftover lab of this
    /// prefix first), at the default [`MTU`], with `xagg_host` on the ranks' ends (`xagg host
    /// attach`); no daemon runs yet.
    pub fn create(prefix: &str, topology: Topology) -> Result<Self> {
        Self::with_mtu(prefix, topology, MTU)
    }

    /// The same with every link at `mtu`.
    pub fn with_mtu(prefix: &str, topology: Topology, mtu: usize) -> Result<Self> {
        crate::lab::check_mtu(mtu)?;
        destroy(prefix);
        let mut lab = TreeLab {
            prefix: prefix.into(),
            topology,
            mtu,
            points: Vec::new(),
            ranks: Vec::new(),
            job: (0, 0, 0),
            rank_programs: Vec::new(),
        };
        let root = lab.add_point(None)?;
        match topology {
            Topology::Ring { hosts, ranks } => {
                lab.points[root].aggregates = false;
                lab.add_hosts(root, hosts, ranks)?;
            }
            Topology::Hosts { hosts, ranks } => lab.add_hosts(root, hosts, ranks)?,
            Topology::Mixed {
                hosts,
                ranks,
                direct,
            } => {
                lab.add_hosts(root, hosts, ranks)?;
                for _ in 0..direct {
                    lab.add_rank(root)?;
                }
            }
            Topology::Tree {
                leaves,
                hosts,
                ranks,
            } => {
                for _ in 0..leaves {
                    let l = lab.add_point(Some(root))?;
                    lab.add_hosts(l, hosts, ranks)?;
                }
            }
        }
        for p in &lab.points {
            ip(&["-n", &p.ns, "link", "set", "br0", "up"])?;
        }
        lab.attach_ranks()?;
        Ok(lab)
    }

    /// `hosts` hosts of `ranks` ranks each under point `parent`.
    fn add_hosts(&mut self, parent: usize, hosts: usize, ranks: usize) -> Result<()> {
        for _ in 0..hosts {
            let h = self.add_point(Some(parent))?;
            for _ in 0..ranks {
                self.add_rank(h)?;
            }
        }
        Ok(())
    }

    fn add_point(&mut self, parent: Option<usize>) -> Result<usize> {
        let i = self.points.len();
        let ns = format!("{}-a{i}", self.prefix);
        let addr = Ipv4Addr::new(10, 77, 0, 1 + i as u8);
        let mtu = self.mtu.to_string();
        ip(&["netns", "add", &ns])?;
        ip(&[
            "-n", &ns, "link", "add", "br0", "mtu", &mtu, "type", "bridge",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/16"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let parent = match parent {
            None => None,
            Some(p) => {
                let k = self.points[p].children.len();
                let pns = self.points[p].ns.clone();
                let port = child_port(k);
                ip(&[
                    "link", "add", &port, "netns", &pns, "mtu", &mtu, "type", "veth", "peer",
                    "name", UPLINK, "netns", &ns, "mtu", &mtu,
                ])?;
                ip(&["-n", &pns, "link", "set", &port, "master", "br0", "up"])?;
                ip(&["-n", &ns, "link", "set", UPLINK, "master", "br0", "up"])?;
                self.points[p].children.push(Child::Point(i));
                Some((p, k as u8))
            }
        };
        let dir = std::env::temp_dir()
            .join(format!("xagg-{}", self.prefix))
            .join(format!("a{i}"));
        std::fs::create_dir_all(&dir)?;
        self.points.push(Point {
            ns,
            ip: addr,
            children: Vec::new(),
            parent,
            aggregates: true,
            daemon: None,
            dir,
            pin: PathBuf::from(format!("/sys/fs/bpf/xagg-{}-a{i}", self.prefix)),
        });
        Ok(i)
    }

    fn add_rank(&mut self, host: usize) -> Result<()> {
        let r = self.ranks.len();
        let ns = format!("{}-r{r}", self.prefix);
        let addr = Ipv4Addr::new(10, 77, 1, 10 + r as u8);
        let mtu = self.mtu.to_string();
        let k = self.points[host].children.len();
        let hns = self.points[host].ns.clone();
        let port = child_port(k);
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &port, "netns", &hns, "mtu", &mtu, "type", "veth", "peer", "name",
            "eth0", "netns", &ns, "mtu", &mtu,
        ])?;
        ip(&["-n", &hns, "link", "set", &port, "master", "br0", "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/16"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        self.points[host].children.push(Child::Rank(r));
        self.ranks.push(Rank {
            ns,
            ip: addr,
            host,
            local: k as u8,
        });
        Ok(())
    }

    /// `xagg_host` on every rank's eth0 and on the ports of a plain bridge (the ring's):
    /// a frame redirected into a veth is dropped unless its peer runs an XDP program.
    fn attach_ranks(&mut self) -> Result<()> {
        let mut ends: Vec<(String, String)> = self
            .ranks
            .iter()
            .map(|r| (r.ns.clone(), "eth0".into()))
            .collect();
        for p in self.points.iter().filter(|p| !p.aggregates) {
            ends.extend((0..p.children.len()).map(|k| (p.ns.clone(), child_port(k))));
        }
        for (ns, dev) in ends {
            let end = crate::lab::HostEnd::attach(&ns, &dev)?;
            self.rank_programs.push(end);
        }
        Ok(())
    }

    /// Starts every point's daemon: its ports are its children's and its uplink.
    pub fn start_daemons(&mut self) -> Result<()> {
        self.start_daemons_with(false)
    }

    /// [`Self::start_daemons`] with every daemon listening for joins at its address, port
    /// [`JOIN_PORT`], taking the lab's credential, and naming its parent's daemon in its
    /// configuration: ranks join jobs by themselves, hosts join their parents.
    pub fn start_joinable(&mut self) -> Result<()> {
        self.start_daemons_with(true)
    }

    fn start_daemons_with(&mut self, joinable: bool) -> Result<()> {
        let key_file = std::env::temp_dir()
            .join(format!("xagg-{}", self.prefix))
            .join("lab.key");
        std::fs::write(&key_file, crate::switch::CREDENTIAL.1)?;
        // A parent's listener, where an aggregating point is above (not the ring's bridge).
        let listeners: Vec<Option<std::net::SocketAddr>> = self
            .points
            .iter()
            .map(|p| p.aggregates.then(|| p.listener().into()))
            .collect();
        for p in self.points.iter_mut().filter(|p| p.aggregates) {
            let _ = xagg_daemon::dataplane::unpin(&p.pin);
            let mut ports: Vec<String> = (0..p.children.len()).map(child_port).collect();
            if p.parent.is_some() {
                ports.push(UPLINK.into());
            }
            let cfg = Config {
                switch: SwitchSection {
                    ports,
                    address: p.ip,
                    udp_port: DEFAULT_PORT,
                    mac: None,
                    xdp_mode: "native".into(),
                    netns: Some(p.ns.clone()),
                    steer_cpus: None,
                    udp_ports: 1,
                },
                daemon: DaemonSection {
                    socket: p.socket(),
                    pin_path: p.pin.clone(),
                    detach_on_exit: false,
                    state_dir: p.dir.join("state"),
                    ..DaemonSection::default()
                },
                jobs: Vec::new(),
                credentials: Vec::new(),
                parent: None,
                host_ends: Vec::new(),
            };
            let mut cfg = cfg;
            if joinable {
                cfg.daemon.listen = Some(p.listener().into());
                cfg.credentials
                    .push(xagg_daemon::config::CredentialSection {
                        name: crate::switch::CREDENTIAL.0.into(),
                        key_file: key_file.clone(),
                        slot_quota: 4096,
                    });
                cfg.parent = p.parent.map(|(q, _)| xagg_daemon::config::ParentSection {
                    interface: UPLINK.into(),
                    daemon: listeners[q],
                    credential: Some(crate::switch::CREDENTIAL.0.into()),
                    key_file: Some(key_file.clone()),
                    ring_after_ms: RING_AFTER_MS,
                });
            }
            let config = p.dir.join("xaggd.toml");
            std::fs::write(&config, cfg.to_toml())?;
            let log = p.dir.join("xaggd.log");
            let _ = std::fs::remove_file(&log);
            p.daemon = Some(Daemon::start(&config, &log, &p.socket())?);
        }
        Ok(())
    }

    fn mac(ns: &str, dev: &str) -> Result<String> {
        Ok(xagg_linux::iface::fmt_mac(&in_netns(ns, || {
            Ok(xagg_linux::iface::mac(dev)?)
        })?))
    }

    /// The job `id` (sum of i32, `segment` elements, `slots` slots) at every point: each
    /// point's members are its children, each point below the root names its parent.
    pub fn add_job(&mut self, id: u32, segment: u16, slots: u32) -> Result<()> {
        self.job = (id, segment.into(), slots as usize);
        for (i, p) in self.points.iter().enumerate() {
            if !p.aggregates {
                continue;
            }
            let members = p
                .children
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let (mac, addr) = match *c {
                        Child::Point(q) => (
                            Self::mac(&self.points[q].ns, "br0")?,
                            SocketAddrV4::new(self.points[q].ip, DEFAULT_PORT),
                        ),
                        Child::Rank(r) => (
                            Self::mac(&self.ranks[r].ns, "eth0")?,
                            SocketAddrV4::new(self.ranks[r].ip, WORKER_PORT),
                        ),
                    };
                    Ok(MemberSpec {
                        interface: child_port(k),
                        mac,
                        addr,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let (parent, ring) = match p.parent {
                None => (None, None),
                Some((q, _)) if !self.points[q].aggregates => (None, Some(self.ring_spec(i)?)),
                Some((q, member)) => (
                    Some(ParentSpec {
                        interface: UPLINK.into(),
                        mac: Self::mac(&self.points[q].ns, "br0")?,
                        addr: SocketAddrV4::new(self.points[q].ip, DEFAULT_PORT),
                        job: id,
                        member,
                    }),
                    None,
                ),
            };
            let spec = JobSpec {
                id,
                op: xagg_common::Op::Sum,
                dtype: xagg_common::DType::I32,
                segment,
                slots,
                members,
                slot_base: None,
                parent,
                ring,
            };
            match xagg_api::call(&p.socket(), &Request::AddJob { job: spec })? {
                Response::Job { .. } => {}
                r => bail!("adding job {id} at point {i} ({}): {r:?}", p.ns),
            }
        }
        Ok(())
    }

    /// Host `i`'s place in the ring of all hosts (the points under the plain bridge), in
    /// host order.
    fn ring_spec(&self, i: usize) -> Result<RingSpec> {
        let hosts: Vec<usize> = (0..self.points.len())
            .filter(|&q| self.points[q].parent.is_some())
            .collect();
        let h = hosts.len();
        let at = hosts.iter().position(|&q| q == i).context("a ring host")?;
        let neighbour = |q: usize, member: usize| -> Result<Neighbour> {
            Ok(Neighbour {
                mac: Self::mac(&self.points[q].ns, "br0")?,
                addr: SocketAddrV4::new(self.points[q].ip, DEFAULT_PORT),
                member: member as u8,
                // Every point of the lab numbers the job alike.
                job: None,
            })
        };
        let successor = hosts[(at + 1) % h];
        Ok(RingSpec {
            interface: UPLINK.into(),
            size: h as u8,
            position: at as u8,
            predecessor: neighbour(hosts[(at + h - 1) % h], 0)?,
            // Its predecessor's member index there is after its ranks.
            successor: neighbour(successor, self.points[successor].children.len())?,
        })
    }

    /// Point `i`'s daemon API.
    pub fn api(&self, i: usize, req: &Request) -> Result<Response> {
        Ok(xagg_api::call(&self.points[i].socket(), req)?)
    }

    /// Adds job `id` by hand at point `i`: `slots` slots, one made-up member behind its
    /// first port. It holds the point's slots and the job index `id` names, so jobs that
    /// join later are numbered differently here than at the other points.
    pub fn occupy(&self, i: usize, id: u32, slots: u32) -> Result<()> {
        let job = JobSpec {
            id,
            op: xagg_common::Op::Sum,
            dtype: xagg_common::DType::I32,
            segment: 860,
            slots,
            members: vec![MemberSpec {
                interface: child_port(0),
                mac: "02:00:00:00:09:09".into(),
                addr: "10.77.9.9:1".parse()?,
            }],
            slot_base: None,
            parent: None,
            ring: None,
        };
        match self.api(i, &Request::AddJob { job })? {
            Response::Job { .. } => Ok(()),
            r => bail!("adding job {id} at point {i}: {r:?}"),
        }
    }

    /// Fault injection at every point of level `level` (0 = the root): contributions
    /// (from ranks, or partials from the level below) and result copies (to ranks, or to
    /// the level below) dropped with these probabilities.
    pub fn inject(&self, level: usize, drop_contribution: f64, drop_result: f64) -> Result<()> {
        for (i, p) in self.points.iter().enumerate() {
            if p.aggregates && p.level(&self.points) == level {
                let req = Request::Inject {
                    drop_contribution,
                    drop_result,
                };
                match self.api(i, &req)? {
                    Response::Ok => {}
                    r => bail!("fault injection at point {i}: {r:?}"),
                }
            }
        }
        Ok(())
    }

    /// Every point's counters, by point.
    pub fn counters(&self) -> Vec<BTreeMap<String, u64>> {
        self.points
            .iter()
            .map(|p| match xagg_api::call(&p.socket(), &Request::Counters) {
                Ok(Response::Counters { counters }) => counters,
                _ => BTreeMap::new(),
            })
            .collect()
    }

    /// The ranks' settings here. More ranks than cores: no busy polling (it would starve
    /// the others for milliseconds), and a first timeout as many times longer as ranks
    /// share a core — the first results wait behind every rank's first window, and must
    /// not pass for losses before a round trip is measured. In a ring a round crosses
    /// 2(h-1) hops: its timeouts, first and least, at least 2h times as long.
    pub fn tune(&self, p: &mut WorkerParams) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut first = 1;
        if self.ranks.len() >= cores {
            p.spin = std::time::Duration::ZERO;
            first = self.ranks.len().div_ceil(cores);
        }
        if let Topology::Ring { hosts, .. } = self.topology {
            let ring = 2 * hosts as u32;
            p.min_timeout *= ring;
            first = first.max(ring as usize);
        }
        p.timeout *= first as u32;
    }

    /// One allreduce (message `message`) of the job of `elems` i32 (sum) on every rank at
    /// once: rank r fills its buffer as member r of `N` would, and every result must be the
    /// sum over all N ranks. Each rank's parameters are [`TreeLab::tune`]d, then adjusted
    /// by `tweak`.
    pub fn allreduce(
        &self,
        message: u32,
        elems: usize,
        seed: u64,
        tweak: impl Fn(&mut WorkerParams) + Sync,
    ) -> Result<Vec<Report>> {
        let sum = self.exact_sum(elems, seed);
        self.on_ranks(
            |g, r, host| self.configured(message, g, r, host, &tweak),
            sum,
        )
    }

    /// One allreduce (message `message`) of `op` over `dtype` in float mode `float` on
    /// every rank at once, rank
    /// r starting from `inputs[r]` (the elements' bytes): every rank's result.
    pub fn allreduce_as(
        &self,
        message: u32,
        (op, dtype, float): (
            xagg_common::Op,
            xagg_common::DType,
            xagg_common::wire::Float,
        ),
        inputs: &[Vec<u8>],
    ) -> Result<Vec<Vec<u8>>> {
        self.on_ranks(
            |g, r, host| self.configured(message, g, r, host, &|p| p.float = float),
            |g, wk| {
                let mut buf = inputs[g].clone();
                wk.allreduce_bytes_as(op, dtype, &mut buf)?;
                Ok(buf)
            },
        )
    }

    /// `calls` — (collective, root, i32 elements of the message, data seed) — one after
    /// the other on every rank at once (messages from `first`), one worker per rank across
    /// them, each rank's result of each call checked ([`CollectiveCase`]): every rank's
    /// reports, in rank order.
    pub fn collectives(
        &self,
        first: u32,
        calls: &[(Collective, usize, usize, u64)],
    ) -> Result<Vec<Vec<Report>>> {
        let n = self.ranks.len();
        self.on_ranks(
            |g, r, host| self.configured(first, g, r, host, &|_| {}),
            |g, wk| {
                calls
                    .iter()
                    .map(|&(c, root, elems, seed)| {
                        let case = CollectiveCase::new(c, root, g, n, elems, seed);
                        let done = wk
                            .submit_collective(
                                c,
                                xagg_common::Op::Sum,
                                root,
                                case.input.map(Buffer::from),
                                Buffer::from(case.output),
                            )?
                            .wait();
                        let report = done.status.with_context(|| format!("{c} of {elems}"))?;
                        let got: Vec<i32> = done
                            .buffer
                            .into_vec()
                            .map_err(|_| anyhow::anyhow!("{c}: the output is not the i32 given"))?;
                        if let Some(i) = got.iter().zip(&case.expected).position(|(a, b)| a != b) {
                            bail!(
                                "{c} of {elems} (root {root}): element {i} is {} but must be {}",
                                got[i],
                                case.expected[i]
                            );
                        }
                        Ok(report)
                    })
                    .collect()
            },
        )
    }

    /// Runs `work` on every rank at once, each with its worker of the job
    /// [`TreeLab::add_job`] added (messages from `first`; its parameters adjusted by
    /// `tweak` with the rank): what each returned, in rank order.
    pub fn on_every_rank<T: Send>(
        &self,
        first: u32,
        tweak: impl Fn(usize, &mut WorkerParams) + Sync,
        work: impl Fn(usize, &Worker) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        self.on_ranks(
            |g, r, host| self.configured(first, g, r, host, &|p| tweak(g, p)),
            work,
        )
    }

    /// Every rank joins job `key` at its host's daemon by itself (stating the job's ranks
    /// and its own global rank), the hosts join their parents, then one allreduce of `elems`
    /// i32 (sum) runs, each result checked against the sum over all ranks; then each leaves.
    pub fn join_and_allreduce(
        &self,
        key: xagg_join::JobKey,
        (segment, slots): (usize, usize),
        elems: usize,
        seed: u64,
    ) -> Result<Vec<Report>> {
        let n = self.ranks.len();
        let secret = xagg_join::Secret([7; 32]);
        // Rank 0's host coordinates a ring, should the switch not take the job.
        let coordinator = self.points[self.ranks[0].host].listener();
        let cred: xagg_join::CredentialKey = crate::switch::CREDENTIAL
            .1
            .parse()
            .map_err(anyhow::Error::msg)?;
        let join = |g: usize, r: &Rank, host: &Point| -> Result<Worker> {
            let shape = host.shape(segment, slots)?;
            let params = xagg_worker::JoinParams {
                daemon: host.listener().into(),
                key,
                secret,
                rank: r.local,
                shape,
                bind: SocketAddrV4::new(r.ip, WORKER_PORT),
                credential: Some((crate::switch::CREDENTIAL.0.into(), cred)),
                timeout: std::time::Duration::from_secs(20),
                levels: Some(xagg_join::Levels {
                    ranks: n as u32,
                    first: g as u32,
                    weight: 1,
                    coordinator: Some(coordinator),
                    open: false,
                }),
            };
            Worker::join_with(params, |p| self.tune(p)).context("joining")
        };
        let sum = self.exact_sum(elems, seed);
        self.on_ranks(join, |g, wk| {
            let rep = sum(g, wk)?;
            let _ = wk.leave();
            Ok(rep)
        })
    }

    /// Rank `r`'s (rank `g` of the job's) worker of the job [`TreeLab::add_job`] added: its host as its aggregation
    /// point, all ranks as the job's ranks, [`Self::tune`]d, then adjusted by `tweak`.
    fn configured(
        &self,
        message: u32,
        g: usize,
        r: &Rank,
        host: &Point,
        tweak: &(impl Fn(&mut WorkerParams) + Sync),
    ) -> Result<Worker> {
        let (job, segment, slots) = self.job;
        let shape = host.shape(segment, slots)?;
        let mut p = WorkerParams::new(
            SocketAddrV4::new(host.ip, DEFAULT_PORT),
            SocketAddrV4::new(r.ip, WORKER_PORT),
            job,
            r.local,
            shape,
        );
        p.ranks = Some(self.ranks.len());
        p.rank = Some(g);
        p.places = self.places();
        p.first_message = Some(message);
        self.tune(&mut p);
        tweak(&mut p);
        Ok(Worker::new(p)?)
    }

    /// Every rank's place, as a join learns it, where the ranks' hosts are members of an
    /// aggregating top (not a ring's bridge, nor a lower switch): the host's member index
    /// there and the rank's at its host.
    pub fn places(&self) -> Option<Vec<xagg_worker::Place>> {
        self.ranks
            .iter()
            .map(|r| match self.points[r.host].parent {
                Some((q, host)) if self.points[q].parent.is_none() && self.points[q].aggregates => {
                    Some(xagg_worker::Place {
                        host,
                        member: r.local,
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// An allreduce of `elems` i32 for rank g: filled as member g of all the ranks would,
    /// its result checked against the sum over all of them.
    fn exact_sum(
        &self,
        elems: usize,
        seed: u64,
    ) -> impl Fn(usize, &Worker) -> Result<Report> + Sync {
        let n = self.ranks.len();
        let expected = xagg_worker::data::expected_sum(seed, n as u32, elems);
        move |g, wk| {
            let mut buf = vec![0i32; elems];
            xagg_worker::data::fill(seed, g as u32, &mut buf);
            let rep = wk.allreduce(&mut buf)?;
            if let Some(i) = buf.iter().zip(expected.iter()).position(|(a, b)| a != b) {
                bail!(
                    "element {i} is {} but the sum over {n} ranks is {}",
                    buf[i],
                    expected[i]
                );
            }
            Ok(rep)
        }
    }

    /// Runs `work` on every rank at once, each on a thread in its namespace with the
    /// worker `worker` makes for it: what each returned, in rank order.
    fn on_ranks<T: Send>(
        &self,
        worker: impl Fn(usize, &Rank, &Point) -> Result<Worker> + Sync,
        work: impl Fn(usize, &Worker) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter()
                .enumerate()
                .map(|(g, r)| {
                    let (worker, work) = (&worker, &work);
                    s.spawn(move || -> Result<T> {
                        xagg_linux::iface::enter_netns(&r.ns)?;
                        let wk = worker(g, r, &self.points[r.host]).and_then(|wk| work(g, &wk));
                        wk.with_context(|| format!("rank {g} (in {})", r.ns))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| bail!("rank thread panicked")))
                .collect()
        })
    }

    /// Bytes each link has carried so far, (up, down) from the child's side: every
    /// rank's eth0 and every point's uplink, named `rank r` and `point i (level l)`.
    pub fn link_bytes(&self) -> Result<Vec<(String, u64, u64)>> {
        let mut out = Vec::new();
        for (r, rank) in self.ranks.iter().enumerate() {
            let (tx, rx) = stats(&rank.ns, "eth0")?;
            out.push((format!("rank {r} -> point {}", rank.host), tx, rx));
        }
        for (i, p) in self.points.iter().enumerate() {
            if let Some((q, _)) = p.parent {
                let (tx, rx) = stats(&p.ns, UPLINK)?;
                out.push((format!("point {i} -> point {q}"), tx, rx));
            }
        }
        Ok(out)
    }
}

/// An interface's (tx, rx) byte counters.
fn stats(ns: &str, dev: &str) -> Result<(u64, u64)> {
    let s = crate::lab::link_stats(ns, dev)?;
    Ok((s.tx_bytes, s.rx_bytes))
}

impl Drop for TreeLab {
    fn drop(&mut self) {
        for p in self.points.iter_mut().filter(|p| p.aggregates) {
            p.daemon.take();
            crate::switch::remove_dataplane(&p.pin);
        }
        self.rank_programs.clear();
        destroy(&self.prefix);
    }
}

/// Removes the namespaces of the tree lab `prefix`. Idempotent.
pub fn destroy(prefix: &str) {
    crate::lab::remove_namespaces(prefix, &["a", "r"], &[]);
}
