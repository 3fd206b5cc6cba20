//! The hub: the one place where a message is published and a stream
//! resumes. Route handlers call [`Hub::publish`]; nothing above this module
//! touches the bus, the lingering table or the history.
//!
//! - [`router`]: the Router actor, id -> this node's streams. It hands a
//!   message to the streams of its id (one actor, so no locks) and answers
//!   a resuming stream's login with what it missed. In a single process it
//!   also mints the message's event id and records it in the [`history`],
//!   in the same step as the deliveries.
//! - [`cluster`]: cluster mode's command connection to Redis (the publish
//!   script, the fleet's history reads, the fleet's `/dispatcher` count,
//!   heartbeats, `/cluster`); [`bus`] with `link`: the supervised Bus actor
//!   holding this node's subscriptions and handing the fleet's messages,
//!   this node's own echoes included, to the Router.
//!
//! An event id is minted once per message. In a single process the Router
//! mints it. In cluster mode the Redis publish script
//! (`cluster::PUBLISH_SCRIPT`, run by [`Cluster::publish`]) mints it from
//! the fleet's clock, keeps the message in the fleet's history under it,
//! and PUBLISHes it with the id; every node's Router, the accepting node's
//! included, delivers it under that id. (While the bus is down, a publish
//! without an `Idempotency-Key` reaches this node's streams alone, without
//! an id.) A broadcast has an event id only in cluster mode.

pub(crate) mod bus;
pub(crate) mod cluster;
pub(crate) mod history;
mod link;
pub(crate) mod router;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::{Addr, ArbiterHandle, Supervisor};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::{PublishSettings, Settings};
use crate::error::ApiError;
use crate::idempotency::{self, Begin, Keys};
use crate::stats::Stats;
use bus::Bus;
use cluster::{Cluster, LocalDelivery, PublishFailed, PublishOutcome};
use router::{Attach, Broadcast, Busy, Count, Publish, Published, Router, StreamActor};

/// How often a publish that found the backlog full looks again.
const BACKLOG_RETRY: Duration = Duration::from_millis(10);

/// The backlog rule, for the Hub's wait and the Router's admission alike:
/// whether `need` more deliveries fit beside `backlog` under `max`. An
/// empty backlog takes anything, so a publish larger than the bound (a
/// broadcast to more streams) still goes out, alone.
pub(crate) fn fits_backlog(backlog: u64, need: u64, max: u64) -> bool {
    backlog == 0 || backlog.saturating_add(need) <= max
}

/// Who a publish is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// Every stream of this id (`/send`).
    Id(String),
    /// Every stream (`/broadcast`).
    All,
}

impl Target {
    /// How an `Idempotency-Key` names the target it is bound to.
    fn name(&self) -> String {
        match self {
            Target::Id(id) => format!("send:{id}"),
            Target::All => "broadcast".to_owned(),
        }
    }
}

/// What a publish reached: the body of a 200 to `/send` or `/broadcast`,
/// kept for a repeat of its `Idempotency-Key` (in cluster mode in Redis, as
/// this JSON). The fields are in the order the answer has always listed
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Receipt {
    /// This node's streams that got it.
    pub(crate) delivered: u64,
    /// Its event id: every publish in cluster mode, a single process's
    /// `/send` (a single process's broadcast has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) event_id: Option<u64>,
    /// The id, for `/send`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    /// Cluster mode: the other nodes Redis handed it to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nodes: Option<u64>,
}

/// A publish that reached no stream: why, and what the publisher may do.
#[derive(Debug)]
pub(crate) struct Undelivered {
    /// The id, for `/send`.
    pub(crate) id: Option<String>,
    /// What failed.
    pub(crate) error: ApiError,
    /// What became of the message, and whether a retry is safe.
    pub(crate) outcome: &'static str,
}

/// What became of a publish; `routes` turns it into the HTTP answer.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Published everywhere it could go: 200.
    Done(Receipt),
    /// A repeat of an `Idempotency-Key`: its first answer (200, marked
    /// replayed), or `None` when the first was accepted and its answer not
    /// recorded (yet); nothing delivered again.
    Replayed(Option<Receipt>),
    /// Cluster mode with the bus down: this node's streams got it, no
    /// other node was sent it (503).
    LocalOnly(Receipt),
    /// Delivered nowhere, or not known to be (503 with `Retry-After`; see
    /// [`Hub::publish`]).
    NotDelivered(Undelivered),
}

/// This node's Router and, in cluster mode, its bus: see the module docs.
pub(crate) struct Hub<S: StreamActor> {
    /// The supervised Router (its address survives restarts).
    router: Addr<Router<S>>,
    /// Cluster mode: the command connection and the node's bus stats.
    cluster: Option<Arc<Cluster>>,
    /// Cluster mode: the supervised Bus actor.
    bus: Option<Addr<Bus>>,
    /// Where publishes are counted.
    stats: Arc<Stats>,
    /// The `[publish]` settings: backlog bound, wait, key TTL.
    publish: PublishSettings,
    /// `Idempotency-Key`s of a single process (in cluster mode they live in
    /// Redis).
    keys: Keys<Receipt>,
    /// Cancelled at shutdown: a publish waiting for room gives up.
    shutdown: CancellationToken,
}

impl<S: StreamActor> Hub<S> {
    /// Starts the Router and, when `cluster.redis_url` is set, the command
    /// connection and the Bus, all on `arbiter` (beside each other: a
    /// message from Redis reaches the Router without waking another
    /// thread). The Bus is attached before any stream can log in.
    pub(crate) async fn start(
        settings: &Settings,
        stats: &Arc<Stats>,
        arbiter: &ArbiterHandle,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> io::Result<Self> {
        let router = {
            let stats = Arc::clone(stats);
            let history = settings.history.clone();
            Supervisor::start_in_arbiter(arbiter, move |_| {
                Router::<S>::new(stats, history.size, Duration::from_millis(history.ttl_ms))
            })
        };
        let cluster = if settings.cluster.enabled() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (c, h, max, s, addr) = (
                settings.cluster.clone(),
                settings.history.clone(),
                settings.message.max_bytes,
                Arc::clone(stats),
                cluster::advertised(addr),
            );
            // The connection's tasks run where it is made.
            arbiter.spawn(async move {
                let _ = tx.send(Cluster::new(&c, &h, max, s, addr));
            });
            let cluster = rx
                .await
                .map_err(|_| io::Error::other("the first worker stopped"))?
                .map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("cluster.redis_url: {e}"))
                })?;
            Some(Arc::new(cluster))
        } else {
            None
        };
        let bus = cluster.as_ref().map(|cluster| {
            let (cluster, router) = (Arc::clone(cluster), router.clone());
            Supervisor::start_in_arbiter(arbiter, move |_| {
                Bus::new(
                    cluster,
                    router.clone().recipient(),
                    router.clone().recipient(),
                    router.clone().recipient(),
                    router.recipient(),
                )
            })
        });
        if let Some(bus) = &bus {
            router.do_send(Attach {
                bus: bus.clone().recipient(),
                shared: cluster.clone(),
            });
        }
        Ok(Hub {
            router,
            cluster,
            bus,
            stats: Arc::clone(stats),
            publish: settings.publish.clone(),
            keys: Keys::new(Duration::from_millis(settings.publish.idempotency_ttl_ms)),
            shutdown,
        })
    }

    /// The supervised Router: streams log in and out here.
    pub(crate) fn router(&self) -> &Addr<Router<S>> {
        &self.router
    }

    /// Cluster mode: the command connection (the Counter's numbers,
    /// `/cluster`, `/stats`).
    pub(crate) fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// `/presence/{id}`: the id's open streams on every live node (in
    /// cluster mode from the nodes' presence in Redis, written every
    /// heartbeat), or on this one.
    pub(crate) async fn presence(&self, id: &str) -> Result<cluster::Presence, ApiError> {
        let here = self
            .router
            .send(Count { id: id.to_owned() })
            .await
            .ok()
            .flatten()
            .ok_or(ApiError::Crashed("router"))?;
        match &self.cluster {
            Some(cluster) => cluster.presence(id, here).await,
            None => Ok(cluster::single_presence(id, here)),
        }
    }

    /// Fault injection: makes the Bus panic in a handler (it restarts).
    /// `false` without a bus.
    pub(crate) async fn crash_bus(&self) -> bool {
        match &self.bus {
            Some(bus) => {
                // `None` (the handler panicked) or a mailbox error: either
                // way the Bus is restarting.
                let _ = bus.send(crate::supervision::Crash).await;
                true
            }
            None => false,
        }
    }

    /// Publishes `msg` to `target`: this node's streams, its history, and
    /// in cluster mode the other nodes. With an `Idempotency-Key`, once per
    /// key (see [`crate::idempotency`]): a repeat within
    /// `publish.idempotency_ttl_ms` gets the first answer and delivers
    /// nothing.
    ///
    /// Waits while this node's publish backlog is full, at most
    /// `publish.wait_ms`; then [`ApiError::Backlogged`], nothing delivered
    /// or kept.
    pub(crate) async fn publish(
        &self,
        target: Target,
        msg: &Arc<str>,
        key: Option<String>,
    ) -> Result<Answer, ApiError> {
        if let Some(cluster) = &self.cluster {
            let request = key
                .as_ref()
                .map(|_| idempotency::fingerprint(&target.name(), msg));
            let keyed = key.as_deref().zip(request.as_deref());
            return self.publish_fleet(cluster, &target, msg, keyed).await;
        }
        let Some(key) = key else {
            return self.publish_here(&target, msg).await.map(Answer::Done);
        };
        let request = idempotency::fingerprint(&target.name(), msg);
        match self.keys.begin(&key, &request) {
            Begin::Replay(answer) => Ok(self.replayed(Some(answer))),
            Begin::InFlight => Err(ApiError::IdempotencyInFlight),
            Begin::Mismatch => Err(ApiError::IdempotencyKeyReused),
            Begin::Full => Err(ApiError::TooManyKeys),
            Begin::New(ticket) => {
                // A failure (an error, or a full backlog) releases the key:
                // nothing was delivered, so a retry is a first attempt. One
                // process has no bus, so what it answers is a success.
                let receipt = self.publish_here(&target, msg).await?;
                ticket.finish(receipt.clone());
                Ok(Answer::Done(receipt))
            }
        }
    }

    /// The first answer to an `Idempotency-Key`, again.
    fn replayed(&self, answer: Option<Receipt>) -> Answer {
        self.stats.publish_replayed.fetch_add(1, Relaxed);
        Answer::Replayed(answer)
    }

    /// Delivers to this node's streams, waiting for room in the backlog (a
    /// full one means nothing was delivered), with an event id this node's
    /// Router gives it: a single process, or cluster mode while the bus is
    /// down.
    async fn publish_here(&self, target: &Target, msg: &Arc<str>) -> Result<Receipt, ApiError> {
        let accepted = Instant::now();
        Ok(match target {
            Target::Id(id) => {
                let Published { delivered, event } = self
                    .admitted(1, |limit| Publish {
                        id: id.clone(),
                        msg: Arc::clone(msg),
                        event: None,
                        accepted,
                        limit,
                    })
                    .await?;
                Receipt {
                    delivered: delivered as u64,
                    event_id: event,
                    id: Some(id.clone()),
                    nodes: None,
                }
            }
            Target::All => {
                let streams = self.stats.streams_active() as u64;
                let delivered = self
                    .admitted(streams, |limit| Broadcast {
                        msg: Arc::clone(msg),
                        event: None,
                        accepted,
                        limit,
                    })
                    .await?;
                Receipt {
                    delivered: delivered as u64,
                    event_id: None,
                    id: None,
                    nodes: None,
                }
            }
        })
    }

    /// A publish in cluster mode: the fleet gives it its event id and keeps
    /// it, and every node's streams, this node's included, get it from
    /// Redis, in the order of the ids ([`Cluster::publish`]). With an
    /// `Idempotency-Key` (`keyed`: the key and the request's fingerprint),
    /// the key is claimed in the same script, so a retry with the key never
    /// delivers it twice, whichever node it reaches.
    ///
    /// While the bus is down, a publish without a key still reaches this
    /// node's streams (503, "other nodes: not sent"); one with a key is
    /// delivered nowhere (503: retry). When Redis does not answer in time,
    /// it may still run the publish (then every node delivers it, this one
    /// included): 503, "unknown".
    async fn publish_fleet(
        &self,
        cluster: &Cluster,
        target: &Target,
        msg: &Arc<str>,
        keyed: Option<(&str, &str)>,
    ) -> Result<Answer, ApiError> {
        self.wait_for_room().await?;
        let id = match target {
            Target::Id(id) => Some(id.as_str()),
            Target::All => None,
        };
        // Whether the echo comes here: asked of the Router while Redis runs
        // the script (a crashed Router holds nothing).
        let subscribed_here = async {
            let Some(id) = id else {
                return true;
            };
            let held = self.router.send(Count { id: id.to_owned() }).await;
            held.ok().flatten().unwrap_or(0) > 0 || cluster.is_lingering(id)
        };
        let ttl = Duration::from_millis(self.publish.idempotency_ttl_ms);
        let failed = match cluster
            .publish(cluster.names.of(id), msg, keyed, ttl, subscribed_here)
            .await
        {
            Ok(PublishOutcome::Mismatch) => return Err(ApiError::IdempotencyKeyReused),
            Ok(PublishOutcome::Repeat(first)) => return Ok(self.replayed(first)),
            Ok(PublishOutcome::Fresh {
                nodes,
                local,
                claim,
                event,
            }) => {
                // No echo here: this node was not subscribed when Redis ran
                // it, so none of its streams had started (a stream that
                // starts later reads it from the fleet's history if it
                // resumes from before it).
                let receipt = Receipt {
                    delivered: match local {
                        LocalDelivery::Delivered(n) => n,
                        LocalDelivery::NotSubscribed => 0,
                    },
                    event_id: Some(event),
                    id: id.map(str::to_owned),
                    nodes: Some(nodes),
                };
                if let (Some((key, _)), Some(claim)) = (keyed, claim) {
                    cluster.remember_answer(key, claim, &receipt).await;
                }
                return Ok(Answer::Done(receipt));
            }
            Err(failed) => failed,
        };
        if let (PublishFailed::NotSent, None) = (&failed, keyed) {
            // The bus is down: this node's streams still get it.
            return self.publish_here(target, msg).await.map(Answer::LocalOnly);
        }
        let error = match &failed {
            PublishFailed::Refused(why) => ApiError::RedisRefused(why.clone()),
            PublishFailed::ClockAhead(ahead) => ApiError::FleetClockAhead {
                ahead_s: ahead.as_secs(),
            },
            _ => ApiError::BusUnavailable,
        };
        let outcome = match (failed, keyed) {
            (PublishFailed::NotSent, _) => "not delivered anywhere: the bus is down; retry",
            (PublishFailed::Refused(_), _) => {
                "not delivered anywhere: Redis refused the publish script before it published; \
                 nothing was sent to any node"
            }
            (PublishFailed::ClockAhead(_), _) => {
                "not delivered anywhere: nothing was kept or sent; retry after Retry-After seconds"
            }
            (PublishFailed::Unknown, Some(_)) => {
                "unknown: Redis did not answer in time; if it runs the publish later, every node \
                 delivers it then; retry with the same Idempotency-Key, which never delivers twice"
            }
            (PublishFailed::Unreplicated, _) => {
                "unknown: Redis ran the publish (streams subscribed then got it), but fewer replicas \
                 than cluster.redis_wait_replicas confirmed it in time, so a failover may lose it \
                 from the fleet's history; retry only with an Idempotency-Key"
            }
            (PublishFailed::Unknown, None) => {
                "unknown: Redis did not answer in time; if it runs the publish later, every node \
                 delivers it then, this one included; retry only with an Idempotency-Key"
            }
        };
        Ok(Answer::NotDelivered(Undelivered {
            id: id.map(str::to_owned),
            error,
            outcome,
        }))
    }

    /// Hands a publish (`make(limit)`) to the Router, waiting while the
    /// publish backlog is full ([`Hub::with_room`]); `need`: about how many
    /// deliveries it makes. The Router, one actor, decides each admission,
    /// so concurrent publishers cannot overshoot the bound together.
    async fn admitted<M, T>(&self, need: u64, make: impl Fn(Option<u64>) -> M) -> Result<T, ApiError>
    where
        M: actix::Message<Result = Option<Result<T, Busy>>> + Send + 'static,
        T: Send + 'static,
        Router<S>: actix::Handler<M>,
        <Router<S> as actix::Actor>::Context: actix::dev::ToEnvelope<Router<S>, M>,
    {
        let limit = Some(self.publish.max_backlog);
        self.with_room(need, async || {
            let answer = self.router.send(make(limit)).await;
            answer.ok().flatten().ok_or(ApiError::Crashed("router"))
        })
        .await
    }

    /// Waits while this node's publish backlog is full, for a cluster
    /// publish, whose delivery here comes from its echo and cannot be
    /// refused then. Approximate: publishes that find room at the
    /// same moment may carry the backlog past the bound together.
    async fn wait_for_room(&self) -> Result<(), ApiError> {
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
    /// messages. Between attempts it reads the backlog every
    /// [`BACKLOG_RETRY`] and tries again only once `need` deliveries would
    /// fit, so waiting publishers cost the Router nothing while it catches
    /// up.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The body a 200 to `/send` and `/broadcast` has always had: the keys
    /// in this order, absent ones left out (not `null`).
    #[test]
    fn a_receipt_is_the_answer_publishers_parse() {
        let send = Receipt {
            delivered: 2,
            event_id: Some(7),
            id: Some("a".to_owned()),
            nodes: Some(3),
        };
        assert_eq!(
            serde_json::to_string(&send).unwrap(),
            r#"{"delivered":2,"event_id":7,"id":"a","nodes":3}"#
        );
        let broadcast = Receipt {
            delivered: 5,
            event_id: None,
            id: None,
            nodes: None,
        };
        assert_eq!(serde_json::to_string(&broadcast).unwrap(), r#"{"delivered":5}"#);
    }

    /// A first answer kept in Redis reads back as it was written, and what
    /// is not a receipt (another build's or a hand-edited value) reads as
    /// "not recorded", never as a made-up answer.
    #[test]
    fn a_kept_receipt_reads_back_and_anything_else_is_refused() {
        let kept = r#"{"delivered":1,"event_id":9,"id":"x","nodes":0}"#;
        let receipt: Receipt = serde_json::from_str(kept).unwrap();
        assert_eq!(serde_json::to_string(&receipt).unwrap(), kept);
        assert!(serde_json::from_str::<Receipt>(r#"{"delivered":-1}"#).is_err());
        assert!(serde_json::from_str::<Receipt>(r#"{"id":"x"}"#).is_err());
        assert!(serde_json::from_str::<Receipt>("not json").is_err());
    }

    /// `/presence/{id}` as it has always been written.
    #[test]
    fn presence_is_the_answer_it_was() {
        let p = cluster::Presence {
            id: "a".to_owned(),
            nodes: vec![cluster::NodePresence {
                node: "n1".to_owned(),
                streams: 2,
            }],
            streams: 2,
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"id":"a","nodes":[{"node":"n1","streams":2}],"streams":2}"#
        );
    }

    #[test]
    fn the_backlog_takes_anything_when_empty_and_up_to_its_bound_otherwise() {
        assert!(fits_backlog(0, 1_000_000, 10));
        assert!(fits_backlog(4, 6, 10));
        assert!(!fits_backlog(4, 7, 10));
        // No overflow near the top.
        assert!(!fits_backlog(u64::MAX, 1, u64::MAX - 1));
    }
}
