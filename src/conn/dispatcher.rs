//! The lean `GET /dispatcher` path: keep-alive connections whose requests
//! are all plain `GET /dispatcher HTTP/1.1` are answered here, without
//! actix-web, and their numbers come from the Counter actor in batches.
//!
//! On actix-web's path both the framework and the hop to the Counter's
//! thread for every request cost (see docs/design-notes.md, section "The
//! lean /dispatcher path"). Here:
//!
//! - A request that is not the plain form (another path, a body, `Expect`,
//!   `Upgrade`, bare LF, a head larger than [`MAX_HEAD_BYTES`]) hands the
//!   connection to actix-web, the bytes already read put back in front
//!   ([`Rewound`]); actix-web serves it and the rest of the connection. So
//!   every other request, valid or not, still gets actix-web's treatment.
//! - Plain requests (several, if pipelined) are consumed and answered with one
//!   write.
//! - Every connection of a worker that wants numbers in the same turn of the
//!   event loop shares one `Take { n }` message to the Counter ([`take`]): the
//!   Counter stays one actor and the count stays exact (each request gets its
//!   own number, gap-free), but the cross-thread hop is paid per batch, not
//!   per request.
//!
//! The same on a TLS port: [`Io`] is the socket, or the socket with its TLS
//! session (its requests decrypted, its answers encrypted).

use std::cell::RefCell;
use std::io::{self, Write as _};
use std::time::Duration;

use actix::Addr;
use actix_rt::net::TcpStream;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use crate::conn::classify::{DISPATCHER_LINE as REQUEST_LINE, HeadError, is_token};
use crate::conn::socket::{self, Rewound};
use crate::conn::tls::{TlsIo, TlsWire};
use crate::conn::wire::{self, Wire};
use crate::counter::{Counter, Take};
use crate::error::ApiError;
use crate::state::ServerState;

/// Largest request head served here. It is also the read buffer every
/// connection on this path holds for its life, so it stays small: a plain
/// `GET /dispatcher` from wrk, curl or a browser is well under 1 KiB. A larger
/// head is not plain by this path's measure and goes to actix-web with the
/// bytes read so far (actix-web answers 431 past its own, larger limit).
const MAX_HEAD_BYTES: usize = 4096;

/// What the bytes at the start of a buffer hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A plain `GET /dispatcher` of `len` bytes; `close` if it asked for
    /// `Connection: close`.
    Plain {
        /// Head length, the blank line included.
        len: usize,
        /// The client asked to close after the answer.
        close: bool,
    },
    /// Could become a plain request; more bytes needed.
    Incomplete,
    /// Anything else: actix-web's to serve.
    Other,
}

/// Reads one request head at the start of `buf`.
pub(crate) fn parse_request(buf: &[u8]) -> Parsed {
    let k = buf.len().min(REQUEST_LINE.len());
    if buf[..k] != REQUEST_LINE[..k] {
        return Parsed::Other;
    }
    if buf.len() < REQUEST_LINE.len() {
        return Parsed::Incomplete;
    }
    let mut pos = REQUEST_LINE.len();
    let mut close = false;
    loop {
        let Some(lf) = buf[pos..].iter().position(|&b| b == b'\n') else {
            return Parsed::Incomplete;
        };
        if lf == 0 || buf[pos + lf - 1] != b'\r' {
            return Parsed::Other; // bare LF
        }
        let line = &buf[pos..pos + lf - 1];
        pos += lf + 1;
        if line.is_empty() {
            return Parsed::Plain { len: pos, close };
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Parsed::Other;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
            return Parsed::Other;
        }
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("content-length") && value != b"0" || is("transfer-encoding") || is("expect") || is("upgrade") {
            return Parsed::Other;
        }
        if is("connection") {
            for token in value.split(|&b| b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::Other;
                }
            }
        }
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// How a connection on this path ended.
pub(crate) enum Outcome {
    /// Closed or to be closed.
    Done,
    /// Its next request is not a plain one: actix-web serves the rest,
    /// starting with the bytes already read.
    HandOff(Rewound),
}

/// What this path reads requests from and writes answers to: the socket
/// itself, or the socket with its TLS session.
pub(crate) trait Io: Wire + Sized {
    /// Reads into `buf` by `deadline`; `None` when nothing came in time.
    async fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Option<io::Result<usize>>;

    /// Writes all of `out`.
    async fn write_all(&mut self, out: &[u8]) -> io::Result<()>;

    /// Ends the connection after its last answer, without a reset.
    async fn close(self);

    /// The connection for actix-web, `read` (bytes read and not served
    /// here) put back in front.
    fn hand_off(self, read: &[u8]) -> Rewound;
}

impl Io for TcpStream {
    /// Past the deadline what is already in the kernel is still read: the
    /// classifier's last look at the deadline can find a head there and
    /// send it here, and tokio, not yet told the socket is readable, would
    /// let the timeout fire before the read (the client then got a reset,
    /// not even a 408).
    async fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Option<io::Result<usize>> {
        if Instant::now() >= deadline {
            // Not `try_read`: it answers from tokio's readiness, which says
            // nothing yet, without asking the kernel.
            return crate::conn::classify::look_now(self, buf, nix::sys::socket::MsgFlags::empty()).map(Ok);
        }
        timeout_at(deadline, self.read(buf)).await.ok()
    }

    async fn write_all(&mut self, out: &[u8]) -> io::Result<()> {
        wire::write_all(self, out).await
    }

    async fn close(self) {
        socket::close_gently(&self).await;
    }

    fn hand_off(self, read: &[u8]) -> Rewound {
        Rewound::with_prefix(self, read)
    }
}

impl Io for TlsWire {
    /// What the session decrypted already comes first (the request line
    /// the classifier read); a record that fails ends the connection.
    async fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Option<io::Result<usize>> {
        if self.session.plain.is_empty() {
            match self.session.read_plain(&self.io, deadline).await {
                Ok(()) => {}
                Err(HeadError::Timeout) => return None,
                Err(HeadError::Gone) => return Some(Ok(0)),
                Err(e) => return Some(Err(io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))),
            }
        }
        Some(Ok(self.session.take_plain(buf)))
    }

    async fn write_all(&mut self, out: &[u8]) -> io::Result<()> {
        let mut sealed = Vec::new();
        self.session
            .encrypt(out, false, &mut sealed)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        wire::write_all(&self.io, &sealed).await
    }

    async fn close(mut self) {
        // A close_notify first, as actix-web's TLS connections end.
        self.write_last(&[]).await;
        socket::close_gently(&self.io).await;
    }

    fn hand_off(mut self, read: &[u8]) -> Rewound {
        let mut plain = read.to_vec();
        plain.append(&mut self.session.plain);
        Rewound::tls(TlsIo::new(self.io, self.session), plain)
    }
}

/// Serves plain `/dispatcher` requests on `io` until the client closes, goes
/// idle past `server.keep_alive_ms`, the server shuts down, or a request of
/// another kind arrives. `deadline` is when the first request's head must be
/// complete (set when the connection was accepted).
pub(crate) async fn serve(mut io: impl Io, state: &ServerState, mut deadline: Instant) -> Outcome {
    let keep_alive = Duration::from_millis(state.settings.server.keep_alive_ms);
    let mut buf = vec![0u8; MAX_HEAD_BYTES];
    let mut filled = 0;
    let mut out = Vec::new();
    loop {
        let n = tokio::select! {
            biased;
            () = state.admission.shutdown.cancelled() => return Outcome::Done,
            r = io.read_by(&mut buf[filled..], deadline) => match r {
                Some(Ok(n)) if n > 0 => n,
                None if filled > 0 => {
                    state.refuse_head(io, HeadError::Timeout).await;
                    return Outcome::Done;
                }
                _ => return Outcome::Done,
            },
        };
        let partial = filled > 0;
        filled += n;
        let (mut len, mut count, mut close, mut other) = (0, 0u64, false, false);
        while len < filled && !close {
            match parse_request(&buf[len..filled]) {
                Parsed::Plain { len: l, close: c } => {
                    len += l;
                    count += 1;
                    close = c;
                }
                Parsed::Incomplete => break,
                Parsed::Other => {
                    other = true;
                    break;
                }
            }
        }
        if count > 0 {
            let close = close || keep_alive.is_zero() || state.admission.shutdown.is_cancelled();
            respond(&mut out, take(&state.counter, count).await, count, close);
            // A client that stops reading gets the head timeout to take its
            // answers, like a client that stops sending.
            let sent = timeout_at(Instant::now() + state.settings.head_timeout(), io.write_all(&out)).await;
            if !matches!(sent, Ok(Ok(()))) {
                return Outcome::Done;
            }
            if close {
                io.close().await;
                return Outcome::Done;
            }
        }
        if other || (len == 0 && filled == buf.len()) {
            return Outcome::HandOff(io.hand_off(&buf[len..filled]));
        }
        buf.copy_within(len..filled, 0);
        filled -= len;
        if filled == 0 {
            deadline = Instant::now() + keep_alive;
        } else if !partial || count > 0 {
            // A request has begun: it has the head timeout to complete.
            deadline = Instant::now() + state.settings.head_timeout();
        }
    }
}

/// Writes the answers to `count` requests into `out`: numbers from `first`
/// on, or 503 for each if the Counter crashed handling the batch.
pub(crate) fn respond(out: &mut Vec<u8>, first: Result<u64, ApiError>, count: u64, close: bool) {
    out.clear();
    let date = crate::conn::http_date::now();
    for i in 0..count {
        let last = i + 1 == count;
        let connection = if close && last {
            "connection: close\r\n"
        } else {
            ""
        };
        // unwrap: writing into a Vec cannot fail.
        match &first {
            Ok(first) => {
                let body = first + i;
                let len = body.checked_ilog10().map_or(1, |d| d as usize + 1);
                write!(
                    out,
                    "HTTP/1.1 200 OK\r\ncontent-length: {len}\r\ncontent-type: text/plain; charset=utf-8\r\n\
                     {connection}date: {date}\r\n\r\n{body}"
                )
            }
            Err(e) => {
                e.write_http1(out, close && last, crate::error::Cors::default());
                Ok(())
            }
        }
        .expect("format into Vec");
    }
}

/// The first of the numbers asked for, or why there are none.
type Numbers = Result<u64, ApiError>;

thread_local! {
    /// The requests of this worker waiting for numbers in this turn of its
    /// event loop: how many each wants, and where its first one goes. Not
    /// empty exactly while a [`flush`] is on its way.
    static BATCH: RefCell<Vec<(u64, oneshot::Sender<Numbers>)>> = const { RefCell::new(Vec::new()) };
}

/// `n` consecutive numbers from the Counter; answers the first (or why
/// not: the Counter crashed, or Redis is unreachable in cluster mode). Calls from the same worker in the same turn of its event
/// loop share one message: the first call spawns the task that sends it,
/// which runs after the tasks already woken, so they join the batch.
pub(crate) async fn take(counter: &Addr<Counter>, n: u64) -> Result<u64, ApiError> {
    let (tx, rx) = oneshot::channel();
    let first = BATCH.with_borrow_mut(|batch| {
        batch.push((n, tx));
        batch.len() == 1
    });
    if first {
        actix_rt::spawn(flush(counter.clone()));
    }
    rx.await.unwrap_or(Err(ApiError::Crashed("counter")))
}

async fn flush(counter: Addr<Counter>) {
    let batch = BATCH.take();
    let total = batch.iter().map(|(n, _)| n).sum();
    let first = counter
        .send(Take { n: total })
        .await
        .unwrap_or(Err(ApiError::Crashed("counter")));
    let mut next = first;
    for (n, tx) in batch {
        let _ = tx.send(next.clone());
        next = next.map(|v| v + n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = "GET /dispatcher HTTP/1.1\r\nHost: a\r\n\r\n";

    /// A server-side socket whose peer has sent `sent`, already in the
    /// kernel, and that tokio has not been told is readable.
    fn arrived(sent: &[u8]) -> (TcpStream, std::net::TcpStream) {
        use std::io::Write as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(sent).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut probe = vec![0u8; sent.len()];
        while !sent.is_empty() && server.peek(&mut probe).unwrap() < sent.len() {}
        server.set_nonblocking(true).unwrap();
        (TcpStream::from_std(server).unwrap(), client)
    }

    /// What the classifier's last look found at the deadline is read, not
    /// timed out; nothing there is a timeout; before the deadline a read
    /// waits as ever.
    #[actix_rt::test]
    async fn a_read_past_the_deadline_takes_what_is_in_the_kernel() {
        let past = Instant::now() - Duration::from_secs(1);
        let mut buf = [0u8; 128];
        let (mut io, _client) = arrived(PLAIN.as_bytes());
        let n = Io::read_by(&mut io, &mut buf, past).await.unwrap().unwrap();
        assert_eq!(&buf[..n], PLAIN.as_bytes());
        assert!(
            Io::read_by(&mut io, &mut buf, past).await.is_none(),
            "nothing more: a timeout"
        );
        let (mut io, _client) = arrived(b"");
        assert!(Io::read_by(&mut io, &mut buf, past).await.is_none());
        let (mut io, _client) = arrived(PLAIN.as_bytes());
        let soon = Instant::now() + Duration::from_secs(5);
        let n = Io::read_by(&mut io, &mut buf, soon).await.unwrap().unwrap();
        assert_eq!(n, PLAIN.len());
    }

    #[test]
    fn plain_requests() {
        assert_eq!(
            parse_request(PLAIN.as_bytes()),
            Parsed::Plain {
                len: PLAIN.len(),
                close: false
            }
        );
        let close =
            "GET /dispatcher HTTP/1.1\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\nGET";
        assert_eq!(
            parse_request(close.as_bytes()),
            Parsed::Plain {
                len: close.len() - 3,
                close: true
            }
        );
        assert_eq!(
            parse_request(b"GET /dispatcher HTTP/1.1\r\n\r\n"),
            Parsed::Plain {
                len: 28,
                close: false
            }
        );
    }

    #[test]
    fn partial_requests_wait() {
        for cut in 1..PLAIN.len() {
            assert_eq!(
                parse_request(&PLAIN.as_bytes()[..cut]),
                Parsed::Incomplete,
                "{cut}"
            );
        }
    }

    #[test]
    fn everything_else_goes_to_actix_web() {
        for req in [
            "GET /dispatcher?x=1 HTTP/1.1\r\n\r\n",
            "GET /dispatcher HTTP/1.0\r\n\r\n",
            "GET /healthz HTTP/1.1\r\n\r\n",
            "POST /dispatcher HTTP/1.1\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "GET /dispatcher HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\nHost: a\n\n",
            "GET /dispatcher HTTP/1.1\r\nno colon\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\n folded: x\r\n\r\n",
            "GET /dispatcher HTTP/1.1\r\nbad name: x\r\n\r\n",
        ] {
            assert_eq!(parse_request(req.as_bytes()), Parsed::Other, "{req:?}");
        }
    }

    #[test]
    fn answers_number_consecutively() {
        let mut out = Vec::new();
        respond(&mut out, Ok(9), 2, true);
        let text = String::from_utf8(out).unwrap();
        let answers: Vec<&str> = text.split("HTTP/1.1 ").skip(1).collect();
        assert_eq!(answers.len(), 2);
        assert!(
            answers[0].starts_with("200 OK\r\ncontent-length: 1\r\n"),
            "{text}"
        );
        assert!(answers[0].ends_with("\r\n\r\n9"), "{text}");
        assert!(!answers[0].contains("connection: close"));
        assert!(
            answers[1].starts_with("200 OK\r\ncontent-length: 2\r\n"),
            "{text}"
        );
        assert!(answers[1].contains("connection: close\r\n"));
        assert!(answers[1].ends_with("\r\n\r\n10"), "{text}");
    }

    #[test]
    fn a_crashed_counter_answers_503() {
        let mut out = Vec::new();
        respond(&mut out, Err(ApiError::Crashed("counter")), 1, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{text}");
        assert!(text.ends_with("\"}"), "{text}");
    }
}

/// Property tests: the `/dispatcher` parser never panics on arbitrary bytes,
/// its answer does not depend on how the bytes arrived, and generated heads
/// are classified as the rules written out plainly say.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Header lines near the cases the parser treats specially.
    fn header() -> impl Strategy<Value = (String, String)> {
        let name = prop_oneof![
            Just("Host".to_owned()),
            Just("Connection".to_owned()),
            Just("content-length".to_owned()),
            Just("Transfer-Encoding".to_owned()),
            Just("Expect".to_owned()),
            Just("Upgrade".to_owned()),
            "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}",
        ];
        let value = prop_oneof![
            Just("close".to_owned()),
            Just("keep-alive, Close".to_owned()),
            Just("upgrade".to_owned()),
            Just("0".to_owned()),
            Just("12".to_owned()),
            "[ -~]{0,16}",
        ];
        (name, value)
    }

    /// What a plain head means by the rules in the module docs: any header
    /// that may bring a body or change the protocol makes it actix-web's;
    /// `Connection: close` (as one of its tokens) asks to close.
    fn reference(headers: &[(String, String)]) -> Option<bool> {
        let mut close = false;
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            let value = value.trim_matches(|c: char| c.is_ascii_whitespace());
            let tokens = || value.split(',').map(|t| t.trim().to_ascii_lowercase());
            match name.as_str() {
                "content-length" if value != "0" => return None,
                "transfer-encoding" | "expect" | "upgrade" => return None,
                "connection" if tokens().any(|t| t == "upgrade") => return None,
                "connection" => close |= tokens().any(|t| t == "close"),
                _ => {}
            }
        }
        Some(close)
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Arbitrary bytes: no panic; a complete answer is final (more bytes
        /// do not change it) and `Plain` never claims more than it was given.
        #[test]
        fn answers_are_final(bytes in proptest::collection::vec(any::<u8>(), 0..200), prefix in any::<bool>()) {
            let mut bytes = bytes;
            if prefix {
                let mut b = REQUEST_LINE.to_vec();
                b.extend_from_slice(&bytes);
                bytes = b;
            }
            let whole = parse_request(&bytes);
            if let Parsed::Plain { len, .. } = whole {
                prop_assert!(len <= bytes.len());
            }
            for k in 0..bytes.len() {
                match parse_request(&bytes[..k]) {
                    Parsed::Incomplete => {}
                    early => {
                        prop_assert_eq!(early, whole, "prefix of {} bytes", k);
                        break;
                    }
                }
            }
        }

        /// Generated heads: plain or not, and `close`, as the reference says;
        /// every proper prefix of a plain head is incomplete.
        #[test]
        fn heads_agree_with_the_reference(
            headers in proptest::collection::vec(header(), 0..6),
            after in "[ -~]{0,30}",
        ) {
            let mut head = String::from_utf8(REQUEST_LINE.to_vec()).unwrap();
            for (name, value) in &headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let bytes = format!("{head}{after}").into_bytes();
            let expected = match reference(&headers) {
                Some(close) => Parsed::Plain { len: head.len(), close },
                None => Parsed::Other,
            };
            prop_assert_eq!(parse_request(&bytes), expected);
            if reference(&headers).is_some() {
                for k in 0..head.len() {
                    prop_assert_eq!(parse_request(&bytes[..k]), Parsed::Incomplete, "prefix of {} bytes", k);
                }
            }
        }
    }
}
