//! Open MPI in the lab: `mpirun` in worker 0's namespace, starting one rank per worker
//! namespace through an rsh agent (each rank with its own UTS namespace, so every rank has
//! a host name of its own), over the lab's addresses only. In a tree lab, one rank per
//! rank namespace, each told its own host's daemon.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context, Result};

use crate::{
    lab::{worker_ip, Lab},
    tree::TreeLab,
};

/// A "host" mpirun starts a rank on: its lab address, the namespace the rank runs in, and
/// the environment that host gives its processes.
pub struct Host {
    pub ip: std::net::Ipv4Addr,
    pub ns: String,
    pub env: Vec<(String, String)>,
}

fn lab_hosts(lab: &Lab) -> Vec<Host> {
    (0..lab.workers)
        .map(|i| Host {
            ip: worker_ip(i),
            ns: lab.worker_ns(i),
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
            ip: r.ip,
            ns: r.ns.clone(),
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

/// Writes the rsh agent for `lab` into `dir`: a "host" is a worker's lab address, and the
/// command runs in that worker's namespace.
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
    for h in hosts {
        let env: String = h.env.iter().map(|(k, v)| format!(" {k}={v}")).collect();
        let export = if env.is_empty() {
            String::new()
        } else {
            format!(" export{env};")
        };
        cases.push_str(&format!("  {}) ns={};{export};\n", h.ip, h.ns));
    }
    std::fs::create_dir_all(dir)?;
    let agent = dir.join(format!("{name}.sh"));
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# mpirun's rsh agent: a \"host\" is a worker's lab address; run the command in its namespace.\nhost=$1; shift\ncase \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1;;\nesac\nexport OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\nexec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $ns; {wrap}$*\"\n"
        ),
    )?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(agent)
}

/// Runs `program` with `args` on `n` ranks (rank i in worker i's namespace) under mpirun,
/// itself in worker 0's namespace (where it starts rank 0 itself); `env` is exported to
/// every rank (`-x`). Open MPI talks TCP over the lab's subnet.
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
    let ips: Vec<std::net::Ipv4Addr> = hosts.iter().map(|h| h.ip).collect();
    // mpirun starts the first host's rank itself: that host's environment is its own.
    mpirun(&hosts[0], agent, &ips, "10.77.0.0/16", env, program)
}

/// [`run`] with mpirun in namespace `ns`: from the switch's, every rank is started through
/// the agent (as [`unprivileged_agent`] wants).
pub fn run_from(
    ns: &str,
    agent: &Path,
    n: usize,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    let ips: Vec<std::net::Ipv4Addr> = (0..n).map(worker_ip).collect();
    let here = Host {
        ip: ips[0],
        ns: ns.to_string(),
        env: Vec::new(),
    };
    mpirun(&here, agent, &ips, "10.77.0.0/24", env, program)
}

fn mpirun(
    here: &Host,
    agent: &Path,
    hosts: &[std::net::Ipv4Addr],
    subnet: &str,
    env: &[(&str, String)],
    program: &str,
) -> Result<Output> {
    let n = hosts.len();
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    let ns = &here.ns;
    let exports: String = env.iter().map(|(k, v)| format!(" -x {k}={v}")).collect();
    let own: String = here
        .env
        .iter()
        .map(|(k, v)| format!("export {k}={v}; "))
        .collect();
    let cmd = format!(
        "hostname {ns}; {own}mpirun --allow-run-as-root -np {n} --host {hosts} --mca plm_rsh_agent {agent} --mca pml ob1 --mca btl tcp,self \
         --mca btl_tcp_if_include {subnet} --mca oob_tcp_if_include {subnet} --bind-to none --mca mpi_yield_when_idle 1{exports} {program}",
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
