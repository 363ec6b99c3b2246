//! What a start checks before it attaches anything, and all `xaggd --check` does: the
//! ports and the programs already on them, the switch's address, the pin path and a
//! dataplane pinned there, the API socket's directory, the state directory and its file,
//! the credentials' key files and their modes, the network listener and metrics
//! addresses, the parent daemon, the configuration's jobs, and other daemons holding what
//! this one claims.
//! It must run in the ports' network namespace (`switch.netns`).

use std::{fmt, path::Path};

use xagg_linux::{iface, xdp::Attached};

use crate::{config::Config, dataplane::Dataplane, job::check_spec, owner, Error};

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Ok,
    /// A start goes ahead, but something is likely wrong or unsafe.
    Warning,
    /// A start would fail.
    Error,
}

/// One finding: what was checked and what was found.
#[derive(Clone, Debug)]
pub struct Finding {
    pub severity: Severity,
    pub text: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{severity:<8}{}", self.text)
    }
}

/// What a check is for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checking {
    /// `--reload`: a pinned dataplane is replaced, not adopted.
    pub reload: bool,
    /// `--check`: nothing is claimed, so other daemons' locks are looked at and the
    /// listeners' addresses bound and let go (a start binds them itself, before attaching).
    pub only: bool,
}

/// The findings, in the order checked.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    fn ok(&mut self, text: impl Into<String>) {
        self.push(Severity::Ok, text);
    }

    fn warn(&mut self, text: impl Into<String>) {
        self.push(Severity::Warning, text);
    }

    fn error(&mut self, text: impl fmt::Display) {
        self.push(Severity::Error, text.to_string());
    }

    fn push(&mut self, severity: Severity, text: impl Into<String>) {
        self.findings.push(Finding {
            severity,
            text: text.into(),
        });
    }

    pub fn of(&self, severity: Severity) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.severity == severity)
    }

    pub fn failed(&self) -> bool {
        self.of(Severity::Error).next().is_some()
    }
}

/// Checks everything a start with `cfg` would, attaching and claiming nothing.
pub fn check(cfg: &Config, checking: Checking) -> Report {
    let mut r = Report::default();
    let held = if checking.only {
        owner::holders(cfg)
    } else {
        Vec::new()
    };
    let running = !held.is_empty();
    for e in held {
        r.warn(format!(
            "{e} (a daemon started with this configuration is refused until that one stops)"
        ));
    }
    let mut unadoptable = false;
    let pinned = pin_path(cfg, checking, &mut r, &mut unadoptable);
    ports(cfg, pinned, unadoptable, &mut r);
    address(cfg, &mut r);
    if let Ok(cpus) = cfg.steer_cpus() {
        if !cpus.is_empty() {
            r.ok(format!("switch.steer_cpus: slots folded on CPUs {cpus:?}"));
        }
    }
    socket_dir(cfg, &mut r);
    for h in &cfg.host_ends {
        let file = std::path::Path::new("/run/netns").join(&h.netns);
        if file.exists() {
            r.ok(format!(
                "[[host_end]] {} in network namespace {}: there",
                h.iface, h.netns
            ));
        } else {
            r.warn(format!(
                "[[host_end]] {} in network namespace {}: no such namespace ({} is missing): a start attaches the others, and this one waits for `xagg host attach {} --netns {}` once it exists",
                h.iface,
                h.netns,
                file.display(),
                h.iface,
                h.netns
            ));
        }
    }
    state(cfg, &mut r);
    keys(cfg, &mut r);
    if checking.only && !running {
        listeners(cfg, &mut r);
    }
    if checking.only {
        parent(cfg, &mut r);
    }
    for job in &cfg.jobs {
        match check_spec(job, &cfg.switch.ports) {
            Ok(()) => r.ok(format!(
                "[[job]] id {}: {} members, {} slots of {} elements",
                job.id,
                job.members.len(),
                job.slots,
                job.segment
            )),
            Err(e) => r.error(format!("[[job]] id {}: {e}", job.id)),
        }
    }
    r
}

/// The pin path, and whether a dataplane pinned there is this configuration's to adopt;
/// `unadoptable` set when one is pinned there that it cannot adopt.
fn pin_path(cfg: &Config, checking: Checking, r: &mut Report, unadoptable: &mut bool) -> bool {
    if cfg.daemon.detach_on_exit {
        r.ok("daemon.detach_on_exit: nothing pinned, the programs go with the daemon");
        return false;
    }
    let pin = &cfg.daemon.pin_path;
    if !pin.starts_with("/sys/fs/bpf") && !in_bpffs(pin) {
        r.error(format!(
            "daemon.pin_path {} is not in a bpffs: use a path under /sys/fs/bpf (mounted there if need be), or mount one (`mount -t bpf bpf DIR`)",
            pin.display()
        ));
        return false;
    }
    match Dataplane::pinned_at(cfg) {
        Ok(None) => {
            r.ok(format!(
                "daemon.pin_path {}: nothing pinned; a fresh dataplane is loaded and pinned there at start",
                pin.display()
            ));
            false
        }
        Ok(Some(_)) if checking.reload => {
            r.ok(format!(
                "daemon.pin_path {}: the pinned dataplane will be replaced (--reload: its jobs are dropped)",
                pin.display()
            ));
            true
        }
        Ok(Some(_)) => {
            r.ok(format!(
                "daemon.pin_path {}: a dataplane of this layout on these ports is pinned; it will be adopted, jobs included",
                pin.display()
            ));
            true
        }
        Err(e) if checking.reload => {
            r.ok(format!(
                "daemon.pin_path {}: {e}; --reload replaces it",
                pin.display()
            ));
            true
        }
        Err(e) => {
            r.error(e);
            *unadoptable = true;
            false
        }
    }
}

/// Whether the nearest existing directory at or above `path` is on a bpffs.
fn in_bpffs(path: &Path) -> bool {
    path.ancestors()
        .find(|d| d.exists())
        .and_then(|d| nix::sys::statfs::statfs(d).ok())
        .is_some_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Each port: present, its MTU, and no program on it but a pinned dataplane's own.
/// (`unadoptable`: a dataplane is pinned that this configuration cannot adopt, already an
/// error; its programs are most likely the ones on the ports.)
fn ports(cfg: &Config, pinned: bool, unadoptable: bool, r: &mut Report) {
    let mut seen = Vec::new();
    for port in &cfg.switch.ports {
        if seen.contains(&port) {
            r.error(format!(
                "switch.ports names {port} twice: list each interface once"
            ));
            continue;
        }
        seen.push(port);
        if let Err(e) = iface::ifindex(port) {
            r.error(format!("switch.ports: {e}"));
            continue;
        }
        let mtu = iface::mtu(port).map_or_else(|e| e.to_string(), |m| format!("MTU {m}"));
        match xagg_linux::xdp::attached(port) {
            Ok(Attached::None) => r.ok(format!("port {port}: {mtu}, no XDP program yet")),
            Ok(mode) if pinned => r.ok(format!(
                "port {port}: {mtu}, the pinned dataplane's program in {} mode",
                mode.name()
            )),
            Ok(mode) if unadoptable => r.warn(format!(
                "port {port}: {mtu}, an XDP program in {} mode, most likely the dataplane pinned at {}, which this configuration cannot adopt (the finding on the pinned dataplane says why): `xagg detach --pin-path {}` takes it off every port it is on",
                mode.name(),
                cfg.daemon.pin_path.display(),
                cfg.daemon.pin_path.display()
            )),
            Ok(mode) => r.error(format!(
                "port {port} already has an XDP program ({} mode) that no dataplane pinned at {} explains: another switch or tool holds it. If it is another xaggd's, stop that one or `xagg detach --pin-path` its pins; else `ip link set dev {port} xdp off` frees it",
                mode.name(),
                cfg.daemon.pin_path.display()
            )),
            Err(e) => r.warn(format!("port {port}: {mtu}; {e}")),
        }
    }
}

/// The switch's address: on an interface here (whose MAC results carry), or `switch.mac`
/// with what that requires of the workers.
fn address(cfg: &Config, r: &mut Report) {
    let a = cfg.switch.address;
    match (iface::holding(a), &cfg.switch.mac) {
        (Ok(Some(holder)), _) => r.ok(format!(
            "switch.address {a}: on {holder}, which answers the workers' ARP for it"
        )),
        (Ok(None), Some(mac)) => r.warn(
            Error::AddressWithMac {
                address: a,
                mac: mac.clone(),
            }
            .to_string(),
        ),
        (Ok(None), None) => r.error(Error::AddressNotHere(a)),
        (Err(e), _) => r.error(format!("switch.address {a}: {e}")),
    }
}

/// The API socket's directory: there, or creatable.
fn socket_dir(cfg: &Config, r: &mut Report) {
    let socket = &cfg.daemon.socket;
    let Some(dir) = socket.parent() else {
        return;
    };
    match creatable(dir) {
        Ok(()) => r.ok(format!(
            "daemon.socket {} (mode {}, group {})",
            socket.display(),
            cfg.daemon.socket_mode,
            cfg.daemon
                .socket_group
                .as_deref()
                .unwrap_or("the daemon's own")
        )),
        Err(why) => r.error(format!("daemon.socket {}: {why}", socket.display())),
    }
}

/// Whether `dir` is a directory, or the nearest existing one above it lets this process
/// create it.
fn creatable(dir: &Path) -> Result<(), String> {
    let Some(existing) = dir.ancestors().find(|d| d.exists()) else {
        return Ok(());
    };
    if !existing.is_dir() {
        return Err(format!("{} is not a directory", existing.display()));
    }
    if existing != dir {
        nix::unistd::access(existing, nix::unistd::AccessFlags::W_OK).map_err(|e| {
            format!(
                "{} does not exist and cannot be created in {}: {e}",
                dir.display(),
                existing.display()
            )
        })?;
    }
    Ok(())
}

/// The state directory (its mode) and the joined jobs' state file in it.
fn state(cfg: &Config, r: &mut Report) {
    use std::os::unix::fs::PermissionsExt;
    let dir = &cfg.daemon.state_dir;
    if let Err(why) = creatable(dir) {
        r.error(format!("daemon.state_dir {}: {why}", dir.display()));
        return;
    }
    match std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o777) {
        Ok(mode) if mode & 0o077 != 0 => r.warn(format!(
            "daemon.state_dir {} is mode {mode:04o}: other users can look into it (the joined jobs' state file itself is 0600); `chmod 0700 {}`",
            dir.display(),
            dir.display()
        )),
        Ok(_) => {}
        Err(_) => {
            r.ok(format!(
                "daemon.state_dir {}: created at start (0700)",
                dir.display()
            ));
            return;
        }
    }
    match crate::join::check_state(cfg) {
        Ok(n) => r.ok(format!(
            "daemon.state_dir {}: {n} joined jobs kept",
            dir.display()
        )),
        Err(e) => r.error(e),
    }
}

/// The credentials' key files: readable, a key, and closed to other users.
fn keys(cfg: &Config, r: &mut Report) {
    let parent = match cfg.parent_credential() {
        Ok(p) => p,
        Err(e) => {
            r.error(e);
            None
        }
    };
    let labelled = cfg
        .credentials
        .iter()
        .map(|c| ("credential", c))
        .chain(parent.as_ref().map(|c| ("parent.credential", c)));
    for (what, c) in labelled {
        match c.key() {
            Ok(_) => r.ok(format!(
                "{what} {}: key read from {}",
                c.name,
                c.key_file.display()
            )),
            Err(e) => r.error(e),
        }
        if let Some(w) = c.open_to_others() {
            r.warn(w);
        }
    }
}

/// The network listener's and the metrics endpoint's addresses, bound and let go.
fn listeners(cfg: &Config, r: &mut Report) {
    let addrs = [
        ("daemon.listen", cfg.daemon.listen),
        ("daemon.metrics", cfg.daemon.metrics),
    ];
    for (key, addr) in addrs {
        let Some(addr) = addr else { continue };
        match std::net::TcpListener::bind(addr) {
            Ok(_) => r.ok(format!("{key} = {addr}: free")),
            Err(e) => r.error(Error::Bind {
                key,
                addr,
                error: e,
            }),
        }
    }
}

/// The parent daemon, if one is named: does it answer on its listener now? Only a warning
/// when not (it may start later), given a moment for one starting beside this check.
fn parent(cfg: &Config, r: &mut Report) {
    let Some(p) = &cfg.parent else { return };
    let Some(addr) = p.daemon else {
        r.ok(format!(
            "[parent] no daemon: jobs with ranks beyond this point go round a ring of hosts behind {}",
            p.interface
        ));
        return;
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let error = loop {
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)) {
            Ok(_) => {
                r.ok(format!(
                    "[parent] daemon {addr} answers (behind {})",
                    p.interface
                ));
                return;
            }
            Err(e) if std::time::Instant::now() >= until => break e,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    r.warn(format!(
        "[parent] daemon {addr} does not answer now ({error}): a start goes ahead, but jobs with ranks beyond this point go round a ring (where their ranks named a coordinator) until it does; start the parent's daemon, or check its daemon.listen and the route to it through {}",
        p.interface
    ));
}
