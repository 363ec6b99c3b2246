//! `cargo xtask setup | build | demo | bench | test`: installs what the command needs and is
//! missing, builds it, then hands the command to `xtask-run`. The workspace's build starts
//! first and runs while the eBPF toolchain installs; this binary itself depends on nothing
//! heavy, so that on a fresh machine it compiles in seconds.

use std::{os::unix::process::CommandExt, path::Path};

use anyhow::{bail, Context, Result};
use xtask::{
    build::{self, target_dir},
    setup::{self, Needs},
};

const USAGE: &str = "\
Build, demo and test the in-network aggregation switch

Usage: cargo xtask <COMMAND> [OPTIONS]

Commands:
  setup  Install everything the test suite needs and is missing, idempotently: iproute2,
         the rust-src component, LLVM 22 and bpf-linker 0.13 (the eBPF toolchain); Open
         MPI and gfortran; Debian's PyTorch and NumPy, and a Python virtual environment
         with maturin; iputils-ping, nftables, tmux, systemd-analyze and mpi4py (the
         tests'); with `--fuzz` also cargo-fuzz. Every other command installs only what
         it uses.
  build  Build the XDP objects, the release binaries (xaggd, xagg), the MPI library, the
         Python module and the worker library's examples.
  demo   Build, bring up a netns lab, allreduce through the XDP switch, verify, report,
         clean up. Installs iproute2 and the eBPF toolchain; `--mpi` adds Open MPI (and
         gfortran for a Fortran program), `--ddp` PyTorch.
  bench  Measure the switch against Open MPI end to end, the switch program's cost per
         packet (BPF_PROG_RUN) and the worker's conversions. Installs what `demo` does,
         and Open MPI and PyTorch unless `--dataplane-only` or `--switch-only`.
         `--bundle DIR` writes it (all but PyTorch's runs) into a directory that runs on
         another Linux x86-64 machine, with no Rust toolchain, Open MPI or iproute2 there.
  test   Build and run the test suite: fmt and clippy, unit, BPF_PROG_RUN and netns end to
         end tests, the benchmark quick; `--long` adds fuzzing and the demo's topologies.
         Installs what `setup` does (cargo-fuzz only with `--long`).

`cargo xtask demo --help` (bench, test) lists a command's options; it builds the program
that runs them first, installing nothing.
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        std::process::exit(2);
    };
    let options = &args[1..];
    let has = |flag: &str| options.iter().any(|a| a == flag);
    let help = has("-h") || has("--help");
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "setup" if help => {
            println!("Usage: cargo xtask setup [--fuzz]\n\n  --fuzz  Also cargo-fuzz (for `cargo xtask test --long`)");
            Ok(())
        }
        "setup" => setup::install(Needs::all(has("--fuzz"))),
        "build" => prepare(Needs::all(false)),
        "demo" | "bench" | "test" if help => {
            build::runner()?;
            hand_over(&args)
        }
        "demo" => {
            let mpi = mpi_program(options);
            prepare(Needs {
                fortran: mpi
                    .as_deref()
                    .is_some_and(|p| Path::new(p).extension().is_some_and(|e| e != "c")),
                mpi: mpi.is_some(),
                python: has("--ddp"),
                ..Needs::default()
            })?;
            hand_over(&args)
        }
        "bench" => {
            // Open MPI is the baseline of the end-to-end runs, which also run the MPI
            // library and the Python module. A bundle carries Open MPI (its MPI program
            // compiled here) and the MPI library, not PyTorch.
            let against_others = !has("--dataplane-only") && !has("--switch-only");
            let bundle = options
                .iter()
                .any(|a| a == "--bundle" || a.starts_with("--bundle="));
            prepare(Needs {
                mpi: against_others || bundle,
                python: against_others && !bundle && !has("--no-torch"),
                ..Needs::default()
            })?;
            hand_over(&args)
        }
        "test" => {
            prepare(Needs::all(has("--long")))?;
            hand_over(&args)
        }
        other => bail!("no command `{other}`\n\n{USAGE}"),
    }
}

/// The program `demo --mpi [PROGRAM]` runs: its default when `--mpi` has no value.
fn mpi_program(options: &[String]) -> Option<String> {
    let at = options
        .iter()
        .position(|a| a == "--mpi" || a.starts_with("--mpi="))?;
    if let Some(value) = options[at].strip_prefix("--mpi=") {
        return Some(value.to_string());
    }
    match options.get(at + 1) {
        Some(value) if !value.starts_with('-') => Some(value.clone()),
        _ => Some("tests/mpi/check.c".into()),
    }
}

/// Installs what is missing for `needs` and builds it. The workspace's libraries need
/// nothing installed to compile, so their build runs beside the installation (on a fresh
/// machine the two together take about as long as the libraries alone); the binaries,
/// which embed the XDP objects, compile once those are built.
fn prepare(needs: Needs) -> Result<()> {
    let mut libraries = build::libraries()
        .spawn()
        .context("starting the workspace's build")?;
    let installed = setup::install(needs);
    let built = libraries.wait().context("the workspace's build")?;
    installed?;
    if !built.success() {
        bail!("building the workspace's libraries failed: {built}");
    }
    build::build(needs)
}

/// Runs the command with `xtask-run`, which replaces this process (a Ctrl-C reaches it
/// alone, and it cleans up its lab).
fn hand_over(args: &[String]) -> Result<()> {
    let runner = target_dir().join("release/xtask-run");
    let error = std::process::Command::new(&runner)
        .args(args)
        .current_dir(build::root())
        .exec();
    Err(error).with_context(|| format!("running {}", runner.display()))
}
