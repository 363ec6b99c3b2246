//! Sending contributions with AF_XDP instead of a UDP socket, for the send-path measurement
//! (`cargo xtask bench --send-path`): whole Ethernet frames written into memory shared with
//! the kernel and handed over by descriptor, a frame past one 4 KiB chunk as a chain of
//! descriptors (`XDP_PKT_CONTD`). On veth this is copy mode: the kernel builds a socket
//! buffer from each frame and transmits it on the interface, in the sending system call.
//!
//! Only the bench uses it; the worker sends with UDP GSO.

use std::{ffi::CString, num::NonZeroU32};

use anyhow::{bail, Context, Result};
use xagg_linux::pages::Pages;
use xdpilone::{
    xdp::XdpDesc, DeviceQueue, IfInfo, RingTx, Socket, SocketConfig, Umem, UmemConfig, User,
};

const CHUNK: usize = 4096;
/// Bind flags: copy mode (veth has no zero copy), multi-buffer frames (`XDP_USE_SG`).
const XDP_COPY: u16 = 1 << 1;
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: more buffers of the same frame follow.
const XDP_PKT_CONTD: u32 = 1;

pub struct XskSender {
    /// Frames that fit the memory at once (each `per_frame` chunks).
    frames: usize,
    per_frame: usize,
    /// Bytes of one frame.
    len: usize,
    /// The next frame to write, and the frames handed to the kernel and not completed.
    next: usize,
    in_flight: usize,
    /// Chunks completed of a frame whose last chunks have not been yet.
    completed: usize,
    // Drop order: rings and sockets, then the memory.
    tx: RingTx,
    cq: DeviceQueue,
    _user: User,
    _sock: Socket,
    _umem: Umem,
    area: Pages,
}

// Safety: the sender owns its socket, rings and memory outright (no other handle to them
// exists in the process), so moving it to another thread moves all of it.
unsafe impl Send for XskSender {}

fn err(what: &str) -> impl FnOnce(xdpilone::Errno) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{what}: {e}")
}

impl XskSender {
    /// A sender on queue 0 of `iface` (in the calling thread's network namespace) with room
    /// for `frames` copies of `frame`, written once; [`XskSender::send`] then rewrites only
    /// bytes of each copy it sends.
    pub fn new(iface: &str, frame: &[u8], frames: usize) -> Result<Self> {
        let per_frame = frame.len().div_ceil(CHUNK);
        let chunks = frames * per_frame;
        let area = Pages::map(chunks * CHUNK).context("the AF_XDP buffers")?;
        let ring = (chunks as u32).next_power_of_two();
        let config = UmemConfig {
            fill_size: 64,
            complete_size: ring,
            frame_size: CHUNK as u32,
            headroom: 0,
            flags: 0,
        };
        // Safety: the area is page aligned, `chunks * CHUNK` long, and outlives the Umem.
        let umem = unsafe { Umem::new(config, area.as_non_null()) }
            .map_err(err("registering AF_XDP buffers"))?;
        let mut info = IfInfo::invalid();
        let name = CString::new(iface).context("interface name")?;
        info.from_name(&name).map_err(err("AF_XDP interface"))?;
        info.set_queue(0);
        let sock = Socket::with_shared(&info, &umem).map_err(err("creating an AF_XDP socket"))?;
        let cq = umem.fq_cq(&sock).map_err(err("AF_XDP completion ring"))?;
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: None,
                    tx_size: NonZeroU32::new(ring),
                    bind_flags: XDP_COPY | XDP_USE_SG,
                },
            )
            .map_err(err("AF_XDP transmit ring"))?;
        let tx = user
            .map_tx()
            .map_err(err("mapping the AF_XDP transmit ring"))?;
        umem.bind(&user)
            .map_err(err("binding the AF_XDP socket to queue 0"))?;
        let mut s = Self {
            frames,
            per_frame,
            len: frame.len(),
            next: 0,
            in_flight: 0,
            completed: 0,
            tx,
            cq,
            _user: user,
            _sock: sock,
            _umem: umem,
            area,
        };
        for f in 0..frames {
            s.frame_mut(f).copy_from_slice(frame);
        }
        Ok(s)
    }

    /// Frame `f`'s bytes: its chunks are consecutive.
    fn frame_mut(&mut self, f: usize) -> &mut [u8] {
        let at = f * self.per_frame * CHUNK;
        // Safety: within the area; frames do not overlap, and a frame handed to the kernel
        // is written again only after its completion.
        unsafe { std::slice::from_raw_parts_mut(self.area.base().add(at), self.len) }
    }

    /// Sends `count` frames, `edit(k, frame)` writing what differs in the k-th (into a
    /// copy no longer in flight), and waits until the kernel took them all.
    pub fn send(&mut self, count: usize, mut edit: impl FnMut(usize, &mut [u8])) -> Result<()> {
        if count > self.frames {
            bail!("{count} frames at once, room for {}", self.frames);
        }
        while self.frames - self.in_flight < count {
            self.reap();
            if self.frames - self.in_flight < count {
                self.tx.wake();
            }
        }
        let descs: Vec<XdpDesc> = (0..count)
            .flat_map(|k| {
                let f = (self.next + k) % self.frames;
                (0..self.per_frame).map(move |c| (f, c))
            })
            .map(|(f, c)| {
                let last = c + 1 == self.per_frame;
                XdpDesc {
                    addr: ((f * self.per_frame + c) * CHUNK) as u64,
                    len: if last {
                        (self.len - c * CHUNK) as u32
                    } else {
                        CHUNK as u32
                    },
                    options: if last { 0 } else { XDP_PKT_CONTD },
                }
            })
            .collect();
        for k in 0..count {
            let f = (self.next + k) % self.frames;
            edit(k, self.frame_mut(f));
        }
        // The ring has room for every frame in flight, but a reservation sees the room the
        // kernel last published: whatever does not fit goes in once it shows more.
        let mut put = 0;
        while put < descs.len() {
            let mut w = self.tx.transmit((descs.len() - put) as u32);
            put += w.insert(descs[put..].iter().copied()) as usize;
            w.commit();
            drop(w);
            if put < descs.len() {
                self.tx.wake();
            }
        }
        self.next = (self.next + count) % self.frames;
        self.in_flight += count;
        // Copy mode transmits a bounded batch per call: call until every descriptor is read.
        while self.tx.pending() > 0 {
            self.tx.wake();
        }
        self.reap();
        Ok(())
    }

    /// Counts the frames whose transmission completed (the last chunk of each).
    fn reap(&mut self) {
        let mut c = self.cq.complete(u32::MAX);
        while c.read().is_some() {
            self.completed += 1;
        }
        c.release();
        drop(c);
        self.in_flight -= self.completed / self.per_frame;
        self.completed %= self.per_frame;
    }
}
