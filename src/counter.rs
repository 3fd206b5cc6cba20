//! The Counter actor behind `GET /dispatcher`: one number, incremented by one
//! message at a time, so concurrent requests get distinct, gap-free values.
//! Runs under a `Supervisor`; the count survives a panic in a handler (see
//! [`crate::supervision`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use actix::{Actor, Context, Handler, Message, Supervised};

use crate::stats::Stats;
use crate::supervision::guarded;

/// The `/dispatcher` counter.
pub(crate) struct Counter {
    /// The last value handed out.
    count: u64,
    /// Mirror for `/stats` and restart counting.
    stats: Arc<Stats>,
}

impl Counter {
    /// Starts at zero; the first `Take(1)` answers 1.
    pub(crate) fn new(stats: Arc<Stats>) -> Self {
        Counter { count: 0, stats }
    }
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Supervised for Counter {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.counter_restarts.fetch_add(1, Relaxed);
        tracing::warn!(count = self.count, "counter restarted; count kept");
    }
}

/// Add `n` (at least 1) and answer the first of the `n` new values: `Take(1)`
/// for one request, more for a batch (see [`crate::dispatcher::take`]). `None`
/// if the handler crashed.
#[derive(Message)]
#[rtype(result = "Option<u64>")]
pub(crate) struct Take(pub u64);

/// Fault injection: panic inside the handler.
#[derive(Message)]
#[rtype(result = "Option<()>")]
pub(crate) struct Crash;

impl Handler<Take> for Counter {
    type Result = Option<u64>;

    fn handle(&mut self, Take(n): Take, ctx: &mut Context<Self>) -> Option<u64> {
        guarded(self, ctx, |c, _| {
            let first = c.count + 1;
            c.count += n;
            c.stats.counter.store(c.count, Relaxed);
            first
        })
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
