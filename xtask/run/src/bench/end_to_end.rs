//! The end-to-end runs: allreduces through the switch, then through Open MPI and PyTorch,
//! on the same lab.

use anyhow::Result;
use xagg_api::Response;
use xagg_common::{
    wire::{DType, Lane, Op},
    JobShape,
};
use xagg_lab::{lab::Lab, placement::Placement, switch::LabSwitch, workers::AllreduceRun};
use xagg_worker::report::{CpuWindow, RoundTrips};

use super::{
    frameworks::{mpi_run, mpi_setup, torch_runs, BenchDtype},
    report::round_line,
    run_point::{median_point, merge_windows, RoundTripFigures, RunPoint},
};

/// Sizes whose runs record CPU windows: the readings delay the next allreduce by some µs,
/// which would show in small-message latency.
pub(super) const CPU_WINDOWS_FROM: usize = 1 << 20;

/// What [`end_to_end`] runs.
pub struct E2e<'a> {
    pub quick: bool,
    pub workers: &'a [usize],
    pub sizes: &'a [usize],
    /// Open MPI's runs besides the switch's.
    pub mpi: bool,
    /// Open MPI alone also with the switch's programs on the path.
    pub mpi_on_switch: bool,
    /// PyTorch's runs besides the switch's.
    pub torch: bool,
    /// The drop-ins' runs' element type: other than int32, the switch's own runs are left
    /// out (its workers sum int32).
    pub dtype: BenchDtype,
    /// Allreduces per point instead of the size's default.
    pub iterations: Option<usize>,
    /// Rounds, each over every worker count (a lab each), the switch's runs then Open MPI's
    /// on it: every figure is the median over the rounds, so both systems, and every worker
    /// count, see the VM's drift alike.
    pub rounds: usize,
    /// i32 elements per segment of the switch's runs.
    pub segment: usize,
    /// The lab links' MTU.
    pub mtu: usize,
    /// Slots of the switch's runs.
    pub slots: u32,
    /// The workers' polling before they sleep, µs (`xagg allreduce --spin-us`).
    pub spin_us: Option<u64>,
    /// The CPUs of the switch's ports and of the workers (the switch's runs).
    pub placement: Placement,
    /// The CPUs the switch folds each slot's contributions on (none: where they come in).
    pub steer: Vec<usize>,
}

impl E2e<'_> {
    /// Allreduces per point of `bytes`: `--iterations`, else by size.
    fn iterations_at(&self, bytes: usize) -> usize {
        self.iterations
            .unwrap_or_else(|| iterations(bytes, self.quick))
    }
}

/// Both systems on the same lab topology, for each worker count and size.
pub fn end_to_end(e: &E2e) -> Result<Vec<RunPoint>> {
    let iterations = |bytes| e.iterations_at(bytes);
    let mpi_bin = mpi_setup()?;
    // Rounds outermost, each over every worker count on a lab of its own: the VM's speed
    // drifts by a fifth within minutes, and figures compared across worker counts (n x
    // per-worker goodput at n = 8 against n = 2) are fair only if taken close in time.
    let mut rounds: Vec<Vec<Vec<RunPoint>>> = vec![Vec::new(); e.workers.len()];
    for round in 0..e.rounds.max(1) {
        for (i, &n) in e.workers.iter().enumerate() {
            let lab = Lab::with_mtu(crate::demo::PREFIX, n, e.mtu)?;
            let mut this = Vec::new();
            // Switch workers receive with AF_XDP: each attaches its own xagg_host.
            let sw = crate::demo::start_switch(lab, &e.steer)?;
            e.placement.pin_switch(&sw.lab)?;
            add_job(&sw, crate::demo::JOB_ID, e.segment, e.slots)?;
            let mut mid = 0u32;
            let switch = e.dtype == BenchDtype::Int32;
            if switch {
                switch_points(e, &sw.lab, true, &mut mid, round, &mut this)?;
            }
            // The same MPI program as Open MPI's runs, with the MPI library preloaded:
            // its MPI_Allreduce through the switch.
            // Its ranks receive on plain UDP sockets, which on veth needs the host program.
            let mut sw = sw;
            if e.mpi || e.torch {
                sw.lab.attach_hosts()?;
            }
            for &bytes in e.sizes.iter().filter(|_| e.mpi) {
                let r = mpi_run(
                    &sw.lab,
                    &mpi_bin,
                    bytes,
                    iterations(bytes),
                    "mpi+xagg",
                    e.dtype,
                )?;
                round_line(round, &r);
                this.push(r);
            }
            for &bytes in e.sizes.iter().filter(|_| e.mpi_on_switch) {
                let r = mpi_run(
                    &sw.lab,
                    &mpi_bin,
                    bytes,
                    iterations(bytes),
                    "openmpi+switch",
                    e.dtype,
                )?;
                round_line(round, &r);
                this.push(r);
            }
            if e.torch {
                for r in torch_runs(&sw.lab, "torch+xagg", e.sizes, iterations, None, e.dtype)? {
                    round_line(round, &r);
                    this.push(r);
                }
                if e.mpi_on_switch {
                    for r in torch_runs(&sw.lab, "gloo+switch", e.sizes, iterations, None, e.dtype)?
                    {
                        round_line(round, &r);
                        this.push(r);
                    }
                }
            }
            if switch && (e.mpi || e.torch) {
                // The switch path as the drop-ins take it (results on a UDP socket, not
                // AF_XDP): their time over it is what they add to the switch path.
                switch_points(e, &sw.lab, false, &mut mid, round, &mut this)?;
            }
            sw.lab.detach_hosts();
            // Open MPI runs over the plain bridge: the switch's programs detached.
            let lab = sw.stop()?;
            for &bytes in e.sizes.iter().filter(|_| e.mpi) {
                let r = mpi_run(&lab, &mpi_bin, bytes, iterations(bytes), "openmpi", e.dtype)?;
                round_line(round, &r);
                this.push(r);
            }
            if e.torch {
                for r in torch_runs(&lab, "gloo", e.sizes, iterations, None, e.dtype)? {
                    round_line(round, &r);
                    this.push(r);
                }
            }
            rounds[i].push(this);
        }
    }
    // Point k of every round of a worker count is the same system and size.
    let mut runs = Vec::new();
    for of_n in &rounds {
        for k in 0..of_n[0].len() {
            runs.push(median_point(of_n.iter().map(|r| &r[k]).collect()));
        }
    }
    Ok(runs)
}

/// The switch's runs of every size on the lab's job (`crate::demo::JOB_ID`), its workers
/// receiving with AF_XDP (each attaching its own `xagg_host`; system `switch`) or on UDP
/// sockets (the lab's host programs attached; [`SWITCH_SOCKET`]), message ids from `*mid`.
fn switch_points(
    e: &E2e,
    lab: &Lab,
    afxdp: bool,
    mid: &mut u32,
    round: usize,
    points: &mut Vec<RunPoint>,
) -> Result<()> {
    let n = lab.workers;
    for &bytes in e.sizes {
        let it = e.iterations_at(bytes);
        let mut run = switch_run(n, crate::demo::JOB_ID, bytes, e.segment, e.slots)?;
        run.repeat = it as u32;
        run.first_message = *mid;
        run.placement = e.placement.clone();
        run.afxdp = afxdp;
        if bytes >= CPU_WINDOWS_FROM {
            run.flags.push("--cpu-windows".into());
        }
        if let Some(us) = e.spin_us {
            run.flags.extend(["--spin-us".into(), us.to_string()]);
        }
        let mut r = switch_point(lab, &run)?;
        if !afxdp {
            r.system = SWITCH_SOCKET;
        }
        *mid += it as u32;
        round_line(round, &r);
        points.push(r);
    }
    Ok(())
}

/// The switch's runs whose workers receive on UDP sockets, as the drop-ins' ranks do.
pub(super) const SWITCH_SOCKET: &str = "switch/socket";

/// Allreduces per point of `bytes` unless `--iterations` says otherwise: fewer as the
/// buffers grow, fewer still with `--quick`.
pub(super) fn iterations(bytes: usize, quick: bool) -> usize {
    match (bytes, quick) {
        (b, false) if b <= 64 << 10 => 200,
        (b, false) if b <= 1 << 20 => 20,
        (_, false) => 5,
        (b, true) if b <= 64 << 10 => 20,
        _ => 2,
    }
}

/// An allreduce of `bytes` of i32 (sum) on job `job` of `n` members.
pub(super) fn switch_run(
    n: usize,
    job: u32,
    bytes: usize,
    segment: usize,
    slots: u32,
) -> Result<AllreduceRun> {
    let shape = JobShape::with_elements(n, slots as usize, segment, Lane::I32)?;
    Ok(AllreduceRun::new(job, Op::Sum, DType::I32, shape, bytes))
}

/// Runs `run` on the lab's workers: the slowest worker's time per allreduce, bytes sent
/// per worker, machine-wide CPU, and whether every result was right.
pub(super) fn switch_point(lab: &Lab, run: &AllreduceRun) -> Result<RunPoint> {
    let n = lab.workers;
    let before = lab.drops()?;
    let outs = run.run(lab)?;
    let drops = lab.drops()?.since(before).total();
    let times: Vec<f64> = (0..run.repeat as usize)
        .map(|k| {
            outs.iter()
                .map(|w| w.seconds_all.get(k).copied().unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max)
        })
        .collect();
    let tx = outs.iter().map(|w| w.tx_bytes as f64).sum::<f64>() / n as f64;
    let rx = outs.iter().map(|w| w.rx_bytes as f64).sum::<f64>() / n as f64;
    let windows: Vec<&[CpuWindow]> = outs.iter().map(|w| &w.cpu_windows[..]).collect();
    let verified = outs.iter().all(|w| w.verified);
    let retransmissions = outs.iter().map(|w| w.retransmissions).sum::<u64>();
    let mut round_trips = RoundTrips::default();
    outs.iter().for_each(|w| round_trips.merge(&w.round_trips));
    Ok(RunPoint {
        rx_ratio: Some(rx / (run.bytes as f64 * run.repeat.max(1) as f64)),
        round_trip_us: RoundTripFigures::new(&round_trips),
        retransmissions: Some(retransmissions as f64 / run.repeat.max(1) as f64),
        interface_drops: Some(drops as f64 / run.repeat.max(1) as f64),
        ..RunPoint::new(
            "switch",
            n,
            run.bytes,
            times,
            tx,
            &merge_windows(&windows),
            verified,
        )
    })
}

/// Adds job `id` (i32 sum) over every worker of the lab.
pub fn add_job(sw: &LabSwitch, id: u32, segment: usize, slots: u32) -> Result<()> {
    let workers: Vec<usize> = (0..sw.lab.workers).collect();
    let spec = sw.job_spec(
        id,
        Op::Sum,
        DType::I32,
        segment as u16,
        slots,
        &workers,
        xagg_lab::lab::WORKER_PORT,
    )?;
    match sw.add_job(spec)? {
        Response::Job { .. } => Ok(()),
        r => anyhow::bail!("adding job {id}: {r:?}"),
    }
}
