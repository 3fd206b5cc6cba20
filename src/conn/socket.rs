//! Socket helpers for the lean paths, which own their connections instead of
//! leaving them to actix-web: answering a refused request and closing
//! without a reset, and handing a connection (plain or TLS) to actix-web
//! with the bytes already read put back in front ([`Rewound`]).

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_rt::net::TcpStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

use crate::conn::tls::TlsIo;
use crate::conn::wire::Wire;
use crate::error::{ApiError, Cors};

/// How long a refused connection is drained before it is closed, so the
/// client reads the error instead of a reset.
const LINGER: Duration = Duration::from_millis(500);

/// Answers a request the lean path refuses with `error` (the same response
/// actix-web would give it, with `cors` for a page), then closes the
/// connection after draining what the client still sends. The one refusal
/// writer, plain or TLS ([`Wire::write_last`]).
pub(crate) async fn refuse<W: Wire>(mut wire: W, error: &ApiError, cors: Cors<'_>) {
    let mut response = Vec::new();
    error.write_http1(&mut response, true, cors);
    wire.write_last(&response).await;
    close_gently(wire.socket()).await;
}

/// Ends our side of `io` and drains what the client still sends for a short
/// while before the socket is dropped: closing a socket with unread bytes
/// makes Linux send a reset, and the client may then lose the answers it
/// has not read yet.
pub(crate) async fn close_gently(io: &TcpStream) {
    let _ = socket2::SockRef::from(io).shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + LINGER;
    let mut drained = 0usize;
    while drained < 1 << 20 {
        if !matches!(timeout_at(deadline, io.readable()).await, Ok(Ok(()))) {
            break;
        }
        let mut buf = [0u8; 512];
        match io.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
    }
}

/// A connection handed to actix-web, with bytes already read from it put
/// back in front. Every actix-web connection goes through this type (with
/// nothing in front when the head was only peeked).
pub(crate) struct Rewound {
    io: Conn,
    /// Lets a handler ask for this connection to be closed.
    close: CloseHandle,
    /// Read before the hand-over; served first.
    prefix: Vec<u8>,
    /// How much of `prefix` has been served.
    pos: usize,
    /// The client's address from a PROXY header (`None`: the socket's peer).
    client: Option<std::net::SocketAddr>,
    /// It came in on the internal listener (`server.admin_port`).
    internal: bool,
}

/// A plain or a TLS connection.
enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsIo>),
}

impl Conn {
    fn socket(&self) -> &TcpStream {
        match self {
            Conn::Plain(io) => io,
            Conn::Tls(tls) => tls.socket(),
        }
    }
}

impl Rewound {
    /// A connection nothing has been read from.
    pub(crate) fn new(io: TcpStream) -> Self {
        Rewound {
            io: Conn::Plain(io),
            close: CloseHandle::default(),
            prefix: Vec::new(),
            pos: 0,
            client: None,
            internal: false,
        }
    }

    /// A connection whose first `prefix` bytes were already read.
    pub(crate) fn with_prefix(io: TcpStream, prefix: &[u8]) -> Self {
        Rewound {
            io: Conn::Plain(io),
            close: CloseHandle::default(),
            prefix: prefix.to_vec(),
            pos: 0,
            client: None,
            internal: false,
        }
    }

    /// A TLS connection whose first `plain` bytes were already decrypted
    /// and read.
    pub(crate) fn tls(io: TlsIo, plain: Vec<u8>) -> Self {
        Rewound {
            io: Conn::Tls(Box::new(io)),
            close: CloseHandle::default(),
            prefix: plain,
            pos: 0,
            client: None,
            internal: false,
        }
    }

    /// The same, its client at `client` (a PROXY header's source).
    pub(crate) fn with_client(mut self, client: Option<std::net::SocketAddr>) -> Self {
        self.client = client;
        self
    }

    /// The same, marked as accepted on the internal listener.
    pub(crate) fn internal(mut self) -> Self {
        self.internal = true;
        self
    }

    /// Whether it was accepted on the internal listener.
    pub(crate) fn is_internal(&self) -> bool {
        self.internal
    }

    /// Whether the client's address came from a PROXY header.
    pub(crate) fn proxied(&self) -> bool {
        self.client.is_some()
    }

    /// The client's address: a PROXY header's source, else the socket's
    /// peer.
    pub(crate) fn client(&self) -> Option<std::net::SocketAddr> {
        self.client.or_else(|| self.io.socket().peer_addr().ok())
    }

    /// What a handler on this connection uses to have it closed.
    pub(crate) fn close_handle(&self) -> CloseHandle {
        self.close.clone()
    }
}

impl AsyncRead for Rewound {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.pos);
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Conn::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Conn::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Conn::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Conn::Plain(io) => io.is_write_vectored(),
            Conn::Tls(_) => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Conn::Plain(io) => Pin::new(io).poll_flush(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Conn::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

/// In an actix-web connection's data when its client's address came from a
/// PROXY header (a claim: see `edge::Client`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proxied;

/// In an actix-web connection's data when it was accepted on the internal
/// listener (`server.admin_host`, `server.admin_port`): the operator pages
/// are served there (`routes::operator_page`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Internal;

/// Asks for the connection under an actix-web request to be closed once its
/// answer is out: for a request whose body stopped arriving, actix-web's
/// HTTP/1 dispatcher would otherwise keep waiting for the rest of a chunked
/// body, holding the socket. Put in each request's connection data; the
/// connection's task in `conn::serve` acts on it.
#[derive(Clone, Default)]
pub(crate) struct CloseHandle(Rc<Notify>);

impl CloseHandle {
    /// Close the connection after the answer.
    pub(crate) fn close(&self) {
        self.0.notify_one();
    }

    /// Resolves once [`CloseHandle::close`] was called.
    pub(crate) async fn requested(&self) {
        self.0.notified().await;
    }
}
