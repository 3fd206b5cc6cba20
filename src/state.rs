//! What every worker and handler of one server shares.

use std::sync::Arc;

use std::sync::atomic::Ordering::Relaxed;

use actix::Addr;
use actix_rt::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::classify::HeadError;
use crate::cluster::Cluster;
use crate::cluster::bus::Bus;
use crate::config::Settings;
use crate::counter::Counter;
use crate::error::ApiError;
use crate::router::Router;
use crate::socket;
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
    /// Cluster mode: this node's side of the Redis bus.
    pub(crate) cluster: Option<Arc<Cluster>>,
    /// Cluster mode: the supervised Bus actor.
    pub(crate) bus: Option<Addr<Bus>>,
    /// The main listening address, as `/cluster` shows it.
    pub(crate) addr: String,
    /// Cancelled once on SIGINT/SIGTERM (or the caller's shutdown future):
    /// accept loops stop, actix-web connections drain, new streams are refused.
    pub(crate) shutdown: CancellationToken,
}

impl ServerState {
    /// The supervised Router (its address survives restarts).
    pub(crate) fn router(&self) -> &Addr<Router<Stream>> {
        &self.streams.router
    }

    /// Answers a head a lean path refuses (400, 408, 431), counted in
    /// `bad_heads`, and closes the connection; a client that is gone gets
    /// nothing.
    pub(crate) async fn refuse_head(&self, io: TcpStream, e: HeadError) {
        let server = &self.settings.server;
        let answer = match e {
            HeadError::Timeout => ApiError::HeadTimeout {
                ms: server.head_timeout_ms,
            },
            HeadError::TooLarge => ApiError::HeadTooLarge {
                limit: server.max_head_bytes,
            },
            HeadError::Invalid(why) => ApiError::BadHead(why),
            HeadError::Gone => return,
        };
        self.stats.bad_heads.fetch_add(1, Relaxed);
        socket::refuse(io, &answer).await;
    }
}
