//! How an XDP program is attached to an interface, as the kernel says (rtnetlink's
//! `IFLA_XDP`): the mode a daemon configured as "auto" really got, or what holds a port.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{Error, Result};

/// The attach mode the kernel reports for an interface's XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    None,
    /// In the driver (`xdpdrv`, what `ip link` shows as `xdp`).
    Native,
    /// In the generic, skb-based path (`xdpgeneric`).
    Generic,
    /// On the NIC (`xdpoffload`).
    Offload,
    /// Programs in more than one mode at once.
    Several,
}

impl Attached {
    /// The name `switch.xdp_mode` and `xagg status` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Native => "native",
            Self::Generic => "generic",
            Self::Offload => "offload",
            Self::Several => "several",
        }
    }
}

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
/// The type bits of an attribute's type (the rest flag nesting and byte order).
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;

/// The XDP attach mode of interface `name` (in the calling thread's network namespace).
pub fn attached(name: &str) -> Result<Attached> {
    let index = crate::iface::ifindex(name)?;
    let failed = |errno| Error::Netlink {
        name: name.to_owned(),
        errno,
    };
    // Safety: a plain socket call; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(failed(nix::errno::Errno::last()));
    }
    // Safety: fd is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = NLMSG_HDRLEN + IFINFOMSG_LEN;
    let mut req = vec![0u8; len];
    req[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // ifinfomsg: family AF_UNSPEC, type, index, flags, change.
    req[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&(index as i32).to_ne_bytes());
    nix::unistd::write(&sock, &req).map_err(failed)?;
    let mut buf = vec![0u8; 64 * 1024];
    // Safety: buf is writable for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(failed(nix::errno::Errno::last()));
    }
    parse(&buf[..n as usize]).map_err(failed)
}

/// The attach mode in an answer to `RTM_GETLINK`.
fn parse(msg: &[u8]) -> std::result::Result<Attached, nix::errno::Errno> {
    use nix::errno::Errno;
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    if msg.len() < NLMSG_HDRLEN {
        return Err(Errno::EBADMSG);
    }
    let len = (u32::from_ne_bytes(msg[0..4].try_into().expect("4 bytes")) as usize).min(msg.len());
    match u16_at(msg, 4) {
        NLMSG_ERROR if len >= NLMSG_HDRLEN + 4 => {
            let code = i32::from_ne_bytes(msg[16..20].try_into().expect("4 bytes"));
            return Err(Errno::from_raw(-code));
        }
        RTM_NEWLINK => {}
        _ => return Err(Errno::EBADMSG),
    }
    let attrs = msg
        .get(NLMSG_HDRLEN + IFINFOMSG_LEN..len)
        .ok_or(Errno::EBADMSG)?;
    let Some(xdp) = attribute(attrs, IFLA_XDP) else {
        return Ok(Attached::None);
    };
    let Some(&mode) = attribute(xdp, IFLA_XDP_ATTACHED).and_then(|v| v.first()) else {
        return Ok(Attached::None);
    };
    Ok(match mode {
        0 => Attached::None,
        1 => Attached::Native,
        2 => Attached::Generic,
        3 => Attached::Offload,
        _ => Attached::Several,
    })
}

/// The value of attribute `kind` in a run of netlink attributes (4-byte aligned).
fn attribute(mut attrs: &[u8], kind: u16) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let ty = u16::from_ne_bytes([attrs[2], attrs[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if ty == kind {
            return Some(&attrs[4..len]);
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    fn link(attrs: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + IFINFOMSG_LEN + attrs.len();
        let mut m = vec![0u8; NLMSG_HDRLEN + IFINFOMSG_LEN];
        m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(attrs);
        m
    }

    #[test]
    fn reads_the_nested_attach_mode() {
        let mut attrs = attr(3, b"swp0\0");
        let nested = [attr(IFLA_XDP_ATTACHED, &[2]), attr(1, &[0; 4])].concat();
        attrs.extend(attr(IFLA_XDP | 0x8000, &nested));
        assert_eq!(parse(&link(&attrs)), Ok(Attached::Generic));
        assert_eq!(parse(&link(&attr(3, b"lo\0"))), Ok(Attached::None));
        let mut err = vec![0u8; 20];
        err[0..4].copy_from_slice(&20u32.to_ne_bytes());
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-19i32).to_ne_bytes());
        assert_eq!(parse(&err), Err(nix::errno::Errno::ENODEV));
    }

    #[test]
    fn loopback_has_no_program() {
        assert_eq!(attached("lo").unwrap(), Attached::None);
    }
}
