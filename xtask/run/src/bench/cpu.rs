//! The machine's CPUs, as the measurements that pin threads and count CPU time see them.

use anyhow::{Context, Result};
use nix::{sched::CpuSet, unistd::Pid};

/// CPUs this process may run on (1 where unknown).
pub(super) fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Pins the calling thread to `cpu`.
pub(super) fn pin_self(cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// Runs `f`, then gives the calling thread back the CPUs it had: `f` pins it, and
/// everything this process starts later (the end-to-end runs' workers, mpirun) would
/// inherit that.
pub(super) fn keeping_affinity<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let affinity = nix::sched::sched_getaffinity(Pid::from_raw(0))?;
    let r = f();
    nix::sched::sched_setaffinity(Pid::from_raw(0), &affinity)?;
    r
}

/// CPU `cpu`'s (busy, total) seconds from /proc/stat.
pub(super) fn busy(cpu: usize) -> Result<(f64, f64)> {
    let stat = xagg_linux::proc::cpu_times()?;
    let t = stat.per_cpu.get(cpu).context("no such CPU")?;
    let tick = xagg_linux::proc::ticks_per_second() as f64;
    Ok((t.busy() as f64 / tick, t.total() as f64 / tick))
}

/// CPU seconds the calling thread has used.
pub(super) fn thread_seconds() -> Result<f64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}
