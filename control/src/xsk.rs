//! A worker's AF_XDP receive path: results go from the NIC (or veth) straight into
//! buffers the worker posted beforehand, without socket buffers or the UDP stack.
//!
//! The worker attaches `xagg_host` to its interface, registers its UDP port in the
//! program's `XSK_PORTS` and its socket in `XSKS`; the program redirects datagrams for that
//! port into the socket and passes everything else to the kernel. Sending stays on the UDP
//! socket (GSO is the faster send path). Dropping the receiver detaches the program.
//!
//! One socket is bound to receive queue 0, so the interface must have a single receive
//! queue (veth does; `ethtool -L <if> combined 1` on a NIC). On veth AF_XDP runs in copy
//! mode: the kernel copies each frame into a posted buffer.

use std::{ffi::CString, io, num::NonZeroU32, os::fd::BorrowedFd, ptr::NonNull, time::Duration};

use aya::{
    maps::{HashMap, XskMap},
    programs::{Xdp, XdpMode},
    Ebpf,
};
use xdpilone::{DeviceQueue, IfInfo, RingRx, Socket, SocketConfig, Umem, UmemConfig, User};

/// Posted buffers: enough for every slot's result at once, with room to spare.
const FRAMES: u32 = 2048;
const FRAME_SIZE: u32 = 4096;
/// Ethernet + IPv4 (no options, as `xagg_host` checks) + UDP.
const UDP_PAYLOAD_OFFSET: usize = 14 + 20 + 8;

/// Page-aligned memory shared with the kernel; unmapped last.
struct Area(NonNull<[u8]>);

impl Drop for Area {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.0.as_ptr().cast(), self.0.len()) };
    }
}

pub struct XskReceiver {
    // Fields drop in this order: the program first (no more redirects), then the rings
    // and sockets, the memory last.
    _ebpf: Ebpf,
    rx: RingRx,
    fq: DeviceQueue,
    _user: User,
    _sock: Socket,
    _umem: Umem,
    area: Area,
    /// How long `receive` waits for a frame when blocking.
    pub wait: Duration,
}

fn err(what: &str) -> impl FnOnce(xdpilone::Errno) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{what}: {e}")
}

impl XskReceiver {
    /// Receives the datagrams sent to UDP `port` on interface `iface` (in the calling
    /// thread's network namespace) from now on.
    pub fn new(iface: &str, port: u16) -> anyhow::Result<Self> {
        use anyhow::{bail, Context};
        let queues = std::fs::read_dir(format!("/sys/class/net/{iface}/queues"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                    .count()
            })
            .unwrap_or(1);
        if queues > 1 {
            bail!(
                "AF_XDP receive binds one queue and {iface} has {queues} receive queues: \
                 `ethtool -L {iface} combined 1`, or receive without AF_XDP"
            );
        }
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this build carries no XDP object: run `cargo xtask build`");
        }
        let mut ebpf = Ebpf::load(crate::EBPF_OBJECT)?;
        {
            let mut ports: HashMap<_, [u8; 2], u32> =
                HashMap::try_from(ebpf.map_mut("XSK_PORTS").context("no XSK_PORTS map")?)?;
            ports.insert(port.to_be_bytes(), 0, 0)?;
        }
        let prog: &mut Xdp = ebpf
            .program_mut("xagg_host")
            .context("no xagg_host program")?
            .try_into()?;
        prog.load()?;
        // Native where the driver has it (veth does), generic otherwise.
        if let Err(native) = prog.attach(iface, XdpMode::Driver) {
            prog.attach(iface, XdpMode::Skb).map_err(|_| {
                anyhow::anyhow!(
                    "attaching xagg_host to {iface}: {native:#}; if another XDP program is \
                     attached (`ip link show {iface}`), detach it (`ip link set dev {iface} \
                     xdp off`) or receive without AF_XDP"
                )
            })?;
        }

        let len = (FRAMES * FRAME_SIZE) as usize;
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()).context("mapping the AF_XDP buffers");
        }
        let area = Area(NonNull::slice_from_raw_parts(
            NonNull::new(ptr.cast::<u8>()).expect("mmap succeeded"),
            len,
        ));
        let config = UmemConfig {
            fill_size: FRAMES,
            complete_size: FRAMES,
            frame_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
        };
        // Safety: the area is page aligned, FRAMES * FRAME_SIZE long, and outlives the Umem.
        let umem =
            unsafe { Umem::new(config, area.0) }.map_err(err("registering AF_XDP buffers"))?;
        let mut info = IfInfo::invalid();
        let name = CString::new(iface).context("interface name")?;
        info.from_name(&name).map_err(err("AF_XDP interface"))?;
        info.set_queue(0);
        let sock = Socket::with_shared(&info, &umem).map_err(err("creating an AF_XDP socket"))?;
        let mut fq = umem.fq_cq(&sock).map_err(err("AF_XDP fill ring"))?;
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: NonZeroU32::new(FRAMES),
                    tx_size: None,
                    bind_flags: 0,
                },
            )
            .map_err(err("AF_XDP receive ring"))?;
        let rx = user
            .map_rx()
            .map_err(err("mapping the AF_XDP receive ring"))?;
        umem.bind(&user)
            .map_err(err("binding the AF_XDP socket to queue 0"))?;
        {
            let mut fill = fq.fill(FRAMES);
            let n = fill.insert((0..FRAMES).map(|i| u64::from(i * FRAME_SIZE)));
            fill.commit();
            if n != FRAMES {
                bail!("posted {n} of {FRAMES} AF_XDP buffers");
            }
        }
        let mut xsks = XskMap::try_from(ebpf.map_mut("XSKS").context("no XSKS map")?)?;
        // Safety: the socket outlives this call; the map holds its own reference.
        let fd = unsafe { BorrowedFd::borrow_raw(rx.as_raw_fd()) };
        xsks.set(0, fd, 0)?;
        Ok(Self {
            _ebpf: ebpf,
            rx,
            fq,
            _user: user,
            _sock: sock,
            _umem: umem,
            area,
            wait: Duration::from_millis(10),
        })
    }

    /// Copies the UDP payload of the next received frame into `out` and returns its
    /// length; waits up to `wait` for one unless `nonblocking`.
    pub fn receive(&mut self, out: &mut [u8], nonblocking: bool) -> io::Result<usize> {
        loop {
            if self.rx.available() == 0 {
                if nonblocking {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let mut pfd = libc::pollfd {
                    fd: self.rx.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = self.wait.as_millis().clamp(1, i32::MAX as u128) as i32;
                let r = unsafe { libc::poll(&mut pfd, 1, ms) };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                if r == 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            let desc = {
                let mut ring = self.rx.receive(1);
                let d = ring.read();
                ring.release();
                d
            };
            let Some(desc) = desc else { continue };
            let (addr, len) = (desc.addr as usize, desc.len as usize);
            let mut n = 0;
            if addr + len <= self.area.0.len() && len >= UDP_PAYLOAD_OFFSET {
                // Safety: the kernel handed this chunk back to us; it is ours until posted
                // again below.
                let frame = unsafe {
                    std::slice::from_raw_parts(self.area.0.cast::<u8>().as_ptr().add(addr), len)
                };
                let d = &frame[UDP_PAYLOAD_OFFSET..];
                n = d.len().min(out.len());
                out[..n].copy_from_slice(&d[..n]);
            }
            // Post the chunk again (any address inside a chunk names the chunk).
            let mut fill = self.fq.fill(1);
            fill.insert_once(desc.addr);
            fill.commit();
            if n > 0 {
                return Ok(n);
            }
        }
    }
}
