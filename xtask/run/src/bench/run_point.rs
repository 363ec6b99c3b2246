//! The figures of one end-to-end point: goodput, latency, bytes on the wire, CPU.

use serde::Serialize;
use xagg_worker::report::{CpuWindow, RoundTrips};

use super::report::median;

/// One end-to-end measurement (the JSON's `runs`).
#[derive(Serialize, Clone, Debug)]
pub struct RunPoint {
    pub system: &'static str,
    pub workers: usize,
    pub bytes: usize,
    pub dtype: &'static str,
    /// S x 8 / t / 1e9, t the median over iterations of the slowest worker's time.
    pub goodput_gbps: f64,
    /// The median t, in µs (the latency at 4 KiB).
    pub latency_us: f64,
    /// Bytes each worker sent (interface tx counters) / S.
    pub wire_ratio: f64,
    /// CPU over exactly the timed windows (runs of 1 MiB and more).
    pub cpu: Option<CpuFigures>,
    /// The switch's runs: retransmissions per allreduce, all workers together (each one a
    /// contribution whose result did not come back within the retransmission timeout).
    pub retransmissions: Option<f64>,
    /// The switch's runs: packets the lab's interfaces dropped per allreduce (switch ports
    /// and workers' ends, received and sent).
    pub interface_drops: Option<f64>,
    /// The switch's runs: the segments' round trips (first sends to results, every
    /// worker's), µs, within 25 %.
    pub round_trip_us: Option<RoundTripFigures>,
    pub iterations: usize,
    /// Rounds whose medians these figures are (`--rounds`).
    pub rounds: usize,
    pub verified: bool,
    /// The MPI program's runs: the latency as osu_allreduce counts it (each rank's mean
    /// over its calls, timed alone after a warm-up, averaged over the ranks), µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub osu_us: Option<f64>,
    /// The drop-ins' programs: the calls timed back to back, as the switch's own workers
    /// time theirs (each call from the end of the rank's previous one, no barrier between
    /// them; the median of each call's slowest rank), µs — what their time over the switch
    /// path alone is reckoned from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub back_to_back_us: Option<f64>,
    /// The drop-ins' runs: where their calls went — "switch", or "routed" when the route
    /// by size (`XAGG_ROUTE`, its default here) sent them to Open MPI or Gloo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<&'static str>,
    /// The collective timed, where not allreduce (`cargo xtask bench --collectives`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collective: Option<&'static str>,
    /// Bytes each worker received (interface rx counters) / S, where measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_ratio: Option<f64>,
    /// Each round's goodput, in the order the rounds ran, where the point is the median of
    /// several: what a figure compared across worker counts is compared round by round.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goodput_rounds: Vec<f64>,
}

/// Quantiles of the segments' round trips, µs.
#[derive(Serialize, Clone, Copy, Debug)]
pub struct RoundTripFigures {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl RoundTripFigures {
    pub(super) fn new(r: &RoundTrips) -> Option<Self> {
        let q = |q| r.quantile(q).map(|us| us as f64);
        Some(Self {
            p50: q(0.5)?,
            p90: q(0.9)?,
            p99: q(0.99)?,
        })
    }
}

/// Machine-wide CPU seconds per GiB reduced (S x allreduces), counted over exactly the
/// timed windows: each allreduce from the earliest member's start to the latest member's
/// result, summed over the allreduces.
#[derive(Serialize, Clone, Debug)]
pub struct CpuFigures {
    /// Everything: the workers' processes and the kernel's network work.
    pub total_s_per_gib: f64,
    /// Process context (user and kernel mode): the workers, their system calls and the
    /// send path that runs inside them.
    pub process_s_per_gib: f64,
    /// Interrupt and softirq context: receive processing, where the switch's XDP
    /// programs run (and, for Open MPI, the bridge and TCP receive).
    pub softirq_s_per_gib: f64,
    /// Busy CPUs on average over the windows (at most the machine's CPU count).
    pub busy_cpus: f64,
    /// The windows' total length, seconds.
    pub window_s: f64,
}

impl CpuFigures {
    fn new(windows: &[CpuWindow], bytes: usize) -> Option<Self> {
        if windows.is_empty() {
            return None;
        }
        let gib = bytes as f64 * windows.len() as f64 / (1u64 << 30) as f64;
        let (mut user, mut system, mut softirq, mut secs) = (0.0, 0.0, 0.0, 0.0);
        for w in windows {
            let (u, s, q) = w.cpu();
            user += u;
            system += s;
            softirq += q;
            secs += w.seconds();
        }
        Some(Self {
            total_s_per_gib: (user + system + softirq) / gib,
            process_s_per_gib: (user + system) / gib,
            softirq_s_per_gib: softirq / gib,
            busy_cpus: (user + system + softirq) / secs,
            window_s: secs,
        })
    }
}

/// The per-allreduce windows of several members merged: allreduce k's window runs from
/// the earliest member's start to the latest member's end.
pub(super) fn merge_windows(members: &[&[CpuWindow]]) -> Vec<CpuWindow> {
    let k = members.iter().map(|w| w.len()).min().unwrap_or(0);
    (0..k)
        .map(|i| {
            members
                .iter()
                .map(|w| w[i])
                .reduce(CpuWindow::union)
                .expect("at least one member")
        })
        .collect()
}

impl RunPoint {
    /// One round's point: `times`, each allreduce's (its slowest member's) seconds; bytes
    /// each worker sent; the merged CPU windows.
    pub(super) fn new(
        system: &'static str,
        workers: usize,
        bytes: usize,
        times: Vec<f64>,
        tx_per_worker: f64,
        windows: &[CpuWindow],
        verified: bool,
    ) -> Self {
        let iterations = times.len();
        let t = median(times);
        Self {
            system,
            workers,
            bytes,
            dtype: "i32",
            goodput_gbps: bytes as f64 * 8.0 / t / 1e9,
            latency_us: t * 1e6,
            wire_ratio: tx_per_worker / (bytes as f64 * iterations as f64),
            cpu: CpuFigures::new(windows, bytes),
            iterations,
            rounds: 1,
            retransmissions: None,
            interface_drops: None,
            round_trip_us: None,
            verified,
            osu_us: None,
            back_to_back_us: None,
            path: None,
            collective: None,
            rx_ratio: None,
            goodput_rounds: Vec::new(),
        }
    }

    /// Total CPU s per GiB over the timed windows (NaN where not recorded).
    pub(super) fn cpu_total(&self) -> f64 {
        self.cpu.as_ref().map_or(f64::NAN, |c| c.total_s_per_gib)
    }
}

/// The rounds of one point merged: each figure the median over the rounds; verified only
/// if every round was.
pub(super) fn median_point(points: Vec<&RunPoint>) -> RunPoint {
    let m = |f: fn(&RunPoint) -> f64| median(points.iter().map(|p| f(p)).collect());
    let cpu = points.iter().all(|p| p.cpu.is_some()).then(|| {
        let c = |f: fn(&CpuFigures) -> f64| {
            median(
                points
                    .iter()
                    .filter_map(|p| p.cpu.as_ref().map(f))
                    .collect(),
            )
        };
        CpuFigures {
            total_s_per_gib: c(|c| c.total_s_per_gib),
            process_s_per_gib: c(|c| c.process_s_per_gib),
            softirq_s_per_gib: c(|c| c.softirq_s_per_gib),
            busy_cpus: c(|c| c.busy_cpus),
            window_s: c(|c| c.window_s),
        }
    });
    RunPoint {
        goodput_gbps: m(|p| p.goodput_gbps),
        latency_us: m(|p| p.latency_us),
        wire_ratio: m(|p| p.wire_ratio),
        cpu,
        retransmissions: points
            .iter()
            .all(|p| p.retransmissions.is_some())
            .then(|| m(|p| p.retransmissions.unwrap_or(0.0))),
        interface_drops: points
            .iter()
            .all(|p| p.interface_drops.is_some())
            .then(|| m(|p| p.interface_drops.unwrap_or(0.0))),
        round_trip_us: points
            .iter()
            .map(|p| p.round_trip_us)
            .collect::<Option<Vec<_>>>()
            .map(|r| {
                let q = |f: fn(&RoundTripFigures) -> f64| median(r.iter().map(f).collect());
                RoundTripFigures {
                    p50: q(|r| r.p50),
                    p90: q(|r| r.p90),
                    p99: q(|r| r.p99),
                }
            }),
        rounds: points.len(),
        verified: points.iter().all(|p| p.verified),
        osu_us: points
            .iter()
            .all(|p| p.osu_us.is_some())
            .then(|| m(|p| p.osu_us.unwrap_or(0.0))),
        back_to_back_us: points
            .iter()
            .all(|p| p.back_to_back_us.is_some())
            .then(|| m(|p| p.back_to_back_us.unwrap_or(0.0))),
        rx_ratio: points
            .iter()
            .all(|p| p.rx_ratio.is_some())
            .then(|| m(|p| p.rx_ratio.unwrap_or(0.0))),
        goodput_rounds: points.iter().map(|p| p.goodput_gbps).collect(),
        ..points[0].clone()
    }
}
