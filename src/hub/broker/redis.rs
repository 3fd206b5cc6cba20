//! The Redis broker: a fleet on one Redis master (cluster mode). It owns
//! the command connection ([`Cluster`]: the publish script, history reads,
//! presence, heartbeats) and tells the Bus ([`crate::hub::bus`]) which ids
//! this node holds; the Bus subscribes to them and hands every message the
//! fleet publishes, this node's own echoes included, to the Router under
//! the event id the script gave it.
//!
//! What only this engine needs stays behind it: the linger table and the
//! awaited echoes live in [`Cluster`], filled and emptied by the Bus.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::Recipient;

use super::{
    Answer, Broker, Counts, Later, LaterFrom, Outgoing, Publishing, Read, Receipt, Subscription, Undelivered,
};
use crate::error::ApiError;
use crate::hub::bus::Interest;
use crate::hub::cluster::{Cluster, LocalDelivery, Presence, PublishFailed, PublishOutcome};
use crate::hub::history::CaughtUp;
use crate::hub::local::Local;
use crate::hub::router::Note;
use crate::idempotency;

/// See the module docs.
pub(crate) struct Redis {
    /// The command connection.
    cluster: Arc<Cluster>,
    /// The Bus, told of every id held here; set once it runs, before any
    /// stream can log in.
    bus: OnceLock<Recipient<Interest>>,
}

impl Redis {
    /// A broker on `cluster`; its Bus comes with [`Redis::attach`].
    pub(crate) fn new(cluster: Arc<Cluster>) -> Self {
        Redis {
            cluster,
            bus: OnceLock::new(),
        }
    }

    /// From now on, tell `bus` which ids this node holds.
    pub(crate) fn attach(&self, bus: Recipient<Interest>) {
        let _ = self.bus.set(bus);
    }

    fn tell(&self, m: Interest) {
        if let Some(bus) = self.bus.get() {
            bus.do_send(m);
        }
    }
}

impl Broker for Redis {
    fn streams_wait(&self) -> bool {
        true
    }

    fn subscribe(&self, id: &Arc<str>) -> Subscription {
        self.tell(Interest::Held(Arc::clone(id)));
        Subscription::Pending
    }

    fn unsubscribe(&self, id: Arc<str>) {
        self.tell(Interest::Released(id));
    }

    fn confirm(&self, id: Arc<str>) -> Subscription {
        self.tell(Interest::Confirm(id));
        Subscription::Pending
    }

    /// The script mints ids: a message that did not go through it (the
    /// bus was down) reaches this node's streams alone, without one (it is
    /// in no history, and an id from this node's clock could pass the
    /// fleet's).
    fn keep(&self, _: &str, _: &Arc<str>) -> Option<u64> {
        None
    }

    fn read(&self, id: &Arc<str>, since: Option<u64>) -> Read {
        let (cluster, id) = (Arc::clone(&self.cluster), Arc::clone(id));
        Read::Later(Box::pin(
            async move { cluster.read_history(&id, since).await.ok() },
        ))
    }

    fn catch_up(&self, ids: Vec<Arc<str>>, since: u64) -> Later<Option<CaughtUp>> {
        let cluster = Arc::clone(&self.cluster);
        Box::pin(async move { cluster.catch_up(&ids, since).await.ok() })
    }

    fn presence_every(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.cluster.settings.heartbeat_interval_ms))
    }

    fn write_presence(&self, counts: Counts, full: bool) -> Later<Result<bool, ()>> {
        let cluster = Arc::clone(&self.cluster);
        Box::pin(async move { cluster.write_presence(&counts, full).await.map_err(|_| ()) })
    }

    /// PUBLISHed on the id's channel as `<instance>!<join|leave> <json>`
    /// (not through the publish script: it has no event id and is not
    /// kept); every other node's Bus hands it to its streams of the id. A
    /// PUBLISH that fails is counted (`streams.notes_failed`), not retried.
    fn notify(&self, id: &Arc<str>, note: &Note) {
        let cluster = Arc::clone(&self.cluster);
        let channel = cluster.names.id_channel(id);
        let payload = format!("{}!{} {}", cluster.instance, note.kind.as_str(), note.json);
        actix_rt::spawn(async move {
            // A sharded channel on a Redis Cluster.
            let command = if cluster.names.sharded() {
                "SPUBLISH"
            } else {
                "PUBLISH"
            };
            let published = cluster
                .command("PUBLISH", async move |mut c| {
                    redis::cmd(command)
                        .arg(channel)
                        .arg(payload)
                        .query_async::<i64>(&mut c)
                        .await
                })
                .await;
            if published.is_err() {
                cluster
                    .server_stats
                    .notes_failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }

    /// The fleet vacates this node's ids ([`Cluster::leave`]).
    fn stopping(&self) {}

    fn upkeep_every(&self) -> Option<Duration> {
        None
    }

    fn upkeep(&self) {}

    /// The fleet gives it its event id and keeps it, and every node's
    /// streams, this node's included, get it from Redis, in the order of
    /// the ids ([`Cluster::publish`]). With an `Idempotency-Key`, the key is
    /// claimed in the same script, so a retry with the key never delivers
    /// it twice, whichever node it reaches.
    ///
    /// While the bus is down, a publish without a key still reaches this
    /// node's streams (503, "other nodes: not sent"); one with a key is
    /// delivered nowhere (503: retry). When Redis does not answer in time,
    /// it may still run the publish (then every node delivers it, this one
    /// included): 503, "unknown".
    fn publish<'a>(&'a self, out: Outgoing<'a>, here: &'a Local) -> Publishing<'a> {
        let Outgoing { target, msg, key } = out;
        Box::pin(async move {
            let cluster = &self.cluster;
            let request = key
                .as_ref()
                .map(|_| idempotency::fingerprint(&target.name(), msg));
            let keyed = key.as_deref().zip(request.as_deref());
            here.wait_for_room().await?;
            let id = target.id();
            // Whether the echo comes here: asked of the Router while Redis
            // runs the script (a crashed Router holds nothing).
            let subscribed_here = async {
                let Some(id) = id else {
                    return true;
                };
                here.count(id).await.unwrap_or(0) > 0 || cluster.is_lingering(id)
            };
            let ttl = Duration::from_millis(here.publish.idempotency_ttl_ms);
            let published = if id.is_none() && cluster.names.sharded() {
                // A broadcast on a Redis Cluster is several steps (its
                // key's claim, then a copy per shard): they run to their
                // end even if the publisher goes away meanwhile, so that a
                // claim is never left without its copies sent or given back.
                let (c, m) = (Arc::clone(cluster), msg.to_owned());
                let k = keyed.map(|(key, request)| (key.to_owned(), request.to_owned()));
                actix_rt::spawn(async move {
                    let keyed = k.as_ref().map(|(key, request)| (key.as_str(), request.as_str()));
                    c.publish(None, &m, keyed, ttl, async { true }).await
                })
                .await
                .unwrap_or(Err(PublishFailed::Unknown))
            } else {
                cluster.publish(id, msg, keyed, ttl, subscribed_here).await
            };
            let failed = match published {
                Ok(PublishOutcome::Mismatch) => return Err(ApiError::IdempotencyKeyReused),
                Ok(PublishOutcome::Repeat(first)) => return Ok(here.replayed(first)),
                Ok(PublishOutcome::Fresh {
                    nodes,
                    local,
                    claim,
                    event,
                }) => {
                    // No echo here: this node was not subscribed when Redis
                    // ran it, so none of its streams had started (a stream
                    // that starts later reads it from the fleet's history
                    // if it resumes from before it).
                    let receipt = Receipt {
                        delivered: match local {
                            LocalDelivery::Delivered(n) => n,
                            LocalDelivery::NotSubscribed => 0,
                        },
                        event_id: event,
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
                return here.deliver(target, msg).await.map(Answer::LocalOnly);
            }
            Ok(Answer::NotDelivered(undelivered(id, failed, keyed.is_some())))
        })
    }

    fn presence<'a>(
        &'a self,
        id: &'a str,
        here: usize,
        subjects: Option<Vec<Arc<str>>>,
    ) -> LaterFrom<'a, Result<Presence, ApiError>> {
        Box::pin(self.cluster.presence(id, here, subjects))
    }
}

/// The 503 for a publish that failed as `failed` (`keyed`: it has an
/// `Idempotency-Key`): the error, and what became of the message.
fn undelivered(id: Option<&str>, failed: PublishFailed, keyed: bool) -> Undelivered {
    let error = match &failed {
        PublishFailed::Refused(why) => ApiError::RedisRefused(why.clone()),
        PublishFailed::ClockAhead(ahead) => ApiError::FleetClockAhead {
            ahead_s: ahead.as_secs(),
        },
        _ => ApiError::BusUnavailable,
    };
    let outcome = match (failed, keyed) {
        (
            PublishFailed::Partial {
                reached,
                shards,
                late,
                key_kept,
            },
            _,
        ) => {
            let mut outcome = if reached == 0 {
                "not delivered anywhere".to_owned()
            } else {
                format!(
                    "partly delivered: the ids of {reached} of the Redis Cluster's {shards} shards got it, \
                     the others' did not"
                )
            };
            if late {
                outcome += "; a shard's master that did not answer in time may still send its copy late";
            }
            outcome += &match key_kept {
                None => "; a retry sends it to every shard again, so streams that got it may get it twice"
                    .to_owned(),
                Some(d) => format!(
                    "; its Idempotency-Key could not be given back: a retry with it within {} s is answered \
                     as a repeat; retry after that, or with a new key",
                    d.as_secs().max(1)
                ),
            };
            return Undelivered {
                id: None,
                error,
                outcome: outcome.into(),
            };
        }
        (PublishFailed::NotSent, _) => "not delivered anywhere: the bus is down; retry",
        (PublishFailed::Refused(_), _) => {
            "not delivered anywhere: Redis refused the publish script before it published; \
             nothing was sent to any node"
        }
        (PublishFailed::ClockAhead(_), _) => {
            "not delivered anywhere: nothing was kept or sent; retry after Retry-After seconds"
        }
        (PublishFailed::Unknown, true) => {
            "unknown: Redis did not answer in time; if it runs the publish later, every node \
             delivers it then; retry with the same Idempotency-Key, which never delivers twice"
        }
        (PublishFailed::Unreplicated, _) => {
            "unknown: Redis ran the publish (streams subscribed then got it), but fewer replicas \
             than cluster.redis_wait_replicas confirmed it in time, so a failover may lose it \
             from the fleet's history; retry only with an Idempotency-Key"
        }
        (PublishFailed::Unknown, false) => {
            "unknown: Redis did not answer in time; if it runs the publish later, every node \
             delivers it then, this one included; retry only with an Idempotency-Key"
        }
    };
    Undelivered {
        id: id.map(str::to_owned),
        error,
        outcome: outcome.into(),
    }
}
