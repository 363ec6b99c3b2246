//! Tool installation and builds.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::setup::Needs;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace's target directory (`CARGO_TARGET_DIR`, or `target/` at the root).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Where the XDP object is built: its own target directory, because the host tools of
/// that build (proc macros, build scripts) are compiled with `RUSTC_BOOTSTRAP`, and in the
/// shared directory each build would throw away the other's and rebuild everything.
pub fn ebpf_target_dir() -> PathBuf {
    target_dir().join("ebpf")
}

/// `cargo SUBCOMMAND` over the XDP crate, for its BPF target, into its own target directory.
/// Stable rustc with RUSTC_BOOTSTRAP builds core for the BPF target; --btf is needed for the
/// BTF maps (the slot spin lock lives in one).
pub fn ebpf_cargo(subcommand: &str) -> Command {
    let mut c = cargo();
    c.env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback")
        .args([
            subcommand,
            "--quiet",
            "-p",
            "xagg-ebpf",
            "--target",
            "bpfel-unknown-none",
        ])
        .args(["-Z", "build-std=core", "--release", "--target-dir"])
        .arg(ebpf_target_dir());
    c
}

pub fn cargo() -> Command {
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

pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// The virtual environment the Python module is installed into (over Debian's Python,
/// which has torch, NumPy and mpi4py).
pub fn venv_dir() -> PathBuf {
    target_dir().join("venv")
}

/// The release binaries every command runs: `xaggd` and `xagg`, which embed the XDP objects
/// (through `xagg-objects`, on which no library depends), and `xtask-run`.
pub fn binaries() -> Command {
    let mut c = cargo();
    c.args(["build", "--quiet", "--release"]);
    c.args(["-p", "xaggd", "-p", "xagg-cli", "-p", "xtask-run"]);
    c
}

/// Everything [`binaries`] needs but the binaries' own crates: what can compile before the
/// XDP objects exist, while the eBPF toolchain installs. The same packages as
/// [`binaries`], so that Cargo resolves the same features and nothing compiles twice
/// (a smaller set would build some dependencies again with other features).
pub fn libraries() -> Command {
    let mut c = binaries();
    c.arg("--lib");
    c
}

/// `xtask-run`, alone: what `--help` of the commands it runs needs, with nothing installed
/// (within [`binaries`]' package set, so that what it compiles serves them later).
pub fn runner() -> Result<()> {
    run(binaries().args(["--bin", "xtask-run"]))
}

/// Builds what a command uses: always the XDP objects (the switch's, a worker's and the test
/// programs') and [`binaries`]; the MPI library, the Python module and the worker library's
/// examples only where `needs` asks for them.
pub fn build(needs: Needs) -> Result<()> {
    // The objects: the XDP crate's binaries (the switch's, a worker's, the tests').
    run(&mut ebpf_cargo("build"))?;
    run(&mut binaries())?;
    if needs.mpi {
        // The MPI library, preloaded under MPI programs.
        run(cargo().args(["build", "--quiet", "--release", "-p", "xagg-mpi"]))?;
    }
    if needs.python {
        python_module()?;
    }
    if needs.test_tools {
        // The worker library's examples, which the tests run in the lab as documented.
        run(cargo().args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "xagg-worker",
            "--examples",
        ]))?;
    }
    Ok(())
}

/// The Python module: a wheel, installed into the virtual environment as a user would
/// (with its start-up hook, which an editable install would not carry).
fn python_module() -> Result<()> {
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
        .arg(&wheel))
}
