//! Accepting and serving connections: the accept loop of one listener,
//! and [`serve`], the one place that decides each connection's fate. Its
//! PROXY header is read ([`edge`]), a TLS port's handshake is done
//! ([`crate::conn::tls`]), its request line is classified ([`classify`]),
//! and one `match` sends it to a lean stream (the Stream actor then owns
//! the socket, on this worker), the lean `/dispatcher` path, actix-web, or
//! a refusal. Connections on the internal listener go straight to
//! actix-web, marked [`socket::Internal`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use actix_rt::net::{TcpListener, TcpStream};
use actix_service::Service;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep};

use crate::admission::Admitted;
use crate::config::ProxyProtocol;
use crate::conn::classify::{self, Class, HeadError, HeadSource, Peeked};
use crate::conn::dispatcher;
use crate::conn::edge::{self, Client, ProxyError};
use crate::conn::socket::{self, Rewound};
use crate::conn::tls::{self, DecryptedHead, DecryptedLine, TlsIo, TlsWire};
use crate::conn::wire::{CLOSE_AFTER_ANSWER, Wire};
use crate::state::ServerState;
use crate::stats::Stats;
use crate::stream::{self, Open, Stream, Via};

/// Pause after `accept` fails for lack of file descriptors. The pending
/// connection stays in the backlog and is accepted once descriptors free up.
const FD_LIMIT_BACKOFF: Duration = Duration::from_millis(50);

/// Pause after any other unexpected `accept` failure.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Which listener a connection came in on, and so what it may become.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Listener {
    /// `server.host` with `server.port` and the extra ports: streams, the
    /// lean `/dispatcher`, everything else through actix-web; `tls` on a
    /// TLS port.
    Public { tls: bool },
    /// `server.admin_host:server.admin_port`: straight to actix-web, where
    /// the operator pages are served ([`socket::Internal`]).
    Internal,
}

/// Accepts on one listener until shutdown, at most as many HTTP
/// connections at once as `slots` allows (`server.max_connections` on the
/// public listeners, the internal listener's own limit on the internal one).
/// Running out of file descriptors is logged once per episode,
/// counted in `/stats` (`accept.fd_limit`), and retried after a pause; open
/// streams are not disturbed.
pub(crate) async fn accept_loop<S>(
    socket: TcpListener,
    listener: Listener,
    http: Rc<S>,
    state: Arc<ServerState>,
    slots: Arc<Semaphore>,
) where
    S: Service<Rewound, Response = (), Error = actix_http::error::DispatchError> + 'static,
{
    let mut fd_limit_since: Option<Instant> = None;
    loop {
        let permit = tokio::select! {
            biased;
            () = state.admission.shutdown.cancelled() => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            () = state.admission.shutdown.cancelled() => return,
            r = socket.accept() => r,
        };
        match accepted {
            Ok((io, _peer)) => {
                state.stats.accepted.fetch_add(1, Relaxed);
                if let Some(since) = fd_limit_since.take() {
                    tracing::info!(
                        event = "fd_limit_cleared",
                        paused_ms = since.elapsed().as_millis() as u64,
                        "file descriptors available again; accepting"
                    );
                }
                actix_rt::spawn(serve(io, listener, Rc::clone(&http), Arc::clone(&state), permit));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                state.stats.accept_fd_limit.fetch_add(1, Relaxed);
                if fd_limit_since.is_none() {
                    fd_limit_since = Some(Instant::now());
                    tracing::warn!(
                        event = "fd_limit",
                        cause = %e,
                        streams = state.stats.streams_active(),
                        connections = state.stats.http_active(),
                        "open-file limit reached; accepting again when descriptors free up"
                    );
                }
                sleep(FD_LIMIT_BACKOFF).await;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                state.stats.accept_errors.fetch_add(1, Relaxed);
                tracing::warn!(event = "accept_error", cause = %e, "accept failed");
                sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// A connection served by actix-web: its `max_connections` permit plus the
/// `http_active` count that shutdown waits on, both given back on drop.
struct HttpConn {
    _permit: OwnedSemaphorePermit,
    stats: Arc<Stats>,
}

impl HttpConn {
    fn new(permit: OwnedSemaphorePermit, stats: &Arc<Stats>) -> Self {
        stats.http_active.fetch_add(1, Relaxed);
        HttpConn {
            _permit: permit,
            stats: Arc::clone(stats),
        }
    }
}

impl Drop for HttpConn {
    fn drop(&mut self) {
        self.stats.http_active.fetch_sub(1, Relaxed);
    }
}

/// Serves one accepted connection: the one place that decides its fate.
///
/// While the head is classified the connection holds only its
/// `max_connections` permit: shutdown does not wait for it (a client that
/// never sends a head cannot hold shutdown up), and no shutdown future is
/// raced here: it would enlarge every connection's short-lived task, which
/// costs idle streams memory (docs/design-notes.md, "Per-stream memory").
async fn serve<S>(
    io: TcpStream,
    listener: Listener,
    http: Rc<S>,
    state: Arc<ServerState>,
    permit: OwnedSemaphorePermit,
) where
    S: Service<Rewound, Response = (), Error = actix_http::error::DispatchError> + 'static,
{
    let secure = match listener {
        Listener::Public { tls } => tls,
        Listener::Internal => {
            // Operators and Prometheus: no PROXY header, no TLS, no lean
            // paths; actix-web serves every route, the operator pages too.
            let _conn = HttpConn::new(permit, &state.stats);
            return Box::pin(serve_http(&*http, Rewound::new(io).internal())).await;
        }
    };
    let settings = &state.settings;
    let deadline = Instant::now() + settings.head_timeout();
    let max_line = settings.server.max_head_bytes;
    // Behind a load balancer: its PROXY header first, nothing else read.
    // Boxed, as below: only connections that have one pay for its future.
    let proxied = match settings.server.proxy_protocol {
        ProxyProtocol::Off => None,
        mode => match Box::pin(edge::read_proxy_header(&io, mode, deadline)).await {
            Ok(client) => client,
            Err(ProxyError::Gone) => return,
            Err(ProxyError::Timeout) => return state.refuse_head(io, HeadError::Timeout).await,
            Err(ProxyError::Invalid(why)) => {
                state.stats.proxy_refused.fetch_add(1, Relaxed);
                return Box::pin(state.refuse_proxy(io, why)).await;
            }
        },
    };
    if secure {
        // Before any handshake work, by the client's own address (the
        // PROXY header's, if any): over `limits.tls_handshakes_per_ip_per_s`
        // the connection is closed unanswered (counted and logged there).
        // (No local: it would be kept in every connection's task.)
        if state
            .admission
            .limits
            .admit_tls_handshake(Client::new(peer_ip(&state, &io, proxied), proxied.is_some()))
            .is_err()
        {
            return;
        }
        // Boxed: a TLS session's handshake future is large.
        return Box::pin(serve_tls(io, http, state, permit, deadline, proxied)).await;
    }
    // A statement of its own: the peek buffers are gone before the match.
    let class = classify::classify(
        &mut Peeked::new(&io, deadline, max_line),
        settings.stream.max_id_len,
    )
    .await;
    match class {
        Class::Stream { id, http10 } => {
            // Boxed: reading and checking the head would otherwise grow
            // every connection's task (docs/design-notes.md).
            Box::pin(serve_stream(io, id, http10, &state, permit, deadline, proxied)).await;
        }
        Class::Dispatcher => serve_dispatcher(io, &*http, &state, permit, deadline, proxied).await,
        Class::Http => {
            let _conn = HttpConn::new(permit, &state.stats);
            // Boxed: actix-web's HTTP/1 dispatcher future is large, and every
            // connection's task would carry its size while it is classified.
            Box::pin(serve_http(&*http, Rewound::new(io).with_client(proxied))).await;
        }
        Class::Timeout => state.refuse_head(io, HeadError::Timeout).await,
        Class::Fragment => {
            state
                .refuse_head(io, HeadError::Invalid(classify::FRAGMENT))
                .await
        }
        Class::Gone => {}
    }
}

/// A wire a lean stream can start on: the socket itself, or the socket with
/// its TLS session.
trait Lean: Wire + Sized {
    /// Where its request head is read from.
    fn head(&mut self) -> impl HeadSource + '_;

    /// Starts the lean stream `id` on it.
    fn start(self, id: Arc<str>, open: Open, shared: Arc<stream::Shared>);
}

impl Lean for TcpStream {
    fn head(&mut self) -> impl HeadSource + '_ {
        classify::Plain::new(self)
    }

    fn start(self, id: Arc<str>, open: Open, shared: Arc<stream::Shared>) {
        Stream::start_lean(self, id, open, shared);
    }
}

impl Lean for TlsWire {
    fn head(&mut self) -> impl HeadSource + '_ {
        DecryptedHead::new(&self.io, &mut self.session)
    }

    fn start(mut self, id: Arc<str>, open: Open, shared: Arc<stream::Shared>) {
        // What followed the head was looked at by the admission, as on a
        // plain connection; the stream reads on from the socket.
        self.session.plain = Vec::new();
        Stream::start_lean_tls(self.io, self.session, id, open, shared);
    }
}

/// A lean stream request whose line has been classified (`http10`: its
/// request line said HTTP/1.0, which changes what a valid head is), plain
/// or TLS: reads and checks its head, then starts the stream or refuses it
/// ([`crate::admission::Admission::admit_stream`], before any stream state
/// exists).
async fn serve_stream(
    mut wire: impl Lean,
    id: Arc<str>,
    http10: bool,
    state: &Arc<ServerState>,
    permit: OwnedSemaphorePermit,
    deadline: Instant,
    proxied: Option<SocketAddr>,
) {
    let max_head = state.settings.server.max_head_bytes;
    let peer = peer_ip(state, wire.socket(), proxied);
    let admitted = classify::consume_head(&mut wire.head(), deadline, max_head, http10, |head, early| {
        let client = state.admission.client_of_head(peer, proxied.is_some(), head);
        state.admission.admit_stream(&id, head, early, Via::Lean, client)
    })
    .await;
    let admitted = match admitted {
        // Its token's key must be fetched first. Boxed: only such
        // requests carry the wait's future.
        Ok(Ok(Admitted::Later(pending))) => Ok(Box::pin(state.admission.complete(pending)).await),
        Ok(Ok(Admitted::Open(open))) => Ok(Ok(open)),
        Ok(Err(refused)) => Ok(Err(refused)),
        Err(e) => Err(e),
    };
    match admitted {
        Ok(Ok(open)) => {
            // A stream is not an HTTP connection: its slot is counted by
            // `stream.max_streams` from here on.
            drop(permit);
            wire.start(id, open, Arc::clone(&state.streams));
        }
        Ok(Err(refused)) => socket::refuse(wire, &refused.error, refused.cors.as_cors()).await,
        Err(e) => state.refuse_head(wire, e).await,
    }
}

/// A connection on a TLS port: the handshake, then the same decision as
/// [`serve`] makes, on the decrypted request head. Until its head is read
/// the connection holds only its `max_connections` permit; a handshake
/// that does not finish by `server.head_timeout_ms` is cut.
async fn serve_tls<S>(
    io: TcpStream,
    http: Rc<S>,
    state: Arc<ServerState>,
    permit: OwnedSemaphorePermit,
    deadline: Instant,
    proxied: Option<SocketAddr>,
) where
    S: Service<Rewound, Response = (), Error = actix_http::error::DispatchError> + 'static,
{
    let Some(acceptor) = state.tls.as_ref() else {
        return;
    };
    let mut session = match acceptor.session() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(event = "tls_failed", cause = %e, "cannot start a TLS session");
            return;
        }
    };
    let shaken = session.handshake(&io, deadline).await;
    if shaken.is_ok() {
        state.stats.tls_handshakes.fetch_add(1, Relaxed);
    }
    if let Err(e) = shaken {
        return tls::refused(&state.stats, e);
    }
    let settings = &state.settings;
    let max_line = settings.server.max_head_bytes;
    let line = &mut DecryptedLine::new(&io, &mut session, &state.stats, deadline, max_line);
    let class = classify::classify(line, settings.stream.max_id_len).await;
    match class {
        Class::Stream { id, http10 } => {
            let wire = TlsWire { io, session };
            Box::pin(serve_stream(wire, id, http10, &state, permit, deadline, proxied)).await;
        }
        Class::Dispatcher => {
            let wire = TlsWire { io, session };
            serve_dispatcher(wire, &*http, &state, permit, deadline, proxied).await;
        }
        Class::Http => {
            let _conn = HttpConn::new(permit, &state.stats);
            let plain = std::mem::take(&mut session.plain);
            let io = Rewound::tls(TlsIo::new(io, session), plain).with_client(proxied);
            Box::pin(serve_http(&*http, io)).await;
        }
        Class::Timeout => {
            state
                .refuse_head(TlsWire { io, session }, HeadError::Timeout)
                .await
        }
        Class::Fragment => {
            let why = HeadError::Invalid(classify::FRAGMENT);
            state.refuse_head(TlsWire { io, session }, why).await;
        }
        Class::Gone => {}
    }
}

/// A connection whose first request is a plain `GET /dispatcher`, plain or
/// TLS: the lean path ([`dispatcher::serve`]) until a request of another
/// kind hands the connection to actix-web.
async fn serve_dispatcher<S>(
    wire: impl dispatcher::Io,
    http: &S,
    state: &ServerState,
    permit: OwnedSemaphorePermit,
    deadline: Instant,
    proxied: Option<SocketAddr>,
) where
    S: Service<Rewound, Response = (), Error = actix_http::error::DispatchError> + 'static,
{
    let _conn = HttpConn::new(permit, &state.stats);
    // Boxed: every connection's task would otherwise carry this future's
    // size while it is classified.
    if let dispatcher::Outcome::HandOff(io) = Box::pin(dispatcher::serve(wire, state, deadline)).await {
        Box::pin(serve_http(http, io.with_client(proxied))).await;
    }
}

/// The client's address for a lean stream's limits: a PROXY header's
/// source, else the socket's peer, asked for only when limits or trusted
/// proxies need it (getpeername is a system call per stream).
fn peer_ip(state: &ServerState, io: &TcpStream, proxied: Option<SocketAddr>) -> IpAddr {
    let needed = state.admission.limits.enabled() || state.admission.trusts_proxies();
    match proxied {
        Some(client) => client.ip(),
        None if needed => io.peer_addr().map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip()),
        None => IpAddr::from([0, 0, 0, 0]),
    }
}

/// Serves a connection with actix-web until it ends, or until a handler
/// asks for it to be closed.
async fn serve_http<S>(http: &S, io: Rewound)
where
    S: Service<Rewound, Response = (), Error = actix_http::error::DispatchError> + 'static,
{
    let close = io.close_handle();
    let served = http.call(io);
    // Dropping the dispatcher closes the socket at once; a client whose
    // request body is still arriving may then see a reset rather than its
    // answer, which has had `CLOSE_AFTER_ANSWER` to go out.
    tokio::select! {
        _ = served => {}
        () = async {
            close.requested().await;
            sleep(CLOSE_AFTER_ANSWER).await;
        } => {}
    }
}
