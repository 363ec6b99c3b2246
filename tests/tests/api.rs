//! The daemon's versioned HTTP API on its Unix socket, spoken by hand: every route
//! answers JSON; malformed, truncated, huge and unknown requests get a clear error and
//! change nothing; a client that sends half a request and stalls does not hold up others;
//! a line of the old JSON-lines protocol is not mistaken for a request.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    time::Duration,
};

use xagg_api::{Request, Response};
use xagg_tests::*;

/// Sends `raw` bytes on a new connection and reads until the daemon closes it or 2 s pass;
/// returns the HTTP status code and the body.
fn exchange(sw: &TestSwitch, raw: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(&sw.socket).expect("connecting to the API socket");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn http(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: xagg\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn the_api_answers_every_request_clearly() {
    if !require_root("the_api_answers_every_request_clearly") {
        return;
    }
    let sw = TestSwitch::start("xap", 2, |_| {});
    let jobs_before = sw.api(Request::ListJobs);

    // The documented routes, by hand.
    let (code, body) = exchange(&sw, &http("GET", "/v1/status", ""));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""result":"status""#), "{body}");
    let spec = sw
        .job_spec(
            7,
            xagg_common::wire::Op::Sum,
            xagg_common::wire::DType::I32,
            256,
            8,
            &[0, 1],
            47801,
        )
        .unwrap();
    let job = serde_json::to_string(&spec).unwrap();
    let (code, body) = exchange(&sw, &http("POST", "/v1/jobs", &job));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""slot_base""#), "{body}");
    let (code, body) = exchange(&sw, &http("GET", "/v1/jobs/7/status", ""));
    assert_eq!(code, 200, "{body}");
    let (code, body) = exchange(&sw, &http("DELETE", "/v1/jobs/7", ""));
    assert_eq!((code, body.as_str()), (200, r#"{"result":"ok"}"#));

    // Wrong requests: each answered with what is wrong, none changes anything.
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "malformed JSON",
            http("POST", "/v1/jobs", "{\"id\": 9,"),
            400,
            "malformed request body",
        ),
        (
            "a job with an unknown field",
            http("POST", "/v1/jobs", r#"{"id":9,"colour":"red"}"#),
            422,
            "unknown field `colour`",
        ),
        (
            "a job the daemon refuses",
            http(
                "POST",
                "/v1/jobs",
                r#"{"id":9,"segment":256,"slots":8,"members":[]}"#,
            ),
            400,
            "member",
        ),
        (
            "a job id whose index is past the switch's jobs",
            http("POST", "/v1/jobs", &job.replace("\"id\":7", "\"id\":300")),
            400,
            "index (300) must be below 256",
        ),
        (
            "a job of an earlier generation of a removed job's index",
            http("GET", &format!("/v1/jobs/{}/status", 7 + (3 << 16)), ""),
            400,
            "no job",
        ),
        (
            "an unknown route",
            http("GET", "/v2/status", ""),
            404,
            "the API is version 1",
        ),
        (
            "a job id that is not a number",
            http("DELETE", "/v1/jobs/nine", ""),
            400,
            "a job id is a number",
        ),
        (
            "removing a job that does not exist",
            http("DELETE", "/v1/jobs/12345", ""),
            400,
            "12345",
        ),
        (
            "faults out of range",
            http(
                "PUT",
                "/v1/faults",
                r#"{"drop_contribution":7,"drop_result":0}"#,
            ),
            400,
            "a probability is between 0 and 1",
        ),
        (
            "a huge body",
            http(
                "POST",
                "/v1/jobs",
                &format!("{{\"id\":9,\"pad\":\"{}\"}}", "x".repeat(3 << 20)),
            ),
            413,
            "length limit exceeded",
        ),
    ];
    // Heads past the API's limit: answered, not closed on.
    let long_line = format!(
        "GET /v1/status?{} HTTP/1.1\r\nhost: xagg\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let long_headers = format!(
        "GET /v1/status HTTP/1.1\r\nhost: xagg\r\n{}\r\n",
        "x-pad: 0123456789abcdef\r\n".repeat(60_000)
    );
    // Just past the limit: the head's end comes in the read that takes it over (before,
    // such a head was served).
    let just_over = format!(
        "GET /v1/status HTTP/1.1\r\nhost: xagg\r\nx-pad: {}\r\n\r\n",
        "p".repeat(66 << 10)
    );
    let cases = cases
        .into_iter()
        .chain([
            (
                "a 1 MiB request line",
                long_line.into_bytes(),
                414,
                "request line is longer than 64 KiB",
            ),
            (
                "66 KiB of headers",
                just_over.into_bytes(),
                431,
                "request line and headers are longer than 64 KiB",
            ),
            (
                "1.4 MB of headers",
                long_headers.into_bytes(),
                431,
                "request line and headers are longer than 64 KiB",
            ),
        ])
        .collect::<Vec<_>>();
    for (what, raw, want, says) in cases {
        let (code, body) = exchange(&sw, &raw);
        assert_eq!(code, want, "{what}: {body}");
        assert!(body.contains(says), "{what}: {body}");
        eprintln!(
            "{what}: {code} {}",
            body.chars().take(160).collect::<String>()
        );
    }
    // Not HTTP at all: the old protocol's line, random bytes, a request cut short.
    for (what, raw) in [
        (
            "a JSON line of the old API",
            b"{\"cmd\":\"detach\"}\n".to_vec(),
        ),
        (
            "random bytes",
            (0..600u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("a truncated body", {
            let mut r = http("POST", "/v1/jobs", &job);
            r.truncate(r.len() - 10);
            r
        }),
    ] {
        let (code, body) = exchange(&sw, &raw);
        assert_ne!(code, 200, "{what}: {body}");
        eprintln!(
            "{what}: {}",
            if code == 0 {
                "connection closed".to_string()
            } else {
                format!("{code}")
            }
        );
    }
    // A client that sends half a request and stalls does not hold up the next.
    let mut stalled = UnixStream::connect(&sw.socket).unwrap();
    stalled
        .write_all(b"POST /v1/jobs HTTP/1.1\r\ncontent-length: 100\r\n\r\n{")
        .unwrap();
    let t = std::time::Instant::now();
    assert!(matches!(sw.api(Request::Status), Response::Status { .. }));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    drop(stalled);

    // Nothing changed, and the daemon still serves.
    assert_eq!(
        serde_json::to_string(&sw.api(Request::ListJobs)).unwrap(),
        serde_json::to_string(&jobs_before).unwrap()
    );
    assert!(matches!(sw.api(Request::Status), Response::Status { .. }));
}
