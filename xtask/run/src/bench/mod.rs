//! Benchmarks: the switch against Open MPI and PyTorch end to end, the switch program's cost
//! per packet (BPF_PROG_RUN), the worker's conversions, the switch's capacity, and the levers
//! of its speed.
//!
//! - `dataplane`: the switch program's cost per path, through BPF_PROG_RUN;
//! - `codecs`: the worker's conversions;
//! - `end_to_end`: allreduces through the switch on a lab, and (`frameworks`) through Open
//!   MPI and PyTorch on the same lab, each point's figures a `run_point`;
//! - `capacity`: what one switch CPU takes, from one `generator`'s traffic; `send_path`: what
//!   that traffic costs the sending side;
//! - `levers`: each lever of the end-to-end speed off and on;
//! - `collectives`: reduce-scatter, all-gather, broadcast and reduce end to end;
//! - `report`: the tables, the plot, the JSON and the medians;
//! - `bundle`: the bench (all but PyTorch's runs) in a directory that runs on another
//!   machine.

pub mod bundle;
mod capacity;
mod codecs;
mod collectives;
mod cpu;
mod dataplane;
mod end_to_end;
mod frameworks;
mod generator;
mod levers;
mod report;
mod run_point;
mod send_path;

use std::path::PathBuf;

use anyhow::{Context, Result};

use end_to_end::{end_to_end, E2e};
use report::{
    codecs_table, compare_table, dataplane_table, draw, runs_tables, scaling, scaling_table,
    write_figures,
};

pub use frameworks::BenchDtype;
use xtask::build::target_dir;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Fewer samples: checks that the benchmark runs, not for figures.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the figures (JSON); default target/bench/bench.json.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to draw goodput against size (SVG); default target/bench/goodput.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Worker counts of the end-to-end runs.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub workers: Vec<usize>,
    /// Buffer sizes of the end-to-end runs (suffixes: KiB, MiB).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,16MiB,64MiB", value_parser = xagg_worker::parse_size)]
    pub sizes: Vec<usize>,
    /// Only the switch program's per-packet costs and the conversions.
    #[arg(long)]
    pub dataplane_only: bool,
    /// Only the switch program's per-packet costs, of this build and of the switch object
    /// at this path (e.g. another checkout's `target/ebpf/bpfel-unknown-none/release/xagg`,
    /// of the same layout version), timed interleaved: every round and every repeated call
    /// goes to each in turn, so both see the same conditions. Prints both and their ratio.
    #[arg(long, value_name = "OBJECT")]
    pub against: Option<PathBuf>,
    /// Leave out the switch's capacity (for quicker end-to-end comparisons).
    #[arg(long)]
    pub no_capacity: bool,
    /// End to end, the switch alone (no Open MPI runs): for profiles and A/B runs.
    #[arg(long)]
    pub switch_only: bool,
    /// End to end, no PyTorch runs (the switch's and Open MPI's only): where PyTorch is
    /// not installed, as on a bundle's machine.
    #[arg(long)]
    pub no_torch: bool,
    /// The drop-ins' runs' element type instead of int32 (float32, float64, float16,
    /// bfloat16: sums of small integers, exact in every order, checked bit for bit): what
    /// their routes by size are measured with per type. The end-to-end runs are then the
    /// drop-ins' and their baselines' alone (the switch's own workers sum int32): the MPI
    /// program's for float32 and float64, PyTorch's for every type.
    #[arg(long, value_enum, default_value_t)]
    pub dtype: BenchDtype,
    /// Also Open MPI and Gloo alone with the switch's programs on the path (systems
    /// `openmpi+switch`, `gloo+switch`): what ordinary traffic pays for crossing the
    /// switch, and the baseline of calls the drop-ins route to Open MPI or Gloo.
    #[arg(long)]
    pub mpi_on_switch: bool,
    /// i32 elements per segment of the switch's end-to-end runs; by default as many as the
    /// lab's MTU carries (2232 at 9000: multi-buffer frames on veth; 860 is the largest
    /// single-buffer veth frame).
    #[arg(long)]
    pub segment: Option<usize>,
    /// MTU of the end-to-end runs' lab links (both systems): 9000, jumbo frames, by
    /// default; 1500 as on most Ethernet networks. Segments stop at 8928 bytes (the
    /// switch's slots) whatever the MTU.
    #[arg(long, default_value_t = xagg_lab::lab::MTU)]
    pub mtu: usize,
    /// Slots (segments in flight per worker) of the switch's end-to-end runs.
    #[arg(long, default_value_t = SLOTS)]
    pub slots: u32,
    /// The switch's workers poll this many µs for results, yielding the CPU, before they
    /// sleep (`xagg allreduce --spin-us`); by default the worker's own default.
    #[arg(long, value_name = "US")]
    pub spin_us: Option<u64>,
    /// CPUs of the switch in the end-to-end runs, as on a switch host: its ports' packet
    /// processing (threaded NAPI, where its XDP programs run) pinned to them, e.g. `1` or
    /// `2-5`. Recorded in the JSON.
    #[arg(long, value_name = "CPUS")]
    pub switch_cpus: Option<xagg_lab::placement::Cpus>,
    /// CPUs of the workers in the switch's end-to-end runs: their processes and their
    /// interfaces' packet processing pinned to them. Recorded in the JSON.
    #[arg(long, value_name = "CPUS")]
    pub worker_cpus: Option<xagg_lab::placement::Cpus>,
    /// Fold each slot's contributions on one of the switch's CPUs (`--switch-cpus`, or
    /// every CPU), however they come in (`switch.steer_cpus`); the capacity runs steer to
    /// their one switch CPU, so that their figures give the steering's cost. Recorded in
    /// the JSON.
    #[arg(long)]
    pub steer: bool,
    /// Allreduces per end-to-end point, instead of 200 up to 64 KiB, 20 up to 1 MiB and 5
    /// above (e.g. many, to profile the steady state).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// End-to-end rounds, each over every worker count in turn, the systems alternating on
    /// the same lab; each figure is the median over the rounds (the VM drifts by a fifth
    /// from one run to the next, so worker counts are compared within a round's minutes).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Measure each lever of the switch's end-to-end speed on and off instead (4 workers,
    /// 64 MiB): segment length, slots in flight, UDP GSO, UDP GRO, AF_XDP receive.
    #[arg(long)]
    pub levers: bool,
    /// Measure the collectives besides allreduce instead: reduce-scatter, all-gather,
    /// broadcast and reduce through the switch, against the switch's allreduce of the same
    /// S and Open MPI's same call, at each of `--workers` and `--sizes`, `--rounds` rounds;
    /// with the bytes each rank sent and received over S.
    #[arg(long)]
    pub collectives: bool,
    /// Measure the send path instead: contributions sent with UDP GSO (as the workers do)
    /// and with AF_XDP, CPU per contribution on each side (4 members, full segments).
    #[arg(long)]
    pub send_path: bool,
    /// Write a self-contained directory instead, which runs this bench on another Linux
    /// x86-64 machine with no Rust toolchain, no Open MPI and no iproute2: the release
    /// binaries, the XDP objects, the MPI program, Debian's Open MPI and `ip` with the
    /// libraries they need, and a `run` script taking this command's options
    /// (docs/bench.md, "Running the bench on another machine").
    #[arg(long, value_name = "DIR")]
    pub bundle: Option<PathBuf>,
}

/// Slots of the switch's end-to-end runs unless `--slots` says otherwise.
pub const SLOTS: u32 = 128;
/// i32 elements per segment of the end-to-end runs unless `--segment` says otherwise: a full
/// segment, the fastest at 4 and 8 workers (docs/bench.md).
pub const SEGMENT: usize = xagg_common::wire::MAX_PAYLOAD / 4;

/// Runs what `a` asks for, prints the tables and writes the figures.
pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(dir) = &a.bundle {
        return bundle::write(dir);
    }
    if a.send_path {
        let r = send_path::send_path(a.quick);
        crate::demo::clean_up();
        let points = r?;
        return write_figures(
            a.json,
            "send_path",
            serde_json::json!({ "send_path": points }),
        );
    }
    if let Some(path) = &a.against {
        let other = std::fs::read(path)
            .with_context(|| format!("reading the switch object {}", path.display()))?;
        let mut both = dataplane::compare(a.quick, &[xagg_lab::Object::Switch.read()?, other])?;
        let (this, against) = (both.remove(0), both.remove(0));
        compare_table(&this, &against, &path.display().to_string());
        return write_figures(
            a.json,
            "compare",
            serde_json::json!({ "dataplane": this, "against": { "object": path, "dataplane": against } }),
        );
    }
    if a.levers {
        let r = levers::levers(a.quick);
        crate::demo::clean_up();
        let points = r?;
        return write_figures(a.json, "levers", serde_json::json!({ "levers": points }));
    }
    let segment = a
        .segment
        .unwrap_or(xagg_common::wire::payload_for_mtu(a.mtu) / 4);
    let placement = crate::demo::placement(&a.switch_cpus, &a.worker_cpus)?;
    if a.collectives {
        let sizes: Vec<usize> = if a.quick {
            a.sizes.iter().copied().filter(|&s| s <= 1 << 20).collect()
        } else {
            a.sizes.clone()
        };
        let r = collectives::collectives(&collectives::Runs {
            quick: a.quick,
            workers: &a.workers,
            sizes: &sizes,
            rounds: a.rounds,
            segment,
            mtu: a.mtu,
            slots: a.slots,
            placement: placement.clone(),
            mpi_on_switch: a.mpi_on_switch,
            torch: !a.no_torch,
            dtype: a.dtype,
        });
        crate::demo::clean_up();
        let points = r?;
        collectives::tables(&points, a.dtype);
        anyhow::ensure!(
            points.iter().all(|r| r.verified),
            "a run's result was wrong: its figures do not count"
        );
        return write_figures(
            a.json,
            "collectives",
            serde_json::json!({ "lab": { "mtu": a.mtu, "segment_elements": segment, "slots": a.slots, "placement": placement }, "collectives": points }),
        );
    }
    let capacity = if a.dataplane_only || a.no_capacity {
        Vec::new()
    } else {
        let r = capacity::run(a.quick, &a.workers, a.steer);
        crate::demo::clean_up();
        r?
    };
    let mut points = dataplane::dataplane(a.quick)?;
    points.extend(dataplane::contention(a.quick)?);
    points.extend(dataplane::float_sums(a.quick)?);
    let codec_points = codecs::codecs(a.quick);
    dataplane_table(&points, a.quick);
    codecs_table(&codec_points);
    let runs = if a.dataplane_only {
        Vec::new()
    } else {
        let sizes: Vec<usize> = if a.quick {
            a.sizes.iter().copied().filter(|&s| s <= 1 << 20).collect()
        } else {
            a.sizes.clone()
        };
        anyhow::ensure!(
            a.dtype == BenchDtype::Int32 || !a.switch_only,
            "--dtype times the drop-ins' runs: leave out --switch-only"
        );
        let r = end_to_end(&E2e {
            quick: a.quick,
            workers: &a.workers,
            sizes: &sizes,
            mpi: !a.switch_only && a.dtype.in_mpi(),
            mpi_on_switch: !a.switch_only && a.mpi_on_switch && a.dtype.in_mpi(),
            torch: !a.switch_only && !a.no_torch,
            dtype: a.dtype,
            iterations: a.iterations,
            rounds: a.rounds,
            segment,
            mtu: a.mtu,
            slots: a.slots,
            spin_us: a.spin_us,
            placement: placement.clone(),
            steer: crate::demo::steer_cpus(a.steer, &placement),
        });
        crate::demo::clean_up();
        r?
    };
    let scaling = scaling(&runs);
    if !runs.is_empty() {
        runs_tables(&runs, a.mtu, segment, a.dtype);
        scaling_table(&scaling, &placement.describe());
        let plot = a
            .plot
            .clone()
            .unwrap_or_else(|| target_dir().join("bench/goodput.svg"));
        draw(&runs, &plot)?;
        println!("plot written to {}", plot.display());
        anyhow::ensure!(
            runs.iter().all(|r| r.verified),
            "a run's result was wrong: its figures do not count"
        );
    }
    write_figures(
        a.json,
        "bench",
        serde_json::json!({
            "lab": { "mtu": a.mtu, "segment_elements": segment, "slots": a.slots, "spin_us": a.spin_us, "placement": placement, "steer_cpus": crate::demo::steer_cpus(a.steer, &placement), "dtype": a.dtype.name() },
            "runs": runs,
            "scaling": scaling,
            "dataplane": points,
            "codecs": codec_points,
            "capacity": capacity,
        }),
    )
}
