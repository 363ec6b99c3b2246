//! The XDP objects built by `cargo xtask build`, embedded at build time: [`SWITCH`]
//! (`xagg`, which `xaggd` attaches) and [`HOST`] (`xagg-host`: a worker's `xagg_host` and
//! its two maps). Libraries take an [`XdpObject`] from the binary that uses them.

use xagg_linux::XdpObject;

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

// The objects' bytes, 8-byte aligned as the ELF loader wants them.
static SWITCH_BYTES: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/xagg.bpf.o")));
static HOST_BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/xagg-host.bpf.o"
)));

/// The switch's object: empty when it was not built.
pub const SWITCH: XdpObject = XdpObject::new(&SWITCH_BYTES.0);

/// A worker's object, holding `xagg_host`: empty when it was not built.
pub const HOST: XdpObject = XdpObject::new(&HOST_BYTES.0);
