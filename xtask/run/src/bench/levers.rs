//! The levers of the switch's end-to-end speed, each measured off and on.

use anyhow::Result;
use serde::Serialize;
use xagg_lab::lab::Lab;

use super::{
    end_to_end::{add_job, iterations, switch_point, switch_run},
    report::median,
    run_point::RunPoint,
    SEGMENT, SLOTS,
};

/// (lever, setting, segment, slots, AF_XDP receive, extra worker flags)
type Lever = (
    &'static str,
    &'static str,
    usize,
    u32,
    bool,
    &'static [&'static str],
);

#[derive(Serialize, Clone, Debug)]
pub struct LeverPoint {
    pub lever: &'static str,
    pub setting: String,
    pub goodput_gbps: f64,
    pub cpu_s_per_gib: f64,
}

/// Each lever off and on, the others at their defaults.
pub fn levers(quick: bool) -> Result<Vec<LeverPoint>> {
    let n = 4;
    let bytes = if quick { 1 << 20 } else { 64 << 20 };
    let it = iterations(bytes, quick);
    let mut sw = crate::demo::start_switch(Lab::create(crate::demo::PREFIX, n)?, &[])?;
    // Receiving with the UDP socket needs the lab's host programs; with AF_XDP each worker
    // attaches its own, so in each round the socket settings run first.
    let settings: [Lever; 11] = [
        ("gro", "off", SEGMENT, SLOTS, false, &["--no-gro"]),
        ("gro", "on", SEGMENT, SLOTS, false, &[]),
        ("afxdp", "off (socket)", SEGMENT, SLOTS, false, &[]),
        ("afxdp", "on", SEGMENT, SLOTS, true, &[]),
        ("segment", "256 elements", 256, SLOTS, true, &[]),
        ("segment", "860 elements", 860, SLOTS, true, &[]),
        ("segment", "2232 elements", 2232, SLOTS, true, &[]),
        ("slots", "16", SEGMENT, 16, true, &[]),
        ("slots", "128", SEGMENT, 128, true, &[]),
        ("gso", "off", SEGMENT, SLOTS, true, &["--no-gso"]),
        ("gso", "on", SEGMENT, SLOTS, true, &[]),
    ];
    for (k, &(_, _, segment, slots, _, _)) in settings.iter().enumerate() {
        add_job(&sw, 100 + k as u32, segment, slots)?;
    }
    // Runs on this VM vary by a fifth from one to the next: every setting runs in each of
    // `rounds` rounds, and its median counts.
    let rounds = if quick { 1 } else { 3 };
    let mut samples: Vec<Vec<RunPoint>> = vec![Vec::new(); settings.len()];
    for round in 0..rounds {
        sw.lab.attach_hosts()?;
        let mut hosts = true;
        for (k, &(lever, setting, segment, slots, afxdp, extra)) in settings.iter().enumerate() {
            if afxdp && hosts {
                sw.lab.detach_hosts();
                hosts = false;
            }
            let id = 100 + k as u32;
            let mut run = switch_run(n, id, bytes, segment, slots)?;
            run.repeat = it as u32;
            run.first_message = (round * it) as u32;
            run.afxdp = afxdp;
            run.flags = extra.iter().map(|f| f.to_string()).collect();
            run.flags.push("--cpu-windows".into());
            let r = switch_point(&sw.lab, &run)?;
            anyhow::ensure!(r.verified, "lever {lever} {setting}: result wrong");
            eprintln!(
                "round {round} lever {lever:>8} {setting:>13}: {:.2} Gbit/s, {:.2} CPU s/GiB",
                r.goodput_gbps,
                r.cpu_total()
            );
            samples[k].push(r);
        }
        sw.lab.detach_hosts();
    }
    let mut out = Vec::new();
    for (&(lever, setting, ..), runs) in settings.iter().zip(samples) {
        let p = LeverPoint {
            lever,
            setting: setting.into(),
            goodput_gbps: median(runs.iter().map(|r| r.goodput_gbps).collect()),
            cpu_s_per_gib: median(runs.iter().map(RunPoint::cpu_total).collect()),
        };
        println!(
            "lever {lever:>8} {setting:>13}: {:.2} Gbit/s, {:.2} CPU s/GiB (median of {rounds})",
            p.goodput_gbps, p.cpu_s_per_gib
        );
        out.push(p);
    }
    Ok(out)
}
