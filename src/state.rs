//! What every worker and handler of one server shares.

use std::sync::Arc;

use actix::Addr;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::counter::Counter;
use crate::router::Router;
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
    /// Cancelled once on SIGINT/SIGTERM (or the caller's shutdown future):
    /// accept loops stop, actix-web connections drain, new streams are refused.
    pub(crate) shutdown: CancellationToken,
}

impl ServerState {
    /// The supervised Router (its address survives restarts).
    pub(crate) fn router(&self) -> &Addr<Router<Stream>> {
        &self.streams.router
    }
}
