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
    use procfs::CurrentSI;
    let stat = procfs::KernelStats::current()?;
    let t = stat.cpu_time.get(cpu).context("no such CPU")?;
    let busy = t.user
        + t.nice
        + t.system
        + t.irq.unwrap_or(0)
        + t.softirq.unwrap_or(0)
        + t.steal.unwrap_or(0);
    let total = busy + t.idle + t.iowait.unwrap_or(0);
    let tick = procfs::ticks_per_second() as f64;
    Ok((busy as f64 / tick, total as f64 / tick))
}

/// CPU seconds the calling thread has used.
pub(super) fn thread_seconds() -> Result<f64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}
