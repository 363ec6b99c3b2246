//! Interface facts read in the calling thread's network namespace (ioctl and netlink
//! sockets follow the thread's namespace; /sys does not).

use std::net::Ipv4Addr;

use nix::{ifaddrs::getifaddrs, net::if_::if_nametoindex};

use crate::{Error, Result};

pub fn ifindex(name: &str) -> Result<u32> {
    if_nametoindex(name).map_err(|errno| Error::NoInterface {
        name: name.to_owned(),
        errno,
    })
}

pub fn mac(name: &str) -> Result<[u8; 6]> {
    for a in getifaddrs()? {
        if a.interface_name != name {
            continue;
        }
        if let Some(link) = a.address.as_ref().and_then(|s| s.as_link_addr()) {
            if let Some(m) = link.addr() {
                return Ok(m);
            }
        }
    }
    Err(Error::NoMac {
        name: name.to_owned(),
    })
}

/// The interface that holds `ip`, if any.
pub fn holding(ip: Ipv4Addr) -> Result<Option<String>> {
    for a in getifaddrs()? {
        if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            if sin.ip() == ip {
                return Ok(Some(a.interface_name));
            }
        }
    }
    Ok(None)
}

/// The MTU of interface `name` (in the calling thread's network namespace).
pub fn mtu(name: &str) -> Result<usize> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|errno| Error::MtuSocket { errno })?;
    // Safety: a zeroed ifreq is valid; the name is copied in bounded and NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(Error::NameTooLong {
            name: name.to_owned(),
        });
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // Safety: SIOCGIFMTU reads the name and writes the MTU into `req`, which outlives it.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SIOCGIFMTU,
            &mut req,
        )
    };
    if r < 0 {
        return Err(Error::NoMtu {
            name: name.to_owned(),
            error: std::io::Error::last_os_error(),
        });
    }
    // Safety: the ioctl filled in the MTU member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || Error::NotMac { text: s.to_owned() };
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(m)
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Moves the calling thread into the network namespace `name` (as made by `ip netns add`).
/// Threads it starts afterwards inherit it; other threads keep theirs.
pub fn enter_netns(name: &str) -> Result<()> {
    let path = format!("/run/netns/{name}");
    let f = std::fs::File::open(&path).map_err(|error| Error::NoNetns {
        name: name.to_owned(),
        path: path.clone(),
        error,
    })?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| {
        Error::EnterNetns {
            name: name.to_owned(),
            errno,
        }
    })?;
    Ok(())
}
