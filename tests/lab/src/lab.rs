//! A veth/netns lab: one switch namespace whose ports are members of a Linux bridge, and
//! N worker namespaces, each linked to one switch port.
//!
//! ```text
//!   {p}-w0: eth0 10.77.0.11 ──veth── swp0 ┐
//!   {p}-w1: eth0 10.77.0.12 ──veth── swp1 ├─ br0 10.77.0.1   ({p}-sw, xagg_switch on swp*)
//!   ...                                    ┘
//! ```
//! Worker ends carry `xagg_host` (a frame redirected into a veth is dropped unless the
//! peer end runs an XDP program). Everything is removed on drop.

use std::{net::Ipv4Addr, process::Command};

use anyhow::{bail, Context, Result};
use aya::Ebpf;
use xagg_api::MemberSpec;

/// The lab links' MTU unless chosen: the jumbo frames a real Ethernet network carries, and
/// what a full segment (`wire::MAX_PAYLOAD`) needs. Past 3506 bytes veth frames are
/// multi-buffer (the switch's programs are frags-aware).
pub const MTU: usize = 9000;
const _: () = assert!(MTU >= xagg_common::wire::MAX_IP_PACKET);
/// MTUs a lab takes: IPv4's least that every link must carry, up to veth's largest.
pub const MTUS: std::ops::RangeInclusive<usize> = 576..=65535;
pub const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const WORKER_PORT: u16 = 47801;

pub fn worker_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, 11 + i as u8)
}

pub struct Lab {
    pub prefix: String,
    pub workers: usize,
    /// Every link's MTU.
    pub mtu: usize,
    /// Host-side programs; dropping them detaches.
    hosts: Vec<HostEnd>,
    /// Impairment programs (`xagg_impair` on worker egress, from the test programs' object).
    impairs: Vec<Ebpf>,
}

/// Whether a lab's links can have `mtu`.
pub fn check_mtu(mtu: usize) -> Result<()> {
    if !MTUS.contains(&mtu) {
        bail!(
            "an MTU of {mtu}: the lab's links take {} to {} bytes",
            MTUS.start(),
            MTUS.end()
        );
    }
    Ok(())
}

/// Runs `ip` with `args`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Packets the lab's interfaces dropped (the kernel's `rx_dropped` and `tx_dropped`: on
/// veth, a frame that found its peer's ring full), switch ports and workers' ends apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drops {
    pub switch_rx: u64,
    pub switch_tx: u64,
    pub workers_rx: u64,
    pub workers_tx: u64,
}

impl Drops {
    /// What was dropped since `before`.
    pub fn since(self, before: Drops) -> Drops {
        Drops {
            switch_rx: self.switch_rx.saturating_sub(before.switch_rx),
            switch_tx: self.switch_tx.saturating_sub(before.switch_tx),
            workers_rx: self.workers_rx.saturating_sub(before.workers_rx),
            workers_tx: self.workers_tx.saturating_sub(before.workers_tx),
        }
    }

    pub fn total(&self) -> u64 {
        self.switch_rx + self.switch_tx + self.workers_rx + self.workers_tx
    }
}

/// An interface's counters, from `ip -s -j link` in its namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkStats {
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_dropped: u64,
    pub rx_dropped: u64,
}

/// `dev`'s counters in namespace `ns`.
pub fn link_stats(ns: &str, dev: &str) -> Result<LinkStats> {
    let text = ip(&["-n", ns, "-s", "-j", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("`ip -j -s link` output for {dev} in {ns}"))?;
    let stats = &v[0]["stats64"];
    let n = |dir: &str, key: &str| {
        stats[dir][key]
            .as_u64()
            .with_context(|| format!("no {dir} {key} for {dev} in {ns}"))
    };
    Ok(LinkStats {
        tx_bytes: n("tx", "bytes")?,
        rx_bytes: n("rx", "bytes")?,
        tx_dropped: n("tx", "dropped")?,
        rx_dropped: n("rx", "dropped")?,
    })
}

/// Runs `f` on a thread inside network namespace `ns` (only that thread moves).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            xagg_linux::iface::enter_netns(ns)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| bail!("thread in {ns} panicked"))
    })
}

impl Lab {
    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }
    pub fn worker_ns(&self, i: usize) -> String {
        format!("{}-w{i}", self.prefix)
    }
    pub fn port(i: usize) -> String {
        format!("swp{i}")
    }

    /// Builds the lab (after removing any leftover of an earlier one with this prefix),
    /// its links at the default [`MTU`].
    pub fn create(prefix: &str, workers: usize) -> Result<Self> {
        Self::with_mtu(prefix, workers, MTU)
    }

    /// Builds the lab with every link at `mtu`.
    pub fn with_mtu(prefix: &str, workers: usize, mtu: usize) -> Result<Self> {
        if workers == 0 || workers > 64 {
            bail!("a lab has 1..=64 workers, not {workers}");
        }
        check_mtu(mtu)?;
        destroy(prefix);
        let lab = Lab {
            prefix: prefix.into(),
            workers,
            mtu,
            hosts: Vec::new(),
            impairs: Vec::new(),
        };
        let sw = lab.switch_ns();
        ip(&["netns", "add", &sw])?;
        let mtu = mtu.to_string();
        ip(&[
            "-n", &sw, "link", "add", "br0", "mtu", &mtu, "type", "bridge",
        ])?;
        ip(&[
            "-n",
            &sw,
            "addr",
            "add",
            &format!("{SWITCH_IP}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        for i in 0..workers {
            let w = lab.worker_ns(i);
            let port = Self::port(i);
            ip(&["netns", "add", &w])?;
            ip(&[
                "link", "add", &port, "netns", &sw, "mtu", &mtu, "type", "veth", "peer", "name",
                "eth0", "netns", &w, "mtu", &mtu,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &w,
                "addr",
                "add",
                &format!("{}/24", worker_ip(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &w, "link", "set", "eth0", "up"])?;
            ip(&["-n", &w, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        Ok(lab)
    }

    /// Attaches `xagg_host` from `object`, a worker's XDP object (`xagg-host`,
    /// [`crate::Object::Host`]), to every worker's interface (native mode).
    pub fn attach_hosts(&mut self) -> Result<()> {
        for i in 0..self.workers {
            let end = HostEnd::attach(&self.worker_ns(i), "eth0")?;
            self.hosts.push(end);
        }
        Ok(())
    }

    /// Drops (`drop`) and duplicates (`duplicate`) fractions of the contributions every
    /// worker sends, with the tc program `xagg_impair` of `object` (the test programs'
    /// object, [`crate::Object::Test`]) on each worker's egress. Called again, it changes
    /// the fractions.
    pub fn impair(&mut self, object: &[u8], drop: f64, duplicate: f64) -> Result<()> {
        use xagg_common::job::{probability_threshold, Impair};
        let settings = Impair {
            drop: probability_threshold(drop),
            duplicate: probability_threshold(duplicate),
            port: xagg_common::wire::DEFAULT_PORT.to_be_bytes(),
            _pad: [0; 2],
        };
        if !self.impairs.is_empty() {
            for e in &mut self.impairs {
                let mut cfg: aya::maps::Array<_, Impair> =
                    aya::maps::Array::try_from(e.map_mut("IMPAIR").context("no IMPAIR map")?)?;
                cfg.set(0, settings, 0)?;
            }
            return Ok(());
        }
        for i in 0..self.workers {
            let ebpf = in_netns(&self.worker_ns(i), || {
                let mut ebpf = Ebpf::load(object)?;
                let mut cfg: aya::maps::Array<_, Impair> =
                    aya::maps::Array::try_from(ebpf.map_mut("IMPAIR").context("no IMPAIR map")?)?;
                cfg.set(0, settings, 0)?;
                let _ = aya::programs::tc::qdisc_add_clsact("eth0");
                let p: &mut aya::programs::SchedClassifier = ebpf
                    .program_mut("xagg_impair")
                    .context("no xagg_impair")?
                    .try_into()?;
                p.load()?;
                p.attach("eth0", aya::programs::TcAttachType::Egress)
                    .context("attaching xagg_impair to a worker's egress")?;
                Ok(ebpf)
            })?;
            self.impairs.push(ebpf);
        }
        Ok(())
    }

    /// What `xagg_impair` did, over all workers: (dropped, duplicated).
    pub fn impair_counts(&self) -> Result<(u64, u64)> {
        let (mut dropped, mut duplicated) = (0, 0);
        for e in &self.impairs {
            let c: aya::maps::PerCpuArray<_, u64> = aya::maps::PerCpuArray::try_from(
                e.map("IMPAIR_COUNTERS").context("no IMPAIR_COUNTERS")?,
            )?;
            dropped += c.get(&0, 0)?.iter().sum::<u64>();
            duplicated += c.get(&1, 0)?.iter().sum::<u64>();
        }
        Ok((dropped, duplicated))
    }

    /// Datagrams the workers sent to the switch's collective port and each of the 7 after
    /// it, while impaired (a GSO burst counts as one).
    pub fn sent_by_port(&self) -> Result<Vec<u64>> {
        let mut sent = vec![0; 8];
        for e in &self.impairs {
            let c: aya::maps::PerCpuArray<_, u64> = aya::maps::PerCpuArray::try_from(
                e.map("IMPAIR_COUNTERS").context("no IMPAIR_COUNTERS")?,
            )?;
            for (lane, n) in sent.iter_mut().enumerate() {
                *n += c.get(&(2 + lane as u32), 0)?.iter().sum::<u64>();
            }
        }
        Ok(sent)
    }

    /// Detaches the worker-side programs (for baselines over a plain bridge).
    pub fn detach_hosts(&mut self) {
        self.hosts.clear();
        self.impairs.clear();
    }

    /// The drop counters of every switch port and every worker's interface, summed.
    pub fn drops(&self) -> Result<Drops> {
        let mut d = Drops::default();
        for i in 0..self.workers {
            let port = link_stats(&self.switch_ns(), &Self::port(i))?;
            d.switch_rx += port.rx_dropped;
            d.switch_tx += port.tx_dropped;
            let worker = link_stats(&self.worker_ns(i), "eth0")?;
            d.workers_rx += worker.rx_dropped;
            d.workers_tx += worker.tx_dropped;
        }
        Ok(d)
    }

    pub fn worker_mac(&self, i: usize) -> Result<[u8; 6]> {
        in_netns(&self.worker_ns(i), || Ok(xagg_linux::iface::mac("eth0")?))
    }

    /// `--member` values of a job over all workers, in member order.
    pub fn members(&self) -> Result<Vec<MemberSpec>> {
        (0..self.workers)
            .map(|i| {
                Ok(MemberSpec {
                    interface: Self::port(i),
                    mac: xagg_linux::iface::fmt_mac(&self.worker_mac(i)?),
                    addr: std::net::SocketAddrV4::new(worker_ip(i), WORKER_PORT),
                })
            })
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.detach_hosts();
        destroy(&self.prefix);
    }
}

/// Removes the namespaces of the lab `prefix` (their veths go with them). Idempotent.
pub fn destroy(prefix: &str) {
    remove_namespaces(prefix, &["w"], &["sw"]);
}

/// Removes the network namespaces named `{prefix}-{k}N` (N digits) for each `k` in
/// `numbered`, and `{prefix}-{n}` for each `n` in `named`, killing the processes left in
/// them. Idempotent.
pub fn remove_namespaces(prefix: &str, numbered: &[&str], named: &[&str]) {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    let head = format!("{prefix}-");
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(&head) else {
            continue;
        };
        let ours = named.contains(&rest)
            || numbered.iter().any(|k| {
                rest.strip_prefix(k)
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            });
        if ours {
            // Processes still in it (a killed run's ranks) keep it and themselves alive:
            // killed first.
            if let Ok(pids) = ip(&["netns", "pids", name]) {
                for pid in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    if pid as u32 != std::process::id() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// A rank's end of its link with `xagg_host`, attached as a user attaches it (`xagg host
/// attach`, pinned) and detached (`xagg host detach`) when dropped, before its namespace
/// goes.
pub struct HostEnd {
    ns: String,
    dev: String,
}

impl HostEnd {
    pub fn attach(ns: &str, dev: &str) -> Result<Self> {
        let out = Command::new(crate::bin("xagg"))
            .args(["host", "attach", dev, "--netns", ns])
            .output()
            .context("running `xagg host attach` (built by `cargo xtask build`)")?;
        if !out.status.success() {
            bail!(
                "xagg host attach {dev} --netns {ns}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Self {
            ns: ns.into(),
            dev: dev.into(),
        })
    }
}

impl Drop for HostEnd {
    fn drop(&mut self) {
        let _ = Command::new(crate::bin("xagg"))
            .args(["host", "detach", &self.dev, "--netns", &self.ns])
            .output();
    }
}
