//! The end-to-end runs through the frameworks, on the same lab as the switch's: Open MPI's
//! MPI_Allreduce and PyTorch's all_reduce, each alone and through the switch.

use std::path::PathBuf;

use anyhow::{Context, Result};
use xagg_common::wire::DType;
use xagg_lab::lab::Lab;
use xagg_worker::report::CpuWindow;

use super::{end_to_end::CPU_WINDOWS_FROM, report::median, run_point::RunPoint};
use xtask::build::target_dir;

/// The element type of the drop-ins' runs (`--dtype`), by torch's name of it (the scripts'
/// `BENCH_DTYPE`): small integers, exact in every type and order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDtype {
    #[default]
    Int32,
    Float32,
    Float64,
    Float16,
    Bfloat16,
}

impl BenchDtype {
    /// Torch's name, as `BENCH_DTYPE` and the tables say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int32 => "int32",
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::Float16 => "float16",
            Self::Bfloat16 => "bfloat16",
        }
    }

    /// The switch's type of it.
    pub fn wire(self) -> DType {
        match self {
            Self::Int32 => DType::I32,
            Self::Float32 => DType::F32,
            Self::Float64 => DType::F64,
            Self::Float16 => DType::F16,
            Self::Bfloat16 => DType::Bf16,
        }
    }

    /// Whether the MPI program has it (MPI has no half types).
    pub fn in_mpi(self) -> bool {
        self.wire().size() >= 4
    }
}

/// Open MPI's MPI_Allreduce over TCP on the same lab (`xagg_lab::mpi::run`: one rank per
/// worker namespace) as `system`: `openmpi`, every XDP program detached; `openmpi+switch`,
/// the switch's programs on the path; `mpi+xagg`, the same binary with `libxagg_mpi.so`
/// preloaded, joining the lab's switch.
pub(super) fn mpi_run(
    lab: &Lab,
    mpi_bin: &std::path::Path,
    bytes: usize,
    iterations: usize,
    system: &'static str,
    dtype: BenchDtype,
) -> Result<RunPoint> {
    mpi_collective(lab, mpi_bin, bytes, iterations, system, None, dtype)
}

/// [`mpi_run`] of `collective` instead of allreduce, where given (the program's
/// `BENCH_COLLECTIVE`): the point carries it and the bytes each rank received; of
/// `dtype`'s elements (int32, float32, float64: `BENCH_DTYPE`).
pub(super) fn mpi_collective(
    lab: &Lab,
    mpi_bin: &std::path::Path,
    bytes: usize,
    iterations: usize,
    system: &'static str,
    collective: Option<&'static str>,
    dtype: BenchDtype,
) -> Result<RunPoint> {
    let preload = system == "mpi+xagg";
    let n = lab.workers;
    let mut env: Vec<(&str, String)> = if preload {
        vec![
            (
                "LD_PRELOAD",
                xagg_lab::bin("libxagg_mpi.so").display().to_string(),
            ),
            ("XAGG_DAEMON", crate::demo::LISTEN.to_string()),
        ]
        .into_iter()
        .chain(crate::demo::credential_env())
        // The route by size as the bench is run with (`XAGG_ROUTE=all`: every call
        // through the switch), else the library's default.
        .chain(std::env::var("XAGG_ROUTE").ok().map(|r| ("XAGG_ROUTE", r)))
        .collect()
    } else {
        Vec::new()
    };
    if let Some(c) = collective {
        env.push(("BENCH_COLLECTIVE", c.to_string()));
    }
    env.push(("BENCH_DTYPE", dtype.name().to_string()));
    let agent = xagg_lab::mpi::agent(lab, &target_dir().join("bench"))?;
    let program = format!(
        "{bin} {bytes} {iterations} 7{cpu}",
        bin = mpi_bin.display(),
        cpu = if bytes >= CPU_WINDOWS_FROM {
            " cpu"
        } else {
            ""
        },
    );
    let o = xagg_lab::mpi::run(lab, &agent, n, &env, &program)?;
    let mut path = None;
    if preload {
        // Every allreduce through the switch or routed by size to Open MPI, none after a
        // failure; or the figures are not the library's.
        let err = String::from_utf8_lossy(&o.stderr);
        // Its calls of the timed entry point (its barriers go through the switch whatever
        // the size): switch, recovered, routed, flagged, fallback, passed.
        let entry = entry_point(collective);
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix(&format!("xagg: rank 0: {entry}: ")))
            .with_context(|| format!("no summary of {entry} from the MPI library: {err}"))?;
        let n: Vec<usize> = line
            .split(", ")
            .filter_map(|w| w.split(' ').next()?.parse().ok())
            .collect();
        let [served, recovered, routed, flagged, failed, passed] = n[..] else {
            anyhow::bail!("the MPI library's summary reads otherwise: {line}");
        };
        // The program gathers its figures with MPI_Reduce (small; some of ops the switch
        // does not take): timing MPI_Reduce, those are among the counts, so there every
        // timed call must have one path, the others may have any.
        let timed_alone = entry != "MPI_Reduce";
        anyhow::ensure!(
            recovered + flagged + failed == 0
                && if timed_alone {
                    served + routed >= iterations && passed == 0 && (served == 0 || routed == 0)
                } else {
                    served >= iterations || routed >= iterations
                },
            "the preloaded MPI program's {entry} calls did not all take one path: {line}"
        );
        path = Some(if served >= iterations {
            "switch"
        } else {
            "routed"
        });
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().find(|l| l.starts_with('{')).with_context(|| {
        format!(
            "mpirun printed no result: {text} {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })?;
    let mut p = json_point(system, n, dtype, line)?;
    p.path = path;
    let v = serde_json::from_str::<serde_json::Value>(line)?;
    p.osu_us = v["osu_us"].as_f64();
    p.collective = collective;
    p.rx_ratio = rx_ratio(&p, line)?;
    Ok(p)
}

/// The MPI entry point `xtask/mpi/allreduce.c` times for `collective` (`BENCH_COLLECTIVE`).
fn entry_point(collective: Option<&str>) -> &'static str {
    match collective {
        Some("reduce_scatter") => "MPI_Reduce_scatter_block",
        Some("all_gather") => "MPI_Allgather",
        Some("broadcast") => "MPI_Bcast",
        Some("reduce") => "MPI_Reduce",
        _ => "MPI_Allreduce",
    }
}

/// Bytes a rank received over the timed calls' S, from the line's `rx_bytes_per_rank`.
fn rx_ratio(p: &RunPoint, line: &str) -> Result<Option<f64>> {
    let v: serde_json::Value = serde_json::from_str(line)?;
    Ok(v["rx_bytes_per_rank"]
        .as_f64()
        .map(|rx| rx / (p.bytes as f64 * p.iterations as f64)))
}

/// PyTorch's `dist.all_reduce` as `system` has it (`torch+xagg`: the xagg backend, through
/// the switch; `gloo`: PyTorch's own, on the plain bridge; `gloo+switch`: Gloo with the
/// switch's programs on the path), every size in one run of `xtask/python/allreduce.py` per
/// rank; with `collective`, that collective instead (`BENCH_COLLECTIVE`: all_gather,
/// broadcast, reduce); of `dtype`'s elements (`BENCH_DTYPE`).
pub(super) fn torch_runs(
    lab: &Lab,
    system: &'static str,
    sizes: &[usize],
    iterations: impl Fn(usize) -> usize,
    collective: Option<&'static str>,
    dtype: BenchDtype,
) -> Result<Vec<RunPoint>> {
    let backend = if system == "torch+xagg" {
        "xagg"
    } else {
        "gloo"
    };
    let n = lab.workers;
    let mut env = xagg_lab::python::base_env();
    env.extend([
        ("MASTER_ADDR", xagg_lab::lab::worker_ip(0).to_string()),
        ("MASTER_PORT", "29600".to_string()),
        ("XAGG_DAEMON", crate::demo::LISTEN.to_string()),
    ]);
    env.extend(crate::demo::credential_env());
    env.extend(std::env::var("XAGG_ROUTE").ok().map(|r| ("XAGG_ROUTE", r)));
    env.extend(collective.map(|c| ("BENCH_COLLECTIVE", c.to_string())));
    env.push(("BENCH_DTYPE", dtype.name().to_string()));
    let script = xtask::build::root().join("xtask/python/allreduce.py");
    let points: Vec<String> = sizes
        .iter()
        .map(|&b| format!("{b}:{}", iterations(b)))
        .collect();
    let outputs = xagg_lab::python::ranks(lab, n, &env, |_| {
        let mut a = vec![
            script.display().to_string(),
            backend.to_string(),
            "7".into(),
        ];
        a.extend(points.iter().cloned());
        a
    })?;
    for (i, o) in outputs.iter().enumerate() {
        anyhow::ensure!(
            o.status.success(),
            "PyTorch's allreduce on {backend}, rank {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let err = String::from_utf8_lossy(&outputs[0].stderr);
    if backend == "xagg" {
        // Every allreduce through the switch or routed by size to Gloo, none after a
        // failure; or the figures are Gloo's.
        anyhow::ensure!(
            err.contains("allreduces through the switch, 0 made by Gloo")
                && !err.contains("allreduces go to Gloo"),
            "PyTorch's allreduce through the xagg backend did not go through the switch: {err}"
        );
    }
    // The script says per point where the calls went (the backend's route by size).
    let route = (backend == "xagg")
        .then(|| std::env::var("XAGG_ROUTE").ok())
        .flatten();
    // The backend's float mode as the bench is run with (fast unless XAGG_FLOAT=exact).
    let float = match std::env::var("XAGG_FLOAT").as_deref().map(str::trim) {
        Ok("exact") => xagg_common::wire::Float::Exact,
        _ => xagg_common::wire::Float::Fast,
    };
    let route = xagg_worker::route::Route::parse(
        route.as_deref(),
        n,
        xagg_worker::route::Other::Gloo,
        float,
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    String::from_utf8_lossy(&outputs[0].stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|line| {
            let mut p = json_point(system, n, dtype, line)?;
            p.collective = collective;
            p.rx_ratio = rx_ratio(&p, line)?;
            if backend == "xagg" {
                // The backend routes each collective by its size (the whole message).
                let c: xagg_worker::Collective = collective
                    .unwrap_or("allreduce")
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let routed = !route.takes(c, Some(dtype.wire()), p.bytes as u64);
                p.path = Some(if !routed { "switch" } else { "routed" });
            }
            Ok(p)
        })
        .collect()
}

/// A point from one line of JSON of the MPI program or the PyTorch script: `bytes`,
/// `seconds` (each iteration's slowest rank), `tx_bytes_per_rank`, `verified`, and
/// optionally `cpu_windows` and `back_to_back` (seconds, as `seconds`).
fn json_point(
    system: &'static str,
    workers: usize,
    dtype: BenchDtype,
    line: &str,
) -> Result<RunPoint> {
    let v: serde_json::Value = serde_json::from_str(line)?;
    let times: Vec<f64> = v["seconds"]
        .as_array()
        .context("seconds")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    let mut p = RunPoint::new(
        system,
        workers,
        v["bytes"].as_u64().context("bytes")? as usize,
        times,
        v["tx_bytes_per_rank"].as_f64().unwrap_or(0.0),
        &serde_json::from_value::<Vec<CpuWindow>>(v["cpu_windows"].clone()).unwrap_or_default(),
        v["verified"].as_bool() == Some(true),
    );
    p.dtype = dtype.wire().name();
    let back_to_back: Vec<f64> = v["back_to_back"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default();
    p.back_to_back_us = (!back_to_back.is_empty()).then(|| median(back_to_back) * 1e6);
    Ok(p)
}

/// The MPI baseline: beside the binaries in a bundle (built there by
/// [`compile_mpi_program`]), else compiled from its source (`cargo xtask setup` installs
/// Open MPI).
pub(super) fn mpi_setup() -> Result<PathBuf> {
    let bundled = xagg_lab::bin(MPI_PROGRAM);
    if bundled.exists() {
        return Ok(bundled);
    }
    let dir = target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join(MPI_PROGRAM);
    compile_mpi_program(&bin)?;
    Ok(bin)
}

/// The MPI baseline's file name.
pub(super) const MPI_PROGRAM: &str = "mpi_allreduce";

/// Compiles the MPI baseline (`xtask/mpi/allreduce.c`) into `out`, with `mpicc`.
pub(super) fn compile_mpi_program(out: &std::path::Path) -> Result<()> {
    xagg_lab::mpi::compile(
        &xtask::build::root().join("xtask/mpi/allreduce.c"),
        out,
        &[],
    )
}
