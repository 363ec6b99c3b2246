//! Interface facts read in the calling thread's network namespace (ioctl and netlink
//! sockets follow the thread's namespace; /sys does not).

use std::net::Ipv4Addr;

use anyhow::{anyhow, Context, Result};
use nix::{ifaddrs::getifaddrs, net::if_::if_nametoindex};

pub fn ifindex(name: &str) -> Result<u32> {
    if_nametoindex(name).with_context(|| format!("no interface `{name}` in this network namespace"))
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
    Err(anyhow!("no MAC address for interface `{name}`"))
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
    .context("a socket to ask for an MTU")?;
    // Safety: a zeroed ifreq is valid; the name is copied in bounded and NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(anyhow!("`{name}` is too long for an interface name"));
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
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("no MTU for interface `{name}` in this network namespace"));
    }
    // Safety: the ioctl filled in the MTU member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("`{s}` is not a MAC address: write six hex bytes, e.g. 02:00:00:00:00:01");
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
    let f = std::fs::File::open(&path)
        .with_context(|| format!("network namespace `{name}` not found ({path})"))?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("cannot enter network namespace `{name}`"))?;
    Ok(())
}
