//! Starting the worker: joined over the network or for a job added by hand, with the
//! flags' settings.

use std::{
    net::{SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use xagg_common::wire::{DType, Op, DEFAULT_PORT};
use xagg_worker::{Worker, WorkerParams};

use super::{AllreduceArgs, Member, ParamsFile};

/// The worker, ready for the first allreduce: joined over the network (`--join`) or
/// started for a job added by hand.
pub(super) fn worker(a: &AllreduceArgs, file: ParamsFile, me: &Member) -> Result<Worker> {
    let size = me.dtype.size();
    if !a.size.is_multiple_of(size) {
        bail!(
            "--size {} is not a whole number of {} elements ({size} bytes each)",
            a.size,
            me.dtype
        );
    }
    if let Some(daemon) = a.join {
        return join(a, me, daemon);
    }
    let w = Worker::new(params_by_hand(a, file, me)?)?;
    // Before any clock starts: which shadow copy each slot takes next, from the switch.
    w.sync()?;
    Ok(w)
}

/// Joins the job through the daemon's listener at `daemon`, with the job's key and secret
/// (and a credential to create it, if given); the join names the switch and the job, and
/// the worker learns the job's state from the switch before any clock starts.
fn join(a: &AllreduceArgs, me: &Member, daemon: SocketAddr) -> Result<Worker> {
    let read_hex = |path: &PathBuf, what: &str| -> Result<String> {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading the {what} from {}", path.display()))
    };
    let secret: xagg_worker::Secret = read_hex(
        a.secret_file
            .as_ref()
            .context("--secret-file is required with --join (write one with `xagg keygen`)")?,
        "job's secret",
    )?
    .parse()
    .map_err(anyhow::Error::msg)?;
    // As the MPI library and the Python module read it, the flags in the variables' place.
    let credential = xagg_worker::settings::credential(
        a.credential
            .clone()
            .or_else(|| std::env::var("XAGG_CREDENTIAL").ok()),
        a.credential_file.as_ref().map(|f| f.display().to_string()),
    )?;
    let j = xagg_worker::JoinParams {
        daemon,
        key: a
            .key
            .context("--key is required with --join (from `xagg keygen`)")?,
        secret,
        rank: me.index,
        shape: me.shape,
        bind: me.bind,
        credential,
        timeout: Duration::from_secs(a.join_timeout_s),
        levels: None,
    };
    Ok(Worker::join_synced(j, |p| settings(p, a, me.op, me.dtype))?)
}

/// The worker's parameters for a job added by hand: the switch and the job from the flags
/// or the params file.
fn params_by_hand(a: &AllreduceArgs, f: ParamsFile, me: &Member) -> Result<WorkerParams> {
    let switch = parse_switch(
        &a.switch
            .clone()
            .or(f.switch)
            .context("--switch is required (the switch's IP[:PORT]), or --join")?,
    )?;
    let job = a.job.or(f.job).context("--job is required, or --join")?;
    let mut p = WorkerParams::new(switch, me.bind, job, me.index, me.shape);
    settings(&mut p, a, me.op, me.dtype);
    Ok(p)
}

/// `--switch`: IP[:PORT], the protocol's port when none is given.
fn parse_switch(s: &str) -> Result<SocketAddrV4> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let ip = s
        .parse()
        .map_err(|_| anyhow::anyhow!("--switch `{s}`: write IP or IP:PORT"))?;
    Ok(SocketAddrV4::new(ip, DEFAULT_PORT))
}

/// The worker's settings from the flags.
fn settings(p: &mut WorkerParams, a: &AllreduceArgs, op: Op, dtype: DType) {
    p.op = op;
    p.dtype = dtype;
    p.float = a.float;
    if a.mid.is_some() {
        p.first_message = a.mid;
    }
    p.give_up = Duration::from_millis(a.give_up_ms);
    p.collective_timeout = Duration::from_secs(a.timeout_s);
    p.min_timeout = Duration::from_millis(a.min_timeout_ms);
    if a.join.is_none() {
        p.switch_ports = a.switch_ports;
    }
    p.reorder = a.reorder;
    p.gso = !a.no_gso;
    p.gro = !a.no_gro;
    p.afxdp = a.afxdp.then_some(xagg_objects::HOST);
    p.spin = Duration::from_micros(a.spin_us);
}
