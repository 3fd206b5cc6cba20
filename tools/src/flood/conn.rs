//! One held stream: connect (optionally from a chosen source address), send
//! the request, then count events until the server closes.
//!
//! Per-stream memory is the point: the task's state is the socket, the
//! parser (~70 bytes) and a few integers. Reads go through one buffer per
//! thread, never held across an await.
//!
//! An `https://` stream is the same task over a [`Tls`] connection instead
//! of a [`TcpStream`]: the task is generic over [`Conn`], so a plain
//! stream's task is exactly what it was without TLS (the TLS one holds a
//! pointer to its rustls state in the socket's place).

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};

use super::Plan;
use super::parse::{EventParser, Fed, ParseError, broadcast_stamp_of, stamp_of};
use super::report::{Counters, ErrorKind};
use crate::sys;
use crate::target::Target;
use crate::tls::{self, TlsStream};

thread_local! {
    /// The one read buffer of this thread's streams.
    static READ_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; 64 * 1024]);
}

/// A held stream's connection to the server: what [`open`] makes of a
/// connected socket, and what [`read_some`] reads.
pub(super) trait Conn: Sized {
    /// Makes the connection of a connected socket to `target` (the TLS
    /// handshake for [`Tls`]).
    fn establish(tcp: TcpStream, plan: &Plan, target: &Target) -> impl Future<Output = io::Result<Self>>;

    /// Sends all of `bytes`.
    fn send(&mut self, bytes: &[u8]) -> impl Future<Output = io::Result<()>>;

    /// Reads what has arrived into `buf`; `Ready(Ok(0))` at the end.
    fn poll_read_into(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>>;
}

/// A plain stream: readiness is waited for with `poll_read_ready`, which
/// keeps the waker in the socket's own registration, so the wait adds no
/// state to the task.
impl Conn for TcpStream {
    async fn establish(tcp: TcpStream, _: &Plan, _: &Target) -> io::Result<Self> {
        Ok(tcp)
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_all(bytes).await
    }

    fn poll_read_into(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_read_ready(cx))?;
            match self.try_read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
        }
    }
}

/// An `https://` stream: boxed, so the task holds a pointer where a plain
/// one holds its socket (the socket and rustls's connection state, which
/// is far larger, live behind it).
pub(super) type Tls = Box<TlsStream>;

impl Conn for Tls {
    async fn establish(tcp: TcpStream, plan: &Plan, target: &Target) -> io::Result<Self> {
        let config = plan.tls.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "an https:// target without a TLS configuration",
            )
        })?;
        tls::handshake(config, &target.host, tcp).await.map(Box::new)
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_all(bytes).await?;
        self.flush().await
    }

    fn poll_read_into(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut read = ReadBuf::new(buf);
        ready!(Pin::new(&mut **self).poll_read(cx, &mut read))?;
        Poll::Ready(Ok(read.filled().len()))
    }
}

/// Starts stream `i`'s task: [`hold`] or [`churn`] (`--lifetime`), over
/// plain TCP or TLS as its URL says.
pub(super) fn spawn(i: u64, plan: Rc<Plan>, counters: Rc<Counters>) {
    let tls = plan.target(plan.first_n + i).tls;
    match (plan.lifetime, tls) {
        (None, false) => drop(tokio::task::spawn_local(hold::<TcpStream>(i, plan, counters))),
        (None, true) => drop(tokio::task::spawn_local(hold::<Tls>(i, plan, counters))),
        (Some(life), false) => drop(tokio::task::spawn_local(churn::<TcpStream>(
            i, plan, counters, life,
        ))),
        (Some(life), true) => drop(tokio::task::spawn_local(churn::<Tls>(i, plan, counters, life))),
    }
}

/// Opens stream `i` of this process and holds it until it closes.
pub(super) async fn hold<S: Conn>(i: u64, plan: Rc<Plan>, counters: Rc<Counters>) {
    // Boxed: the opening phase (connect, timers, request) is large and
    // short-lived; what stays for the stream's life is only the socket and
    // the parser.
    let mut clock = TickClock::new(plan.tick_interval);
    let Some((mut stream, mut parser)) = Box::pin(open::<S>(i, plan, &counters, &mut clock)).await else {
        return;
    };
    counters.established(i as usize);
    while let Ok(Fed::More) = read_some(&mut stream, &mut parser, &mut clock, &counters).await {}
    counters.closed(i as usize);
}

/// With `--lifetime`: pause before opening again after a failed open or a
/// close by the server (no tight reconnect loop against a server that cuts).
const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// With `--lifetime`: how long a leaving stream keeps reading, so messages
/// sent to it just before it stopped being a target still arrive.
const LEAVE_DRAIN: Duration = Duration::from_secs(1);

/// Like [`hold`], but churning: holds stream `i` for a random time between
/// half and one and a half `lifetime`, stops it being a message target,
/// reads for [`LEAVE_DRAIN`] more, closes it and opens it again; until the
/// run ends (the task is dropped then). A stream the server closes is
/// counted closed and opened again too.
pub(super) async fn churn<S: Conn>(i: u64, plan: Rc<Plan>, counters: Rc<Counters>, lifetime: Duration) {
    let mut rng = SmallRng::seed_from_u64(i ^ now_micros());
    loop {
        let mut clock = TickClock::new(plan.tick_interval);
        let Some((mut stream, mut parser)) =
            Box::pin(open::<S>(i, Rc::clone(&plan), &counters, &mut clock)).await
        else {
            tokio::time::sleep(REOPEN_PAUSE).await;
            continue;
        };
        counters.established(i as usize);
        let until = tokio::time::Instant::now() + lifetime.mul_f64(rng.random_range(0.5..1.5));
        if !read_until(&mut stream, &mut parser, &mut clock, &counters, until).await {
            counters.closed(i as usize);
            tokio::time::sleep(REOPEN_PAUSE).await;
            continue;
        }
        counters.leaving(i as usize);
        let drain = tokio::time::Instant::now() + LEAVE_DRAIN;
        read_until(&mut stream, &mut parser, &mut clock, &counters, drain).await;
        drop(stream);
        counters.churned();
    }
}

/// Reads events until `until`; false if the stream ended before.
async fn read_until(
    stream: &mut impl Conn,
    parser: &mut EventParser,
    clock: &mut TickClock,
    counters: &Counters,
    until: tokio::time::Instant,
) -> bool {
    loop {
        tokio::select! {
            r = read_some(&mut *stream, parser, clock, counters) => if !matches!(r, Ok(Fed::More)) {
                return false;
            },
            () = tokio::time::sleep_until(until) => return true,
        }
    }
}

/// Connects, sends the request and reads the response head. `None` when it
/// failed (counted by kind).
async fn open<S: Conn>(
    i: u64,
    plan: Rc<Plan>,
    counters: &Counters,
    clock: &mut TickClock,
) -> Option<(S, EventParser)> {
    let n = plan.first_n + i;
    let (addr, path, src) = plan.conn(n);
    let mut tcp = match tokio::time::timeout(plan.connect_timeout, connect(addr, src)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return fail(counters, ErrorKind::of(&e)),
        Err(_) => return fail(counters, ErrorKind::Timeout),
    };
    if let Some(version) = plan.proxy_protocol {
        let header = match (tcp.local_addr(), tcp.peer_addr()) {
            (Ok(src), Ok(dst)) => version.header(src, dst),
            (Err(e), _) | (_, Err(e)) => return fail(counters, ErrorKind::of(&e)),
        };
        if let Err(e) = tcp.write_all(&header).await {
            return fail(counters, ErrorKind::of(&e));
        }
    }
    let target = plan.target(n);
    let mut stream = match tokio::time::timeout(plan.connect_timeout, S::establish(tcp, &plan, target)).await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return fail(counters, ErrorKind::of(&e)),
        Err(_) => return fail(counters, ErrorKind::Timeout),
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nuser-agent: floodtest\r\n{}\r\n",
        plan.transport.request_headers()
    );
    if let Err(e) = stream.send(request.as_bytes()).await {
        return fail(counters, ErrorKind::of(&e));
    }
    let mut parser = EventParser::new(plan.transport);
    let head = tokio::time::timeout(
        plan.connect_timeout,
        read_until_body(&mut stream, &mut parser, clock, counters),
    )
    .await;
    match head {
        Ok(Ok(true)) => Some((stream, parser)),
        Ok(Ok(false)) => None,
        Ok(Err(e)) => fail(counters, ErrorKind::of(&e)),
        Err(_) => fail(counters, ErrorKind::Timeout),
    }
}

fn fail<T>(counters: &Counters, kind: ErrorKind) -> Option<T> {
    counters.error(kind);
    None
}

async fn connect(addr: SocketAddr, src: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = src {
        sys::bind_address_no_port(&socket)?;
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(addr).await
}

/// Reads until the response head is through. `Ok(false)`: the server
/// answered with something other than a stream (already counted).
async fn read_until_body(
    stream: &mut impl Conn,
    parser: &mut EventParser,
    clock: &mut TickClock,
    counters: &Counters,
) -> io::Result<bool> {
    while !parser.in_body() {
        match read_some(&mut *stream, parser, clock, counters).await {
            Ok(Fed::More) => {}
            Ok(Fed::Ended) => return Ok(parser.in_body()),
            Err(ReadError::Io(e)) => return Err(e),
            Err(ReadError::Parse(ParseError::Status(code))) => {
                counters.error(ErrorKind::Status(code));
                return Ok(false);
            }
            Err(ReadError::Parse(ParseError::Framing)) => {
                counters.error(ErrorKind::Protocol);
                return Ok(false);
            }
        }
    }
    Ok(true)
}

enum ReadError {
    Io(io::Error),
    Parse(ParseError),
}

/// One read: feeds the parser, counts events and message latencies. The
/// wait is the connection's own ([`Conn::poll_read_into`]); the bytes go
/// through this thread's one buffer.
async fn read_some(
    stream: &mut impl Conn,
    parser: &mut EventParser,
    clock: &mut TickClock,
    counters: &Counters,
) -> Result<Fed, ReadError> {
    std::future::poll_fn(|cx| {
        READ_BUF.with_borrow_mut(|buf| {
            let n = match ready!(stream.poll_read_into(cx, buf)) {
                Ok(0) => return Poll::Ready(Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()))),
                Ok(n) => n,
                Err(e) => return Poll::Ready(Err(ReadError::Io(e))),
            };
            let fed = parser.feed(&buf[..n], |event| {
                counters.chunk();
                if let Some(sent) = broadcast_stamp_of(event) {
                    counters.broadcast_received(now_micros().saturating_sub(sent));
                } else if let Some(sent) = stamp_of(event) {
                    counters.message_received(sent, now_micros().saturating_sub(sent));
                } else if let Some(lag) = clock.event(event, now_micros()) {
                    counters.tick_arrived(now_micros(), lag);
                }
            });
            Poll::Ready(fed.map_err(ReadError::Parse))
        })
    })
    .await
}

/// One stream's tick schedule (`--tick-interval`): when its welcome
/// arrived and how many ticks came since. 24 bytes per held stream.
pub(super) struct TickClock {
    /// The interval in µs; 0 when not measuring.
    interval_us: u64,
    /// Arrival of the welcome, µs since the epoch (0: not yet).
    welcome_us: u64,
    /// Ticks seen since the welcome (the line's own number also counts
    /// messages, so the clock counts ticks itself).
    ticks: u64,
}

impl TickClock {
    pub(super) fn new(interval: Option<Duration>) -> Self {
        TickClock {
            interval_us: interval.map_or(0, |d| d.as_micros() as u64),
            welcome_us: 0,
            ticks: 0,
        }
    }

    /// Takes one event arriving at `now_us`. For a tick ("Chunk N for id
    /// X"), answers how late it is against welcome + k × interval, k being
    /// this tick's number (0 when it came early).
    pub(super) fn event(&mut self, event: &[u8], now_us: u64) -> Option<u64> {
        if self.interval_us == 0 {
            return None;
        }
        if event.starts_with(b"Switchboard welcomes you!") {
            self.welcome_us = now_us;
            return None;
        }
        if !event.starts_with(b"Chunk ") || self.welcome_us == 0 {
            return None;
        }
        self.ticks += 1;
        let due = self.welcome_us + self.ticks * self.interval_us;
        Some(now_us.saturating_sub(due))
    }
}

/// Microseconds since the Unix epoch: the clock message stamps use, so
/// sender and receiver may be different processes on this machine.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    /// The task state every held stream pays for; a regression here shows up
    /// as client bytes per connection.
    #[test]
    fn held_stream_state_stays_small() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let plan = std::rc::Rc::new(super::super::Plan {
            targets: vec![crate::target::Target::parse("http://127.0.0.1:1/test/{n}", false).unwrap()],
            ports: vec![],
            source_ips: vec![],
            first_n: 0,
            count: 1,
            rate: 1.0,
            max_opening: 1,
            msg_rate: 0.0,
            send: None,
            connect_timeout: std::time::Duration::from_secs(1),
            lifetime: None,
            tick_interval: None,
            transport: super::super::Transport::Chunked,
            proxy_protocol: None,
            tls: None,
        });
        let c = std::rc::Rc::new(super::Counters::new(1));
        let f = super::hold::<tokio::net::TcpStream>(0, std::rc::Rc::clone(&plan), std::rc::Rc::clone(&c));
        let size = std::mem::size_of_val(&f);
        assert!(size <= 256, "hold future grew to {size} bytes");
        // Over TLS the task holds a pointer to its rustls state where a plain
        // one holds its socket: no bigger.
        let tls = std::mem::size_of_val(&super::hold::<super::Tls>(0, plan, c));
        assert!(
            tls <= size,
            "a TLS stream's task is {tls} bytes, a plain one's {size}"
        );
    }

    #[test]
    fn ticks_are_late_against_welcome_plus_k_intervals() {
        let mut c = super::TickClock::new(Some(std::time::Duration::from_secs(1)));
        assert_eq!(
            c.event(b"Chunk 1 for id x", 5_000_000),
            None,
            "before the welcome"
        );
        assert_eq!(c.event(b"Switchboard welcomes you! Your Id: x", 10_000_000), None);
        assert_eq!(c.event(b"Chunk 1 for id x", 11_000_250), Some(250));
        assert_eq!(c.event(b"Recvd msg #2: 'hi'", 11_500_000), None);
        // The third event of the line's count is the second tick.
        assert_eq!(c.event(b"Chunk 3 for id x", 12_004_000), Some(4000));
        assert_eq!(c.event(b"Chunk 4 for id x", 12_990_000), Some(0), "early");
        let mut off = super::TickClock::new(None);
        assert_eq!(off.event(b"Switchboard welcomes you! Your Id: x", 1), None);
        assert_eq!(off.event(b"Chunk 1 for id x", 2_000_000), None);
    }
}
