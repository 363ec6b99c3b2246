//! What the daemon, the worker library and the lab take from the host they run on:
//! interface facts and network namespaces ([`iface`]), memory shared with the kernel
//! ([`pages`]), and, with the `object` feature, the XDP object built by `cargo xtask build`
//! ([`EBPF_OBJECT`]).

pub mod iface;
pub mod pages;

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The bytes of `aligned`, 8-byte aligned as the ELF loader wants them.
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/xagg.bpf.o")));

/// The XDP object, embedded at build time: empty without the `object` feature or when it
/// was not built.
pub static EBPF_OBJECT: &[u8] = &OBJECT.0;

/// Why the embedded object cannot be used, if it cannot.
pub fn object_missing() -> Option<&'static str> {
    EBPF_OBJECT.is_empty().then_some(
        "this build carries no XDP object: run `cargo xtask build` (or `cargo xtask demo`) and rebuild",
    )
}
