//! Workers as processes: `xagg allreduce --json` in each worker namespace of a lab, from a
//! common start, each printing one [`RunReport`] that is read back typed. The demo and
//! the bench run their workers this way.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use xagg_common::{
    wire::{DType, Op},
    JobShape,
};
use xagg_worker::report::RunReport;

use crate::{
    lab::{self, Lab},
    placement::Placement,
};

/// One allreduce run on every worker of a lab.
#[derive(Clone, Debug)]
pub struct AllreduceRun {
    pub job: u32,
    pub op: Op,
    pub dtype: DType,
    pub shape: JobShape,
    /// Bytes each worker allreduces.
    pub bytes: usize,
    /// Allreduces of the same buffer, one message each.
    pub repeat: u32,
    /// The first message's id.
    pub first_message: u32,
    pub seed: u64,
    /// Receive results with AF_XDP.
    pub afxdp: bool,
    /// Other `xagg allreduce` flags (e.g. `--no-gso`, `--reorder`).
    pub flags: Vec<String>,
    /// Nanoseconds between now and the common start, on top of the workers' set-up time.
    pub head_start_ns: u64,
    /// The CPUs the workers and their interfaces' packet processing run on.
    pub placement: Placement,
    /// A worker held off its CPU in the middle of the run, as the scheduler or a debugger
    /// may hold a process: stopped (`SIGSTOP`) this long after the common start and once it
    /// has sent a window's worth, for this long, then continued.
    pub pause: Option<Pause>,
}

/// How long after the common start a worker may still attach its receive program before
/// pinning its interface's packet processing gives up.
const PIN_MARGIN: Duration = Duration::from_secs(5);

/// What a paused worker has sent before it is stopped: a window of 8.9 KB segments, so
/// that rounds are in flight across the pause.
const PAUSE_SENT: u64 = 1 << 20;

/// See [`AllreduceRun::pause`].
#[derive(Clone, Copy, Debug)]
pub struct Pause {
    pub member: usize,
    pub after: Duration,
    pub length: Duration,
}

impl AllreduceRun {
    /// A run of `bytes` of `dtype` (`op`) on job `job` of `shape`, seed 7, AF_XDP receive.
    pub fn new(job: u32, op: Op, dtype: DType, shape: JobShape, bytes: usize) -> Self {
        Self {
            job,
            op,
            dtype,
            shape,
            bytes,
            repeat: 1,
            first_message: 0,
            seed: 7,
            afxdp: true,
            flags: Vec::new(),
            head_start_ns: 500_000_000,
            placement: Placement::default(),
            pause: None,
        }
    }

    /// Runs it on `lab`'s workers (member i = worker i) and returns their reports in
    /// member order; a worker that fails or prints no report is an error. Reports of wrong
    /// results come back (`verified: false`) for the caller to judge.
    pub fn run(&self, lab: &Lab) -> Result<Vec<RunReport>> {
        let n = lab.workers;
        let start_ns = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64
            + self.head_start_ns
            + head_start_ns(self.bytes, n);
        let elements = self.shape.segment_elements(
            xagg_common::wire::lane(self.op, self.dtype).context("op and type not reduced")?,
        )?;
        let sent_before = match self.pause {
            Some(_) => (0..n)
                .map(|i| Ok(lab::link_stats(&lab.worker_ns(i), "eth0")?.tx_bytes))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let children: Vec<Child> = (0..n)
            .map(|i| {
                let mut worker = Command::new("ip");
                self.placement.pin_process(&mut worker);
                worker
                    .args(["netns", "exec", &lab.worker_ns(i)])
                    .arg(crate::bin("xagg"))
                    .args(["allreduce", "--switch", &lab::SWITCH_IP.to_string()])
                    .args([
                        "--bind",
                        &format!("{}:{}", lab::worker_ip(i), lab::WORKER_PORT),
                    ])
                    .args(["--job", &self.job.to_string(), "--member", &i.to_string()])
                    .args(["--op", self.op.name(), "--dtype", self.dtype.name()])
                    .args(["--segment", &elements.to_string()])
                    .args(["--slots", &self.shape.slots().to_string()])
                    .args(["--members", &self.shape.members().to_string()])
                    .args(["--size", &self.bytes.to_string()])
                    .args(["--repeat", &self.repeat.to_string()])
                    .args(["--mid", &self.first_message.to_string()])
                    .args(["--seed", &self.seed.to_string(), "--verify", "--json"])
                    .args(["--start-at", &start_ns.to_string()])
                    .args(self.afxdp.then_some("--afxdp"))
                    .args(&self.flags)
                    .stdout(Stdio::piped())
                    .spawn()
                    .context("starting a worker")
            })
            .collect::<Result<_>>()?;
        let pause = self.pause.map(|p| {
            // `ip netns exec` execs the worker: the child is the worker itself.
            let pid = nix::unistd::Pid::from_raw(children[p.member].id() as i32);
            let ns = lab.worker_ns(p.member);
            std::thread::spawn(move || {
                let at = UNIX_EPOCH + Duration::from_nanos(start_ns) + p.after;
                std::thread::sleep(at.duration_since(SystemTime::now()).unwrap_or_default());
                // A worker still making its data at that time (late on a busy machine) has
                // nothing in flight: stop it once it has sent a window's worth.
                let until = Instant::now() + PIN_MARGIN;
                while Instant::now() < until
                    && lab::link_stats(&ns, "eth0")
                        .is_ok_and(|s| s.tx_bytes < sent_before[p.member] + PAUSE_SENT)
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                use nix::sys::signal::{kill, Signal};
                let stopped = kill(pid, Signal::SIGSTOP);
                std::thread::sleep(p.length);
                let _ = kill(pid, Signal::SIGCONT);
                stopped
            })
        });
        // Each worker attaches its receive program as it starts, normally well before the
        // common start; its interface's NAPI exists from then. On a busy machine a worker
        // can be ready only after the common start (measured: 330 ms after it), so the wait
        // runs past the start; it ends as soon as every interface took the setting.
        let until_start = Duration::from_nanos(start_ns)
            .saturating_sub(SystemTime::now().duration_since(UNIX_EPOCH)?);
        let pinned = self.placement.pin_workers(lab, until_start + PIN_MARGIN);
        // Joined before any worker is reaped, so its pid cannot be anyone else's yet.
        let paused = pause.map(|p| {
            p.join()
                .map_err(|_| anyhow::anyhow!("the pausing thread panicked"))
        });
        let mut reports = Vec::new();
        let mut failed = Vec::new();
        for (i, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            // Exit code 2: the run completed and its result was wrong; the report says so.
            match serde_json::from_str::<RunReport>(text.trim()) {
                Ok(r) if out.status.success() || out.status.code() == Some(2) => reports.push(r),
                _ => failed.push(format!("worker {i} ({}): {}", out.status, text.trim())),
            }
        }
        if !failed.is_empty() {
            bail!("{}", failed.join("; "));
        }
        if let Some(stopped) = paused {
            stopped?.context("stopping the worker to pause")?;
        }
        pinned?;
        Ok(reports)
    }
}

/// Time the workers need before a common start, besides a fixed margin: generating and
/// copying their data, all of them sharing the cores. On the 2-core VM 8 workers x 64 MiB
/// were ready 0.73 s after starting (1.4 ns per byte per worker); this allows twice that. A
/// late worker warns, and its clock still runs from the common start.
pub fn head_start_ns(bytes: usize, workers: usize) -> u64 {
    bytes as u64 * workers as u64 * 3
}
