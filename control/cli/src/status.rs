//! `xagg status`: the switch's address, ports and the XDP mode each is in, pinning, its parent, jobs and slots in use.

use std::path::Path;

use anyhow::Result;
use xagg_api::{call, Request, Response};

use crate::daemon::answer;

pub fn run(socket: &Path, json: bool) -> Result<()> {
    match call(socket, &Request::Status)? {
        r @ Response::Status { .. } if json => {
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
        Response::Status {
            ports,
            pinned,
            adopted,
            jobs,
            slots_total,
            slots_used,
            address,
            udp_port,
            mac,
            xdp_mode,
            xdp_in_use,
            pin_path,
            steer_cpus,
            parent,
            faults,
            listen,
            metrics,
        } => {
            println!("switch: {address}:{udp_port}, MAC {mac}, XDP mode {xdp_mode} (configured)");
            // An older daemon does not say the mode in use.
            let ports: Vec<String> = ports
                .iter()
                .enumerate()
                .map(|(i, p)| match xdp_in_use.get(i) {
                    Some(m) => format!("{p} (XDP {m})"),
                    None => p.clone(),
                })
                .collect();
            println!("ports: {}", ports.join(", "));
            if steer_cpus.is_empty() {
                println!("folding: on the CPU each contribution comes in on");
            } else {
                let cpus: Vec<String> = steer_cpus.iter().map(usize::to_string).collect();
                println!(
                    "folding: steered to CPUs {}, each slot on one",
                    cpus.join(",")
                );
            }
            if let Some(p) = pin_path {
                println!("pinned at: {}", p.display());
            }
            println!(
                "dataplane: {}{}",
                if pinned {
                    "pinned (outlives the daemon)"
                } else {
                    "detached when the daemon exits"
                },
                if adopted {
                    ", adopted from an earlier daemon"
                } else {
                    ""
                }
            );
            if let Some(p) = parent {
                match (p.daemon, p.credential) {
                    (Some(d), c) => println!(
                        "parent: the daemon at {d}, behind {}{}; jobs with ranks beyond this point join it",
                        p.interface,
                        c.map(|c| format!(", credential {c}")).unwrap_or_default()
                    ),
                    (None, _) => println!(
                        "parent: none aggregating; jobs with ranks beyond this point go round a ring of hosts behind {}",
                        p.interface
                    ),
                }
            }
            println!("jobs: {jobs}, slots used: {slots_used} of {slots_total}");
            match listen {
                Some(a) => println!("network listener: {a} (joins, and the level below)"),
                None => println!("network listener: off (daemon.listen): jobs are added here only"),
            }
            if let Some(a) = metrics {
                println!("metrics: http://{a}/metrics");
            }
            if let Some(f) = faults {
                println!("{}", crate::inject::describe(&f));
            }
            Ok(())
        }
        r => answer(r),
    }
}
