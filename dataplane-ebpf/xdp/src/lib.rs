//! What the crate's two objects share: parsing and rewriting frames ([`packet`]), the slot
//! state machine ([`slot`]) and the reductions ([`reduce`]). The programs and their maps
//! live in the binaries, `xagg` (the switch's object, `main.rs`), `xagg-host` (a worker's,
//! `bin/xagg-host.rs`) and `xagg-test` (the bench's and the tests' programs,
//! `bin/xagg-test.rs`): the linker keeps every program
//! and map of this library in every object that links it.
#![no_std]

pub mod packet;
pub mod reduce;
pub mod slot;

use aya_ebpf::helpers::bpf_get_prandom_u32;

/// Whether fault injection picks this packet, with probability `threshold` / 2^32.
#[inline(always)]
pub fn inject(threshold: u32) -> bool {
    threshold != 0 && unsafe { bpf_get_prandom_u32() } < threshold
}

/// tc actions: the packet goes on, or is dropped.
pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_SHOT: i32 = 2;

// What every object needs once: a panic handler (the verifier admits no panics, so none is
// reached), and the licence the kernel reads to allow GPL-only helpers.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
