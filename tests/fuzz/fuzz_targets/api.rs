//! Coverage-guided fuzzing of the daemon's API: decoding, validation and handling of
//! requests through the real routers (local socket and network listener) and the real join
//! registry, against a dataplane stand-in. An input is a short sequence of requests: raw
//! bodies and paths, and joins, leaves and status requests built from the input with real
//! proofs, so the fuzzer reaches the checks behind the proofs too.
//!
//! What must hold after every request: no panic, no 5xx, a JSON body with a `result`;
//! an answer that refuses or errs changed nothing; no credential holds more slots than its
//! quota and the jobs never hold more slots than the switch has.
#![no_main]

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, OnceLock},
};

use axum::{body::Body, http};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use xagg_api::{JobSpec, Request, Response};
use xagg_common::{job::MemberAddr, JobShape};
use xagg_daemon::{
    api::{self, Handler},
    config::Config,
    join::{JobTable, Joins},
    Error,
};
use xagg_join::{
    CredentialKey, JobKey, JoinReply, JoinRequest, Levels, MemberReply, MemberRequest, Nonce,
    NonceReply, RingReply, RingRequest, Secret,
};

const SLOTS: u32 = 2048;
const QUOTA: usize = 300;
const CRED: CredentialKey = CredentialKey([0x42; 32]);
const PORTS: [(u32, &str); 3] = [(11, "p0"), (12, "p1"), (13, "p2")];

/// The dataplane stand-in: ports, hellos, and jobs with their slots.
#[derive(Default, Clone, PartialEq, Debug)]
struct Table {
    hellos: HashMap<u64, (u32, [u8; 4], [u8; 6], [u8; 2])>,
    jobs: BTreeMap<u32, (u32, u32)>,
}

impl JobTable for Table {
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        self.hellos
            .remove(&token)
            .map(|(ifindex, ip, mac, port)| MemberAddr {
                ifindex,
                ip,
                mac,
                port,
            })
    }
    fn port_named(&self, ifindex: u32) -> Option<String> {
        PORTS
            .iter()
            .find(|p| p.0 == ifindex)
            .map(|p| p.1.to_string())
    }
    fn free_slots(&self) -> Result<u32, Error> {
        Ok(SLOTS - self.jobs.values().map(|j| j.1).sum::<u32>())
    }
    fn jobs(&self) -> Result<Vec<(u32, u32)>, Error> {
        Ok(self.jobs.iter().map(|(id, j)| (*id, j.0)).collect())
    }
    fn add_job(&mut self, spec: &JobSpec) -> Result<(), Error> {
        spec.shape()?;
        if self.jobs.contains_key(&spec.id) {
            return Err(Error::JobExists(spec.id));
        }
        let free = self.free_slots()?;
        if spec.slots > free {
            return Err(Error::NoSlots {
                id: spec.id,
                want: spec.slots,
                free,
                total: SLOTS,
            });
        }
        let base = SLOTS - free;
        self.jobs.insert(spec.id, (base, spec.slots));
        Ok(())
    }
    fn update_member(&mut self, id: u32, _: usize, _: MemberAddr) -> Result<(), Error> {
        self.jobs
            .contains_key(&id)
            .then_some(())
            .ok_or(Error::NoJob(id))
    }
    fn remove_job(&mut self, id: u32) -> Result<(), Error> {
        self.jobs.remove(&id).map(drop).ok_or(Error::NoJob(id))
    }
    fn waiting(&self, _: u32) -> Vec<(u32, u32, u32, Vec<u8>)> {
        Vec::new()
    }
    fn activity(&self, id: u32) -> Result<u64, Error> {
        Ok(u64::from(id))
    }
}

struct State {
    table: Table,
    joins: Joins,
}

#[derive(Clone)]
struct StandIn(Arc<Mutex<State>>);

impl Handler for StandIn {
    fn admin(&self, req: Request) -> Response {
        let st = &mut *self.0.lock().unwrap();
        let err = |e: Error| Response::Error {
            message: e.to_string(),
        };
        match req {
            Request::AddJob { job } => match st.table.add_job(&job) {
                Ok(()) => Response::Job { job },
                Err(e) => err(e),
            },
            Request::RemoveJob { id } => match st.table.remove_job(id) {
                Ok(()) => Response::Ok,
                Err(e) => err(e),
            },
            Request::ListJobs => Response::Jobs { jobs: Vec::new() },
            Request::Joins => Response::Joins {
                joins: st.joins.listing(),
            },
            Request::Inject {
                drop_contribution,
                drop_result,
            } if !(0.0..=1.0).contains(&drop_contribution)
                || !(0.0..=1.0).contains(&drop_result) =>
            {
                Response::Error {
                    message: "a probability is between 0 and 1".into(),
                }
            }
            _ => Response::Ok,
        }
    }
    fn nonce(&self) -> NonceReply {
        self.0.lock().unwrap().joins.nonce(None)
    }
    fn join(&self, req: JoinRequest) -> JoinReply {
        let st = &mut *self.0.lock().unwrap();
        st.joins.join(&mut st.table, &req)
    }
    fn member(&self, action: &'static str, req: MemberRequest) -> MemberReply {
        let st = &mut *self.0.lock().unwrap();
        st.joins.member(&mut st.table, action, &req)
    }
    fn ring(&self, req: RingRequest) -> RingReply {
        self.0.lock().unwrap().joins.ring(&req)
    }
}

fn config() -> Config {
    static KEY: OnceLock<()> = OnceLock::new();
    let dir = std::env::temp_dir().join(format!("xagg-fuzz-api-{}", std::process::id()));
    KEY.get_or_init(|| {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cred.key"), "42".repeat(32)).unwrap();
    });
    let shm = std::path::Path::new("/dev/shm");
    let state = if shm.is_dir() { shm } else { dir.as_path() }
        .join(format!("xagg-fuzz-api-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    Config::parse(&format!(
        "[switch]\nports = [\"p0\", \"p1\", \"p2\"]\naddress = \"10.0.0.1\"\n[daemon]\nstate_dir = \"{}\"\n[[credential]]\nname = \"fuzz\"\nkey_file = \"{}\"\nslot_quota = {QUOTA}\n",
        state.display(),
        dir.join("cred.key").display()
    ))
    .unwrap()
}

/// Reads the input a byte (or a few) at a time; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn bytes(&mut self) -> &[u8] {
        let n = usize::from(self.byte()).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, _| v << 8 | u64::from(self.byte()))
    }
}

/// Sends one request through `app`; returns its status and body.
async fn send(
    app: &axum::Router,
    method: http::Method,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body));
    let Ok(req) = req else {
        return (400, b"{\"result\":\"error\"}".to_vec());
    };
    let answer = app
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = answer.status().as_u16();
    let body = answer
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body)
}

/// What a refused request must leave unchanged: the jobs and the joined jobs (hellos are
/// records of the wire, which the fuzz input itself adds to).
fn snapshot(h: &StandIn) -> (BTreeMap<u32, (u32, u32)>, String) {
    let st = h.0.lock().unwrap();
    let joined: Vec<_> = st
        .joins
        .listing()
        .into_iter()
        .map(|j| (j.key, j.id, j.ready, j.present, j.missing, j.slots))
        .collect();
    (st.table.jobs.clone(), format!("{joined:?}"))
}

fuzz_target!(|data: &[u8]| {
    let handler = StandIn(Arc::new(Mutex::new({
        let cfg = config();
        let table = Table::default();
        let joins = Joins::new(&cfg, "10.0.0.1:47800".parse().unwrap(), &table).unwrap();
        State { table, joins }
    })));
    let local = api::router(handler.clone());
    let network = api::network_router(handler.clone());
    let keys = [JobKey([1; 16]), JobKey([2; 16]), JobKey([3; 16])];
    let secrets = [Secret([7; 32]), Secret([8; 32]), Secret([9; 32])];
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut input = Input(data);
    for _ in 0..12 {
        if input.0.is_empty() {
            break;
        }
        let before = snapshot(&handler);
        let op = input.byte();
        let app = if op & 0x80 == 0 { &network } else { &local };
        let (method, path, body) = match op % 8 {
            // Raw bodies and paths: decoding and validation.
            0 => (
                http::Method::POST,
                "/v1/join".to_string(),
                input.bytes().to_vec(),
            ),
            1 => (
                http::Method::POST,
                "/v1/leave".to_string(),
                input.bytes().to_vec(),
            ),
            2 => (
                http::Method::POST,
                "/v1/jobs".to_string(),
                input.bytes().to_vec(),
            ),
            3 => {
                let tail =
                    String::from_utf8_lossy(input.bytes()).replace(|c: char| c.is_whitespace(), "");
                (http::Method::GET, format!("/v1/jobs/{tail}"), Vec::new())
            }
            // A join built from the input, its proofs real unless the input says otherwise.
            4 | 5 => {
                let b = input.byte();
                let k = usize::from(b % 3);
                let shape = JobShape::new(
                    1 + usize::from(input.byte() % 4),
                    1 + usize::from(input.byte()),
                    4 * (1 + usize::from(input.byte()) * 3),
                )
                .expect("within a shape's bounds");
                let rank = input.byte() % 5;
                let token = input.u64();
                if b & 0x08 != 0 {
                    let port = input.byte();
                    handler.0.lock().unwrap().table.hellos.insert(
                        token,
                        (
                            10 + u32::from(port % 4),
                            [10, 0, 0, port],
                            [2, 0, 0, 0, 0, port],
                            [0, port],
                        ),
                    );
                }
                let nonce = if b & 0x10 != 0 {
                    handler.nonce().nonce
                } else {
                    Nonce([input.byte(); 16])
                };
                let secret = if b & 0x20 != 0 {
                    secrets[k]
                } else {
                    Secret([b; 32])
                };
                let cred = if b & 0x40 != 0 {
                    CRED
                } else {
                    CredentialKey([b; 32])
                };
                let admission = (b & 0x80 != 0).then_some(("fuzz", &cred));
                // Jobs with levels too: a rank's join at its host, a host's at an open level.
                let levels = (token & 3 == 1).then(|| Levels {
                    ranks: u32::from(input.byte() % 9),
                    first: u32::from(rank),
                    weight: u32::from(input.byte() % 3),
                    coordinator: None,
                    open: token & 4 != 0,
                });
                let req = JoinRequest::new(
                    keys[k], &secret, shape, rank, token, nonce, admission, levels,
                );
                if op % 8 == 5 {
                    let action = if b & 1 == 0 { "leave" } else { "status" };
                    let m =
                        MemberRequest::new(keys[k], &secret, action, rank, handler.nonce().nonce);
                    let route = if action == "leave" {
                        "/v1/leave"
                    } else {
                        "/v1/joined/status"
                    };
                    (
                        http::Method::POST,
                        route.to_string(),
                        serde_json::to_vec(&m).unwrap(),
                    )
                } else {
                    (
                        http::Method::POST,
                        "/v1/join".to_string(),
                        serde_json::to_vec(&req).unwrap(),
                    )
                }
            }
            6 => {
                let st = &mut *handler.0.lock().unwrap();
                st.joins.tick(&mut st.table);
                continue;
            }
            _ => {
                let id = input.byte();
                (http::Method::DELETE, format!("/v1/jobs/{id}"), Vec::new())
            }
        };
        let (status, answer) = rt.block_on(send(app, method, &path, body));
        assert!(
            status < 500,
            "{status} for {path}: {}",
            String::from_utf8_lossy(&answer)
        );
        let json: serde_json::Value = serde_json::from_slice(&answer)
            .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&answer)));
        let result = json["result"].as_str().expect("a result key").to_string();
        if matches!(result.as_str(), "error" | "refused") {
            assert_eq!(
                snapshot(&handler),
                before,
                "{path} refused ({json}) yet changed state"
            );
        }
        let st = handler.0.lock().unwrap();
        let held: u32 = st.table.jobs.values().map(|j| j.1).sum();
        assert!(held <= SLOTS);
        let joined: usize = st.joins.listing().iter().map(|j| j.slots).sum();
        assert!(joined <= QUOTA, "credential over its quota: {joined}");
    }
});
