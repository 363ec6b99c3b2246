//! The lab's switch: `xaggd` started on a lab with a configuration written from its
//! struct, reached through its API, signalled with `nix`, removed with its pins on drop.
//! The demo, the bench and the tests all start it this way.

use std::{
    collections::BTreeMap,
    net::SocketAddrV4,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use nix::{sys::signal::Signal, unistd::Pid};
use xagg_api::{JobSpec, Request, Response};
use xagg_common::{
    wire::{DType, Lane, Op, DEFAULT_PORT},
    JobShape,
};
use xagg_daemon::config::{Config, DaemonSection, SwitchSection};
use xagg_worker::{Report, Worker, WorkerParams};

use crate::lab::{self, Lab};

/// A running `xaggd`. Dropping it kills it.
pub struct Daemon {
    child: Child,
}

impl Daemon {
    /// Starts `xaggd --config config`, its output appended to `log`, and waits until its
    /// API at `socket` answers.
    pub fn start(config: &Path, log: &Path, socket: &Path) -> Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = Command::new(crate::bin("xaggd"))
            .arg("--config")
            .arg(config)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting xaggd (built by `cargo xtask build`)")?;
        let mut d = Self { child };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if xagg_api::call(socket, &Request::Status).is_ok() {
                return Ok(d);
            }
            if let Some(status) = d.child.try_wait()? {
                bail!(
                    "xaggd exited ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        d.stop(Signal::SIGKILL)?;
        bail!(
            "xaggd did not come up within 15 s: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `signal` and waits for the daemon to exit.
    pub fn stop(mut self, signal: Signal) -> Result<ExitStatus> {
        nix::sys::signal::kill(self.pid(), signal).context("signalling xaggd")?;
        Ok(self.child.wait()?)
    }

    /// Waits for the daemon to exit by itself (after a detach request).
    pub fn wait(mut self) -> Result<ExitStatus> {
        Ok(self.child.wait()?)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Kills a daemon left running on `config` by an earlier run that was killed before it
/// could stop it (its jobs would answer this run's API calls: "job exists").
fn stop_leftover(config: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let wanted = [
        b"--config".as_slice(),
        config.as_os_str().as_encoded_bytes(),
    ];
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let daemon = args.first().is_some_and(|a| a.ends_with(b"xaggd"));
        if !daemon || !args.windows(2).any(|w| w == wanted) {
            continue;
        }
        eprintln!(
            "killing xaggd {pid} left running on {} by an earlier run",
            config.display()
        );
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.path().exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The lab daemon's network listener when ranks join jobs by themselves (the MPI
/// library, the Python module).
pub const LISTEN: std::net::SocketAddrV4 =
    std::net::SocketAddrV4::new(crate::lab::SWITCH_IP, 47900);
/// The lab's admission credential: its name and key (64 hex digits).
pub const CREDENTIAL: (&str, &str) = (
    "lab",
    "6c61626c61626c61626c61626c61626c61626c61626c61626c61626c61626c61",
);

/// The ranks' environment for [`CREDENTIAL`], as the docs launch them: its name in
/// `XAGG_CREDENTIAL`, its key in a file `XAGG_CREDENTIAL_FILE` names, so that no
/// launcher's command line or environment holds the key. Written here 0644: the lab's
/// unprivileged ranks (user nobody) read it too, where a real key file is its user's, 0600.
pub fn credential_env() -> [(&'static str, String); 2] {
    let file = std::env::temp_dir().join("xagg-lab-credential.key");
    if std::fs::read_to_string(&file).ok().as_deref() != Some(CREDENTIAL.1) {
        use std::os::unix::fs::OpenOptionsExt;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, CREDENTIAL.1.as_bytes()));
        if let Err(e) = written {
            panic!(
                "writing the lab credential's key to {}: {e}",
                file.display()
            );
        }
    }
    [
        ("XAGG_CREDENTIAL", CREDENTIAL.0.to_string()),
        ("XAGG_CREDENTIAL_FILE", file.display().to_string()),
    ]
}

/// Makes `c` a daemon ranks join: the listener at [`LISTEN`], the credential [`CREDENTIAL`]
/// with its key written to `dir`.
pub fn joinable(c: &mut Config, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let key_file = dir.join("lab.key");
    std::fs::write(&key_file, CREDENTIAL.1)?;
    c.daemon.listen = Some(LISTEN.into());
    c.credentials.push(xagg_daemon::config::CredentialSection {
        name: CREDENTIAL.0.into(),
        key_file,
        slot_quota: 4096,
    });
    Ok(())
}

/// One allreduce of i32 sums through the lab's switch: who takes part, on which job and
/// message, with what data.
#[derive(Clone, Copy, Debug)]
pub struct Allreduce<'a> {
    pub job: u32,
    /// The message id the run starts at.
    pub message: u32,
    /// The lab's workers taking part: member i is worker `workers[i]`.
    pub workers: &'a [usize],
    /// Elements per segment of the job.
    pub segment: usize,
    /// Slots of the job.
    pub slots: usize,
    /// The UDP port every worker binds.
    pub port: u16,
    /// Elements each worker reduces.
    pub elems: usize,
    /// Seeds the workers' data (`xagg_worker::data::fill`).
    pub seed: u64,
}

/// A lab with its switch daemon: the files it uses and the daemon while it runs. Dropping
/// it stops the daemon, removes the pins (the dataplane detaches), then the lab.
pub struct LabSwitch {
    // Dropped in this order.
    pub daemon: Option<Daemon>,
    unpin: Unpin,
    pub config: PathBuf,
    pub log: PathBuf,
    pub socket: PathBuf,
    pub pin: PathBuf,
    pub lab: Lab,
}

/// Removes a pinned dataplane when dropped.
struct Unpin(PathBuf);

impl Drop for Unpin {
    fn drop(&mut self) {
        remove_dataplane(&self.0);
    }
}

/// Removes the dataplane pinned at `pin` and the lock file its daemon, killed before it
/// could remove it, left in `/run/xagg` (every lab's would pile up there).
pub fn remove_dataplane(pin: &Path) {
    let _ = xagg_daemon::dataplane::unpin(pin);
    let _ = std::fs::remove_file(xagg_daemon::owner::dataplane_lock(pin));
}

impl LabSwitch {
    /// Starts the daemon on `lab`'s switch namespace, its files in `dir` and its pins in
    /// `pin`, with the configuration [`LabSwitch::default_config`] changed by `tweak`.
    pub fn start(
        lab: Lab,
        dir: PathBuf,
        pin: PathBuf,
        tweak: impl FnOnce(&mut Config),
    ) -> Result<Self> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = xagg_daemon::dataplane::unpin(&pin);
        let mut s = Self {
            daemon: None,
            unpin: Unpin(pin.clone()),
            config: dir.join("xaggd.toml"),
            log: dir.join("xaggd.log"),
            socket: dir.join("xaggd.sock"),
            pin,
            lab,
        };
        stop_leftover(&s.config);
        let _ = std::fs::remove_file(&s.log);
        let _ = std::fs::remove_dir_all(s.state_dir());
        let mut cfg = s.default_config();
        tweak(&mut cfg);
        s.write_config(&cfg)?;
        s.start_daemon()?;
        Ok(s)
    }

    /// The lab's switch: every port, the bridge's address, native XDP, pinned.
    /// Where the lab's daemon keeps its joined jobs.
    pub fn state_dir(&self) -> PathBuf {
        self.socket.with_file_name("state")
    }

    pub fn default_config(&self) -> Config {
        Config {
            switch: SwitchSection {
                ports: (0..self.lab.workers).map(Lab::port).collect(),
                address: lab::SWITCH_IP,
                udp_port: DEFAULT_PORT,
                mac: None,
                xdp_mode: "native".into(),
                netns: Some(self.lab.switch_ns()),
                steer_cpus: None,
                udp_ports: 1,
            },
            daemon: DaemonSection {
                socket: self.socket.clone(),
                pin_path: self.pin.clone(),
                detach_on_exit: false,
                state_dir: self.state_dir(),
                ..DaemonSection::default()
            },
            jobs: Vec::new(),
            credentials: Vec::new(),
            parent: None,
            host_ends: Vec::new(),
        }
    }

    /// Writes the daemon's configuration file (read at its next start).
    pub fn write_config(&self, cfg: &Config) -> Result<()> {
        std::fs::write(&self.config, cfg.to_toml())
            .with_context(|| format!("writing {}", self.config.display()))
    }

    /// Stops the daemon and removes the pins, so the dataplane detaches; the lab stays
    /// (e.g. for a baseline over the plain bridge).
    pub fn stop(self) -> Result<Lab> {
        let Self {
            daemon, unpin, lab, ..
        } = self;
        if let Some(d) = daemon {
            d.stop(Signal::SIGTERM)?;
        }
        drop(unpin);
        Ok(lab)
    }

    pub fn start_daemon(&mut self) -> Result<()> {
        self.daemon = Some(Daemon::start(&self.config, &self.log, &self.socket)?);
        Ok(())
    }

    /// Stops the daemon with `signal` and waits for it.
    pub fn stop_daemon(&mut self, signal: Signal) -> Result<ExitStatus> {
        self.daemon
            .take()
            .context("no daemon running")?
            .stop(signal)
    }

    pub fn api(&self, req: Request) -> Result<Response> {
        Ok(xagg_api::call(&self.socket, &req)?)
    }

    /// Adds a job: the daemon's answer (the job with its slots, or an error).
    pub fn add_job(&self, spec: JobSpec) -> Result<Response> {
        self.api(Request::AddJob { job: spec })
    }

    /// The spec of job `id` over the lab's `workers` (member i = worker `workers[i]`),
    /// reached at UDP `port` (a worker in several jobs uses one port per job); `segment` in
    /// elements.
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per field of the job"
    )]
    pub fn job_spec(
        &self,
        id: u32,
        op: Op,
        dtype: DType,
        segment: u16,
        slots: u32,
        workers: &[usize],
        port: u16,
    ) -> Result<JobSpec> {
        let all = self.lab.members()?;
        let members = workers
            .iter()
            .map(|&w| xagg_api::MemberSpec {
                addr: SocketAddrV4::new(*all[w].addr.ip(), port),
                ..all[w].clone()
            })
            .collect();
        Ok(JobSpec {
            id,
            op,
            dtype,
            segment,
            slots,
            members,
            slot_base: None,
            parent: None,
            ring: None,
        })
    }

    /// The switch's counters by name.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>> {
        match self.api(Request::Counters)? {
            Response::Counters { counters } => Ok(counters),
            r => bail!("counters: {r:?}"),
        }
    }

    /// Runs `run` with the worker library, every listed worker at once, each worker's
    /// parameters adjusted by `tweak`, and checks each result against the wrapping sum.
    /// Panics with the switch's counters on failure (test support).
    pub fn allreduce_with(
        &self,
        run: &Allreduce,
        tweak: impl Fn(&mut WorkerParams) + Sync,
    ) -> Vec<Report> {
        let &Allreduce {
            job,
            message,
            workers,
            segment,
            slots,
            port,
            elems,
            seed,
        } = run;
        let shape = JobShape::with_elements(workers.len(), slots, segment, Lane::I32)
            .expect("a valid test shape");
        let n = workers.len();
        let expected = xagg_worker::data::expected_sum(seed, n as u32, elems);
        std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter()
                .enumerate()
                .map(|(m, &w)| {
                    let ns = self.lab.worker_ns(w);
                    let (expected, tweak) = (&expected, &tweak);
                    s.spawn(move || {
                        xagg_linux::iface::enter_netns(&ns).unwrap();
                        let bind = SocketAddrV4::new(lab::worker_ip(w), port);
                        let sw = SocketAddrV4::new(lab::SWITCH_IP, DEFAULT_PORT);
                        let mut p = WorkerParams::new(sw, bind, job, m as u8, shape);
                        p.first_message = Some(message);
                        tweak(&mut p);
                        let wk = bind_worker(p);
                        let mut buf = vec![0i32; elems];
                        xagg_worker::data::fill(seed, m as u32, &mut buf);
                        let rep = wk.allreduce(&mut buf).unwrap_or_else(|e| {
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

/// A worker on its fixed lab port. A child process started meanwhile (a test's `tmux`,
/// `xagg`) holds copies of every descriptor between its fork and its exec, so the port
/// the previous allreduce's worker just closed can be busy for a moment: tried again for
/// up to a second.
fn bind_worker(p: WorkerParams) -> Worker {
    let mut tries = 0;
    loop {
        match Worker::new(p.clone()) {
            Err(xagg_worker::AllreduceError::Io(e))
                if e.kind() == std::io::ErrorKind::AddrInUse && tries < 50 =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.expect("worker socket"),
        }
    }
}
