//! `xagg_host`, on a worker's interface (not the switch's): steers the worker's results
//! into its AF_XDP socket.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use xagg_ebpf::packet::Udp4;

use crate::maps::{XSKS, XSK_PORTS};

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
