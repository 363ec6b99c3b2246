//! The XDP programs of the aggregation switch: the object `xagg`, which the daemon attaches
//! to the switch's ports and the worker library to a worker's interface. Its maps are in
//! `maps.rs`. It also carries the bench's `xagg_floor` and the tests' `xagg_impair`.
//!
//! - `xagg_switch` (`ingress.rs`), on every switch port: takes contributions addressed to
//!   the switch, checks them against their job and hands each to the fold program of its
//!   op and lane. Everything else passes to the kernel (the bridge) untouched.
//! - `xagg_fold_*` (`fold.rs`), one per op and lane (`Fold`), reached by a tail call:
//!   aggregate the contribution in its slot and deliver a finished result — a
//!   single-buffer one broadcast through the devmap, a multi-buffer one passed to
//!   `xagg_fanout`. At an inner level (a host, a lower switch; `upward.rs`) a complete
//!   segment is a partial: it goes to the parent as this point's contribution, and the
//!   parent's result, taken only from the uplink, is stored and delivered to the members
//!   like a result of its own (`xagg_deliver`).
//! - `xagg_result` (`egress.rs`), the devmap egress program: addresses each broadcast copy
//!   to the member behind the port it leaves through.
//! - `xagg_fanout` (`fanout.rs`), tc ingress on every switch port: sends a copy of each
//!   multi-buffer result to every member (the devmap broadcast cannot clone one).
//! - `xagg_host` (`host.rs`), on a worker's interface: steers results into the worker's
//!   AF_XDP socket when it has one, and lets everything else in (a frame redirected into a
//!   veth is dropped unless the peer end runs an XDP program).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomics on bpfel need core::intrinsics")]

mod egress;
mod fanout;
mod fold;
mod host;
mod ingress;
mod maps;
mod upward;

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{Array, PerCpuArray},
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};
use xagg_common::{
    job::Impair,
    slot::MAX_SLOTS,
    wire::{self, Kind},
};
use xagg_ebpf::{inject, packet::Udp4, reduce, reduce::InFrame, TC_ACT_OK, TC_ACT_SHOT};

use crate::maps::SLOTS;

/// A measuring stick for the bench, never attached: the accumulate path's add alone — the
/// same word-wide, unrolled sum of the frame's payload into the same map value (the last
/// slot's first copy) — without parsing, job lookup, lock or counters; for a frame of kind Result,
/// the complete path's add, which also writes the sum into the frame. The switch's
/// per-packet cost is judged against it.
#[xdp]
pub fn xagg_floor(ctx: XdpContext) -> u32 {
    let payload = ctx.data() + wire::PAYLOAD_OFFSET;
    let end = ctx.data_end();
    let (Some(slot), true) = (SLOTS.get_ptr_mut(MAX_SLOTS - 1), payload <= end) else {
        return xdp_action::XDP_ABORTED;
    };
    // The word count from the header and checked against the frame, as the switch does.
    let hdr = unsafe { &*((payload - wire::HEADER_LEN) as *const xagg_common::Header) };
    let words = wire::payload_len(hdr.count() as usize, 4) / 8;
    if payload + words * 8 != end {
        return xdp_action::XDP_ABORTED;
    }
    let write = hdr.kind == Kind::Result as u8;
    reduce::sum_32(
        unsafe { &mut (*slot).shadow[0] },
        &InFrame { payload, end },
        words,
        write,
    );
    xdp_action::XDP_DROP
}

/// Impairment settings of `xagg_impair` (one entry).
#[btf_map]
static IMPAIR: Array<Impair, 1> = Array::new();

/// `xagg_impair`'s counters: 0 dropped, 1 duplicated.
#[btf_map]
static IMPAIR_COUNTERS: PerCpuArray<u64, 2> = PerCpuArray::new();

/// Marks the copies `xagg_impair` makes, so they pass it untouched the second time.
const IMPAIR_MARK: u32 = 0x7861_6767;

/// tc egress program on a worker's interface, for tests and demos: drops and duplicates a
/// fraction of the contributions the worker sends (these kernels have no netem).
#[classifier]
pub fn xagg_impair(ctx: TcContext) -> i32 {
    let Some(cfg) = IMPAIR.get(0) else {
        return TC_ACT_OK;
    };
    let skb = ctx.skb.skb;
    let mark = unsafe { (*skb).mark };
    if mark == IMPAIR_MARK {
        return TC_ACT_OK;
    }
    // IPv4 without options, UDP, to the collective port.
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()) else {
        return TC_ACT_OK;
    };
    if !frame.plain() || frame.udp().dst != cfg.port {
        return TC_ACT_OK;
    }
    if inject(cfg.drop) {
        impair_count(0);
        return TC_ACT_SHOT;
    }
    if inject(cfg.duplicate) {
        ctx.set_mark(IMPAIR_MARK);
        let ifindex = unsafe { (*skb).ifindex };
        if ctx.clone_redirect(ifindex, 0).is_ok() {
            impair_count(1);
        }
        ctx.set_mark(mark);
    }
    TC_ACT_OK
}

#[inline(always)]
fn impair_count(i: u32) {
    if let Some(p) = IMPAIR_COUNTERS.get_ptr_mut(i) {
        unsafe { *p += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
