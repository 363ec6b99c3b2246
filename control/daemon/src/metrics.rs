//! The daemon's Prometheus endpoint (opt-in, `daemon.metrics`): the switch-wide counters,
//! each job's counters and its members' contributions and retransmissions, jobs and slots
//! in use. Labels name jobs and members, never slots; secrets are never in them.

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{dataplane::Dataplane, Error};

/// What the switch did with a packet (`complete`, `drop_not_member`, ...: `xagg counters`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobOutcome {
    job: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberKind {
    job: String,
    member: String,
    kind: String,
}

/// What [`render`] writes: OpenMetrics text (`_total` samples, `# EOF`), which a
/// Prometheus server parses with the types kept only when told so.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics now, in the OpenMetrics text format ([`CONTENT_TYPE`]).
pub fn render(dp: &Dataplane) -> Result<String, Error> {
    let mut reg = Registry::with_prefix("xagg");
    let switch = Family::<Outcome, Counter>::default();
    reg.register(
        "switch_packets",
        "Packets the switch program handled, by what it did (all jobs, and packets of no job)",
        switch.clone(),
    );
    for (name, v) in dp.counters()? {
        switch.get_or_create(&Outcome { outcome: name }).inc_by(v);
    }
    let job = Family::<JobOutcome, Counter>::default();
    reg.register(
        "job_packets",
        "Packets of each job, by what the switch did with them",
        job.clone(),
    );
    let member = Family::<MemberKind, Counter>::default();
    reg.register(
        "member_contributions",
        "Contributions of each member: new ones, and retransmissions the switch saw (kind=again)",
        member.clone(),
    );
    let jobs = dp.jobs()?;
    for (id, _) in &jobs {
        let c = dp.job_counters(*id)?;
        for (name, v) in c.counters {
            job.get_or_create(&JobOutcome {
                job: id.to_string(),
                outcome: name,
            })
            .inc_by(v);
        }
        for m in c.members {
            for (kind, v) in [("new", m.contributions), ("again", m.retransmissions)] {
                member
                    .get_or_create(&MemberKind {
                        job: id.to_string(),
                        member: m.member.to_string(),
                        kind: kind.into(),
                    })
                    .inc_by(v);
            }
        }
    }
    let njobs = Gauge::<i64>::default();
    njobs.set(jobs.len() as i64);
    reg.register("jobs", "Jobs on the switch", njobs);
    let slots = Gauge::<i64>::default();
    slots.set(jobs.iter().map(|(_, j)| i64::from(j.slot_count)).sum());
    reg.register("slots_used", "Slots the jobs hold", slots);
    let mut out = String::new();
    encode(&mut out, &reg).map_err(Error::Metrics)?;
    Ok(out)
}
