//! At the edge: the client's real address behind a load balancer (the
//! PROXY protocol, or `X-Forwarded-For` from a trusted proxy) and the
//! limits per client address.
//!
//! - [`read_proxy_header`] takes a PROXY protocol header (v1 text, v2
//!   binary; parsed by the `ppp` crate) off the front of a fresh
//!   connection, before anything else reads it: it peeks, and then reads
//!   exactly the header's bytes, so the request behind it is classified
//!   and served as on a connection without one. The peek buffer lives on
//!   the stack of a plain function, never in the connection's task, whose
//!   size every idle stream pays for (docs/design-notes.md).
//! - [`Limits`]: open streams per address (a count kept only while an
//!   address has streams open), new streams and publishes per address per
//!   second, TLS handshakes per address per second (`governor`'s keyed
//!   GCRA limiters: one 8-byte state per address seen recently, dropped
//!   once it would be full again).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::os::fd::AsRawFd as _;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use actix_rt::net::TcpStream;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::config::{LimitSettings, Nets, ProxyProtocol, Rate};
use crate::conn::classify::{PEEK_BACKOFF_MAX, PEEK_BACKOFF_START, peer_closed};
use crate::error::ApiError;

/// The longest PROXY header taken: a v1 header is at most 107 bytes; a v2
/// header is 16 plus its addresses (at most 216 for Unix sockets) and its
/// TLVs, which HAProxy keeps to a few hundred bytes.
const MAX_PROXY_HEADER: usize = 1024;

/// v2's signature, the first 12 bytes of its header.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// v1's start.
const V1_PREFIX: &[u8] = b"PROXY ";

/// Why a connection's PROXY header was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProxyError {
    /// Not whole before the head deadline.
    Timeout,
    /// The client went away first.
    Gone,
    /// Not a PROXY header this server takes (the reason says why).
    Invalid(String),
}

/// What a peek found at the front of a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A whole header of `len` bytes; the client's address (`None`: the
    /// balancer's own connection, `LOCAL` or `UNKNOWN`, for health checks:
    /// the socket's peer stands).
    Header { len: usize, client: Option<SocketAddr> },
    /// Only the start of one so far.
    Partial,
    /// Not a header this server takes.
    Invalid(String),
}

/// Parses what was peeked of a connection with `mode` on (never `Off`).
pub(crate) fn parse(buf: &[u8], mode: ProxyProtocol) -> Parsed {
    let starts = |prefix: &[u8]| {
        let k = buf.len().min(prefix.len());
        buf[..k] == prefix[..k]
    };
    let (v1, v2) = (starts(V1_PREFIX), starts(V2_SIGNATURE));
    if buf.is_empty() || (v1 && v2) {
        return Parsed::Partial;
    }
    match (v1, v2, mode) {
        (true, _, ProxyProtocol::V2) => {
            Parsed::Invalid("a PROXY protocol v1 header, and server.proxy_protocol takes v2 only".to_owned())
        }
        (_, true, ProxyProtocol::V1) => {
            Parsed::Invalid("a PROXY protocol v2 header, and server.proxy_protocol takes v1 only".to_owned())
        }
        (true, _, _) => parse_v1(buf),
        (_, true, _) => parse_v2(buf),
        _ => Parsed::Invalid(
            "no PROXY protocol header: with server.proxy_protocol on, every connection must \
             start with one (from the load balancer)"
                .to_owned(),
        ),
    }
}

/// v1's longest header, CRLF included.
const V1_MAX: usize = 107;

fn parse_v1(buf: &[u8]) -> Parsed {
    use ppp::v1::{Addresses, Header};
    // The whole line first: ppp takes a line cut inside a number for a
    // whole one, and a v1 header always ends with CRLF.
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Parsed::Invalid(format!(
                "a PROXY protocol v1 header has no CRLF within {V1_MAX} bytes"
            ))
        } else {
            Parsed::Partial
        };
    };
    // UNKNOWN: the rest of the line is to be ignored (ppp takes at most
    // four fields after it).
    if buf.starts_with(b"PROXY UNKNOWN") {
        return Parsed::Header {
            len: end + 2,
            client: None,
        };
    }
    // The line is whole: whatever ppp finds missing is missing.
    match Header::try_from(&buf[..end + 2]) {
        Ok(h) => Parsed::Header {
            len: h.header.len(),
            client: match h.addresses {
                Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                Addresses::Unknown => None,
            },
        },
        Err(e) => Parsed::Invalid(format!("not a PROXY protocol v1 header: {e}")),
    }
}

fn parse_v2(buf: &[u8]) -> Parsed {
    use ppp::PartialResult as _;
    use ppp::v2::{Addresses, Command, Header};
    // Once the 16 fixed bytes are in, the header's whole length is known;
    // once that many bytes are in, no more will make a broken header whole.
    let declared = (buf.len() >= 16).then(|| 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]])));
    let whole = declared.is_some_and(|n| buf.len() >= n);
    match Header::try_from(buf) {
        Ok(h) => {
            // ppp does not read the TLVs: one that runs past the header's
            // end is refused here, as HAProxy refuses it (which reads them
            // for PROXY only; a LOCAL header's addresses are ignored).
            if matches!(h.command, Command::Proxy)
                && let Some(Err(e)) = h.tlvs().find(Result::is_err)
            {
                return Parsed::Invalid(format!("not a PROXY protocol v2 header: {e}"));
            }
            Parsed::Header {
                len: h.len(),
                client: match (h.command, h.addresses) {
                    (Command::Proxy, Addresses::IPv4(a)) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)))
                    }
                    (Command::Proxy, Addresses::IPv6(a)) => {
                        Some(SocketAddr::from((a.source_address, a.source_port)))
                    }
                    _ => None,
                },
            }
        }
        Err(e) if e.is_incomplete() && !whole => {
            if buf.len() >= MAX_PROXY_HEADER || declared.is_some_and(|n| n > MAX_PROXY_HEADER) {
                Parsed::Invalid(format!(
                    "a PROXY protocol v2 header longer than {MAX_PROXY_HEADER} bytes"
                ))
            } else {
                Parsed::Partial
            }
        }
        Err(e) => Parsed::Invalid(format!("not a PROXY protocol v2 header: {e}")),
    }
}

/// Takes the PROXY header off the front of `io` (mode on): the client's
/// address it names (`None`: a `LOCAL`/`UNKNOWN` header; the socket's peer
/// stands), or why the connection must be refused. Nothing after the
/// header is read.
pub(crate) async fn read_proxy_header(
    io: &TcpStream,
    mode: ProxyProtocol,
    deadline: Instant,
) -> Result<Option<SocketAddr>, ProxyError> {
    match timeout_at(deadline, io.readable()).await {
        Err(_) => return Err(ProxyError::Timeout),
        Ok(Err(_)) => return Err(ProxyError::Gone),
        Ok(Ok(())) => {}
    }
    // Peeked as `classify` peeks a request line, with its backoff.
    let mut backoff = PEEK_BACKOFF_START;
    loop {
        match take_header(io, mode) {
            Taken::Done(client) => return Ok(client),
            Taken::Gone => return Err(ProxyError::Gone),
            Taken::Invalid(why) => return Err(ProxyError::Invalid(why)),
            Taken::NotYet if Instant::now() >= deadline => return Err(ProxyError::Timeout),
            // Part of a header, then FIN or RST: its bytes stay queued, so
            // only the socket's readiness tells.
            // (One more look first: the rest may have come with the FIN.)
            Taken::NotYet if peer_closed(io) => {
                return match take_header(io, mode) {
                    Taken::Done(client) => Ok(client),
                    Taken::Invalid(why) => Err(ProxyError::Invalid(why)),
                    Taken::NotYet | Taken::Gone => Err(ProxyError::Gone),
                };
            }
            Taken::NotYet => {
                sleep_until(deadline.min(Instant::now() + backoff)).await;
                backoff = (backoff * 2).min(PEEK_BACKOFF_MAX);
            }
        }
    }
}

/// What one look at the socket found.
enum Taken {
    Done(Option<SocketAddr>),
    NotYet,
    Gone,
    Invalid(String),
}

/// Peeks at `io` without waiting; if a whole header is there, reads
/// exactly its bytes. Its buffer is on this function's stack.
fn take_header(io: &TcpStream, mode: ProxyProtocol) -> Taken {
    let fd = io.as_raw_fd();
    let mut buf = [0u8; MAX_PROXY_HEADER];
    let n = match recv(fd, &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) => return Taken::Gone,
        Ok(n) => n,
        Err(Errno::EAGAIN | Errno::EINTR) => return Taken::NotYet,
        Err(_) => return Taken::Gone,
    };
    match parse(&buf[..n], mode) {
        Parsed::Header { len, client } => {
            // The bytes are in the kernel already (just peeked): one read
            // takes exactly them.
            match recv(fd, &mut buf[..len], MsgFlags::MSG_DONTWAIT) {
                Ok(got) if got == len => Taken::Done(client),
                _ => Taken::Gone,
            }
        }
        Parsed::Partial if n == MAX_PROXY_HEADER => Taken::Invalid(format!(
            "a PROXY protocol header longer than {MAX_PROXY_HEADER} bytes"
        )),
        Parsed::Partial => Taken::NotYet,
        Parsed::Invalid(why) => Taken::Invalid(why),
    }
}

/// The values of the header `name` (lower case) in a request head that was
/// already checked (`classify::consume_head`): one per line it is on.
pub(crate) fn header_values<'a>(head: &'a [u8], name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    head.split(|b| *b == b'\n').skip(1).filter_map(move |line| {
        let colon = line.iter().position(|b| *b == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(name)
            .then(|| line[colon + 1..].trim_ascii())
    })
}

/// The client's address by `X-Forwarded-For` (the values of every such
/// header, in order) when the connection's peer is a trusted proxy: the
/// rightmost address that is not itself a trusted proxy (what the proxies
/// nearest this server saw), or the peer if the header names none.
/// An unparseable entry ends the walk there: what is left of it was
/// written by someone untrusted.
pub(crate) fn forwarded_for<'a>(
    peer: IpAddr,
    trusted: &Nets,
    values: impl Iterator<Item = &'a [u8]>,
) -> IpAddr {
    if trusted.is_empty() || !trusted.contains(peer) {
        return peer;
    }
    let entries: Vec<&[u8]> = values.flat_map(|v| v.split(|b| *b == b',')).collect();
    let mut client = peer;
    for entry in entries.iter().rev() {
        let Some(ip) = std::str::from_utf8(entry)
            .ok()
            .and_then(|s| parse_forwarded_ip(s.trim()))
        else {
            break;
        };
        client = ip;
        if !trusted.contains(ip) {
            break;
        }
    }
    client
}

/// An `X-Forwarded-For` entry: an address, with a port or in brackets
/// as some proxies write them.
fn parse_forwarded_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// A client's address as the limits see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Client {
    /// The address (an IPv4 address mapped into IPv6 as itself).
    pub(crate) ip: IpAddr,
    /// It came from a PROXY header or `X-Forwarded-For`, not the socket:
    /// then a loopback or unspecified address is a claim, never exempt.
    pub(crate) claimed: bool,
}

impl Client {
    pub(crate) fn new(ip: IpAddr, claimed: bool) -> Client {
        Client {
            ip: ip.to_canonical(),
            claimed,
        }
    }
}

/// What was refused, for `/stats` `limits.refused` and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `limits.streams_per_ip`.
    Streams,
    /// `limits.stream_opens_per_ip_per_s`.
    Opens,
    /// `limits.publishes_per_ip_per_s`.
    Publishes,
    /// `limits.tls_handshakes_per_ip_per_s`.
    TlsHandshakes,
}

impl Refused {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refused::Streams => "streams",
            Refused::Opens => "stream_opens",
            Refused::Publishes => "publishes",
            Refused::TlsHandshakes => "tls_handshakes",
        }
    }
}

/// Where a counted stream's address is kept: an index into [`Slots`]'
/// table, which is all a stream carries (4 bytes, in what was padding of
/// its task cell: the lean stream does not grow).
pub(crate) type Slot = std::num::NonZeroU32;

/// The addresses with streams open and their counts: an address costs
/// one table row and one map entry while it has streams open, a stream
/// nothing here.
#[derive(Debug, Default)]
struct Slots {
    /// Address to its row (index + 1).
    by_ip: HashMap<IpAddr, Slot>,
    /// Rows: an address and its open streams (0: free).
    rows: Vec<(IpAddr, u32)>,
    /// Free rows.
    free: Vec<Slot>,
}

impl Slots {
    /// One more stream for `ip`, if it has fewer than `max`.
    fn take(&mut self, ip: IpAddr, max: u32) -> Option<Slot> {
        if let Some(&slot) = self.by_ip.get(&ip) {
            let row = &mut self.rows[slot.get() as usize - 1];
            if row.1 >= max {
                return None;
            }
            row.1 += 1;
            return Some(slot);
        }
        if max == 0 {
            return None;
        }
        let reusable = loop {
            match self.free.pop() {
                Some(slot)
                    if (slot.get() as usize) <= self.rows.len()
                        && self.rows[slot.get() as usize - 1].1 == 0 =>
                {
                    break Some(slot);
                }
                Some(_) => {}
                None => break None,
            }
        };
        let slot = match reusable {
            Some(slot) => {
                self.rows[slot.get() as usize - 1] = (ip, 1);
                slot
            }
            None => {
                self.rows.push((ip, 1));
                Slot::new(self.rows.len() as u32).expect("a row's index + 1 is not 0")
            }
        };
        self.by_ip.insert(ip, slot);
        Some(slot)
    }

    /// Gives back memory a burst of addresses left (run by the sweep).
    fn shrink(&mut self) {
        let rows = self.rows.len();
        self.free.retain(|s| s.get() as usize <= rows);
        if self.rows.capacity() > 4 * rows.max(16) {
            self.rows.shrink_to_fit();
            self.free.shrink_to_fit();
            self.by_ip.shrink_to_fit();
        }
    }

    /// One stream fewer in `slot`; the row is freed with its last.
    fn give_back(&mut self, slot: Slot) {
        let Some(row) = self.rows.get_mut(slot.get() as usize - 1) else {
            return;
        };
        if row.1 == 0 {
            return;
        }
        row.1 -= 1;
        if row.1 == 0 {
            let ip = row.0;
            self.by_ip.remove(&ip);
            self.free.push(slot);
            // The table's free tail is cut off (its memory goes back at the
            // next sweep, [`Slots::shrink`]); `free` may then name rows past
            // the end, skipped when taken.
            while self.rows.last().is_some_and(|r| r.1 == 0) {
                self.rows.pop();
            }
            if self.rows.is_empty() {
                self.free.clear();
            }
        }
    }
}

/// Most addresses remembered for the once-a-minute refusal log line.
const MAX_LOGGED: usize = 10_000;

/// The limits per client address (`[limits]`).
#[derive(Debug)]
pub(crate) struct Limits {
    settings: LimitSettings,
    exempt: Nets,
    /// Open streams by address; an address leaves when its last closes.
    streams: Mutex<Slots>,
    opens: Option<DefaultKeyedRateLimiter<IpAddr>>,
    publishes: Option<DefaultKeyedRateLimiter<IpAddr>>,
    tls_handshakes: Option<DefaultKeyedRateLimiter<IpAddr>>,
    /// When each refusing address was last logged, and for which limit.
    logged: Mutex<HashMap<IpAddr, (Instant, Refused)>>,
    pub(crate) refused_streams: AtomicU64,
    pub(crate) refused_opens: AtomicU64,
    pub(crate) refused_publishes: AtomicU64,
    pub(crate) refused_tls_handshakes: AtomicU64,
}

/// `rate` as a quota; `None`: off.
fn quota(rate: Rate) -> Option<Quota> {
    let per_s = NonZeroU32::new(rate.per_s)?;
    Some(Quota::per_second(per_s).allow_burst(NonZeroU32::new(rate.burst).unwrap_or(per_s)))
}

/// A rate as a refusal names it: "5 publishes a second (bursts of 5)".
fn per_second(what: &str, rate: Rate) -> String {
    format!("{} {what} a second (bursts of {})", rate.per_s, rate.burst)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Limits {
    pub(crate) fn new(settings: &LimitSettings) -> Result<Limits, String> {
        Ok(Limits {
            exempt: Nets::parse(&settings.exempt)?,
            settings: settings.clone(),
            streams: Mutex::new(Slots::default()),
            opens: quota(settings.stream_opens()).map(DefaultKeyedRateLimiter::keyed),
            publishes: quota(settings.publishes()).map(DefaultKeyedRateLimiter::keyed),
            tls_handshakes: quota(settings.tls_handshakes()).map(DefaultKeyedRateLimiter::keyed),
            logged: Mutex::new(HashMap::new()),
            refused_streams: AtomicU64::new(0),
            refused_opens: AtomicU64::new(0),
            refused_publishes: AtomicU64::new(0),
            refused_tls_handshakes: AtomicU64::new(0),
        })
    }

    /// Whether the limits apply to `ip` (not exempt).
    fn applies(&self, client: Client) -> bool {
        let suspicious = client.claimed && (client.ip.is_loopback() || client.ip.is_unspecified());
        suspicious || !self.exempt.contains(client.ip)
    }

    /// Whether any limit is on.
    pub(crate) fn enabled(&self) -> bool {
        self.settings.streams_per_ip > 0
            || self.opens.is_some()
            || self.publishes.is_some()
            || self.tls_handshakes.is_some()
    }

    /// A new stream from `client`, before its token is checked (a flood of
    /// bad tokens is limited too): its opening rate.
    pub(crate) fn admit_open(&self, client: Client) -> Result<(), ApiError> {
        self.rate(self.opens.as_ref(), client, Refused::Opens)
    }

    /// A new stream from `client` that passed every other check: its
    /// count. On success it is counted until its slot is given back
    /// ([`Limits::stream_closed`]); answers the slot (`None`: not counted).
    pub(crate) fn count_stream(&self, client: Client) -> Result<Option<Slot>, ApiError> {
        let max = self.settings.streams_per_ip;
        if max == 0 || !self.applies(client) {
            return Ok(None);
        }
        let slot = lock(&self.streams).take(client.ip, max);
        match slot {
            Some(slot) => Ok(Some(slot)),
            None => Err(self.refuse(client.ip, Refused::Streams, Duration::from_secs(5))),
        }
    }

    /// A stream counted in `slot` closed (or was refused after it was
    /// counted): its address gets the place back.
    pub(crate) fn stream_closed(&self, slot: Slot) {
        lock(&self.streams).give_back(slot);
    }

    /// A `/send` or `/broadcast` from `client`.
    pub(crate) fn admit_publish(&self, client: Client) -> Result<(), ApiError> {
        self.rate(self.publishes.as_ref(), client, Refused::Publishes)
    }

    /// A connection from `client` on a TLS port, before its handshake.
    pub(crate) fn admit_tls_handshake(&self, client: Client) -> Result<(), ApiError> {
        self.rate(self.tls_handshakes.as_ref(), client, Refused::TlsHandshakes)
    }

    /// One more of `what` from `client` against `limiter` (if on).
    fn rate(
        &self,
        limiter: Option<&DefaultKeyedRateLimiter<IpAddr>>,
        client: Client,
        what: Refused,
    ) -> Result<(), ApiError> {
        if let Some(limiter) = limiter
            && self.applies(client)
            && let Err(not_until) = limiter.check_key(&client.ip)
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(self.refuse(client.ip, what, wait));
        }
        Ok(())
    }

    /// Counts a refusal, logs it (once a minute per address), and answers
    /// 429 with `Retry-After` (a TLS handshake is not answered: its
    /// connection is closed).
    fn refuse(&self, ip: IpAddr, what: Refused, wait: Duration) -> ApiError {
        let (counter, limit) = match what {
            Refused::Streams => (
                &self.refused_streams,
                format!("{} open streams", self.settings.streams_per_ip),
            ),
            Refused::Opens => (
                &self.refused_opens,
                per_second("new streams", self.settings.stream_opens()),
            ),
            Refused::Publishes => (
                &self.refused_publishes,
                per_second("publishes", self.settings.publishes()),
            ),
            Refused::TlsHandshakes => (
                &self.refused_tls_handshakes,
                per_second("TLS handshakes", self.settings.tls_handshakes()),
            ),
        };
        let answer = match what {
            Refused::TlsHandshakes => "its connection closed",
            _ => "429",
        };
        let total = counter.fetch_add(1, Relaxed) + 1;
        let now = Instant::now();
        let mut logged = lock(&self.logged);
        let due = logged
            .get(&ip)
            .is_none_or(|(at, _)| now.duration_since(*at) >= Duration::from_secs(60));
        if due && (logged.len() < MAX_LOGGED || logged.contains_key(&ip)) {
            logged.insert(ip, (now, what));
            drop(logged);
            tracing::warn!(
                event = "limit_refused",
                client = %ip,
                limit = what.name(),
                refused_total = total,
                "a client address is over its limit ({limit}); refused with {answer} (logged once a minute per address)"
            );
        }
        ApiError::OverLimit {
            what: what.name(),
            limit,
            retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
        }
    }

    /// Drops what no longer needs keeping: rate states that would be full
    /// again, log times older than a minute. Run every few seconds.
    pub(crate) fn sweep(&self) {
        lock(&self.streams).shrink();
        for limiter in [&self.opens, &self.publishes, &self.tls_handshakes]
            .into_iter()
            .flatten()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        let now = Instant::now();
        lock(&self.logged).retain(|_, (at, _)| now.duration_since(*at) < Duration::from_secs(60));
    }

    /// Addresses with streams counted, and addresses whose rates are
    /// tracked.
    pub(crate) fn tracked(&self) -> (usize, usize) {
        let rates = [&self.opens, &self.publishes, &self.tls_handshakes]
            .into_iter()
            .flatten()
            .map(|l| l.len())
            .sum();
        (lock(&self.streams).by_ip.len(), rates)
    }

    /// The client addresses refused (and logged) within about the last
    /// minute, at most 20, the latest first: `/stats` `limits.refusing`,
    /// for who holds the publish token.
    pub(crate) fn refusing(&self) -> Value {
        let mut refusing: Vec<(IpAddr, Instant, Refused)> = lock(&self.logged)
            .iter()
            .map(|(ip, (at, what))| (*ip, *at, *what))
            .collect();
        refusing.sort_by_key(|r| std::cmp::Reverse(r.1));
        Value::from(
            refusing
                .iter()
                .take(20)
                .map(|(ip, at, what)| {
                    json!({"address": ip.to_string(), "limit": what.name(), "seconds_ago": at.elapsed().as_secs()})
                })
                .collect::<Vec<_>>(),
        )
    }

    /// `/stats` `limits`.
    pub(crate) fn stats(&self) -> Value {
        let (with_streams, rate_tracked) = self.tracked();
        json!({
            "refused": {
                "streams": self.refused_streams.load(Relaxed),
                "stream_opens": self.refused_opens.load(Relaxed),
                "publishes": self.refused_publishes.load(Relaxed),
                "tls_handshakes": self.refused_tls_handshakes.load(Relaxed),
            },
            "addresses_with_streams": with_streams,
            "addresses_rate_tracked": rate_tracked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend(((addresses.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend(addresses);
        h.extend(tlvs);
        h
    }

    #[test]
    fn v1_headers_give_the_source_address() {
        let line = b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 8000\r\nGET /test/a HTTP/1.1\r\n";
        assert_eq!(
            parse(line, ProxyProtocol::Any),
            Parsed::Header {
                len: 46,
                client: Some("192.0.2.7:51234".parse().unwrap())
            }
        );
        let line6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 80\r\n";
        assert_eq!(
            parse(line6, ProxyProtocol::V1),
            Parsed::Header {
                len: line6.len(),
                client: Some("[2001:db8::7]:4000".parse().unwrap())
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n", ProxyProtocol::V1),
            Parsed::Header {
                len: 15,
                client: None
            }
        );
        for cut in 1..line.len().min(45) {
            assert_eq!(parse(&line[..cut], ProxyProtocol::Any), Parsed::Partial, "{cut}");
        }
    }

    #[test]
    fn v2_headers_with_tlvs_give_the_source_address() {
        let addrs = [192, 0, 2, 7, 198, 51, 100, 1, 0xC8, 0x22, 0x1F, 0x40];
        // An ALPN TLV and a unique-id TLV, as HAProxy sends them.
        let tlvs = [0x01, 0x00, 0x02, b'h', b'2', 0x05, 0x00, 0x03, b'a', b'b', b'c'];
        let h = v2(1, 0x11, &addrs, &tlvs);
        let mut with_request = h.clone();
        with_request.extend_from_slice(b"GET /test/a HTTP/1.1\r\n");
        assert_eq!(
            parse(&with_request, ProxyProtocol::V2),
            Parsed::Header {
                len: h.len(),
                client: Some("192.0.2.7:51234".parse().unwrap())
            }
        );
        for cut in 1..h.len() {
            assert_eq!(parse(&h[..cut], ProxyProtocol::Any), Parsed::Partial, "{cut}");
        }
        // LOCAL (a health check of the balancer itself): no address.
        assert_eq!(
            parse(&v2(0, 0x00, &[], &[]), ProxyProtocol::V2),
            Parsed::Header {
                len: 16,
                client: None
            }
        );
    }

    #[test]
    fn no_header_garbage_or_the_other_version_is_refused() {
        for (input, mode) in [
            (&b"PROXY TCP4 1.2.3.4\r\n"[..], ProxyProtocol::Any),
            (b"PROXY TCP4\r\n", ProxyProtocol::V1),
            (b"\r\n\r\n\0\r\nQUIT\n\x21\x11\xff\xff", ProxyProtocol::V2),
            (&b"GET /test/a HTTP/1.1\r\n"[..], ProxyProtocol::Any),
            (b"PROXY TCP4 not-an-address 1.2.3.4 1 2\r\n", ProxyProtocol::V1),
            (
                b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 8000\r\n",
                ProxyProtocol::V2,
            ),
            (b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c", ProxyProtocol::V1),
            (b"\r\n\r\n\0\r\nQUIT\n\x31\x11\x00\x0c", ProxyProtocol::V2),
        ] {
            assert!(matches!(parse(input, mode), Parsed::Invalid(_)), "{input:?}");
        }
    }

    /// `limits.tls_handshakes_burst` 0 follows the rate: at 2 a second, two
    /// handshakes at once and not a third; an exempt address is not counted.
    #[test]
    fn tls_handshakes_burst_follows_the_rate_when_zero() {
        let mut settings = crate::Settings::defaults().limits;
        settings.tls_handshakes_per_ip_per_s = 2;
        settings.tls_handshakes_burst = 0;
        settings.exempt = "192.0.2.9".into();
        let limits = Limits::new(&settings).unwrap();
        let client = Client::new("192.0.2.1".parse().unwrap(), false);
        assert!(limits.admit_tls_handshake(client).is_ok());
        assert!(limits.admit_tls_handshake(client).is_ok());
        assert!(limits.admit_tls_handshake(client).is_err());
        assert_eq!(limits.refused_tls_handshakes.load(Relaxed), 1);
        let exempt = Client::new("192.0.2.9".parse().unwrap(), false);
        for _ in 0..5 {
            assert!(limits.admit_tls_handshake(exempt).is_ok());
        }
        assert_eq!(limits.stats()["refused"]["tls_handshakes"], 1);
    }

    #[test]
    fn slots_count_per_address_and_free_their_rows() {
        let mut slots = Slots::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let sa = slots.take(a, 2).unwrap();
        assert_eq!(slots.take(a, 2), Some(sa));
        assert_eq!(slots.take(a, 2), None, "a third over 2");
        let sb = slots.take(b, 2).unwrap();
        assert_ne!(sa, sb);
        slots.give_back(sa);
        assert_eq!(slots.take(a, 2), Some(sa), "a place back");
        slots.give_back(sa);
        slots.give_back(sa);
        assert!(!slots.by_ip.contains_key(&a), "gone with its last stream");
        slots.give_back(sa);
        assert_eq!(
            slots.rows[sb.get() as usize - 1],
            (b, 1),
            "a stale give-back touches nothing else"
        );
        slots.give_back(sb);
        assert!(slots.rows.is_empty() && slots.by_ip.is_empty(), "{slots:?}");
        assert_eq!(slots.take(b, 0), None);
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted = Nets::parse("10.0.0.0/8, 192.0.2.1").unwrap();
        let peer: IpAddr = "10.1.2.3".parse().unwrap();
        let client = |peer: IpAddr, values: &[&str]| {
            forwarded_for(peer, &trusted, values.iter().map(|v| v.as_bytes()))
        };
        assert_eq!(
            client(peer, &["203.0.113.9"]),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        // A client's own forgery sits left of what the trusted proxies wrote.
        assert_eq!(
            client(peer, &["6.6.6.6, 203.0.113.9, 10.9.9.9"]),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client(peer, &["6.6.6.6", "203.0.113.9:4321"]),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client(peer, &["garbage, 203.0.113.9"]),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client(peer, &[]), peer);
        let untrusted: IpAddr = "198.51.100.4".parse().unwrap();
        assert_eq!(client(untrusted, &["203.0.113.9"]), untrusted);
        assert!(Nets::parse("10.0.0.0/33").is_err());
    }
}

/// Property tests: the PROXY header reader never panics, whatever arrives,
/// and a v2 header that is all there is never taken for the start of one
/// (it would be held until the head deadline and answered 408, not 400).
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// A valid v1 header for an arbitrary IPv4 or IPv6 client.
    fn v1_header() -> impl Strategy<Value = Vec<u8>> {
        (any::<bool>(), any::<[u8; 16]>(), any::<u16>(), any::<u16>()).prop_map(|(six, a, sp, dp)| {
            if six {
                let (src, dst) = (std::net::Ipv6Addr::from(a), std::net::Ipv6Addr::LOCALHOST);
                format!("PROXY TCP6 {src} {dst} {sp} {dp}\r\n").into_bytes()
            } else {
                let src = std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                format!("PROXY TCP4 {src} 127.0.0.1 {sp} {dp}\r\n").into_bytes()
            }
        })
    }

    /// A valid v2 PROXY header (IPv4 or IPv6) with well-formed TLVs.
    fn v2_header() -> impl Strategy<Value = Vec<u8>> {
        let tlv = (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..20));
        (
            any::<bool>(),
            any::<[u8; 36]>(),
            proptest::collection::vec(tlv, 0..4),
        )
            .prop_map(|(six, addresses, tlvs)| {
                let mut body = if six {
                    addresses.to_vec()
                } else {
                    addresses[..12].to_vec()
                };
                for (kind, value) in tlvs {
                    body.push(kind);
                    body.extend((value.len() as u16).to_be_bytes());
                    body.extend(value);
                }
                let mut h = V2_SIGNATURE.to_vec();
                h.extend([0x21, if six { 0x21 } else { 0x11 }]);
                h.extend((body.len() as u16).to_be_bytes());
                h.extend(body);
                h
            })
    }

    fn mode() -> impl Strategy<Value = ProxyProtocol> {
        prop_oneof![
            Just(ProxyProtocol::V1),
            Just(ProxyProtocol::V2),
            Just(ProxyProtocol::Any)
        ]
    }

    /// Some bytes of `h` overwritten, then `h` cut or lengthened.
    fn mutated(h: Vec<u8>, edits: Vec<(usize, u8)>, len: usize) -> Vec<u8> {
        let mut h = h;
        for (at, b) in edits {
            let at = at % h.len();
            h[at] = b;
        }
        h.resize(len.min(MAX_PROXY_HEADER), 0);
        h
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Arbitrary bytes, or arbitrary bytes after a v2 signature, never
        /// panic.
        #[test]
        fn any_bytes_are_answered(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            signed in any::<bool>(),
            mode in mode(),
        ) {
            let buf = if signed { [V2_SIGNATURE, &bytes].concat() } else { bytes };
            let _ = parse(&buf, mode);
        }

        /// A valid header is taken whole, every cut of it is the start of
        /// one; mutated, it never panics, and a complete v2 header (its
        /// declared length all there) is taken or refused, never waited on.
        #[test]
        fn mutated_headers_are_taken_or_refused(
            h in prop_oneof![v1_header(), v2_header()],
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            len in 0usize..400,
            mode in mode(),
        ) {
            let v2 = h.starts_with(V2_SIGNATURE);
            if matches!((v2, mode), (true, ProxyProtocol::V2 | ProxyProtocol::Any) | (false, ProxyProtocol::V1 | ProxyProtocol::Any)) {
                let taken = matches!(parse(&h, mode), Parsed::Header { len, .. } if len == h.len());
                prop_assert!(taken, "{:?}", h);
                let cut = len % h.len();
                prop_assert_eq!(parse(&h[..cut], mode), Parsed::Partial);
            }
            let m = mutated(h, edits, len);
            let parsed = parse(&m, mode);
            if m.len() >= 16 && m.starts_with(V2_SIGNATURE) {
                let declared = 16 + usize::from(u16::from_be_bytes([m[14], m[15]]));
                if m.len() >= declared {
                    prop_assert_ne!(parsed, Parsed::Partial, "{:?}", m);
                }
            }
        }

        /// A v2 PROXY header whose last TLV runs past the declared end is
        /// refused as soon as the declared length is in.
        #[test]
        fn a_tlv_past_the_end_is_refused(
            h in v2_header(),
            kind in any::<u8>(),
            over in 1u16..200,
            have in proptest::collection::vec(any::<u8>(), 0..10),
        ) {
            let mut h = h;
            h.push(kind);
            h.extend((have.len() as u16 + over).to_be_bytes());
            h.extend(&have);
            let n = (h.len() - 16) as u16;
            h[14..16].copy_from_slice(&n.to_be_bytes());
            prop_assert!(matches!(parse(&h, ProxyProtocol::V2), Parsed::Invalid(_)));
        }
    }
}
