//! The Bus actor: this node's pub/sub link to Redis.
//!
//! It owns one pub/sub connection, split in two: a writer task that sends
//! SUBSCRIBE/UNSUBSCRIBE/PING in order, and the message stream, added to the
//! actor's context. The Router tells it when an id gets its first local
//! stream ([`Interest::Held`]) and loses its last one
//! ([`Interest::Released`]); the Bus subscribes at once and unsubscribes
//! `cluster.unsubscribe_linger_ms` later unless the id came back meanwhile.
//! The writer takes every queued change each time it sends, so a burst of
//! 10,000 new ids is a handful of commands of up to [`MAX_BATCH`] channels.
//!
//! When the link fails (the stream ends, a command or PING fails or times
//! out), the Bus marks the node not ready, reconnects with jittered
//! exponential backoff and, once connected, subscribes again to the
//! broadcast channel and to every id the Router holds plus the lingering
//! ones, in batches. It is ready again `reconnect_max_ms` + 100 ms later,
//! when every other node that lost Redis too has had its next attempt:
//! before that a publish could miss their streams yet answer 200. It runs under a `Supervisor`: a panic in a handler
//! restarts it (see [`crate::supervision`]), which drops the link and makes
//! it again, resubscribing the same way.
//!
//! Bookkeeping per id: the lingering table holds only ids that left
//! recently; the held ids are the Router's table keys, asked for on
//! reconnect. redis-rs's pub/sub connection keeps its own set of subscribed
//! channel names (to count confirmations), the other per-id cost.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use actix::prelude::*;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Cluster, parse_payload};
use crate::router::{Broadcast, HeldIds, Interest, Publish, Subscribed};
use crate::supervision::guarded;

/// Most channels in one SUBSCRIBE or UNSUBSCRIBE.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long the writer gathers subscription changes after the first one
/// before it sends them: streams that open at 5,000 a second then share a
/// command 50 at a time (measured without the window: 13), and a stream can
/// get messages from other nodes at most this much later.
const GATHER: Duration = Duration::from_millis(10);

/// Added to `reconnect_max_ms` for [`Bus::settle`].
const SETTLE_MARGIN: Duration = Duration::from_millis(100);

/// How often lingering ids are checked for expiry, at most.
const SWEEP_MAX: Duration = Duration::from_millis(250);

/// One change to this node's subscriptions, in the order they must reach
/// Redis.
#[derive(Debug)]
enum Op {
    /// An id (the writer names its channel, and tells the Router once
    /// Redis confirmed it).
    Subscribe(Arc<str>),
    Unsubscribe(String),
    Ping,
}

/// A message from the pub/sub stream of link `generation`, or its end.
#[derive(Message)]
#[rtype(result = "()")]
enum Incoming {
    Msg(u64, redis::Msg),
    End(u64),
}

/// The link of `generation` failed (sent by its writer task).
#[derive(Message)]
#[rtype(result = "()")]
struct LinkLost(u64, String);

/// Fault injection: panic inside the handler.
#[derive(Message)]
#[rtype(result = "Option<()>")]
pub(crate) struct Crash;

/// An established link: where ops go, and the message stream's handle.
struct Link {
    ops: mpsc::UnboundedSender<Op>,
    stream: SpawnHandle,
}

/// See the module docs.
pub(crate) struct Bus {
    cluster: Arc<Cluster>,
    publish: Recipient<Publish>,
    broadcast: Recipient<Broadcast>,
    held: Recipient<HeldIds>,
    subscribed: Recipient<Subscribed>,
    /// Bumped for every link attempt: events of an older link are ignored.
    generation: u64,
    link: Option<Link>,
    /// Failed connection attempts since the last link.
    attempts: u32,
    /// Ids held or lingering.
    subscriptions: u64,
    /// Whether a link was ever up (the next one is a reconnect).
    was_up: bool,
}

impl Bus {
    /// A Bus for `cluster`, delivering to (and asking) the Router.
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        publish: Recipient<Publish>,
        broadcast: Recipient<Broadcast>,
        held: Recipient<HeldIds>,
        subscribed: Recipient<Subscribed>,
    ) -> Self {
        Bus {
            cluster,
            publish,
            broadcast,
            held,
            subscribed,
            generation: 0,
            link: None,
            attempts: 0,
            subscriptions: 0,
            was_up: false,
        }
    }

    /// How long after a reconnect the node waits before it is ready: the
    /// longest backoff of another node, and a connect's round trip.
    fn settle(&self) -> Duration {
        Duration::from_millis(self.cluster.settings.reconnect_max_ms) + SETTLE_MARGIN
    }

    fn linger(&self) -> Duration {
        Duration::from_millis(self.cluster.settings.unsubscribe_linger_ms)
    }

    /// Queues `op` on the link; without one, the next link's resubscription
    /// covers it.
    fn send(&self, op: Op) {
        match (&self.link, op) {
            (Some(link), op) => {
                let _ = link.ops.send(op);
            }
            // No link: streams waiting for this id need not wait for one.
            (None, Op::Subscribe(id)) => self.subscribed.do_send(Subscribed::Ids(vec![id])),
            (None, _) => {}
        }
    }

    fn set_subscriptions(&mut self, n: u64) {
        self.subscriptions = n;
        self.cluster.stats.subscriptions.store(n, Relaxed);
    }

    /// Drops the link (if it is the current one) and schedules a reconnect.
    fn lost(&mut self, generation: u64, why: &str, ctx: &mut Context<Self>) {
        if generation != self.generation {
            return;
        }
        if let Some(link) = self.link.take() {
            ctx.cancel_future(link.stream);
            // SUBSCRIBEs in flight are lost with the link.
            self.subscribed.do_send(Subscribed::All);
            tracing::warn!(
                cause = why,
                "cluster bus lost its Redis link; local delivery goes on, publishing answers 503"
            );
        }
        self.cluster.stats.connected.store(false, Relaxed);
        self.cluster.stats.errors.fetch_add(1, Relaxed);
        self.generation += 1;
        self.schedule_connect(ctx);
    }

    /// Connects after the backoff for `attempts` failures: reconnect_min_ms
    /// doubling up to reconnect_max_ms, less a random part of up to half.
    fn schedule_connect(&mut self, ctx: &mut Context<Self>) {
        let s = &self.cluster.settings;
        let exp = s.reconnect_min_ms.saturating_mul(1 << self.attempts.min(20));
        let full = exp.min(s.reconnect_max_ms);
        let jitter = RandomState::new().hash_one(self.generation) % (full / 2 + 1);
        let delay = Duration::from_millis(full - jitter);
        self.attempts = self.attempts.saturating_add(1);
        ctx.run_later(delay, |bus, ctx| bus.connect(ctx));
    }

    /// Opens a pub/sub connection and subscribes to the broadcast channel;
    /// then [`Bus::up`].
    fn connect(&mut self, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let client = self.cluster.client.clone();
        let broadcast = self.cluster.names.broadcast().to_owned();
        let timeout = self.cluster.link_timeout();
        let open = async move {
            let pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .map_err(|_| "connect timed out".to_owned())?
                .map_err(|e| e.to_string())?;
            let (mut sink, stream) = pubsub.split();
            tokio::time::timeout(timeout, sink.subscribe(&broadcast))
                .await
                .map_err(|_| "SUBSCRIBE timed out".to_owned())?
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((sink, stream))
        };
        ctx.spawn(open.into_actor(self).map(move |opened, bus, ctx| {
            if generation != bus.generation {
                return;
            }
            match opened {
                Ok((sink, stream)) => bus.up(sink, stream, ctx),
                Err(cause) => {
                    bus.cluster.stats.errors.fetch_add(1, Relaxed);
                    if bus.attempts == 0 || bus.attempts.is_power_of_two() {
                        tracing::warn!(
                            cause,
                            attempts = bus.attempts + 1,
                            "cluster bus cannot reach Redis; retrying"
                        );
                    }
                    bus.schedule_connect(ctx);
                }
            }
        }));
    }

    /// The link is made: start its writer and stream, mark the node ready,
    /// and subscribe to every id held here or lingering.
    fn up(&mut self, sink: PubSubSink, stream: redis::aio::PubSubStream, ctx: &mut Context<Self>) {
        let generation = self.generation;
        let (ops, rx) = mpsc::unbounded_channel();
        actix_rt::spawn(writer(
            sink,
            rx,
            Arc::clone(&self.cluster),
            ctx.address(),
            self.subscribed.clone(),
            generation,
        ));
        let incoming = stream
            .map(move |m| Incoming::Msg(generation, m))
            .chain(futures_util::stream::once(
                async move { Incoming::End(generation) },
            ));
        let stream = ctx.add_stream(incoming);
        self.link = Some(Link { ops, stream });
        let after_failures = std::mem::take(&mut self.attempts) > 0;
        let reconnect = std::mem::replace(&mut self.was_up, true);
        if reconnect {
            self.cluster.stats.reconnects.fetch_add(1, Relaxed);
        }
        // Ready once the Router's ids are queued: they reach Redis before
        // any SUBSCRIBE the Router asks for from here on.
        self.held
            .send(HeldIds)
            .into_actor(self)
            .map(move |held, bus, ctx| {
                if generation != bus.generation {
                    return;
                }
                let held = held.unwrap_or_default();
                let ids: Vec<Arc<str>> = {
                    let lingering = bus.cluster.lingering();
                    held.into_iter()
                        .filter(|id| !lingering.contains_key(id))
                        .chain(lingering.keys().cloned())
                        .collect()
                };
                for id in &ids {
                    bus.send(Op::Subscribe(Arc::clone(id)));
                }
                bus.set_subscriptions(ids.len() as u64);
                if !reconnect && !after_failures {
                    bus.cluster.stats.connected.store(true, Relaxed);
                    tracing::info!(ids = ids.len(), reconnect, "cluster bus connected and subscribed");
                    return;
                }
                bus.cluster
                    .stats
                    .resubscribed
                    .fetch_add(ids.len() as u64, Relaxed);
                // After an outage (or a start while Redis was down) the other
                // nodes come back within their own backoff, up to
                // reconnect_max_ms later than this one. Until then a PUBLISH
                // would miss their streams and still answer 200: keep
                // answering 503 (and /readyz 503) that long.
                let settle = bus.settle();
                tracing::info!(
                    ids = ids.len(),
                    reconnect,
                    settle_ms = settle.as_millis() as u64,
                    "cluster bus connected and subscribed again; ready once the other nodes can be back"
                );
                ctx.run_later(settle, move |bus, _| {
                    if generation == bus.generation && bus.link.is_some() {
                        bus.cluster.stats.connected.store(true, Relaxed);
                    }
                });
            })
            .wait(ctx);
    }

    /// Unsubscribes the lingering ids whose time is up.
    fn sweep(&mut self, _ctx: &mut Context<Self>) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut lingering = self.cluster.lingering();
            lingering.retain(|id, until| {
                let keep = *until > now;
                if !keep {
                    expired.push(Arc::clone(id));
                }
                keep
            });
            if !expired.is_empty()
                && lingering.capacity() > 1024
                && lingering.len() < lingering.capacity() / 4
            {
                lingering.shrink_to_fit();
            }
        }
        for id in &expired {
            self.send(Op::Unsubscribe(self.cluster.names.id_channel(id)));
        }
        if !expired.is_empty() {
            self.set_subscriptions(self.subscriptions.saturating_sub(expired.len() as u64));
        }
    }

    /// Heartbeat, and a PING through the link so a Redis that stops
    /// answering (without closing the connection) is noticed.
    fn beat(&mut self, ctx: &mut Context<Self>) {
        self.send(Op::Ping);
        let cluster = Arc::clone(&self.cluster);
        ctx.spawn(
            async move {
                if cluster.heartbeat().await.is_err() {
                    tracing::debug!("heartbeat not written");
                }
            }
            .into_actor(self),
        );
    }
}

/// Sends `ops` in order, every op queued so far in each round, consecutive
/// ones of a kind in one command. Any failure ends the link.
async fn writer(
    mut sink: PubSubSink,
    mut rx: mpsc::UnboundedReceiver<Op>,
    cluster: Arc<Cluster>,
    bus: Addr<Bus>,
    router: Recipient<Subscribed>,
    generation: u64,
) {
    // Many channels in one command take longer than one command.
    let timeout = cluster.link_timeout();
    let mut batch: Vec<Op> = Vec::new();
    while let Some(first) = rx.recv().await {
        if !matches!(first, Op::Ping) {
            tokio::time::sleep(GATHER).await;
        }
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut ops = batch.drain(..).peekable();
        while let Some(op) = ops.next() {
            let sent = match op {
                Op::Ping => tokio::time::timeout(timeout, sink.ping::<redis::Value>())
                    .await
                    .map(|r| r.map(drop)),
                Op::Subscribe(first) => {
                    let mut ids = vec![first];
                    while let Some(Op::Subscribe(_)) = ops.peek() {
                        if let Some(Op::Subscribe(id)) = ops.next() {
                            ids.push(id);
                        }
                    }
                    let channels: Vec<String> = ids.iter().map(|id| cluster.names.id_channel(id)).collect();
                    cluster.stats.subscribe_commands.fetch_add(1, Relaxed);
                    let sent = tokio::time::timeout(timeout, sink.subscribe(channels)).await;
                    if matches!(sent, Ok(Ok(()))) {
                        router.do_send(Subscribed::Ids(ids));
                    }
                    sent
                }
                Op::Unsubscribe(first) => {
                    let mut channels = vec![first];
                    while let Some(Op::Unsubscribe(_)) = ops.peek() {
                        if let Some(Op::Unsubscribe(c)) = ops.next() {
                            channels.push(c);
                        }
                    }
                    cluster.stats.subscribe_commands.fetch_add(1, Relaxed);
                    tokio::time::timeout(timeout, sink.unsubscribe(channels)).await
                }
            };
            let why = match sent {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "a command on the pub/sub link timed out".to_owned(),
            };
            bus.do_send(LinkLost(generation, why));
            return;
        }
    }
}

impl Actor for Bus {
    type Context = Context<Self>;

    /// Also runs again after a restart.
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.connect(ctx);
        let sweep = (self.linger() / 4).clamp(Duration::from_millis(10), SWEEP_MAX);
        ctx.run_interval(sweep, Bus::sweep);
        let beat = Duration::from_millis(self.cluster.settings.heartbeat_interval_ms);
        self.beat(ctx);
        ctx.run_interval(beat, Bus::beat);
    }
}

impl Supervised for Bus {
    /// After a panic: drop the link (its futures are gone with the old
    /// context); `started` makes a new one and resubscribes.
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.cluster.stats.restarts.fetch_add(1, Relaxed);
        self.cluster.stats.connected.store(false, Relaxed);
        self.link = None;
        self.generation += 1;
        self.attempts = 0;
        self.subscribed.do_send(Subscribed::All);
        tracing::warn!("cluster bus restarted; reconnecting and resubscribing");
    }
}

impl Handler<Interest> for Bus {
    type Result = ();

    fn handle(&mut self, m: Interest, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, _| match m {
            Interest::Held(id) => {
                let back = bus.cluster.lingering().remove(&id).is_some();
                if back {
                    // Back within the linger: still subscribed.
                    bus.subscribed.do_send(Subscribed::Ids(vec![id]));
                } else {
                    bus.send(Op::Subscribe(id));
                    bus.set_subscriptions(bus.subscriptions + 1);
                }
            }
            Interest::Released(id) => {
                let until = Instant::now() + bus.linger();
                bus.cluster.lingering().insert(id, until);
            }
        });
    }
}

impl StreamHandler<Incoming> for Bus {
    fn handle(&mut self, m: Incoming, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, ctx| match m {
            Incoming::End(generation) => bus.lost(generation, "the pub/sub connection closed", ctx),
            Incoming::Msg(generation, msg) if generation == bus.generation => bus.deliver(&msg),
            Incoming::Msg(..) => {}
        });
    }

    /// The stream ends with [`Incoming::End`]; nothing more to do here (the
    /// default would stop the actor).
    fn finished(&mut self, _ctx: &mut Context<Self>) {}
}

impl Bus {
    /// Hands a message from another node to the Router.
    fn deliver(&mut self, msg: &redis::Msg) {
        let stats = &self.cluster.stats;
        let Some((origin, text)) = parse_payload(msg.get_payload_bytes()) else {
            if stats.malformed.fetch_add(1, Relaxed) == 0 {
                tracing::warn!(
                    channel = msg.get_channel_name(),
                    "a bus message is not \"<instance> <one line>\"; dropped (counted in /stats cluster.malformed)"
                );
            }
            return;
        };
        if origin == self.cluster.instance {
            stats.echoes.fetch_add(1, Relaxed);
            return;
        }
        let channel = msg.get_channel_name();
        let text: Arc<str> = Arc::from(text);
        if channel == self.cluster.names.broadcast() {
            self.broadcast.do_send(Broadcast { msg: text });
        } else if let Some(id) = self.cluster.names.id_of(channel) {
            self.publish.do_send(Publish {
                id: id.to_owned(),
                msg: text,
            });
        } else {
            stats.malformed.fetch_add(1, Relaxed);
            return;
        }
        stats.received.fetch_add(1, Relaxed);
    }
}

impl Handler<LinkLost> for Bus {
    type Result = ();

    fn handle(&mut self, LinkLost(generation, why): LinkLost, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, ctx| bus.lost(generation, &why, ctx));
    }
}

impl Handler<Crash> for Bus {
    type Result = Option<()>;

    fn handle(&mut self, _: Crash, ctx: &mut Context<Self>) -> Option<()> {
        guarded(self, ctx, |_, _| panic!("fault injection: bus crash requested"))
    }
}
