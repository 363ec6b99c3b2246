//! The test suite, in two tiers: the default one (what CI runs; its budget is 25 minutes
//! from a fresh clone on a 2-core machine, builds included) and `--long`, which adds the
//! soak runs and the bench's bundle (docs/testing.md).

use anyhow::Result;

use xtask::build::{cargo, root, run, target_dir};

#[derive(clap::Args)]
pub struct TestArgs {
    /// Also the soak runs: any test marked `#[ignore = "soak ..."]` (none yet), coverage-guided
    /// fuzzing of the packet decoder and of the daemon's API for `--fuzz-minutes` each, and
    /// every lab topology through the demo.
    #[arg(long)]
    pub long: bool,
    /// Minutes of fuzzing per target under `--long`.
    #[arg(long, default_value_t = 5, requires = "long")]
    pub fuzz_minutes: u64,
    /// Arguments for the test binaries (a test name filter, `--nocapture`, ...): with a
    /// filter only the matching tests run, without the lint, fuzz, demo and bench steps.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// The default tier: formatting and lints (warnings are errors), every crate's unit tests,
/// the BPF_PROG_RUN tables and the netns tests (which need root; under CI=true they never
/// skip), and the benchmark quick. `--long` adds the soak tests, fuzzing and every lab
/// topology through the demo.
pub fn run_suite(a: &TestArgs) -> Result<()> {
    let filtered = !a.args.is_empty();
    if !filtered {
        lints()?;
    }
    let bins = target_dir().join("release");
    let mut tests = cargo();
    tests.env("XAGG_BIN_DIR", &bins).args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "xagg-ebpf",
        // A Python extension module: it links against the interpreter that loads it, and
        // its tests are Python's (tests/tests/python.rs runs them).
        "--exclude",
        "xagg-python",
        "--",
        "--test-threads",
        "1",
    ]);
    if a.long {
        tests.arg("--include-ignored");
    }
    run(tests.args(&a.args))?;
    if filtered {
        return Ok(());
    }
    if a.long {
        fuzz(a.fuzz_minutes)?;
        // The same labs as tests/tests/tree.rs, which asserts more of them.
        demos()?;
        bundle()?;
    }
    quick_bench(a.long)
}

/// `cargo fmt --check` over both workspaces (the project's and the fuzz targets'), and
/// clippy with warnings as errors over every crate, the XDP crate for its BPF target.
fn lints() -> Result<()> {
    eprintln!("cargo fmt --check; cargo clippy --all-targets -- -D warnings");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo()
        .args(["fmt", "--check", "--manifest-path"])
        .arg(root().join("tests/fuzz/Cargo.toml")))?;
    run(cargo().args([
        "clippy",
        "--quiet",
        "--workspace",
        "--exclude",
        "xagg-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The XDP crate, for its target and as it is built.
    run(xtask::build::ebpf_cargo("clippy").args(["--", "-D", "warnings"]))
}

/// Coverage-guided runs of both fuzz targets.
fn fuzz(minutes: u64) -> Result<()> {
    for (target, what) in [
        ("decode", "the packet decoder"),
        (
            "api",
            "the daemon's API (requests and joins against a dataplane stand-in)",
        ),
    ] {
        eprintln!("fuzzing {what} for {minutes} min");
        run(cargo()
            .current_dir(root().join("tests/fuzz"))
            .env("RUSTC_BOOTSTRAP", "1")
            .args(["fuzz", "run", target, "--"])
            .arg(format!("-max_total_time={}", minutes * 60))
            .arg("-print_final_stats=1"))?;
    }
    Ok(())
}

/// Every lab topology through the demo itself, small (each rank verified; the tests in
/// tests/tests/tree.rs assert the bytes per link), and the MPI library's collectives on the
/// hosts' 16 ranks.
fn demos() -> Result<()> {
    use crate::topology::TopologyName;
    for t in [
        TopologyName::Hosts,
        TopologyName::Tree,
        TopologyName::Ring,
        TopologyName::Mixed,
    ] {
        eprintln!("cargo xtask demo --topology {t:?} --size 1MiB");
        let args = crate::demo::DemoArgs {
            size: 1 << 20,
            topology: t,
            ..crate::demo::DemoArgs::default()
        };
        let r = crate::topology::run(&args, t.topology().expect("not flat"));
        crate::topology::clean_up();
        r?;
    }
    eprintln!("cargo xtask demo --mpi tests/mpi/collectives.c --topology hosts");
    let (dir, binary) = crate::demo::compile_mpi("tests/mpi/collectives.c".as_ref())?;
    let r = crate::topology::run_mpi(TopologyName::Hosts, xagg_lab::lab::MTU, &dir, &binary);
    crate::topology::clean_up();
    r
}

/// The benchmark, quick (for breakage, not figures): every path of it runs, both systems
/// verified; then the send path, quick: both ways of sending reach the switch; then the
/// switch object against itself, interleaved; with `long`, the collectives' bench and
/// PyTorch's runs in bfloat16 too.
fn quick_bench(long: bool) -> Result<()> {
    // The switch's runs placed as on a switch host (its ports' NAPI on CPU 1, the workers
    // on CPU 0), so that the placement is exercised too, where there are two CPUs.
    let two = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let cpu = |c: usize| two.then(|| xagg_lab::placement::Cpus(vec![c]));
    let quick = |send_path: bool, json: &str| crate::bench::BenchArgs {
        against: None,
        quick: true,
        json: Some(target_dir().join(json)),
        plot: Some(target_dir().join("bench/quick.svg")),
        workers: vec![2],
        sizes: vec![4 << 10, 64 << 10],
        dataplane_only: false,
        no_capacity: false,
        switch_only: false,
        no_torch: false,
        dtype: crate::bench::BenchDtype::Int32,
        mpi_on_switch: false,
        iterations: None,
        rounds: 1,
        segment: None,
        mtu: xagg_lab::lab::MTU,
        slots: crate::bench::SLOTS,
        spin_us: None,
        switch_cpus: cpu(1),
        worker_cpus: cpu(0),
        steer: true,
        levers: false,
        collectives: false,
        send_path,
        bundle: None,
    };
    eprintln!(
        "cargo xtask bench --quick --switch-cpus 1 --worker-cpus 0 --steer (2 workers, small sizes)"
    );
    crate::bench::run(quick(false, "bench/quick.json"))?;
    eprintln!("cargo xtask bench --send-path --quick");
    crate::bench::run(quick(true, "bench/send_path_quick.json"))?;
    // The A/B of two switch objects, here the build against itself.
    let object = xagg_lab::Object::Switch.path();
    eprintln!("cargo xtask bench --quick --against {}", object.display());
    crate::bench::run(crate::bench::BenchArgs {
        against: Some(object),
        ..quick(false, "bench/compare_quick.json")
    })?;
    if long {
        // The collectives' bench at 2 workers, 64 KiB: that it runs and verifies.
        eprintln!("cargo xtask bench --quick --collectives --workers 2 --sizes 64KiB");
        crate::bench::run(crate::bench::BenchArgs {
            collectives: true,
            sizes: vec![64 << 10],
            ..quick(false, "bench/collectives_quick.json")
        })?;
        // PyTorch's runs in another type (bfloat16: Gloo's run the float32 stand-in).
        eprintln!(
            "cargo xtask bench --quick --no-capacity --dtype bfloat16 --workers 2 --sizes 64KiB"
        );
        crate::bench::run(crate::bench::BenchArgs {
            no_capacity: true,
            dtype: crate::bench::BenchDtype::Bfloat16,
            sizes: vec![64 << 10],
            ..quick(false, "bench/dtype_quick.json")
        })?;
    }
    Ok(())
}

/// The bench's bundle, made and run quick from a copy, with this machine's Open MPI and
/// iproute2 hidden (a mount namespace with empty files and directories bound over them,
/// `PATH` the system's alone, `OMPI_MCA_plm=isolated` set as some machines do): the
/// switch's and Open MPI's runs each verified (the bench fails otherwise), and Open MPI's
/// ranks each in a namespace of its own — each sent its share of the data on its own
/// namespace's interface (in one namespace they would talk over loopback).
fn bundle() -> Result<()> {
    let dir = target_dir().join("bench-bundle");
    eprintln!("cargo xtask bench --bundle {}", dir.display());
    crate::bench::bundle::write(&dir)?;
    let copy = target_dir().join("bench-bundle-copy");
    let _ = std::fs::remove_dir_all(&copy);
    run(std::process::Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&copy))?;
    let json = copy.join("quick.json");
    eprintln!(
        "{}/run --quick --workers 2 --sizes 64KiB --no-capacity, Open MPI and iproute2 hidden",
        copy.display()
    );
    run(std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", HIDDEN, "hidden"])
        .arg(copy.join("run"))
        .args([
            "--quick",
            "--workers",
            "2",
            "--sizes",
            "64KiB",
            "--no-capacity",
            "--json",
        ])
        .arg(&json))?;
    let figures: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let runs = figures["runs"].as_array().cloned().unwrap_or_default();
    for system in ["switch", "mpi+xagg", "openmpi"] {
        let r = runs
            .iter()
            .find(|r| r["system"] == system)
            .ok_or_else(|| anyhow::anyhow!("the bundle's bench ran no {system} point"))?;
        let wire = r["wire_ratio"].as_f64().unwrap_or(0.0);
        anyhow::ensure!(
            r["verified"] == true && wire > 0.9,
            "the bundle's {system} run: verified {}, {wire:.3} S sent per worker on its interface",
            r["verified"]
        );
    }
    Ok(())
}

/// Runs "$@" with the machine's `ip`, Open MPI and PMIx hidden (in a mount namespace of
/// its own: `unshare -m`).
const HIDDEN: &str = r#"set -e
# Programs are hidden behind a stub that fails loudly (an empty file would run as an empty
# shell script and succeed); libraries behind an empty file.
# They live beside the bundle's copy, which the next check removes (inside this namespace
# they are busy as mount sources).
scratch="$(dirname "$1")/.hidden"
mkdir -p "$scratch/dir"
stub="$scratch/stub" empty="$scratch/empty" emptydir="$scratch/dir"
printf '#!/bin/sh\necho "hidden from the bundle check: $0" >&2\nexit 127\n' > "$stub"
chmod +x "$stub"
: > "$empty"
L=/usr/lib/x86_64-linux-gnu
for f in /usr/bin/ip /usr/sbin/ip /bin/ip /sbin/ip /usr/bin/mpirun /usr/bin/mpicc \
         /usr/bin/orterun /usr/bin/orted; do
    if [ -e "$f" ]; then mount --bind "$stub" "$(readlink -f "$f")"; fi
done
for f in $L/libmpi.so.40 $L/libopen-pal.so.40 $L/libopen-rte.so.40 $L/libmnl.so.0 $L/libbpf.so.1; do
    if [ -e "$f" ]; then mount --bind "$empty" "$(readlink -f "$f")"; fi
done
for d in $L/openmpi $L/pmix2 /usr/share/openmpi /etc/openmpi; do
    if [ -d "$d" ]; then mount --bind "$emptydir" "$d"; fi
done
exec env -i PATH=/usr/bin:/bin HOME=/root OMPI_MCA_plm=isolated "$@"
"#;
