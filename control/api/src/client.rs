//! The blocking client: one request, one HTTP/1.1 exchange on its own connection to the
//! daemon's Unix socket. Plain `std` I/O, so a client links no runtime and can call from
//! any thread.

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
};

use crate::{Error, Request, Response};

/// Sends one request to the daemon at `socket` and waits for its response.
pub fn call(socket: &Path, req: &Request) -> Result<Response, Error> {
    let mut stream = UnixStream::connect(socket).map_err(|source| {
        if source.kind() == io::ErrorKind::PermissionDenied {
            return Error::Denied {
                socket: socket.into(),
                access: access(socket),
            };
        }
        use std::os::unix::fs::FileTypeExt;
        if std::fs::metadata(socket).is_ok_and(|m| !m.file_type().is_socket()) {
            return Error::NotASocket {
                socket: socket.into(),
            };
        }
        Error::Unreachable {
            socket: socket.into(),
            source,
        }
    })?;
    let io = |source| Error::Io {
        socket: socket.into(),
        source,
    };
    stream.write_all(&request_bytes(req)).map_err(io)?;
    let (status, bytes) = read_answer(BufReader::new(stream)).map_err(|e| match e {
        Answer::Io(source) => io(source),
        Answer::Http(why) => Error::Http(why),
    })?;
    if bytes.is_empty() {
        return Err(Error::NoBody { status });
    }
    serde_json::from_slice(&bytes).map_err(|source| Error::Malformed { status, source })
}

/// The request on the wire: its line, `host` and `content-type`, and with a body its
/// length and the body (keys in order, as `serde_json::Value` writes them).
/// A socket's mode and group as `ls` would say them, e.g. "mode 0660, group xagg".
fn access(socket: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(socket) else {
        return "its mode cannot be read".into();
    };
    let group = nix::unistd::Group::from_gid(m.gid().into())
        .ok()
        .flatten()
        .map_or_else(|| m.gid().to_string(), |g| g.name);
    format!("mode {:04o}, group {group}", m.mode() & 0o7777)
}

fn request_bytes(req: &Request) -> Vec<u8> {
    let (method, path, body) = req.route();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut out =
        format!("{method} {path} HTTP/1.1\r\nhost: xagg\r\ncontent-type: application/json\r\n");
    if !body.is_empty() {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

/// Why an answer could not be read.
enum Answer {
    Io(std::io::Error),
    Http(String),
}

impl From<std::io::Error> for Answer {
    fn from(e: std::io::Error) -> Self {
        Answer::Io(e)
    }
}

/// Reads one answer: its status (code and reason, e.g. `400 Bad Request`) and its body,
/// sized by `content-length`, in chunks, or up to the end of the connection.
fn read_answer(mut r: impl BufRead) -> Result<(String, Vec<u8>), Answer> {
    let line = read_line(&mut r)?;
    let status = match line.split_once(' ') {
        Some((version, status)) if version.starts_with("HTTP/1.") => status.to_string(),
        _ => return Err(Answer::Http(format!("status line `{line}`"))),
    };
    let (mut length, mut chunked) = (None, false);
    loop {
        let header = read_line(&mut r)?;
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            return Err(Answer::Http(format!("header `{header}`")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| Answer::Http(format!("content-length `{value}`")))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let size = read_line(&mut r)?;
            let hex = size.split(';').next().unwrap_or_default().trim();
            let n = usize::from_str_radix(hex, 16)
                .map_err(|_| Answer::Http(format!("chunk size `{size}`")))?;
            if n == 0 {
                break;
            }
            let start = body.len();
            body.resize(start + n, 0);
            r.read_exact(&mut body[start..])?;
            read_line(&mut r)?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok((status, body))
}

/// One line of the answer's head, without its line end.
fn read_line(r: &mut impl BufRead) -> Result<String, Answer> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(Answer::Http(
            "the connection ended within the answer".into(),
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_on_the_wire() {
        // As the daemon's clients have always sent them: no length without a body.
        assert_eq!(
            String::from_utf8(request_bytes(&Request::ListJobs)).unwrap(),
            "GET /v1/jobs HTTP/1.1\r\nhost: xagg\r\ncontent-type: application/json\r\n\r\n"
        );
        assert_eq!(
            String::from_utf8(request_bytes(&Request::RemoveJob { id: 3 })).unwrap(),
            "DELETE /v1/jobs/3 HTTP/1.1\r\nhost: xagg\r\ncontent-type: application/json\r\n\r\n"
        );
        assert_eq!(
            String::from_utf8(request_bytes(&Request::Inject {
                drop_contribution: 0.05,
                drop_result: 0.0
            }))
            .unwrap(),
            "PUT /v1/faults HTTP/1.1\r\nhost: xagg\r\ncontent-type: application/json\r\ncontent-length: 44\r\n\r\n{\"drop_contribution\":0.05,\"drop_result\":0.0}"
        );
    }

    #[test]
    fn answers_by_length_in_chunks_or_to_the_end() {
        let read = |a: &[u8]| match read_answer(a) {
            Ok((status, body)) => (status, String::from_utf8(body).unwrap()),
            Err(Answer::Http(e)) => panic!("{e}"),
            Err(Answer::Io(e)) => panic!("{e}"),
        };
        let ok = ("200 OK".to_string(), r#"{"result":"ok"}"#.to_string());
        assert_eq!(
            read(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"result\":\"ok\"}"),
            ok
        );
        assert_eq!(
            read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"res\r\na\r\nult\":\"ok\"}\r\n0\r\n\r\n"),
            ok
        );
        assert_eq!(read(b"HTTP/1.1 200 OK\r\n\r\n{\"result\":\"ok\"}"), ok);
        assert_eq!(
            read(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"),
            ("400 Bad Request".to_string(), String::new())
        );
        assert!(matches!(
            read_answer(&b"SSH-2.0-OpenSSH\r\n"[..]),
            Err(Answer::Http(_))
        ));
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_named_so() {
        let file = std::env::temp_dir().join(format!("xagg-not-a-socket-{}", std::process::id()));
        std::fs::write(&file, "").unwrap();
        let e = call(&file, &Request::Status).unwrap_err();
        let _ = std::fs::remove_file(&file);
        assert!(
            e.to_string().contains("is not a socket: pass --socket"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_daemon_says_how_to_start_it() {
        let e = call(Path::new("/nonexistent/xaggd.sock"), &Request::Status).unwrap_err();
        assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "cannot reach the daemon at /nonexistent/xaggd.sock: is xaggd running? (start it with `xaggd --config FILE`, or pass --socket)"
        );
    }
}
