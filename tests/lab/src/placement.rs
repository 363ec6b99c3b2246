//! Where a lab's work runs, as on a switch host: the switch ports' packet processing on CPUs
//! of its own, the workers and their interfaces' on others.
//!
//! On veth the switch's XDP programs run in the NAPI poll of the port a contribution
//! arrives on. Without threaded NAPI that poll runs in the softirq of whichever CPU sent the
//! frame — a worker's — so the switch's work lands on the workers' CPUs. With it, each
//! interface's poll is a kernel thread (`napi/<dev>-<id>`) that can be pinned: the switch
//! ports' to the switch CPUs, the workers' to theirs, the workers' processes too.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

use crate::lab::Lab;

/// CPUs of the switch and of the workers; empty lists leave the kernel to place the work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub switch_cpus: Vec<usize>,
    pub worker_cpus: Vec<usize>,
}

impl Placement {
    pub fn new(switch_cpus: Vec<usize>, worker_cpus: Vec<usize>) -> Result<Self> {
        let cpus = xagg_linux::cpus::available();
        for &c in switch_cpus.iter().chain(&worker_cpus) {
            ensure!(
                c < cpus,
                "CPU {c} does not exist: this machine has CPUs 0..{cpus}"
            );
        }
        if let Some(c) = switch_cpus.iter().find(|c| worker_cpus.contains(c)) {
            bail!("CPU {c} is in both the switch's and the workers' lists: give each its own");
        }
        Ok(Self {
            switch_cpus,
            worker_cpus,
        })
    }

    /// Where the work ran, in words: "switch on CPUs 1, workers on CPUs 0", or that
    /// the kernel placed it.
    pub fn describe(&self) -> String {
        let list = |c: &[usize]| {
            let v: Vec<String> = c.iter().map(|c| c.to_string()).collect();
            v.join(",")
        };
        match (self.switch_cpus.is_empty(), self.worker_cpus.is_empty()) {
            (true, true) => "unplaced: the kernel placed the switch's and the workers' work".into(),
            (false, true) => format!(
                "switch on CPUs {}, workers anywhere",
                list(&self.switch_cpus)
            ),
            (true, false) => format!(
                "switch anywhere, workers on CPUs {}",
                list(&self.worker_cpus)
            ),
            (false, false) => format!(
                "switch on CPUs {}, workers on CPUs {}",
                list(&self.switch_cpus),
                list(&self.worker_cpus)
            ),
        }
    }

    /// The switch ports' NAPI threaded, each port's thread pinned to the switch CPUs in
    /// turn. The ports must already run the switch's program (veth has NAPI only then).
    pub fn pin_switch(&self, lab: &Lab) -> Result<()> {
        if self.switch_cpus.is_empty() {
            return Ok(());
        }
        for i in 0..lab.workers {
            let port = Lab::port(i);
            make_threaded(&lab.switch_ns(), &port, Duration::ZERO)?;
            pin_napi(&port, &[self.switch_cpus[i % self.switch_cpus.len()]])?;
        }
        Ok(())
    }

    /// The workers' interfaces' NAPI threaded and pinned to the worker CPUs, once each
    /// worker has attached its receive program (within `wait`).
    pub fn pin_workers(&self, lab: &Lab, wait: Duration) -> Result<()> {
        if self.worker_cpus.is_empty() {
            return Ok(());
        }
        for i in 0..lab.workers {
            make_threaded(&lab.worker_ns(i), "eth0", wait)?;
        }
        // Every worker's interface is `eth0`: all their threads go to the same CPUs.
        pin_napi("eth0", &self.worker_cpus)
    }

    /// Pins a worker process (before it runs: the affinity outlives `exec`) to the worker
    /// CPUs.
    pub fn pin_process(&self, command: &mut Command) {
        if self.worker_cpus.is_empty() {
            return;
        }
        let mut set = nix::sched::CpuSet::new();
        for &c in &self.worker_cpus {
            // Checked against the machine's CPUs in `new`.
            let _ = set.set(c);
        }
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec only sched_setaffinity runs, which is async-signal
        // safe and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                    .map_err(std::io::Error::from)
            });
        }
    }
}

/// `dev`'s NAPI (in namespace `ns`) in a kernel thread. veth has NAPI only while an XDP
/// program is attached: until `wait` has passed, a refusal is retried.
fn make_threaded(ns: &str, dev: &str, wait: Duration) -> Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        let o = Command::new("ip")
            .args(["netns", "exec", ns, "sh", "-c"])
            .arg(format!("echo 1 > /sys/class/net/{dev}/threaded"))
            .output()?;
        if o.status.success() {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "threaded NAPI on {dev} in {ns}: {} (veth has NAPI only with an XDP program attached)",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Pins the NAPI threads of every interface named `dev` (`napi/<dev>-<id>`) to `cpus`.
fn pin_napi(dev: &str, cpus: &[usize]) -> Result<()> {
    let threads = xagg_linux::proc::threads_named(&format!("napi/{dev}-"))?;
    ensure!(!threads.is_empty(), "no NAPI thread for {dev}");
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    for pid in threads {
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid), &set)
            .with_context(|| format!("pinning NAPI thread {pid} of {dev}"))?;
    }
    Ok(())
}

/// A list of CPUs, as written on a command line: `1`, `0,2`, `2-5`, `0,4-7`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cpus(pub Vec<usize>);

impl std::str::FromStr for Cpus {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        xagg_linux::cpus::parse(text).map(Cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert!(Placement::new(vec![0], vec![0]).is_err());
        assert!(Placement::new(vec![10_000], vec![]).is_err());
    }
}
