//! The lock files by which a daemon claims what it alone may use (its API socket, its
//! state directory, its pinned dataplane): flock'd for as long as it runs, naming it
//! (`pid=...`, `socket=...`), so that whoever finds one taken can say which daemon holds
//! it and how to reach it.

use std::{
    fs::File,
    io::{Read, Seek},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};

/// Where the locks of pinned dataplanes are kept: a bpffs holds no plain files.
pub const DATAPLANE_LOCKS: &str = "/run/xagg";

/// The lock file of the dataplane pinned at `pin`: its path with `%` and `/` escaped.
pub fn dataplane_lock(pin: &Path) -> PathBuf {
    let name = pin
        .to_string_lossy()
        .replace('%', "%25")
        .replace('/', "%2F");
    Path::new(DATAPLANE_LOCKS).join(format!("dataplane-{name}.lock"))
}

/// The daemon holding a lock: its pid and API socket, as it wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub socket: String,
}

/// Whether a daemon holds the lock file `path` now: `Some` with what it wrote of itself
/// (`None` inside if that cannot be read), `None` when no daemon holds it.
pub fn held(path: &Path) -> Option<Option<Holder>> {
    let mut file = File::open(path).ok()?;
    // A shared lock is granted unless a daemon holds the exclusive one.
    match Flock::lock(file.try_clone().ok()?, FlockArg::LockSharedNonblock) {
        Ok(f) => {
            drop(f);
            None
        }
        Err(_) => Some(read_holder(&mut file)),
    }
}

/// What the daemon that holds (or held) `file` wrote of itself.
pub fn read_holder(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    parse_holder(&text)
}

fn parse_holder(text: &str) -> Option<Holder> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .map(str::to_owned)
    };
    // A lock file of a daemon before these fields held only its pid.
    let pid = field("pid").or_else(|| Some(text.trim().to_owned()))?;
    Some(Holder {
        pid: pid.trim().parse().ok()?,
        socket: field("socket").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_read_back() {
        assert_eq!(
            parse_holder("pid=42\nsocket=/run/xagg/a.sock\n"),
            Some(Holder {
                pid: 42,
                socket: "/run/xagg/a.sock".into()
            })
        );
        assert_eq!(parse_holder("17").map(|h| h.pid), Some(17));
        assert_eq!(parse_holder(""), None);
        assert_eq!(
            dataplane_lock(Path::new("/sys/fs/bpf/xagg")),
            Path::new("/run/xagg/dataplane-%2Fsys%2Ffs%2Fbpf%2Fxagg.lock")
        );
    }

    /// A lock held exclusively (as a daemon holds it) is found held, with its holder; once
    /// let go, free.
    #[test]
    fn a_held_lock_is_found_held() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("xagg-lock-test-{}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        write!(f, "pid=7\nsocket=/run/x.sock\n").unwrap();
        assert_eq!(held(&path), None);
        let lock = Flock::lock(File::open(&path).unwrap(), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(
            held(&path),
            Some(Some(Holder {
                pid: 7,
                socket: "/run/x.sock".into()
            }))
        );
        drop(lock);
        assert_eq!(held(&path), None);
        let _ = std::fs::remove_file(&path);
    }
}
