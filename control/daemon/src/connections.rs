//! The connections the daemon accepts over the network (its join listener, its metrics
//! endpoint): each lives at most [`LIFETIME`], and at most [`MAX_CONNECTIONS`] are open
//! at once, [`MAX_PER_SOURCE`] from one address. Without these, a stranger who opens
//! connections and never finishes a request holds them for ever: enough of them take
//! every file descriptor the daemon may have, and the local API, the state file and the
//! ranks' lease renewals fail with it (their jobs removed as if the ranks had died).
//! Joins and scrapes are one short request per connection: their clients give up after
//! 5 s.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::serve::Listener;
use log::warn;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::Sleep,
};

/// How long a connection may stay open, whatever it does.
pub const LIFETIME: Duration = Duration::from_secs(10);
/// Connections open at once, and from one address.
pub const MAX_CONNECTIONS: usize = 256;
pub const MAX_PER_SOURCE: usize = 32;
/// How often a refused connection is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The open connections by source address.
#[derive(Default)]
struct Open {
    by_source: HashMap<IpAddr, usize>,
    total: usize,
    logged: Option<Instant>,
}

/// A TCP listener whose connections are [`Bounded`].
pub struct BoundedListener {
    inner: TcpListener,
    open: Arc<Mutex<Open>>,
    /// What it serves, for the log.
    what: &'static str,
}

impl BoundedListener {
    pub fn new(inner: TcpListener, what: &'static str) -> Self {
        Self {
            inner,
            open: Arc::default(),
            what,
        }
    }
}

impl Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = Listener::accept(&mut self.inner).await;
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let from = open.by_source.get(&addr.ip()).copied().unwrap_or(0);
            if open.total >= MAX_CONNECTIONS || from >= MAX_PER_SOURCE {
                // Closed at once: a client of the daemon's tries again later.
                if open.logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                    open.logged = Some(Instant::now());
                    warn!(
                        "{}: refused a connection from {addr}: {} open, {from} of them from its address (at most {MAX_CONNECTIONS}, {MAX_PER_SOURCE} from one address; said once a minute)",
                        self.what, open.total
                    );
                }
                continue;
            }
            open.total += 1;
            *open.by_source.entry(addr.ip()).or_default() += 1;
            drop(open);
            let io = Bounded {
                inner: io,
                deadline: Box::pin(tokio::time::sleep(LIFETIME)),
                _open: Counted {
                    open: self.open.clone(),
                    source: addr.ip(),
                },
            };
            return (io, addr);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A place among the open connections, given back when the connection goes.
struct Counted {
    open: Arc<Mutex<Open>>,
    source: IpAddr,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

/// A connection that fails every read and write once its lifetime is over (hyper then
/// closes it).
pub struct Bounded {
    inner: TcpStream,
    deadline: Pin<Box<Sleep>>,
    _open: Counted,
}

impl Bounded {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the connection outlived its {} s", LIFETIME.as_secs()),
    )
}

impl AsyncRead for Bounded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
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
    use std::io::{Read, Write};

    use super::*;

    /// Whether the server closed `s` (within `within`).
    fn closed(s: &mut std::net::TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        match s.read(&mut [0u8; 256]) {
            Ok(0) => true,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }

    #[test]
    fn one_address_holds_its_share_and_no_more() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let tcp = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = tcp.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "hi" }));
        rt.spawn(async move {
            axum::serve(BoundedListener::new(tcp, "test"), app)
                .await
                .unwrap()
        });
        let mut stalled: Vec<std::net::TcpStream> = (0..=MAX_PER_SOURCE)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let refused = stalled
            .iter_mut()
            .map(|s| closed(s, Duration::from_millis(50)))
            .filter(|&c| c)
            .count();
        assert_eq!(refused, 1);
        stalled.clear();
        std::thread::sleep(Duration::from_millis(100));
        // Their places given back: a whole request is answered.
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.ends_with("hi"), "{answer}");
    }
}
