//! Binding, worker threads, signals and shutdown.
//!
//! Every worker is an actix `Arbiter` (one thread, one event loop). Each
//! builds its own actix-web `HttpService` (the same steps
//! `HttpServer::listen` takes) and runs an accept loop on its own duplicate
//! of every listening socket; from there each connection is the connection
//! pipeline's ([`crate::conn`]), which decides its fate. The Router and
//! Counter run supervised on the first worker's arbiter.
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
use actix_rt::net::TcpListener;
use actix_service::{IntoServiceFactory, Service, ServiceFactory, ServiceFactoryExt, fn_service, map_config};
use actix_web::dev::AppConfig;
use actix_web::http::header;
use actix_web::{App, web};
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::config::{ProxyProtocol, Settings};
use crate::conn::serve::{Listener, accept_loop};
use crate::conn::socket::{self, Rewound};
use crate::counter::Counter;
use crate::error::{ApiError, CorsAnswer};
use crate::hub::Hub;
use crate::hub::router::{CloseAll, Stopping};
use crate::state::ServerState;
use crate::stats::Stats;
use crate::stream::{self, Stream};
use crate::webhooks::Webhooks;

/// How often shutdown checks whether streams and connections are gone.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// actix-web's time to flush a response before dropping a closing connection.
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Most connections the internal listener serves at once (Prometheus, a
/// few dashboards, an operator's curl). At the limit it stops accepting
/// until one closes. Apart from `server.max_connections`, so that a flood
/// on the public ports does not lock the operators out.
const INTERNAL_MAX_CONNECTIONS: usize = 256;

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
        // One thread for every endpoint of the application's.
        let backend = crate::backend::Backend::of(&settings.endpoints())?;
        let webhooks = match &backend {
            Some(backend) if !settings.hooks.events_url.trim().is_empty() => Some(Webhooks::start(
                &settings,
                Arc::clone(backend),
                Arc::clone(&stats),
                crate::hub::cluster::node_name(&settings.cluster),
            )),
            _ => None,
        };
        let hub = Hub::<Stream>::start(
            &settings,
            &stats,
            &arbiters[0].handle(),
            main_addr,
            cancel.clone(),
            webhooks.clone(),
        )
        .await?;
        let counter = {
            let (stats, cluster) = (Arc::clone(&stats), hub.cluster().cloned());
            Supervisor::start_in_arbiter(&arbiters[0].handle(), move |_| Counter::new(stats, cluster))
        };
        let admission = Admission::new(
            &settings,
            Arc::clone(&stats),
            publish_protected,
            cancel.clone(),
            backend.as_ref(),
            hub.cluster().cloned(),
        )?;
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
            let acceptor = crate::conn::tls::Acceptor::new(
                &settings.server.tls_cert_file,
                &settings.server.tls_key_file,
            )
            .map_err(|e| invalid(e.key, e.reason))?;
            Some(Arc::new(acceptor))
        };
        let streams = Arc::new(stream::Shared {
            settings: settings.stream.clone(),
            stats: Arc::clone(&stats),
            router: hub.router().clone(),
            await_welcome: hub.streams_wait(),
            limits: Arc::clone(&limits),
            per_id: Arc::clone(&admission.per_id),
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
    tls: Option<Arc<crate::conn::tls::Acceptor>>,
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
    // Webhooks: ids still lingering are vacated now, and what is queued
    // is sent, within the deadline (a dead endpoint does not hold the
    // stop past it).
    let _ = tokio::time::timeout_at(deadline, state.router().send(Stopping)).await;
    while state.stats.webhook_pending.load(Relaxed) > 0 && Instant::now() < deadline {
        sleep(DRAIN_POLL).await;
    }
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
/// hand because connections reach it through [`crate::conn::serve`] instead
/// of actix-server.
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
    let admitting = Arc::clone(state);
    let app = App::new()
        .wrap_fn(move |req, srv| {
            // The admission's CORS rule, decided once per request before
            // the call. Two `Origin` headers leave the page unknown:
            // refused.
            let mut origins = req.headers().get_all(header::ORIGIN);
            let (origin, repeated) = (origins.next(), origins.next().is_some());
            let cors = admitting.admission.cors(origin.and_then(|o| o.to_str().ok()));
            let cors = CorsAnswer::from(cors);
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
                crate::routes::cors(cors.as_cors(), res.response_mut());
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
