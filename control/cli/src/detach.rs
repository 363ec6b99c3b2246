//! `xagg detach`: detach the dataplane and remove its pins, through the daemon when one
//! answers (which stops it), directly otherwise.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use xagg_api::{call, Request, Response, DEFAULT_PIN_PATH};

use crate::daemon::answer;

pub fn run(socket: &Path, pin_path: Option<PathBuf>) -> Result<()> {
    match call(socket, &Request::Status) {
        Ok(Response::Status {
            pin_path: theirs,
            ports,
            ..
        }) => {
            if let Some(mine) = &pin_path {
                if theirs.as_ref() != Some(mine) {
                    bail!(
                        "the daemon at {} pins its dataplane at {}, not {}: nothing detached. Pass the --socket of the daemon that pins at {}, or stop it and run this again",
                        socket.display(),
                        theirs.as_ref().map_or("nothing (it detaches on exit)".into(), |p| p.display().to_string()),
                        mine.display(),
                        mine.display()
                    );
                }
            }
            answer(call(socket, &Request::Detach)?)?;
            // The daemon answers, then stops: back only once it has (its lock file goes
            // last), so a daemon started next is not refused.
            let lock = PathBuf::from(format!("{}.lock", socket.display()));
            let since = std::time::Instant::now();
            while lock.exists() && since.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if lock.exists() {
                bail!(
                    "detached the dataplane, but the daemon at {} has not stopped after 10 s: see its log",
                    socket.display()
                );
            }
            println!(
                "detached the dataplane on {}{} and stopped the daemon at {}",
                ports.join(", "),
                theirs.map_or(String::new(), |p| format!(", pinned at {}", p.display())),
                socket.display()
            );
            Ok(())
        }
        Ok(r) => answer(r),
        Err(_) => {
            let pin_path = pin_path.unwrap_or_else(|| DEFAULT_PIN_PATH.into());
            // A running daemon that did not answer at this socket may still hold this
            // dataplane: removing its pins under it would lose its jobs unseen.
            let lock = xagg_linux::locks::dataplane_lock(&pin_path);
            if let Some(holder) = xagg_linux::locks::held(&lock) {
                let (pid, theirs) = holder.map_or(("?".into(), None), |h| {
                    (h.pid.to_string(), Some(h.socket).filter(|s| !s.is_empty()))
                });
                bail!(
                    "no daemon answered at {}, but the daemon with pid {pid} runs the dataplane pinned at {}: nothing detached. Detach it through that daemon: `xagg --socket {} detach`",
                    socket.display(),
                    pin_path.display(),
                    theirs.as_deref().unwrap_or("ITS_SOCKET")
                );
            }
            // Removing the pinned links and maps detaches the programs.
            if xagg_linux::pins::unpin(&pin_path)? {
                println!(
                    "no daemon answered; removed the pinned dataplane at {}",
                    pin_path.display()
                );
            } else {
                println!(
                    "nothing to detach: no daemon answered at {} and {} does not exist (a daemon elsewhere: give its --socket; a dataplane pinned elsewhere: --pin-path, its daemon.pin_path)",
                    socket.display(),
                    pin_path.display()
                );
            }
            Ok(())
        }
    }
}
