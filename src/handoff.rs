//! Deciding, per accepted connection, who serves it: the lean stream path or
//! actix-web.
//!
//! actix-web's HTTP/1 dispatcher keeps an 8 KiB read and an 8 KiB write
//! buffer for a connection's whole life; an idle stream must not pay that.
//! So the first request line is *peeked* (`MSG_PEEK`: nothing is consumed).
//! A plain `GET /test/{id} HTTP/1.1` with a valid id is taken here: the head
//! is read and discarded and the socket goes to a [`crate::stream::Stream`]
//! actor. Every other connection goes, bytes untouched, to actix-web, which
//! also has a `/test/{id}` route for what this path declines (HTTP/1.0, a
//! percent-escaped or invalid id, a second request on a keep-alive connection).

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use actix_rt::net::TcpStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, sleep, timeout_at};

use crate::id::is_id_byte;
use crate::stats::Stats;
use crate::wire::head_end_step;

/// How much of the request line is peeked. Larger lines go to actix-web. Kept
/// small because this buffer lives in every connection's future while it is
/// being classified.
pub const PEEK_BYTES: usize = 128;

/// First wait before peeking again when the request line is incomplete
/// (peek leaves the socket readable, so waiting for readiness would spin).
const PEEK_BACKOFF_START: Duration = Duration::from_millis(1);

/// Longest wait between peeks.
const PEEK_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// How long a rejected connection is drained before it is closed, so the
/// client reads the error instead of a reset.
const LINGER: Duration = Duration::from_millis(500);

const STREAM_PREFIX: &[u8] = b"GET /test/";
const DISPATCHER_LINE: &[u8] = crate::dispatch::REQUEST_LINE;
const HTTP11_SUFFIX: &[u8] = b" HTTP/1.1\r\n";

/// Who serves a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Class {
    /// A lean stream for this id.
    Stream(Arc<str>),
    /// A plain `GET /dispatcher` first: [`crate::dispatch`].
    Dispatcher,
    /// actix-web.
    Http,
    /// No complete request line before the deadline.
    Timeout,
    /// The client closed or the socket failed before sending a request.
    Gone,
}

/// What is wrong with a request head on the lean path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Not complete before the deadline: 408.
    Timeout,
    /// Larger than `server.max_head_bytes`: 431.
    TooLarge,
    /// The client went away.
    Gone,
}

/// Peeks the request line of a fresh connection and decides who serves it.
pub async fn classify(io: &TcpStream, deadline: Instant, max_id_len: usize) -> Class {
    let mut backoff = PEEK_BACKOFF_START;
    loop {
        let mut line = [0u8; PEEK_BYTES];
        let n = match timeout_at(deadline, io.peek(&mut line)).await {
            Err(_) => return Class::Timeout,
            Ok(Ok(0) | Err(_)) => return Class::Gone,
            Ok(Ok(n)) => n,
        };
        match decide(&line[..n], n == PEEK_BYTES, max_id_len) {
            Some(class) => return class,
            None if Instant::now() + backoff >= deadline => return Class::Timeout,
            None => {
                sleep(backoff).await;
                backoff = (backoff * 2).min(PEEK_BACKOFF_MAX);
            }
        }
    }
}

/// Classifies what has been peeked so far; `None` means "need more bytes".
/// `full` says the peek buffer is full, so no more will be looked at.
pub fn decide(buf: &[u8], full: bool, max_id_len: usize) -> Option<Class> {
    let more = || if full { Some(Class::Http) } else { None };
    let k = buf.len().min(DISPATCHER_LINE.len());
    if buf[..k] == DISPATCHER_LINE[..k] {
        return if k == DISPATCHER_LINE.len() {
            Some(Class::Dispatcher)
        } else {
            more()
        };
    }
    let k = buf.len().min(STREAM_PREFIX.len());
    if buf[..k] != STREAM_PREFIX[..k] {
        return Some(Class::Http);
    }
    if buf.len() < STREAM_PREFIX.len() {
        return more();
    }
    let rest = &buf[STREAM_PREFIX.len()..];
    let id_len = rest.iter().take_while(|b| is_id_byte(**b)).count();
    if id_len > max_id_len {
        return Some(Class::Http);
    }
    let mut tail = &rest[id_len..];
    if tail.first() == Some(&b'?') {
        match tail.iter().position(|b| matches!(b, b' ' | b'\r' | b'\n')) {
            Some(end) => tail = &tail[end..],
            None => return more(),
        }
    }
    let k = tail.len().min(HTTP11_SUFFIX.len());
    if tail[..k] != HTTP11_SUFFIX[..k] {
        return Some(Class::Http);
    }
    if tail.len() < HTTP11_SUFFIX.len() {
        return more();
    }
    if id_len == 0 {
        return Some(Class::Http);
    }
    // unwrap: id bytes are ASCII.
    let id = std::str::from_utf8(&rest[..id_len]).expect("ASCII id");
    Some(Class::Stream(Arc::from(id)))
}

/// Reads and discards the request head (up to the blank line) of a connection
/// taken for the lean path. Reads through a small stack buffer not held
/// across an await.
pub async fn consume_head(io: &TcpStream, deadline: Instant, max_head: usize) -> Result<(), HeadError> {
    let mut seen = 0usize;
    let mut matched = 0u8; // how much of "\r\n\r\n" ends what was read
    loop {
        match timeout_at(deadline, io.readable()).await {
            Err(_) => return Err(HeadError::Timeout),
            Ok(Err(_)) => return Err(HeadError::Gone),
            Ok(Ok(())) => {}
        }
        let mut buf = [0u8; 256];
        let n = match io.try_read(&mut buf) {
            Ok(0) => return Err(HeadError::Gone),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return Err(HeadError::Gone),
        };
        for &b in &buf[..n] {
            seen += 1;
            matched = head_end_step(matched, b);
            if matched == 4 {
                return Ok(());
            }
            if seen > max_head {
                return Err(HeadError::TooLarge);
            }
        }
    }
}

/// Answers a request that cannot be served with `status` and a JSON reason,
/// then closes the connection after draining what the client still sends.
pub async fn reject(io: TcpStream, status: &str, reason: &str, stats: &Stats) {
    stats.bad_heads.fetch_add(1, Relaxed);
    let body = serde_json::json!({ "error": reason }).to_string();
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = io.try_write(response.as_bytes());
    close_gently(&io).await;
}

/// Ends our side of `io` and drains what the client still sends for a short
/// while before the socket is dropped: closing a socket with unread bytes
/// makes Linux send a reset, and the client may then lose the answers it
/// has not read yet.
pub async fn close_gently(io: &TcpStream) {
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
pub struct Rewound {
    io: TcpStream,
    /// Read before the hand-over; served first.
    prefix: Vec<u8>,
    /// How much of `prefix` has been served.
    pos: usize,
}

impl Rewound {
    /// A connection nothing has been read from.
    pub fn new(io: TcpStream) -> Self {
        Rewound {
            io,
            prefix: Vec::new(),
            pos: 0,
        }
    }

    /// A connection whose first `prefix` bytes were already read.
    pub fn with_prefix(io: TcpStream, prefix: &[u8]) -> Self {
        Rewound {
            io,
            prefix: prefix.to_vec(),
            pos: 0,
        }
    }

    /// The socket underneath.
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
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
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Option<Class> {
        decide(s.as_bytes(), false, 8)
    }

    #[test]
    fn plain_dispatcher_requests() {
        assert_eq!(d("GET /dispatcher HTTP/1.1\r\n"), Some(Class::Dispatcher));
        assert_eq!(d("GET /dispatch"), None);
    }

    #[test]
    fn lean_requests() {
        assert_eq!(d("GET /test/foo HTTP/1.1\r\n"), Some(Class::Stream("foo".into())));
        assert_eq!(
            d("GET /test/foo?x=1 HTTP/1.1\r\nHost: a\r\n"),
            Some(Class::Stream("foo".into()))
        );
    }

    #[test]
    fn everything_else_goes_to_actix_web() {
        assert_eq!(d("POST /send/foo HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /dispatcher?x HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /dispatcher HTTP/1.0\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/foo HTTP/1.0\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/ HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/a%20b HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/a/b HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/waytoolongid HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("\x16\x03\x01"), Some(Class::Http));
    }

    #[test]
    fn partial_lines_wait_for_more() {
        assert_eq!(d(""), None);
        assert_eq!(d("GET /te"), None);
        assert_eq!(d("GET /test/foo"), None);
        assert_eq!(d("GET /test/foo?x"), None);
        assert_eq!(d("GET /test/foo HTTP/1."), None);
        assert_eq!(decide(b"GET /test/foo?xxxx", true, 8), Some(Class::Http));
    }
}
