//! `xagg top`: a live view of the switch's jobs, refreshed in place — per job, segments
//! completed and contributions per second, retransmissions the switch saw, drops by
//! reason, and the slots waiting for members.

use std::{
    collections::BTreeMap,
    io::Write,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use xagg_api::{call, JobCounters, Request, Response};

/// One look at a job.
struct Seen {
    at: Instant,
    counters: JobCounters,
}

fn fetch(socket: &Path, req: Request) -> Result<Response> {
    match call(socket, &req)? {
        Response::Error { message } => bail!("{message}"),
        r => Ok(r),
    }
}

/// The screen once: a line per job, then its waiting slots.
fn screen(socket: &Path, last: &mut BTreeMap<u32, Seen>) -> Result<String> {
    let Response::Jobs { jobs } = fetch(socket, Request::ListJobs)? else {
        bail!("unexpected answer to the job list");
    };
    let Response::Counters { counters } = fetch(socket, Request::Counters)? else {
        bail!("unexpected answer to the counters");
    };
    let mut out = String::new();
    let drops: u64 = counters
        .iter()
        .filter(|(k, _)| k.starts_with("drop_"))
        .map(|(_, v)| v)
        .sum();
    let injected: u64 = counters
        .iter()
        .filter(|(k, _)| k.starts_with("inject_drop_"))
        .map(|(_, v)| v)
        .sum();
    out += &format!(
        "xagg top — {} jobs; switch: {} contributions, {} complete, {} dropped (all reasons){}\n\n",
        jobs.len(),
        counters.get("contribution").copied().unwrap_or(0)
            + counters.get("complete").copied().unwrap_or(0),
        counters.get("complete").copied().unwrap_or(0),
        drops,
        if injected > 0 {
            format!(", {injected} by fault injection (`xagg status`)")
        } else {
            String::new()
        }
    );
    out += &format!(
        "{:>10} {:>7} {:>12} {:>14} {:>12} {:>8}  drops by reason\n",
        "job", "members", "segments/s", "contrib/s", "retrans/s", "waiting"
    );
    let now = Instant::now();
    let mut keep = BTreeMap::new();
    for spec in &jobs {
        let Response::JobCounters { job } = fetch(socket, Request::JobCounters { id: spec.id })?
        else {
            bail!("unexpected answer to the job counters");
        };
        let Response::JobStatus { slots } = fetch(socket, Request::JobStatus { id: spec.id })?
        else {
            bail!("unexpected answer to the job status");
        };
        let get = |c: &JobCounters, k: &str| c.counters.get(k).copied().unwrap_or(0);
        let again = |c: &JobCounters| c.members.iter().map(|m| m.retransmissions).sum::<u64>();
        let new = |c: &JobCounters| c.members.iter().map(|m| m.contributions).sum::<u64>();
        let (seg, contrib, retx) = match last.get(&spec.id) {
            Some(prev) => {
                let dt = now.duration_since(prev.at).as_secs_f64().max(1e-3);
                let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
                (
                    rate(get(&job, "complete"), get(&prev.counters, "complete")),
                    rate(new(&job), new(&prev.counters)),
                    rate(again(&job), again(&prev.counters)),
                )
            }
            None => (0.0, 0.0, 0.0),
        };
        let waiting: Vec<_> = slots
            .iter()
            .filter(|s| s.state == "filling" && !s.missing.is_empty())
            .collect();
        let drops: Vec<String> = job
            .counters
            .iter()
            .filter(|(k, _)| k.starts_with("drop_"))
            .map(|(k, v)| format!("{}={v}", &k[5..]))
            .collect();
        out += &format!(
            "{:>10} {:>7} {:>12.0} {:>14.0} {:>12.0} {:>8}  {}\n",
            spec.id,
            spec.members.len(),
            seg,
            contrib,
            retx,
            waiting.len(),
            if drops.is_empty() {
                "-".to_string()
            } else {
                drops.join(" ")
            }
        );
        for s in waiting.iter().take(3) {
            out += &format!(
                "{:>10}   slot {} (message {}, segment {}) waits for members {:?}\n",
                "", s.slot, s.message, s.segment, s.missing
            );
        }
        keep.insert(
            spec.id,
            Seen {
                at: now,
                counters: job,
            },
        );
    }
    *last = keep;
    Ok(out)
}

/// Refreshes the view every `interval` until interrupted (or `count` times).
pub fn run(socket: &Path, interval: Duration, count: Option<u64>) -> Result<()> {
    use crossterm::{
        cursor::MoveTo,
        execute,
        terminal::{Clear, ClearType},
    };
    let mut last = BTreeMap::new();
    let mut out = std::io::stdout();
    let tty = std::io::IsTerminal::is_terminal(&out);
    let mut n = 0;
    loop {
        let text = screen(socket, &mut last)?;
        if tty {
            execute!(out, MoveTo(0, 0), Clear(ClearType::All))?;
            // Raw line ends: the terminal may not translate \n while it draws.
            write!(out, "{}", text.replace('\n', "\r\n"))?;
        } else {
            // A pipe or a log: one view after another, no terminal codes.
            writeln!(out, "{text}")?;
        }
        out.flush()?;
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}
