//! Request heads too long for the API get the API's JSON error: status 414 for a request
//! line, 431 for headers, past [`MAX_HEAD`] bytes. Left to hyper, a head past its own limit
//! (about 400 KiB) closes the connection, and its client, still writing, never reads why.
//!
//! [`Limited`] wraps a listener; each connection's first request head is read through
//! [`Guarded`], which counts it up to its blank line. Past the limit it hands hyper nothing
//! more, reads and discards the rest of the head, writes the answer itself and ends the
//! connection. Later requests on a kept-alive connection meet hyper's limit (the API's
//! clients send one request per connection).

use std::{
    io,
    pin::Pin,
    task::{ready, Context, Poll},
};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use xagg_api::Response;

/// The longest request line and headers the API reads: its routes are short, its data goes
/// in the body.
pub const MAX_HEAD: usize = 64 << 10;
/// How much of an over-long head is read and discarded before the answer regardless, so a
/// client that never ends its head cannot keep the connection.
const MAX_DISCARD: usize = 16 << 20;

/// A listener whose connections' first request heads are [`Guarded`].
pub struct Limited<L>(pub L);

impl<L: Listener> Listener for Limited<L> {
    type Io = Guarded<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.0.accept().await;
        (Guarded::new(io), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection whose first request head is counted on its way to hyper.
pub struct Guarded<S> {
    inner: S,
    state: State,
}

enum State {
    /// In the first head: its bytes so far, whether its request line has ended, and how
    /// much of the blank line ending the head has been seen.
    Head {
        seen: usize,
        line_ended: bool,
        matched: u8,
    },
    /// The head ended within the limit: everything passes.
    Passed,
    /// The head is too long: reading the rest of it (`matched` of its end seen, `discarded`
    /// bytes dropped), then writing `answer`.
    Refusing {
        matched: u8,
        discarded: usize,
        answer: Vec<u8>,
        written: usize,
    },
    /// Answered: hyper reads the end of the connection, and what it writes goes nowhere.
    Answered,
}

const END: &[u8; 4] = b"\r\n\r\n";

/// Advances the match of the head's end over `b`: the index just past the end, if found.
fn find_end(matched: &mut u8, b: &[u8]) -> Option<usize> {
    for (i, &c) in b.iter().enumerate() {
        *matched = if c == END[*matched as usize] {
            *matched + 1
        } else if c == b'\r' {
            1
        } else {
            0
        };
        if *matched == 4 {
            return Some(i + 1);
        }
    }
    None
}

/// The HTTP answer to a head too long: 414 for its request line, 431 for its headers, with
/// the API's JSON error.
fn answer(line: bool) -> Vec<u8> {
    let (status, what) = if line {
        ("414 URI Too Long", "request line")
    } else {
        (
            "431 Request Header Fields Too Large",
            "request line and headers",
        )
    };
    let message = format!(
        "the {what} are longer than {} KiB: the API's routes are short and its data goes in a JSON body (docs/daemon.md)",
        MAX_HEAD >> 10
    )
    .replace("request line are", "request line is");
    let body = serde_json::to_string(&Response::Error { message }).unwrap_or_default();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl<S> Guarded<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            state: State::Head {
                seen: 0,
                line_ended: false,
                matched: 0,
            },
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Guarded<S> {
    /// Reads and discards the rest of an over-long head, then writes the answer; `Ready`
    /// once it is written.
    fn refuse(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let State::Refusing {
            matched,
            discarded,
            answer,
            written,
        } = &mut self.state
        else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 8192];
        while *matched < 4 && *discarded < MAX_DISCARD {
            let mut b = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut b))?;
            if b.filled().is_empty() {
                break;
            }
            *discarded += b.filled().len();
            if find_end(matched, b.filled()).is_some() {
                *matched = 4;
            }
        }
        while *written < answer.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                break;
            }
            *written += n;
        }
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.state = State::Answered;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let State::Head {
            seen,
            line_ended,
            matched,
        } = &mut this.state
        {
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let new = &buf.filled()[before..];
            let end = find_end(matched, new);
            let head = end.unwrap_or(new.len());
            *line_ended |= new[..head].contains(&b'\n');
            *seen += head;
            // A head that ends in the read that takes it past the limit is over it too.
            if end.is_some() && *seen <= MAX_HEAD {
                this.state = State::Passed;
                return Poll::Ready(Ok(()));
            } else if *seen > MAX_HEAD {
                if end.is_some() {
                    *matched = 4;
                }
                // Hyper gets none of these bytes: it waits for more of the head, and gets
                // the connection's end once the answer is written.
                buf.set_filled(before);
                this.state = State::Refusing {
                    matched: *matched,
                    discarded: 0,
                    answer: answer(!*line_ended),
                    written: 0,
                };
            } else {
                return Poll::Ready(Ok(()));
            }
        }
        match this.state {
            State::Passed => Pin::new(&mut this.inner).poll_read(cx, buf),
            State::Refusing { .. } => this.refuse(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.state {
            State::Refusing { .. } | State::Answered => Poll::Ready(Ok(buf.len())),
            _ => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_head_is_found_across_reads() {
        let mut m = 0;
        assert_eq!(find_end(&mut m, b"GET / HTTP/1.1\r\nhost: x\r"), None);
        assert_eq!(find_end(&mut m, b"\n\r"), None);
        assert_eq!(find_end(&mut m, b"\nbody"), Some(1));
        let mut m = 0;
        assert_eq!(find_end(&mut m, b"a\r\r\n\r\nb"), Some(6));
    }

    #[test]
    fn the_answer_is_the_apis_json_error() {
        let a = String::from_utf8(answer(true)).unwrap();
        assert!(a.starts_with("HTTP/1.1 414 "), "{a}");
        let body = a.split("\r\n\r\n").nth(1).unwrap();
        assert!(body.contains(r#""result":"error""#), "{body}");
        assert!(
            body.contains("request line is longer than 64 KiB"),
            "{body}"
        );
        let a = String::from_utf8(answer(false)).unwrap();
        assert!(a.starts_with("HTTP/1.1 431 ") && a.contains("request line and headers are"));
    }
}
