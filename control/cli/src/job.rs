//! `xagg job`: add, remove, list and inspect jobs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use xagg_api::{call, JobSpec, MemberSpec, Request, Response};
use xagg_common::wire::{DType, Op};

use crate::daemon::answer;

#[derive(Subcommand)]
pub enum JobCmd {
    /// Add a job, from flags or from a TOML file of its fields (docs/job.toml).
    Add(JobAddArgs),
    /// Remove a job; its slots are cleared and freed.
    Remove { id: u32 },
    /// List the jobs on the switch.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Every slot copy of a job (its round and state) and the members a filling round still
    /// waits for; without an id, the jobs workers joined over the network, pending (which
    /// ranks are missing) or running.
    Status {
        id: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// A job's place in its tree or ring as this daemon sees it: its role, its members,
    /// the aggregation point above it (or its ring neighbours) and how it reaches them,
    /// and this level's counters.
    Tree { id: u32 },
}

#[derive(clap::Args)]
pub struct JobAddArgs {
    /// Job file (TOML); flags given as well override its fields.
    #[arg(long)]
    file: Option<PathBuf>,
    #[arg(long)]
    id: Option<u32>,
    /// sum | min | max | avg | prod | and | or | xor
    #[arg(long)]
    op: Option<Op>,
    /// i32 | u32 | i64 | f32 | f64 | f16 | bf16
    #[arg(long)]
    dtype: Option<DType>,
    /// Elements per segment.
    #[arg(long)]
    segment: Option<u16>,
    /// Slots (segments in flight per member).
    #[arg(long)]
    slots: Option<u32>,
    /// A member, in member-index order: PORT,MAC,IP:UDPPORT (repeat the flag).
    #[arg(long = "member", value_name = "PORT,MAC,IP:UDPPORT")]
    members: Vec<String>,
}

pub fn run(socket: &Path, cmd: JobCmd) -> Result<()> {
    match cmd {
        JobCmd::Add(a) => add(socket, a),
        JobCmd::Remove { id } => {
            answer(call(socket, &Request::RemoveJob { id })?)?;
            println!("job {id} removed: its slots are cleared and free");
            Ok(())
        }
        JobCmd::List { json } => list(socket, json),
        JobCmd::Status { id: None, json } => joins(socket, json),
        JobCmd::Status { id: Some(id), json } => slots(socket, id, json),
        JobCmd::Tree { id } => tree(socket, id),
    }
}

/// `xagg job add`: the job from its flags and file, added.
fn add(socket: &Path, a: JobAddArgs) -> Result<()> {
    let spec = job_spec(a)?;
    match call(socket, &Request::AddJob { job: spec })? {
        Response::Job { job } => {
            println!("{}", job.added());
            Ok(())
        }
        r => answer(r),
    }
}

/// `xagg job list`: a line per job.
fn list(socket: &Path, json: bool) -> Result<()> {
    match call(socket, &Request::ListJobs)? {
        Response::Jobs { jobs } if json => {
            println!("{}", serde_json::to_string_pretty(&jobs)?);
            Ok(())
        }
        Response::Jobs { jobs } => {
            println!(
                "{:>6} {:>4} {:>5} {:>8} {:>11} {:>7}  level",
                "job", "op", "dtype", "segment", "slots", "members"
            );
            for j in jobs {
                let base = j.slot_base.unwrap_or(0);
                println!(
                    "{:>6} {:>4} {:>5} {:>8} {:>11} {:>7}  {}",
                    j.id,
                    j.op,
                    j.dtype,
                    j.segment,
                    format!("{}..{}", base, base + j.slots),
                    j.members.len(),
                    level(&j)
                );
            }
            Ok(())
        }
        r => answer(r),
    }
}

/// `xagg job status` without an id: the jobs workers joined over the network.
fn joins(socket: &Path, json: bool) -> Result<()> {
    match call(socket, &Request::Joins)? {
        Response::Joins { joins } if json => {
            println!("{}", serde_json::to_string_pretty(&joins)?);
            Ok(())
        }
        Response::Joins { joins } => {
            if joins.is_empty() {
                println!("no jobs joined over the network (jobs added by hand: `xagg job list`)");
            }
            for j in joins {
                println!(
                    "job {} ({:#x}) key {}: {} members, {} slots, {}-byte segments, credential {}: {}",
                    j.id, j.id, j.key, j.members, j.slots, j.segment_bytes, j.credential,
                    join_state(&j)
                );
            }
            Ok(())
        }
        r => answer(r),
    }
}

/// What a joined job is doing, as `xagg job status` says it.
fn join_state(j: &xagg_api::JoinListing) -> String {
    if !j.ready {
        return if j.route.is_empty() {
            format!(
                "pending for {:.0} s, ranks in {:?}, waiting for {:?}",
                j.waited_s, j.present, j.missing
            )
        } else {
            format!("{} for {:.0} s (every rank in)", j.route, j.waited_s)
        };
    }
    let running = match (j.route.as_str(), j.parent_member, &j.why) {
        ("parent", Some(m), _) => {
            format!("running, partials to its parent's job as member {m} (a tree)")
        }
        ("ring", _, Some(why)) => format!("running round a ring of hosts ({why})"),
        _ => "running, results to its members".to_string(),
    };
    // A job some ranks left waits for the others to leave, or for a lease to run out
    // (a rank killed leaves nothing): said, so its slots held meanwhile are explained.
    match (&j.left[..], j.lease_ends_s) {
        ([], Some(s)) => format!(
            "{running}; the first lease runs out in {s} s unless renewed (live ranks renew theirs; a rank whose process is gone renews nothing, and the job goes then)"
        ),
        ([], None) => running,
        (left, Some(s)) => format!(
            "{running}; ranks {left:?} left: it goes when the others leave, or in {s} s unless their leases are renewed (a rank whose process is gone renews nothing)"
        ),
        (left, None) => format!("{running}; ranks {left:?} left"),
    }
}

/// `xagg job status ID`: every slot copy of the job (its round and state) and the members
/// a filling round still waits for.
fn slots(socket: &Path, id: u32, json: bool) -> Result<()> {
    match call(socket, &Request::JobStatus { id })? {
        r @ Response::JobStatus { .. } if json => {
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
        Response::JobStatus { slots } if slots.is_empty() => {
            println!("job {id}: no slot holds a round: nothing in flight, nothing waited for");
            Ok(())
        }
        Response::JobStatus { slots } => {
            println!(
                "{:>5} {:>6} {:>8} {:>8} {:>8} {:>6}  missing members",
                "slot", "shadow", "state", "message", "segment", "count"
            );
            for s in slots {
                println!(
                    "{:>5} {:>6} {:>8} {:>8} {:>8} {:>6}  {:?}",
                    s.slot, s.shadow, s.state, s.message, s.segment, s.count, s.missing
                );
            }
            Ok(())
        }
        r => answer(r),
    }
}

/// The job to add: its file's fields, overridden by the flags given. Every flag missing
/// or malformed is said at once, not one per try.
fn job_spec(a: JobAddArgs) -> Result<JobSpec> {
    let mut wrong: Vec<String> = Vec::new();
    let members: Vec<MemberSpec> = a
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            parse_member(m)
                .map_err(|e| wrong.push(format!("--member #{i}: {e}")))
                .ok()
        })
        .collect();
    let mut spec: JobSpec = match &a.file {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("job file {}", p.display()))?
        }
        None => {
            let missing: Vec<&str> = [
                ("--id", a.id.is_none()),
                ("--segment", a.segment.is_none()),
                ("--slots", a.slots.is_none()),
            ]
            .into_iter()
            .filter_map(|(flag, absent)| absent.then_some(flag))
            .collect();
            if !missing.is_empty() {
                let are = if missing.len() == 1 { "is" } else { "are" };
                wrong.insert(
                    0,
                    format!("{} {are} required (or --file)", missing.join(", ")),
                );
            }
            // Said below, with the members' mistakes, when any flag is missing.
            JobSpec {
                id: a.id.unwrap_or_default(),
                op: Op::Sum,
                dtype: DType::I32,
                segment: a.segment.unwrap_or_default(),
                slots: a.slots.unwrap_or_default(),
                members: Vec::new(),
                slot_base: None,
                parent: None,
                ring: None,
            }
        }
    };
    if !wrong.is_empty() {
        bail!("{}", wrong.join("; "));
    }
    if let Some(v) = a.id {
        spec.id = v;
    }
    if let Some(v) = a.op {
        spec.op = v;
    }
    if let Some(v) = a.dtype {
        spec.dtype = v;
    }
    if let Some(v) = a.segment {
        spec.segment = v;
    }
    if let Some(v) = a.slots {
        spec.slots = v;
    }
    if !members.is_empty() {
        spec.members = members;
    }
    Ok(spec)
}

/// One `--member`: PORT,MAC,IP:UDPPORT.
fn parse_member(s: &str) -> Result<MemberSpec> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != 3 {
        bail!("`{s}`: write PORT,MAC,IP:UDPPORT, e.g. swp0,02:00:00:00:00:01,10.0.0.11:47801");
    }
    let addr = parts[2]
        .parse()
        .map_err(|_| anyhow::anyhow!("`{}` is not IP:UDPPORT", parts[2]))?;
    Ok(MemberSpec {
        interface: parts[0].into(),
        mac: parts[1].into(),
        addr,
    })
}

/// A job's level in a few words: root, an inner level and its parent, or a ring host.
fn level(j: &JobSpec) -> String {
    match (&j.parent, &j.ring) {
        (Some(p), _) => format!("inner: member {} of job {} at {}", p.member, p.job, p.addr),
        (None, Some(r)) => format!("ring: place {} of {}", r.position, r.size),
        (None, None) => "root".into(),
    }
}

/// `xagg job tree ID`: the job's place in its tree or ring, from this daemon.
fn tree(socket: &Path, id: u32) -> Result<()> {
    let Response::Jobs { jobs } = call(socket, &Request::ListJobs)? else {
        bail!("the daemon did not list its jobs");
    };
    let Some(j) = jobs.into_iter().find(|j| j.id == id) else {
        bail!("no job {id} on this daemon: `xagg job list` shows its jobs");
    };
    let here = match call(socket, &Request::Status)? {
        Response::Status {
            address, udp_port, ..
        } => format!("{address}:{udp_port}"),
        _ => "this switch".into(),
    };
    println!(
        "job {id}, answered by the daemon at {} (aggregation point {here})",
        socket.display()
    );
    println!("  level: {}", level(&j));
    for (i, m) in j.members.iter().enumerate() {
        println!(
            "  member {i}: {} on port {} ({})",
            m.addr, m.interface, m.mac
        );
    }
    match (&j.parent, &j.ring) {
        (Some(p), _) => println!(
            "  partials go up through port {} to {} ({}), as member {} of its job {}; its daemon shows that level (`xagg job tree {}` there)",
            p.interface, p.addr, p.mac, p.member, p.job, p.job
        ),
        (None, Some(r)) => println!(
            "  ring of {} hosts through port {}: predecessor {} ({}), successor {} ({}, where this host is member {}); each segment's chain starts at host segment mod {}",
            r.size, r.interface, r.predecessor.addr, r.predecessor.mac, r.successor.addr,
            r.successor.mac, r.successor.member, r.size
        ),
        (None, None) => println!("  the root: results go to the members"),
    }
    if let Response::JobCounters { job } = call(socket, &Request::JobCounters { id })? {
        let c: Vec<String> = job
            .counters
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        if c.is_empty() {
            println!("  this level's counters: none yet (no packet of this job has come in)");
        } else {
            println!("  this level's counters: {}", c.join(", "));
        }
    }
    Ok(())
}
