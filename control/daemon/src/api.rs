//! The daemon's API, version 1: HTTP/1.1 with JSON bodies on the local Unix socket
//! (`daemon.socket`). Each [`Request`] is one route ([`Request::route`]); every answer's
//! body is a [`Response`] in JSON, errors with a 4xx status and `{"result": "error",
//! "message": ...}`. The CLI and the tests are clients of it ([`call`]); anything that
//! speaks HTTP over a Unix socket can be (`curl --unix-socket /run/xagg/xaggd.sock
//! http://xagg/v1/status`). The routes are listed in `docs/daemon.md`.

use std::{collections::BTreeMap, path::Path};

use anyhow::{bail, Context};
use axum::{
    extract::{
        rejection::{JsonRejection, PathRejection},
        Path as UrlPath,
    },
    http::{Method, StatusCode, Uri},
    response::IntoResponse,
    routing::{get, post, put},
    Json, Router,
};
use serde::{Deserialize, Serialize};
use xagg_join::{
    JoinReply, JoinRequest, MemberReply, MemberRequest, NonceReply, RingReply, RingRequest,
};

use crate::job::JobSpec;

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
        /// Where the dataplane is pinned (none when it detaches on exit).
        #[serde(default)]
        pin_path: Option<std::path::PathBuf>,
    },
    JobStatus {
        slots: Vec<crate::dataplane::SlotStatus>,
    },
    Joins {
        joins: Vec<crate::join::JoinListing>,
    },
    JobCounters {
        job: crate::dataplane::JobCounters,
    },
    Error {
        message: String,
    },
}

/// The version prefix of every route.
pub const VERSION: &str = "/v1";

/// The fault injection settings of [`Request::Inject`], as the route's body.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    pub drop_contribution: f64,
    pub drop_result: f64,
}

impl Request {
    /// The request's HTTP method, path and JSON body.
    pub fn route(&self) -> (Method, String, Option<serde_json::Value>) {
        let v = VERSION;
        match self {
            Request::AddJob { job } => (
                Method::POST,
                format!("{v}/jobs"),
                Some(serde_json::to_value(job).expect("a job serializes")),
            ),
            Request::RemoveJob { id } => (Method::DELETE, format!("{v}/jobs/{id}"), None),
            Request::ListJobs => (Method::GET, format!("{v}/jobs"), None),
            Request::JobStatus { id } => (Method::GET, format!("{v}/jobs/{id}/status"), None),
            Request::Counters => (Method::GET, format!("{v}/counters"), None),
            Request::Status => (Method::GET, format!("{v}/status"), None),
            Request::Inject {
                drop_contribution,
                drop_result,
            } => (
                Method::PUT,
                format!("{v}/faults"),
                Some(
                    serde_json::to_value(Faults {
                        drop_contribution: *drop_contribution,
                        drop_result: *drop_result,
                    })
                    .expect("faults serialize"),
                ),
            ),
            Request::Detach => (Method::POST, format!("{v}/detach"), None),
            Request::Joins => (Method::GET, format!("{v}/joins"), None),
            Request::JobCounters { id } => (Method::GET, format!("{v}/jobs/{id}/counters"), None),
        }
    }
}

impl IntoResponse for Response {
    fn into_response(self) -> axum::response::Response {
        let status = match &self {
            Response::Error { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::OK,
        };
        (status, Json(self)).into_response()
    }
}

/// The largest request body the API reads (a job with 64 members is a few KiB).
pub const MAX_BODY: usize = 1 << 20;

/// A body or path the route cannot read: the extractor's status and what is wrong.
struct Malformed(StatusCode, String);

impl IntoResponse for Malformed {
    fn into_response(self) -> axum::response::Response {
        let r = Response::Error { message: self.1 };
        (self.0, Json(r)).into_response()
    }
}

fn malformed(status: StatusCode, what: &str, why: String) -> Malformed {
    Malformed(status, format!("malformed request {what}: {why}"))
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, Malformed> {
    b.map(|Json(t)| t)
        .map_err(|e| malformed(e.status(), "body", e.body_text()))
}

fn job_id(p: Result<UrlPath<u32>, PathRejection>) -> Result<u32, Malformed> {
    p.map(|UrlPath(id)| id).map_err(|e| {
        malformed(
            e.status(),
            "path",
            format!("{} (a job id is a number, e.g. /v1/jobs/7)", e.body_text()),
        )
    })
}

/// What serves the API's routes.
pub trait Handler: Clone + Send + Sync + 'static {
    /// The local socket's requests.
    fn admin(&self, req: Request) -> Response;
    fn nonce(&self) -> NonceReply;
    fn join(&self, req: JoinRequest) -> JoinReply;
    /// A member's `action` ("leave" or "status") on its job.
    fn member(&self, action: &'static str, req: MemberRequest) -> MemberReply;
    /// A host's word to this daemon as its job's ring coordinator.
    fn ring(&self, req: RingRequest) -> RingReply;
}

/// A join protocol answer with its HTTP status: a refusal is 403.
fn join_answer<T: Serialize>(refused: bool, body: T) -> axum::response::Response {
    let status = if refused {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}

/// The network listener's routes: the join protocol only (`xagg_join`).
pub fn network_router<H: Handler>(h: H) -> Router {
    join_routes(h)
        .fallback(|method: Method, uri: Uri| async move {
            let r = Response::Error {
                message: format!(
                    "no route {method} {uri} on the network listener: it serves only the join protocol (GET /v1/nonce, POST /v1/join, /v1/leave, /v1/joined/status, /v1/ring); everything else is on the daemon's local socket"
                ),
            };
            (StatusCode::NOT_FOUND, Json(r))
        })
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

/// A route asked with a method it does not take: JSON like every other answer.
async fn wrong_method(method: Method, uri: Uri) -> (StatusCode, Json<Response>) {
    let r = Response::Error {
        message: format!("{uri} does not take {method}: docs/daemon.md lists each route's method"),
    };
    (StatusCode::METHOD_NOT_ALLOWED, Json(r))
}

/// The join protocol's routes.
fn join_routes<H: Handler>(h: H) -> Router {
    Router::new()
        .route(
            "/v1/nonce",
            get({
                let h = h.clone();
                move || async move { Json(h.nonce()) }
            }),
        )
        .route(
            "/v1/join",
            post({
                let h = h.clone();
                move |r: Result<Json<JoinRequest>, JsonRejection>| async move {
                    body(r).map(|r| {
                        let reply = h.join(r);
                        join_answer(matches!(reply, JoinReply::Refused { .. }), reply)
                    })
                }
            }),
        )
        .route(
            "/v1/leave",
            post({
                let h = h.clone();
                move |r: Result<Json<MemberRequest>, JsonRejection>| async move {
                    body(r).map(|r| {
                        let reply = h.member("leave", r);
                        join_answer(matches!(reply, MemberReply::Refused { .. }), reply)
                    })
                }
            }),
        )
        .route(
            "/v1/ring",
            post({
                let h = h.clone();
                move |r: Result<Json<RingRequest>, JsonRejection>| async move {
                    body(r).map(|r| {
                        let reply = h.ring(r);
                        join_answer(matches!(reply, RingReply::Refused { .. }), reply)
                    })
                }
            }),
        )
        .route(
            "/v1/joined/status",
            post({
                let h = h.clone();
                move |r: Result<Json<MemberRequest>, JsonRejection>| async move {
                    body(r).map(|r| {
                        let reply = h.member("status", r);
                        join_answer(matches!(reply, MemberReply::Refused { .. }), reply)
                    })
                }
            }),
        )
}

/// The local socket's routes: every request, and the join protocol's.
pub fn router<H: Handler>(handler: H) -> Router {
    let network = join_routes(handler.clone());
    let a = handler;
    let h = move |r: Request| a.admin(r);
    Router::new()
        .route(
            "/v1/jobs",
            get({
                let h = h.clone();
                move || async move { h(Request::ListJobs) }
            })
            .post({
                let h = h.clone();
                move |job: Result<Json<JobSpec>, JsonRejection>| async move {
                    body(job).map(|job| h(Request::AddJob { job }))
                }
            }),
        )
        .route(
            "/v1/jobs/{id}",
            axum::routing::delete({
                let h = h.clone();
                move |id| async move { job_id(id).map(|id| h(Request::RemoveJob { id })) }
            }),
        )
        .route(
            "/v1/jobs/{id}/status",
            get({
                let h = h.clone();
                move |id| async move { job_id(id).map(|id| h(Request::JobStatus { id })) }
            }),
        )
        .route(
            "/v1/counters",
            get({
                let h = h.clone();
                move || async move { h(Request::Counters) }
            }),
        )
        .route(
            "/v1/status",
            get({
                let h = h.clone();
                move || async move { h(Request::Status) }
            }),
        )
        .route(
            "/v1/faults",
            put({
                let h = h.clone();
                move |f: Result<Json<Faults>, JsonRejection>| async move {
                    body(f).map(|f| {
                        h(Request::Inject {
                            drop_contribution: f.drop_contribution,
                            drop_result: f.drop_result,
                        })
                    })
                }
            }),
        )
        .route(
            "/v1/detach",
            post({
                let h = h.clone();
                move || async move { h(Request::Detach) }
            }),
        )
        .route(
            "/v1/jobs/{id}/counters",
            get({
                let h = h.clone();
                move |id| async move { job_id(id).map(|id| h(Request::JobCounters { id })) }
            }),
        )
        .route(
            "/v1/joins",
            get({
                let h = h.clone();
                move || async move { h(Request::Joins) }
            }),
        )
        .merge(network)
        .fallback(|method: Method, uri: Uri| async move {
            let r = Response::Error {
                message: format!(
                    "no route {method} {uri}: the API is version 1, its routes start with {VERSION}/ (docs/daemon.md lists them)"
                ),
            };
            (StatusCode::NOT_FOUND, Json(r))
        })
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

/// Sends one request to the daemon at `socket` and waits for its response (a blocking
/// call: it runs its own short-lived runtime, so it must not be called from async code).
pub fn call(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(call_async(socket, req))
}

async fn call_async(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::UnixStream::connect(socket).await.with_context(|| {
        format!(
            "cannot reach the daemon at {}: is xaggd running? (start it with `xaggd --config FILE`, or pass --socket)",
            socket.display()
        )
    })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let driver = tokio::spawn(conn);
    let (method, path, body) = req.route();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "xagg")
        .header("content-type", "application/json")
        .body(Full::new(hyper::body::Bytes::from(body)))?;
    let answer = sender.send_request(request).await?;
    let status = answer.status();
    let bytes = answer.into_body().collect().await?.to_bytes();
    driver.abort();
    if bytes.is_empty() {
        bail!("the daemon answered {status} without a body");
    }
    serde_json::from_slice(&bytes)
        .with_context(|| format!("malformed response from the daemon ({status})"))
}
