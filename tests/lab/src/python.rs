//! Python in the lab: the virtual environment `cargo xtask setup` makes (over Debian's
//! Python with NumPy and PyTorch, the xagg module installed by `cargo xtask build`), and
//! one process per worker namespace.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use anyhow::{Context, Result};

use crate::{lab::Lab, target_dir};

/// The virtual environment's interpreter.
pub fn interpreter() -> PathBuf {
    target_dir().join("venv/bin/python")
}

/// The environment every rank gets: one thread for PyTorch's own work, unbuffered output,
/// and Gloo on the lab's interface (it would take the address the host name resolves to:
/// loopback in the lab's namespaces).
pub fn base_env() -> Vec<(&'static str, String)> {
    vec![
        ("PYTHONUNBUFFERED", "1".into()),
        ("OMP_NUM_THREADS", "1".into()),
        ("GLOO_SOCKET_IFNAME", "eth0".into()),
    ]
}

/// Runs the interpreter with `args(i)` on ranks 0..n at once, rank i in worker i's
/// namespace with `RANK` and `WORLD_SIZE` set and `env` besides; each rank's output.
pub fn ranks(
    lab: &Lab,
    n: usize,
    env: &[(&str, String)],
    args: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Output>> {
    let python = interpreter();
    anyhow::ensure!(
        python.exists(),
        "{} is made by cargo xtask setup",
        python.display()
    );
    let children = (0..n)
        .map(|i| {
            Command::new("ip")
                .args(["netns", "exec", &lab.worker_ns(i)])
                .arg(&python)
                .args(args(i))
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("RANK", i.to_string())
                .env("WORLD_SIZE", n.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting python")
        })
        .collect::<Result<Vec<_>>>()?;
    children
        .into_iter()
        .map(|c| c.wait_with_output().context("waiting for python"))
        .collect()
}
