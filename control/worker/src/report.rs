//! What allreduces did: [`Report`] for one call of the library, [`RunReport`] for one run
//! of `xagg allreduce --json` (one line of JSON), which the demo, the bench and the tests
//! read back.

use serde::{Deserialize, Serialize};

/// The way a request's result was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// Aggregated by the switch.
    #[default]
    Switch,
}

/// What one allreduce did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// How the result was made.
    #[serde(default)]
    pub path: Path,
    pub bytes: usize,
    pub seconds: f64,
    pub goodput_gbps: f64,
    pub segments: usize,
    pub retransmissions: u64,
    /// Contributions sent after one with a higher segment index (with `reorder`).
    pub reordered: u64,
    /// Datagrams that read as results but came from elsewhere than the switch: dropped.
    #[serde(default)]
    pub refused: u64,
    /// Sends the host refused for a moment (a packet filter, full buffers): lost packets,
    /// recovered by retransmission.
    #[serde(default)]
    pub lost_sends: u64,
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
    /// Datagrams refused because they came from elsewhere than the switch.
    #[serde(default)]
    pub refused: u64,
    /// Sends the host refused for a moment, recovered as lost packets.
    #[serde(default)]
    pub lost_sends: u64,
    /// The first result checked against the inputs (with `--verify`).
    pub verified: bool,
    pub op: String,
    pub dtype: String,
    /// The largest float error relative to its bound (sums and means of floats).
    pub float_error_of_bound: f64,
    /// Machine-wide busy CPU seconds over the run.
    pub busy_seconds: f64,
    /// Bytes the member's interface sent over the run.
    pub tx_bytes: u64,
}
