//! Open MPI in the lab: `mpirun` in worker 0's namespace, starting one rank per worker
//! namespace through an rsh agent (each rank with its own UTS namespace, so every rank has
//! a host name of its own), over the lab's addresses only. In a tree lab, one rank per
//! rank namespace, each told its own host's daemon.
//!
//! mpirun's hosts are names that resolve nowhere (`h0`, `h1`, ...), which the agent maps
//! to namespaces, with `orte_do_not_resolve`: mpirun merges hosts that resolve alike, and
//! on some machines the lab's addresses (or names) all resolve to the local node, every
//! rank then landing in mpirun's own namespace. So every rank, the first too, is started
//! through the agent.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context, Result};

use crate::{lab::Lab, tree::TreeLab};

/// A "host" mpirun starts a rank on: the namespace the rank runs in, and the environment
/// that host gives its processes.
pub struct Host {
    pub ns: String,
    /// Its address on the lab's network: mpirun may name the host by it, as a user's
    /// `--host` list does.
    pub ip: std::net::Ipv4Addr,
    pub env: Vec<(String, String)>,
}

fn lab_hosts(lab: &Lab) -> Vec<Host> {
    (0..lab.workers)
        .map(|i| Host {
            ns: lab.worker_ns(i),
            ip: crate::lab::worker_ip(i),
            env: Vec::new(),
        })
        .collect()
}

/// Every rank of a tree lab as a host, in rank order, `XAGG_DAEMON` set to its own host's
/// daemon (as each machine of a cluster would set it to its own).
pub fn tree_hosts(lab: &TreeLab) -> Vec<Host> {
    lab.ranks
        .iter()
        .map(|r| Host {
            ns: r.ns.clone(),
            ip: r.ip,
            env: vec![(
                "XAGG_DAEMON".into(),
                lab.points[r.host].listener().to_string(),
            )],
        })
        .collect()
}

/// Compiles `source` (C with `mpicc`, Fortran `.f90`/`.F90`/`.f` with `mpifort`) into
/// `out`, with the compiler's `flags` besides.
pub fn compile(source: &Path, out: &Path, flags: &[&str]) -> Result<()> {
    let fortran = source
        .extension()
        .is_some_and(|e| e == "f90" || e == "F90" || e == "f");
    let compiler = if fortran { "mpifort" } else { "mpicc" };
    let mut c = Command::new(compiler);
    if fortran {
        // What every mpif.h program needs with gfortran 10 and later: the MPI calls take
        // buffers of any type.
        c.arg("-fallow-argument-mismatch");
    }
    let o = c
        .args(flags)
        .args(["-O2", "-o"])
        .arg(out)
        .arg(source)
        .output()
        .with_context(|| format!("running {compiler}"))?;
    anyhow::ensure!(
        o.status.success(),
        "{compiler} {}: {}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Writes the rsh agent for `lab` into `dir`: host `hI` is worker I, and the command runs
/// in that worker's namespace.
pub fn agent(lab: &Lab, dir: &Path) -> Result<PathBuf> {
    write_agent(
        &lab_hosts(lab),
        dir,
        &format!("rsh-agent-{}", lab.prefix),
        "",
    )
}

/// The rsh agent for `hosts` (e.g. [`tree_hosts`]) into `dir`, named `name`.
pub fn hosts_agent(hosts: &[Host], dir: &Path, name: &str) -> Result<PathBuf> {
    write_agent(hosts, dir, name, "")
}

/// [`agent`], the ranks (Open MPI's daemon on each host and the processes it starts)
/// running as the unprivileged user `nobody`, with no capabilities.
pub fn unprivileged_agent(lab: &Lab, dir: &Path) -> Result<PathBuf> {
    write_agent(
        &lab_hosts(lab),
        dir,
        &format!("rsh-agent-nobody-{}", lab.prefix),
        "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all ",
    )
}

fn write_agent(hosts: &[Host], dir: &Path, name: &str, wrap: &str) -> Result<PathBuf> {
    let mut cases = String::new();
    for (i, h) in hosts.iter().enumerate() {
        let env: String = h.env.iter().map(|(k, v)| format!(" {k}={v}")).collect();
        let export = if env.is_empty() {
            String::new()
        } else {
            format!(" export{env};")
        };
        cases.push_str(&format!(
            "  {}|{}) ns={};{export};\n",
            host_name(i),
            h.ip,
            h.ns
        ));
    }
    std::fs::create_dir_all(dir)?;
    let agent = dir.join(format!("{name}.sh"));
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# mpirun's rsh agent: host hI is the I-th rank's namespace; run the command there.\nhost=$1; shift\ncase \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1;;\nesac\nexport OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\nexec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $ns; {wrap}$*\"\n"
        ),
    )?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(agent)
}

/// The name mpirun knows the `i`-th host by: one that resolves nowhere.
fn host_name(i: usize) -> String {
    format!("h{i}")
}

/// Runs a user's `mpirun` command `line` as typed, in worker 0's namespace (with a host name
/// of its own), with what namespaces add to a real cluster after `mpirun`: the agent that
/// reaches the other hosts (`agent`, which knows them by their addresses too), hosts taken
/// as named, and root allowed.
pub fn run_line(lab: &Lab, agent: &Path, line: &str) -> Result<Output> {
    let ns = lab.worker_ns(0);
    let extras = format!(
        "mpirun --allow-run-as-root --mca orte_do_not_resolve 1 --mca plm_rsh_agent {} ",
        agent.display()
    );
    let line = line.replacen("mpirun ", &extras, 1);
    Command::new("ip")
        .args(["netns", "exec", &ns, "unshare", "--uts", "sh", "-c"])
        .arg(format!("hostname {ns}; {line}"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .context("running mpirun")
}

/// Runs `program` on `n` ranks (rank i in worker i's namespace) under mpirun, itself in
/// worker 0's namespace; `env` is exported to every rank (`-x`). Open MPI talks TCP over
/// the lab's subnet.
pub fn run(
    lab: &Lab,
    agent: &Path,
    n: usize,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    run_from(&lab.worker_ns(0), agent, n, env, program)
}

/// Runs `program` on one rank per host of `hosts` under mpirun in the first host's
/// namespace, over the tree lab's network (10.77.0.0/16); `env` is exported to every rank
/// besides each host's own.
pub fn run_on_hosts(
    hosts: &[Host],
    agent: &Path,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    mpirun(
        &hosts[0].ns,
        agent,
        hosts.len(),
        "10.77.0.0/16",
        env,
        program,
    )
}

/// [`run`] with mpirun in namespace `ns` (e.g. the switch's: the ranks are started through
/// the agent either way, as [`unprivileged_agent`] wants).
pub fn run_from(
    ns: &str,
    agent: &Path,
    n: usize,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    mpirun(ns, agent, n, "10.77.0.0/24", env, program)
}

fn mpirun(
    ns: &str,
    agent: &Path,
    n: usize,
    subnet: &str,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    let hosts: Vec<String> = (0..n).map(host_name).collect();
    let exports: String = env.iter().map(|(k, v)| format!(" -x {k}={v}")).collect();
    let cmd = format!(
        "hostname {ns}; mpirun --allow-run-as-root -np {n} --host {hosts} --mca orte_do_not_resolve 1 --mca plm_rsh_agent {agent} \
         --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include {subnet} --mca oob_tcp_if_include {subnet} --bind-to none \
         --mca mpi_yield_when_idle 1{exports} {program}",
        hosts = hosts.join(","),
        agent = agent.display(),
    );
    Command::new("ip")
        .args(["netns", "exec", ns, "unshare", "--uts", "sh", "-c", &cmd])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .context("running mpirun")
}
