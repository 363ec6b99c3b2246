//! The run's check against every member's inputs, and its report.

use anyhow::Result;
use xagg_worker::{report::RunReport, Collective};

use super::{timed::Runs, AllreduceArgs, Member};

/// The first result checked against every member's inputs, with `--verify`.
pub(super) struct Check {
    pub(super) verified: bool,
    pub(super) worst_float_error: f64,
}

pub(super) fn verify(a: &AllreduceArgs, me: &Member, n: usize, first: &[u8]) -> Check {
    let mut check = Check {
        verified: true,
        worst_float_error: 0.0,
    };
    if a.verify {
        let inputs: Vec<Vec<u8>> = (0..me.members as u32)
            .map(|k| xagg_worker::data::generate(me.dtype, a.seed, k, n))
            .collect();
        let block = inputs[0].len() / me.members;
        let own = me.index as usize * block..(me.index as usize + 1) * block;
        let reduced = |range: std::ops::Range<usize>| {
            let parts: Vec<Vec<u8>> = inputs.iter().map(|i| i[range.clone()].to_vec()).collect();
            xagg_worker::data::check(me.op, me.dtype, me.segment, &parts, first)
                .map_err(|e| e.to_string())
        };
        // Each collective's result against what it must be.
        let moved = |expected: &[u8]| {
            if first == expected {
                Ok(0.0)
            } else {
                let at = first.iter().zip(expected).position(|(x, y)| x != y);
                Err(format!("differs from the expected bytes at byte {at:?}"))
            }
        };
        let r = match a.collective {
            Collective::Allreduce => reduced(0..inputs[0].len()),
            Collective::ReduceScatter => reduced(own),
            Collective::Reduce if a.root == me.index as usize => reduced(0..inputs[0].len()),
            // Left as it was: the member's own data.
            Collective::Reduce => moved(&inputs[me.index as usize]),
            Collective::AllGather => {
                let all: Vec<u8> = (0..me.members)
                    .flat_map(|k| inputs[k][k * block..(k + 1) * block].to_vec())
                    .collect();
                moved(&all)
            }
            Collective::Broadcast => moved(&inputs[a.root]),
        };
        match r {
            Ok(e) => check.worst_float_error = e,
            Err(e) => {
                eprintln!("member {}: result wrong: {e}", me.index);
                check.verified = false;
            }
        }
    }
    check
}

/// The run's report: one JSON object with `--json`, else a line.
pub(super) fn print(a: &AllreduceArgs, me: &Member, runs: Runs, check: &Check) -> Result<()> {
    let reports = &runs.reports;
    let secs: f64 = reports.iter().map(|r| r.seconds).sum();
    let retx: u64 = reports.iter().map(|r| r.retransmissions).sum();
    let last = reports.last().cloned().unwrap_or_default();
    if a.json {
        let out = RunReport {
            member: me.index,
            bytes: a.size,
            repeat: a.repeat,
            seconds: last.seconds,
            seconds_all: reports.iter().map(|r| r.seconds).collect(),
            goodput_gbps: last.goodput_gbps,
            retransmissions: retx,
            reordered: reports.iter().map(|r| r.reordered).sum(),
            refused: reports.iter().map(|r| r.refused).sum(),
            lost_sends: reports.iter().map(|r| r.lost_sends).sum(),
            round_trips: reports.iter().fold(Default::default(), |mut all, r| {
                all.merge(&r.round_trips);
                all
            }),
            verified: a.verify && check.verified,
            op: me.op.to_string(),
            dtype: me.dtype.to_string(),
            float_error_of_bound: check.worst_float_error,
            cpu_windows: runs.windows,
            tx_bytes: runs.tx_bytes,
            rx_bytes: runs.rx_bytes,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "member {}: {} x {} bytes in {:.3} s, last {:.3} s = {:.2} Gbit/s, {retx} retransmissions{}",
            me.index, a.repeat, a.size, secs, last.seconds, last.goodput_gbps,
            if a.verify { if check.verified { ", result verified" } else { ", RESULT WRONG" } } else { "" }
        );
    }
    Ok(())
}
