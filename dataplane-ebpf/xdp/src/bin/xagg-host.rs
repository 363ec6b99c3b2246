//! `xagg_host`, on a worker's interface (not the switch's), in an object of its own
//! (`xagg-host`): a worker, or a lab's rank behind veth, loads a few kilobytes and two
//! small maps instead of the switch's object and its slots.
//!
//! It steers the worker's results into its AF_XDP socket, and lets everything else in (a
//! frame redirected into a veth is dropped unless the peer end runs an XDP program).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{HashMap, XskMap},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use xagg_ebpf::packet::Udp4;

/// AF_XDP sockets of the workers on this interface, by receive queue.
#[btf_map]
static XSKS: XskMap<64> = XskMap::new();

/// UDP ports (network order) whose datagrams go to the receive queue's AF_XDP socket:
/// the ports of workers that receive results with AF_XDP.
#[btf_map]
static XSK_PORTS: HashMap<[u8; 2], u32, 64> = HashMap::new();

/// On a worker's interface: datagrams to a port in `XSK_PORTS` go straight to the
/// worker's AF_XDP socket (no socket buffer, no UDP stack); everything else, and
/// everything while no socket is registered, passes to the kernel.
///
/// Frags-aware, so the interface may carry frames of any MTU; the worker's socket takes
/// multi-buffer frames too (bound with `XDP_USE_SG`: one descriptor per buffer).
#[xdp(frags)]
pub fn xagg_host(ctx: XdpContext) -> u32 {
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()) else {
        return xdp_action::XDP_PASS;
    };
    if !frame.plain()
        || frame.fragment_offset() != 0
        || frame.more_fragments()
        || unsafe { XSK_PORTS.get(frame.udp().dst) }.is_none()
    {
        return xdp_action::XDP_PASS;
    }
    let queue = unsafe { (*ctx.ctx).rx_queue_index };
    XSKS.redirect(queue, xdp_action::XDP_PASS as u64)
        .unwrap_or_else(|fallback| fallback)
}
