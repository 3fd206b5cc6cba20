//! What every worker, handler and stream of one server shares.

use std::sync::Arc;

use actix::Addr;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::counter::Counter;
use crate::router::Router;
use crate::stats::Stats;

/// Shared by `Arc`: each Stream holds one pointer to it rather than its own
/// copies (a cloned `Addr` alone costs ~72 bytes per stream).
pub struct ServerState {
    /// The effective configuration.
    pub settings: Settings,
    /// Counters for `/stats`.
    pub stats: Arc<Stats>,
    /// The supervised Router (its address survives restarts).
    pub router: Addr<Router>,
    /// The supervised Counter.
    pub counter: Addr<Counter>,
    /// Cancelled once on SIGINT/SIGTERM (or the caller's shutdown future):
    /// accept loops stop, actix-web connections drain, new streams are refused.
    pub shutdown: CancellationToken,
}
