//! Deciding, per accepted connection, who serves it: the lean stream path or
//! actix-web.
//!
//! actix-web's HTTP/1 dispatcher keeps an 8 KiB read and an 8 KiB write
//! buffer for a connection's whole life; an idle stream must not pay that.
//! So the first request line is *peeked* (`MSG_PEEK`: nothing is consumed).
//! A plain `GET /test/{id} HTTP/1.1` (or HTTP/1.0) with a valid id is taken
//! here: the head is checked ([`HeadCheck`]) and discarded as it is read, and
//! the socket goes to a [`crate::stream::Stream`] actor. Every other
//! connection goes, bytes untouched, to actix-web, which also has a
//! `/test/{id}` route for what this path declines (an invalid id, an odd
//! query, a second request on a keep-alive connection).
//!
//! On a TLS port the same two steps, [`classify`] and [`consume_head`],
//! look at the decrypted bytes instead ([`Line`] and [`HeadSource`] are
//! implemented for the TLS session in `crate::conn::tls`).

use std::io;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::time::Duration;

use actix_rt::net::TcpStream;
use futures_util::FutureExt as _;
use nix::sys::socket::{MsgFlags, recv};
use tokio::io::Interest;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::id::is_id_byte;

/// How much of the request line is peeked at first. Kept small because this
/// buffer lives in every connection's future while it is being classified.
const PEEK_SMALL: usize = 128;

/// How much of the request line is peeked next: room for a query with a
/// subscriber token (a JWT is 150-400 bytes). A longer line (an identity
/// provider's token can be several KiB) is peeked again into a buffer of
/// twice the size, up to `server.max_head_bytes`. These buffers are allocated only for a stream
/// request line longer than [`PEEK_SMALL`]: a transient allocation for
/// every connection costs idle streams RSS through fragmentation
/// (docs/design-notes.md).
pub(crate) const PEEK_BYTES: usize = 1024;

/// First wait before peeking again when the request line is incomplete
/// (peek leaves the socket readable, so waiting for readiness would spin).
pub(crate) const PEEK_BACKOFF_START: Duration = Duration::from_millis(1);

/// Longest wait between peeks.
pub(crate) const PEEK_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// What a lean stream's request line starts with.
const STREAM_PREFIX: &[u8] = b"GET /test/";

/// The request line the lean `/dispatcher` path serves (see
/// [`crate::conn::dispatcher`], which serves every later request on the
/// connection with the same line).
pub(crate) const DISPATCHER_LINE: &[u8] = b"GET /dispatcher HTTP/1.1\r\n";

/// Who serves a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Class {
    /// A lean stream for this id.
    Stream {
        /// The stream id.
        id: Arc<str>,
        /// HTTP/1.0: the response is close-delimited, not chunked.
        http10: bool,
    },
    /// A plain `GET /dispatcher` first: [`crate::conn::dispatcher`].
    Dispatcher,
    /// actix-web.
    Http,
    /// No complete request line before the deadline.
    Timeout,
    /// The client closed, the socket failed, or a TLS record failed before
    /// a request was sent.
    Gone,
    /// A request target with a fragment: refused 400 ([`FRAGMENT`]).
    Fragment,
}

/// Why a request target with a fragment (`#`) is refused 400: RFC 9112 §3.2
/// does not allow one, and actix-web would silently cut it off
/// (`POST /send/a#b` would publish to `a`).
pub(crate) const FRAGMENT: &str = "a request target has no fragment (#); send it percent-escaped (%23)";

/// How a lean stream's request line may end: HTTP/1.1 or HTTP/1.0, and
/// CRLF or the bare LF RFC 9112 §2.2 tells servers to accept.
const SUFFIXES: [(&[u8], bool); 4] = [
    (b" HTTP/1.1\r\n", false),
    (b" HTTP/1.1\n", false),
    (b" HTTP/1.0\r\n", true),
    (b" HTTP/1.0\n", true),
];

/// What is wrong with a request head on the lean path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Not complete before the deadline: 408.
    Timeout,
    /// Larger than `server.max_head_bytes`: 431.
    TooLarge,
    /// More header lines than [`MAX_HEADERS`]: 431.
    TooManyHeaders,
    /// Not a valid head by RFC 9112 (the reason says which rule): 400.
    Invalid(&'static str),
    /// The client went away.
    Gone,
    /// A TLS port's handshake or records failed (the reason): closed
    /// without an HTTP answer, which the client could not read.
    Tls(&'static str),
}

/// Where [`classify`] looks at a request line: a plain socket, peeked so
/// that nothing is consumed ([`Peeked`]), or a TLS session's decrypted
/// bytes (`crate::conn::tls`).
///
/// Each is made with the connection's head deadline and `max_line`, the
/// longest request line a lean stream may have (the head limit, at least
/// [`PEEK_BYTES`]); a longer one goes to actix-web. (Kept in the source, not
/// passed to each call: every connection's task carries [`classify`]'s
/// future, and each argument would be stored in it again.)
pub(crate) trait Line {
    /// What has arrived of the request line so far, and whether it fills
    /// the most that will be looked at (`max_line`).
    async fn look(&mut self) -> Result<(&[u8], bool), HeadError>;

    /// Waits for more of a line [`Line::look`] saw too little of (`seen`
    /// bytes).
    async fn more(&mut self, seen: usize) -> Result<(), HeadError>;
}

/// Reads enough of the request line of a fresh connection from `line` to
/// decide who serves it.
pub(crate) async fn classify(line: &mut impl Line, max_id_len: usize) -> Class {
    loop {
        let seen = match line.look().await {
            Ok((seen, full)) => match judge(seen, full, max_id_len) {
                Some(class) => return class,
                None => seen.len(),
            },
            Err(e) => return ended(e),
        };
        if let Err(e) = line.more(seen).await {
            return ended(e);
        }
    }
}

/// [`decide`], with a request target that has a fragment refused.
fn judge(seen: &[u8], full: bool, max_id_len: usize) -> Option<Class> {
    match decide(seen, full, max_id_len) {
        Some(Class::Http) if has_fragment(seen) => Some(Class::Fragment),
        class => class,
    }
}

/// What a request line that did not come means: a timeout, or nobody to
/// answer. (A TLS record that failed is counted where it was read.)
fn ended(e: HeadError) -> Class {
    match e {
        HeadError::Timeout => Class::Timeout,
        _ => Class::Gone,
    }
}

/// A plain connection's request line, peeked: nothing is consumed, and
/// actix-web reads the bytes untouched.
pub(crate) struct Peeked<'a> {
    io: &'a TcpStream,
    deadline: Instant,
    /// At least [`PEEK_BYTES`].
    max_line: usize,
    /// The first peek's buffer, in the future of every connection.
    small: [u8; PEEK_SMALL],
    /// A longer line's buffer, unallocated until one is peeked.
    big: Vec<u8>,
    /// The next wait before peeking again.
    backoff: Duration,
}

impl<'a> Peeked<'a> {
    pub(crate) fn new(io: &'a TcpStream, deadline: Instant, max_line: usize) -> Self {
        Peeked {
            io,
            deadline,
            max_line: max_line.max(PEEK_BYTES),
            small: [0u8; PEEK_SMALL],
            big: Vec::new(),
            backoff: PEEK_BACKOFF_START,
        }
    }
}

impl Line for Peeked<'_> {
    async fn look(&mut self) -> Result<(&[u8], bool), HeadError> {
        // Fields, not copies: each local would be kept in every
        // connection's task while it waits here.
        let line: &mut [u8] = if self.big.is_empty() {
            &mut self.small
        } else {
            &mut self.big
        };
        let n = match timeout_at(self.deadline, self.io.peek(line)).await {
            Err(_) => match look_now(self.io, line, MsgFlags::MSG_PEEK) {
                Some(0) | None => return Err(HeadError::Timeout),
                Some(n) => n,
            },
            Ok(Ok(0) | Err(_)) => return Err(HeadError::Gone),
            Ok(Ok(n)) => n,
        };
        let full = n == line.len();
        let last = line.len() >= self.max_line;
        Ok((&line[..n], full && last))
    }

    async fn more(&mut self, seen: usize) -> Result<(), HeadError> {
        let (deadline, max_line) = (self.deadline, self.max_line);
        let len = if self.big.is_empty() {
            PEEK_SMALL
        } else {
            self.big.len()
        };
        if seen == len {
            // A long stream request line: look at more of it at once.
            // Doubling: a slow client's line costs what it has sent, not
            // the whole head limit, while it waits.
            let next = if self.big.is_empty() {
                PEEK_BYTES
            } else {
                (self.big.len() * 2).min(max_line)
            };
            self.big = vec![0u8; next];
            return Ok(());
        }
        // A client that sent part of a line and went away (FIN or RST)
        // leaves its bytes queued, so peeking alone would see them until
        // the deadline: the socket's readiness says whether the read side
        // has closed (epoll's RDHUP, which tokio keeps as READ_CLOSED).
        if peer_closed(self.io) {
            return Err(HeadError::Gone);
        }
        if Instant::now() >= deadline {
            return Err(HeadError::Timeout);
        }
        // The last wait ends at the deadline, for one last peek.
        sleep_until(deadline.min(Instant::now() + self.backoff)).await;
        self.backoff = (self.backoff * 2).min(PEEK_BACKOFF_MAX);
        Ok(())
    }
}

/// True if the request target in `line` (what was peeked of a request
/// line) holds a `#`. Only a first request on a connection is peeked; the
/// rest reach actix-web, which drops a fragment without a word.
pub(crate) fn has_fragment(line: &[u8]) -> bool {
    let Some(start) = line.iter().position(|b| *b == b' ') else {
        return false;
    };
    line[start + 1..]
        .iter()
        .take_while(|b| !matches!(b, b' ' | b'\r' | b'\n'))
        .any(|b| *b == b'#')
}

/// What the kernel holds for `io` right now (peeked, or read, by `flags`),
/// without waiting and without asking tokio's readiness: `None` if nothing
/// or an error.
///
/// The one last look when the head deadline passes. A saturated worker
/// turns its event loop late, and handles at most 1,024 readiness events a
/// turn: a head can sit in the kernel, sent in time, while the deadline's
/// timer fires first. That head is served. `server.head_timeout_ms`
/// measures the client, not switchboard's own queue; a client that sent
/// only part of its head in time is still refused (the slowloris defence).
pub(crate) fn look_now(io: &TcpStream, buf: &mut [u8], flags: MsgFlags) -> Option<usize> {
    recv(io.as_raw_fd(), buf, flags | MsgFlags::MSG_DONTWAIT).ok()
}

/// True once the peer has closed its sending side or reset the connection.
pub(crate) fn peer_closed(io: &TcpStream) -> bool {
    match io.ready(Interest::READABLE).now_or_never() {
        Some(Ok(ready)) => ready.is_read_closed(),
        Some(Err(_)) => true,
        None => false,
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
    // The id, percent-escapes decoded as actix-web's path extractor does;
    // an escape that decodes to a byte ids may not hold is actix-web's to
    // refuse. Nothing is allocated here but the id itself (see PEEK_BYTES).
    let (mut at, mut id_len, mut escaped) = (0, 0, false);
    while let Some(&b) = rest.get(at) {
        if is_id_byte(b) {
            at += 1;
        } else if b == b'%' {
            let (Some(&hi), Some(&lo)) = (rest.get(at + 1), rest.get(at + 2)) else {
                return more();
            };
            if !unescape(hi, lo).is_some_and(is_id_byte) {
                return Some(Class::Http);
            }
            (at, escaped) = (at + 3, true);
        } else {
            break;
        }
        id_len += 1;
        if id_len > max_id_len {
            return Some(Class::Http);
        }
    }
    let mut tail = &rest[at..];
    if tail.first() == Some(&b'?') {
        let query = &tail[1..];
        let len = query.iter().take_while(|b| is_query_byte(**b)).count();
        match query.get(len) {
            // The query is any bytes actix-web accepts in one; anything else
            // is actix-web's to refuse.
            Some(b' ') => tail = &query[len..],
            Some(_) => return Some(Class::Http),
            None => return more(),
        }
    }
    let mut partial = false;
    let mut http10 = None;
    for (suffix, ten) in SUFFIXES {
        if tail.starts_with(suffix) {
            http10 = Some(ten);
        } else if suffix.starts_with(tail) {
            partial = true;
        }
    }
    let Some(http10) = http10 else {
        return if partial { more() } else { Some(Class::Http) };
    };
    if id_len == 0 {
        return Some(Class::Http);
    }
    let raw = &rest[..at];
    let id: Arc<str> = if escaped {
        let mut id = String::with_capacity(id_len);
        let mut bytes = raw.iter();
        while let Some(&b) = bytes.next() {
            match b {
                // unwrap (both): the scan above checked every escape.
                b'%' => {
                    let (hi, lo) = (*bytes.next().expect("checked"), *bytes.next().expect("checked"));
                    id.push(char::from(unescape(hi, lo).expect("checked")));
                }
                b => id.push(char::from(b)),
            }
        }
        Arc::from(id)
    } else {
        // unwrap: id bytes are ASCII.
        Arc::from(std::str::from_utf8(raw).expect("ASCII id"))
    };
    Some(Class::Stream { id, http10 })
}

/// The byte a percent-escape `%<hi><lo>` stands for, if both are hex digits.
fn unescape(hi: u8, lo: u8) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    u8::try_from(digit(hi)? << 4 | digit(lo)?).ok()
}

/// True for the bytes the `http` crate (under actix-web) accepts in a query:
/// visible ASCII but `"`, `#`, `<` and `>`.
fn is_query_byte(b: u8) -> bool {
    matches!(b, 0x21 | 0x24..=0x3b | 0x3d | 0x3f..=0x7e)
}

/// Most header lines in a head, as actix-web allows (more: 431 there too).
pub(crate) const MAX_HEADERS: u8 = 96;

/// Header names the lean stream path looks at, lower case.
const WATCHED: [&[u8]; 3] = [b"host", b"content-length", b"transfer-encoding"];

/// Where [`HeadCheck`] is within a `Content-Length` value, a list of
/// lengths (RFC 9112 §6.3) that a stream request may give only as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    /// Not in a `Content-Length` value.
    Off,
    /// Before an element's digits (whitespace may come).
    Before,
    /// In an element's digits.
    Digits,
    /// After an element's digits (whitespace, then a comma or the end).
    After,
}

/// Where [`HeadCheck`] is within the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the request line (the classifier has already judged it).
    RequestLine,
    /// At the start of a line.
    LineStart,
    /// In a header name.
    Name,
    /// In a header value.
    Value,
}

/// Checks a lean stream's request head against RFC 9112 and the rules
/// actix-web applies on the other path, in bytes that arrive piece by piece,
/// with a few bytes of state (nothing is buffered):
///
/// - lines end in CRLF or a bare LF (§2.2); a CR anywhere else is refused;
/// - a header line is a token name, `:` with no whitespace before it, and a
///   value of visible characters, spaces, tabs or obs-text; no NUL or other
///   control byte, no obs-fold (a line starting with whitespace, §5.2);
/// - HTTP/1.1 needs exactly one `Host` (§3.2), HTTP/1.0 at most one;
/// - a stream request carries no body: `Transfer-Encoding` is refused, and
///   so is a `Content-Length` other than 0. `Content-Length: 0` (which
///   Java's and Erlang's HTTP clients send on every GET) is an empty body
///   and accepted, also repeated or as a list of zeros (RFC 9112 §6.3);
/// - at most `max_head` bytes and [`MAX_HEADERS`] header lines (431).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadCheck {
    /// Bytes of the head seen so far.
    seen: usize,
    /// Where the next byte falls.
    place: Place,
    /// The previous byte was a CR: only LF may follow.
    after_cr: bool,
    /// Length of the header name so far (saturating).
    name_len: u8,
    /// Which of [`WATCHED`] the header name so far still spells (a bit each).
    watched: u8,
    /// Header lines so far.
    headers: u8,
    /// `Host` headers so far.
    hosts: u8,
    /// Where a `Content-Length` value being read is.
    length: Length,
    /// HTTP/1.0: `Host` is optional.
    http10: bool,
}

/// What [`HeadCheck::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Not over yet: every byte fed belongs to the head.
    More,
    /// The head is valid and ends this many bytes into the piece just fed.
    End(usize),
    /// The head is refused.
    Refused(HeadError),
}

impl HeadCheck {
    /// A check for a head whose request line said HTTP/1.0 (`http10`) or 1.1.
    pub(crate) fn new(http10: bool) -> Self {
        HeadCheck {
            seen: 0,
            place: Place::RequestLine,
            after_cr: false,
            name_len: 0,
            watched: 0,
            headers: 0,
            hosts: 0,
            length: Length::Off,
            http10,
        }
    }

    /// Feeds the next piece of the connection; `max_head` bounds the head.
    pub(crate) fn feed(&mut self, piece: &[u8], max_head: usize) -> Checked {
        for (i, &b) in piece.iter().enumerate() {
            self.seen += 1;
            if self.seen > max_head {
                return Checked::Refused(HeadError::TooLarge);
            }
            match self.step(b) {
                Ok(false) => {}
                Ok(true) => return Checked::End(i + 1),
                Err(e) => return Checked::Refused(e),
            }
        }
        Checked::More
    }

    /// One byte; `Ok(true)` when it ends the head.
    fn step(&mut self, b: u8) -> Result<bool, HeadError> {
        let invalid = |why| Err(HeadError::Invalid(why));
        if self.after_cr {
            self.after_cr = false;
            if b != b'\n' {
                return invalid("CR not followed by LF in the request head");
            }
            return self.line_end();
        }
        match (self.place, b) {
            (_, b'\r') => self.after_cr = true,
            (_, b'\n') => return self.line_end(),
            (Place::RequestLine, _) => {}
            (Place::LineStart, b' ' | b'\t') => return invalid("obsolete line folding in a header"),
            (Place::LineStart, b':') => return invalid("empty header name"),
            (Place::LineStart | Place::Name, _) if is_token(b) => {
                if self.place == Place::LineStart {
                    self.place = Place::Name;
                    self.name_len = 0;
                    self.watched = (1 << WATCHED.len()) - 1;
                }
                let at = usize::from(self.name_len);
                for (k, name) in WATCHED.iter().enumerate() {
                    if name.get(at) != Some(&b.to_ascii_lowercase()) {
                        self.watched &= !(1 << k);
                    }
                }
                self.name_len = self.name_len.saturating_add(1);
            }
            (Place::Name, b':') => {
                self.place = Place::Value;
                let whole =
                    |k: usize| self.watched & (1 << k) != 0 && WATCHED[k].len() == usize::from(self.name_len);
                if whole(0) {
                    self.hosts += 1;
                    if self.hosts > 1 {
                        return invalid("more than one Host header");
                    }
                }
                if whole(1) {
                    self.length = Length::Before;
                }
                if whole(2) {
                    return invalid("a stream request has no body (Transfer-Encoding)");
                }
            }
            (Place::LineStart | Place::Name, _) => return invalid("invalid character in a header name"),
            (Place::Value, _) if self.length != Length::Off => self.length = length_step(self.length, b)?,
            (Place::Value, b'\t' | b' '..=b'~' | 0x80..=0xff) => {}
            (Place::Value, _) => return invalid("control character in a header value"),
        }
        Ok(false)
    }

    /// A LF: the end of a line, or of the head.
    fn line_end(&mut self) -> Result<bool, HeadError> {
        match self.place {
            Place::RequestLine => self.place = Place::LineStart,
            Place::LineStart if !self.http10 && self.hosts == 0 => {
                return Err(HeadError::Invalid("HTTP/1.1 request without a Host header"));
            }
            Place::LineStart => return Ok(true),
            Place::Name => return Err(HeadError::Invalid("header line without a colon")),
            Place::Value => {
                if matches!(self.length, Length::Before) {
                    return Err(HeadError::Invalid(BAD_LENGTH));
                }
                self.length = Length::Off;
                self.headers += 1;
                if self.headers > MAX_HEADERS {
                    return Err(HeadError::TooManyHeaders);
                }
                self.place = Place::LineStart;
            }
        }
        Ok(false)
    }
}

/// Why a `Content-Length` that is not a list of numbers is refused.
const BAD_LENGTH: &str = "Content-Length is not a number";

/// One byte of a `Content-Length` value on a stream request: whitespace
/// around each element, elements separated by commas, every one of them 0.
fn length_step(at: Length, b: u8) -> Result<Length, HeadError> {
    match (at, b) {
        (Length::Before | Length::After, b' ' | b'\t') => Ok(at),
        (Length::Digits, b' ' | b'\t') => Ok(Length::After),
        (Length::Before | Length::Digits, b'0') => Ok(Length::Digits),
        (Length::Digits | Length::After, b',') => Ok(Length::Before),
        (Length::Before | Length::Digits, b'1'..=b'9') => Err(HeadError::Invalid(
            "a stream request has no body (Content-Length other than 0)",
        )),
        _ => Err(HeadError::Invalid(BAD_LENGTH)),
    }
}

/// Checks one `Content-Length` value as [`HeadCheck`] does, for the
/// fallback route (actix-web has parsed it as one number already).
pub(crate) fn check_length(value: &[u8]) -> Result<(), HeadError> {
    let mut at = Length::Before;
    for &b in value {
        at = length_step(at, b)?;
    }
    match at {
        Length::Before => Err(HeadError::Invalid(BAD_LENGTH)),
        _ => Ok(()),
    }
}

/// RFC 9110 token characters (header names).
pub(crate) fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Where [`consume_head`] reads a head from: a plain socket ([`Plain`]),
/// or a TLS session's decrypted bytes (`crate::conn::tls`).
pub(crate) trait HeadSource {
    /// Reads on by `deadline` and calls `f` with every byte read of the head
    /// so far, from its start, and how many of them `f` has been shown
    /// already. `f` answers `None` while the head goes on; the source then
    /// keeps what it read, for the next call.
    async fn read_on<R>(
        &mut self,
        deadline: Instant,
        f: impl FnOnce(&[u8], usize) -> Option<R>,
    ) -> Result<Option<R>, HeadError>;
}

/// A plain connection's head, read through a stack buffer not held across
/// an await: a head that arrives in one read, as nearly every head does,
/// is read without an allocation; one that comes in pieces is gathered on
/// the heap.
pub(crate) struct Plain<'a> {
    io: &'a TcpStream,
    /// What was read of a head that came in pieces. Unallocated until then.
    kept: Vec<u8>,
}

impl<'a> Plain<'a> {
    pub(crate) fn new(io: &'a TcpStream) -> Self {
        Plain { io, kept: Vec::new() }
    }
}

impl HeadSource for Plain<'_> {
    async fn read_on<R>(
        &mut self,
        deadline: Instant,
        f: impl FnOnce(&[u8], usize) -> Option<R>,
    ) -> Result<Option<R>, HeadError> {
        let io = self.io;
        loop {
            let expired = match timeout_at(deadline, io.readable()).await {
                Err(_) => true,
                Ok(Err(_)) => return Err(HeadError::Gone),
                Ok(Ok(())) => false,
            };
            let mut buf = [0u8; 2048];
            let n = if expired {
                // Past the deadline: what the kernel holds now is all the
                // head there will be (a slow client's partial head is still
                // a 408).
                match look_now(io, &mut buf, MsgFlags::empty()) {
                    Some(0) | None => return Err(HeadError::Timeout),
                    Some(n) => n,
                }
            } else {
                match io.try_read(&mut buf) {
                    Ok(0) => return Err(HeadError::Gone),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => return Err(HeadError::Gone),
                }
            };
            if self.kept.is_empty() {
                let done = f(&buf[..n], 0);
                if done.is_none() {
                    self.kept.extend_from_slice(&buf[..n]);
                }
                return Ok(done);
            }
            let shown = self.kept.len();
            self.kept.extend_from_slice(&buf[..n]);
            return Ok(f(&self.kept, shown));
        }
    }
}

/// Reads and checks the request head (up to the blank line) of a connection
/// taken for the lean path, and returns what `read` makes of the whole head
/// and of the bytes read after it (see [`crate::conn::handshake`]; a WebSocket
/// client may send its first frames right behind its handshake).
pub(crate) async fn consume_head<T>(
    source: &mut impl HeadSource,
    deadline: Instant,
    max_head: usize,
    http10: bool,
    mut read: impl FnMut(&[u8], &[u8]) -> T,
) -> Result<T, HeadError> {
    let mut check = HeadCheck::new(http10);
    loop {
        let done = source
            .read_on(deadline, |all, shown| match check.feed(&all[shown..], max_head) {
                Checked::More => None,
                Checked::End(k) => Some(Ok(read(&all[..shown + k], &all[shown + k..]))),
                Checked::Refused(e) => Some(Err(e)),
            })
            .await?;
        if let Some(done) = done {
            return done;
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Option<Class> {
        decide(s.as_bytes(), false, 8)
    }

    fn stream(id: &str, http10: bool) -> Option<Class> {
        Some(Class::Stream {
            id: id.into(),
            http10,
        })
    }

    #[test]
    fn plain_dispatcher_requests() {
        assert_eq!(d("GET /dispatcher HTTP/1.1\r\n"), Some(Class::Dispatcher));
        assert_eq!(d("GET /dispatch"), None);
    }

    #[test]
    fn lean_requests() {
        assert_eq!(d("GET /test/foo HTTP/1.1\r\n"), stream("foo", false));
        assert_eq!(
            d("GET /test/foo?x=1 HTTP/1.1\r\nHost: a\r\n"),
            stream("foo", false)
        );
        assert_eq!(d("GET /test/foo HTTP/1.1\n"), stream("foo", false));
        assert_eq!(d("GET /test/foo HTTP/1.0\r\n"), stream("foo", true));
        assert_eq!(d("GET /test/foo HTTP/1.0\n"), stream("foo", true));
    }

    #[test]
    fn everything_else_goes_to_actix_web() {
        assert_eq!(d("POST /send/foo HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /dispatcher?x HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /dispatcher HTTP/1.0\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/foo HTTP/2.0\r\n"), Some(Class::Http));
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
        assert_eq!(d("GET /test/foo HTTP/1.1\r"), None);
        assert_eq!(decide(b"GET /test/foo?xxxx", true, 8), Some(Class::Http));
    }

    /// A connection whose client wrote `sent`, accepted only once the bytes
    /// are in the server's kernel buffer, and handed to tokio just now. With
    /// a deadline already past, the timer fires before the event loop has
    /// seen the socket's readiness: a saturated worker's case.
    fn arrived(sent: &[u8]) -> (TcpStream, std::net::TcpStream) {
        use std::io::Write as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(sent).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut probe = vec![0u8; sent.len()];
        while server.peek(&mut probe).unwrap() < sent.len() {}
        server.set_nonblocking(true).unwrap();
        (TcpStream::from_std(server).unwrap(), client)
    }

    #[actix_rt::test]
    async fn a_head_that_arrived_in_time_is_served_past_the_deadline() {
        let head = b"GET /test/foo HTTP/1.1\r\nHost: x\r\n\r\n";
        let (io, _client) = arrived(head);
        let past = Instant::now() - Duration::from_secs(1);
        let class = classify(&mut Peeked::new(&io, past, 8192), 8).await;
        assert_eq!(class, stream("foo", false).unwrap());
        let read = consume_head(&mut Plain::new(&io), past, 8192, false, |head, _| head.len()).await;
        assert_eq!(read, Ok(head.len()));
    }

    #[actix_rt::test]
    async fn a_partial_head_is_still_a_timeout_past_the_deadline() {
        let (io, _client) = arrived(b"GET /test/foo HTTP/1.1\r\nHost:");
        let past = Instant::now() - Duration::from_secs(1);
        assert_eq!(
            classify(&mut Peeked::new(&io, past, 8192), 8).await,
            stream("foo", false).unwrap()
        );
        let read = consume_head(&mut Plain::new(&io), past, 8192, false, |head, _| head.len()).await;
        assert_eq!(read, Err(HeadError::Timeout));
        let (io, _client) = arrived(b"GET /test/fo");
        assert_eq!(
            classify(&mut Peeked::new(&io, past, 8192), 8).await,
            Class::Timeout
        );
    }

    fn check(head: &str, http10: bool, max: usize) -> Checked {
        HeadCheck::new(http10).feed(head.as_bytes(), max)
    }

    #[test]
    fn heads_end_at_the_blank_line_within_the_limit() {
        let head = "GET /test/x HTTP/1.1\r\nHost: a\r\n\r\nrest";
        assert_eq!(check(head, false, 1000), Checked::End(33));
        // Exactly at the limit is accepted; one byte more is not.
        assert_eq!(check(head, false, 33), Checked::End(33));
        assert_eq!(check(head, false, 32), Checked::Refused(HeadError::TooLarge));
        // Bare LF line ends (RFC 9112 §2.2), and HTTP/1.0 without Host.
        assert_eq!(
            check("GET /test/x HTTP/1.1\nhost:a\n\n", false, 1000),
            Checked::End(29)
        );
        assert_eq!(
            check("GET /test/x HTTP/1.0\r\n\r\n", true, 1000),
            Checked::End(24)
        );
    }

    #[test]
    fn invalid_heads_are_refused_with_the_rule() {
        for (head, why) in [
            ("GET /test/x HTTP/1.1\r\n\r\n", "without a Host"),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
                "more than one Host",
            ),
            ("GET /test/x HTTP/1.1\r\nHost: a\0b\r\n\r\n", "control character"),
            ("GET /test/x HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "folding"),
            ("GET /test/x HTTP/1.1\r\nHost : a\r\n\r\n", "header name"),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nnocolon\r\n\r\n",
                "without a colon",
            ),
            ("GET /test/x HTTP/1.1\r\nHost: a\rb\r\n\r\n", "CR not followed"),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
                "no body",
            ),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 1\r\n\r\n",
                "no body",
            ),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n",
                "not a number",
            ),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0 0\r\n\r\n",
                "not a number",
            ),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: -0\r\n\r\n",
                "not a number",
            ),
            (
                "GET /test/x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n",
                "no body",
            ),
        ] {
            match check(head, false, 1000) {
                Checked::Refused(HeadError::Invalid(reason)) => {
                    assert!(reason.contains(why), "{head:?}: {reason}")
                }
                other => panic!("{head:?}: {other:?}"),
            }
        }
        let many = format!("GET /test/x HTTP/1.1\r\nHost: a\r\n{}\r\n", "a: b\r\n".repeat(96));
        assert_eq!(
            check(&many, false, 10_000),
            Checked::Refused(HeadError::TooManyHeaders)
        );
    }

    /// What real clients send on a plain GET: Erlang's httpc (`content-length:
    /// 0` and an empty `te:`), Java's HttpClient, and zeros repeated or listed.
    #[test]
    fn empty_bodies_and_empty_values_are_legal() {
        for head in [
            "GET /test/x HTTP/1.1\r\ncontent-length: 0\r\nte: \r\nhost: 127.0.0.1:18499\r\nconnection: keep-alive\r\n\r\n",
            "GET /test/x HTTP/1.1\r\nContent-Length: 0\r\nHost: localhost:8000\r\nUser-Agent: Java-http-client/17\r\n\r\n",
            "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length:\t0 \r\n\r\n",
            "GET /test/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 00\r\nX-Empty:\r\n\r\n",
        ] {
            assert_eq!(check(head, false, 1000), Checked::End(head.len()), "{head:?}");
        }
        assert!(check_length(b"0").is_ok());
        assert!(check_length(b" 0 , 0").is_ok());
        assert!(check_length(b"").is_err());
        assert!(check_length(b"7").is_err());
        assert!(check_length(b"0,").is_err());
    }

    #[test]
    fn percent_escaped_ids_and_long_lines_stay_lean() {
        assert_eq!(d("GET /test/%66oo HTTP/1.1\r\n"), stream("foo", false));
        assert_eq!(d("GET /test/f%6F%6f?x=1 HTTP/1.1\r\n"), stream("foo", false));
        // Escapes count as one byte of the id.
        assert_eq!(
            d("GET /test/%61%61%61%61%61%61%61%61 HTTP/1.1\r\n"),
            stream("aaaaaaaa", false)
        );
        assert_eq!(
            d("GET /test/%61%61%61%61%61%61%61%61a HTTP/1.1\r\n"),
            Some(Class::Http)
        );
        // An escape for a byte no id holds, or no escape at all: actix-web's.
        assert_eq!(d("GET /test/a%2Fb HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/a%zz HTTP/1.1\r\n"), Some(Class::Http));
        assert_eq!(d("GET /test/a%6"), None);
        let token = "t".repeat(3000);
        let line = format!("GET /test/foo?token={token} HTTP/1.1\r\n");
        assert_eq!(decide(line.as_bytes(), false, 8), stream("foo", false));
    }

    #[test]
    fn fragments_are_found_in_the_target() {
        assert!(has_fragment(b"POST /send/a#b HTTP/1.1\r\n"));
        assert!(has_fragment(b"GET /test/a?x#y"));
        assert!(!has_fragment(b"POST /send/a HTTP/1.1\r\nX: #\r\n"));
        assert!(!has_fragment(b"POST"));
    }
}

/// Property tests: for arbitrary bytes, and arbitrary splits of valid input
/// into the pieces TCP may deliver, the classifier and the head check never
/// panic and agree with a reference: plain rules for the request line, and
/// for the head the parser actix-web itself uses (`httparse`) plus the rules
/// actix-web adds to it.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::id;

    /// The id length limit the properties use (small, so it is often crossed).
    const MAX_ID: usize = 12;

    /// What a request line means, by the rules written out plainly: a lean
    /// stream is `GET /test/<id>[?query] HTTP/1.x` (CRLF or LF) with a valid
    /// id, fitting the peek buffer; the lean `/dispatcher` line is exactly
    /// that line; every other line is actix-web's.
    fn reference(line: &[u8]) -> Class {
        if line == DISPATCHER_LINE {
            return Class::Dispatcher;
        }
        let stream = (|| {
            if line.len() > MAX_LINE {
                return None;
            }
            let text = std::str::from_utf8(line).ok()?;
            let text = text.strip_suffix('\n')?;
            let text = text.strip_suffix('\r').unwrap_or(text);
            let (target, http10) = match text.strip_prefix("GET ")? {
                t if t.ends_with(" HTTP/1.1") => (&t[..t.len() - 9], false),
                t if t.ends_with(" HTTP/1.0") => (&t[..t.len() - 9], true),
                _ => return None,
            };
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let id = percent_decode(path.strip_prefix("/test/")?)?;
            let query_ok = query
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"\"#<>".contains(&b));
            if path.contains([' ', '\r', '\n']) || !query_ok || id::validate(&id, MAX_ID).is_err() {
                return None;
            }
            Some(Class::Stream {
                id: Arc::from(id),
                http10,
            })
        })();
        stream.unwrap_or(Class::Http)
    }

    /// The longest request line the properties let the classifier peek.
    const MAX_LINE: usize = 2 * PEEK_BYTES;

    /// `s` with its percent-escapes decoded; `None` for a broken escape or
    /// one that is not an id byte (actix-web's path extractor decodes the
    /// rest, and refuses those ids).
    fn percent_decode(s: &str) -> Option<String> {
        let mut out = String::new();
        let mut rest = s;
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            let code = rest.get(at + 1..at + 3)?;
            let b = u8::from_str_radix(code, 16)
                .ok()
                .filter(|_| code.bytes().all(|c| c.is_ascii_hexdigit()))?;
            if !is_id_byte(b) {
                return None;
            }
            out.push(char::from(b));
            rest = &rest[at + 3..];
        }
        out.push_str(rest);
        Some(out)
    }

    /// What the classifier decides when `bytes` have arrived: it peeks at
    /// most [`MAX_LINE`] of them.
    fn decide_arrived(bytes: &[u8]) -> Option<Class> {
        let n = bytes.len().min(MAX_LINE);
        decide(&bytes[..n], n == MAX_LINE, MAX_ID)
    }

    /// Request lines near the interesting cases: stream and dispatcher lines,
    /// their near misses, and noise.
    fn request_line() -> impl Strategy<Value = Vec<u8>> {
        let id = "[A-Za-z0-9._~%/:-]{0,16}";
        let query = proptest::option::of(prop_oneof![
            "[!$-;=?-~]{0,20}",
            "[ -~]{0,20}",
            proptest::collection::vec(any::<u8>(), 0..8)
                .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ]);
        let method = prop_oneof![Just("GET"), Just("POST"), Just("get"), Just("GET ")];
        let version = prop_oneof![
            Just("HTTP/1.1\r\n"),
            Just("HTTP/1.1\n"),
            Just("HTTP/1.0\r\n"),
            Just("HTTP/1.0\n"),
            Just("HTTP/2\r\n"),
            Just("HTTP/1.1 \r\n"),
            Just("HTTP/1.1\r\r\n"),
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
                format!("{m} {p}{id}{q} {v}").into_bytes()
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

    /// What the head check should say about `head` (request line included),
    /// by actix-web's rules: `httparse` with 96 header slots, then one Host
    /// (none allowed on HTTP/1.0), and no body headers on a stream request.
    /// `None`: not complete.
    fn head_reference(head: &[u8], http10: bool, max: usize) -> Option<Checked> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS as usize];
        let mut req = httparse::Request::new(&mut headers);
        let refused = |e| Some(Checked::Refused(e));
        match req.parse(head) {
            Err(httparse::Error::TooManyHeaders) => refused(HeadError::TooManyHeaders),
            Err(_) => refused(HeadError::Invalid("")),
            Ok(httparse::Status::Partial) if head.len() > max => refused(HeadError::TooLarge),
            Ok(httparse::Status::Partial) => None,
            Ok(httparse::Status::Complete(len)) if len > max => refused(HeadError::TooLarge),
            Ok(httparse::Status::Complete(len)) => {
                let named = |n: &str| {
                    req.headers
                        .iter()
                        .filter(|h| h.name.eq_ignore_ascii_case(n))
                        .count()
                };
                let host_ok = if http10 {
                    named("host") <= 1
                } else {
                    named("host") == 1
                };
                // Content-Length may only say "no body": each value a list of
                // zeros (written out plainly here).
                let zeros = |v: &[u8]| {
                    let v = String::from_utf8_lossy(v);
                    v.split(',').all(|e| {
                        let e = e.trim_matches([' ', '\t']);
                        !e.is_empty() && e.bytes().all(|b| b == b'0')
                    })
                };
                let lengths_ok = req
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .all(|h| zeros(h.value));
                if !host_ok || !lengths_ok || named("transfer-encoding") > 0 {
                    refused(HeadError::Invalid(""))
                } else {
                    Some(Checked::End(len))
                }
            }
        }
    }

    /// Pieces heads are made of: good and bad header lines, line ends.
    fn head_pieces() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            8 => Just(&b"Host: a\r\n"[..]),
            4 => Just(&b"X-A: b c\r\n"[..]),
            2 => Just(&b"x:\n"[..]),
            2 => Just(&b"\r\n"[..]),
            2 => Just(&b"\n"[..]),
            1 => Just(&b"\r"[..]),
            1 => Just(&b"host:b\n"[..]),
            1 => Just(&b"Content-Length: 0\r\n"[..]),
            1 => Just(&b"content-length:0, 0 \n"[..]),
            1 => Just(&b"Content-Length: 1\r\n"[..]),
            1 => Just(&b"Content-Length: 0x\r\n"[..]),
            1 => Just(&b"Content-Length:\r\n"[..]),
            1 => Just(&b"Transfer-Encoding: chunked\r\n"[..]),
            1 => Just(&b" folded\r\n"[..]),
            1 => Just(&b"Bad Name: x\r\n"[..]),
            1 => Just(&b":empty\r\n"[..]),
            1 => Just(&b"nocolon\r\n"[..]),
            1 => Just(&b"V: \x00\x01\x7f\r\n"[..]),
            1 => Just(&b"V: \t\x80\xff~\r\n"[..]),
            1 => Just(&b"N@me: x\r\n"[..]),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
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
            if bytes.len() >= MAX_LINE {
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
            if let Class::Stream { id, .. } = expected {
                prop_assert!(id::validate(&id, MAX_ID).is_ok());
            }
        }

        /// The head check agrees with actix-web's own parser and rules on
        /// where a head ends and whether it is refused (and as what), however
        /// the bytes are split.
        #[test]
        fn head_check_agrees_with_actix_webs_rules(
            headers in head_pieces(),
            http10 in any::<bool>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            max in prop_oneof![Just(4096usize), 16usize..400],
        ) {
            let line: &[u8] = if http10 { b"GET /test/x HTTP/1.0\r\n" } else { b"GET /test/x HTTP/1.1\r\n" };
            let head = [line, &headers].concat();
            let expected = head_reference(&head, http10, max);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (head.len() + 1)).collect();
            cuts.push(head.len());
            cuts.sort_unstable();
            let (mut check, mut from, mut got) = (HeadCheck::new(http10), 0, None);
            for to in cuts {
                match check.feed(&head[from..to], max) {
                    Checked::More => from = to,
                    Checked::End(n) => {
                        got = Some(Checked::End(from + n));
                        break;
                    }
                    refused => {
                        got = Some(refused);
                        break;
                    }
                }
            }
            // The reasons are ours alone: compare the kind of refusal.
            let kind = |c: Option<Checked>| match c {
                Some(Checked::Refused(HeadError::Invalid(_))) => Some(Checked::Refused(HeadError::Invalid(""))),
                other => other,
            };
            // Past the size limit the two may stop at different places, one
            // at the limit and one at an invalid byte further on: both refuse.
            let (got, mut expected) = (kind(got), kind(expected));
            // The check refuses as soon as a rule is broken (a body header's
            // name, a second Host), where the whole-head reference still
            // waits: then every completion of the head must be refused too.
            if expected.is_none() && got == Some(Checked::Refused(HeadError::Invalid(""))) {
                expected = kind(head_reference(&[&head[..], b"\r\n\r\n"].concat(), http10, usize::MAX));
            }
            if head.len() > max && got.is_some_and(|g| matches!(g, Checked::Refused(_)))
                && expected.is_some_and(|e| matches!(e, Checked::Refused(_))) {
                return Ok(());
            }
            prop_assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(&head));
        }
    }
}
