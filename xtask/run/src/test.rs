//! The test suite, in two tiers: the default one (what CI runs; its budget is 25 minutes
//! from a fresh clone on a 2-core machine, builds included) and `--long`, which adds the
//! soak runs (docs/testing.md).

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
    }
    quick_bench()
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
/// tests/tests/tree.rs assert the bytes per link).
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
    Ok(())
}

/// The benchmark, quick (for breakage, not figures): every path of it runs, both systems
/// verified; then the send path, quick: both ways of sending reach the switch; then the
/// switch object against itself, interleaved.
fn quick_bench() -> Result<()> {
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
        iterations: None,
        rounds: 1,
        segment: None,
        mtu: xagg_lab::lab::MTU,
        slots: crate::bench::SLOTS,
        switch_cpus: cpu(1),
        worker_cpus: cpu(0),
        levers: false,
        send_path,
        bundle: None,
    };
    eprintln!("cargo xtask bench --quick --switch-cpus 1 --worker-cpus 0 (2 workers, small sizes)");
    crate::bench::run(quick(false, "bench/quick.json"))?;
    eprintln!("cargo xtask bench --send-path --quick");
    crate::bench::run(quick(true, "bench/send_path_quick.json"))?;
    // The A/B of two switch objects, here the build against itself.
    let object = xagg_lab::Object::Switch.path();
    eprintln!("cargo xtask bench --quick --against {}", object.display());
    crate::bench::run(crate::bench::BenchArgs {
        against: Some(object),
        ..quick(false, "bench/compare_quick.json")
    })
}
