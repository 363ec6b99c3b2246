//! A member's end of a link that results are redirected into — a rank's veth behind a
//! switch's or host aggregator's port, as ranks in containers sit — needs an XDP program
//! of its own: veth drops a frame redirected into it unless the peer end runs one. This
//! attaches `xagg_host` there (it passes everything to the kernel while no AF_XDP socket is
//! registered), frags-aware so the link may have any MTU, and pins its link so it outlives
//! the command that attached it (`xagg host attach`), until [`detach`]. The AF_XDP receive
//! path ([`crate::xsk`]) loads the same program through [`load`].

use std::path::{Path, PathBuf};

use aya::{
    programs::{links::FdLink, Xdp, XdpMode},
    Ebpf,
};
use xagg_linux::{xdp::Attached, XdpObject};

use crate::Error;

/// Where host ends are pinned: one directory per network namespace (by its inode, stable
/// while the namespace lives), one per interface in it.
pub const PIN_ROOT: &str = "/sys/fs/bpf/xagg-host";

/// The pin directory of the host end on `iface` in the network namespace of inode `netns`.
pub fn pin_dir(netns: u64, iface: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(netns.to_string()).join(iface)
}

/// Loads `xagg_host` from `object` and attaches it to `iface` (in the calling thread's
/// network namespace): native where the driver has it (veth does), generic otherwise.
/// Returns the object (the program stays attached while it lives, or its link is pinned)
/// and the attached link's id.
pub fn load(
    object: XdpObject,
    iface: &str,
) -> Result<(Ebpf, aya::programs::xdp::XdpLinkId), Error> {
    let mut ebpf = Ebpf::load(object.bytes().map_err(Error::NoObject)?).map_err(Error::Load)?;
    let prog: &mut Xdp = ebpf
        .program_mut("xagg_host")
        .ok_or(Error::NoProgram)?
        .try_into()
        .map_err(Error::Program)?;
    prog.load().map_err(Error::Program)?;
    let link = match prog.attach(iface, XdpMode::Driver) {
        Ok(link) => link,
        Err(native) => prog
            .attach(iface, XdpMode::Skb)
            .map_err(|_| Error::Attach {
                iface: iface.into(),
                native,
            })?,
    };
    Ok((ebpf, link))
}

/// What [`attach`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Attached now, in this mode.
    Attached(Attached),
    /// It was there already (pinned by an earlier attach), in this mode.
    Already(Attached),
}

/// [`attach`] in the network namespace `netns` (a file naming it: `/run/netns/NAME`,
/// `/proc/PID/ns/net`; `name` says which in errors), entered by a thread of its own so the
/// caller stays where it is; where it is pinned, with what happened.
pub fn attach_in(
    object: XdpObject,
    netns: &Path,
    name: &str,
    iface: &str,
) -> Result<(Outcome, PathBuf), Error> {
    use std::os::unix::fs::MetadataExt;
    let no = |error| Error::Netns {
        name: name.into(),
        file: netns.to_owned(),
        error,
    };
    let ns = std::fs::File::open(netns).map_err(no)?;
    let pin = pin_dir(ns.metadata().map_err(no)?.ino(), iface);
    let at = pin.clone();
    let iface = iface.to_owned();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| no(std::io::Error::from(e)))?;
            attach(object, &iface, &at)
        })
        .join()
        .map_err(|_| no(std::io::Error::other("the attaching thread panicked")))?
    })?;
    Ok((outcome, pin))
}

/// Attaches `xagg_host` to `iface` (in the calling thread's network namespace) and pins its
/// link in `pin`, unless it is there already. An interface running another XDP program is
/// refused, saying how to free it.
pub fn attach(object: XdpObject, iface: &str, pin: &Path) -> Result<Outcome, Error> {
    xagg_linux::iface::ifindex(iface)?;
    let mode = xagg_linux::xdp::attached(iface)?;
    let link = pin.join("link");
    if mode != Attached::None {
        if link.exists() {
            return Ok(Outcome::Already(mode));
        }
        return Err(Error::HostEndTaken {
            iface: iface.into(),
            mode: mode.name(),
        });
    }
    // A pin left by an interface that went away (its namespace deleted, then made again).
    let _ = xagg_linux::pins::unpin(pin);
    xagg_linux::pins::ensure_bpffs(Path::new(PIN_ROOT)).map_err(|e| Error::HostEndPin {
        path: pin.into(),
        error: e.to_string(),
    })?;
    let (mut ebpf, id) = load(object, iface)?;
    let prog: &mut Xdp = ebpf
        .program_mut("xagg_host")
        .ok_or(Error::NoProgram)?
        .try_into()
        .map_err(Error::Program)?;
    let owned = prog.take_link(id).map_err(Error::Program)?;
    let fd: FdLink = owned.try_into().map_err(|e| Error::HostEndPin {
        path: pin.into(),
        error: format!("{e}"),
    })?;
    std::fs::create_dir_all(pin).map_err(|e| Error::HostEndPin {
        path: pin.into(),
        error: e.to_string(),
    })?;
    fd.pin(&link).map_err(|e| Error::HostEndPin {
        path: link.clone(),
        error: format!("{e}"),
    })?;
    Ok(Outcome::Attached(xagg_linux::xdp::attached(iface)?))
}

/// Removes the host end pinned in `pin` (its program detaches); whether one was there.
pub fn detach(pin: &Path) -> Result<bool, Error> {
    let there = xagg_linux::pins::unpin(pin).map_err(|e| Error::HostEndPin {
        path: pin.into(),
        error: e.to_string(),
    })?;
    // The namespace's directory goes with its last interface.
    if let Some(parent) = pin.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(there)
}
