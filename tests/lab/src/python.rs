//! Python in the lab: the virtual environment `cargo xtask setup` makes (over Debian's
//! Python with NumPy and PyTorch, the xagg module installed by `cargo xtask build`), and
//! one process per worker namespace.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use anyhow::{Context, Result};

use crate::{lab::Lab, target_dir, tree::TreeLab};

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
    let own = (0..n).map(|i| (lab.worker_ns(i), Vec::new())).collect();
    spawn(own, env, args)
}

/// A shell command line per rank (`line(i)`), as a user types it, run in worker i's
/// namespace for ranks 0..n at once with `env` besides; each rank's output.
pub fn shell_ranks(
    lab: &Lab,
    n: usize,
    env: &[(&str, String)],
    line: impl Fn(usize) -> String,
) -> Result<Vec<Output>> {
    all_at_once((0..n).map(|i| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &lab.worker_ns(i), "sh", "-c", &line(i)])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    }))
}

/// Starts every command, then waits for each: their outputs, in order.
fn all_at_once(commands: impl Iterator<Item = Command>) -> Result<Vec<Output>> {
    let children = commands
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting a rank")
        })
        .collect::<Result<Vec<_>>>()?;
    children
        .into_iter()
        .map(|c| c.wait_with_output().context("waiting for a rank"))
        .collect()
}

/// [`ranks`] on every rank of a tree lab, each in its namespace with, besides `env`,
/// `XAGG_DAEMON` set to its host's daemon, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` to its place
/// on its host (as a launcher sets them), and `XAGG_COORDINATOR` to rank 0's host's daemon.
pub fn tree_ranks(
    lab: &TreeLab,
    env: &[(&str, String)],
    args: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Output>> {
    let daemon = |host: usize| lab.points[host].listener().to_string();
    let own = lab
        .ranks
        .iter()
        .map(|r| {
            let local = lab.points[r.host].children.len();
            let e = vec![
                ("XAGG_DAEMON".to_string(), daemon(r.host)),
                ("XAGG_COORDINATOR".to_string(), daemon(lab.ranks[0].host)),
                ("LOCAL_RANK".to_string(), r.local.to_string()),
                ("LOCAL_WORLD_SIZE".to_string(), local.to_string()),
            ];
            (r.ns.clone(), e)
        })
        .collect();
    spawn(own, env, args)
}

/// The interpreter with `args(i)` in each namespace of `ranks` at once, with `RANK`,
/// `WORLD_SIZE`, `env` and each rank's own environment; each rank's output.
fn spawn(
    ranks: Vec<(String, Vec<(String, String)>)>,
    env: &[(&str, String)],
    args: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Output>> {
    let python = interpreter();
    anyhow::ensure!(
        python.exists(),
        "{} is made by cargo xtask setup",
        python.display()
    );
    let n = ranks.len();
    all_at_once(ranks.iter().enumerate().map(|(i, (ns, own))| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(&python)
            .args(args(i))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(own.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RANK", i.to_string())
            .env("WORLD_SIZE", n.to_string());
        c
    }))
}

/// torchrun on ranks 0..n, one node per worker namespace (one process each), rank 0's
/// namespace hosting the rendezvous at `port`: `script` with `args`.
pub fn torchrun(
    lab: &Lab,
    n: usize,
    port: u16,
    env: &[(&str, String)],
    script: &std::path::Path,
    args: &[&str],
) -> Result<Vec<Output>> {
    let master = crate::lab::worker_ip(0);
    ranks(lab, n, env, |i| {
        torchrun_args(n, i, master, port, script, args)
    })
}

/// `script` with `args` on ranks 0..n, one per worker namespace, each started with the
/// environment torchrun gives a worker (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: rank 0's namespace hosts the store at
/// `port`) but without torchrun's agents, which cost each run seconds of their own start and
/// exit (the tests of the launch itself use [`torchrun`]).
pub fn as_torchrun_starts(
    lab: &Lab,
    n: usize,
    port: u16,
    env: &[(&str, String)],
    script: &std::path::Path,
    args: &[&str],
) -> Result<Vec<Output>> {
    let mut e = env.to_vec();
    e.extend([
        ("LOCAL_RANK", "0".to_string()),
        ("LOCAL_WORLD_SIZE", "1".to_string()),
        ("MASTER_ADDR", crate::lab::worker_ip(0).to_string()),
        ("MASTER_PORT", port.to_string()),
    ]);
    ranks(lab, n, &e, |_| {
        let mut a = vec![script.display().to_string()];
        a.extend(args.iter().map(|s| s.to_string()));
        a
    })
}

/// [`torchrun`] on every rank of a tree lab, each with `XAGG_DAEMON` set to its host's
/// daemon: the backend finds which ranks share a host from the daemons they name.
pub fn tree_torchrun(
    lab: &TreeLab,
    port: u16,
    env: &[(&str, String)],
    script: &std::path::Path,
    args: &[&str],
) -> Result<Vec<Output>> {
    let (n, master) = (lab.ranks.len(), lab.ranks[0].ip);
    let own = lab
        .ranks
        .iter()
        .map(|r| {
            let daemon = lab.points[r.host].listener().to_string();
            (r.ns.clone(), vec![("XAGG_DAEMON".to_string(), daemon)])
        })
        .collect();
    spawn(own, env, |i| {
        torchrun_args(n, i, master, port, script, args)
    })
}

/// torchrun's command line for node `i` of `n` (one process each), the rendezvous at
/// `master`:`port`.
fn torchrun_args(
    n: usize,
    i: usize,
    master: std::net::Ipv4Addr,
    port: u16,
    script: &std::path::Path,
    args: &[&str],
) -> Vec<String> {
    let mut a: Vec<String> = [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        &n.to_string(),
        "--nproc_per_node",
        "1",
        "--node_rank",
        &i.to_string(),
        "--master_addr",
        &master.to_string(),
        "--master_port",
        &port.to_string(),
        // torch 1.13's launcher on Python 3.11 parses only the redirections 1 and 2
        // (its flag enum lost 0 and 3 in iteration): stdout to its log and, with the
        // tee, to ours as well.
        "--redirects",
        "1",
        "--tee",
        "1",
        // Its agent looks at its worker every 5 s by default: each run would end up to 5 s
        // after its program did.
        "--monitor_interval",
        "0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(script.display().to_string());
    a.extend(args.iter().map(|s| s.to_string()));
    a
}
