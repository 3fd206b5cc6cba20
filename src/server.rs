//! Listening, accepting, handing connections out, and shutting down.
//!
//! Every worker is an actix `Arbiter` (one thread, one event loop). Each runs
//! an accept loop on its own duplicate of every listening socket, builds its
//! own actix-web `HttpService` (the same steps `HttpServer::listen` takes),
//! and decides each connection's fate in one place, [`serve`]: the
//! classifier ([`crate::classify`]) peeks its request line, and one `match`
//! sends it to a lean stream (the Stream actor then owns the socket, on this
//! worker), the lean `/dispatcher` path, actix-web, or a refusal. The Router
//! and Counter run supervised on the first worker's arbiter.
//!
//! Beside the public listeners (`server.host`, `server.port`, the extra
//! ports) each worker also accepts on the internal listener for operators
//! (`server.admin_host`, `server.admin_port`): its connections go straight
//! to the same actix-web service, marked [`socket::Internal`], where the
//! operator pages are served (`routes`).
//!
//! Shutdown is one future passed to [`Server::run`]. When it resolves:
//! 1. `Admission::shutdown` is cancelled: accept loops return and close
//!    their sockets, actix-web connections drain (idle keep-alives close,
//!    in-flight requests finish), new streams are refused;
//! 2. the Router tells every stream to end: each writes the final zero-length
//!    chunk and closes;
//! 3. `run` waits for streams and HTTP connections to reach zero, at most
//!    `server.shutdown_timeout_ms` in all, then stops the workers and returns.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use actix::{Arbiter, Supervisor};
use actix_http::{HttpService, KeepAlive, Protocol};
use actix_rt::net::{TcpListener, TcpStream};
use actix_service::{IntoServiceFactory, Service, ServiceFactory, ServiceFactoryExt, fn_service, map_config};
use actix_web::dev::AppConfig;
use actix_web::http::header;
use actix_web::{App, web};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::classify::{self, Class, HeadError};
use crate::config::{ProxyProtocol, Settings};
use crate::counter::Counter;
use crate::dispatcher;
use crate::edge::{self, Client, ProxyError};
use crate::error::ApiError;
use crate::hub::Hub;
use crate::hub::router::CloseAll;
use crate::socket::{self, Rewound};
use crate::state::ServerState;
use crate::stats::Stats;
use crate::stream::{self, Stream, Via};
use crate::tls::{Session, TlsIo};

/// Pause after `accept` fails for lack of file descriptors. The pending
/// connection stays in the backlog and is accepted once descriptors free up.
const FD_LIMIT_BACKOFF: Duration = Duration::from_millis(50);

/// Pause after any other unexpected `accept` failure.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// How often shutdown checks whether streams and connections are gone.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// actix-web's time to flush a response before dropping a closing connection.
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a connection a handler asked to close (see
/// [`socket::CloseHandle`]) keeps running so its answer, a few hundred
/// bytes that the socket takes at once, goes out first.
const CLOSE_AFTER_ANSWER: Duration = Duration::from_millis(100);

/// Most connections the internal listener serves at once (Prometheus, a
/// few dashboards, an operator's curl). At the limit it stops accepting
/// until one closes. Apart from `server.max_connections`, so that a flood
/// on the public ports does not lock the operators out.
const INTERNAL_MAX_CONNECTIONS: usize = 256;

/// Which listener a connection came in on, and so what it may become.
#[derive(Debug, Clone, Copy)]
enum Listener {
    /// `server.host` with `server.port` and the extra ports: streams, the
    /// lean `/dispatcher`, everything else through actix-web; `tls` on a
    /// TLS port.
    Public { tls: bool },
    /// `server.admin_host:server.admin_port`: straight to actix-web, where
    /// the operator pages are served ([`socket::Internal`]).
    Internal,
}

/// A bound, not yet running server.
pub struct Server {
    settings: Settings,
    listeners: Vec<std::net::TcpListener>,
    /// The internal listener for operators (`server.admin_host`,
    /// `server.admin_port`).
    admin: std::net::TcpListener,
}

impl Server {
    /// Binds the main port, every extra port and the internal listener
    /// from `settings`.
    pub fn bind(settings: Settings) -> io::Result<Self> {
        let listeners = settings
            .listen_addrs()
            .into_iter()
            .map(|addr| {
                listen(addr, settings.server.backlog, settings.server.reuse_port)
                    .map_err(|e| io::Error::new(e.kind(), format!("listening on {addr}: {e}")))
            })
            .collect::<io::Result<_>>()?;
        let admin = bind_admin(&settings)?;
        Ok(Server {
            settings,
            listeners,
            admin,
        })
    }

    /// Uses public listeners the caller bound (tests bind `127.0.0.1:0`);
    /// the internal listener is bound from `settings` (tests set
    /// `server.admin_port = 0` and ask [`Server::admin_addr`]).
    pub fn from_listeners(settings: Settings, listeners: Vec<std::net::TcpListener>) -> io::Result<Self> {
        for l in &listeners {
            l.set_nonblocking(true)?;
        }
        let admin = bind_admin(&settings)?;
        Ok(Server {
            settings,
            listeners,
            admin,
        })
    }

    /// Where the server listens (actual ports, also when 0 was asked for).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Where the internal listener listens (the actual port, also when
    /// `server.admin_port` is 0).
    pub fn admin_addr(&self) -> io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully (see the
    /// module docs). Must run inside an actix `System`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let Server {
            settings,
            listeners,
            admin,
        } = self;
        let addrs: Vec<SocketAddr> = listeners.iter().filter_map(|l| l.local_addr().ok()).collect();
        let Some(&main_addr) = addrs.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no listening socket"));
        };
        let admin_addr = admin.local_addr()?;
        let publish_protected = publish_mode(&settings, addrs.iter().chain([&admin_addr]));
        let workers = settings.workers();
        crate::stats::count_panics();
        let stats = Arc::new(Stats::new());

        // The Router, the Counter and in cluster mode the bus run on the
        // first worker's thread, not a thread of their own: on a machine
        // with few cores every extra runnable thread costs context
        // switches, and half of the hops to them become same-thread
        // mailbox pushes instead of cross-thread wake-ups
        // (docs/design-notes.md, "Threads").
        let arbiters: Vec<Arbiter> = (0..workers).map(|_| Arbiter::new()).collect();
        let cancel = CancellationToken::new();
        let hub = Hub::<Stream>::start(
            &settings,
            &stats,
            &arbiters[0].handle(),
            main_addr,
            cancel.clone(),
        )
        .await?;
        let counter = {
            let (stats, cluster) = (Arc::clone(&stats), hub.cluster().cloned());
            Supervisor::start_in_arbiter(&arbiters[0].handle(), move |_| Counter::new(stats, cluster))
        };
        let admission = Admission::new(&settings, Arc::clone(&stats), publish_protected, cancel.clone())?;
        let invalid =
            |key: &str, e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{key}: {e}"));
        let limits = Arc::clone(&admission.limits);
        let public = settings
            .server
            .host
            .parse::<IpAddr>()
            .is_ok_and(|ip| !ip.is_loopback());
        if limits.enabled()
            && public
            && settings.server.proxy_protocol == ProxyProtocol::Off
            && !admission.trusts_proxies()
        {
            tracing::warn!(
                event = "limits_by_peer",
                "the [limits] per client address count each connection's own peer: behind a load \
                 balancer every client has its address, and the whole site shares one limit. Turn on \
                 server.proxy_protocol or http.trusted_proxies, or set the limits to 0"
            );
        }
        let tls = if settings.server.tls_cert_file.is_empty() {
            None
        } else {
            let acceptor =
                crate::tls::Acceptor::new(&settings.server.tls_cert_file, &settings.server.tls_key_file)
                    .map_err(|e| invalid(e.key, e.reason))?;
            Some(Arc::new(acceptor))
        };
        let streams = Arc::new(stream::Shared {
            settings: settings.stream.clone(),
            stats: Arc::clone(&stats),
            router: hub.router().clone(),
            await_welcome: hub.cluster().is_some(),
            limits: Arc::clone(&limits),
        });
        // Rate states and log times no longer needed go every 10 s.
        actix_rt::spawn({
            let limits = Arc::clone(&limits);
            let stop = cancel.clone();
            async move {
                let mut every = tokio::time::interval(Duration::from_secs(10));
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = every.tick() => limits.sweep(),
                    }
                }
            }
        });
        let state = Arc::new(ServerState {
            settings,
            stats,
            streams,
            counter,
            hub,
            addr: crate::hub::cluster::advertised(main_addr),
            admission,
            tls,
        });
        // Installed before the server says it listens, so a SIGHUP sent
        // from then on is never the default action (exit), TLS or not: a
        // fleet parent passes it on to every process, and systemd's
        // ExecReload or logrotate may send it.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        actix_rt::spawn(reload_on_hangup(hangup, state.tls.clone(), Arc::clone(&state)));

        let slots = Slots {
            public: Arc::new(Semaphore::new(state.settings.server.max_connections)),
            internal: Arc::new(Semaphore::new(INTERNAL_MAX_CONNECTIONS)),
        };
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(workers);
        for worker in &arbiters {
            let mine = listeners
                .iter()
                .map(|l| l.try_clone())
                .collect::<io::Result<Vec<_>>>()?;
            let admin = admin.try_clone()?;
            let (state, slots, ready) = (Arc::clone(&state), slots.clone(), ready_tx.clone());
            // The worker future is not Send (actix-web services are !Send):
            // send a closure that spawns it on the worker's own thread.
            worker.spawn_fn(move || {
                actix_rt::spawn(run_worker(mine, admin, main_addr, state, slots, ready));
            });
        }
        drop(listeners);
        drop(admin);
        drop(ready_tx);
        // Wait until every worker serves, so the idle baseline includes them.
        for _ in 0..workers {
            if ready_rx.recv().await.is_none() {
                break;
            }
        }

        state.stats.set_baseline();
        tracing::info!(event = "bind", ?addrs, admin = %admin_addr, workers, "switchboard listening");
        if !state.settings.server.address_file.is_empty() {
            write_address_file(&state.settings.server.address_file, &addrs, admin_addr)?;
        }
        tracing::info!(event = "config", settings = ?state.settings, "effective configuration");
        actix_rt::spawn(report_slow_disconnects(Arc::clone(&state)));

        shutdown.await;
        shut_down(&state).await;
        if let Some(cluster) = state.hub.cluster() {
            cluster.leave().await;
        }
        for a in arbiters {
            a.stop();
        }
        Ok(())
    }
}

/// `server.address_file`: one line per bound address, written to a
/// temporary file beside it and renamed, so a script polling for the file
/// reads all of it or nothing.
fn write_address_file(path: &str, public: &[SocketAddr], admin: SocketAddr) -> io::Result<()> {
    use std::fmt::Write as _;
    let mut text = String::new();
    for addr in public {
        let _ = writeln!(text, "public {addr}");
    }
    let _ = writeln!(text, "admin {admin}");
    let tmp = format!("{path}.{}.tmp", std::process::id());
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| io::Error::new(e.kind(), format!("server.address_file {path}: {e}")))
}

/// The internal listener, as [`listen`] binds the public ones.
fn bind_admin(settings: &Settings) -> io::Result<std::net::TcpListener> {
    let addr = settings.admin_addr();
    listen(addr, settings.server.backlog, settings.server.reuse_port).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("listening on {addr} (server.admin_host, server.admin_port): {e}"),
        )
    })
}

/// Decides protected mode once (`Admission`'s `publish_protected`)
/// from the addresses actually bound, and says which it is in one WARN
/// line when a listener is beyond loopback and no publish token is set.
fn publish_mode<'a>(settings: &Settings, bound: impl Iterator<Item = &'a SocketAddr>) -> bool {
    let auth = &settings.auth;
    let beyond: Vec<&SocketAddr> = bound.filter(|a| !a.ip().to_canonical().is_loopback()).collect();
    if beyond.is_empty() || !auth.publish_token.is_empty() {
        return false;
    }
    if auth.publish_open {
        tracing::warn!(
            event = "publish_open",
            ?beyond,
            "auth.publish_open: no auth.publish_token and listening beyond loopback, so anyone who \
             reaches a port may POST /send and /broadcast"
        );
        return false;
    }
    tracing::warn!(
        event = "protected_mode",
        ?beyond,
        "protected mode: no auth.publish_token and listening beyond loopback, so /send, /broadcast \
         and /presence answer 403 to clients that are not loopback; set auth.publish_token, or \
         auth.publish_open = true to accept the risk"
    );
    true
}

/// The connection limits: `server.max_connections` on the public
/// listeners, [`INTERNAL_MAX_CONNECTIONS`] on the internal one.
#[derive(Clone)]
struct Slots {
    /// Shared by every public listener of every worker.
    public: Arc<Semaphore>,
    /// The internal listener's own, so operators get in during a flood.
    internal: Arc<Semaphore>,
}

/// A listening socket with `SO_REUSEADDR`, `SO_REUSEPORT` if asked for, and
/// the configured backlog.
fn listen(addr: SocketAddr, backlog: u32, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    // Several processes on one port: the kernel spreads new connections over
    // every listener that set it (by a hash of the 4-tuple).
    socket.set_reuse_port(reuse_port)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// How often slow disconnects are summed up in the log.
const SLOW_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// One `slow_disconnects` log line per [`SLOW_REPORT_INTERVAL`] in which
/// streams were cut for not reading (one line per stream would flood the
/// log in exactly the storm it reports), until shutdown.
async fn report_slow_disconnects(state: Arc<ServerState>) {
    let stats = &state.stats;
    let mut last = stats.slow_disconnects.load(Relaxed);
    let mut tick = tokio::time::interval(SLOW_REPORT_INTERVAL);
    tick.tick().await;
    loop {
        tokio::select! {
            () = state.admission.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let total = stats.slow_disconnects.load(Relaxed);
        if total > last {
            tracing::warn!(
                event = "slow_disconnects",
                count = total - last,
                total,
                interval_s = SLOW_REPORT_INTERVAL.as_secs(),
                dropped_total = stats.messages_dropped.load(Relaxed),
                "streams cut because their clients stopped reading"
            );
        }
        last = total;
    }
}

/// Reads the TLS certificate and key again on every SIGHUP, until shutdown.
/// A file that does not load leaves the certificate in use (logged and
/// counted); open connections keep what they negotiated. Without TLS a
/// SIGHUP is logged and changes nothing.
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    tls: Option<Arc<crate::tls::Acceptor>>,
    state: Arc<ServerState>,
) {
    loop {
        tokio::select! {
            () = state.admission.shutdown.cancelled() => return,
            got = hangup.recv() => if got.is_none() { return },
        }
        let Some(tls) = &tls else {
            tracing::info!(
                event = "signal",
                signal = "SIGHUP",
                "SIGHUP: no TLS certificate to reload; nothing changes"
            );
            continue;
        };
        match tls.reload() {
            Ok(()) => {
                state.stats.tls_reloads.fetch_add(1, Relaxed);
                tracing::info!(
                    event = "tls_reloaded",
                    "SIGHUP: TLS certificate and key read again"
                );
            }
            Err(e) => {
                state.stats.tls_reload_failures.fetch_add(1, Relaxed);
                tracing::error!(
                    event = "tls_reload_failed",
                    cause = %e,
                    "SIGHUP: TLS certificate not reloaded; the one in use stays"
                );
            }
        }
    }
}

/// Steps 1-3 of the module docs.
async fn shut_down(state: &ServerState) {
    let started = Instant::now();
    let deadline = started + state.settings.shutdown_timeout();
    tracing::info!(
        event = "stop",
        streams = state.stats.streams_active(),
        connections = state.stats.http_active(),
        "shutting down"
    );
    state.admission.shutdown.cancel();
    let _ = tokio::time::timeout_at(deadline, state.router().send(CloseAll)).await;
    let gone = |s: &ServerState| s.stats.streams_active() == 0 && s.stats.http_active() == 0;
    while !gone(state) && Instant::now() < deadline {
        sleep(DRAIN_POLL).await;
    }
    // Let actix-web's HTTP/1 dispatchers write what the last fallback
    // streams queued.
    sleep(DRAIN_POLL).await;
    if gone(state) {
        tracing::info!(
            event = "stopped",
            elapsed_ms = started.elapsed().as_millis() as u64,
            "shutdown complete"
        );
    } else {
        tracing::warn!(
            event = "stopped",
            elapsed_ms = started.elapsed().as_millis() as u64,
            streams = state.stats.streams_active(),
            connections = state.stats.http_active(),
            "shutdown timeout reached; dropping what is left"
        );
    }
}

/// One worker: its actix-web service and an accept loop per listener.
async fn run_worker(
    listeners: Vec<std::net::TcpListener>,
    admin: std::net::TcpListener,
    local_addr: SocketAddr,
    state: Arc<ServerState>,
    slots: Slots,
    ready: tokio::sync::mpsc::Sender<()>,
) {
    let http = match http_service(&state, local_addr).new_service(()).await {
        Ok(s) => Rc::new(s),
        Err(()) => {
            tracing::error!(
                event = "worker_failed",
                "worker could not build its HTTP service; it serves nothing"
            );
            return;
        }
    };
    let public = listeners.into_iter().map(|l| {
        let tls = l
            .local_addr()
            .is_ok_and(|a| state.tls.is_some() && state.settings.tls_port(a.port()));
        (l, Listener::Public { tls }, &slots.public)
    });
    for (l, listener, slots) in public.chain([(admin, Listener::Internal, &slots.internal)]) {
        match TcpListener::from_std(l) {
            Ok(l) => {
                actix_rt::spawn(accept_loop(
                    l,
                    listener,
                    Rc::clone(&http),
                    Arc::clone(&state),
                    Arc::clone(slots),
                ));
            }
            Err(e) => tracing::error!(
                event = "worker_failed",
                cause = %e,
                "worker could not register a listener"
            ),
        }
    }
    let _ = ready.send(()).await;
}

/// actix-web's HTTP/1 service with `HttpServer::listen`'s settings, built by
/// hand because connections reach it through [`serve`] instead of
/// actix-server.
fn http_service(
    state: &Arc<ServerState>,
    local_addr: SocketAddr,
) -> impl ServiceFactory<
    Rewound,
    Config = (),
    Response = (),
    Error = actix_http::error::DispatchError,
    InitError = (),
> + use<> {
    let s = &state.settings.server;
    let keep_alive = match s.keep_alive_ms {
        0 => KeepAlive::Disabled,
        ms => KeepAlive::Timeout(Duration::from_millis(ms)),
    };
    let app_state = web::Data::from(Arc::clone(state));
    let fault_injection = state.settings.debug.fault_injection;
    let http_settings = state.settings.http.clone();
    let app = App::new()
        .wrap_fn(move |req, srv| {
            // Decided before the call, so nothing of the settings is copied
            // per request: only an allowed origin's header value. Two
            // `Origin` headers leave the page unknown: refused.
            let mut origins = req.headers().get_all(header::ORIGIN);
            let (origin, repeated) = (origins.next().cloned(), origins.next().is_some());
            let allowed = origin.filter(|o| http_settings.allows_origin(o.as_bytes()));
            let vary = http_settings.cors_enabled();
            let served = if repeated {
                Err(req.error_response(ApiError::RepeatedOrigin))
            } else {
                Ok(srv.call(req))
            };
            async move {
                let mut res = match served {
                    Ok(served) => served.await?,
                    Err(refused) => return Ok(refused),
                };
                crate::routes::cors(allowed, vary, res.response_mut());
                Ok(res)
            }
        })
        .app_data(app_state)
        .configure(move |cfg| crate::routes::routes(cfg, fault_injection))
        .into_factory()
        .map_err(|err: actix_web::Error| err.error_response());
    let drain = state.admission.shutdown.clone();
    let http = HttpService::build()
        .keep_alive(keep_alive)
        .client_request_timeout(state.settings.head_timeout())
        .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
        // A fallback stream must notice a client that closes (EOF), not keep
        // writing to a half-closed connection until the next tick fails.
        .h1_allow_half_closed(false)
        .local_addr(local_addr)
        .on_connect_ext(|io: &Rewound, ext: &mut actix_http::Extensions| {
            ext.insert(io.close_handle());
            if io.proxied() {
                ext.insert(socket::Proxied);
            }
            if io.is_internal() {
                ext.insert(socket::Internal);
            }
        })
        // Hidden but stable in actix-http 3: what HttpServer uses to drain
        // keep-alive connections on graceful shutdown.
        .graceful_shutdown_signal(move || {
            let drain = drain.clone();
            async move { drain.cancelled().await }
        })
        .finish(map_config(app, |_| AppConfig::default()));
    // What `HttpService::tcp` does, for a connection that may come with bytes
    // already read (see `dispatcher`).
    fn_service(|io: Rewound| async move {
        let peer = io.client();
        Ok((io, Protocol::Http1, peer))
    })
    .and_then(http)
}

/// Accepts on one listener until shutdown, at most as many HTTP
/// connections at once as `slots` allows (`server.max_connections` on the
/// public listeners, [`INTERNAL_MAX_CONNECTIONS`] on the internal one).
/// Running out of file descriptors is logged once per episode,
/// counted in `/stats` (`accept.fd_limit`), and retried after a pause; open
/// streams are not disturbed.
async fn accept_loop<S>(
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
    match classify::classify(&io, deadline, settings.stream.max_id_len, max_line).await {
        Class::Stream { id, http10 } => {
            // Boxed: reading and checking the head would otherwise grow
            // every connection's task (docs/design-notes.md).
            Box::pin(serve_stream(io, id, http10, &state, permit, deadline, proxied)).await;
        }
        Class::Dispatcher => {
            let _conn = HttpConn::new(permit, &state.stats);
            // Boxed: every connection's task would otherwise carry this
            // future's size while it is classified.
            if let dispatcher::Outcome::HandOff(io) = Box::pin(dispatcher::serve(io, &state, deadline)).await
            {
                Box::pin(serve_http(&*http, io.with_client(proxied))).await;
            }
        }
        Class::Http => {
            let _conn = HttpConn::new(permit, &state.stats);
            // Boxed: actix-web's HTTP/1 dispatcher future is large, and every
            // connection's task would carry its size while it is classified.
            Box::pin(serve_http(&*http, Rewound::new(io).with_client(proxied))).await;
        }
        Class::Timeout => state.refuse_head(io, HeadError::Timeout).await,
        Class::Fragment => {
            let why = "a request target has no fragment (#); send it percent-escaped (%23)";
            state.refuse_head(io, HeadError::Invalid(why)).await;
        }
        Class::Gone => {}
    }
}

/// A lean stream request whose line has been classified (`http10`: its
/// request line said HTTP/1.0, which changes what a valid head is): reads
/// and checks its head, then starts the stream or refuses it
/// ([`Admission::admit_stream`], before any stream state exists).
async fn serve_stream(
    io: TcpStream,
    id: Arc<str>,
    http10: bool,
    state: &Arc<ServerState>,
    permit: OwnedSemaphorePermit,
    deadline: Instant,
    proxied: Option<SocketAddr>,
) {
    let max_head = state.settings.server.max_head_bytes;
    let peer = peer_ip(state, &io, proxied);
    let admitted = classify::consume_head(&io, deadline, max_head, http10, |head, early| {
        let client = state.admission.client_of_head(peer, proxied.is_some(), head);
        state.admission.admit_stream(&id, head, early, Via::Lean, client)
    })
    .await;
    match admitted {
        Ok(Ok(open)) => {
            // A stream is not an HTTP connection: its slot is counted by
            // `stream.max_streams` from here on.
            drop(permit);
            Stream::start_lean(io, id, open, Arc::clone(&state.streams));
        }
        Ok(Err(refused)) => socket::refuse(io, &refused.error, refused.cors.as_cors()).await,
        Err(e) => state.refuse_head(io, e).await,
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
        return count_tls_refusal(&state, e);
    }
    let settings = &state.settings;
    let max_line = settings.server.max_head_bytes.max(classify::PEEK_BYTES);
    let class = loop {
        let full = session.plain.len() >= max_line;
        match classify::decide(&session.plain, full, settings.stream.max_id_len) {
            Some(Class::Http) if classify::has_fragment(&session.plain) => break Class::Fragment,
            Some(class) => break class,
            None => match session.read_plain(&io, deadline).await {
                Ok(()) => {}
                Err(HeadError::Timeout) => break Class::Timeout,
                Err(e @ HeadError::Tls(_)) => {
                    count_tls_refusal(&state, e);
                    break Class::Gone;
                }
                Err(_) => break Class::Gone,
            },
        }
    };
    match class {
        Class::Stream { id, http10 } => {
            Box::pin(serve_tls_stream(
                io, session, id, http10, &state, permit, deadline, proxied,
            ))
            .await;
        }
        Class::Dispatcher | Class::Http => {
            let _conn = HttpConn::new(permit, &state.stats);
            let plain = std::mem::take(&mut session.plain);
            let io = Rewound::tls(TlsIo::new(io, session), plain).with_client(proxied);
            Box::pin(serve_http(&*http, io)).await;
        }
        Class::Timeout => refuse_tls_head(&state, io, session, HeadError::Timeout).await,
        Class::Fragment => {
            let why = "a request target has no fragment (#); send it percent-escaped (%23)";
            refuse_tls_head(&state, io, session, HeadError::Invalid(why)).await;
        }
        Class::Gone => {}
    }
}

/// [`serve_stream`] on a TLS connection whose request line is decrypted.
#[allow(clippy::too_many_arguments)]
async fn serve_tls_stream(
    io: TcpStream,
    mut session: Session,
    id: Arc<str>,
    http10: bool,
    state: &Arc<ServerState>,
    permit: OwnedSemaphorePermit,
    deadline: Instant,
    proxied: Option<SocketAddr>,
) {
    let max_head = state.settings.server.max_head_bytes;
    let mut check = classify::HeadCheck::new(http10);
    let mut fed = 0;
    let end = loop {
        match check.feed(&session.plain[fed..], max_head) {
            classify::Checked::More => {
                fed = session.plain.len();
                if let Err(e) = session.read_plain(&io, deadline).await {
                    return refuse_tls_head(state, io, session, e).await;
                }
            }
            classify::Checked::End(k) => break fed + k,
            classify::Checked::Refused(e) => return refuse_tls_head(state, io, session, e).await,
        }
    };
    let peer = peer_ip(state, &io, proxied);
    let admitted = {
        let (head, early) = session.plain.split_at(end);
        let client = state.admission.client_of_head(peer, proxied.is_some(), head);
        state.admission.admit_stream(&id, head, early, Via::Lean, client)
    };
    match admitted {
        Ok(open) => {
            // What followed the head was looked at by the admission, as on a
            // plain connection; the stream reads on from the socket.
            session.plain = Vec::new();
            drop(permit);
            Stream::start_lean_tls(io, session, id, open, Arc::clone(&state.streams));
        }
        Err(refused) => refuse_tls(io, session, &refused.error, refused.cors.as_cors()).await,
    }
}

/// [`ServerState::refuse_head`] on a TLS connection.
async fn refuse_tls_head(state: &ServerState, io: TcpStream, session: Session, e: HeadError) {
    if let HeadError::Tls(_) = e {
        return count_tls_refusal(state, e);
    }
    if let Some(error) = state.refused_head(e) {
        refuse_tls(io, session, &error, crate::error::Cors::default()).await;
    }
}

/// [`socket::refuse`] on a TLS connection: the answer, a close_notify, and
/// a gentle close.
async fn refuse_tls(io: TcpStream, mut session: Session, error: &ApiError, cors: crate::error::Cors<'_>) {
    let mut response = Vec::new();
    error.write_http1(&mut response, true, cors);
    session
        .write_and_close(&io, &response, Instant::now() + CLOSE_AFTER_ANSWER)
        .await;
    socket::close_gently(&io).await;
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

/// Counts and logs a TLS connection refused before its head was read,
/// which gets no HTTP answer (the client could not read one): a handshake
/// out of time, or a handshake or record that failed. A client that went
/// away is not counted.
fn count_tls_refusal(state: &ServerState, e: HeadError) {
    let counter = match e {
        HeadError::Timeout => &state.stats.tls_handshake_timeouts,
        HeadError::Gone => return,
        _ => &state.stats.tls_handshake_failures,
    };
    counter.fetch_add(1, Relaxed);
    tracing::debug!(event = "tls_refused", cause = ?e, "TLS connection refused before its head");
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
