//! Deployment: who may use the daemon's local API (the socket's mode and group).

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use nix::{
    errno::Errno,
    sys::{
        socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr},
        stat::{umask, Mode},
        wait::{waitpid, WaitStatus},
    },
    unistd::{fork, setgid, setgroups, setuid, ForkResult, Gid, Group, Uid},
};
use xagg_daemon::api::{Request, Response};
use xagg_tests::*;

/// The unprivileged user the checks connect as.
const NOBODY: Uid = Uid::from_raw(65534);

/// Connects to the Unix socket `path` from a child process running as `uid` with group
/// `gid` and no supplementary groups: `Ok` if the connection is accepted, else the error.
fn connect_as(path: &std::path::Path, uid: Uid, gid: Gid) -> Result<(), Errno> {
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

    // Owner only, and the socket in a directory the daemon makes: 0755 whatever the umask.
    sw.stop_daemon(Signal::SIGTERM);
    let sub = dir.join("run");
    let _ = std::fs::remove_dir_all(&sub);
    sw.socket = sub.join("xaggd.sock");
    let mut cfg = sw.default_config();
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
}
