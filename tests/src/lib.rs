//! Test support: root checks, a BPF_PROG_RUN harness around the switch program, and frame
//! building.

use std::net::Ipv4Addr;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions, Xdp},
    Ebpf,
};
use xagg_common::{
    job::{EgressKey, MemberAddr, Role, SwitchConfig},
    slot::SlotImage,
    wire::{self, Header, MAX_MEMBERS},
    Counter, Job,
};

/// Whether a test that needs root may run. Without root it skips loudly — except under
/// `CI=true`, where it fails: CI runs as root and must run every test.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root, and CI=true forbids skipping");
    }
    eprintln!("\n*** SKIPPED {test}: needs root (BPF and network namespaces) ***\n");
    false
}

pub const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const SWITCH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
pub const PORT: u16 = wire::DEFAULT_PORT;

/// A member's addresses in the table tests: 10.0.0.(10+i), 02:00:00:00:00:(10+i), UDP
/// 47801, all behind the loopback device (BPF_PROG_RUN's ingress interface).
pub fn member(i: u8) -> MemberAddr {
    MemberAddr {
        ifindex: 1,
        ip: [10, 0, 0, 10 + i],
        mac: [0x02, 0, 0, 0, 0, 10 + i],
        port: 47801u16.to_be_bytes(),
    }
}

/// A job entry with `n` members from [`member`].
pub fn job(n: usize, op: u8, dtype: u8, seg_elems: u16, slot_base: u32, slot_count: u32) -> Job {
    let mut j = Job {
        members: Job::members_bitmap(n),
        slot_base,
        slot_count,
        op,
        dtype,
        role: Role::Root as u8,
        _pad0: 0,
        seg_elems,
        _pad1: 0,
        parent: MemberAddr::default(),
        member: [MemberAddr::default(); MAX_MEMBERS],
    };
    for i in 0..n {
        j.member[i] = member(i as u8);
    }
    j
}

/// An Ethernet/IPv4/UDP frame from `src` to the switch carrying `udp_payload`.
pub fn frame(src: &MemberAddr, dst_port: u16, udp_payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + udp_payload.len());
    f.extend_from_slice(&SWITCH_MAC);
    f.extend_from_slice(&src.mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + udp_payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.ip);
    ip[16..20].copy_from_slice(&SWITCH_IP.octets());
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&src.port);
    f.extend_from_slice(&dst_port.to_be_bytes());
    f.extend_from_slice(&((8 + udp_payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(udp_payload);
    f
}

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
    pub jobs: HashMap<MapData, u32, Job>,
    pub egress: HashMap<MapData, EgressKey, u32>,
    pub slots: Array<MapData, SlotImage>,
    pub counters: PerCpuArray<MapData, u64>,
}

pub struct Run {
    pub action: u32,
    pub out: Vec<u8>,
    pub duration: std::time::Duration,
}

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

impl Switch {
    pub fn load() -> Self {
        assert!(
            !xagg::EBPF_OBJECT.is_empty(),
            "the XDP object is not built: run the tests with `cargo xtask test`"
        );
        let mut ebpf = Ebpf::load(xagg::EBPF_OBJECT).expect("loading the XDP object");
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
            },
            0,
        )
        .unwrap();
        Self {
            jobs: HashMap::try_from(ebpf.take_map("JOBS").unwrap()).unwrap(),
            egress: HashMap::try_from(ebpf.take_map("EGRESS").unwrap()).unwrap(),
            slots: Array::try_from(ebpf.take_map("SLOTS").unwrap()).unwrap(),
            counters: PerCpuArray::try_from(ebpf.take_map("COUNTERS").unwrap()).unwrap(),
            ebpf,
        }
    }

    pub fn run(&mut self, frame: &[u8]) -> Run {
        self.run_repeat(frame, 1)
    }

    pub fn run_repeat(&mut self, frame: &[u8], repeat: u32) -> Run {
        let p: &mut Xdp = self
            .ebpf
            .program_mut("xagg_switch")
            .unwrap()
            .try_into()
            .unwrap();
        let mut out = vec![0u8; frame.len() + 256];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        opts.repeat = repeat;
        let r = p.test_run(opts).expect("BPF_PROG_RUN");
        out.truncate(r.data_size_out as usize);
        Run {
            action: r.return_value,
            out,
            duration: r.duration,
        }
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

/// A lab with a running daemon (the release `xaggd` from `XAGG_BIN_DIR`), removed on drop.
pub struct LabSwitch {
    pub lab: xagg::lab::Lab,
    pub socket: std::path::PathBuf,
    pub pin: std::path::PathBuf,
    pub config: std::path::PathBuf,
    pub log: std::path::PathBuf,
    pub daemon: Option<std::process::Child>,
}

pub fn bin(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("XAGG_BIN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

impl LabSwitch {
    /// A lab of `workers` named after `prefix` (short: it names namespaces), with the
    /// host programs attached and the daemon started. `extra` is appended to the daemon's
    /// `[daemon]` section.
    pub fn start(prefix: &str, workers: usize, extra: &str) -> Self {
        let mut lab = xagg::lab::Lab::create(prefix, workers).expect("creating the lab");
        lab.attach_hosts(xagg::EBPF_OBJECT)
            .expect("attaching host programs");
        let dir = std::env::temp_dir().join(format!("xagg-test-{prefix}"));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("xaggd.sock");
        let pin = std::path::PathBuf::from(format!("/sys/fs/bpf/xagg-test-{prefix}"));
        let _ = xagg::dataplane::unpin(&pin);
        let ports: Vec<String> = (0..workers).map(|i| format!("\"swp{i}\"")).collect();
        let config = dir.join("xaggd.toml");
        std::fs::write(
            &config,
            format!(
                "[switch]\nports = [{}]\naddress = \"{}\"\nnetns = \"{}\"\nxdp_mode = \"native\"\n\n[daemon]\nsocket = \"{}\"\npin_path = \"{}\"\n{extra}\n",
                ports.join(", "),
                xagg::lab::SWITCH_IP,
                lab.switch_ns(),
                socket.display(),
                pin.display()
            ),
        )
        .unwrap();
        let mut s = Self {
            lab,
            socket,
            pin,
            config,
            log: dir.join("xaggd.log"),
            daemon: None,
        };
        s.start_daemon();
        s
    }

    pub fn start_daemon(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = std::process::Command::new(bin("xaggd"))
            .arg("--config")
            .arg(&self.config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting xaggd");
        self.daemon = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while std::time::Instant::now() < deadline {
            if xagg::api::call(&self.socket, &xagg::api::Request::Status).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!(
            "xaggd did not come up: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Stops the daemon with `signal` ("TERM", "INT", "KILL") and waits for it.
    pub fn stop_daemon(&mut self, signal: &str) -> std::process::ExitStatus {
        let mut c = self.daemon.take().expect("daemon running");
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(c.id().to_string())
            .status()
            .unwrap();
        c.wait().unwrap()
    }

    pub fn api(&self, req: xagg::api::Request) -> xagg::api::Response {
        xagg::api::call(&self.socket, &req).expect("daemon API")
    }

    /// A sum/i32 job over the given workers (member i = worker `workers[i]`).
    pub fn add_job(
        &self,
        id: u32,
        segment: u16,
        slots: u32,
        workers: &[usize],
    ) -> xagg::api::Response {
        let all = self.lab.members().unwrap();
        let members = workers.iter().map(|&w| all[w].clone()).collect();
        self.api(xagg::api::Request::AddJob {
            job: xagg::job::JobSpec {
                id,
                op: "sum".into(),
                dtype: "i32".into(),
                segment,
                slots,
                members,
                slot_base: None,
            },
        })
    }

    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        match self.api(xagg::api::Request::Counters) {
            xagg::api::Response::Counters { counters } => counters,
            r => panic!("counters: {r:?}"),
        }
    }

    /// Runs one allreduce (message `mid`) of `elems` i32 on every listed worker at once
    /// (member i is worker `workers[i]`, bound to `port`), and checks each result against
    /// the wrapping sum.
    #[allow(clippy::too_many_arguments)]
    pub fn allreduce(
        &self,
        job: u32,
        mid: u32,
        segment: usize,
        slots: usize,
        workers: &[usize],
        port: u16,
        elems: usize,
        seed: u64,
    ) -> Vec<xagg::worker::Report> {
        let n = workers.len();
        let expected = xagg::data::expected_sum(seed, n as u32, elems);
        std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .enumerate()
                .map(|(m, &w)| {
                    let ns = self.lab.worker_ns(w);
                    let expected = &expected;
                    s.spawn(move || {
                        xagg::iface::enter_netns(&ns).unwrap();
                        let bind = std::net::SocketAddrV4::new(xagg::lab::worker_ip(w), port);
                        let sw =
                            std::net::SocketAddrV4::new(xagg::lab::SWITCH_IP, wire::DEFAULT_PORT);
                        let mut p = xagg::worker::WorkerParams::new(sw, bind, job, m as u8);
                        p.segment = segment;
                        p.slots = slots;
                        p.first_mid = mid;
                        let mut wk = xagg::worker::Worker::new(p).expect("worker socket");
                        let mut buf = vec![0i32; elems];
                        xagg::data::fill(seed, m as u32, &mut buf);
                        let rep = wk.allreduce_i32(&mut buf).unwrap_or_else(|e| {
                            panic!("member {m}: {e}; switch counters {:?}", self.counters())
                        });
                        if let Some(i) = buf.iter().zip(expected.iter()).position(|(a, b)| a != b) {
                            panic!(
                                "member {m}: element {i} is {} but the sum is {}",
                                buf[i], expected[i]
                            );
                        }
                        rep
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker thread"))
                .collect()
        })
    }
}

impl Drop for LabSwitch {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = xagg::dataplane::unpin(&self.pin);
    }
}
