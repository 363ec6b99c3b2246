//! The XDP programs of the aggregation switch: the object `xagg`, which the daemon attaches
//! to the switch's ports. Its maps are in `maps.rs`. A worker's program is in an object of
//! its own (`xagg-host`, `bin/xagg-host.rs`), and so are the bench's and the tests'
//! (`xagg-test`, `bin/xagg-test.rs`).
//!
//! - `xagg_switch` (`ingress.rs`), on every switch port: takes contributions addressed to
//!   the switch, checks them against their job and hands each to the fold program of its
//!   op and lane. Everything else passes to the kernel (the bridge) untouched.
//! - `xagg_fold_*` (`fold.rs`), one per op and lane (`Fold`) or group of them (min and max,
//!   the bitwise ops: `Fold::program`), reached by a tail call:
//!   aggregate the contribution in its slot and deliver a finished result — a
//!   single-buffer one broadcast through the devmap, a multi-buffer one passed to
//!   `xagg_fanout`. At an inner level (a host, a lower switch; `upward.rs`) a complete
//!   segment is a partial: it goes to the parent as this point's contribution, and the
//!   parent's result, taken only from the uplink, is stored and delivered to the members
//!   like a result of its own (`xagg_deliver`).
//! - `xagg_switch_steered` (`ingress.rs`) and `xagg_cpu_*` (`fold.rs`), run by the `CPUS`
//!   cpumap where the switch steers (`switch.steer_cpus`): `xagg_switch` hands an admitted
//!   contribution to its slot's CPU, and there it is checked again and folded as above.
//! - `xagg_result` (`egress.rs`), the devmap egress program: addresses each broadcast copy
//!   to the member behind the port it leaves through.
//! - `xagg_fanout` (`fanout.rs`), tc ingress on every switch port: sends a copy of each
//!   multi-buffer result to every member (the devmap broadcast cannot clone one).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomics on bpfel need core::intrinsics")]

mod egress;
mod fanout;
mod fold;
mod ingress;
mod maps;
mod upward;
