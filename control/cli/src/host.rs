//! `xagg host attach|detach IFACE [--netns NAME | --netns-pid PID]`: the rank's end of a
//! veth whose peer is a switch's (or host aggregator's) port must run an XDP program, or
//! veth drops every result redirected into it. `attach` gives it `xagg_host`, pinned so it
//! outlives the command; ranks need nothing themselves (they may run unprivileged).

use std::{os::unix::fs::MetadataExt, path::PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use xagg_worker::host_end::{self, Outcome};

#[derive(Subcommand)]
pub enum HostCmd {
    /// Attach xagg_host to a rank's interface (in its network namespace), pinned.
    Attach(Target),
    /// Detach it (remove its pin).
    Detach(Target),
}

/// An interface, in this network namespace or another.
#[derive(Args)]
pub struct Target {
    /// The rank's interface: its end of the veth (e.g. eth0 in a container).
    iface: String,
    /// The network namespace, as `ip netns` names it.
    #[arg(long, conflicts_with = "netns_pid")]
    netns: Option<String>,
    /// The network namespace of this process (a container's, e.g. from `docker inspect
    /// -f '{{.State.Pid}}'`).
    #[arg(long)]
    netns_pid: Option<u32>,
}

impl Target {
    /// The namespace's file and what to call it.
    fn netns(&self) -> (PathBuf, String) {
        match (&self.netns, self.netns_pid) {
            (Some(n), _) => (
                format!("/run/netns/{n}").into(),
                format!("network namespace {n}"),
            ),
            (None, Some(p)) => (
                format!("/proc/{p}/ns/net").into(),
                format!("the network namespace of process {p}"),
            ),
            (None, None) => ("/proc/self/ns/net".into(), "this network namespace".into()),
        }
    }
}

pub fn run(cmd: HostCmd) -> Result<()> {
    let (t, attach) = match &cmd {
        HostCmd::Attach(t) => (t, true),
        HostCmd::Detach(t) => (t, false),
    };
    let (file, name) = t.netns();
    let ns = match std::fs::File::open(&file) {
        Ok(ns) => ns,
        Err(e) if !attach && e.kind() == std::io::ErrorKind::NotFound => {
            // Deleted with the program pinned: the program went with the interface, its pin
            // is left under the namespace's inode, which no name leads to any more.
            let swept = sweep_gone()?;
            println!(
                "{name} ({}) no longer exists; removed the pins of {swept} namespace(s) that no longer exist",
                file.display()
            );
            return Ok(());
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("{name} ({}): no such namespace", file.display()))
        }
    };
    let inode = ns.metadata()?.ino();
    let pin = host_end::pin_dir(inode, &t.iface);
    if !attach {
        if host_end::detach(&pin)? {
            println!(
                "xagg_host detached from {} in {name} (its pin {} removed)",
                t.iface,
                pin.display()
            );
            return Ok(());
        }
        anyhow::bail!(
            "no xagg_host is pinned for {} in {name} (nothing at {}): `xagg host attach` pins one",
            t.iface,
            pin.display()
        );
    }
    drop(ns);
    let (outcome, pin) = host_end::attach_in(xagg_objects::HOST, &file, &name, &t.iface)?;
    match outcome {
        Outcome::Attached(mode) => println!(
            "xagg_host attached to {} in {name} ({} XDP), pinned at {}: results redirected into {} now reach its sockets; `xagg host detach` removes it",
            t.iface,
            mode.name(),
            pin.display(),
            t.iface
        ),
        Outcome::Already(mode) => println!(
            "xagg_host is attached to {} in {name} already ({} XDP, pinned at {})",
            t.iface,
            mode.name(),
            pin.display()
        ),
    }
    Ok(())
}

/// Removes the pin directories of network namespaces that no longer exist (none named in
/// /run/netns, none a process is in); how many.
fn sweep_gone() -> Result<usize> {
    let inode = |p: PathBuf| std::fs::metadata(p).ok().map(|m| m.ino());
    let mut live = std::collections::HashSet::new();
    for dir in ["/run/netns", "/proc"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = if dir == "/proc" {
                e.path().join("ns/net")
            } else {
                e.path()
            };
            live.extend(inode(p));
        }
    }
    let mut swept = 0;
    let Ok(pins) = std::fs::read_dir(host_end::PIN_ROOT) else {
        return Ok(0);
    };
    for e in pins.flatten() {
        let gone = e
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|ino| !live.contains(&ino));
        if gone {
            std::fs::remove_dir_all(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
            swept += 1;
        }
    }
    Ok(swept)
}
