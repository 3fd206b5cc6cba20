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
use std::time::Duration;

use actix_rt::net::TcpStream;
use tokio::time::{Instant, sleep, timeout_at};

use crate::id::is_id_byte;

/// How much of the request line is peeked. Larger lines go to actix-web. Kept
/// small because this buffer lives in every connection's future while it is
/// being classified.
pub(crate) const PEEK_BYTES: usize = 128;

/// First wait before peeking again when the request line is incomplete
/// (peek leaves the socket readable, so waiting for readiness would spin).
const PEEK_BACKOFF_START: Duration = Duration::from_millis(1);

/// Longest wait between peeks.
const PEEK_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// What a lean stream's request line starts with.
const STREAM_PREFIX: &[u8] = b"GET /test/";

/// The request line the lean `/dispatcher` path serves (see
/// [`crate::dispatcher`], which serves every later request on the
/// connection with the same line).
pub(crate) const DISPATCHER_LINE: &[u8] = b"GET /dispatcher HTTP/1.1\r\n";

/// How a lean stream's request line ends.
const HTTP11_SUFFIX: &[u8] = b" HTTP/1.1\r\n";

/// Who serves a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Class {
    /// A lean stream for this id.
    Stream(Arc<str>),
    /// A plain `GET /dispatcher` first: [`crate::dispatcher`].
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
pub(crate) enum HeadError {
    /// Not complete before the deadline: 408.
    Timeout,
    /// Larger than `server.max_head_bytes`: 431.
    TooLarge,
    /// The client went away.
    Gone,
}

/// Peeks the request line of a fresh connection and decides who serves it.
pub(crate) async fn classify(io: &TcpStream, deadline: Instant, max_id_len: usize) -> Class {
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
pub(crate) fn decide(buf: &[u8], full: bool, max_id_len: usize) -> Option<Class> {
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

/// Advances a matcher for the blank line that ends a head: `matched` is how
/// much of `"\r\n\r\n"` the bytes so far end with; 4 means the head is over.
fn head_end_step(matched: u8, b: u8) -> u8 {
    match (matched, b) {
        (0 | 2, b'\r') | (1 | 3, b'\n') => matched + 1,
        (_, b'\r') => 1,
        _ => 0,
    }
}

/// Finds the end of a request head in bytes that arrive piece by piece,
/// keeping two numbers of state (nothing is buffered).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct HeadScan {
    /// Bytes of the head seen so far.
    seen: usize,
    /// How much of `"\r\n\r\n"` the bytes so far end with.
    matched: u8,
}

/// What [`HeadScan::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scanned {
    /// Not over yet: every byte fed belongs to the head.
    More,
    /// The head ends this many bytes into the piece just fed.
    End(usize),
    /// The head is longer than the limit.
    TooLarge,
}

impl HeadScan {
    /// Feeds the next piece of the connection; `max_head` bounds the head.
    pub(crate) fn feed(&mut self, piece: &[u8], max_head: usize) -> Scanned {
        for (i, &b) in piece.iter().enumerate() {
            self.seen += 1;
            if self.seen > max_head {
                return Scanned::TooLarge;
            }
            self.matched = head_end_step(self.matched, b);
            if self.matched == 4 {
                return Scanned::End(i + 1);
            }
        }
        Scanned::More
    }
}

/// Reads and discards the request head (up to the blank line) of a connection
/// taken for the lean path. Reads through a small stack buffer not held
/// across an await. (A client sends nothing after its head before it has
/// the response, so reading past the head's end loses nothing.)
pub(crate) async fn consume_head(
    io: &TcpStream,
    deadline: Instant,
    max_head: usize,
) -> Result<(), HeadError> {
    let mut scan = HeadScan::default();
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
        match scan.feed(&buf[..n], max_head) {
            Scanned::More => {}
            Scanned::End(_) => return Ok(()),
            Scanned::TooLarge => return Err(HeadError::TooLarge),
        }
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

    #[test]
    fn head_end() {
        let head = b"GET / HTTP/1.1\r\nx: y\r\r\n\r\nrest";
        assert_eq!(HeadScan::default().feed(head, 1000), Scanned::End(25));
        // Exactly at the limit is accepted; one byte more is not.
        assert_eq!(HeadScan::default().feed(head, 25), Scanned::End(25));
        assert_eq!(HeadScan::default().feed(head, 24), Scanned::TooLarge);
    }
}

/// Property tests: for arbitrary bytes, and arbitrary splits of valid input
/// into the pieces TCP may deliver, the classifier and the head scanner never
/// panic and agree with a straightforward reference.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::id;

    /// The id length limit the properties use (small, so it is often crossed).
    const MAX_ID: usize = 12;

    /// What a request line means, by the rules written out plainly: a lean
    /// stream is `GET /test/<id>[?query] HTTP/1.1` with a valid id, fitting the
    /// peek buffer; the lean `/dispatcher` line is exactly that line; every
    /// other line is actix-web's.
    fn reference(line: &[u8]) -> Class {
        if line == DISPATCHER_LINE {
            return Class::Dispatcher;
        }
        let stream = (|| {
            if line.len() > PEEK_BYTES {
                return None;
            }
            let text = std::str::from_utf8(line).ok()?;
            let target = text.strip_prefix("GET ")?.strip_suffix(" HTTP/1.1\r\n")?;
            let path = target.split_once('?').map_or(target, |(path, _)| path);
            let id = path.strip_prefix("/test/")?;
            if target.contains([' ', '\r', '\n']) || id::validate(id, MAX_ID).is_err() {
                return None;
            }
            Some(Class::Stream(Arc::from(id)))
        })();
        stream.unwrap_or(Class::Http)
    }

    /// What the classifier decides when `bytes` have arrived: it peeks at
    /// most [`PEEK_BYTES`] of them.
    fn decide_arrived(bytes: &[u8]) -> Option<Class> {
        let n = bytes.len().min(PEEK_BYTES);
        decide(&bytes[..n], n == PEEK_BYTES, MAX_ID)
    }

    /// Request lines near the interesting cases: stream and dispatcher lines,
    /// their near misses, and noise.
    fn request_line() -> impl Strategy<Value = Vec<u8>> {
        let id = "[A-Za-z0-9._~%/-]{0,16}";
        let query = proptest::option::of("[ -~]{0,20}");
        let method = prop_oneof![Just("GET"), Just("POST"), Just("get"), Just("GET ")];
        let version = prop_oneof![
            Just("HTTP/1.1"),
            Just("HTTP/1.0"),
            Just("HTTP/2"),
            Just("HTTP/1.1 ")
        ];
        let stream = (
            method,
            prop_oneof![Just("/test/"), Just("/test"), Just("/tes/")],
            id,
            query,
            version,
        )
            .prop_map(|(m, p, id, q, v)| {
                let q = q.map(|q| format!("?{q}")).unwrap_or_default();
                format!("{m} {p}{id}{q} {v}\r\n").into_bytes()
            });
        let dispatcher = prop_oneof![
            Just(DISPATCHER_LINE.to_vec()),
            Just(b"GET /dispatcher?x HTTP/1.1\r\n".to_vec()),
            Just(b"GET /dispatcher HTTP/1.0\r\n".to_vec()),
        ];
        let noise = proptest::collection::vec(any::<u8>(), 0..160).prop_map(|mut v| {
            v.extend_from_slice(b"\r\n");
            v
        });
        prop_oneof![4 => stream, 1 => dispatcher, 1 => noise]
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Arbitrary bytes: no panic, and once a prefix is decided, more
        /// bytes never change the decision (so however the line is split
        /// into TCP pieces, the classifier reaches the same answer).
        #[test]
        fn decisions_are_final(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let whole = decide_arrived(&bytes);
            for k in 0..=bytes.len() {
                if let Some(early) = decide_arrived(&bytes[..k]) {
                    prop_assert_eq!(Some(early), whole.clone(), "prefix of {} bytes", k);
                    break;
                }
            }
            if bytes.len() >= PEEK_BYTES {
                prop_assert!(whole.is_some(), "a full peek buffer must be decided");
            }
        }

        /// A complete request line (plus whatever follows it) is classified
        /// as the reference says, and every split of it leads there.
        #[test]
        fn lines_agree_with_the_reference(
            line in request_line(),
            after in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let expected = reference(&line);
            let mut bytes = line.clone();
            bytes.extend_from_slice(&after);
            prop_assert_eq!(decide_arrived(&bytes), Some(expected.clone()));
            for k in 0..bytes.len() {
                let early = decide_arrived(&bytes[..k]);
                prop_assert!(early.is_none() || early == Some(expected.clone()), "prefix {k}: {early:?}");
            }
            if let Class::Stream(id) = expected {
                prop_assert!(id::validate(&id, MAX_ID).is_ok());
            }
        }

        /// The head scanner finds the end of a head exactly where the
        /// reference does (the first blank line), or refuses a head longer
        /// than the limit, however the bytes are split.
        #[test]
        fn head_scan_agrees_with_the_reference(
            head in proptest::collection::vec(prop_oneof![
                Just(&b"\r\n"[..]), Just(&b"\r"[..]), Just(&b"\n"[..]), Just(&b"Host: a"[..]),
                Just(&b"\r\n\r"[..]), Just(&b"\0\xff"[..]),
            ], 0..80).prop_map(|pieces| pieces.concat()),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            max in 1usize..400,
        ) {
            let end = head.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
            let expected = match end {
                Some(len) if len <= max => Some(Ok(len)),
                Some(_) => Some(Err(())),
                None if head.len() > max => Some(Err(())),
                None => None,
            };
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (head.len() + 1)).collect();
            cuts.push(head.len());
            cuts.sort_unstable();
            let (mut scan, mut from, mut got) = (HeadScan::default(), 0, None);
            for to in cuts {
                match scan.feed(&head[from..to], max) {
                    Scanned::More => from = to,
                    Scanned::End(n) => {
                        got = Some(Ok(from + n));
                        break;
                    }
                    Scanned::TooLarge => {
                        got = Some(Err(()));
                        break;
                    }
                }
            }
            prop_assert_eq!(got, expected);
        }
    }
}
