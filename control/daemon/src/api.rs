//! The daemon's side of its API, version 1 (the requests, answers and client are
//! `xagg_api`'s): the routes of the local Unix socket (`daemon.socket`), each a
//! [`Request`], and of the network listener (the join protocol), answered with a
//! [`Response`] in JSON, errors with a 4xx status and `{"result": "error", "message":
//! ...}`. The routes are listed in `docs/daemon.md`.

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
use serde::Serialize;
use xagg_api::{Faults, JobSpec, Request, Response, VERSION};
use xagg_join::{
    JoinReply, JoinRequest, MemberReply, MemberRequest, NonceReply, RingReply, RingRequest,
};

/// A [`Response`] as the route's answer: an error with status 400.
struct Answer(Response);

impl IntoResponse for Answer {
    fn into_response(self) -> axum::response::Response {
        let status = match &self.0 {
            Response::Error { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::OK,
        };
        (status, Json(self.0)).into_response()
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
    /// A member's `action` ("leave", "renew" or "status") on its job.
    fn member(&self, action: &'static str, req: MemberRequest) -> MemberReply;
    /// A host's word to this daemon as its job's ring coordinator.
    fn ring(&self, req: RingRequest) -> RingReply;
}

/// The route of a member's `action` on its job (leave, renew, status).
fn member_route<H: Handler>(h: H, action: &'static str) -> axum::routing::MethodRouter {
    post(
        move |r: Result<Json<MemberRequest>, JsonRejection>| async move {
            body(r).map(|r| {
                let reply = h.member(action, r);
                join_answer(matches!(reply, MemberReply::Refused { .. }), reply)
            })
        },
    )
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
        .route("/v1/leave", member_route(h.clone(), "leave"))
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
        .route("/v1/joined/renew", member_route(h.clone(), "renew"))
        .route("/v1/joined/status", member_route(h.clone(), "status"))
}

/// The local socket's routes: every request, and the join protocol's.
pub fn router<H: Handler>(handler: H) -> Router {
    let network = join_routes(handler.clone());
    let a = handler;
    let h = move |r: Request| Answer(a.admin(r));
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use xagg_api::{call, JobCounters};

    use super::*;

    /// Answers the local socket's requests as the daemon would shape them.
    #[derive(Clone)]
    struct StandIn;

    impl Handler for StandIn {
        fn admin(&self, req: Request) -> Response {
            match req {
                Request::AddJob { job } => Response::Job { job },
                Request::ListJobs => Response::Jobs { jobs: Vec::new() },
                Request::JobCounters { id } => Response::JobCounters {
                    job: JobCounters {
                        id,
                        ..JobCounters::default()
                    },
                },
                Request::RemoveJob { id } => Response::Error {
                    message: format!("no job {id}"),
                },
                _ => Response::Ok,
            }
        }
        fn nonce(&self) -> NonceReply {
            unreachable!("not asked")
        }
        fn join(&self, _: JoinRequest) -> JoinReply {
            unreachable!("not asked")
        }
        fn member(&self, _: &'static str, _: MemberRequest) -> MemberReply {
            unreachable!("not asked")
        }
        fn ring(&self, _: RingRequest) -> RingReply {
            unreachable!("not asked")
        }
    }

    /// The blocking client and these routes agree on every request, errors included.
    #[test]
    fn the_client_and_the_routes_agree() {
        let dir = std::env::temp_dir().join(format!("xagg-api-routes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("api.sock");
        let _ = std::fs::remove_file(&socket);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(async { tokio::net::UnixListener::bind(&socket) });
        let listener = listener.unwrap();
        rt.spawn(async move { axum::serve(listener, router(StandIn)).await });
        let ask = |req: Request| call(&socket, &req).unwrap();
        let spec: JobSpec = serde_json::from_str(
            r#"{"id":7,"segment":256,"slots":8,"members":[{"interface":"p0","mac":"02:00:00:00:00:01","addr":"10.0.0.1:47801"}]}"#,
        )
        .unwrap();
        match ask(Request::AddJob { job: spec.clone() }) {
            Response::Job { job } => assert_eq!(job, spec),
            r => panic!("{r:?}"),
        }
        assert!(matches!(ask(Request::ListJobs), Response::Jobs { jobs } if jobs.is_empty()));
        assert!(matches!(
            ask(Request::JobCounters { id: 9 }),
            Response::JobCounters { job } if job.id == 9
        ));
        // An error answer (status 400) is the daemon's word, not a failed call.
        assert!(matches!(
            ask(Request::RemoveJob { id: 3 }),
            Response::Error { message } if message == "no job 3"
        ));
        for req in [
            Request::Counters,
            Request::Status,
            Request::JobStatus { id: 1 },
            Request::Inject {
                drop_contribution: 0.5,
                drop_result: 0.0,
            },
            Request::Joins,
            Request::Detach,
        ] {
            assert!(matches!(ask(req), Response::Ok));
        }
        assert!(call(Path::new("/nonexistent/api.sock"), &Request::Status).is_err());
        rt.shutdown_background();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A join whose shape `JobShape::new` refuses is refused as it is read, with the
    /// shape's reason: it never reaches the registry (the stand-in would panic).
    #[test]
    fn a_join_with_a_bad_shape_is_refused_as_it_is_read() {
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move { axum::serve(listener, network_router(StandIn)).await });
        let shape = xagg_common::JobShape::new(2, 8, 256).unwrap();
        let (key, secret) = (xagg_join::JobKey::random(), xagg_join::Secret::random());
        let nonce = xagg_join::Nonce::random();
        let join = JoinRequest::new(key, &secret, shape, 0, 1, nonce, None, None);
        let body = serde_json::to_string(&join).unwrap();
        assert!(body.contains(r#""members":2"#), "{body}");
        let body = body.replace(r#""members":2"#, r#""members":0"#);
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        write!(
            c,
            "POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
        assert!(answer.contains("0 members: a job has 1..=64"), "{answer}");
        rt.shutdown_background();
    }
}
