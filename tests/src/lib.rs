//! Test support: root checks, the BPF_PROG_RUN harness, and labs with a running daemon.

pub use xagg::testrun::*;
use xagg_common::wire;

/// The switch program of this build, loaded for BPF_PROG_RUN.
pub fn load_switch() -> Switch {
    Switch::load(xagg::EBPF_OBJECT)
}

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
        self.add_job_on(id, segment, slots, workers, xagg::lab::WORKER_PORT)
    }

    /// [`Self::add_job`] with the members' UDP port (a worker in several jobs uses one
    /// port per job).
    pub fn add_job_on(
        &self,
        id: u32,
        segment: u16,
        slots: u32,
        workers: &[usize],
        port: u16,
    ) -> xagg::api::Response {
        let all = self.lab.members().unwrap();
        let members = workers
            .iter()
            .map(|&w| xagg::job::MemberSpec {
                addr: std::net::SocketAddrV4::new(*all[w].addr.ip(), port),
                ..all[w].clone()
            })
            .collect();
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
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per knob of the run"
    )]
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
        self.allreduce_with(job, mid, workers, port, elems, seed, |p| {
            p.segment = segment;
            p.slots = slots;
        })
    }

    /// [`Self::allreduce`] with every worker's parameters adjusted by `tweak`.
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per knob of the run"
    )]
    pub fn allreduce_with(
        &self,
        job: u32,
        mid: u32,
        workers: &[usize],
        port: u16,
        elems: usize,
        seed: u64,
        tweak: impl Fn(&mut xagg::worker::WorkerParams) + Sync,
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
                    let tweak = &tweak;
                    s.spawn(move || {
                        xagg::iface::enter_netns(&ns).unwrap();
                        let bind = std::net::SocketAddrV4::new(xagg::lab::worker_ip(w), port);
                        let sw =
                            std::net::SocketAddrV4::new(xagg::lab::SWITCH_IP, wire::DEFAULT_PORT);
                        let mut p = xagg::worker::WorkerParams::new(sw, bind, job, m as u8);
                        p.first_mid = mid;
                        tweak(&mut p);
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
