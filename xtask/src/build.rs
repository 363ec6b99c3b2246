//! Tool installation and builds.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub use xagg_lab::target_dir;

/// Where the XDP object is built: its own target directory, because the host tools of
/// that build (proc macros, build scripts) are compiled with `RUSTC_BOOTSTRAP`, and in the
/// shared directory each build would throw away the other's and rebuild everything.
pub fn ebpf_target_dir() -> PathBuf {
    target_dir().join("ebpf")
}

/// The XDP object `cargo xtask build` produces: the switch's, which the daemon embeds.
pub fn ebpf_object() -> PathBuf {
    ebpf_target_dir().join("bpfel-unknown-none/release/xagg")
}

/// The object of the bench's and the tests' programs (`xagg_floor`, `xagg_impair`), built
/// with the switch's and never embedded.
pub fn ebpf_test_object() -> PathBuf {
    ebpf_target_dir().join("bpfel-unknown-none/release/xagg-test")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// Installs what the eBPF build and the tests need and is missing: iproute2, iputils-ping,
/// nftables, tmux, systemd (for systemd-analyze), Open MPI with gfortran, mpi4py, NumPy and
/// PyTorch (Debian's, for /usr/bin/python3), a virtual environment with maturin, LLVM 22
/// (Debian), the rust-src component,
/// bpf-linker 0.13 built against LLVM 22. Each step is skipped when its result is already
/// there.
pub fn setup() -> Result<()> {
    if !succeeds(Command::new("ip").arg("-V")) {
        apt(&["iproute2"])?;
    }
    // The tests check that ordinary traffic (ping, TCP) still crosses the switch.
    if !succeeds(Command::new("ping").arg("-V")) {
        apt(&["iputils-ping"])?;
    }
    // The trust tests impose a host's packet filter on a worker, as users' hosts do.
    if !succeeds(Command::new("nft").arg("--version")) {
        apt(&["nftables"])?;
    }
    // The live view's test drives `xagg top` in a terminal.
    if !succeeds(Command::new("tmux").arg("-V")) {
        apt(&["tmux"])?;
    }
    // The deployment tests check the daemon's systemd unit with `systemd-analyze verify`
    // (in the systemd package; a package of its own where a release splits it out).
    let analyze = || succeeds(Command::new("systemd-analyze").arg("--version"));
    if !analyze() {
        apt(&["systemd"])?;
        if !analyze() {
            apt(&["systemd-analyze"])?;
        }
    }
    // The MPI baseline of the bench, and the tests of the MPI library: C and Fortran
    // programs under Open MPI, and mpi4py.
    if !succeeds(Command::new("mpicc").arg("--version"))
        || !succeeds(Command::new("mpifort").arg("--version"))
    {
        apt(&["openmpi-bin", "libopenmpi-dev", "gfortran"])?;
    }
    if !succeeds(Command::new("/usr/bin/python3").args(["-c", "import mpi4py, numpy"])) {
        apt(&["python3-mpi4py", "python3-numpy"])?;
    }
    // The Python module's tests: Debian's PyTorch (1.13, CPU), and a virtual environment
    // over Debian's Python (which holds torch, NumPy and mpi4py) with maturin in it.
    if !succeeds(Command::new("/usr/bin/python3").args(["-c", "import torch"])) {
        apt(&["python3-torch"])?;
    }
    if !succeeds(Command::new("/usr/bin/python3").args(["-c", "import ensurepip, venv"])) {
        apt(&["python3-venv"])?;
    }
    let venv = venv_dir();
    if !venv.join("bin/python").exists() {
        eprintln!(
            "setup: a virtual environment for the Python module in {}",
            venv.display()
        );
        run(Command::new("/usr/bin/python3")
            .args(["-m", "venv", "--system-site-packages"])
            .arg(&venv))?;
    }
    if !succeeds(Command::new(venv.join("bin/maturin")).arg("--version")) {
        eprintln!("setup: installing maturin into the virtual environment (pip)");
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "maturin>=1.16,<2"]))?;
    }
    let have_src = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("rust-src"))
        .unwrap_or(false);
    if !have_src {
        eprintln!("setup: adding the rust-src component (for -Z build-std)");
        run(Command::new("rustup").args(["component", "add", "rust-src"]))?;
    }
    if !succeeds(Command::new("bpf-linker").arg("--version")) {
        if !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists() {
            apt(&[
                "llvm-22-dev",
                "libpolly-22-dev",
                "zlib1g-dev",
                "libzstd-dev",
            ])?;
        }
        eprintln!("setup: building bpf-linker 0.13.0 against LLVM 22 (about a minute)");
        let path = format!(
            "/usr/lib/llvm-22/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        run(Command::new("cargo").env("PATH", path).args([
            "install",
            "bpf-linker",
            "--version",
            "0.13.0",
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ]))?;
    }
    Ok(())
}

fn apt(pkgs: &[&str]) -> Result<()> {
    eprintln!("setup: installing {} (apt)", pkgs.join(" "));
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq"])
        .args(pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The virtual environment the Python module is installed into (over Debian's Python,
/// which has torch, NumPy and mpi4py).
pub fn venv_dir() -> PathBuf {
    target_dir().join("venv")
}

/// Builds the XDP objects, then the release binaries that embed the switch's.
pub fn build_all() -> Result<()> {
    // Both objects (the switch's and the test programs'): the crate's two binaries.
    // Stable rustc with RUSTC_BOOTSTRAP builds core for the BPF target; --btf is needed for
    // the BTF maps (the slot spin lock lives in one).
    run(cargo()
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback")
        .args([
            "build",
            "--quiet",
            "-p",
            "xagg-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            "--target-dir",
        ])
        .arg(ebpf_target_dir()))?;
    run(cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "xagg-daemon",
        "-p",
        "xagg-cli",
        "--bins",
    ]))?;
    // The MPI library, preloaded under MPI programs.
    run(cargo().args(["build", "--quiet", "--release", "-p", "xagg-mpi"]))?;
    // The Python module: a wheel, installed into the virtual environment as a user would
    // (with its start-up hook, which an editable install would not carry).
    let venv = venv_dir();
    let wheels = target_dir().join("wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    run(Command::new(venv.join("bin/maturin"))
        .current_dir(root())
        .env("VIRTUAL_ENV", &venv)
        .args([
            "build",
            "--quiet",
            "--release",
            "-m",
            "control/python/Cargo.toml",
            "-o",
        ])
        .arg(&wheels))?;
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("maturin built no wheel")?;
    run(Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
        ])
        .arg(&wheel))?;
    // The worker library's examples, which the tests run in the lab as documented.
    run(cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "xagg-worker",
        "--examples",
    ]))?;
    Ok(())
}

/// The whole suite: every crate's unit tests, the BPF_PROG_RUN tables and the netns
/// tests (which need root; under CI=true they never skip), then a short coverage-guided
/// fuzz runs of the packet decoder and of the daemon's API. With `extra` (a test name filter), only the tests.
pub fn test(extra: &[String]) -> Result<()> {
    let bins = target_dir().join("release");
    run(cargo()
        .env("XAGG_BIN_DIR", &bins)
        .args([
            "test",
            "--release",
            "--workspace",
            "--exclude",
            "xagg-ebpf",
            // A Python extension module: it links against the interpreter that loads it,
            // and its tests are Python's (tests/tests/python.rs runs them).
            "--exclude",
            "xagg-python",
            "--",
        ])
        .args(["--test-threads", "1"])
        .args(extra))?;
    if !extra.is_empty() {
        return Ok(());
    }
    if !succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
        eprintln!("setup: installing cargo-fuzz (for the decoder's fuzz target)");
        run(Command::new("cargo").args([
            "install",
            "cargo-fuzz",
            "--version",
            "0.13.2",
            "--locked",
        ]))?;
    }
    // Short coverage-guided runs (long ones: docs/testing.md).
    for (target, seconds, what) in [
        ("decode", 30, "the packet decoder"),
        (
            "api",
            20,
            "the daemon's API (requests and joins against a dataplane stand-in)",
        ),
    ] {
        eprintln!("fuzzing {what} for {seconds} s");
        run(cargo()
            .current_dir(root().join("tests/fuzz"))
            .env("RUSTC_BOOTSTRAP", "1")
            .args(["fuzz", "run", target, "--"])
            .arg(format!("-max_total_time={seconds}"))
            .arg("-print_final_stats=1"))?;
    }
    // Every lab topology through the demo itself, small (each rank verified; the tests in
    // tests/tests/tree.rs assert the bytes per link).
    for t in [
        crate::topology::TopologyName::Hosts,
        crate::topology::TopologyName::Tree,
        crate::topology::TopologyName::Ring,
        crate::topology::TopologyName::Mixed,
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
    // The benchmark, quick (for breakage, not figures): every path of it runs, both systems
    // verified.
    let quick = |send_path: bool, json: &str| crate::bench::BenchArgs {
        quick: true,
        json: Some(target_dir().join(json)),
        plot: Some(target_dir().join("bench/quick.svg")),
        workers: vec![2],
        sizes: vec![4 << 10, 64 << 10],
        dataplane_only: false,
        no_capacity: false,
        switch_only: false,
        iterations: None,
        rounds: 1,
        segment: None,
        mtu: xagg_lab::lab::MTU,
        slots: crate::bench::SLOTS,
        levers: false,
        send_path,
    };
    eprintln!("cargo xtask bench --quick (2 workers, small sizes)");
    crate::bench::run(quick(false, "bench/quick.json"))?;
    // The send-path measurement, quick: both ways of sending reach the switch.
    eprintln!("cargo xtask bench --send-path --quick");
    crate::bench::run(quick(true, "bench/send_path_quick.json"))
}
