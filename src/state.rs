//! What every worker and handler of one server shares ([`ServerState`]);
//! who gets in is decided by its [`Admission`].

use std::sync::Arc;

use std::sync::atomic::Ordering::Relaxed;

use actix::Addr;
use actix_rt::net::TcpStream;

use crate::admission::Admission;
use crate::config::Settings;
use crate::conn::classify::HeadError;
use crate::conn::wire::Wire;
use crate::conn::{socket, tls};
use crate::counter::Counter;
use crate::error::{ApiError, Cors};
use crate::hub::Hub;
use crate::hub::router::Router;
use crate::stats::Stats;
use crate::stream::{self, Stream};

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
    /// Who gets in: every input of a stream's or a publish's admission.
    pub(crate) admission: Admission,
    /// The certificate and TLS settings of the TLS ports, if any.
    pub(crate) tls: Option<Arc<crate::conn::tls::Acceptor>>,
}

impl ServerState {
    /// The `/stats` document: the server's counters, and in cluster mode
    /// a `cluster` section (also what the dashboard's feed carries).
    pub(crate) fn stats_document(&self) -> serde_json::Value {
        let mut snapshot = self.stats.snapshot();
        snapshot["limits"] = self.admission.limits.stats();
        if let Some(cluster) = self.hub.cluster() {
            snapshot["cluster"] = serde_json::to_value(cluster.snapshot()).unwrap_or_default();
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
    /// `bad_heads`, and closes the connection, plain or TLS; a client that
    /// is gone gets nothing, nor does a TLS connection whose records failed
    /// ([`tls::refused`]).
    pub(crate) async fn refuse_head(&self, wire: impl Wire, e: HeadError) {
        if let HeadError::Tls(_) = e {
            return tls::refused(&self.stats, e);
        }
        if let Some(error) = self.refused_head(e) {
            socket::refuse(wire, &error, Cors::default()).await;
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
                limit: crate::conn::classify::MAX_HEADERS,
            },
            HeadError::Invalid(why) => ApiError::BadHead(why),
            HeadError::Tls(why) => ApiError::BadHead(why),
            // Nobody to answer; callers do not send it.
            HeadError::Gone => ApiError::BadHead("the client went away"),
        }
    }
}
