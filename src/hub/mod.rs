//! The hub: the one place where a message is published and a stream
//! resumes. Route handlers call [`Hub::publish`]; nothing above this module
//! touches the broker, the bus or the history.
//!
//! - [`router`]: the Router actor, id -> this node's streams. It hands a
//!   message to the streams of its id (one actor, so no locks) and answers
//!   a resuming stream's login with what it missed. It names no engine:
//!   it asks its [`broker`] for subscriptions, event ids and history.
//! - [`broker`]: the engine under the hub, behind one trait: [`broker::
//!   memory`] for one process, [`broker::redis`] for a fleet on one Redis.
//! - [`local`]: this node's Router as a publisher sees it (the backlog
//!   wait, the delivery here), used by each broker's publish.
//! - [`cluster`]: the Redis broker's command connection (the publish
//!   script, the fleet's history reads, the fleet's `/dispatcher` count,
//!   heartbeats, `/cluster`); [`bus`] with `link`: the supervised Bus actor
//!   holding this node's subscriptions and handing the fleet's messages,
//!   this node's own echoes included, to the Router.
//!
//! An event id is minted once per message, by the broker: in one process
//! in the Router's step that delivers it ([`broker::Broker::keep`]); in a
//! fleet by the Redis publish script (`cluster::PUBLISH_SCRIPT`, run by
//! [`Cluster::publish`]), which keeps the message in the fleet's history
//! under it and PUBLISHes it with the id; every node's Router, the
//! accepting node's included, delivers it under that id. (While the bus is
//! down, a publish without an `Idempotency-Key` reaches this node's streams
//! alone, without an id.) A broadcast has an event id only in a fleet.

pub(crate) mod broker;
pub(crate) mod bus;
pub(crate) mod cluster;
pub(crate) mod history;
mod link;
pub(crate) mod local;
pub(crate) mod occupancy;
pub(crate) mod router;
pub(crate) mod sharded;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use actix::{Addr, ArbiterHandle, Supervisor};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::error::ApiError;
use crate::stats::Stats;
use crate::webhooks::Webhooks;
pub(crate) use broker::{Answer, Receipt, Target, Undelivered};
use broker::{Broker, memory::Memory};
use bus::Bus;
use cluster::Cluster;
use local::Local;
use router::{Count, Router, StreamActor, Subjects};

/// This node's Router, its broker and, in cluster mode, its bus: see the
/// module docs.
pub(crate) struct Hub<S: StreamActor> {
    /// The supervised Router (its address survives restarts).
    router: Addr<Router<S>>,
    /// The engine.
    broker: Arc<dyn Broker>,
    /// Cluster mode: the command connection, for the fleet's views
    /// (`/cluster`, `/stats`, the Counter's numbers).
    cluster: Option<Arc<Cluster>>,
    /// Cluster mode: the supervised Bus actor.
    bus: Option<Addr<Bus>>,
    /// This node's Router, as a publish uses it.
    local: Local,
    /// Which ids' `/presence` lists subjects (`presence_events`).
    namespaces: crate::namespace::Namespaces,
}

impl<S: StreamActor> Hub<S> {
    /// Starts the broker and the Router and, when `cluster.redis_url` is
    /// set, the command connection and the Bus, all on `arbiter` (beside
    /// each other: a message from Redis reaches the Router without waking
    /// another thread). The Bus is attached before any stream can log in.
    pub(crate) async fn start(
        settings: &Settings,
        stats: &Arc<Stats>,
        arbiter: &ArbiterHandle,
        addr: SocketAddr,
        shutdown: CancellationToken,
        webhooks: Option<Arc<Webhooks>>,
    ) -> io::Result<Self> {
        let cluster = if settings.cluster.enabled() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (c, h, max, s, addr, w) = (
                settings.cluster.clone(),
                crate::namespace::Namespaces::new(settings),
                settings.message.max_bytes,
                Arc::clone(stats),
                cluster::advertised(addr),
                webhooks.clone(),
            );
            // The connection's tasks run where it is made.
            arbiter.spawn(async move {
                let _ = tx.send(Cluster::new(&c, h, max, s, addr).map(|c| c.with_webhooks(w)));
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
        let fleet = cluster
            .as_ref()
            .map(|cluster| Arc::new(broker::redis::Redis::new(Arc::clone(cluster))));
        let broker: Arc<dyn Broker> = match &fleet {
            Some(fleet) => Arc::clone(fleet) as Arc<dyn Broker>,
            None => Arc::new(Memory::new(settings, stats).with_webhooks(webhooks.clone())),
        };
        let router = {
            let (stats, broker) = (Arc::clone(stats), Arc::clone(&broker));
            let node = cluster::node_name(&settings.cluster);
            let window = router::fanout_window(settings.workers());
            Supervisor::start_in_arbiter(arbiter, move |_| {
                Router::<S>::new(Arc::clone(&stats), Arc::clone(&broker))
                    .with_window(window)
                    .with_webhooks(webhooks.clone())
                    .with_node(&node)
            })
        };
        let bus = cluster.as_ref().map(|cluster| {
            let (cluster, router) = (Arc::clone(cluster), router.clone());
            Supervisor::start_in_arbiter(arbiter, move |_| {
                Bus::new(
                    cluster,
                    router.clone().recipient(),
                    router.clone().recipient(),
                    router.clone().recipient(),
                    router.clone().recipient(),
                    router.recipient(),
                )
            })
        });
        if let (Some(fleet), Some(bus)) = (&fleet, &bus) {
            fleet.attach(bus.clone().recipient());
        }
        let local = Local {
            publish_to: router.clone().recipient(),
            broadcast_to: router.clone().recipient(),
            count_of: router.clone().recipient(),
            stats: Arc::clone(stats),
            publish: settings.publish.clone(),
            shutdown,
        };
        Ok(Hub {
            router,
            broker,
            cluster,
            bus,
            local,
            namespaces: crate::namespace::Namespaces::new(settings),
        })
    }

    /// The supervised Router: streams log in and out here.
    pub(crate) fn router(&self) -> &Addr<Router<S>> {
        &self.router
    }

    /// Whether every stream waits for the Router's welcome before writing
    /// its own ([`Broker::streams_wait`]).
    pub(crate) fn streams_wait(&self) -> bool {
        self.broker.streams_wait()
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
            .send(Count {
                id: id.to_owned(),
                present: true,
            })
            .await
            .ok()
            .flatten()
            .ok_or(ApiError::Crashed("router"))?;
        let subjects = match self.namespaces.of(id).presence_events {
            false => None,
            true => Some(
                self.router
                    .send(Subjects { id: id.to_owned() })
                    .await
                    .ok()
                    .flatten()
                    .ok_or(ApiError::Crashed("router"))?,
            ),
        };
        self.broker.presence(id, here, subjects).await
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

    /// Publishes `msg` to `target` through the broker: this node's streams,
    /// the history, and in cluster mode the other nodes. With an
    /// `Idempotency-Key`, once per key (see [`crate::idempotency`]): a
    /// repeat within `publish.idempotency_ttl_ms` gets the first answer and
    /// delivers nothing.
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
        let out = broker::Outgoing {
            target: &target,
            msg,
            key,
        };
        self.broker.publish(out, &self.local).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use actix::Actor;

    use super::*;
    use broker::{Later, LaterFrom, Outgoing, Publishing, Read, Subscription};
    use history::CaughtUp;
    use router::testing::Taker;
    use router::{Login, Router, fits_backlog};

    /// A broker that records what the Hub asks of it and answers what a
    /// test set: the Hub adds nothing of its own between a route and the
    /// engine.
    #[derive(Default)]
    struct Recording {
        asked: Mutex<Vec<String>>,
    }

    impl Broker for Recording {
        fn streams_wait(&self) -> bool {
            false
        }
        fn subscribe(&self, _: &Arc<str>) -> Subscription {
            Subscription::Live
        }
        fn unsubscribe(&self, _: Arc<str>) {}
        fn confirm(&self, _: Arc<str>) -> Subscription {
            Subscription::Live
        }
        fn keep(&self, _: &str, _: &Arc<str>) -> Option<u64> {
            None
        }
        fn read(&self, _: &Arc<str>, _: Option<u64>) -> Read {
            Read::Now(history::FleetRead::default())
        }
        fn catch_up(&self, _: Vec<Arc<str>>, _: u64) -> Later<Option<CaughtUp>> {
            Box::pin(async { None })
        }
        fn presence_every(&self) -> Option<Duration> {
            None
        }
        fn notify(&self, _: &Arc<str>, _: &crate::hub::router::Note) {}
        fn stopping(&self) {}
        fn write_presence(&self, _: crate::hub::broker::Counts, _: bool) -> Later<Result<bool, ()>> {
            Box::pin(async { Ok(true) })
        }
        fn upkeep_every(&self) -> Option<Duration> {
            None
        }
        fn upkeep(&self) {}
        fn publish<'a>(&'a self, out: Outgoing<'a>, _: &'a Local) -> Publishing<'a> {
            let line = format!("publish {} {} key={:?}", out.target.name(), out.msg, out.key);
            self.asked.lock().unwrap().push(line);
            let id = out.target.id().map(str::to_owned);
            Box::pin(async move {
                Ok(Answer::Done(Receipt {
                    delivered: 7,
                    event_id: Some(42),
                    id,
                    nodes: Some(3),
                }))
            })
        }
        fn presence<'a>(
            &'a self,
            id: &'a str,
            here: usize,
            _: Option<Vec<Arc<str>>>,
        ) -> LaterFrom<'a, Result<cluster::Presence, ApiError>> {
            self.asked
                .lock()
                .unwrap()
                .push(format!("presence {id} here={here}"));
            Box::pin(async move { Ok(cluster::single_presence(id, here + 100)) })
        }
    }

    /// A Hub on `broker`, its Router holding one stream of `a`.
    async fn hub_on(broker: Arc<dyn Broker>) -> (Hub<Taker>, actix::Addr<Taker>) {
        let stats = Arc::new(Stats::new());
        let router = Router::<Taker>::new(Arc::clone(&stats), Arc::clone(&broker)).start();
        let stream = Taker::default().start();
        router
            .send(Login {
                id: Arc::from("a"),
                conn: crate::id::next_conn_id(),
                addr: stream.downgrade(),
            })
            .await
            .unwrap();
        let local = Local {
            publish_to: router.clone().recipient(),
            broadcast_to: router.clone().recipient(),
            count_of: router.clone().recipient(),
            stats,
            publish: Settings::defaults().publish,
            shutdown: CancellationToken::new(),
        };
        let hub = Hub {
            router,
            broker,
            cluster: None,
            bus: None,
            local,
            namespaces: crate::namespace::Namespaces::new(&Settings::defaults()),
        };
        (hub, stream)
    }

    #[actix_rt::test]
    async fn the_hub_hands_publishes_and_presence_to_its_broker_as_they_came() {
        let recording = Arc::new(Recording::default());
        let (hub, _stream) = hub_on(Arc::clone(&recording) as Arc<dyn Broker>).await;
        let msg: Arc<str> = Arc::from("hi");
        let answer = hub
            .publish(Target::Id("a".to_owned()), &msg, Some("k".to_owned()))
            .await;
        let Ok(Answer::Done(receipt)) = answer else {
            panic!("not the broker's answer: {answer:?}");
        };
        assert_eq!(
            (receipt.delivered, receipt.event_id, receipt.nodes),
            (7, Some(42), Some(3))
        );
        hub.publish(Target::All, &msg, None).await.unwrap();
        // Presence: this node's count from the Router, then the broker's.
        let p = hub.presence("a").await.unwrap();
        assert_eq!(p.streams, 101);
        assert_eq!(
            *recording.asked.lock().unwrap(),
            [
                "publish send:a hi key=Some(\"k\")",
                "publish broadcast hi key=None",
                "presence a here=1",
            ]
        );
        assert!(!hub.streams_wait());
        assert!(!hub.crash_bus().await, "no bus without a fleet");
    }

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
            subjects: None,
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"id":"a","nodes":[{"node":"n1","streams":2}],"streams":2}"#
        );
        // With `presence_events`: the subjects, here and on other nodes,
        // distinct and sorted, with their count.
        let p = p.with_subjects(
            Some(vec!["bob".into(), "alice".into()]),
            vec!["carol".into(), "bob".into()],
        );
        assert_eq!(
            serde_json::to_value(&p).unwrap()["subjects"],
            serde_json::json!({"list": ["alice", "bob", "carol"], "count": 3})
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
