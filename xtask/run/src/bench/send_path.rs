//! The send path on its own: what a contribution costs the sending side's CPU with UDP GSO
//! and with AF_XDP.

use anyhow::Result;
use serde::Serialize;
use xagg_common::wire::DType;
use xagg_lab::lab::Lab;

use super::{
    capacity::{measure, thread_napi, SLOTS},
    cpu,
    end_to_end::add_job,
    generator::{Generator, SendWith},
};

/// One run of the send-path measurement (the JSON's `send_path`).
#[derive(Serialize, Clone, Debug)]
pub struct SendPathPoint {
    pub send_with: &'static str,
    pub members: usize,
    pub segment_bytes: usize,
    /// The target rate (contributions/s); None: as fast as the generator could.
    pub paced_at: Option<f64>,
    pub contributions_per_s: f64,
    pub loss: f64,
    /// CPU µs per contribution: the sending thread, the sending CPU in all (the members'
    /// receive side included), the switch CPU, and the sum of the two CPUs.
    pub sender_us: f64,
    pub sending_cpu_us: f64,
    pub switch_cpu_us: f64,
    pub total_us: f64,
}

/// The send path on its own: the same contributions (4 members, full segments) sent with
/// UDP GSO, as the workers do, and with AF_XDP, alternating; first as fast as the generator
/// can, then both at one rate below either's maximum; the CPU per contribution on each
/// side.
pub fn send_path(quick: bool) -> Result<Vec<SendPathPoint>> {
    anyhow::ensure!(
        cpu::count() >= 2,
        "the send-path measurement needs two CPUs"
    );
    cpu::keeping_affinity(|| send_path_points(quick))
}

fn send_path_points(quick: bool) -> Result<Vec<SendPathPoint>> {
    let (n, seconds, rounds) = (4, if quick { 0.3 } else { 2.0 }, if quick { 1 } else { 3 });
    let mut sw = crate::demo::start_switch(Lab::create(crate::demo::PREFIX, n)?, &[])?;
    sw.lab.attach_hosts()?;
    thread_napi(&sw.lab)?;
    let (job, elements) = (20, DType::I32.max_elements());
    add_job(&sw, job, elements, SLOTS)?;
    let mut g = Generator::new(&sw.lab, job, elements, true)?;
    let mut out = Vec::new();
    let run = |g: &mut Generator, with, rate| -> Result<SendPathPoint> {
        g.with = with;
        let p = measure(&sw, g, seconds, rate)?;
        let us = |s: f64| s * 1e6 / p.spent.contributions.max(1) as f64;
        let point = SendPathPoint {
            send_with: with.name(),
            members: n,
            segment_bytes: p.segment_bytes,
            paced_at: rate,
            contributions_per_s: p.contributions_per_s,
            loss: p.loss,
            sender_us: us(p.spent.sender),
            sending_cpu_us: us(p.spent.sending_cpu),
            switch_cpu_us: us(p.spent.switch_cpu),
            total_us: us(p.spent.sending_cpu + p.spent.switch_cpu),
        };
        // A way of sending that does not reach the switch fails the measurement.
        anyhow::ensure!(
            point.contributions_per_s > 0.0 && point.loss < 0.5,
            "sending with {}: the switch took {:.0} contributions/s, {:.1} % of rounds lost",
            point.send_with,
            point.contributions_per_s,
            point.loss * 100.0
        );
        eprintln!(
            "send path {:>7}{}: {:>7.0} contributions/s, loss {:.3} %, CPU µs per contribution: sender {:.2}, sending CPU {:.2}, switch CPU {:.2}, both {:.2}",
            point.send_with,
            rate.map_or(" (unpaced)".into(), |r| format!(" (paced at {r:.0}/s)")),
            point.contributions_per_s,
            point.loss * 100.0,
            point.sender_us,
            point.sending_cpu_us,
            point.switch_cpu_us,
            point.total_us,
        );
        Ok(point)
    };
    // Warm up both ways; not kept.
    for with in [SendWith::Gso, SendWith::AfXdp] {
        g.with = with;
        measure(&sw, &mut g, seconds / 4.0, None)?;
    }
    for _ in 0..rounds {
        for with in [SendWith::Gso, SendWith::AfXdp] {
            out.push(run(&mut g, with, None)?);
        }
    }
    let slowest = out
        .iter()
        .map(|p| p.contributions_per_s)
        .fold(f64::INFINITY, f64::min);
    let rate = (slowest * 0.7).round();
    for _ in 0..rounds {
        for with in [SendWith::Gso, SendWith::AfXdp] {
            out.push(run(&mut g, with, Some(rate))?);
        }
    }
    drop(g);
    sw.lab.detach_hosts();
    sw.stop()?;
    Ok(out)
}
