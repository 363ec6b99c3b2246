//! The timed allreduces: the clocks, the CPU windows, the interface's bytes sent and the
//! progress shown meanwhile.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use xagg_worker::{
    report::{CpuSample, CpuWindow},
    Collective, Report, Worker,
};

use super::{AllreduceArgs, Member};

/// What the timed allreduces leave: a report and (with `--cpu-windows`) a CPU window
/// each, the first result, and the bytes the member's interface sent meanwhile.
pub(super) struct Runs {
    pub(super) reports: Vec<Report>,
    pub(super) windows: Vec<CpuWindow>,
    pub(super) first: Vec<u8>,
    pub(super) tx_bytes: u64,
    pub(super) rx_bytes: u64,
}

/// The `--repeat` allreduces of `n` elements each, timed.
pub(super) fn run(w: &Worker, a: &AllreduceArgs, me: &Member, n: usize) -> Result<Runs> {
    // Every repeat allreduces the same data; the first result is verified once every clock
    // has stopped, so neither the data generation nor the check counts in time or CPU.
    let data = xagg_worker::data::generate(me.dtype, a.seed, me.index as u32, n);
    // The results go to a buffer of their own (its pages touched now, not in the first
    // window): the data is only read, so nothing is copied between repeats — on a CPU
    // shared by several workers that copy would run inside the others' windows.
    let call = Call::of(a, me, &data);
    let mut buf = call.output.clone();
    let (op, dtype) = (w.params().op, w.params().dtype);
    let mut first = Vec::new();
    let mut reports = Vec::new();
    let iface = xagg_linux::iface::holding(*me.bind.ip()).ok().flatten();
    let (mut tx0, mut rx0) = (0, 0);
    let bar = progress_bar(a);
    let mut windows = Vec::new();
    for r in 0..a.repeat {
        let common = match (a.start_at, r) {
            (Some(t), 0) => Some(wait_until(t)),
            _ => None,
        };
        // Read before the clock starts, so the reading is outside the window.
        let window_start = a.cpu_windows.then(cpu_sample);
        let started = common.unwrap_or_else(Instant::now);
        if r == 0 {
            tx0 = link_bytes(iface.as_deref(), "tx");
            rx0 = link_bytes(iface.as_deref(), "rx");
        }
        let mut rep = match a.collective {
            Collective::Allreduce => w.allreduce_bytes_into(op, dtype, &data, &mut buf)?,
            Collective::Broadcast => {
                // In place: each repeat broadcasts the root's data again.
                buf.copy_from_slice(&call.output);
                w.collective_bytes_into(a.collective, op, a.root, dtype, None, &mut buf)?
            }
            c => w.collective_bytes_into(c, op, a.root, dtype, Some(&call.input), &mut buf)?,
        };
        // Wall time from the common start, so the slowest worker defines the run.
        rep.seconds = started.elapsed().as_secs_f64();
        if let Some(start) = window_start {
            windows.push(CpuWindow {
                start,
                end: cpu_sample(),
            });
        }
        rep.goodput_gbps = a.size as f64 * 8.0 / rep.seconds / 1e9;
        if r == 0 {
            first = buf.clone();
        }
        if let Some(b) = &bar {
            b.set_message(format!("{:.2} Gbit/s", rep.goodput_gbps));
            b.inc(1);
        }
        reports.push(rep);
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(Runs {
        reports,
        windows,
        first,
        tx_bytes: link_bytes(iface.as_deref(), "tx") - tx0,
        rx_bytes: link_bytes(iface.as_deref(), "rx") - rx0,
    })
}

/// What a collective sends and where its result goes, from this member's generated data
/// (`data`, the whole message): a reduce-scatter and a reduce send it all, an all-gather
/// its own block of it, a broadcast's root its data (the others start from zeros).
pub(super) struct Call {
    pub(super) input: Vec<u8>,
    pub(super) output: Vec<u8>,
}

impl Call {
    pub(super) fn of(a: &AllreduceArgs, me: &Member, data: &[u8]) -> Self {
        let block = data.len() / me.members;
        let own = me.index as usize * block..(me.index as usize + 1) * block;
        match a.collective {
            Collective::ReduceScatter => Self {
                input: data.to_vec(),
                output: vec![0; block],
            },
            Collective::AllGather => Self {
                input: data[own].to_vec(),
                output: vec![0; data.len()],
            },
            Collective::Broadcast if a.root != me.index as usize => Self {
                input: Vec::new(),
                output: vec![0; data.len()],
            },
            _ => Self {
                input: data.to_vec(),
                output: data.to_vec(),
            },
        }
    }
}

/// A long run shows its progress on a terminal (never in --json output).
fn progress_bar(a: &AllreduceArgs) -> Option<indicatif::ProgressBar> {
    (!a.json && a.repeat > 1 && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        indicatif::ProgressBar::new(u64::from(a.repeat)).with_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} allreduces, {msg}, {eta} left",
            )
            .expect("a valid template"),
        )
    })
}

/// The bytes the interface has sent (`way` tx) or received (rx), 0 when unknown.
fn link_bytes(iface: Option<&str>, way: &str) -> u64 {
    iface
        .and_then(|i| {
            std::fs::read_to_string(format!("/sys/class/net/{i}/statistics/{way}_bytes")).ok()
        })
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The machine's CPU counters and the wall clock, now.
fn cpu_sample() -> CpuSample {
    let wall_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let Ok(stat) = xagg_linux::proc::cpu_times() else {
        return CpuSample {
            wall_ns,
            ..Default::default()
        };
    };
    let t = stat.total;
    let s = |ticks: u64| ticks as f64 / xagg_linux::proc::ticks_per_second() as f64;
    CpuSample {
        wall_ns,
        user: s(t.user + t.nice),
        system: s(t.system),
        softirq: s(t.irq + t.softirq),
    }
}

/// Sleeps until `ns` (since the Unix epoch) and returns that moment as an Instant.
fn wait_until(ns: u64) -> Instant {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
        return Instant::now();
    }
    // Late: the clock still runs from the common start, so the set-up that made this
    // worker late counts against the run instead of flattering it.
    let late = Duration::from_nanos(now - ns);
    eprintln!(
        "warning: ready {:.1} ms after the common start (--start-at): give the workers a longer head start",
        late.as_secs_f64() * 1e3
    );
    Instant::now() - late
}
