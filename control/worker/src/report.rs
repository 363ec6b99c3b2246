//! What allreduces did: [`Report`] for one call of the library, [`RunReport`] for one run
//! of `xagg allreduce --json` (one line of JSON), which the demo, the bench and the tests
//! read back.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The way a request's result was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// Aggregated by the switch.
    #[default]
    Switch,
    /// Aggregated by this rank's host and the switches above it.
    Tree,
    /// Aggregated round a ring of the job's hosts (no aggregating switch): see `why`.
    Ring,
}

impl Path {
    /// How a joined rank's allreduces go, for a line of news (`why`: the ring's reason).
    pub fn joined(&self, why: Option<&str>) -> String {
        match self {
            Self::Switch => "joined the switch".into(),
            Self::Tree => "joined through its host, which joined the switch (a tree)".into(),
            Self::Ring => format!("joined a ring of hosts ({})", why.unwrap_or("no switch")),
        }
    }
}

/// What one allreduce did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// How the result was made.
    #[serde(default)]
    pub path: Path,
    /// Why, when it is not the switch's doing (the ring: the switch refused the job, did
    /// not answer, or none is configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub bytes: usize,
    pub seconds: f64,
    pub goodput_gbps: f64,
    pub segments: usize,
    pub retransmissions: u64,
    /// Contributions sent after one with a higher segment index (with `reorder`).
    pub reordered: u64,
    /// Datagrams that read as results or replies but came from elsewhere than the switch, or
    /// without this member's cookie (forgeries): dropped.
    #[serde(default)]
    pub refused: u64,
    /// Sends the host refused for a moment (a packet filter, full buffers): lost packets,
    /// recovered by retransmission.
    #[serde(default)]
    pub lost_sends: u64,
    /// Each segment's round trip, from its contribution's first send to its result.
    #[serde(default)]
    pub round_trips: RoundTrips,
    /// Segments whose result came from a peer, the switch having stopped answering
    /// ([`Worker::recover`](crate::Worker::recover)).
    #[serde(default)]
    pub recovered: usize,
}

/// Round trips counted in buckets a quarter of a power of two wide (within 25 %), from a
/// microsecond up: where the time of a round goes (queueing shows as a long tail).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoundTrips(pub Vec<u64>);

impl RoundTrips {
    pub fn add(&mut self, rtt: Duration) {
        let i = bucket(rtt.as_micros().min(u64::MAX as u128) as u64);
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] += 1;
    }

    pub fn merge(&mut self, o: &Self) {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), 0);
        }
        self.0.iter_mut().zip(&o.0).for_each(|(a, b)| *a += b);
    }

    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The round trip `q` (0 to 1) of them are within, in microseconds (the upper bound of
    /// its bucket).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        self.0.iter().enumerate().find_map(|(i, &n)| {
            seen += n;
            (seen >= rank).then(|| upper(i))
        })
    }
}

/// The bucket of `us` microseconds: one each below 4, then four per power of two.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize;
    4 + 4 * (e - 2) + ((us >> (e - 2)) & 3) as usize
}

/// The least round trip (µs) above bucket `i`.
fn upper(i: usize) -> u64 {
    if i < 4 {
        return i as u64 + 1;
    }
    let (e, sub) = ((i - 4) / 4 + 2, (i - 4) % 4);
    (5 + sub as u64) << (e - 2)
}

/// One worker's run of `xagg allreduce --json`: `repeat` allreduces of the same buffer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub member: u8,
    pub bytes: usize,
    pub repeat: u32,
    /// The last allreduce's wall time from the common start (or its own start).
    pub seconds: f64,
    /// Every allreduce's wall time.
    pub seconds_all: Vec<f64>,
    pub goodput_gbps: f64,
    pub retransmissions: u64,
    pub reordered: u64,
    /// Datagrams refused because they came from elsewhere than the switch, or without this
    /// member's cookie.
    #[serde(default)]
    pub refused: u64,
    /// Sends the host refused for a moment, recovered as lost packets.
    #[serde(default)]
    pub lost_sends: u64,
    /// Every allreduce's segments' round trips.
    #[serde(default)]
    pub round_trips: RoundTrips,
    /// The first result checked against the inputs (with `--verify`).
    pub verified: bool,
    pub op: String,
    pub dtype: String,
    /// The largest float error relative to its bound (sums and means of floats).
    pub float_error_of_bound: f64,
    /// Each allreduce's timed window with the machine's CPU counters at both ends (with
    /// `--cpu-windows`).
    #[serde(default)]
    pub cpu_windows: Vec<CpuWindow>,
    /// Bytes the member's interface sent over the run.
    pub tx_bytes: u64,
    /// Bytes the member's interface received over the run.
    #[serde(default)]
    pub rx_bytes: u64,
}

/// The machine's CPU time counters (`/proc/stat`, all CPUs, in seconds) and the wall clock
/// at one instant. The kernel samples them at every clock tick (10 ms here): a figure over a
/// window is exact on average, within about two ticks per CPU for one window.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuSample {
    /// Nanoseconds since the Unix epoch (the same clock in every namespace).
    pub wall_ns: u64,
    /// Process context, user mode (nice included): the workers' own code.
    pub user: f64,
    /// Process context, kernel mode: system calls, copies, the send path up to the queue.
    pub system: f64,
    /// Interrupt and softirq context: the network's receive processing, where the switch's
    /// XDP program runs.
    pub softirq: f64,
}

impl CpuSample {
    /// The elementwise minimum (for a window's start) or maximum (its end): every counter
    /// only grows, so the earliest reading has the smallest values.
    fn pick(self, o: Self, f: fn(f64, f64) -> f64, g: fn(u64, u64) -> u64) -> Self {
        Self {
            wall_ns: g(self.wall_ns, o.wall_ns),
            user: f(self.user, o.user),
            system: f(self.system, o.system),
            softirq: f(self.softirq, o.softirq),
        }
    }
}

/// One timed window: an allreduce from its start to its result, with the machine's CPU
/// counters at both ends.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuWindow {
    pub start: CpuSample,
    pub end: CpuSample,
}

impl CpuWindow {
    /// The window covering both: from the earlier start to the later end (the members of
    /// one allreduce, each timing its own part).
    pub fn union(self, o: Self) -> Self {
        Self {
            start: self.start.pick(o.start, f64::min, u64::min),
            end: self.end.pick(o.end, f64::max, u64::max),
        }
    }

    pub fn seconds(&self) -> f64 {
        self.end.wall_ns.saturating_sub(self.start.wall_ns) as f64 / 1e9
    }

    /// CPU seconds in (process user, process kernel, softirq) over the window.
    pub fn cpu(&self) -> (f64, f64, f64) {
        (
            self.end.user - self.start.user,
            self.end.system - self.start.system,
            self.end.softirq - self.start.softirq,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_a_quarter() {
        for us in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            9,
            100,
            1000,
            10_000,
            11_000,
            1 << 40,
        ] {
            let i = bucket(us);
            assert!(upper(i) > us, "{us} below its bucket's bound");
            assert!(i == 0 || upper(i - 1) <= us, "{us} above the bucket before");
            assert!(us < 4 || upper(i) as f64 <= us as f64 * 1.25 + 1.0, "{us}");
        }
        let mut r = RoundTrips::default();
        for us in [10, 10, 10, 10_000] {
            r.add(Duration::from_micros(us));
        }
        assert_eq!(r.quantile(0.5), Some(upper(bucket(10))));
        assert_eq!(r.quantile(1.0), Some(upper(bucket(10_000))));
        let mut m = RoundTrips::default();
        m.merge(&r);
        m.merge(&r);
        assert_eq!(m.count(), 8);
    }
}
