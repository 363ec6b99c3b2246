//! The few facts read from /proc: CPU time by kind (`/proc/stat`), whether a filesystem is
//! mounted at a point (`/proc/self/mounts`), threads by name. Read here in a few lines
//! each rather than through a general /proc crate, which would double the build of the
//! binaries that need them.

use std::path::Path;

use crate::{Error, Result};

/// One `cpu` line of `/proc/stat`, in clock ticks ([`ticks_per_second`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTicks {
    /// Ticks spent running something (everything but idle and I/O wait).
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }

    /// Every tick counted.
    pub fn total(&self) -> u64 {
        self.busy() + self.idle + self.iowait
    }

    fn parse(fields: &str) -> Option<Self> {
        let mut n = fields.split_whitespace().map(|f| f.parse::<u64>().ok());
        let mut next = || n.next().flatten();
        Some(Self {
            user: next()?,
            nice: next()?,
            system: next()?,
            idle: next()?,
            // Older kernels stop early; these then count nothing.
            iowait: next().unwrap_or(0),
            irq: next().unwrap_or(0),
            softirq: next().unwrap_or(0),
            steal: next().unwrap_or(0),
        })
    }
}

/// The machine's CPU time: all CPUs together, then each CPU by number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: CpuTicks,
    pub per_cpu: Vec<CpuTicks>,
}

/// Reads `/proc/stat`'s `cpu` lines.
pub fn cpu_times() -> Result<CpuTimes> {
    let text = read("/proc/stat")?;
    parse_stat(&text).ok_or(Error::Proc {
        path: "/proc/stat",
        error: std::io::ErrorKind::InvalidData.into(),
    })
}

fn parse_stat(text: &str) -> Option<CpuTimes> {
    let mut times = CpuTimes::default();
    for line in text.lines() {
        let Some((name, fields)) = line.split_once(' ') else {
            continue;
        };
        if name == "cpu" {
            times.total = CpuTicks::parse(fields)?;
        } else if let Some(n) = name.strip_prefix("cpu") {
            let n: usize = n.parse().ok()?;
            times
                .per_cpu
                .resize(times.per_cpu.len().max(n + 1), CpuTicks::default());
            times.per_cpu[n] = CpuTicks::parse(fields)?;
        }
    }
    Some(times)
}

/// Clock ticks per second, the unit of [`CpuTicks`].
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Whether a filesystem of type `fs_type` is mounted at `point` in this process's mount
/// namespace.
pub fn mounted(point: &Path, fs_type: &str) -> Result<bool> {
    let text = read("/proc/self/mounts")?;
    Ok(text.lines().any(|line| {
        let mut f = line.split_whitespace();
        let (_, at, kind) = (f.next(), f.next(), f.next());
        // Spaces in a mount point are written as \040; the points asked about have none.
        at.is_some_and(|at| Path::new(at) == point) && kind == Some(fs_type)
    }))
}

/// The ids of the processes and kernel threads whose name (`comm`) starts with `prefix`.
pub fn threads_named(prefix: &str) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir("/proc").map_err(|error| Error::Proc {
        path: "/proc",
        error,
    })?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.starts_with(prefix))
        })
        .collect())
}

/// Sets the nice value of process or thread `pid` (-20, first, to 19, last).
pub fn set_nice(pid: i32, nice: i32) -> std::io::Result<()> {
    // Safety: a plain system call on integers.
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn read(path: &'static str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|error| Error::Proc { path, error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_total_and_each_cpu() {
        let text = "cpu  10 1 5 100 2 3 4 0 0 0\ncpu0 6 1 3 50 1 2 2 0 0 0\ncpu1 4 0 2 50 1 1 2 0 0 0\nintr 5 0\n";
        let t = parse_stat(text).unwrap();
        assert_eq!(t.total.busy(), 10 + 1 + 5 + 3 + 4);
        assert_eq!(t.total.total(), 23 + 100 + 2);
        assert_eq!(t.per_cpu.len(), 2);
        assert_eq!(t.per_cpu[1].softirq, 2);
    }

    #[test]
    fn reads_this_machine() {
        let t = cpu_times().unwrap();
        assert!(!t.per_cpu.is_empty());
        assert!(t.total.total() >= t.per_cpu[0].total());
        assert!(mounted(Path::new("/proc"), "proc").unwrap());
        assert!(!mounted(Path::new("/proc"), "bpf").unwrap());
    }
}
