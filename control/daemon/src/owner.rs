//! One daemon per API socket, per pinned dataplane and per state directory: each is
//! claimed by a lock file (flock, released when the process ends however it ends) that
//! names its owner, so a second daemon is refused saying which one holds it and how to
//! stop that one without dropping its jobs. A daemon that stops removes its lock files
//! while it still holds them; a daemon that locks a file checks that it is still the one
//! the path names, so a file removed meanwhile is never taken for the claim.

use std::{
    fs::File,
    io::{Seek, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
pub use xagg_linux::locks::{dataplane_lock, Holder, DATAPLANE_LOCKS};
use xagg_linux::locks::{held, read_holder};

use crate::{config::Config, Error, Result};

/// The locks a running daemon holds; dropped with it, removing their files.
pub struct Owner {
    held: Vec<(PathBuf, Flock<File>)>,
    /// The runtime directories the locks' files made (the socket's, the dataplane locks'),
    /// the deepest first: removed after them where nothing else is in them.
    made: Vec<PathBuf>,
    /// The state directory (and parents) this claim made: removed as the runtime ones are
    /// unless the daemon started ([`Owner::started`]), so a refused start leaves none.
    made_to_keep: Vec<PathBuf>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Removed while locked: a daemon that opened the file before it went finds it
        // unnamed once it has the lock, and opens the path again. The socket's goes last:
        // once it is gone, every claim is free (`xagg detach` waits for it).
        for (path, lock) in self.held.drain(..).rev() {
            let _ = std::fs::remove_file(&path);
            drop(lock);
        }
        // Another daemon's files, or the API socket still there, keep a directory.
        for dir in self.made.iter().chain(&self.made_to_keep) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Whether `file` is the file `path` names now.
fn still_named(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// A resource a daemon claims, and the configuration key that names it.
struct Claim {
    lock: PathBuf,
    what: String,
    key: &'static str,
    /// The mode of the lock's directory, should it be created.
    dir_mode: u32,
    /// Whether that directory is the daemon's for as long as it runs only (not the state
    /// directory, which outlives it).
    runtime: bool,
}

fn claims(cfg: &Config) -> Vec<Claim> {
    let d = &cfg.daemon;
    let mut c = vec![
        Claim {
            lock: PathBuf::from(format!("{}.lock", d.socket.display())),
            what: format!("serves the API socket {}", d.socket.display()),
            key: "daemon.socket",
            dir_mode: 0o755,
            runtime: true,
        },
        Claim {
            lock: d.state_dir.join("xaggd.lock"),
            what: format!(
                "keeps its joined jobs in the state directory {}",
                d.state_dir.display()
            ),
            key: "daemon.state_dir",
            // The state file holds the joined jobs' secrets.
            dir_mode: 0o700,
            runtime: false,
        },
    ];
    if !d.detach_on_exit {
        c.push(Claim {
            lock: dataplane_lock(&d.pin_path),
            what: format!("runs the dataplane pinned at {}", d.pin_path.display()),
            key: "daemon.pin_path",
            dir_mode: 0o755,
            runtime: true,
        });
    }
    c
}

impl Owner {
    /// Claims the configuration's socket, state directory and (when pinned) pin path, or
    /// says which daemon holds the first one taken.
    pub fn claim(cfg: &Config) -> Result<Self> {
        let mut owner = Self {
            held: Vec::new(),
            made: Vec::new(),
            made_to_keep: Vec::new(),
        };
        for c in claims(cfg) {
            let mut tries = 0;
            let locked = loop {
                let (file, made) = open(&c.lock, c.dir_mode)?;
                if c.runtime {
                    owner.made.extend(made);
                } else {
                    owner.made_to_keep.extend(made);
                }
                match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                    // Its daemon removed it as it stopped: the path's file is another.
                    Ok(f) if !still_named(&f, &c.lock) && tries < 10 => tries += 1,
                    other => break other,
                }
            };
            match locked {
                Ok(mut f) => {
                    let io = |error| Error::Lock {
                        path: c.lock.clone(),
                        error,
                    };
                    f.set_len(0).map_err(io)?;
                    f.rewind().map_err(io)?;
                    write!(
                        f,
                        "pid={}\nsocket={}\n",
                        std::process::id(),
                        cfg.daemon.socket.display()
                    )
                    .map_err(io)?;
                    owner.held.push((c.lock, f));
                }
                Err((mut file, _)) => return Err(taken(&c, read_holder(&mut file))),
            }
        }
        Ok(owner)
    }

    /// The daemon started: the state directory it made stays when it stops.
    pub fn started(&mut self) {
        self.made_to_keep.clear();
    }
}

/// Who holds each of the configuration's claims now, as refusals a start would give.
pub fn holders(cfg: &Config) -> Vec<Error> {
    let mut out = Vec::new();
    for c in claims(cfg) {
        if let Some(holder) = held(&c.lock) {
            out.push(taken(&c, holder));
        }
    }
    out
}

fn taken(c: &Claim, h: Option<Holder>) -> Error {
    let (pid, socket) = h.map_or((None, None), |h| (Some(h.pid), Some(h.socket)));
    Error::Taken {
        what: c.what.clone(),
        key: c.key,
        pid,
        socket,
    }
}

/// Opens (or creates) the lock file `path`, and any missing directory of its with
/// `dir_mode`: the file and the directories made.
fn open(path: &Path, dir_mode: u32) -> Result<(File, Vec<PathBuf>)> {
    let lock_error = |error| Error::Lock {
        path: path.to_owned(),
        error,
    };
    let mut made = Vec::new();
    // Twice: a daemon stopping may remove the directory, empty a moment, between the two
    // steps.
    for _ in 0..2 {
        if let Some(dir) = path.parent() {
            made.extend(create_dir(dir, dir_mode).map_err(lock_error)?);
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            r => return Ok((r.map_err(lock_error)?, made)),
        }
    }
    Err(lock_error(std::io::ErrorKind::NotFound.into()))
}

/// Creates a missing directory (and its parents) with `mode` whatever the umask (0755:
/// readable by all, writable only by the daemon). An existing directory is left as it is.
/// Returns the directories it made, the deepest first (what to remove again, in order).
/// Another process making one of them at the same moment (daemons started together under
/// one new parent directory) is no error: that one is theirs.
pub fn create_dir(dir: &Path, mode: u32) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    let mut made = Vec::new();
    for d in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
                made.push(d.to_path_buf());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    made.reverse();
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemons_started_together_make_their_directories_under_one_new_parent() {
        let base = std::env::temp_dir().join(format!("xagg-owner-race-{}", std::process::id()));
        for round in 0..20 {
            let parent = base.join(round.to_string());
            let made: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..8)
                    .map(|i| {
                        let dir = parent.join("state").join(format!("xagg{i}"));
                        s.spawn(move || create_dir(&dir, 0o755))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (i, m) in made.iter().enumerate() {
                let m = m
                    .as_ref()
                    .unwrap_or_else(|e| panic!("round {round}, daemon {i}: {e}"));
                // Its own directory first; the shared ones only by whoever made them.
                assert_eq!(m[0], parent.join("state").join(format!("xagg{i}")));
            }
            let shared = made
                .iter()
                .flat_map(|m| m.as_ref().unwrap())
                .filter(|d| **d == parent)
                .count();
            assert_eq!(shared, 1, "round {round}: one maker of the shared parent");
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
