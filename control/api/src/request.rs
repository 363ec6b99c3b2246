//! The API's requests and answers, and the listings and counters the answers carry. Their
//! JSON is the API's: a request's body is what [`Request::route`] gives, an answer's body
//! is a [`Response`] tagged by `result`.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{JobSpec, VERSION};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[expect(
    clippy::large_enum_variant,
    reason = "one request per API call, parsed once: its size costs nothing"
)]
pub enum Request {
    AddJob {
        job: JobSpec,
    },
    RemoveJob {
        id: u32,
    },
    ListJobs,
    Counters,
    Status,
    /// The state of a job's busy slot versions (which members are missing).
    JobStatus {
        id: u32,
    },
    /// Fault injection in the dataplane: probabilities 0..=1 (0 = off).
    Inject {
        drop_contribution: f64,
        drop_result: f64,
    },
    /// Detach the dataplane, remove its pins, and stop the daemon.
    Detach,
    /// The jobs workers joined over the network, pending or running.
    Joins,
    /// What the switch did with one job's packets, per member too.
    JobCounters {
        id: u32,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Ok,
    Job {
        job: JobSpec,
    },
    Jobs {
        jobs: Vec<JobSpec>,
    },
    Counters {
        counters: BTreeMap<String, u64>,
    },
    Status {
        ports: Vec<String>,
        pinned: bool,
        adopted: bool,
        jobs: usize,
        slots_total: u32,
        slots_used: u32,
        /// The switch's address, collective port and MAC, as the dataplane has them.
        #[serde(default)]
        address: String,
        #[serde(default)]
        udp_port: u16,
        #[serde(default)]
        mac: String,
        /// `native`, `generic` or `auto`, as configured.
        #[serde(default)]
        xdp_mode: String,
        /// The mode each port's program is attached in, as the kernel says
        /// (`native`, `generic`, ...; `none` where it is gone), in the order of `ports`.
        #[serde(default)]
        xdp_in_use: Vec<String>,
        /// Where the dataplane is pinned (none when it detaches on exit).
        #[serde(default)]
        pin_path: Option<PathBuf>,
        /// The CPUs contributions are folded on, each slot on one (`switch.steer_cpus`);
        /// empty: each on the CPU it came in on.
        #[serde(default)]
        steer_cpus: Vec<usize>,
        /// The aggregation point above this one (`[parent]`), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<ParentStatus>,
        /// Fault injection in force (`xagg inject`), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        faults: Option<Faults>,
        /// The network listener (`daemon.listen`: joins, the level below) and the
        /// Prometheus endpoint (`daemon.metrics`), where on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        listen: Option<std::net::SocketAddr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metrics: Option<std::net::SocketAddr>,
    },
    JobStatus {
        slots: Vec<SlotStatus>,
    },
    Joins {
        joins: Vec<JoinListing>,
    },
    JobCounters {
        job: JobCounters,
    },
    Error {
        message: String,
    },
}

/// The fault injection settings of [`Request::Inject`], as the route's body.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    pub drop_contribution: f64,
    pub drop_result: f64,
}

impl Request {
    /// The request's HTTP method, path and JSON body.
    pub fn route(&self) -> (&'static str, String, Option<serde_json::Value>) {
        let v = VERSION;
        match self {
            Request::AddJob { job } => (
                "POST",
                format!("{v}/jobs"),
                Some(serde_json::to_value(job).expect("a job serializes")),
            ),
            Request::RemoveJob { id } => ("DELETE", format!("{v}/jobs/{id}"), None),
            Request::ListJobs => ("GET", format!("{v}/jobs"), None),
            Request::JobStatus { id } => ("GET", format!("{v}/jobs/{id}/status"), None),
            Request::Counters => ("GET", format!("{v}/counters"), None),
            Request::Status => ("GET", format!("{v}/status"), None),
            Request::Inject {
                drop_contribution,
                drop_result,
            } => (
                "PUT",
                format!("{v}/faults"),
                Some(
                    serde_json::to_value(Faults {
                        drop_contribution: *drop_contribution,
                        drop_result: *drop_result,
                    })
                    .expect("faults serialize"),
                ),
            ),
            Request::Detach => ("POST", format!("{v}/detach"), None),
            Request::Joins => ("GET", format!("{v}/joins"), None),
            Request::JobCounters { id } => ("GET", format!("{v}/jobs/{id}/counters"), None),
        }
    }
}

/// A daemon's `[parent]`, as `status` reports it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ParentStatus {
    /// The uplink the parent (or a ring's other hosts) is behind.
    pub interface: String,
    /// The parent daemon's listener; none: jobs beyond this point go round a ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<std::net::SocketAddr>,
    /// The credential this daemon gives there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// A shadow copy of a job's slot, as `job_status` reports it. (The API's keys keep the
/// names they had before the protocol's coordinates were renamed.)
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SlotStatus {
    /// Slot index within the job.
    pub slot: u32,
    /// Which of the slot's two shadow copies.
    pub shadow: u8,
    /// "filling" or "done".
    pub state: String,
    pub message: u32,
    pub segment: u32,
    pub count: u32,
    /// Members whose contribution is not in.
    pub missing: Vec<u8>,
}

/// What the switch did with one job's packets.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobCounters {
    pub id: u32,
    /// By counter name (those not zero).
    pub counters: BTreeMap<String, u64>,
    pub members: Vec<MemberCounters>,
}

/// One member's contributions: new ones, and retransmissions the switch saw (duplicates
/// and ones answered with a stored result).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberCounters {
    pub member: u8,
    pub contributions: u64,
    pub retransmissions: u64,
}

/// A joined job as `xagg job status` and `GET /v1/joins` show it (no secret).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JoinListing {
    pub key: String,
    pub id: u32,
    pub credential: String,
    pub members: usize,
    pub slots: usize,
    pub segment_bytes: usize,
    pub ready: bool,
    /// Ranks in (joined and not left), and ranks the job waits for.
    pub present: Vec<u8>,
    pub missing: Vec<u8>,
    pub waited_s: f64,
    /// Where a running job's aggregates go: `members` (its results to its members),
    /// `parent` (partials up a tree, as member `parent_member` of the parent's job) or
    /// `ring` (round a ring of hosts, `why` the tree did not serve); `joining its parent`
    /// while it does; empty while pending.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub route: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_member: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Ranks of a running job that left it: a job goes once every rank has left, or when
    /// one of the others stops renewing its lease (its process gone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<u8>,
    /// Seconds until the first lease of a rank still in runs out unless renewed (a live
    /// rank renews every third of a lease); none for an open level, whose members hold
    /// no leases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ends_s: Option<u64>,
}

#[cfg(test)]
mod tests {
    use xagg_common::wire::{DType, Op};

    use super::*;
    use crate::MemberSpec;

    fn job(slot_base: Option<u32>) -> JobSpec {
        JobSpec {
            id: 7,
            op: Op::Sum,
            dtype: DType::I32,
            segment: 256,
            slots: 8,
            members: vec![MemberSpec {
                interface: "p0".into(),
                mac: "02:00:00:00:00:01".into(),
                addr: "10.0.0.1:47801".parse().unwrap(),
            }],
            slot_base,
            parent: None,
            ring: None,
        }
    }

    /// `r` as JSON is `json` exactly, and `json` reads back as `r`.
    fn same(r: &Response, json: &str) {
        assert_eq!(serde_json::to_string(r).unwrap(), json);
        let back: Response = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }

    #[test]
    fn routes_and_bodies() {
        // A job's body has its keys in order (as a `serde_json::Value` writes them) and no
        // slot base.
        let (method, path, body) = Request::AddJob { job: job(None) }.route();
        assert_eq!((method, path.as_str()), ("POST", "/v1/jobs"));
        let body = body.unwrap().to_string();
        assert_eq!(
            body,
            r#"{"dtype":"i32","id":7,"members":[{"addr":"10.0.0.1:47801","interface":"p0","mac":"02:00:00:00:00:01"}],"op":"sum","segment":256,"slots":8}"#
        );
        assert_eq!(serde_json::from_str::<JobSpec>(&body).unwrap(), job(None));
        assert_eq!(
            Request::ListJobs.route(),
            ("GET", "/v1/jobs".to_string(), None)
        );
        assert_eq!(
            Request::JobCounters { id: 65537 }.route(),
            ("GET", "/v1/jobs/65537/counters".to_string(), None)
        );
        assert_eq!(
            Request::Detach.route(),
            ("POST", "/v1/detach".to_string(), None)
        );
        let (method, path, body) = Request::Inject {
            drop_contribution: 0.05,
            drop_result: 0.0,
        }
        .route();
        assert_eq!(
            (method, path.as_str(), body.unwrap().to_string().as_str()),
            (
                "PUT",
                "/v1/faults",
                r#"{"drop_contribution":0.05,"drop_result":0.0}"#
            )
        );
    }

    /// The answers as `docs/daemon.md` shows them.
    #[test]
    fn answers_as_documented() {
        same(&Response::Ok, r#"{"result":"ok"}"#);
        same(
            &Response::Error {
                message: "no job 9".into(),
            },
            r#"{"result":"error","message":"no job 9"}"#,
        );
        same(
            &Response::Job { job: job(Some(0)) },
            r#"{"result":"job","job":{"id":7,"op":"sum","dtype":"i32","segment":256,"slots":8,"members":[{"interface":"p0","mac":"02:00:00:00:00:01","addr":"10.0.0.1:47801"}],"slot_base":0}}"#,
        );
        same(
            &Response::Jobs {
                jobs: vec![job(Some(128))],
            },
            r#"{"result":"jobs","jobs":[{"id":7,"op":"sum","dtype":"i32","segment":256,"slots":8,"members":[{"interface":"p0","mac":"02:00:00:00:00:01","addr":"10.0.0.1:47801"}],"slot_base":128}]}"#,
        );
        same(
            &Response::Status {
                ports: vec!["p0".into()],
                pinned: true,
                adopted: false,
                jobs: 1,
                slots_total: 2048,
                slots_used: 128,
                address: "10.77.0.1".into(),
                udp_port: 47800,
                mac: "02:00:00:00:00:0a".into(),
                xdp_mode: "auto".into(),
                xdp_in_use: vec!["native".into()],
                pin_path: Some("/sys/fs/bpf/xagg".into()),
                steer_cpus: vec![2, 3],
                parent: Some(ParentStatus {
                    interface: "up".into(),
                    daemon: Some("10.77.0.9:7800".parse().unwrap()),
                    credential: Some("lab".into()),
                }),
                faults: None,
                listen: None,
                metrics: None,
            },
            r#"{"result":"status","ports":["p0"],"pinned":true,"adopted":false,"jobs":1,"slots_total":2048,"slots_used":128,"address":"10.77.0.1","udp_port":47800,"mac":"02:00:00:00:00:0a","xdp_mode":"auto","xdp_in_use":["native"],"pin_path":"/sys/fs/bpf/xagg","steer_cpus":[2,3],"parent":{"interface":"up","daemon":"10.77.0.9:7800","credential":"lab"}}"#,
        );
        same(
            &Response::JobStatus {
                slots: vec![SlotStatus {
                    slot: 0,
                    shadow: 0,
                    state: "filling".into(),
                    message: 0,
                    segment: 0,
                    count: 256,
                    missing: vec![1, 2],
                }],
            },
            r#"{"result":"job_status","slots":[{"slot":0,"shadow":0,"state":"filling","message":0,"segment":0,"count":256,"missing":[1,2]}]}"#,
        );
        same(
            &Response::JobCounters {
                job: JobCounters {
                    id: 5,
                    counters: [("complete".to_string(), 100)].into(),
                    members: vec![MemberCounters {
                        member: 0,
                        contributions: 100,
                        retransmissions: 0,
                    }],
                },
            },
            r#"{"result":"job_counters","job":{"id":5,"counters":{"complete":100},"members":[{"member":0,"contributions":100,"retransmissions":0}]}}"#,
        );
        same(
            &Response::Joins {
                joins: vec![JoinListing {
                    key: "0101".into(),
                    id: 65537,
                    credential: "lab".into(),
                    members: 3,
                    slots: 32,
                    segment_bytes: 3440,
                    ready: false,
                    present: vec![0],
                    missing: vec![1, 2],
                    waited_s: 0.7,
                    route: "parent".into(),
                    parent_member: Some(1),
                    why: None,
                    left: Vec::new(),
                    lease_ends_s: None,
                }],
            },
            r#"{"result":"joins","joins":[{"key":"0101","id":65537,"credential":"lab","members":3,"slots":32,"segment_bytes":3440,"ready":false,"present":[0],"missing":[1,2],"waited_s":0.7,"route":"parent","parent_member":1}]}"#,
        );
        // An older daemon's status (before the switch's address was in it) still reads.
        let old: Response = serde_json::from_str(
            r#"{"result":"status","ports":[],"pinned":false,"adopted":false,"jobs":0,"slots_total":2048,"slots_used":0}"#,
        )
        .unwrap();
        assert!(matches!(old, Response::Status { pin_path: None, .. }));
    }
}
