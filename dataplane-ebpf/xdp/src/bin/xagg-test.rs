//! The bench's and the tests' programs, in an object of their own (`xagg-test`) so that
//! the switch's (`xagg`) carries none of them; neither shares a map with the switch.
//!
//! - `xagg_floor`: the bench's measuring stick, run through BPF_PROG_RUN, never attached.
//! - `xagg_impair`, tc egress on a lab worker's interface: counts the datagrams the worker
//!   sends to each collective port, and drops and duplicates a fraction of them.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{Array, PerCpuArray},
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};
use xagg_common::{
    job::Impair,
    wire::{self, Kind},
};
use xagg_ebpf::{
    inject, packet::Udp4, reduce, reduce::InFrame, slot::Slot, TC_ACT_OK, TC_ACT_SHOT,
};

/// The slot `xagg_floor` adds into: a switch slot's value, alone.
#[btf_map]
static FLOOR_SLOT: Array<Slot, 1> = Array::new();

/// A measuring stick for the bench, never attached: the accumulate path's add alone — the
/// same word-wide, unrolled sum of the frame's payload into the same kind of map value (a
/// slot's first copy) — without parsing, job lookup, lock or counters; for a frame of kind Result,
/// the complete path's add, which also writes the sum into the frame. The switch's
/// per-packet cost is judged against it.
#[xdp]
pub fn xagg_floor(ctx: XdpContext) -> u32 {
    let payload = ctx.data() + wire::PAYLOAD_OFFSET;
    let end = ctx.data_end();
    let (Some(slot), true) = (FLOOR_SLOT.get_ptr_mut(0), payload <= end) else {
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

/// `xagg_impair`'s counters: 0 dropped, 1 duplicated, then datagrams sent to the collective
/// port and each of the [`LANES`] - 1 after it (GSO bursts counted as one).
#[btf_map]
static IMPAIR_COUNTERS: PerCpuArray<u64, { 2 + LANES as usize }> = PerCpuArray::new();

/// Collective ports `xagg_impair` counts and impairs, from `Impair::port` on.
const LANES: u16 = 8;

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
    // IPv4 without options, UDP, to a collective port.
    let Some(frame) = Udp4::parse(ctx.data(), ctx.data_end()) else {
        return TC_ACT_OK;
    };
    let lane = u16::from_be_bytes(frame.udp().dst).wrapping_sub(u16::from_be_bytes(cfg.port));
    if !frame.plain() || lane >= LANES {
        return TC_ACT_OK;
    }
    impair_count(2 + u32::from(lane));
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
