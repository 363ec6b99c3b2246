//! What the daemon, the worker library and the lab take from the host they run on:
//! interface facts and network namespaces ([`iface`]), memory shared with the kernel
//! ([`pages`]), and, with the `object` feature, the XDP objects built by `cargo xtask build`
//! ([`EBPF_OBJECT`], the switch's; [`HOST_OBJECT`], a worker's).

mod error;
pub mod iface;
pub mod pages;
pub mod pins;

pub use error::{Error, Result};

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

// The objects' bytes, 8-byte aligned as the ELF loader wants them.
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/xagg.bpf.o")));
static HOST: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/xagg-host.bpf.o"
)));

/// The switch's XDP object (`xagg`), embedded at build time: empty without the `object`
/// feature or when it was not built.
pub static EBPF_OBJECT: &[u8] = &OBJECT.0;

/// A worker's XDP object (`xagg-host`: `xagg_host` and its two maps), embedded like
/// [`EBPF_OBJECT`].
pub static HOST_OBJECT: &[u8] = &HOST.0;

/// Why the embedded object cannot be used, if it cannot.
pub fn object_missing() -> Option<&'static str> {
    (EBPF_OBJECT.is_empty() || HOST_OBJECT.is_empty()).then_some(
        "this build carries no XDP object: run `cargo xtask build` (or `cargo xtask demo`) and rebuild",
    )
}
