//! The Counter actor behind `GET /dispatcher`: one number, incremented by one
//! message at a time, so concurrent requests get distinct, gap-free values.
//! Runs under a `Supervisor`; the count survives a panic in a handler (see
//! [`crate::supervision`]).
//!
//! In cluster mode the number is the fleet's: each `Take(n)` is one
//! `INCRBY <prefix>:dispatcher n` in Redis, so every node hands out distinct
//! numbers and, together, a gap-free run. A Redis that is down answers 503
//! ("cluster bus unavailable"), never a number from a local count.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use actix::{Actor, Context, Handler, Message, Response, Supervised};

use crate::error::ApiError;
use crate::hub::cluster::Cluster;
use crate::stats::Stats;
use crate::supervision::{Crash, guarded};

/// The `/dispatcher` counter.
pub(crate) struct Counter {
    /// The last value handed out.
    count: u64,
    /// Mirror for `/stats` and restart counting.
    stats: Arc<Stats>,
    /// In cluster mode, where the numbers come from instead of `count`.
    cluster: Option<Arc<Cluster>>,
}

impl Counter {
    /// Starts at zero; the first `Take(1)` answers 1. With `cluster`, the
    /// numbers come from Redis.
    pub(crate) fn new(stats: Arc<Stats>, cluster: Option<Arc<Cluster>>) -> Self {
        Counter {
            count: 0,
            stats,
            cluster,
        }
    }
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Supervised for Counter {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.counter_restarts.fetch_add(1, Relaxed);
        tracing::warn!(
            event = "restart",
            actor = "counter",
            count = self.count,
            "counter restarted; count kept"
        );
    }
}

/// Add `n` (at least 1) and answer the first of the `n` new values: `Take(1)`
/// for one request, more for a batch (see [`crate::conn::dispatcher::take`]).
/// [`ApiError::Crashed`] if the handler crashed, [`ApiError::BusUnavailable`]
/// if Redis did not answer in cluster mode.
#[derive(Message)]
#[rtype(result = "Result<u64, ApiError>")]
pub(crate) struct Take {
    /// How many numbers.
    pub(crate) n: u64,
}

impl Handler<Take> for Counter {
    type Result = Response<Result<u64, ApiError>>;

    fn handle(&mut self, Take { n }: Take, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(cluster) = &self.cluster {
            let cluster = Arc::clone(cluster);
            return Response::fut(async move { cluster.take_numbers(n).await });
        }
        let taken = guarded(self, ctx, |c, _| {
            let first = c.count + 1;
            c.count += n;
            c.stats.counter.store(c.count, Relaxed);
            first
        });
        Response::reply(taken.ok_or(ApiError::Crashed("counter")))
    }
}

impl Handler<Crash> for Counter {
    type Result = Option<()>;

    fn handle(&mut self, _: Crash, ctx: &mut Context<Self>) -> Option<()> {
        guarded(self, ctx, |_, _| {
            panic!("fault injection: counter crash requested")
        })
    }
}
