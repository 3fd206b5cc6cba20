//! Where a Stream's events go: straight onto its own socket (lean path) or into
//! the queue behind an actix-web streaming body (fallback path).
//!
//! Slow-client policy, in one place: each sink holds at most
//! `stream.max_pending_bytes` of output the client has not taken yet. An event
//! that would pass the bound is refused with [`SinkError::Full`] and the
//! Stream disconnects the client: memory per stream stays bounded, and a
//! client that cannot keep up learns it (the connection ends) instead of
//! silently missing events.
//!
//! The message books, in one place too: a message handed to a stream is
//! `messages.delivered` (counted by the Router); it is then `written` once all
//! its bytes reach the kernel (or actix-web takes it from the body queue), or
//! `dropped` if the stream ends first, slow or gone. So at rest
//! `delivered = written + dropped`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use actix_rt::net::TcpStream;
use bytes::Bytes;

use crate::conn::socket::CloseHandle;
use crate::conn::tls::{Protection, Session};
use crate::stats::Stats;

/// The last chunk of a chunked body.
const FINAL_CHUNK: &[u8] = b"0\r\n\r\n";

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SinkError {
    /// The client is gone.
    Closed,
    /// The client is not reading and the pending bound is reached.
    Full,
}

/// What became of a write that succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// All of it is with the kernel (or the body queue).
    Done,
    /// Part waits in the pending buffer: a flush must be driven.
    Pending,
}

/// How a lean stream's body is framed. Kept by the Stream, beside its other
/// flag, not in the sink: there it would cost 8 bytes of every stream's
/// task cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// HTTP/1.1: one chunk per event, a final zero-length chunk at the end.
    Chunked,
    /// HTTP/1.0 (no chunked encoding, RFC 9112 §6.1) and WebSocket (frames
    /// delimit themselves): the bytes as they are; closing the connection
    /// ends the body.
    Close,
}

/// What an event is, for the message books (`messages.written`/`.dropped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// A routed message: counted written once all its bytes reach the
    /// kernel (or actix-web takes it from the body queue), dropped if the
    /// stream ends first. When this node accepted it, for the latency
    /// histogram; `None` for a replay from history.
    Message(Option<Instant>),
    /// The welcome line or a tick.
    Other,
}

/// Bytes the kernel would not take yet, and where the messages among them end.
#[derive(Default)]
pub(crate) struct Pending {
    /// The bytes, oldest first.
    bytes: Vec<u8>,
    /// Bytes already moved from `bytes` to the kernel.
    drained: usize,
    /// For each message not yet wholly with the kernel: `drained` plus its
    /// end within `bytes` at the time, i.e. where it ends in the same count;
    /// and when it was accepted.
    ends: VecDeque<(usize, Option<Instant>)>,
}

impl Pending {
    /// `n` more bytes reached the kernel; counts the messages now complete.
    fn drain(&mut self, n: usize, stats: &Stats) {
        self.bytes.drain(..n);
        self.drained += n;
        while let Some(&(end, accepted)) = self.ends.front()
            && end <= self.drained
        {
            self.ends.pop_front();
            stats.message_written(accepted);
        }
    }
}

/// An event destination.
pub(crate) enum Sink {
    /// Lean path: the Stream owns the socket and frames events itself.
    Socket {
        /// The client connection.
        io: TcpStream,
        /// Bytes the kernel would not take yet (bounded); `None` when idle,
        /// and deallocated as soon as it drains. Boxed: 8 bytes in the
        /// Stream's task cell, for a buffer most streams never use.
        pending: Option<Box<Pending>>,
    },
    /// Fallback path: actix-web's HTTP/1 dispatcher reads a [`BodyStream`].
    Body(Rc<RefCell<BodyQueue>>),
    /// Lean path on a TLS port: events are encrypted here and then go as
    /// on [`Sink::Socket`]. All boxed: a variant as large as `Socket`
    /// would cost the enum a tag, 8 bytes in every stream's task cell.
    Tls(Box<TlsSink>),
}

/// A TLS stream's socket, session and pending ciphertext.
pub(crate) struct TlsSink {
    io: TcpStream,
    session: Protection,
    pending: Option<Box<Pending>>,
}

thread_local! {
    /// A worker's scratch for sealing a TLS stream's event: its plaintext
    /// and its ciphertext. A broadcast seals once per TLS stream; with
    /// these it allocates no buffer for it.
    static SEALING: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Encrypts `parts` as one record (and a close_notify with `close`) and
/// hands the ciphertext to `then`.
fn sealed<T>(
    session: &mut Protection,
    parts: &[&[u8]],
    close: bool,
    then: impl FnOnce(&[u8]) -> T,
) -> Result<T, SinkError> {
    SEALING.with_borrow_mut(|(plain, out)| {
        plain.clear();
        out.clear();
        for part in parts {
            plain.extend_from_slice(part);
        }
        session
            .encrypt(plain, close, out)
            .map_err(|_| SinkError::Closed)?;
        Ok(then(out))
    })
}

impl Sink {
    /// A lean sink; `open` writes the response head.
    pub(crate) fn socket(io: TcpStream) -> Self {
        Sink::Socket { io, pending: None }
    }

    /// A lean sink on a TLS connection whose head was read.
    pub(crate) fn tls(io: TcpStream, session: Session) -> Self {
        Sink::Tls(Box::new(TlsSink {
            io,
            session: Protection::of(session),
            pending: None,
        }))
    }

    /// A fallback sink and the body actix-web should stream.
    pub(crate) fn body(stats: Arc<Stats>, close: Option<CloseHandle>) -> (Self, BodyStream) {
        let queue = Rc::new(RefCell::new(BodyQueue::new(stats, close)));
        (Sink::Body(Rc::clone(&queue)), BodyStream(queue))
    }

    /// Writes what precedes the first event (the lean response head).
    pub(crate) fn open(
        &mut self,
        head: &[u8],
        max_pending: usize,
        stats: &Stats,
    ) -> Result<Written, SinkError> {
        match self {
            Sink::Socket { io, pending } => {
                write_all(io, pending, &[head], Counted::Other, max_pending, stats)
            }
            Sink::Tls(tls) => {
                let TlsSink { io, session, pending } = &mut **tls;
                sealed(session, &[head], false, |c| {
                    write_all(io, pending, &[c], Counted::Other, max_pending, stats)
                })?
            }
            Sink::Body(_) => Ok(Written::Done),
        }
    }

    /// Sends one event; `line` ends with `\n` and becomes one chunk (or, on
    /// HTTP/1.0, is written as it is). A message wholly with the kernel at
    /// once is counted written here; one left pending, when it drains.
    pub(crate) fn push_line(
        &mut self,
        line: &[u8],
        framing: Framing,
        event: Counted,
        max_pending: usize,
        stats: &Stats,
    ) -> Result<Written, SinkError> {
        match self {
            Sink::Socket { io, pending } if framing == Framing::Close => {
                write_all(io, pending, &[line], event, max_pending, stats)
            }
            Sink::Socket { io, pending } => {
                let mut head = [0u8; 18];
                let head = chunk_head(line.len(), &mut head);
                write_all(io, pending, &[head, line, b"\r\n"], event, max_pending, stats)
            }
            Sink::Tls(tls) => {
                let mut head = [0u8; 18];
                let parts: &[&[u8]] = match framing {
                    Framing::Close => &[line],
                    Framing::Chunked => &[chunk_head(line.len(), &mut head), line, b"\r\n"],
                };
                // Refused before it is sealed: a sealed record thrown away
                // would leave a gap in the record numbers, and the final
                // chunk after it would reach the client as a bad record.
                let waiting = tls.pending.as_ref().map_or(0, |p| p.bytes.len());
                let plain: usize = parts.iter().map(|p| p.len()).sum();
                let sealed_at_most = plain + 64 * (plain / 16_384 + 1);
                if waiting > 0 && waiting + sealed_at_most > max_pending {
                    return Err(SinkError::Full);
                }
                let TlsSink { io, session, pending } = &mut **tls;
                sealed(session, parts, false, |c| {
                    write_all(io, pending, &[c], event, max_pending, stats)
                })?
            }
            Sink::Body(queue) => queue.borrow_mut().push(line, event, max_pending),
        }
    }

    /// Moves pending bytes to the kernel; ready when none are left.
    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>, stats: &Stats) -> Poll<Result<(), SinkError>> {
        let (io, pending) = match self {
            Sink::Socket { io, pending } => (&*io, pending),
            Sink::Tls(tls) => (&tls.io, &mut tls.pending),
            Sink::Body(_) => return Poll::Ready(Ok(())),
        };
        let Some(p) = pending else {
            return Poll::Ready(Ok(()));
        };
        while !p.bytes.is_empty() {
            match io.poll_write_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(SinkError::Closed)),
                Poll::Ready(Ok(())) => {}
            }
            match io.try_write(&p.bytes) {
                Ok(n) => p.drain(n, stats),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Poll::Ready(Err(SinkError::Closed)),
            }
        }
        *pending = None;
        Poll::Ready(Ok(()))
    }

    /// Whether bytes wait for the socket (a flush must be driven).
    pub(crate) fn is_pending(&self) -> bool {
        let pending = match self {
            Sink::Socket { pending, .. } => pending,
            Sink::Tls(tls) => &tls.pending,
            Sink::Body(_) => return false,
        };
        pending.as_ref().is_some_and(|p| !p.bytes.is_empty())
    }

    /// Messages handed to this sink that have not reached the kernel (they
    /// are dropped if the stream ends now). The body queue counts its own
    /// when it goes.
    pub(crate) fn pending_messages(&self) -> usize {
        match self {
            Sink::Socket { pending, .. } => pending.as_ref().map_or(0, |p| p.ends.len()),
            Sink::Tls(tls) => tls.pending.as_ref().map_or(0, |p| p.ends.len()),
            Sink::Body(_) => 0,
        }
    }

    /// What the client sends after its request head: `Ready(Some(n))` when
    /// `n` bytes were read into `scratch`, `Ready(None)` once the client has
    /// gone (EOF or an error on the read side of the socket, or actix-web
    /// dropping the body), `Pending` until either.
    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        scratch: &mut [u8],
        stats: &Stats,
    ) -> Poll<Option<usize>> {
        match self {
            Sink::Socket { io, .. } => read_socket(io, cx, scratch),
            Sink::Tls(tls) => loop {
                let io = &tls.io;
                if tls.session.has_plain() {
                    return Poll::Ready(Some(tls.session.take_plain(scratch)));
                }
                if tls.session.peer_closed() {
                    return Poll::Ready(None);
                }
                match read_socket(io, cx, scratch) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Ready(Some(n)) => {
                        let mut out = Vec::new();
                        if tls.session.received(&scratch[..n], &mut out).is_err() {
                            return Poll::Ready(None);
                        }
                        // TLS's own answer (a TLS 1.2 session's warning
                        // alert) goes in order with the events.
                        if !out.is_empty()
                            && write_all(io, &mut tls.pending, &[&out], Counted::Other, usize::MAX, stats)
                                .is_err()
                        {
                            return Poll::Ready(None);
                        }
                    }
                }
            },
            Sink::Body(queue) => {
                let mut q = queue.borrow_mut();
                if q.reader_gone {
                    Poll::Ready(None)
                } else {
                    q.watcher = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }

    /// Ends the body cleanly: what is pending and the final zero-length
    /// chunk (none on HTTP/1.0, where closing ends the body), best effort:
    /// a client that is not reading may not get it.
    pub(crate) fn finish(&mut self, framing: Framing, stats: &Stats) {
        match self {
            Sink::Socket { io, pending } => {
                let end: &[u8] = match framing {
                    Framing::Chunked => FINAL_CHUNK,
                    Framing::Close => b"",
                };
                match pending {
                    Some(p) if !p.bytes.is_empty() => {
                        p.bytes.extend_from_slice(end);
                        if let Ok(n) = io.try_write(&p.bytes) {
                            p.drain(n, stats);
                        }
                    }
                    _ => {
                        let _ = io.try_write(end);
                    }
                }
            }
            Sink::Tls(tls) => {
                let end: &[u8] = match framing {
                    Framing::Chunked => FINAL_CHUNK,
                    Framing::Close => b"",
                };
                let TlsSink { io, session, pending } = &mut **tls;
                let _ = sealed(session, &[end], true, |c| match pending {
                    Some(p) if !p.bytes.is_empty() => {
                        p.bytes.extend_from_slice(c);
                        if let Ok(n) = io.try_write(&p.bytes) {
                            p.drain(n, stats);
                        }
                    }
                    _ => {
                        let _ = io.try_write(c);
                    }
                });
            }
            Sink::Body(queue) => {
                let mut q = queue.borrow_mut();
                q.done = true;
                if let Some(w) = q.reader.take() {
                    w.wake();
                }
            }
        }
    }
}

impl Drop for Sink {
    /// A fallback sink whose Stream stops without [`Sink::finish`] (too slow,
    /// or gone) aborts its body: actix-web then drops the connection instead
    /// of waiting on a body that will never end. (A lean sink's socket
    /// closes with it.)
    fn drop(&mut self) {
        if let Sink::Body(queue) = self {
            let mut q = queue.borrow_mut();
            if !q.done {
                q.aborted = true;
                if let Some(w) = q.reader.take() {
                    w.wake();
                }
                if let Some(close) = &q.close {
                    close.close();
                }
            }
        }
    }
}

/// Reads what the socket has: `Ready(Some(n))` bytes into `scratch`,
/// `Ready(None)` at EOF or an error, `Pending` until either.
fn read_socket(io: &TcpStream, cx: &mut Context<'_>, scratch: &mut [u8]) -> Poll<Option<usize>> {
    loop {
        match io.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(None),
            Poll::Ready(Ok(())) => {}
        }
        match io.try_read(scratch) {
            Ok(0) => return Poll::Ready(None),
            Ok(n) => return Poll::Ready(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(None),
        }
    }
}

/// Writes `parts` in one `writev`; what the kernel does not take goes to
/// `pending`, unless that would pass `max_pending`. A message is counted
/// written if it all went, else its end is noted in `pending`.
fn write_all(
    io: &TcpStream,
    pending: &mut Option<Box<Pending>>,
    parts: &[&[u8]],
    event: Counted,
    max_pending: usize,
    stats: &Stats,
) -> Result<Written, SinkError> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = 0;
    let waiting = pending.as_ref().map_or(0, |p| p.bytes.len());
    if waiting == 0 {
        let slices: [IoSlice<'_>; 3] =
            std::array::from_fn(|i| IoSlice::new(parts.get(i).copied().unwrap_or_default()));
        match io.try_write_vectored(&slices[..parts.len()]) {
            Ok(n) if n == total => {
                if let Counted::Message(accepted) = event {
                    stats.message_written(accepted);
                }
                return Ok(Written::Done);
            }
            Ok(n) => written = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(SinkError::Closed),
        }
    }
    if waiting + (total - written) > max_pending {
        return Err(SinkError::Full);
    }
    let p = pending.get_or_insert_with(Default::default);
    let mut skip = written;
    for part in parts {
        let s = skip.min(part.len());
        p.bytes.extend_from_slice(&part[s..]);
        skip -= s;
    }
    if let Counted::Message(accepted) = event {
        p.ends.push_back((p.drained + p.bytes.len(), accepted));
    }
    Ok(Written::Pending)
}

/// Formats the `{len:x}\r\n` line of a chunk into `buf`.
fn chunk_head(len: usize, buf: &mut [u8; 18]) -> &[u8] {
    use std::io::Write;
    let mut cursor = io::Cursor::new(&mut buf[..]);
    // unwrap: 16 hex digits + CRLF always fit in 18 bytes.
    write!(cursor, "{len:x}\r\n").expect("chunk head fits");
    let n = cursor.position() as usize;
    &buf[..n]
}

/// The queue between a fallback Stream and actix-web's body. Both ends live on
/// the same worker thread, hence `Rc<RefCell<_>>` and no channel.
pub(crate) struct BodyQueue {
    /// Event lines not yet taken by actix-web's HTTP/1 dispatcher; each
    /// becomes one chunk. What each is, for the message books.
    lines: VecDeque<(Bytes, Counted)>,
    /// Total bytes in `lines`, held under the pending bound.
    bytes: usize,
    /// The Stream has ended; the body ends once `lines` is drained.
    done: bool,
    /// The Stream stopped without ending the body (client too slow, or
    /// gone): the body fails, and the connection is closed.
    aborted: bool,
    /// Closes the connection under the body: actix-web polls the body only
    /// when the socket takes bytes, so a client that stopped reading would
    /// never let it see the failure.
    close: Option<CloseHandle>,
    /// actix-web dropped the body (client gone).
    reader_gone: bool,
    /// Wakes actix-web's HTTP/1 dispatcher when there is data or the end.
    reader: Option<Waker>,
    /// Wakes the Stream's watcher when the reader goes.
    watcher: Option<Waker>,
    /// Where messages taken by actix-web are counted written, and the ones
    /// left when the queue goes, dropped.
    stats: Arc<Stats>,
}

impl BodyQueue {
    fn new(stats: Arc<Stats>, close: Option<CloseHandle>) -> Self {
        BodyQueue {
            lines: VecDeque::new(),
            bytes: 0,
            done: false,
            aborted: false,
            close,
            reader_gone: false,
            reader: None,
            watcher: None,
            stats,
        }
    }

    fn push(&mut self, line: &[u8], event: Counted, max_pending: usize) -> Result<Written, SinkError> {
        if self.reader_gone {
            return Err(SinkError::Closed);
        }
        if self.bytes + line.len() > max_pending {
            return Err(SinkError::Full);
        }
        self.bytes += line.len();
        self.lines.push_back((Bytes::copy_from_slice(line), event));
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        Ok(Written::Done)
    }
}

impl Drop for BodyQueue {
    fn drop(&mut self) {
        let left = self
            .lines
            .iter()
            .filter(|(_, e)| matches!(e, Counted::Message(_)))
            .count();
        self.stats.messages_dropped.fetch_add(left as u64, Relaxed);
    }
}

/// The body of a fallback stream response.
pub(crate) struct BodyStream(Rc<RefCell<BodyQueue>>);

/// Why a fallback stream's body ends in error: its Stream was cut.
#[derive(Debug, thiserror::Error)]
#[error("stream cut: the client did not keep up")]
pub(crate) struct Aborted;

impl futures_core::Stream for BodyStream {
    type Item = Result<Bytes, Aborted>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut q = self.0.borrow_mut();
        if q.aborted {
            return Poll::Ready(Some(Err(Aborted)));
        }
        if let Some((line, event)) = q.lines.pop_front() {
            q.bytes -= line.len();
            if let Counted::Message(accepted) = event {
                q.stats.message_written(accepted);
            }
            Poll::Ready(Some(Ok(line)))
        } else if q.done {
            Poll::Ready(None)
        } else {
            q.reader = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

impl Drop for BodyStream {
    fn drop(&mut self) {
        let mut q = self.0.borrow_mut();
        q.reader_gone = true;
        if let Some(w) = q.watcher.take() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_heads() {
        let mut b = [0u8; 18];
        assert_eq!(chunk_head(0x1a, &mut b), b"1a\r\n");
        assert_eq!(chunk_head(usize::MAX, &mut b), b"ffffffffffffffff\r\n");
    }
}
