//! Deployment: who may use the daemon's local API (the socket's mode and group), and the
//! systemd unit (`control/daemon/xaggd.service`): valid, in the host's mount namespace, and
//! enough for the daemon with the capabilities it keeps.

use std::{
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::{
        socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr},
        stat::{umask, Mode},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, setgid, setgroups, setuid, ForkResult, Gid, Group, Uid},
};
use xagg_api::{Request, Response, DEFAULT_SOCKET};
use xagg_tests::*;

/// The one-host deployment docs/topologies.md prints, run as printed.
mod one_host;

/// The two-host deployment docs/topologies.md prints, run as printed.
mod two_hosts;

/// The daemon's systemd unit, as shipped.
const UNIT: &str = include_str!("../../control/daemon/xaggd.service");

/// The unprivileged user the checks connect as.
const NOBODY: Uid = Uid::from_raw(65534);

/// Connects to the Unix socket `path` from a child process running as `uid` with group
/// `gid` and no supplementary groups: `Ok` if the connection is accepted, else the error.
fn connect_as(path: &Path, uid: Uid, gid: Gid) -> Result<(), Errno> {
    // Everything the child needs is prepared before the fork: after it, the child of this
    // multithreaded process makes only system calls, then `_exit`s with the errno.
    let addr = UnixAddr::new(path).expect("a socket path");
    // SAFETY: the child calls only async-signal-safe functions (system calls and _exit).
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = (|| {
                setgroups(&[])?;
                setgid(gid)?;
                setuid(uid)?;
                let fd = socket(
                    AddressFamily::Unix,
                    SockType::Stream,
                    SockFlag::empty(),
                    None,
                )?;
                connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)
            })()
            .map_or_else(|e| e as i32, |()| 0);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
            WaitStatus::Exited(_, 0) => Ok(()),
            WaitStatus::Exited(_, code) => Err(Errno::from_raw(code)),
            s => panic!("the connecting child ended with {s:?}"),
        },
    }
}

/// The process's umask, set until dropped.
struct Umask(Mode);

impl Umask {
    fn set(mask: u32) -> Self {
        Self(umask(Mode::from_bits_truncate(mask)))
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        umask(self.0);
    }
}

/// A group of this host other than root's, for the socket to be given.
fn some_group() -> Group {
    ["nogroup", "nobody", "daemon"]
        .iter()
        .find_map(|name| Group::from_name(name).ok().flatten())
        .expect("a group nogroup, nobody or daemon on this host")
}

#[test]
fn api_socket_mode_and_group() {
    if !require_root("api_socket_mode_and_group") {
        return;
    }
    let group = some_group();
    let other = Gid::from_raw(if group.gid.as_raw() == 65533 {
        65532
    } else {
        65533
    });
    let name = group.name.clone();
    let mut sw = TestSwitch::start("dp", 1, |c| {
        c.daemon.socket_mode = "0660".into();
        c.daemon.socket_group = Some(name);
    });
    // The lab's directory is the test's: let others reach the socket, so that the socket's
    // own mode decides.
    let dir = sw.socket.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

    let meta = std::fs::metadata(&sw.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o7777, 0o660, "daemon.socket_mode = \"0660\"");
    assert_eq!(meta.gid(), group.gid.as_raw(), "daemon.socket_group");
    assert_eq!(meta.uid(), 0, "the daemon's own user");
    // The group's members may use the API, anyone else is refused by connect.
    assert_eq!(connect_as(&sw.socket, NOBODY, group.gid), Ok(()));
    assert_eq!(connect_as(&sw.socket, NOBODY, other), Err(Errno::EACCES));
    // Told so by the CLI, with the socket's mode and group, not "is xaggd running?".
    let out = Command::new("setpriv")
        .arg(format!("--reuid={}", NOBODY.as_raw()))
        .arg(format!("--regid={}", other.as_raw()))
        .arg("--clear-groups")
        .arg(bin("xagg"))
        .arg("--socket")
        .arg(&sw.socket)
        .arg("status")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains("is not open to you (mode 0660, group ")
            && e.contains(&group.name)
            && !e.contains("is xaggd running"),
        "{e}"
    );

    // Owner only, and the socket in a directory the daemon makes: 0755 whatever the umask.
    sw.stop_daemon(Signal::SIGTERM);
    let sub = dir.join("run");
    let _ = std::fs::remove_dir_all(&sub);
    sw.socket = sub.join("xaggd.sock");
    let mut cfg = sw.default_config();
    // Out of the socket's directory, so that nothing else keeps it when the daemon stops.
    cfg.daemon.state_dir = dir.join("state-elsewhere");
    cfg.daemon.socket_mode = "0600".into();
    cfg.daemon.socket_group = Some(group.name.clone());
    sw.write_config(&cfg).unwrap();
    {
        // umask 0: without the daemon's own chmod its directory would be world-writable.
        let _umask = Umask::set(0);
        sw.start_daemon();
    }
    let dmeta = std::fs::metadata(&sub).unwrap();
    assert_eq!(dmeta.mode() & 0o7777, 0o755, "the socket's directory");
    let meta = std::fs::metadata(&sw.socket).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600, "daemon.socket_mode = \"0600\"");
    assert_eq!(meta.gid(), group.gid.as_raw(), "daemon.socket_group");
    assert_eq!(
        connect_as(&sw.socket, NOBODY, group.gid),
        Err(Errno::EACCES)
    );
    assert_eq!(connect_as(&sw.socket, NOBODY, other), Err(Errno::EACCES));
    // Root still manages the switch.
    assert!(matches!(sw.api(Request::Status), Response::Status { .. }));
    assert_eq!(
        connect_as(&sw.socket, Uid::from_raw(0), Gid::from_raw(0)),
        Ok(())
    );
    // Stopped, the daemon takes its socket away, and the directory it made for it.
    sw.stop_daemon(Signal::SIGTERM);
    assert!(!sw.socket.exists(), "the socket left behind");
    assert!(
        !sub.exists(),
        "the socket's directory left behind: {:?}",
        std::fs::read_dir(&sub).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}

/// Whether `tool` (run with `arg`) is installed. Without it the test skips loudly, except
/// under `CI=true`, where it fails: `cargo xtask setup` installs it.
fn require_tool(test: &str, tool: &str, arg: &str) -> bool {
    if Command::new(tool).arg(arg).output().is_ok() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: needs {tool} (`cargo xtask setup` installs it), and CI=true forbids skipping"
        );
    }
    eprintln!("\n*** SKIPPED {test}: needs {tool} (`cargo xtask setup` installs it) ***\n");
    false
}

/// The values of `key` in the unit, in order.
fn unit_values(key: &str) -> Vec<&'static str> {
    UNIT.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .map(str::trim)
        .collect()
}

/// The single value of `key` in the unit.
fn unit_value(key: &str) -> &'static str {
    match unit_values(key)[..] {
        [v] => v,
        ref vs => panic!("the unit sets {key} {} times", vs.len()),
    }
}

#[test]
fn unit_verifies() {
    if !require_tool("unit_verifies", "systemd-analyze", "--version") {
        return;
    }
    let exec = unit_value("ExecStart");
    assert_eq!(exec, "/usr/local/bin/xaggd --config /etc/xagg/xaggd.toml");
    let xaggd = bin("xaggd");
    assert!(
        xaggd.exists(),
        "{} (built by `cargo xtask build`)",
        xaggd.display()
    );
    // systemd-analyze checks that the binary exists: the one built here stands in for the
    // installed one.
    let dir = std::env::temp_dir().join(format!("xagg-test-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unit = dir.join("xaggd.service");
    let text = UNIT.replace(
        "ExecStart=/usr/local/bin/xaggd ",
        &format!("ExecStart={} ", xaggd.display()),
    );
    std::fs::write(&unit, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("running systemd-analyze");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("systemd-analyze verify: {}{stderr}", out.status);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    let about_ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("xaggd.service"))
        .collect();
    assert!(
        about_ours.is_empty(),
        "systemd-analyze verify: {about_ours:?}"
    );
}

#[test]
fn unit_keeps_the_dataplane_running() {
    for (key, value) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
        ("RuntimeDirectory", "xagg"),
        // Stopping the service must not delete the directory: other daemons' dataplane
        // locks are in it (without them a second daemon could adopt a running dataplane).
        ("RuntimeDirectoryPreserve", "yes"),
    ] {
        assert_eq!(unit_value(key), value, "{key}");
    }
    assert_eq!(
        Path::new(xagg_daemon::owner::DATAPLANE_LOCKS).parent(),
        Some(Path::new("/run"))
    );
    assert_eq!(
        PathBuf::from("/run").join(unit_value("RuntimeDirectory")),
        Path::new(xagg_daemon::owner::DATAPLANE_LOCKS)
    );
    // A configuration that does not load exits with the status the unit does not restart
    // (a daemon restarted every 2 s, failing the same way, forever).
    let dir = std::env::temp_dir().join(format!("xagg-test-unit-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("xaggd.toml");
    std::fs::write(
        &config,
        "[switch]\nports = [\"p0\"]\naddress = \"10.0.0.1\"\nportz = 1\n",
    )
    .unwrap();
    let out = Command::new(bin("xaggd"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stop: i32 = unit_value("RestartPreventExitStatus").parse().unwrap();
    assert_eq!(
        out.status.code(),
        Some(stop),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("portz"));
    // A start that fails otherwise (ports not there yet at boot, say) is retried, a few
    // times.
    assert!(unit_value("StartLimitBurst").parse::<u32>().unwrap() <= 10);
    // The default socket is in the directory systemd makes for the service.
    let run = PathBuf::from("/run").join(unit_value("RuntimeDirectory"));
    assert_eq!(Path::new(DEFAULT_SOCKET).parent(), Some(run.as_path()));
    // Each of these gives the service a mount (or network) namespace of its own, where a
    // bpffs it mounts vanishes with it, or where the ports are not.
    for key in [
        "PrivateMounts",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateNetwork",
        "PrivateUsers",
        "NetworkNamespacePath",
        "DynamicUser",
        "RootDirectory",
        "RootImage",
        "ReadWritePaths",
        "ReadOnlyPaths",
        "InaccessiblePaths",
        "TemporaryFileSystem",
        "BindPaths",
        "BindReadOnlyPaths",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectProc",
        "ProcSubset",
        "MountFlags",
        "MountAPIVFS",
    ] {
        assert!(unit_values(key).is_empty(), "the unit sets {key}");
    }
}

/// An `xaggd` started by a test, killed if still running when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts the lab's `xaggd` as the unit does: root with the unit's capability bounding
/// set and no new privileges (`setpriv`), then waits for its API.
fn start_as_the_unit(sw: &TestSwitch) -> Started {
    let caps: Vec<String> = unit_value("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| {
            let name = c
                .strip_prefix("CAP_")
                .expect("capability names start with CAP_");
            format!("+{}", name.to_lowercase())
        })
        .collect();
    assert_eq!(unit_value("NoNewPrivileges"), "yes");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&sw.log)
        .unwrap();
    let notify = Notify::bind(sw.config.parent().unwrap());
    let mut d = Started(
        Command::new("setpriv")
            .arg(format!("--bounding-set=-all,{}", caps.join(",")))
            .args(["--inh-caps=-all", "--no-new-privs", "--"])
            .arg(bin("xaggd"))
            .arg("--config")
            .arg(&sw.config)
            .env("NOTIFY_SOCKET", &notify.path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting xaggd under setpriv"),
    );
    // Type=notify: the daemon says READY=1 on NOTIFY_SOCKET once it serves.
    let notify = notify.recv_ready(&mut d.0, &sw.log);
    assert!(notify.contains("READY=1"), "{notify:?}");
    xagg_api::call(&sw.socket, &Request::Status).expect("the API answers once ready");
    // The daemon holds the unit's capabilities, those of them this host grants, no more.
    let unit_caps = caps.iter().fold(0u64, |m, c| m | 1 << cap_number(&c[1..]));
    assert_eq!(
        cap_set(d.0.id(), "CapEff"),
        unit_caps & cap_set(std::process::id(), "CapBnd"),
        "the daemon's capabilities: {caps:?} as far as this host has them"
    );
    d
}

/// A service manager's notification socket, as systemd gives a Type=notify service.
struct Notify {
    path: PathBuf,
    socket: std::os::unix::net::UnixDatagram,
}

impl Notify {
    fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Self { path, socket }
    }

    /// What the daemon sent first, within 15 s (failing if it exited first).
    fn recv_ready(&self, d: &mut Child, log: &Path) -> String {
        let until = std::time::Instant::now() + Duration::from_secs(15);
        let mut buf = [0u8; 512];
        loop {
            if let Ok(n) = self.socket.recv(&mut buf) {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
            if let Some(status) = d.try_wait().unwrap() {
                panic!(
                    "xaggd with the unit's capabilities exited ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(
                std::time::Instant::now() < until,
                "no notification from xaggd in 15 s: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

/// The number of the capability `name` (as setpriv writes it: `net_admin`).
fn cap_number(name: &str) -> u32 {
    match name {
        "chown" => 0,
        "net_admin" => 12,
        "sys_admin" => 21,
        "sys_resource" => 24,
        "perfmon" => 38,
        "bpf" => 39,
        _ => panic!(
            "add the number of CAP_{} (linux/capability.h)",
            name.to_uppercase()
        ),
    }
}

/// The capability set `field` (`CapEff`, `CapBnd`) of process `pid`.
fn cap_set(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap_or_else(|| panic!("{field} of process {pid}"))
}

/// Stops an `xaggd` with the unit's KillSignal, as `systemctl stop` does, and waits.
fn stop_as_the_unit(mut d: Started) {
    let signal: Signal = unit_value("KillSignal").parse().expect("a signal name");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.0.id() as i32), signal).unwrap();
    let status = d.0.wait().unwrap();
    assert!(status.success(), "xaggd stopped with {status}");
}

#[test]
fn daemon_runs_with_the_units_capabilities() {
    if !require_root("daemon_runs_with_the_units_capabilities")
        || !require_tool(
            "daemon_runs_with_the_units_capabilities",
            "setpriv",
            "--version",
        )
    {
        return;
    }
    let group = some_group().name;
    let mut sw = TestSwitch::start("dq", 2, |_| {});
    sw.stop_daemon(Signal::SIGTERM);
    let _ = xagg_daemon::dataplane::unpin(&sw.pin);
    // A fresh dataplane, loaded, attached and pinned with the unit's capabilities only; the
    // socket given a group (CAP_CHOWN).
    let mut cfg = sw.default_config();
    cfg.daemon.socket_group = Some(group.clone());
    sw.write_config(&cfg).unwrap();
    let d = start_as_the_unit(&sw);
    // A HUP (a `systemctl kill -s HUP`, a closed terminal) is said, and the daemon serves on.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.0.id() as i32), Signal::SIGHUP).unwrap();
    eventually("the HUP said", Duration::from_secs(5), || {
        let log = std::fs::read_to_string(&sw.log).unwrap_or_default();
        log.contains("SIGHUP: xaggd does not reload its configuration; restart it")
            .then_some(())
            .ok_or(log)
    });
    assert!(matches!(sw.api(Request::Status), Response::Status { .. }));
    let meta = std::fs::metadata(&sw.socket).unwrap();
    assert_eq!(
        Some(meta.gid()),
        Group::from_name(&group).unwrap().map(|g| g.gid.as_raw())
    );
    assert!(matches!(
        sw.add_job(7, 512, 8, &[0, 1]),
        Response::Job { .. }
    ));
    sw.allreduce(&Allreduce {
        job: 7,
        message: 0,
        segment: 512,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 5_000,
        seed: 1,
    });

    // `systemctl stop`: the daemon exits, the dataplane stays pinned and keeps aggregating.
    stop_as_the_unit(d);
    assert!(
        sw.pin.join("maps/JOBS").exists(),
        "the dataplane stays pinned"
    );
    sw.allreduce(&Allreduce {
        job: 7,
        message: 1,
        segment: 512,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 5_000,
        seed: 2,
    });

    // `systemctl start`: the daemon adopts it, the job included.
    let d = start_as_the_unit(&sw);
    match sw.api(Request::Status) {
        Response::Status { adopted, jobs, .. } => assert!(adopted && jobs == 1),
        r => panic!("{r:?}"),
    }
    sw.allreduce(&Allreduce {
        job: 7,
        message: 2,
        segment: 512,
        slots: 8,
        workers: &[0, 1],
        port: 47801,
        elems: 5_000,
        seed: 3,
    });
    stop_as_the_unit(d);
}
