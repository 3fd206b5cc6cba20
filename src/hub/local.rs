//! This node's Router as a publisher sees it: hand it a message for this
//! node's streams, wait for room in the publish backlog, ask how many
//! streams of an id are here. A broker's publish ([`super::broker::Broker::
//! publish`]) uses it; it names no engine.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::{Message, Recipient};
use tokio_util::sync::CancellationToken;

use crate::config::PublishSettings;
use crate::error::ApiError;
use crate::hub::broker::{Answer, Receipt, Target};
use crate::hub::router::{Broadcast, Busy, Count, Publish, Published, fits_backlog};
use crate::stats::Stats;

/// How often a publish that found the backlog full looks again.
const BACKLOG_RETRY: Duration = Duration::from_millis(10);

/// See the module docs.
pub(crate) struct Local {
    /// The Router's publish, broadcast and count handlers.
    pub(crate) publish_to: Recipient<Publish>,
    pub(crate) broadcast_to: Recipient<Broadcast>,
    pub(crate) count_of: Recipient<Count>,
    /// Where publishes are counted.
    pub(crate) stats: Arc<Stats>,
    /// The `[publish]` settings: backlog bound, wait, key TTL.
    pub(crate) publish: PublishSettings,
    /// Cancelled at shutdown: a publish waiting for room gives up.
    pub(crate) shutdown: CancellationToken,
}

impl Local {
    /// How many streams of `id` this node has open (`None`: the Router
    /// crashed and holds nothing).
    pub(crate) async fn count(&self, id: &str) -> Option<usize> {
        self.count_of
            .send(Count {
                id: id.to_owned(),
                present: false,
            })
            .await
            .ok()
            .flatten()
    }

    /// The first answer to an `Idempotency-Key`, again.
    pub(crate) fn replayed(&self, answer: Option<Receipt>) -> Answer {
        self.stats.publish_replayed.fetch_add(1, Relaxed);
        Answer::Replayed(answer)
    }

    /// Delivers to this node's streams, waiting for room in the backlog (a
    /// full one means nothing was delivered), with the event id the
    /// Router's step gives it ([`super::broker::Broker::keep`]).
    pub(crate) async fn deliver(&self, target: &Target, msg: &Arc<str>) -> Result<Receipt, ApiError> {
        let (accepted, msg) = (Instant::now(), Arc::clone(msg));
        Ok(match target {
            Target::Id(id) => {
                let make = |limit| Publish {
                    id: id.clone(),
                    msg: Arc::clone(&msg),
                    event: None,
                    accepted,
                    limit,
                };
                let Published { delivered, event } = self.admitted(&self.publish_to, 1, make).await?;
                Receipt {
                    delivered: delivered as u64,
                    event_id: event,
                    id: Some(id.clone()),
                    nodes: None,
                }
            }
            Target::All => {
                let streams = self.stats.streams_active() as u64;
                let make = |limit| Broadcast {
                    msg: Arc::clone(&msg),
                    event: None,
                    accepted,
                    limit,
                    part: None,
                };
                let delivered = self.admitted(&self.broadcast_to, streams, make).await?;
                Receipt {
                    delivered: delivered as u64,
                    event_id: None,
                    id: None,
                    nodes: None,
                }
            }
        })
    }

    /// Hands a publish (`make(limit)`) to the Router, waiting while the
    /// publish backlog is full ([`Local::with_room`]); `need`: about how
    /// many deliveries it makes. The Router, one actor, decides each
    /// admission, so concurrent publishers cannot overshoot the bound
    /// together.
    async fn admitted<M, T>(
        &self,
        to: &Recipient<M>,
        need: u64,
        make: impl Fn(Option<u64>) -> M,
    ) -> Result<T, ApiError>
    where
        M: Message<Result = Option<Result<T, Busy>>> + Send + 'static,
        T: Send + 'static,
    {
        let limit = Some(self.publish.max_backlog);
        self.with_room(need, async || {
            let answer = to.send(make(limit)).await;
            answer.ok().flatten().ok_or(ApiError::Crashed("router"))
        })
        .await
    }

    /// Waits while this node's publish backlog is full, for a publish
    /// whose delivery here comes later (a fleet's echo) and cannot be
    /// refused then. Approximate: publishes that find room at the same
    /// moment may carry the backlog past the bound together.
    pub(crate) async fn wait_for_room(&self) -> Result<(), ApiError> {
        self.with_room(1, async || Ok(if self.has_room(1) { Ok(()) } else { Err(Busy) }))
            .await
    }

    /// Whether `need` more deliveries would fit in the publish backlog now
    /// (an empty one takes anything), read without asking the Router.
    fn has_room(&self, need: u64) -> bool {
        fits_backlog(
            self.stats.publish_backlog.load(Relaxed),
            need,
            self.publish.max_backlog,
        )
    }

    /// Runs `attempt` until it finds room in the publish backlog, for at
    /// most `publish.wait_ms`; then [`ApiError::Backlogged`]
    /// (`publish.rejected`), nothing of the message delivered or kept. This
    /// is what pushes back on a publisher faster than the streams take its
    /// messages. Between
    /// attempts it reads the backlog every [`BACKLOG_RETRY`] and tries
    /// again only once `need` deliveries would fit, so waiting publishers
    /// cost the Router nothing while it catches up.
    async fn with_room<T>(
        &self,
        need: u64,
        mut attempt: impl AsyncFnMut() -> Result<Result<T, Busy>, ApiError>,
    ) -> Result<T, ApiError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.publish.wait_ms);
        loop {
            if let Ok(done) = attempt().await? {
                return Ok(done);
            }
            loop {
                if tokio::time::Instant::now() + BACKLOG_RETRY > deadline {
                    self.stats.publish_rejected.fetch_add(1, Relaxed);
                    return Err(ApiError::Backlogged {
                        limit: self.publish.max_backlog,
                    });
                }
                tokio::select! {
                    () = self.shutdown.cancelled() => return Err(ApiError::ShuttingDown),
                    () = tokio::time::sleep(BACKLOG_RETRY) => {}
                }
                if self.has_room(need) {
                    break;
                }
            }
        }
    }
}
