//! Loading, attaching, pinning and adopting the XDP dataplane, and the map operations the
//! daemon performs on it. The dataplane's maps are the single source of truth: a restarted
//! daemon adopts the pinned maps and knows every job from them.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, DevMap, HashMap, Map, MapData, PerCpuArray, PerCpuValues, ProgramArray},
    programs::{links::FdLink, tc, SchedClassifier, TcAttachType, Xdp, XdpMode},
    Ebpf,
};
use log::{info, warn};
use serde::{Deserialize, Serialize};
use xagg_common::{
    counter::{job_row, member_row, JOB_ROW, MEMBER_AGAIN, MEMBER_NEW},
    job::{
        job_generation, job_id, job_index, members_of, probability_threshold, EgressKey, Faults,
        Hello, MemberAddr, SwitchConfig, EGRESS_SUCCESSOR, HELLO_TTL_NS, MAX_JOBS,
    },
    slot::{Fold, ShadowState, SlotImage, DELIVER, DELIVER_PROGRAM, MAX_SLOTS},
    Counter, Job, Role, LAYOUT_VERSION,
};
use xagg_sys::iface;

use crate::{
    config::{Config, XdpMode as Mode},
    job::{allocate_slots, JobError, JobSpec},
};

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("the XDP object was not built into this binary: run `cargo xtask build` (or `cargo xtask demo`) and rebuild")]
    NoObject,
    #[error("loading the XDP object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error(
        "attaching to {port}: {source} (try xdp_mode = \"generic\" if the driver lacks native XDP)"
    )]
    Attach {
        port: String,
        source: aya::programs::ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error(
        "pinning under {path}: {source} (is a bpffs mounted there? `mount -t bpf bpf /sys/fs/bpf`)"
    )]
    Pin {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{0}")]
    Job(#[from] JobError),
    #[error("job {0} already exists: remove it first (`xagg job remove {0}`)")]
    JobExists(u32),
    #[error("no job {0}")]
    NoJob(u32),
    #[error("job {id} needs {want} slots but the largest free range is smaller ({free} of {total} slots free in all): ask for fewer slots or remove a job")]
    NoSlots {
        id: u32,
        want: u32,
        free: u32,
        total: u32,
    },
    #[error("the pinned dataplane at {pin} was started with ports {pinned:?}, the configuration names {configured:?}: run `xagg detach --pin-path {pin}` (or `xaggd --reload --config FILE`) to replace it (running jobs are dropped), or restore the configuration")]
    PortsChanged {
        pin: PathBuf,
        pinned: Vec<String>,
        configured: Vec<String>,
    },
    #[error("the pinned dataplane at {pin} has map layout {pinned}, this build has layout {ours}: run `xaggd --reload --config FILE` (or `xagg detach --pin-path {pin}`, then start xaggd) to replace it with this build's (running jobs are dropped), or run the build that pinned it")]
    LayoutChanged {
        pin: PathBuf,
        pinned: u32,
        ours: u32,
    },
    #[error("{0}")]
    Other(String),
}

type Result<T, E = DataplaneError> = std::result::Result<T, E>;

/// Every map the daemon pins. `LAYOUT` holds [`LAYOUT_VERSION`]; dataplanes pinned before
/// it existed have layout 1.
const MAP_NAMES: [&str; 14] = [
    "JOBS",
    "EGRESS",
    "SLOTS",
    "SWITCH",
    "PORTS",
    "COUNTERS",
    "FAULTS",
    "LAYOUT",
    "HELLOS",
    "HELLO_COUNTS",
    "JOB_COUNTERS",
    "DROPS",
    "FOLDS",
    "PARENTS",
];

pub struct Dataplane {
    jobs: Array<MapData, Job>,
    egress: HashMap<MapData, EgressKey, u32>,
    slots: Array<MapData, SlotImage>,
    switch: Array<MapData, SwitchConfig>,
    faults: Array<MapData, Faults>,
    counters: PerCpuArray<MapData, u64>,
    /// The first sender of each drop reason since the daemon last took them.
    drops: Array<MapData, MemberAddr>,
    /// Per-job and per-member counters, a row per job index.
    job_counters: PerCpuArray<MapData, u64>,
    /// Joining members' hellos by token (the switch program fills it, each port up to its
    /// share).
    hellos: HashMap<MapData, u64, Hello>,
    /// Hellos waiting per port, which the sweep recounts.
    hello_counts: HashMap<MapData, u32, u32>,
    /// Inner-level jobs by their id at the parent: where the parent's results go.
    parents: HashMap<MapData, u32, u32>,
    /// The pin directory, when the dataplane outlives the daemon.
    pin: Option<PathBuf>,
    /// Links of an unpinned dataplane (XDP, and the fan-out's tc ingress): dropping them
    /// detaches the programs.
    _links: Vec<aya::programs::xdp::XdpLink>,
    _fanout_links: Vec<aya::programs::tc::SchedClassifierLink>,
    /// The fold programs' table: its entries live as long as a descriptor of it (or its pin).
    _folds: Option<ProgramArray<MapData>>,
    _ebpf: Option<Ebpf>,
    /// Whether the maps came from an earlier daemon's pins.
    pub adopted: bool,
    /// The switch's ports, in devmap order: a job's members must be behind them.
    ports: Vec<String>,
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> DataplaneError {
    move |source| DataplaneError::Map { name, source }
}

fn pin_err(
    path: &Path,
) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> DataplaneError + '_ {
    move |source| DataplaneError::Pin {
        path: path.to_owned(),
        source,
    }
}

impl Dataplane {
    /// Adopts the pinned dataplane if there is one (and `pin` is set), else loads and
    /// attaches a fresh one. Must run in the ports' network namespace.
    pub fn start(cfg: &Config, pinned: bool) -> Result<Self> {
        let pin = pinned.then(|| cfg.daemon.pin_path.clone());
        if let Some(dir) = &pin {
            if dir.join("maps/JOBS").exists() {
                let pinned = read_layout(dir)?;
                if pinned != LAYOUT_VERSION {
                    return Err(DataplaneError::LayoutChanged {
                        pin: dir.clone(),
                        pinned,
                        ours: LAYOUT_VERSION,
                    });
                }
                let mut dp = Self::adopt(dir)?;
                let pinned_ports = read_ports(dir)?;
                if pinned_ports != cfg.switch.ports {
                    return Err(DataplaneError::PortsChanged {
                        pin: dir.clone(),
                        pinned: pinned_ports,
                        configured: cfg.switch.ports.clone(),
                    });
                }
                dp.ports = pinned_ports;
                info!("adopted the pinned dataplane at {}", dir.display());
                dp.configure_switch(cfg)?;
                return Ok(dp);
            }
        }
        // A start that fails half-way leaves no pins behind, unless they were there.
        let fresh = pin.as_ref().is_some_and(|d| !d.exists());
        let loaded = Self::load(cfg, pin.clone());
        if let (Err(_), true, Some(dir)) = (&loaded, fresh, &pin) {
            let _ = unpin(dir);
        }
        loaded
    }

    fn load(cfg: &Config, pin: Option<PathBuf>) -> Result<Self> {
        if xagg_sys::object_missing().is_some() {
            return Err(DataplaneError::NoObject);
        }
        let mut ebpf = Ebpf::load(xagg_sys::EBPF_OBJECT)?;
        let mode = cfg.mode().map_err(DataplaneError::Other)?;

        let result: &mut Xdp = prog(&mut ebpf, "xagg_result")?;
        result.load().map_err(|source| DataplaneError::Program {
            name: "xagg_result",
            source,
        })?;
        let result_fd = result
            .fd()
            .map_err(|source| DataplaneError::Program {
                name: "xagg_result",
                source,
            })?
            .try_clone()
            .map_err(|e| DataplaneError::Other(format!("duplicating a program fd: {e}")))?;

        if let Some(dir) = &pin {
            for sub in ["maps", "links", "links/fanout"] {
                fs::create_dir_all(dir.join(sub)).map_err(|e| pin_err(dir)(Box::new(e)))?;
            }
        }
        let mut maps = BTreeMap::new();
        for name in MAP_NAMES {
            let map = ebpf
                .take_map(name)
                .ok_or_else(|| DataplaneError::Other(format!("object lacks map {name}")))?;
            if let Some(dir) = &pin {
                let path = dir.join("maps").join(name);
                map.pin(&path).map_err(|e| pin_err(&path)(Box::new(e)))?;
            }
            maps.insert(name, map);
        }
        let mut take = |name: &'static str| maps.remove(name).expect("taken above");
        let mut layout: Array<MapData, u32> =
            Array::try_from(take("LAYOUT")).map_err(map_err("LAYOUT"))?;
        layout
            .set(0, LAYOUT_VERSION, 0)
            .map_err(map_err("LAYOUT"))?;

        let mut ports: DevMap<MapData> =
            DevMap::try_from(take("PORTS")).map_err(map_err("PORTS"))?;
        for (i, port) in cfg.switch.ports.iter().enumerate() {
            let ifindex = iface::ifindex(port)
                .map_err(|e| DataplaneError::Other(format!("switch.ports[{i}]: {e:#}")))?;
            ports
                .set(i as u32, ifindex, Some(&result_fd), 0)
                .map_err(|e| DataplaneError::Other(format!("PORTS[{i}] = {port}: {e}")))?;
        }

        let mut folds: ProgramArray<MapData> =
            ProgramArray::try_from(take("FOLDS")).map_err(map_err("FOLDS"))?;
        load_folds(&mut ebpf, &mut folds)?;

        // The fan-out of multi-buffer results, on each port's tc ingress.
        let fanout: &mut SchedClassifier = ebpf
            .program_mut("xagg_fanout")
            .ok_or_else(|| DataplaneError::Other("object lacks program xagg_fanout".into()))?
            .try_into()
            .map_err(|source| DataplaneError::Program {
                name: "xagg_fanout",
                source,
            })?;
        fanout.load().map_err(|source| DataplaneError::Program {
            name: "xagg_fanout",
            source,
        })?;
        let mut fanout_links = Vec::new();
        let mut link_pins = Vec::new();
        for port in &cfg.switch.ports {
            // EEXIST: the port has its clsact qdisc already.
            let _ = tc::qdisc_add_clsact(port);
            let err = |source| DataplaneError::Attach {
                port: port.clone(),
                source,
            };
            let id = fanout.attach(port, TcAttachType::Ingress).map_err(err)?;
            let link = fanout.take_link(id).map_err(err)?;
            if pin.is_some() {
                let fd: FdLink = link.try_into().map_err(|e| {
                    DataplaneError::Other(format!(
                        "tc link on {port} is not a bpf_link, cannot pin it: {e}"
                    ))
                })?;
                link_pins.push((format!("fanout/{port}"), fd));
            } else {
                fanout_links.push(link);
            }
        }

        let switch: &mut Xdp = prog(&mut ebpf, "xagg_switch")?;
        switch.load().map_err(|source| DataplaneError::Program {
            name: "xagg_switch",
            source,
        })?;
        let mut links = Vec::new();
        for port in &cfg.switch.ports {
            let id = attach(switch, port, mode)?;
            let link = switch
                .take_link(id)
                .map_err(|source| DataplaneError::Program {
                    name: "xagg_switch",
                    source,
                })?;
            if pin.is_some() {
                let fd: FdLink = link.try_into().map_err(|e| {
                    DataplaneError::Other(format!(
                        "link on {port} is not a bpf_link, cannot pin it: {e}"
                    ))
                })?;
                link_pins.push((port.clone(), fd));
            } else {
                links.push(link);
            }
        }

        if let Some(dir) = &pin {
            for (port, fd) in link_pins {
                let path = dir.join("links").join(&port);
                fd.pin(&path).map_err(|e| pin_err(&path)(Box::new(e)))?;
            }
        }

        drop(ports);
        let mut dp = Self {
            jobs: Array::try_from(take("JOBS")).map_err(map_err("JOBS"))?,
            egress: HashMap::try_from(take("EGRESS")).map_err(map_err("EGRESS"))?,
            slots: Array::try_from(take("SLOTS")).map_err(map_err("SLOTS"))?,
            switch: Array::try_from(take("SWITCH")).map_err(map_err("SWITCH"))?,
            faults: Array::try_from(take("FAULTS")).map_err(map_err("FAULTS"))?,
            counters: PerCpuArray::try_from(take("COUNTERS")).map_err(map_err("COUNTERS"))?,
            hellos: HashMap::try_from(take("HELLOS")).map_err(map_err("HELLOS"))?,
            hello_counts: HashMap::try_from(take("HELLO_COUNTS"))
                .map_err(map_err("HELLO_COUNTS"))?,
            parents: HashMap::try_from(take("PARENTS")).map_err(map_err("PARENTS"))?,
            job_counters: PerCpuArray::try_from(take("JOB_COUNTERS"))
                .map_err(map_err("JOB_COUNTERS"))?,
            drops: Array::try_from(take("DROPS")).map_err(map_err("DROPS"))?,
            pin,
            _links: links,
            _fanout_links: fanout_links,
            _folds: Some(folds),
            _ebpf: Some(ebpf),
            adopted: false,
            ports: cfg.switch.ports.clone(),
        };
        dp.configure_switch(cfg)?;
        info!(
            "dataplane attached to {} ({})",
            cfg.switch.ports.join(", "),
            if dp.pin.is_some() {
                "pinned"
            } else {
                "detached on exit"
            }
        );
        Ok(dp)
    }

    fn adopt(dir: &Path) -> Result<Self> {
        let open = |name: &'static str| -> Result<Map> {
            let md = MapData::from_pin(dir.join("maps").join(name)).map_err(map_err(name))?;
            Map::from_map_data(md).map_err(map_err(name))
        };
        Ok(Self {
            jobs: Array::try_from(open("JOBS")?).map_err(map_err("JOBS"))?,
            egress: HashMap::try_from(open("EGRESS")?).map_err(map_err("EGRESS"))?,
            slots: Array::try_from(open("SLOTS")?).map_err(map_err("SLOTS"))?,
            switch: Array::try_from(open("SWITCH")?).map_err(map_err("SWITCH"))?,
            faults: Array::try_from(open("FAULTS")?).map_err(map_err("FAULTS"))?,
            counters: PerCpuArray::try_from(open("COUNTERS")?).map_err(map_err("COUNTERS"))?,
            hellos: HashMap::try_from(open("HELLOS")?).map_err(map_err("HELLOS"))?,
            hello_counts: HashMap::try_from(open("HELLO_COUNTS")?)
                .map_err(map_err("HELLO_COUNTS"))?,
            parents: HashMap::try_from(open("PARENTS")?).map_err(map_err("PARENTS"))?,
            job_counters: PerCpuArray::try_from(open("JOB_COUNTERS")?)
                .map_err(map_err("JOB_COUNTERS"))?,
            drops: Array::try_from(open("DROPS")?).map_err(map_err("DROPS"))?,
            pin: Some(dir.to_owned()),
            _links: Vec::new(),
            _fanout_links: Vec::new(),
            _folds: None,
            _ebpf: None,
            adopted: true,
            ports: Vec::new(),
        })
    }

    /// Writes the switch's address, port and MAC into the `SWITCH` map.
    fn configure_switch(&mut self, cfg: &Config) -> Result<()> {
        let mac = match &cfg.switch.mac {
            Some(m) => iface::parse_mac(m).map_err(DataplaneError::Other)?,
            None => {
                let holder = iface::holding(cfg.switch.address)
                    .map_err(|e| DataplaneError::Other(format!("{e:#}")))?
                    .ok_or_else(|| {
                        DataplaneError::Other(format!(
                            "switch.address {} is on no interface here: assign it to one (e.g. the bridge of the ports) or set switch.mac",
                            cfg.switch.address
                        ))
                    })?;
                iface::mac(&holder).map_err(|e| DataplaneError::Other(format!("{e:#}")))?
            }
        };
        let value = SwitchConfig {
            ip: cfg.switch.address.octets(),
            port: cfg.switch.udp_port.to_be_bytes(),
            mac,
        };
        self.switch.set(0, value, 0).map_err(map_err("SWITCH"))
    }

    /// The jobs by wire id: the entries of `JOBS` that have members.
    pub fn jobs(&self) -> Result<Vec<(u32, Job)>> {
        let mut v = Vec::new();
        for index in 0..MAX_JOBS as u32 {
            let j = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
            if j.members != 0 {
                v.push((job_id(index, j.generation), j));
            }
        }
        v.sort_by_key(|(id, _)| *id);
        Ok(v)
    }

    /// Job `id`: its index's entry, if that holds a job of the id's generation.
    fn job(&self, id: u32) -> Result<Job> {
        let index = job_index(id);
        if index >= MAX_JOBS as u32 {
            return Err(DataplaneError::NoJob(id));
        }
        let j = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
        if j.members == 0 || j.generation != job_generation(id) {
            return Err(DataplaneError::NoJob(id));
        }
        Ok(j)
    }

    pub fn add_job(&mut self, spec: &JobSpec) -> Result<JobSpec> {
        let index = job_index(spec.id);
        if index >= MAX_JOBS as u32 {
            return Err(JobError {
                field: "id".into(),
                problem: format!(
                    "{}: a job id is generation x 65536 + index, and the index ({index}) must be below {MAX_JOBS}",
                    spec.id
                ),
            }
            .into());
        }
        let held = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
        if held.members != 0 {
            let other = job_id(index, held.generation);
            if other == spec.id {
                return Err(DataplaneError::JobExists(spec.id));
            }
            return Err(JobError {
                field: "id".into(),
                problem: format!(
                    "{}: its index {index} is job {other}'s; choose an id with another index (id mod 65536)",
                    spec.id
                ),
            }
            .into());
        }
        // Validate before allocating so a bad spec reports its real problem.
        spec.to_job(0)?;
        let shape = spec.shape()?;
        for (i, m) in spec.members.iter().enumerate() {
            // A segment must fit the link: a full one is one IPv4 packet.
            let mtu = iface::mtu(&m.interface).unwrap_or(usize::MAX);
            let need = xagg_common::wire::ip_packet_len(shape.segment_bytes());
            if mtu < need {
                let lane = crate::job::lane(spec.op, spec.dtype).map_err(DataplaneError::Other)?;
                let fits = xagg_common::wire::payload_for_mtu(mtu) / lane.size();
                return Err(JobError {
                    field: "segment".into(),
                    problem: format!(
                        "{} elements make {need}-byte packets, but members[{i}]'s port {} has an MTU of {mtu}: choose a segment of at most {fits} elements, or raise the MTU",
                        spec.segment, m.interface
                    ),
                }
                .into());
            }
            if !self.ports.contains(&m.interface) {
                return Err(JobError {
                    field: format!("members[{i}].interface"),
                    problem: format!(
                        "`{}` is not a port of this switch (its ports: {}): name the port the member is behind",
                        m.interface,
                        self.ports.join(", ")
                    ),
                }
                .into());
            }
        }
        // An inner level's or a ring host's uplink, and the job id results carry on it.
        let uplink = match (&spec.parent, &spec.ring) {
            (Some(p), _) => Some(("parent", &p.interface, p.job)),
            (None, Some(r)) => Some(("ring", &r.interface, spec.id)),
            (None, None) => None,
        };
        if let Some((field, interface, upstream)) = uplink {
            if !self.ports.contains(interface) {
                return Err(JobError {
                    field: format!("{field}.interface"),
                    problem: format!(
                        "`{interface}` is not a port of this switch (its ports: {}): name the uplink",
                        self.ports.join(", ")
                    ),
                }
                .into());
            }
            if let Ok(other) = self.parents.get(&upstream, 0) {
                if self.job(other).is_ok() {
                    return Err(JobError {
                        field: format!("{field}.job"),
                        problem: format!(
                            "job {other} already takes the results of job {upstream} upstream: one job here per job there"
                        ),
                    }
                    .into());
                }
            }
        }
        let jobs = self.jobs()?;
        let used: Vec<(u32, u32)> = jobs
            .iter()
            .map(|(_, j)| (j.slot_base, j.slot_count))
            .collect();
        let base = allocate_slots(&used, spec.slots, MAX_SLOTS).ok_or_else(|| {
            let busy: u32 = used.iter().map(|(_, c)| c).sum();
            DataplaneError::NoSlots {
                id: spec.id,
                want: spec.slots,
                free: MAX_SLOTS - busy,
                total: MAX_SLOTS,
            }
        })?;
        let mut job = spec.to_job(base)?;
        job.generation = job_generation(spec.id);
        job.index = index as u8;
        // The index's row of counters, cleared of an earlier job's counts.
        self.clear_counter_row(index)?;
        self.reset_slots(base, spec.slots)?;
        // Ports are distinct within a job (checked by `to_job`): one member per port.
        for (idx, m) in job.member[..job.member_count()].iter().enumerate() {
            let key = EgressKey {
                job: spec.id,
                ifindex: m.ifindex,
            };
            self.egress
                .insert(key, idx as u32, 0)
                .map_err(map_err("EGRESS"))?;
        }
        if job.role == Role::Inner as u8 || job.role == Role::Ring as u8 {
            self.parents
                .insert(job.upstream_job(), spec.id, 0)
                .map_err(map_err("PARENTS"))?;
        }
        if job.role == Role::Ring as u8 {
            // Result copies leaving through the uplink go on to the successor.
            let key = EgressKey {
                job: spec.id,
                ifindex: job.parent.ifindex,
            };
            self.egress
                .insert(key, EGRESS_SUCCESSOR, 0)
                .map_err(map_err("EGRESS"))?;
        }
        self.jobs.set(index, job, 0).map_err(map_err("JOBS"))?;
        Ok(JobSpec::from_job(spec.id, &job))
    }

    pub fn remove_job(&mut self, id: u32) -> Result<()> {
        let job = self.job(id)?;
        // The job goes first, so no packet can reach its slots while they are cleared.
        let free: Job = unsafe { std::mem::zeroed() };
        self.jobs
            .set(job_index(id), free, 0)
            .map_err(map_err("JOBS"))?;
        for m in &job.member[..job.member_count()] {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: m.ifindex,
            });
        }
        if job.role == Role::Ring as u8 {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: job.parent.ifindex,
            });
        }
        let upstream = job.upstream_job();
        if job.role != Role::Root as u8 && self.parents.get(&upstream, 0).ok() == Some(id) {
            let _ = self.parents.remove(&upstream);
        }
        self.reset_slots(job.slot_base, job.slot_count)
    }

    fn clear_counter_row(&mut self, row: u32) -> Result<()> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| DataplaneError::Other(format!("counting CPUs: {e}")))?;
        for i in 0..JOB_ROW as u32 {
            let zero = PerCpuValues::try_from(vec![0u64; cpus])
                .map_err(|e| DataplaneError::Other(format!("per-CPU values: {e}")))?;
            self.job_counters
                .set(row * JOB_ROW as u32 + i, zero, 0)
                .map_err(map_err("JOB_COUNTERS"))?;
        }
        Ok(())
    }

    /// Job `id`'s counters (summed over CPUs, only those not zero) and its members'.
    pub fn job_counters(&self, id: u32) -> Result<JobCounters> {
        let job = self.job(id)?;
        let read = |i: u32| -> Result<u64> {
            Ok(self
                .job_counters
                .get(&i, 0)
                .map_err(map_err("JOB_COUNTERS"))?
                .iter()
                .sum())
        };
        let mut counters = BTreeMap::new();
        for c in Counter::ALL {
            let v = read(job_row(job_index(id), c))?;
            if v != 0 {
                counters.insert(c.name().to_string(), v);
            }
        }
        let mut members = Vec::new();
        for m in members_of(job.members) {
            members.push(MemberCounters {
                member: m,
                contributions: read(member_row(job_index(id), m.into(), MEMBER_NEW))?,
                retransmissions: read(member_row(job_index(id), m.into(), MEMBER_AGAIN))?,
            });
        }
        Ok(JobCounters {
            id,
            counters,
            members,
        })
    }

    /// Takes the first sender of drop reason `c` since the last take, if there was one.
    pub fn take_drop_source(&mut self, c: Counter) -> Option<MemberAddr> {
        let key = c as u32;
        let a = self.drops.get(&key, 0).ok().filter(|a| a.ifindex != 0)?;
        let empty: MemberAddr = unsafe { std::mem::zeroed() };
        let _ = self.drops.set(key, empty, 0);
        Some(a)
    }

    /// Drop reasons with a sender waiting to be taken (an entry with an interface).
    pub fn drop_reasons(&self) -> Vec<Counter> {
        Counter::ALL
            .into_iter()
            .filter(|c| {
                self.drops
                    .get(&(*c as u32), 0)
                    .is_ok_and(|a| a.ifindex != 0)
            })
            .collect()
    }

    /// Takes the hello recorded under `token`, if the switch saw one.
    pub fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        let hello = self.hellos.get(&token, 0).ok()?;
        let _ = self.hellos.remove(&token);
        Some(hello.addr)
    }

    /// Removes the hellos nobody claimed within `HELLO_TTL_NS` and recounts each port's
    /// waiting ones (the switch counts them up, and may miscount when two CPUs record one
    /// at once; taken hellos count until now). Returns how many it removed.
    pub fn sweep_hellos(&mut self) -> usize {
        let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) else {
            return 0;
        };
        let now = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
        let mut waiting: BTreeMap<u32, u32> = BTreeMap::new();
        let mut stale = Vec::new();
        for (token, hello) in self.hellos.iter().filter_map(|r| r.ok()) {
            if now.saturating_sub(hello.seen_ns) > HELLO_TTL_NS {
                stale.push(token);
            } else {
                *waiting.entry(hello.addr.ifindex).or_default() += 1;
            }
        }
        for token in &stale {
            let _ = self.hellos.remove(token);
        }
        let ports: Vec<u32> = self.hello_counts.keys().filter_map(|k| k.ok()).collect();
        for port in ports.iter().chain(waiting.keys()) {
            let n = waiting.get(port).copied().unwrap_or(0);
            let _ = self.hello_counts.insert(port, n, 0);
        }
        stale.len()
    }

    /// The switch port with interface index `ifindex`, if it is one.
    pub fn port_named(&self, ifindex: u32) -> Option<String> {
        self.ports
            .iter()
            .find(|p| iface::ifindex(p).ok() == Some(ifindex))
            .cloned()
    }

    /// Slots no job holds.
    pub fn free_slots(&self) -> Result<u32> {
        let used: u32 = self.jobs()?.iter().map(|(_, j)| j.slot_count).sum();
        Ok(MAX_SLOTS - used)
    }

    /// Makes `addr` member `member`'s address in job `id` (a member that joined again
    /// after a restart, from another port or address): its slots are kept.
    pub fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<()> {
        let mut job = self.job(id)?;
        let old = job.member[member];
        if old.ifindex != addr.ifindex {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: old.ifindex,
            });
            self.egress
                .insert(
                    EgressKey {
                        job: id,
                        ifindex: addr.ifindex,
                    },
                    member as u32,
                    0,
                )
                .map_err(map_err("EGRESS"))?;
        }
        job.member[member] = addr;
        self.jobs
            .set(job_index(id), job, 0)
            .map_err(map_err("JOBS"))
    }

    /// A value that changes whenever a round of job `id` moves on (its slots' rounds and
    /// members seen): how the daemon tells an idle job.
    pub fn activity(&self, id: u32) -> Result<u64> {
        let job = self.job(id)?;
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for i in job.slot_base..job.slot_base + job.slot_count {
            let s = self.slot(i)?;
            for c in &s.shadow {
                for v in [c.message as u64, c.segment as u64, c.seen] {
                    h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        Ok(h)
    }

    fn reset_slots(&mut self, base: u32, count: u32) -> Result<()> {
        let empty: SlotImage = unsafe { std::mem::zeroed() };
        for i in base..base + count {
            self.slots.set(i, empty, 0).map_err(map_err("SLOTS"))?;
        }
        Ok(())
    }

    /// One slot's state, for diagnostics.
    pub fn slot(&self, index: u32) -> Result<SlotImage> {
        self.slots.get(&index, 0).map_err(map_err("SLOTS"))
    }

    /// The state of every shadow copy of job `id` that is not empty.
    pub fn job_status(&self, id: u32) -> Result<Vec<SlotStatus>> {
        let job = self.job(id)?;
        let mut out = Vec::new();
        for slot in 0..job.slot_count {
            let s = self.slot(job.slot_base + slot)?;
            for (shadow, v) in s.shadow.iter().enumerate() {
                let state = match ShadowState::from_u32(v.state) {
                    Some(
                        s @ (ShadowState::Filling | ShadowState::PartialSent | ShadowState::Done),
                    ) => s,
                    _ => continue,
                };
                out.push(SlotStatus {
                    slot,
                    shadow: shadow as u8,
                    state: state.name().into(),
                    message: v.message,
                    segment: v.segment,
                    count: v.count,
                    missing: members_of(job.members & !v.seen).collect(),
                });
            }
        }
        Ok(out)
    }

    /// Sets the fault injection probabilities (0 turns a fault off).
    pub fn set_faults(&mut self, drop_contribution: f64, drop_result: f64) -> Result<()> {
        for (name, p) in [
            ("drop_contribution", drop_contribution),
            ("drop_result", drop_result),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(DataplaneError::Other(format!(
                    "{name} = {p}: a probability is between 0 and 1"
                )));
            }
        }
        let f = Faults {
            drop_contribution: probability_threshold(drop_contribution),
            drop_result: probability_threshold(drop_result),
        };
        self.faults.set(0, f, 0).map_err(map_err("FAULTS"))
    }

    /// Counters summed over CPUs, by name.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for c in Counter::ALL {
            let v = self
                .counters
                .get(&(c as u32), 0)
                .map_err(map_err("COUNTERS"))?;
            out.insert(c.name().to_string(), v.iter().sum());
        }
        Ok(out)
    }

    /// The switch's address, collective port and MAC as the dataplane has them.
    pub fn switch_config(&self) -> Result<SwitchConfig> {
        self.switch.get(&0, 0).map_err(map_err("SWITCH"))
    }

    pub fn pinned(&self) -> bool {
        self.pin.is_some()
    }
}

/// A shadow copy of a job's slot, as `job_status` reports it. (The API's keys keep the
/// names they had before the protocol's coordinates were renamed.)
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SlotStatus {
    /// Slot index within the job.
    pub slot: u32,
    /// Which of the slot's two shadow copies.
    pub shadow: u8,
    /// "filling" or "done".
    pub state: String,
    pub message: u32,
    pub segment: u32,
    pub count: u32,
    /// Members whose contribution is not in.
    pub missing: Vec<u8>,
}

/// What the switch did with one job's packets.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobCounters {
    pub id: u32,
    /// By counter name (those not zero).
    pub counters: BTreeMap<String, u64>,
    pub members: Vec<MemberCounters>,
}

/// One member's contributions: new ones, and retransmissions the switch saw (duplicates
/// and ones answered with a stored result).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberCounters {
    pub member: u8,
    pub contributions: u64,
    pub retransmissions: u64,
}

/// Removes a pinned dataplane: its links (so the programs detach) and maps.
pub fn unpin(dir: &Path) -> std::io::Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    fs::remove_dir_all(dir)?;
    Ok(true)
}

/// The map layout of a pinned dataplane: its `LAYOUT` map, or 1 when it has none (pinned
/// by a build from before layouts were versioned).
fn read_layout(dir: &Path) -> Result<u32> {
    let path = dir.join("maps/LAYOUT");
    if !path.exists() {
        return Ok(1);
    }
    let md = MapData::from_pin(&path).map_err(map_err("LAYOUT"))?;
    let layout: Array<MapData, u32> =
        Array::try_from(Map::from_map_data(md).map_err(map_err("LAYOUT"))?)
            .map_err(map_err("LAYOUT"))?;
    layout.get(&0, 0).map_err(map_err("LAYOUT"))
}

/// The ports of a pinned dataplane, from its broadcast devmap (bpffs holds no plain
/// files, and the devmap is what the dataplane really uses).
fn read_ports(dir: &Path) -> Result<Vec<String>> {
    let md = MapData::from_pin(dir.join("maps/PORTS")).map_err(map_err("PORTS"))?;
    let ports: DevMap<MapData> =
        DevMap::try_from(Map::from_map_data(md).map_err(map_err("PORTS"))?)
            .map_err(map_err("PORTS"))?;
    let mut names = Vec::new();
    for i in 0..ports.len() {
        match ports.get(i, 0) {
            Ok(v) if v.if_index != 0 => names.push(
                nix::net::if_::if_indextoname(v.if_index)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| format!("ifindex {}", v.if_index)),
            ),
            _ => break,
        }
    }
    Ok(names)
}

/// Loads every fold program of `ebpf` and enters it in `folds` (the object's `FOLDS` map),
/// where `xagg_switch` finds it by its `Fold`, and `xagg_deliver` after them.
pub fn load_folds(ebpf: &mut Ebpf, folds: &mut ProgramArray<MapData>) -> Result<()> {
    let programs = Fold::ALL
        .iter()
        .map(|f| (*f as u32, f.program()))
        .chain([(DELIVER, DELIVER_PROGRAM)]);
    for (index, name) in programs {
        let p = prog(ebpf, name)?;
        p.load()
            .map_err(|source| DataplaneError::Program { name, source })?;
        let fd = p
            .fd()
            .map_err(|source| DataplaneError::Program { name, source })?;
        folds.set(index, fd, 0).map_err(map_err("FOLDS"))?;
    }
    Ok(())
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(name)
        .ok_or_else(|| DataplaneError::Other(format!("object lacks program {name}")))?
        .try_into()
        .map_err(|source| DataplaneError::Program { name, source })
}

fn attach(prog: &mut Xdp, port: &str, mode: Mode) -> Result<aya::programs::xdp::XdpLinkId> {
    let err = |source| DataplaneError::Attach {
        port: port.to_owned(),
        source,
    };
    match mode {
        Mode::Native => prog.attach(port, XdpMode::Driver).map_err(err),
        Mode::Generic => prog.attach(port, XdpMode::Skb).map_err(err),
        Mode::Auto => match prog.attach(port, XdpMode::Driver) {
            Ok(id) => Ok(id),
            Err(e) => {
                warn!("native XDP on {port} failed ({e}); falling back to generic mode, which is slower");
                prog.attach(port, XdpMode::Skb).map_err(err)
            }
        },
    }
}
