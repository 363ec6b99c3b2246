//! A BPF_PROG_RUN harness around the switch program: load it unattached, fill its maps,
//! run frames through it. The test tables and the dataplane benchmark use it, the
//! benchmark also with its floor ([`Floor`]).

use std::net::Ipv4Addr;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
    Ebpf,
};
use xagg_common::{
    job::{EgressKey, MemberAddr, SwitchConfig},
    slot::SlotImage,
    wire::{self, DType, Header, Op},
    Counter, Job, JobShape,
};

pub const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const SWITCH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
pub const PORT: u16 = wire::DEFAULT_PORT;

/// A member's addresses in harness runs: 10.0.0.(10+i), 02:00:00:00:00:(10+i), UDP
/// 47801, all behind the loopback device (BPF_PROG_RUN's ingress interface).
pub fn member(i: u8) -> MemberAddr {
    MemberAddr {
        ifindex: 1,
        ip: [10, 0, 0, 10 + i],
        mac: [0x02, 0, 0, 0, 0, 10 + i],
        port: 47801u16.to_be_bytes(),
    }
}

/// A job entry with `n` members from [`member`], `op` over `dtype`, segments of `elements`
/// lanes, slots `slot_base..slot_base + slots`.
pub fn job(n: usize, op: Op, dtype: DType, elements: u16, slot_base: u32, slots: u32) -> Job {
    let lane = wire::lane(op, dtype).expect("a harness job of a supported op and type");
    let shape = JobShape::with_elements(n, slots as usize, elements.into(), lane)
        .expect("a valid harness job shape");
    let mut j = Job::new(&shape, op, dtype, slot_base).expect("whole lanes");
    for i in 0..n {
        j.member[i] = member(i as u8);
    }
    j
}

/// An Ethernet/IPv4/UDP frame from `src` to the switch carrying `udp_payload`: IPv4 with
/// DF set, TTL 64, identification 0, a valid header checksum, and no UDP checksum (as the
/// test vectors of docs/protocol.md have it).
pub fn frame(src: &MemberAddr, dst_port: u16, udp_payload: &[u8]) -> Vec<u8> {
    use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, UdpHeader};
    let eth = Ethernet2Header {
        source: src.mac,
        destination: SWITCH_MAC,
        ether_type: EtherType::IPV4,
    };
    let udp = UdpHeader {
        source_port: u16::from_be_bytes(src.port),
        destination_port: dst_port,
        length: (UdpHeader::LEN + udp_payload.len()) as u16,
        checksum: 0,
    };
    let mut ip = Ipv4Header::new(udp.length, 64, IpNumber::UDP, src.ip, SWITCH_IP.octets())
        .expect("a test frame fits an IPv4 packet");
    ip.dont_fragment = true;
    ip.header_checksum = ip.calc_header_checksum();
    let mut f = Vec::with_capacity(42 + udp_payload.len());
    f.extend_from_slice(&eth.to_bytes());
    f.extend_from_slice(&ip.to_bytes());
    f.extend_from_slice(&udp.to_bytes());
    f.extend_from_slice(udp_payload);
    f
}

/// The Internet checksum of an IPv4 header whose checksum field is zero, for tests that
/// edit a frame's header byte by byte.
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Header and payload of a contribution: `values` as little-endian i32, padded to 8 bytes.
pub fn contribution(h: Header, values: &[i32]) -> Vec<u8> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut p = vec![0u8; wire::HEADER_LEN + bytes.len() + 8];
    let n = wire::encode(&h, &bytes, &mut p).unwrap();
    p.truncate(n);
    p
}

/// The switch program loaded (not attached), with its maps, for BPF_PROG_RUN.
pub struct Switch {
    pub ebpf: Ebpf,
    pub jobs: Array<MapData, Job>,
    pub egress: HashMap<MapData, EgressKey, u32>,
    pub slots: Array<MapData, SlotImage>,
    pub counters: PerCpuArray<MapData, u64>,
    pub hellos: HashMap<MapData, u64, xagg_common::job::Hello>,
    /// Inner-level jobs by their wire id at the parent.
    pub parents: HashMap<MapData, u32, u32>,
    /// Holds the fold programs' table (its entries go with its last descriptor).
    _folds: aya::maps::ProgramArray<MapData>,
}

pub struct Run {
    pub action: u32,
    /// The frame as the program left it.
    pub out: Vec<u8>,
    /// The metadata the program put in front of it (`xagg_fanout`'s mark).
    pub meta: Vec<u8>,
    pub duration: std::time::Duration,
}

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

impl Switch {
    /// Loads `xagg_switch` from `object` (panics with context on failure: test support).
    pub fn load(object: &[u8]) -> Self {
        assert!(
            !object.is_empty(),
            "the XDP object is not built: run `cargo xtask build` (or `cargo xtask test`)"
        );
        let mut ebpf = Ebpf::load(object).expect("loading the XDP object");
        let mut folds = aya::maps::ProgramArray::try_from(ebpf.take_map("FOLDS").unwrap()).unwrap();
        xagg_daemon::dataplane::load_folds(&mut ebpf, &mut folds)
            .unwrap_or_else(|e| panic!("loading the fold programs: {e}"));
        let p: &mut Xdp = ebpf.program_mut("xagg_switch").unwrap().try_into().unwrap();
        p.load().expect("verifier accepts xagg_switch");
        let mut sw: Array<MapData, SwitchConfig> =
            Array::try_from(ebpf.take_map("SWITCH").unwrap()).unwrap();
        sw.set(
            0,
            SwitchConfig {
                ip: SWITCH_IP.octets(),
                port: PORT.to_be_bytes(),
                mac: SWITCH_MAC,
                ports: 1,
                _pad: [0; 3],
            },
            0,
        )
        .unwrap();
        Self {
            jobs: Array::try_from(ebpf.take_map("JOBS").unwrap()).unwrap(),
            egress: HashMap::try_from(ebpf.take_map("EGRESS").unwrap()).unwrap(),
            slots: Array::try_from(ebpf.take_map("SLOTS").unwrap()).unwrap(),
            counters: PerCpuArray::try_from(ebpf.take_map("COUNTERS").unwrap()).unwrap(),
            hellos: HashMap::try_from(ebpf.take_map("HELLOS").unwrap()).unwrap(),
            parents: HashMap::try_from(ebpf.take_map("PARENTS").unwrap()).unwrap(),
            _folds: folds,
            ebpf,
        }
    }

    pub fn run(&mut self, frame: &[u8]) -> Run {
        self.run_repeat(frame, 1)
    }

    pub fn run_repeat(&mut self, frame: &[u8], repeat: u32) -> Run {
        self.run_program("xagg_switch", frame, repeat)
    }

    /// Runs program `name` (loaded) on `frame`, `repeat` times.
    pub fn run_program(&mut self, name: &str, frame: &[u8], repeat: u32) -> Run {
        run_xdp(&mut self.ebpf, name, frame, repeat)
    }

    /// Adds job `jid` (at its index, with its generation) with its slots cleared, as the
    /// daemon does.
    pub fn add_job(&mut self, jid: u32, mut job: Job) {
        let empty: SlotImage = unsafe { std::mem::zeroed() };
        for i in job.slot_base..job.slot_base + job.slot_count {
            self.slots.set(i, empty, 0).expect("clearing a slot");
        }
        job.generation = xagg_common::job::job_generation(jid);
        job.index = xagg_common::job::job_index(jid) as u8;
        self.jobs
            .set(xagg_common::job::job_index(jid), job, 0)
            .expect("adding a job");
    }

    /// Adds job `jid` at an inner level: its partials go to `parent` (behind BPF_PROG_RUN's
    /// ingress port, so they leave by `XDP_TX`) as member `parent_member` of the parent's
    /// job `parent_job`, as the daemon does.
    pub fn add_inner_job(
        &mut self,
        jid: u32,
        mut job: Job,
        parent: MemberAddr,
        parent_job: u32,
        parent_member: u8,
    ) {
        job.role = xagg_common::Role::Inner as u8;
        job.parent = parent;
        job.parent_job = parent_job;
        job.parent_member = parent_member;
        self.add_upstream_job(jid, job);
    }

    /// Adds job `jid`, whose results come from upstream (`job.parent_job` names it there),
    /// and enters it in `PARENTS`.
    fn add_upstream_job(&mut self, jid: u32, job: Job) {
        self.add_job(jid, job);
        let upstream = self.job(jid).upstream_job();
        self.parents
            .insert(upstream, jid, 0)
            .expect("entering the job's id upstream");
    }

    /// Adds job `jid` as a ring host at `position` of `size` with `job`'s members as its
    /// ranks: partials go to `successor` (as its member `successor_member`, naming the job
    /// by the successor's id `successor_job`), the predecessor's (whose id of the job is
    /// `predecessor_job`) arrive as member `job.member_count()`, as the daemon does.
    pub fn add_ring_job(
        &mut self,
        jid: u32,
        mut job: Job,
        (predecessor, successor): (MemberAddr, MemberAddr),
        (predecessor_job, successor_job): (u32, u32),
        (size, position): (u8, u8),
        successor_member: u8,
    ) {
        let pred = job.member_count();
        job.role = xagg_common::Role::Ring as u8;
        job.parent = successor;
        job.parent_job = successor_job;
        job.predecessor_job = predecessor_job;
        job.parent_member = successor_member;
        job.member[pred] = predecessor;
        job.predecessor = pred as u8;
        job.ring_size = size;
        job.ring_position = position;
        self.add_upstream_job(jid, job);
    }

    /// Job `jid`'s entry (whatever generation its index holds).
    pub fn job(&self, jid: u32) -> Job {
        self.jobs
            .get(&xagg_common::job::job_index(jid), 0)
            .expect("a job index")
    }

    /// Frees job `jid`'s index.
    pub fn remove_job(&mut self, jid: u32) {
        let free: Job = unsafe { std::mem::zeroed() };
        self.jobs
            .set(xagg_common::job::job_index(jid), free, 0)
            .expect("freeing a job index");
    }

    pub fn counter(&self, c: Counter) -> u64 {
        self.counters.get(&(c as u32), 0).unwrap().iter().sum()
    }

    pub fn counters(&self) -> Vec<u64> {
        Counter::ALL.iter().map(|c| self.counter(*c)).collect()
    }

    pub fn slot(&self, i: u32) -> SlotImage {
        self.slots.get(&i, 0).unwrap()
    }
}

/// The bench's `xagg_floor`, from the test programs' object (`xagg-test`), loaded (not
/// attached) for BPF_PROG_RUN. It shares no map with the switch.
pub struct Floor {
    ebpf: Ebpf,
}

impl Floor {
    /// Loads `xagg_floor` from `object` (panics with context on failure: test support).
    pub fn load(object: &[u8]) -> Self {
        let mut ebpf = Ebpf::load(object).expect("loading the test programs' object");
        let p: &mut Xdp = ebpf.program_mut("xagg_floor").unwrap().try_into().unwrap();
        p.load()
            .unwrap_or_else(|e| panic!("verifier refuses xagg_floor: {e}"));
        Self { ebpf }
    }

    /// Runs the floor on `frame` once.
    pub fn run(&mut self, frame: &[u8]) -> Run {
        run_xdp(&mut self.ebpf, "xagg_floor", frame, 1)
    }
}

/// Runs XDP program `name` of `ebpf` (loaded) on `frame`, `repeat` times.
fn run_xdp(ebpf: &mut Ebpf, name: &str, frame: &[u8], repeat: u32) -> Run {
    let p: &mut Xdp = ebpf.program_mut(name).unwrap().try_into().unwrap();
    let mut out = vec![0u8; frame.len() + 256];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    opts.repeat = repeat;
    let r = p.test_run(opts).expect("BPF_PROG_RUN");
    out.truncate(r.data_size_out as usize);
    // BPF_PROG_RUN hands back the metadata a program put in front of the frame with it;
    // the switch's programs never change a frame's length, so what is longer is that.
    let frame = out.split_off(out.len().saturating_sub(frame.len()));
    Run {
        action: r.return_value,
        out: frame,
        meta: out,
        duration: r.duration,
    }
}
