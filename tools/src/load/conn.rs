//! One loadtest connection: keeps up to `pipeline` requests in flight, parses
//! responses as they complete, reconnects after failures.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::report::{Outcome, Tally};
use super::{Job, Queue, Shape};
use crate::flood::report::ErrorKind;
use crate::http;

/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// Pause after a failed connect, so a dead server is not hammered in a loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

/// Where a connection's requests come from.
trait Source {
    /// What identifies a request until it completes.
    type Token;
    /// A request to send now, if there is one.
    fn take(&self) -> Option<Self::Token>;

    /// Waits for more requests; false when there will be none.
    async fn wait(&self) -> bool;
    /// A request finished.
    fn complete(&self, token: Self::Token, outcome: Outcome, latency: Duration);
}

/// wrk-style: requests until the deadline.
struct Until {
    deadline: Instant,
    tally: Rc<RefCell<Tally>>,
}

impl Source for Until {
    type Token = ();
    fn take(&self) -> Option<()> {
        (Instant::now() < self.deadline).then_some(())
    }
    async fn wait(&self) -> bool {
        false
    }
    fn complete(&self, (): (), outcome: Outcome, latency: Duration) {
        self.tally.borrow_mut().record(outcome, latency);
    }
}

/// ibrowse-style: requests from the workers' shared queue.
struct FromQueue {
    queue: Rc<Queue>,
    tally: Rc<RefCell<Tally>>,
}

impl Source for FromQueue {
    type Token = Job;
    fn take(&self) -> Option<Job> {
        self.queue.jobs.borrow_mut().pop_front()
    }
    async fn wait(&self) -> bool {
        loop {
            if !self.queue.jobs.borrow().is_empty() {
                return true;
            }
            if self.queue.closed.get() {
                return false;
            }
            self.queue.ready.notified().await;
        }
    }
    fn complete(&self, job: Job, outcome: Outcome, latency: Duration) {
        self.tally.borrow_mut().record(outcome, latency);
        let _ = job.done.send(outcome);
    }
}

/// Runs one connection until `deadline`.
pub(super) async fn run_until(shape: Shape, deadline: Instant, tally: Rc<RefCell<Tally>>) {
    drive(&shape, &Until { deadline, tally }).await;
}

/// Runs one pooled connection serving the workers' queue until it closes.
pub(super) async fn serve_queue(shape: Shape, queue: Rc<Queue>, tally: Rc<RefCell<Tally>>) {
    drive(&shape, &FromQueue { queue, tally }).await;
}

/// An open connection and its unparsed input.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

async fn drive<S: Source>(shape: &Shape, source: &S) {
    let deadline = tokio::time::sleep(shape.timeout);
    tokio::pin!(deadline);
    let mut conn: Option<Conn> = None;
    let mut inflight: VecDeque<(S::Token, Instant)> = VecDeque::new();
    let mut out: Vec<u8> = Vec::with_capacity(shape.request.len() * shape.pipeline);
    loop {
        // Take requests first, connect after: a connection is opened only for
        // a request this task holds (another task cannot take it meanwhile).
        out.clear();
        while inflight.len() < shape.pipeline {
            let Some(t) = source.take() else { break };
            out.extend_from_slice(&shape.request);
            inflight.push_back((t, Instant::now()));
        }
        if inflight.is_empty() {
            if source.wait().await {
                continue;
            }
            return;
        }
        if conn.is_none() {
            match TcpStream::connect(shape.target.addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    conn = Some(Conn {
                        stream,
                        buf: Vec::with_capacity(READ_CHUNK),
                    });
                }
                Err(e) => {
                    fail_all(source, &mut inflight, ErrorKind::of(&e));
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            }
        }
        // unwrap: set just above.
        let c = conn.as_mut().expect("connected");
        // Pushing a pending deadline later is a cheap state update in tokio
        // (no timer-wheel re-insert), unlike a fresh `timeout` per request.
        deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + shape.timeout);
        match exchange(c, &out, &mut inflight, source, deadline.as_mut()).await {
            Ok(true) if !shape.close => {}
            Ok(_) => {
                // The connection ends here: what it still carried is lost.
                fail_all(source, &mut inflight, ErrorKind::Eof);
                conn = None;
            }
            Err(kind) => {
                fail_all(source, &mut inflight, kind);
                conn = None;
            }
        }
    }
}

/// Completes every request in flight as failed with `kind`.
fn fail_all<S: Source>(source: &S, inflight: &mut VecDeque<(S::Token, Instant)>, kind: ErrorKind) {
    for (t, sent) in inflight.drain(..) {
        source.complete(t, Outcome::Error(kind), sent.elapsed());
    }
}

/// Writes `out`, then reads until at least one response completed, giving up
/// at `deadline`. Returns whether the connection may be reused.
async fn exchange<S: Source>(
    c: &mut Conn,
    out: &[u8],
    inflight: &mut VecDeque<(S::Token, Instant)>,
    source: &S,
    mut deadline: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Result<bool, ErrorKind> {
    if !out.is_empty() {
        tokio::select! {
            r = c.stream.write_all(out) => r.map_err(|e| ErrorKind::of(&e))?,
            () = &mut deadline => return Err(ErrorKind::Timeout),
        }
    }
    let mut completed = 0;
    loop {
        // Parse what is buffered.
        let mut at = 0;
        while let Some(parsed) = http::parse_response(&c.buf[at..]).map_err(|_| ErrorKind::Protocol)? {
            at += parsed.len;
            let Some((t, sent)) = inflight.pop_front() else {
                return Err(ErrorKind::Protocol);
            };
            source.complete(t, outcome(&parsed), sent.elapsed());
            completed += 1;
            if parsed.close {
                c.buf.drain(..at);
                return Ok(false);
            }
        }
        c.buf.drain(..at);
        if completed > 0 {
            return Ok(true);
        }
        c.buf.reserve(READ_CHUNK);
        let read = tokio::select! {
            r = c.stream.read_buf(&mut c.buf) => r,
            () = &mut deadline => return Err(ErrorKind::Timeout),
        };
        match read {
            Ok(0) => return Err(ErrorKind::Eof),
            Ok(_) => {}
            Err(e) => return Err(ErrorKind::of(&e)),
        }
    }
}

/// Success is a 2xx with a body; anything else is an error of its kind.
fn outcome(r: &http::Response) -> Outcome {
    match r.status {
        200..=299 if r.len > r.body_start => Outcome::Success,
        200..=299 => Outcome::Error(ErrorKind::Protocol),
        status => Outcome::Error(ErrorKind::Status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        let parse = |b: &[u8]| http::parse_response(b).unwrap().unwrap();
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n12HTTP/1.1 503 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let first = parse(r);
        assert_eq!(outcome(&first), Outcome::Success);
        let second = parse(&r[first.len..]);
        assert_eq!(outcome(&second), Outcome::Error(ErrorKind::Status(503)));
        assert!(second.close);
        assert_eq!(http::parse_response(&r[..first.len - 1]).unwrap(), None);
        assert!(http::parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        let empty = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(outcome(&empty), Outcome::Error(ErrorKind::Protocol));
    }
}
