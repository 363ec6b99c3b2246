//! What the bench reports: the tables it prints, the goodput plot, the JSON of figures, and
//! the medians every figure is.

use std::path::PathBuf;

use anyhow::Result;

use super::{
    codecs::CodecPoint, dataplane::DataplanePoint, end_to_end::SWITCH_SOCKET,
    frameworks::BenchDtype, run_point::RunPoint,
};
use xtask::build::target_dir;

/// The middle of `v` (the upper middle of an even count).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The switch program's cost per path, each against its floor where it has one.
pub(super) fn dataplane_table(points: &[DataplanePoint], quick: bool) {
    println!(
        "switch program, BPF_PROG_RUN (median ns; {}):",
        if quick { "quick" } else { "full" }
    );
    println!(
        "{:>20} {:>9} {:>12} {:>10} {:>8}",
        "path", "elements", "ns/packet", "ns/KiB", "x floor"
    );
    for p in points {
        // Accumulate against the add alone; complete against the add that writes the frame.
        let floor = match p.path {
            "accumulate" => Some("floor: add"),
            "complete" => Some("floor: add, write"),
            _ => None,
        }
        .and_then(|f| {
            points
                .iter()
                .find(|q| q.path == f && q.elements == p.elements)
        })
        .map_or(String::new(), |f| {
            format!("{:.2}", p.ns_per_packet / f.ns_per_packet)
        });
        println!(
            "{:>20} {:>9} {:>12.0} {:>10.0} {:>8}",
            p.path, p.elements, p.ns_per_packet, p.ns_per_kib, floor
        );
    }
}

/// This build's switch program against another object, path by path, timed interleaved.
pub(super) fn compare_table(this: &[DataplanePoint], against: &[DataplanePoint], other: &str) {
    println!("switch program, BPF_PROG_RUN, interleaved (median ns): this build against {other}");
    println!(
        "{:>20} {:>9} {:>9} {:>9} {:>8}",
        "path", "elements", "this", "against", "ratio"
    );
    for (p, q) in this.iter().zip(against) {
        println!(
            "{:>20} {:>9} {:>9.0} {:>9.0} {:>8.3}",
            p.path,
            p.elements,
            p.ns_per_packet,
            q.ns_per_packet,
            p.ns_per_packet / q.ns_per_packet
        );
    }
}

/// The conversions' throughput per op and dtype.
pub(super) fn codecs_table(codec_points: &[CodecPoint]) {
    println!();
    println!("worker conversions, one core (GB/s of buffer):");
    println!(
        "{:>5} {:>6} {:>6} {:>8} {:>8}",
        "op", "dtype", "float", "encode", "decode"
    );
    for c in codec_points {
        println!(
            "{:>5} {:>6} {:>6} {:>8.2} {:>8.2}",
            c.op, c.dtype, c.float, c.encode_gbps, c.decode_gbps
        );
    }
}

/// The end-to-end runs, each system beside its baseline at the same worker count and size.
pub(super) fn runs_tables(runs: &[RunPoint], mtu: usize, segment: usize, dtype: BenchDtype) {
    let pairs = pairs_of(runs, "switch", "openmpi");
    if !pairs.is_empty() {
        switch_tables(&pairs, mtu, segment);
    }
    let dtype = dtype.name();
    let mpi_title = format!("an MPI program's MPI_Allreduce (xtask/mpi/allreduce.c), {dtype} sum, libxagg_mpi.so preloaded | the same binary alone");
    let torch_title = format!(
        "PyTorch's dist.all_reduce (xtask/python/allreduce.py), {dtype} sum, the xagg backend | Gloo"
    );
    for (system, baseline, title, a_name, b_name) in [
        (
            "mpi+xagg",
            "openmpi",
            mpi_title.as_str(),
            "preload",
            "openmpi",
        ),
        ("torch+xagg", "gloo", torch_title.as_str(), "xagg", "gloo"),
        (
            "openmpi+switch",
            "openmpi",
            "Open MPI alone, the switch's programs on the path | on the plain bridge",
            "on sw",
            "bridge",
        ),
        (
            "gloo+switch",
            "gloo",
            "Gloo alone, the switch's programs on the path | on the plain bridge",
            "on sw",
            "bridge",
        ),
    ] {
        let pairs = pairs_of(runs, system, baseline);
        if pairs.is_empty() {
            continue;
        }
        println!();
        println!("{title} (goodput Gbit/s | latency µs | the drop-in's time over the switch path alone's, all timed back to back: results on a UDP socket as the drop-in's, and with AF_XDP | nccl-tests' busbw, algbw x 2(n-1)/n | osu_allreduce's latency µs):");
        println!(
            "{:>3} {:>9} | {:>8} {:>8} {:>6} | {:>9} {:>9} {:>6} | {:>7} {:>7} {:>6} | {:>7} {:>7} | {:>9} {:>9} {:>6}",
            "n", "bytes", a_name, b_name, "x", a_name, b_name, "x", "path", "/socket", "/afxdp", "busbw", "busbw", "osu", "osu", "x"
        );
        for &(r, m) in &pairs {
            let over = |system: &str| {
                runs.iter()
                    .find(|s| s.system == system && s.workers == r.workers && s.bytes == r.bytes)
                    .filter(|_| r.path == Some("switch"))
                    .map_or(f64::NAN, |s| {
                        r.back_to_back_us.unwrap_or(f64::NAN) / s.latency_us
                    })
            };
            let (alone, afxdp) = (over(SWITCH_SOCKET), over("switch"));
            let bus = |g: f64| g * 2.0 * (r.workers as f64 - 1.0) / r.workers as f64;
            let (osu_a, osu_b) = (r.osu_us.unwrap_or(f64::NAN), m.osu_us.unwrap_or(f64::NAN));
            println!(
                "{:>3} {:>9} | {:>8.2} {:>8.2} {:>6.2} | {:>9.1} {:>9.1} {:>6.2} | {:>7} {:>7.2} {:>6.2} | {:>7.2} {:>7.2} | {:>9.1} {:>9.1} {:>6.2}{}",
                r.workers, r.bytes, r.goodput_gbps, m.goodput_gbps, r.goodput_gbps / m.goodput_gbps,
                r.latency_us, m.latency_us, r.latency_us / m.latency_us,
                r.path.unwrap_or("?"), alone, afxdp, bus(r.goodput_gbps), bus(m.goodput_gbps),
                osu_a, osu_b, osu_a / osu_b,
                if r.verified && m.verified { "" } else { "  NOT VERIFIED" }
            );
        }
    }
}

/// n x per-worker goodput at a worker count over that at the smallest count run, for one
/// system and bulk size: a switch whose work spreads over its cores keeps it near 1.
#[derive(serde::Serialize, Clone, Debug)]
pub(super) struct ScalingPoint {
    system: &'static str,
    bytes: usize,
    workers: usize,
    /// The smallest worker count run, which this one is over.
    over: usize,
    /// Per worker, the median over the rounds.
    goodput_gbps: f64,
    /// n x goodput over the same at `over`, of the medians.
    aggregate_ratio: f64,
    /// The same ratio round by round: both counts' runs of one round, taken minutes apart
    /// at most (the VM drifts by a fifth over longer).
    round_ratios: Vec<f64>,
}

/// The allreduce's scaling with workers, from 1 MiB up, for the switch and Open MPI.
pub(super) fn scaling(runs: &[RunPoint]) -> Vec<ScalingPoint> {
    let bulk = |r: &&RunPoint| {
        r.bytes >= 1 << 20 && r.collective.is_none() && ["switch", "openmpi"].contains(&r.system)
    };
    let mut out = Vec::new();
    for r in runs.iter().filter(bulk) {
        let Some(base) = runs
            .iter()
            .filter(bulk)
            .filter(|b| b.system == r.system && b.bytes == r.bytes)
            .min_by_key(|b| b.workers)
            .filter(|b| b.workers < r.workers)
        else {
            continue;
        };
        let (n, n0) = (r.workers as f64, base.workers as f64);
        out.push(ScalingPoint {
            system: r.system,
            bytes: r.bytes,
            workers: r.workers,
            over: base.workers,
            goodput_gbps: r.goodput_gbps,
            aggregate_ratio: n * r.goodput_gbps / (n0 * base.goodput_gbps),
            round_ratios: r
                .goodput_rounds
                .iter()
                .zip(&base.goodput_rounds)
                .map(|(g, g0)| n * g / (n0 * g0))
                .collect(),
        });
    }
    out
}

/// The scaling table, `placement` naming where the switch and the workers ran.
pub(super) fn scaling_table(points: &[ScalingPoint], placement: &str) {
    if points.is_empty() {
        return;
    }
    println!();
    println!("scaling with workers ({placement}): n x per-worker goodput over that at the smallest n, of the medians, and round by round (lowest to highest):");
    println!(
        "{:>8} {:>9} {:>3} {:>5} | {:>13} {:>7} | rounds",
        "system", "bytes", "n", "over", "Gbit/s/worker", "ratio"
    );
    for p in points {
        let mut rounds = p.round_ratios.clone();
        rounds.sort_by(|a, b| a.total_cmp(b));
        let rounds: Vec<String> = rounds.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "{:>8} {:>9} {:>3} {:>5} | {:>13.2} {:>7.2} | {}",
            p.system,
            p.bytes,
            p.workers,
            p.over,
            p.goodput_gbps,
            p.aggregate_ratio,
            rounds.join(" ")
        );
    }
}

/// One end-to-end point of one round, as it comes.
pub(super) fn round_line(round: usize, r: &RunPoint) {
    eprintln!(
        "round {round} {:<7} n={} {:>9} B: {:7.3} Gbit/s, {:8.1} µs, wire {:.3} S, {:.2} CPU s/GiB{}{}",
        r.system,
        r.workers,
        r.bytes,
        r.goodput_gbps,
        r.latency_us,
        r.wire_ratio,
        r.cpu_total(),
        r.round_trip_us.map_or(String::new(), |t| format!(
            ", round trip p50 {:.0} p99 {:.0} µs",
            t.p50, t.p99
        )),
        if r.verified { "" } else { "  NOT VERIFIED" }
    );
}

/// Writes `figures` to `json`, or by default to `target/bench/<name>.json`.
pub(super) fn write_figures(
    json: Option<PathBuf>,
    name: &str,
    figures: serde_json::Value,
) -> Result<()> {
    let path = json.unwrap_or_else(|| target_dir().join(format!("bench/{name}.json")));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(&figures)?)?;
    println!("figures written to {}", path.display());
    Ok(())
}

/// The points of `system` with `baseline`'s at the same worker count and size.
fn pairs_of<'a>(
    runs: &'a [RunPoint],
    system: &str,
    baseline: &str,
) -> Vec<(&'a RunPoint, &'a RunPoint)> {
    runs.iter()
        .filter(|r| r.system == system)
        .filter_map(|r| {
            runs.iter()
                .find(|m| m.system == baseline && m.workers == r.workers && m.bytes == r.bytes)
                .map(|m| (r, m))
        })
        .collect()
}

/// Goodput against buffer size, one line per system and worker count.
pub(super) fn draw(runs: &[RunPoint], path: &std::path::Path) -> Result<()> {
    use plotters::prelude::*;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = runs.iter().map(|r| r.goodput_gbps).fold(0.0, f64::max) * 1.15;
    let xs: Vec<f64> = runs.iter().map(|r| (r.bytes as f64).log2()).collect();
    let (x0, x1) = (
        xs.iter().cloned().fold(f64::INFINITY, f64::min),
        xs.iter().cloned().fold(0.0, f64::max),
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "allreduce goodput, i32 sum, netns lab (2 cores)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x0 - 0.3..x1 + 0.3, 0.0..max)?;
    chart
        .configure_mesh()
        .x_desc("bytes per worker")
        .y_desc("goodput, Gbit/s")
        .x_label_formatter(&|x| crate::demo::human(2f64.powf(x.round()) as usize))
        .draw()?;
    let mut workers: Vec<usize> = runs.iter().map(|r| r.workers).collect();
    workers.sort();
    workers.dedup();
    for (i, system) in ["switch", "openmpi"].into_iter().enumerate() {
        for (j, &n) in workers.iter().enumerate() {
            let color = Palette99::pick(i * 4 + j).to_rgba();
            let pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.system == system && r.workers == n)
                .map(|r| ((r.bytes as f64).log2(), r.goodput_gbps))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(format!("{system}, {n} workers"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The switch's own runs against Open MPI's: goodput and latency, then CPU per GiB.
fn switch_tables(pairs: &[(&RunPoint, &RunPoint)], mtu: usize, segment: usize) {
    println!();
    println!("allreduce, i32 sum, same lab (MTU {mtu}, segments of {segment} elements), same data (goodput Gbit/s | latency µs | bytes sent per worker / S):");
    println!(
        "{:>3} {:>9} | {:>8} {:>8} {:>6} | {:>9} {:>9} {:>6} | {:>6} {:>6}",
        "n", "bytes", "switch", "openmpi", "x", "switch", "openmpi", "x", "switch", "ompi"
    );
    for &(r, m) in pairs {
        println!(
            "{:>3} {:>9} | {:>8.2} {:>8.2} {:>6.2} | {:>9.1} {:>9.1} {:>6.2} | {:>6.3} {:>6.3}{}",
            r.workers,
            r.bytes,
            r.goodput_gbps,
            m.goodput_gbps,
            r.goodput_gbps / m.goodput_gbps,
            r.latency_us,
            m.latency_us,
            r.latency_us / m.latency_us,
            r.wire_ratio,
            m.wire_ratio,
            if r.verified && m.verified {
                ""
            } else {
                "  NOT VERIFIED"
            }
        );
    }
    println!();
    println!("CPU s per GiB over exactly the timed windows, machine-wide (total = process + softirq | busy CPUs):");
    println!(
        "{:>3} {:>9} | {:>22} | {:>22} | {:>6} | {:>5} {:>5}",
        "n", "bytes", "switch", "openmpi", "x", "busy", "busy"
    );
    for &(r, m) in pairs {
        let (Some(c), Some(d)) = (&r.cpu, &m.cpu) else {
            continue;
        };
        println!(
            "{:>3} {:>9} | {:>6.2} = {:>5.2} + {:>5.2} | {:>6.2} = {:>5.2} + {:>5.2} | {:>6.2} | {:>5.2} {:>5.2}",
            r.workers, r.bytes, c.total_s_per_gib, c.process_s_per_gib, c.softirq_s_per_gib,
            d.total_s_per_gib, d.process_s_per_gib, d.softirq_s_per_gib,
            c.total_s_per_gib / d.total_s_per_gib, c.busy_cpus, d.busy_cpus
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(system: &'static str, workers: usize, bytes: usize, rounds: &[f64]) -> RunPoint {
        RunPoint {
            goodput_gbps: median(rounds.to_vec()),
            goodput_rounds: rounds.to_vec(),
            ..RunPoint::new(system, workers, bytes, vec![1.0], 0.0, &[], true)
        }
    }

    /// Each count over the smallest of its system and size, medians and round by round;
    /// small sizes and a system's smallest count have no row.
    #[test]
    fn scaling_is_over_the_smallest_count_round_by_round() {
        let runs = [
            point("switch", 2, 16 << 20, &[4.0, 3.0, 5.0]),
            point("switch", 8, 16 << 20, &[1.0, 0.9, 1.0]),
            point("switch", 8, 4 << 10, &[0.1, 0.1, 0.1]),
            point("openmpi", 4, 16 << 20, &[2.0, 2.0, 2.0]),
            point("openmpi", 8, 16 << 20, &[1.5, 1.0, 0.5]),
            point("switch/socket", 8, 16 << 20, &[1.0, 1.0, 1.0]),
        ];
        let s = scaling(&runs);
        let rows: Vec<_> = s.iter().map(|p| (p.system, p.workers, p.over)).collect();
        assert_eq!(rows, [("switch", 8, 2), ("openmpi", 8, 4)]);
        // 8 x 1.0 over 2 x 4.0; round by round 8 x (1.0, 0.9, 1.0) over 2 x (4, 3, 5).
        assert!((s[0].aggregate_ratio - 1.0).abs() < 1e-9);
        let want = [1.0, 1.2, 0.8];
        for (got, want) in s[0].round_ratios.iter().zip(want) {
            assert!((got - want).abs() < 1e-9, "{:?}", s[0].round_ratios);
        }
        // 8 x 1.0 over 4 x 2.0, the medians; the rounds 1.5, 1.0, 0.5.
        assert!((s[1].aggregate_ratio - 1.0).abs() < 1e-9);
        assert!((s[1].round_ratios[0] - 1.5).abs() < 1e-9);
    }
}
