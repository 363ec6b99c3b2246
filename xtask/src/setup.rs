//! Installing what a command needs and is missing, idempotently: each step is skipped
//! when what it installs already answers. Packages come from Debian without their
//! recommendations (PyTorch's would bring a desktop's worth of GUI libraries).

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::build::{run, succeeds, venv_dir};

/// What a command needs installed, beyond the eBPF toolchain every command needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// Open MPI (mpicc, mpirun): MPI programs under the preload, the bench's baseline.
    pub mpi: bool,
    /// gfortran: Fortran MPI programs.
    pub fortran: bool,
    /// PyTorch and a virtual environment with maturin: the Python module.
    pub python: bool,
    /// What only the test suite uses: ping, nftables, tmux, systemd-analyze, mpi4py.
    pub test_tools: bool,
    /// cargo-fuzz, for the coverage-guided fuzz runs of `cargo xtask test --long`.
    pub fuzz: bool,
}

impl Needs {
    /// Everything the suite uses (`cargo xtask setup`, `cargo xtask test`).
    pub fn all(fuzz: bool) -> Self {
        Self {
            mpi: true,
            fortran: true,
            python: true,
            test_tools: true,
            fuzz,
        }
    }
}

/// Installs the eBPF toolchain (iproute2, the rust-src component, LLVM 22, bpf-linker
/// 0.13 built against it) and what `needs` adds.
pub fn install(needs: Needs) -> Result<()> {
    if !succeeds(Command::new("ip").arg("-V")) {
        apt(&["iproute2"])?;
    }
    ebpf_toolchain()?;
    if needs.mpi && !succeeds(Command::new("mpicc").arg("--version")) {
        apt(&["openmpi-bin", "libopenmpi-dev"])?;
    }
    if needs.fortran && !succeeds(Command::new("mpifort").arg("--version")) {
        apt(&["gfortran"])?;
    }
    if needs.python {
        python()?;
    }
    if needs.test_tools {
        test_tools()?;
    }
    if needs.fuzz && !succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
        eprintln!("setup: installing cargo-fuzz (for the fuzz targets)");
        run(Command::new("cargo").args([
            "install",
            "cargo-fuzz",
            "--version",
            "0.13.2",
            "--locked",
        ]))?;
    }
    Ok(())
}

/// The rust-src component (for `-Z build-std`) and bpf-linker 0.13 against LLVM 22.
fn ebpf_toolchain() -> Result<()> {
    let have_src = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("rust-src"))
        .unwrap_or(false);
    if !have_src {
        eprintln!("setup: adding the rust-src component (for -Z build-std)");
        run(Command::new("rustup").args(["component", "add", "rust-src"]))?;
    }
    if succeeds(Command::new("bpf-linker").arg("--version")) {
        return Ok(());
    }
    // While LLVM downloads and unpacks, compile the XDP crate's library and what it depends
    // on (core for BPF): none of it is linked, and it is half the objects' build. Not beside
    // bpf-linker's build, which wants both CPUs. Its errors, if any, show again when the
    // objects are built.
    let mut early = crate::build::ebpf_cargo("build")
        .arg("--lib")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists() {
        apt(&[
            "llvm-22-dev",
            "libpolly-22-dev",
            "zlib1g-dev",
            "libzstd-dev",
        ])?;
    }
    if let Ok(early) = &mut early {
        let _ = early.wait();
    }
    eprintln!("setup: building bpf-linker 0.13.0 against LLVM 22 (under a minute)");
    let path = format!(
        "/usr/lib/llvm-22/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    // Its release profile carries debug info and full optimisation, which double its build
    // (96 s against 47 s here); the linking it does is LLVM's work, and the objects it
    // links come out byte for byte the same, as fast, without them.
    run(Command::new("cargo")
        .env("PATH", path)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
        .args([
            "install",
            "bpf-linker",
            "--version",
            "0.13.0",
            "--locked",
            "--no-default-features",
            "--features",
            "llvm-22",
        ]))
}

/// Debian's PyTorch (1.13, CPU) and NumPy for /usr/bin/python3, and a virtual environment
/// over it (seeing those) with maturin, which builds the module's wheel.
fn python() -> Result<()> {
    if !succeeds(Command::new("/usr/bin/python3").args(["-c", "import torch, numpy"])) {
        apt(&["python3-torch", "python3-numpy"])?;
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
    Ok(())
}

fn test_tools() -> Result<()> {
    // Ordinary traffic (ping, TCP) must still cross the switch.
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
    // The metrics test reads the endpoint with Prometheus' own strict OpenMetrics parser.
    if !succeeds(
        Command::new("/usr/bin/python3")
            .args(["-c", "import prometheus_client.openmetrics.parser"]),
    ) {
        apt(&["python3-prometheus-client"])?;
    }
    // The MPI library's tests run mpi4py programs too.
    if !succeeds(Command::new("/usr/bin/python3").args(["-c", "import mpi4py"])) {
        apt(&["python3-mpi4py"])?;
    }
    Ok(())
}

fn apt(pkgs: &[&str]) -> Result<()> {
    static UPDATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    eprintln!("setup: installing {} (apt)", pkgs.join(" "));
    if !UPDATED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
    }
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}
