//! What every worker and handler of one server shares ([`ServerState`]),
//! and the one admission decision for every stream, lean or fallback
//! ([`ServerState::admit_stream`]).

use std::net::IpAddr;
use std::sync::Arc;

use std::sync::atomic::Ordering::Relaxed;

use actix::Addr;
use actix_rt::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::classify::HeadError;
use crate::config::{Nets, Settings};
use crate::counter::Counter;
use crate::edge::{self, Client};
use crate::error::{ApiError, Cors, CorsAnswer};
use crate::handshake::{self, Transport};
use crate::hub::Hub;
use crate::hub::router::Router;
use crate::socket;
use crate::stats::Stats;
use crate::stream::{self, Open, Stream, Via};

/// A stream request refused before any stream state exists.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Why.
    pub(crate) error: ApiError,
    /// What CORS says to the page's origin, decided at admission (an
    /// allowed origin is named, so the page can read why).
    pub(crate) cors: CorsAnswer,
}

/// Shared by `Arc` between the workers and actix-web's handlers.
pub(crate) struct ServerState {
    /// The effective configuration.
    pub(crate) settings: Settings,
    /// Counters for `/stats`.
    pub(crate) stats: Arc<Stats>,
    /// What the streams share: the Router's address, their settings, stats.
    pub(crate) streams: Arc<stream::Shared>,
    /// The supervised Counter.
    pub(crate) counter: Addr<Counter>,
    /// Publishing and resuming: the Router and, in cluster mode, the bus.
    pub(crate) hub: Hub<Stream>,
    /// The main listening address, as `/cluster` shows it.
    pub(crate) addr: String,
    /// `http.trusted_proxies`, parsed.
    pub(crate) trusted_proxies: Nets,
    /// Protected mode, decided once at start-up: no `auth.publish_token`,
    /// no `auth.publish_open`, and some listener bound beyond loopback.
    /// Publishing is then open to loopback clients only
    /// (`routes::authorize`).
    pub(crate) publish_protected: bool,
    /// The certificate and TLS settings of the TLS ports, if any.
    pub(crate) tls: Option<Arc<crate::tls::Acceptor>>,
    /// Cancelled once on SIGINT/SIGTERM (or the caller's shutdown future):
    /// accept loops stop, actix-web connections drain, new streams are refused.
    pub(crate) shutdown: CancellationToken,
}

impl ServerState {
    /// The client's address for an actix-web request: the socket's peer
    /// or the PROXY header's source ([`Rewound`]), or, from a trusted
    /// proxy, what its `X-Forwarded-For` says.
    ///
    /// [`Rewound`]: crate::socket::Rewound
    pub(crate) fn client_of(&self, req: &actix_web::HttpRequest) -> Client {
        let proxied = req.conn_data::<crate::socket::Proxied>().is_some();
        let peer = req.peer_addr().map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let ip = edge::forwarded_for(
            peer,
            &self.trusted_proxies,
            req.headers().get_all("x-forwarded-for").map(|v| v.as_bytes()),
        );
        Client::new(ip, proxied || ip.to_canonical() != peer.to_canonical())
    }

    /// The client's address for a lean stream: `peer` (the socket's, or
    /// the PROXY header's source: `proxied`), or from a trusted proxy what
    /// the head's `X-Forwarded-For` says.
    pub(crate) fn client_of_head(&self, peer: IpAddr, proxied: bool, head: &[u8]) -> Client {
        if self.trusted_proxies.is_empty() {
            return Client::new(peer, proxied);
        }
        let ip = edge::forwarded_for(
            peer,
            &self.trusted_proxies,
            edge::header_values(head, b"x-forwarded-for"),
        );
        Client::new(ip, proxied || ip.to_canonical() != peer.to_canonical())
    }

    /// The `/stats` document: the server's counters, and in cluster mode
    /// a `cluster` section (also what the dashboard's feed carries).
    pub(crate) fn stats_document(&self) -> serde_json::Value {
        let mut snapshot = self.stats.snapshot();
        snapshot["limits"] = self.streams.limits.stats();
        if let Some(cluster) = self.hub.cluster() {
            snapshot["cluster"] = cluster.snapshot();
        }
        snapshot
    }

    /// This node's name as the dashboard shows it.
    pub(crate) fn node_name(&self) -> String {
        match self.hub.cluster() {
            Some(c) => c.node.clone(),
            None => "(single process)".to_owned(),
        }
    }

    /// The supervised Router (its address survives restarts).
    pub(crate) fn router(&self) -> &Addr<Router<Stream>> {
        self.hub.router()
    }

    /// Answers a head a lean path refuses (400, 408, 431), counted in
    /// `bad_heads`, and closes the connection; a client that is gone gets
    /// nothing.
    pub(crate) async fn refuse_head(&self, io: TcpStream, e: HeadError) {
        if let Some(error) = self.refused_head(e) {
            socket::refuse(io, &error, Cors::default()).await;
        }
    }

    /// What a refused head is answered with, counted in `bad_heads`;
    /// `None` for a client that is gone (nobody to answer).
    pub(crate) fn refused_head(&self, e: HeadError) -> Option<ApiError> {
        if e == HeadError::Gone {
            return None;
        }
        self.stats.bad_heads.fetch_add(1, Relaxed);
        Some(self.head_error(e))
    }

    /// Refuses a connection whose PROXY protocol header is missing or
    /// invalid: 400 with the reason, closed; logged at debug level (the
    /// count is in `/stats` `connections.proxy_refused`).
    pub(crate) async fn refuse_proxy(&self, io: TcpStream, why: String) {
        let peer = io.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::debug!(event = "proxy_refused", peer = %peer, reason = %why, "connection refused");
        socket::refuse(io, &ApiError::BadProxyHeader(why), Cors::default()).await;
    }

    /// The answer to a head a stream path refuses.
    pub(crate) fn head_error(&self, e: HeadError) -> ApiError {
        let server = &self.settings.server;
        match e {
            HeadError::Timeout => ApiError::HeadTimeout {
                ms: server.head_timeout_ms,
            },
            HeadError::TooLarge => ApiError::HeadTooLarge {
                limit: server.max_head_bytes,
            },
            HeadError::TooManyHeaders => ApiError::TooManyHeaders {
                limit: crate::classify::MAX_HEADERS,
            },
            HeadError::Invalid(why) => ApiError::BadHead(why),
            HeadError::Tls(why) => ApiError::BadHead(why),
            // Nobody to answer; callers do not send it.
            HeadError::Gone => ApiError::BadHead("the client went away"),
        }
    }

    /// The CORS headers of a stream's answer to a page from `origin`:
    /// decided once per stream request, at its admission, and carried to
    /// whichever answer it gets.
    pub(crate) fn cors<'a>(&self, origin: Option<&'a str>) -> Cors<'a> {
        let http = &self.settings.http;
        Cors {
            allow: origin.filter(|o| http.allows_origin(o.as_bytes())),
            vary: http.cors_enabled(),
        }
    }

    /// A refusal of a stream request, counted (`tokens_refused`,
    /// `origins_refused`, or `bad_heads`), answered with `cors` (as
    /// [`ServerState::cors`] decided it).
    pub(crate) fn refusal(&self, error: ApiError, cors: Cors<'_>) -> Refusal {
        let counter = match error {
            ApiError::BadToken(_) => Some(&self.stats.tokens_refused),
            ApiError::OriginNotAllowed => Some(&self.stats.origins_refused),
            // Counted where they are decided (`limits.refused`).
            ApiError::ShuttingDown | ApiError::StreamLimit(_) | ApiError::OverLimit { .. } => None,
            _ => Some(&self.stats.bad_heads),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Relaxed);
        }
        Refusal {
            error,
            cors: cors.into(),
        }
    }

    /// The one admission decision for a stream of `id`, lean or fallback
    /// (`via`), whose whole head (validated) is `head`, with `early` the
    /// bytes the client sent right behind it, in this order: shutdown (503),
    /// the client address's opening rate (429: every stream request spends
    /// one, refused later or not), one `Origin` at most, its transport, HTTP
    /// version and resume point ([`handshake::read_request`]), its page
    /// origin (a WebSocket's, against `http.cors_origins`), its subscriber token
    /// when `auth.subscribe_secret` is set, a WebSocket only as a
    /// connection's first request (on the lean path), then a
    /// `stream.max_streams` slot, which it takes (given back when the
    /// stream stops). Refusals are counted ([`ServerState::refusal`]).
    pub(crate) fn admit_stream(
        &self,
        id: &str,
        head: &[u8],
        early: &[u8],
        via: Via,
        client: Client,
    ) -> Result<Open, Refusal> {
        // The origin first, read once, and what CORS says to it decided
        // once, so that every answer after it, refusal or stream, names it.
        // Two `Origin` headers leave the page unknown: none is named, and
        // the request is refused after the opening rate.
        let origin = handshake::origin(head);
        let page = origin.as_ref().ok().copied().flatten();
        let cors = self.cors(page);
        let refused = |error: ApiError| self.refusal(error, cors);
        // Shutting down: whatever else is wrong, the answer is "go elsewhere".
        if self.shutdown.is_cancelled() {
            return Err(refused(ApiError::ShuttingDown));
        }
        // The opening rate first: a flood of bad tokens counts too.
        let limits = &self.streams.limits;
        limits.admit_open(client).map_err(refused)?;
        if let Err(repeated) = origin {
            return Err(refused(repeated));
        }
        let req = handshake::read_request(head).map_err(refused)?;
        // Browsers apply no CORS to WebSockets: the server checks the
        // origin itself, once a list is configured (`vary`).
        if req.transport == Transport::Ws && cors.vary && page.is_some() && cors.allow.is_none() {
            return Err(refused(ApiError::OriginNotAllowed));
        }
        let expires = match &self.streams.verifier {
            None => None,
            Some(verifier) => {
                let Some(token) = req.token.as_deref() else {
                    return Err(refused(ApiError::BadToken(
                        "none given: use ?token=<jwt> or Authorization: Bearer <jwt>".to_owned(),
                    )));
                };
                Some(
                    verifier
                        .check(token, id)
                        .map_err(|why| refused(ApiError::BadToken(why)))?,
                )
            }
        };
        if req.transport == Transport::Ws && via == Via::Fallback {
            // Only a first request on a connection is peeked and can become a
            // WebSocket (every WebSocket client opens a connection for it).
            return Err(refused(ApiError::BadWebSocket(
                "a WebSocket upgrade must be the first request on its connection".to_owned(),
            )));
        }
        // The client's address: its count (429).
        let counted = limits.count_stream(client).map_err(refused)?;
        let max = self.settings.stream.max_streams;
        if !self.stats.try_reserve_stream(max) {
            if let Some(slot) = counted {
                limits.stream_closed(slot);
            }
            return Err(refused(ApiError::StreamLimit(max)));
        }
        Ok(Open {
            req,
            cors: cors.into(),
            expires,
            early: early.to_vec(),
            counted,
        })
    }
}
