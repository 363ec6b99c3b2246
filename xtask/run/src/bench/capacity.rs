//! The switch's capacity on its own: how many contributions one switch CPU takes per second,
//! result delivery included, with every member's traffic made by one generator.
//!
//! The lab's switch ports run their NAPI in kernel threads (`/sys/class/net/<port>/threaded`)
//! pinned to the switch CPU, so every contribution's XDP run, and the broadcast of every
//! result into the members' interfaces, happens there, whatever CPU sent it. The generator
//! and the members' receive side run on the other CPU. The generator sends each member's
//! contributions from that member's address (one UDP socket per member, inside its
//! namespace, GSO bursts of one member's consecutive rounds), varying message, segment,
//! slot and shadow copy as the workers' schedule does. It first sends as fast as it can,
//! then, where that loses contributions, at fixed lower rates, keeping the fastest with
//! under 0.1 % loss.
//!
//! A veth figure is a lower bound for a real NIC: here every packet also costs the sending
//! side's and the receiving side's veth work on the switch CPU.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde::Serialize;
use xagg_common::{
    wire::{self, DType},
    Counter,
};
use xagg_lab::{lab::Lab, placement::Placement, switch::LabSwitch};

use super::{cpu, end_to_end::add_job, generator::Generator};

/// The CPU the switch's NAPI threads are pinned to; the generator and the members' side
/// take CPU 0.
const SWITCH_CPU: usize = 1;
/// Slots of the measured job: rounds in flight per member.
pub(super) const SLOTS: u32 = 128;
/// The loss a sustained rate may have.
const MAX_LOSS: f64 = 0.001;

/// One capacity figure (the JSON's `capacity`).
#[derive(Serialize, Clone, Debug)]
pub struct CapacityPoint {
    pub members: usize,
    /// Elements (i32) per contribution, and its payload bytes.
    pub elements: usize,
    pub segment_bytes: usize,
    /// Contributions the switch took per second (results: this / members).
    pub contributions_per_s: f64,
    /// Contribution payload taken in, Gbit/s.
    pub gbps_in: f64,
    /// Elements reduced per second (contributions x elements).
    pub elements_per_s: f64,
    /// The switch CPU's busy share over the run (0..1).
    pub switch_cpu_busy: f64,
    /// Contributions per second of busy switch CPU: what one fully busy CPU takes, where the
    /// generator could not keep it busy.
    pub contributions_per_busy_s: f64,
    /// Rounds the generator sent that the switch did not complete / rounds sent.
    pub loss: f64,
    /// The generator's target rate (contributions/s); None: as fast as it could.
    pub paced_at: Option<f64>,
    /// `xagg_switch`'s own mean ns per run, from the kernel's BPF statistics (in a run of
    /// its own at the same rate: the statistics add clock reads).
    pub program_ns_per_packet: Option<f64>,
    /// `xagg_result` (the broadcast's egress program), ns per copy, same run.
    pub egress_ns_per_copy: Option<f64>,
    /// CPU seconds over the run, for the send-path measurement.
    #[serde(skip)]
    pub spent: Spent,
}

/// What one run took, and the CPU seconds it cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// Contributions the switch took.
    pub contributions: u64,
    /// The generator's thread (its system calls, and the send path run inside them).
    pub sender: f64,
    /// The generator's CPU in all (the members' receive side too).
    pub sending_cpu: f64,
    /// The switch CPU.
    pub switch_cpu: f64,
}

/// Capacity per member count and segment size.
pub fn run(quick: bool, members: &[usize], steer: bool) -> Result<Vec<CapacityPoint>> {
    if cpu::count() < 2 {
        eprintln!("capacity: SKIPPED, this machine has one CPU and the measurement needs two");
        return Ok(Vec::new());
    }
    // The generator pins the calling thread to CPU 0.
    cpu::keeping_affinity(|| points(quick, members, steer))
}

fn points(quick: bool, members: &[usize], steer: bool) -> Result<Vec<CapacityPoint>> {
    // Steered, the folds run in the cpumap's thread on the switch CPU: what steering costs.
    let steer_cpus = if steer { vec![SWITCH_CPU] } else { Vec::new() };
    let seconds = if quick { 0.3 } else { 2.0 };
    let mut out = Vec::new();
    for &n in members {
        let mut sw = crate::demo::start_switch(Lab::create(crate::demo::PREFIX, n)?, &steer_cpus)?;
        sw.lab.attach_hosts()?;
        thread_napi(&sw.lab)?;
        // 1 KiB, the longest single-buffer segment on veth, the longest (a 9000-byte MTU).
        let buffer = wire::BUFFER_PAYLOAD / 4;
        for (k, elements) in [256usize, buffer, DType::I32.max_elements()]
            .into_iter()
            .enumerate()
        {
            let job = 10 + k as u32;
            add_job(&sw, job, elements, SLOTS)?;
            let mut g = Generator::new(&sw.lab, job, elements, false)?;
            // A first short run warms the lab up (the first one after the lab came up
            // measured low); its figures are not kept.
            measure(&sw, &mut g, seconds / 4.0, None)?;
            let mut best = measure(&sw, &mut g, seconds, None)?;
            let mut rate = best.contributions_per_s;
            // Slower until the loss is under the bound (at most a few steps).
            for _ in 0..4 {
                if best.loss < MAX_LOSS {
                    break;
                }
                rate *= 0.85;
                best = measure(&sw, &mut g, seconds, Some(rate))?;
            }
            let stats = with_bpf_stats(n, || measure(&sw, &mut g, seconds, best.paced_at))?;
            best.program_ns_per_packet = stats.0;
            best.egress_ns_per_copy = stats.1;
            eprintln!(
                "capacity n={n} {:>4} elements: {:>9.0} contributions/s ({:.0} per busy CPU-second), {:.2} Gbit/s in, {:.2e} elements/s, switch CPU {:.0} % busy, loss {:.3} %{}, program {} ns/packet, egress {} ns/copy",
                elements,
                best.contributions_per_s,
                best.contributions_per_busy_s,
                best.gbps_in,
                best.elements_per_s,
                best.switch_cpu_busy * 100.0,
                best.loss * 100.0,
                best.paced_at.map_or(" (unpaced)".into(), |r| format!(" (paced at {r:.0}/s)")),
                best.program_ns_per_packet.map_or("?".into(), |v| format!("{v:.0}")),
                best.egress_ns_per_copy.map_or("?".into(), |v| format!("{v:.0}")),
            );
            out.push(best);
        }
        sw.lab.detach_hosts();
        sw.stop()?;
    }
    Ok(out)
}

/// Every switch port's NAPI in a thread pinned to [`SWITCH_CPU`]; every member interface's
/// in a thread on CPU 0. Threaded NAPI needs an XDP program on the interface (attached).
pub(super) fn thread_napi(lab: &Lab) -> Result<()> {
    let placement = Placement::new(vec![SWITCH_CPU], vec![0])?;
    placement.pin_switch(lab)?;
    placement.pin_workers(lab, std::time::Duration::ZERO)
}

/// Sends for `seconds` (paced at `rate` contributions/s, or as fast as possible) and
/// measures what the switch took, its CPU, and the rounds lost.
pub(super) fn measure(
    sw: &LabSwitch,
    g: &mut Generator,
    seconds: f64,
    rate: Option<f64>,
) -> Result<CapacityPoint> {
    cpu::pin_self(0)?;
    let n = g.sockets.len();
    // Let earlier rounds finish, so the counters see only this run's.
    std::thread::sleep(Duration::from_millis(100));
    let c0 = sw.counters()?;
    let cpu0 = cpu::busy(SWITCH_CPU)?;
    let sending0 = cpu::busy(0)?;
    let thread0 = cpu::thread_seconds()?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut rounds = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        if let Some(rate) = rate {
            // Bursts on schedule: never ahead of the target rate. Sleeping, not spinning,
            // so the generator's own CPU counts only what sending costs (a late wake-up
            // is made up by the next bursts going at once).
            let due = start + Duration::from_secs_f64(sent as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        sent += g.burst()?;
        rounds += g.burst as u64;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu1 = cpu::busy(SWITCH_CPU)?;
    let sending1 = cpu::busy(0)?;
    let mut spent = Spent {
        contributions: 0,
        sender: cpu::thread_seconds()? - thread0,
        sending_cpu: sending1.0 - sending0.0,
        switch_cpu: cpu1.0 - cpu0.0,
    };
    std::thread::sleep(Duration::from_millis(100));
    let c1 = sw.counters()?;
    let d = |c: Counter| delta(&c0, &c1, c.name());
    let taken = d(Counter::Contribution) + d(Counter::Complete);
    spent.contributions = taken;
    let completed = d(Counter::Complete);
    let segment_bytes = g.elements * 4;
    let per_s = taken as f64 / elapsed;
    let busy = ((cpu1.0 - cpu0.0) / (cpu1.1 - cpu0.1)).min(1.0);
    Ok(CapacityPoint {
        members: n,
        elements: g.elements,
        segment_bytes,
        contributions_per_s: per_s,
        gbps_in: per_s * segment_bytes as f64 * 8.0 / 1e9,
        elements_per_s: per_s * g.elements as f64,
        switch_cpu_busy: busy,
        contributions_per_busy_s: per_s / busy.max(f64::MIN_POSITIVE),
        loss: 1.0 - (completed as f64 / rounds as f64).min(1.0),
        paced_at: rate,
        program_ns_per_packet: None,
        egress_ns_per_copy: None,
        spent,
    })
}

fn delta(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, k: &str) -> u64 {
    b.get(k)
        .copied()
        .unwrap_or(0)
        .saturating_sub(a.get(k).copied().unwrap_or(0))
}

/// Runs `f` with the kernel's BPF statistics on, and returns the mean ns per run of
/// `xagg_switch` (tail calls included) and per result copy (`xagg_result`'s run, or
/// `xagg_fanout`'s over `r_members`) over it.
fn with_bpf_stats(
    r_members: usize,
    f: impl FnOnce() -> Result<CapacityPoint>,
) -> Result<(Option<f64>, Option<f64>)> {
    const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let was = std::fs::read_to_string(SYSCTL)?.trim().to_string();
    std::fs::write(SYSCTL, "1")?;
    let before = prog_stats();
    let r = f();
    let after = prog_stats();
    std::fs::write(SYSCTL, was)?;
    r?;
    let mean = |name: &str| -> Option<f64> {
        let (t0, c0) = before.get(name).copied().unwrap_or_default();
        let (t1, c1) = after.get(name).copied()?;
        (c1 > c0).then(|| (t1 - t0) as f64 / (c1 - c0) as f64)
    };
    // A multi-buffer result is copied by `xagg_fanout`, once per result for all members.
    let n = r_members as f64;
    let per_copy = mean("xagg_result").or_else(|| mean("xagg_fanout").map(|ns| ns / n));
    Ok((mean("xagg_switch"), per_copy))
}

/// Run time (ns) and run count of every loaded program, by name (summed over programs of
/// one name).
fn prog_stats() -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for info in aya::programs::loaded_programs().flatten() {
        let name = info.name_as_str().unwrap_or_default().to_string();
        let e = out.entry(name).or_default();
        e.0 += info.run_time().as_nanos() as u64;
        e.1 += info.run_count();
    }
    out
}
