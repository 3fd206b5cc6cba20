//! The Bus actor: this node's pub/sub link to Redis.
//!
//! It owns one pub/sub connection ([`super::link`]), driven by a link task
//! that sends SUBSCRIBE/UNSUBSCRIBE in order, one command in flight at a
//! time (PINGs go at once), matches each confirmation to its command, and
//! hands every message to the actor. The Router tells it when an id gets its first local
//! stream ([`Interest::Held`]) and loses its last one
//! ([`Interest::Released`]); the Bus subscribes at once and unsubscribes
//! `cluster.unsubscribe_linger_ms` later unless the id came back meanwhile.
//! Each command takes every change queued meanwhile (up to [`MAX_BATCH`]
//! channels of one kind), so a burst of 10,000 new ids is a handful of
//! commands.
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
//! Bookkeeping per id: the lingering table (in [`Cluster`], shared with
//! the Hub, which asks it whether a publish's echo comes here; only the
//! Bus writes it, through [`Cluster::linger`] and its kin) holds only ids
//! that left recently; the held ids are the Router's table keys, asked for
//! on reconnect; a SUBSCRIBE's ids are kept only until Redis confirms it. No
//! set of subscribed channel names is kept anywhere (see [`super::link`] for
//! why the link is not redis-rs's pub/sub connection, which keeps one).

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::cluster::{AwaitedEcho, Cluster, MAX_AHEAD, Names, Payload, parse_note, parse_payload};
use super::link::{Conn, FRAMING_BYTES, Received, Reply};
use super::occupancy::Wrote;
use super::sharded::{Topology, slot_of};
use crate::hub::router::{Broadcast, HeldIds, Note, NoteFor, Part, Publish, Subscribed};
use crate::supervision::{Crash, guarded};

/// Most channels in one SUBSCRIBE or UNSUBSCRIBE.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long the writer gathers subscription changes after the first one
/// before it sends them, so streams that open together share a command
/// (docs/design-notes.md); a stream can get messages from other nodes at
/// most this much later.
const GATHER: Duration = Duration::from_millis(10);

/// Added to `reconnect_max_ms` for [`Bus::settle`].
const SETTLE_MARGIN: Duration = Duration::from_millis(100);

/// How often lingering ids are checked for expiry, at most.
const SWEEP_MAX: Duration = Duration::from_millis(250);

/// A link's queue of subscription changes keeps at most this capacity
/// once it is empty.
const SHRINK_ABOVE: usize = 1024;

/// Most occupancy writes (each of up to 1,000 ids) one step makes.
const OCCUPANCY_STEPS: usize = 10;

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

/// A message that came over a link.
#[derive(Message)]
#[rtype(result = "()")]
struct Incoming {
    /// The link it came over (one replaced since is ignored).
    generation: u64,
    /// Which shard's link (0 on one Redis), and which connection of it.
    shard: (usize, u64),
    /// Its channel.
    channel: Bytes,
    /// `"<origin> <event id or -> <text>"`.
    payload: Bytes,
}

/// Redis confirmed a SUBSCRIBE of these ids (sent by a link task).
#[derive(Message)]
#[rtype(result = "()")]
struct Confirmed {
    /// Which link.
    generation: u64,
    /// Which shard's connection of it.
    shard: (usize, u64),
    /// The ids.
    ids: Vec<Arc<str>>,
}

impl Handler<Confirmed> for Bus {
    type Result = ();

    fn handle(&mut self, m: Confirmed, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, _| {
            if bus.current(m.generation, m.shard, true) {
                bus.subscribed.do_send(Subscribed::Ids(m.ids));
            }
        });
    }
}

/// A link failed (sent by its link task).
#[derive(Message)]
#[rtype(result = "()")]
struct LinkLost {
    /// Which link.
    generation: u64,
    /// Which shard's connection of it.
    shard: (usize, u64),
    /// Why, for the log.
    why: String,
}

/// An established link: where ops go. Dropping it ends the link tasks.
///
/// On one Redis it is one connection. On a Redis Cluster it is one
/// connection per shard master, each carrying the sharded channels
/// (SSUBSCRIBE) of the slots that master serves; they fail and are made
/// again together, so the Router sees one link as on one Redis.
struct Link {
    /// Each shard's connection.
    shards: Vec<ShardLink>,
    /// On a Redis Cluster: which master served each slot when the links
    /// were made (a failover changes masters, and the shards' connections
    /// are remade one by one; slots that move make them all again).
    topology: Option<Arc<Topology>>,
}

/// One shard's connection (the only one on one Redis).
struct ShardLink {
    /// Where its ops go; `None` while it is made again.
    ops: Option<mpsc::UnboundedSender<Op>>,
    /// Bumped for every connection: events of an older one are ignored.
    generation: u64,
    /// The highest event id it carried: on a Redis Cluster, where its
    /// shard's ids catch up from if it goes.
    seen: u64,
    /// Failed attempts to make it again since it went.
    attempts: u32,
}

impl ShardLink {
    fn up(ops: mpsc::UnboundedSender<Op>, since: u64) -> Self {
        ShardLink {
            ops: Some(ops),
            generation: 0,
            seen: since,
            attempts: 0,
        }
    }
}

impl Link {
    /// The shard an op goes to: its channel's.
    fn shard_of(&self, op: &Op) -> usize {
        match (&self.topology, op) {
            (Some(_), Op::Subscribe(id)) => self.shard_of_id(id),
            (Some(topology), Op::Unsubscribe(channel)) => topology.shard_of_key(channel.as_bytes()),
            _ => 0,
        }
    }

    /// The shard that carries `id`'s channel.
    fn shard_of_id(&self, id: &str) -> usize {
        self.topology
            .as_ref()
            .map_or(0, |topology| topology.shard_of(Names::slot_of_id(id)))
    }
}

/// See the module docs.
pub(crate) struct Bus {
    cluster: Arc<Cluster>,
    publish: Recipient<Publish>,
    broadcast: Recipient<Broadcast>,
    held: Recipient<HeldIds>,
    subscribed: Recipient<Subscribed>,
    /// Other nodes' `join` and `leave`, for this node's streams.
    notes: Recipient<NoteFor>,
    /// Bumped for every link attempt: events of an older link are ignored.
    generation: u64,
    link: Option<Link>,
    /// Failed connection attempts since the last link.
    attempts: u32,
    /// Ids held or lingering.
    subscriptions: u64,
    /// Whether a link was ever up (the next one is a reconnect).
    was_up: bool,
    /// A connect is in flight (between [`Bus::connect`] and its result).
    connecting: bool,
}

impl Bus {
    /// A Bus for `cluster`, delivering to (and asking) the Router.
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        publish: Recipient<Publish>,
        broadcast: Recipient<Broadcast>,
        held: Recipient<HeldIds>,
        subscribed: Recipient<Subscribed>,
        notes: Recipient<NoteFor>,
    ) -> Self {
        Bus {
            cluster,
            publish,
            broadcast,
            held,
            subscribed,
            notes,
            generation: 0,
            link: None,
            attempts: 0,
            subscriptions: 0,
            was_up: false,
            connecting: false,
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

    /// Whether an event of link `generation`, shard connection `(index,
    /// connection)` is of the current one (`up`: and it was not dropped).
    fn current(&self, generation: u64, (index, connection): (usize, u64), up: bool) -> bool {
        generation == self.generation
            && self
                .link
                .as_ref()
                .and_then(|l| l.shards.get(index))
                .is_some_and(|s| s.generation == connection && (s.ops.is_some() || !up))
    }

    /// Whether the connection that carries `id` is up.
    fn linked(&self, id: &Arc<str>) -> bool {
        self.link.as_ref().is_some_and(|link| {
            let shard = link.shard_of_id(id);
            link.shards.get(shard).is_some_and(|s| s.ops.is_some())
        })
    }

    /// Queues `op` on the link; without one, the next link's resubscription
    /// covers it.
    fn send(&self, op: Op) {
        match (&self.link, op) {
            (Some(link), Op::Ping) => {
                for ops in link.shards.iter().filter_map(|s| s.ops.as_ref()) {
                    let _ = ops.send(Op::Ping);
                }
            }
            (Some(link), op) => {
                let shard = link.shard_of(&op);
                match (link.shards.get(shard).and_then(|s| s.ops.as_ref()), op) {
                    (Some(ops), op) => {
                        let _ = ops.send(op);
                    }
                    // That shard's connection is being made again: it
                    // subscribes the id then.
                    (None, Op::Subscribe(id)) => self.subscribed.do_send(Subscribed::NoLink(vec![id])),
                    (None, _) => {}
                }
            }
            // No link: plain streams waiting for this id need not wait
            // for one (the next link subscribes it).
            (None, Op::Subscribe(id)) => self.subscribed.do_send(Subscribed::NoLink(vec![id])),
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
            match &link.topology {
                // Each shard's ids catch up from where its own link had them.
                Some(topology) => {
                    self.cluster.shards_up(None);
                    for (k, shard) in link.shards.iter().enumerate() {
                        let part = self.part(topology, k);
                        self.subscribed.do_send(Subscribed::PartDown(part, shard.seen));
                    }
                }
                // SUBSCRIBEs in flight are lost with the link.
                None => self.subscribed.do_send(Subscribed::LinkDown),
            }
            tracing::warn!(
                event = "bus_down",
                cause = why,
                "cluster bus lost its Redis link; local delivery goes on, publishing answers 503"
            );
        }
        self.cluster.stats.connected.store(false, Relaxed);
        self.cluster.stats.errors.fetch_add(1, Relaxed);
        self.generation += 1;
        self.schedule_connect(ctx);
    }

    /// On a Redis Cluster: one shard's connection failed. Only that
    /// shard's ids are affected: the Router catches them up once it is
    /// made again (from where it had their messages), publishes to them
    /// answer 503 meanwhile, and the other shards' ids flow on.
    fn shard_lost(&mut self, (k, connection): (usize, u64), why: &str, ctx: &mut Context<Self>) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let Some(topology) = link.topology.clone() else {
            return;
        };
        let Some(shard) = link.shards.get_mut(k) else {
            return;
        };
        if shard.generation != connection || shard.ops.take().is_none() {
            return;
        }
        let seen = shard.seen;
        self.cluster.set_shard_up(k, false, None);
        if !self.cluster.any_shard_up() {
            self.cluster.stats.connected.store(false, Relaxed);
        }
        self.cluster.stats.errors.fetch_add(1, Relaxed);
        let part = self.part(&topology, k);
        self.subscribed.do_send(Subscribed::PartDown(part, seen));
        tracing::warn!(
            event = "bus_shard_down",
            shard = k,
            master = %topology.shards[k].master,
            cause = why,
            "cluster bus lost its link to one shard's master; that shard's ids answer 503 until it is made \
             again, the others flow on"
        );
        self.schedule_shard_connect(k, ctx);
    }

    /// Which ids a broadcast that came over shard `k`'s link is for: that
    /// shard's (each shard sends its own copy, in its order among its ids'
    /// messages: [`Cluster::broadcast_sharded`]); every id on one Redis.
    fn broadcast_part(&self, k: usize) -> Option<Part> {
        if !self.cluster.names.sharded() {
            return None;
        }
        // A sharded link always has its topology; without one, no id
        // (every copy to every id would hand each stream the broadcast once
        // per shard).
        Some(match self.link.as_ref().and_then(|l| l.topology.as_ref()) {
            Some(topology) => self.part(topology, k),
            None => Part(Arc::new(|_: &str| false)),
        })
    }

    /// The ids shard `k` of `topology` carries, for the Router.
    fn part(&self, topology: &Arc<Topology>, k: usize) -> Part {
        let of = Arc::clone(topology);
        Part(Arc::new(move |id: &str| of.shard_of(Names::slot_of_id(id)) == k))
    }

    /// Makes shard `k`'s connection again after its backoff.
    fn schedule_shard_connect(&mut self, k: usize, ctx: &mut Context<Self>) {
        let Some(shard) = self.link.as_mut().and_then(|l| l.shards.get_mut(k)) else {
            return;
        };
        let s = &self.cluster.settings;
        let exp = s.reconnect_min_ms.saturating_mul(1 << shard.attempts.min(20));
        let full = exp.min(s.reconnect_max_ms);
        let jitter = RandomState::new().hash_one((self.generation, k, shard.attempts)) % (full / 2 + 1);
        shard.attempts = shard.attempts.saturating_add(1);
        let generation = self.generation;
        ctx.run_later(Duration::from_millis(full - jitter), move |bus, ctx| {
            if generation == bus.generation {
                bus.connect_shard(k, ctx);
            }
        });
    }

    /// Reads the topology again and, if every slot is still in the same
    /// shard, links to shard `k`'s master (a new one after a failover).
    /// If slots moved, every shard's link is made again.
    fn connect_shard(&mut self, k: usize, ctx: &mut Context<Self>) {
        let Some(before) = self.link.as_ref().and_then(|l| l.topology.clone()) else {
            return;
        };
        let generation = self.generation;
        let cluster = Arc::clone(&self.cluster);
        let timeout = self.cluster.link_timeout();
        let open = async move {
            let opened = async {
                let topology = cluster.read_topology().await.map_err(Some)?;
                if !topology.same_slots(&before) {
                    return Err(None::<String>);
                }
                let master = &topology.shards[k].master;
                let client = cluster.shard_client(master).map_err(Some)?;
                let mut conn = Conn::open(&client, cluster.tls())
                    .await
                    .map_err(|e| Some(format!("the link to shard master {master}: {e}")))?;
                let since = shard_time(&mut conn).await.map_err(Some)?;
                load_scripts(&mut conn, cluster.shard_scripts())
                    .await
                    .map_err(Some)?;
                conn.limit(cluster.max_message_bytes + FRAMING_BYTES);
                if let Some(broadcast) = cluster.names.shard_broadcast(&topology, k) {
                    ssubscribe_broadcast(&mut conn, &broadcast).await.map_err(Some)?;
                }
                Ok((conn, since, topology))
            };
            tokio::time::timeout(timeout, opened)
                .await
                .map_err(|_| Some("connect and SSUBSCRIBE timed out".to_owned()))?
        };
        ctx.spawn(open.into_actor(self).map(move |opened, bus, ctx| {
            if generation != bus.generation {
                return;
            }
            match opened {
                Ok((conn, since, topology)) => bus.shard_established(k, (conn, since), topology, ctx),
                Err(None) => bus.lost(
                    generation,
                    "the cluster's slots moved: every shard's link is made again",
                    ctx,
                ),
                Err(Some(cause)) => {
                    bus.cluster.stats.errors.fetch_add(1, Relaxed);
                    let attempts = bus
                        .link
                        .as_ref()
                        .and_then(|l| l.shards.get(k))
                        .map_or(0, |s| s.attempts);
                    if attempts.is_power_of_two() {
                        tracing::warn!(
                            event = "bus_shard_down",
                            shard = k,
                            cause,
                            attempts,
                            "cluster bus cannot link to one shard's master yet; retrying"
                        );
                    }
                    bus.schedule_shard_connect(k, ctx);
                }
            }
        }));
    }

    /// Shard `k`'s connection is made again: subscribe there every id of
    /// it held here or lingering, and mark it up once the other nodes can
    /// be back too ([`Bus::settle`]).
    fn shard_established(
        &mut self,
        k: usize,
        (conn, since): (Conn, u64),
        topology: Arc<Topology>,
        ctx: &mut Context<Self>,
    ) {
        let generation = self.generation;
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let Some(shard) = link.shards.get_mut(k) else {
            return;
        };
        if shard.ops.is_some() {
            return;
        }
        shard.generation += 1;
        shard.attempts = 0;
        // Not below what the lost connection carried: a catch-up of it may
        // still be under way, and reads from the lower of the two.
        shard.seen = shard.seen.max(since);
        let connection = shard.generation;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_link(
            conn,
            rx,
            Arc::clone(&self.cluster),
            ctx.address(),
            (generation, (k, connection)),
        ));
        shard.ops = Some(tx);
        link.topology = Some(Arc::clone(&topology));
        self.cluster.set_shard_up(k, false, Some(Arc::clone(&topology)));
        self.cluster.stats.reconnects.fetch_add(1, Relaxed);
        self.held
            .send(HeldIds)
            .into_actor(self)
            .map(move |held, bus, ctx| {
                if !bus.current(generation, (k, connection), true) {
                    return;
                }
                let ids: Vec<Arc<str>> = bus
                    .cluster
                    .to_subscribe(held.unwrap_or_default())
                    .into_iter()
                    .filter(|id| topology.shard_of(Names::slot_of_id(id)) == k)
                    .collect();
                for id in &ids {
                    bus.send(Op::Subscribe(Arc::clone(id)));
                }
                bus.cluster
                    .stats
                    .resubscribed
                    .fetch_add(ids.len() as u64, Relaxed);
                let settle = bus.settle();
                tracing::info!(
                    event = "bus_shard_up",
                    shard = k,
                    master = %topology.shards[k].master,
                    ids = ids.len(),
                    settle_ms = settle.as_millis() as u64,
                    "cluster bus linked to the shard's master again and subscribed its ids; its publishes \
                     resume once the other nodes can be back"
                );
                ctx.run_later(settle, move |bus, _| {
                    if bus.current(generation, (k, connection), true) {
                        bus.cluster.set_shard_up(k, true, None);
                        bus.cluster.stats.connected.store(true, Relaxed);
                    }
                });
            })
            .wait(ctx);
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
    /// then [`Bus::link_established`].
    fn connect(&mut self, ctx: &mut Context<Self>) {
        self.generation += 1;
        self.connecting = true;
        let generation = self.generation;
        let cluster = Arc::clone(&self.cluster);
        let broadcast = self.cluster.names.broadcast().to_owned();
        let timeout = self.cluster.link_timeout();
        let open = async move {
            let opened = async {
                if cluster.names.sharded() {
                    return open_shards(&cluster).await;
                }
                let subscribe = redis::cmd("SUBSCRIBE").arg(&broadcast).get_packed_command();
                // With sentinels: the master they name now, confirmed
                // with ROLE on the link itself (a master demoted while
                // this node was connecting is a replica by now).
                cluster.find_master().await?;
                let mut conn = Conn::open(&cluster.client(), cluster.tls()).await?;
                if cluster.sentinels() {
                    confirm_master(&mut conn).await?;
                }
                conn.limit(cluster.max_message_bytes + FRAMING_BYTES);
                // Before anything is read or delivered through this link:
                // a Redis that lost entries this node saw starts a new
                // epoch, so resumes and catch-ups are told of a gap.
                cluster.fence().await?;
                conn.write(&subscribe).await.map_err(|e| e.to_string())?;
                match Received::of(conn.next().await?)? {
                    Received::Subscribed => Ok((vec![(conn, 0)], None)),
                    other => Err(format!("unexpected answer to SUBSCRIBE: {other:?}")),
                }
            };
            tokio::time::timeout(timeout, opened)
                .await
                .map_err(|_| "connect and SUBSCRIBE timed out".to_owned())?
        };
        ctx.spawn(open.into_actor(self).map(move |opened, bus, ctx| {
            if generation != bus.generation {
                return;
            }
            bus.connecting = false;
            match opened {
                Ok((conns, topology)) => bus.link_established(conns, topology, ctx),
                Err(cause) => {
                    bus.cluster.stats.errors.fetch_add(1, Relaxed);
                    if bus.attempts == 0 || bus.attempts.is_power_of_two() {
                        tracing::warn!(
                            event = "bus_down",
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

    /// The link is made: start its task, mark the node ready, and subscribe
    /// to every id held here or lingering.
    fn link_established(
        &mut self,
        conns: Vec<(Conn, u64)>,
        topology: Option<Arc<Topology>>,
        ctx: &mut Context<Self>,
    ) {
        let generation = self.generation;
        let mut shards = Vec::with_capacity(conns.len());
        for (shard, (conn, since)) in conns.into_iter().enumerate() {
            let (tx, rx) = mpsc::unbounded_channel();
            // A task of the runtime, not of this arbiter's local set: the
            // runtime polls it beside the whole local set, so thousands of
            // stream tasks woken at once (a broadcast, a burst of connects)
            // do not queue in front of Redis's confirmations and PINGs.
            tokio::spawn(run_link(
                conn,
                rx,
                Arc::clone(&self.cluster),
                ctx.address(),
                (generation, (shard, 0)),
            ));
            shards.push(ShardLink::up(tx, since));
        }
        let sharded = topology.is_some();
        if let Some(topology) = &topology {
            self.cluster
                .shards_up(Some((Arc::clone(topology), vec![true; shards.len()])));
        }
        self.link = Some(Link { shards, topology });
        // The fleet's clock, for where this node would say it lost the
        // link (a Redis Cluster has none: each shard's link catches up from
        // where it was, see `Cluster::links_lost`).
        let (cluster, subscribed) = (Arc::clone(&self.cluster), self.subscribed.clone());
        if !sharded {
            actix_rt::spawn(async move {
                if let Ok(clock) = cluster.fleet_clock().await {
                    subscribed.do_send(Subscribed::Clock(clock));
                }
            });
        }
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
                let ids = bus.cluster.to_subscribe(held);
                for id in &ids {
                    bus.send(Op::Subscribe(Arc::clone(id)));
                }
                bus.set_subscriptions(ids.len() as u64);
                if !reconnect && !after_failures {
                    bus.cluster.stats.connected.store(true, Relaxed);
                    tracing::info!(
                        event = "bus_up",
                        ids = ids.len(),
                        reconnect,
                        "cluster bus connected and subscribed"
                    );
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
                    event = "bus_up",
                    ids = ids.len(),
                    reconnect,
                    settle_ms = settle.as_millis() as u64,
                    "cluster bus connected and subscribed again; ready once the other nodes can be back"
                );
                ctx.run_later(settle, move |bus, _| {
                    // On a Redis Cluster, with at least one shard's link up.
                    let up = bus
                        .link
                        .as_ref()
                        .is_some_and(|l| l.topology.is_none() || l.shards.iter().any(|s| s.ops.is_some()));
                    if generation == bus.generation && up {
                        bus.cluster.stats.connected.store(true, Relaxed);
                    }
                });
            })
            .wait(ctx);
    }

    /// Unsubscribes the lingering ids whose time is up (this node holds
    /// them no more: their occupancy changes are written).
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let expired = self.cluster.expired_lingers(Instant::now());
        for id in &expired {
            self.send(Op::Unsubscribe(self.cluster.names.id_channel(id)));
        }
        if !expired.is_empty() {
            self.set_subscriptions(self.subscriptions.saturating_sub(expired.len() as u64));
        }
        if let Some(occupancy) = &self.cluster.occupancy {
            for id in &expired {
                occupancy.change(id, false);
            }
            if occupancy.has_changes() {
                self.write_occupancy(false, ctx);
            }
        }
    }

    /// Writes this node's occupancy changes (or only renews its place),
    /// and with `reap` takes expired nodes' ids out. If its own place was
    /// lost, every id held here is written again.
    fn write_occupancy(&mut self, reap: bool, ctx: &mut Context<Self>) {
        if self.cluster.occupancy.is_none() {
            return;
        }
        let (cluster, held) = (Arc::clone(&self.cluster), self.held.clone());
        ctx.spawn(
            async move {
                let Some(occupancy) = &cluster.occupancy else {
                    return;
                };
                // A few batches at a time; the rest at the next step.
                for _ in 0..OCCUPANCY_STEPS {
                    match cluster.write_occupancy().await {
                        Some(Ok(Wrote::Lost)) => {
                            let Ok(ids) = held.send(HeldIds).await else {
                                break;
                            };
                            let all = cluster.to_subscribe(ids);
                            tracing::warn!(
                                event = "occupancy_rewritten",
                                ids = all.len(),
                                "this node's place in the fleet's occupancy had expired (Redis was out of \
                                 reach, or lost it): its ids are written again"
                            );
                            occupancy.hold_all(all);
                        }
                        Some(Ok(Wrote::Done)) if occupancy.has_changes() => {}
                        _ => break,
                    }
                }
                if reap && let Err(e) = cluster.reap_occupancy().await {
                    tracing::debug!(cause = %e, "occupancy not reaped");
                }
            }
            .into_actor(self),
        );
    }

    /// Heartbeat, and a PING through the link so a Redis that stops
    /// answering (without closing the connection) is noticed.
    fn beat(&mut self, ctx: &mut Context<Self>) {
        if self.cluster.take_stale_master() && self.link.is_some() {
            // A command was refused with READONLY: the master this node
            // speaks to is a replica now, and so is its link's Redis.
            self.lost(
                self.generation,
                "Redis answered READONLY: the master became a replica",
                ctx,
            );
            return;
        }
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
        self.write_occupancy(true, ctx);
    }
}

/// A command sent on the link whose confirmations are still due.
struct Unconfirmed {
    command: LinkCommand,
    /// Confirmations still to come (one per channel).
    remaining: usize,
    /// A SUBSCRIBE's ids, for the Router once it is confirmed.
    ids: Vec<Arc<str>>,
    /// When it was written; the link fails if it is not confirmed within
    /// [`Cluster::link_timeout`] of this or of the last byte read.
    sent: Instant,
}

/// What a command on the link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkCommand {
    Subscribe,
    Unsubscribe,
    Ping,
}

/// Drives one link until it fails, then tells the Bus why.
async fn run_link(
    mut conn: Conn,
    mut rx: mpsc::UnboundedReceiver<Op>,
    cluster: Arc<Cluster>,
    bus: Addr<Bus>,
    (generation, shard): (u64, (usize, u64)),
) {
    let why = relay_until_lost(&mut conn, &mut rx, &cluster, &bus, (generation, shard)).await;
    bus.do_send(LinkLost {
        generation,
        shard,
        why,
    });
}

/// Sends ops in order and hands messages to the Bus; returns why the link
/// ended. Subscription changes go one command at a time: the changes
/// queued within [`GATHER`] of the first, then, while a command waits for
/// its confirmations, everything queued meanwhile goes in the next (up to
/// [`MAX_BATCH`] channels of one kind). So the slower Redis answers, the
/// larger and fewer the commands (why not pipelined: docs/design-notes.md,
/// "The cluster bus under load"). PINGs go at once.
async fn relay_until_lost(
    conn: &mut Conn,
    rx: &mut mpsc::UnboundedReceiver<Op>,
    cluster: &Cluster,
    bus: &Addr<Bus>,
    (generation, shard): (u64, (usize, u64)),
) -> String {
    let timeout = cluster.link_timeout();
    // On a Redis Cluster an SSUBSCRIBE takes the channels of one slot, so
    // a burst of new ids is many small commands: several go at once (their
    // confirmations come in order). On one Redis, one at a time.
    let max_in_flight = if cluster.names.sharded() { 64 } else { 1 };
    let slack = Duration::from_millis(cluster.settings.heartbeat_interval_ms).min(timeout / 2);
    let mut queued: VecDeque<Op> = VecDeque::new();
    let mut gather_until: Option<Instant> = None;
    let mut unconfirmed: VecDeque<Unconfirmed> = VecDeque::new();
    let mut last_read = Instant::now();
    let mut ping = false;
    loop {
        loop {
            let reply = match conn.parsed() {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(e) => return format!("unreadable reply from Redis: {e}"),
            };
            let event = match Received::of(reply) {
                Ok(event) => event,
                Err(e) => return e,
            };
            let kind = match event {
                Received::Message { channel, payload } => {
                    bus.do_send(Incoming {
                        generation,
                        shard,
                        channel,
                        payload,
                    });
                    continue;
                }
                Received::Oversized { channel, bytes } => {
                    cluster.stats.malformed.fetch_add(1, Relaxed);
                    tracing::warn!(
                        event = "bus_malformed",
                        channel = %String::from_utf8_lossy(&channel),
                        bytes,
                        "a bus message longer than message.max_bytes and its framing; dropped as it \
                         arrived, never buffered (counted in /stats cluster.malformed)"
                    );
                    continue;
                }
                Received::Subscribed => LinkCommand::Subscribe,
                Received::Unsubscribed => LinkCommand::Unsubscribe,
                Received::Pong => LinkCommand::Ping,
            };
            let Some(front) = unconfirmed.front_mut().filter(|p| p.command == kind) else {
                return format!("a {kind:?} confirmation Redis sent matches no command");
            };
            front.remaining -= 1;
            if front.remaining == 0
                && let Some(done) = unconfirmed.pop_front()
                && !done.ids.is_empty()
            {
                // Through the Bus, which drops it if this connection was
                // replaced meanwhile (its ids are then subscribed again on
                // the new one, and confirmed there).
                bus.do_send(Confirmed {
                    generation,
                    shard,
                    ids: done.ids,
                });
            }
        }
        // Ops that came meanwhile: the biased select below reads the
        // socket first, and a backlog there must not hold them up.
        loop {
            match rx.try_recv() {
                Ok(op) => take(op, &mut queued, &mut gather_until, &mut ping),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return "the link was replaced".to_owned(),
            }
        }
        if std::mem::take(&mut ping)
            && let Err(e) = send_ping(conn, &mut unconfirmed, timeout).await
        {
            return format!("writing to Redis: {e}");
        }
        let commands = unconfirmed
            .iter()
            .filter(|p| p.command != LinkCommand::Ping)
            .count();
        let in_flight = commands >= max_in_flight;
        if !in_flight && !queued.is_empty() && gather_until.is_none_or(|t| Instant::now() >= t) {
            gather_until = None;
            if let Err(e) = send_command(conn, &mut queued, &mut unconfirmed, cluster, timeout).await {
                return format!("writing to Redis: {e}");
            }
            if queued.is_empty() && queued.capacity() > SHRINK_ABOVE {
                // A burst of new ids (on a Redis Cluster one command per
                // slot, so they wait longer) grew the queue: its memory
                // goes back rather than staying with the idle link.
                queued.shrink_to_fit();
            }
            continue;
        }
        // Redis answers in order: the link is alive while bytes come. It
        // is dead when a command waits and nothing was read for `timeout`
        // (counted from the last read, or from one ping interval before
        // the command was sent, whichever is later: a PING goes every
        // interval, so a Redis gone silent right after a read is given
        // up `timeout` after that read, not an interval later; a command
        // still gets at least half of `timeout` of its own).
        let expiry = unconfirmed
            .front()
            .map(|p| p.sent.checked_sub(slack).unwrap_or(p.sent).max(last_read) + timeout);
        // Biased, the socket first: after this thread was starved (a box
        // under full load can leave a process unpolled for seconds), what
        // Redis sent meanwhile is read before any timer is believed.
        tokio::select! {
            biased;
            filled = conn.fill() => match filled {
                Ok(()) => last_read = Instant::now(),
                Err(e) => return e,
            },
            op = rx.recv() => match op {
                // The Bus dropped this link (it failed, or the Bus restarted).
                None => return "the link was replaced".to_owned(),
                Some(op) => take(op, &mut queued, &mut gather_until, &mut ping),
            },
            () = sleep_until_some(gather_until.filter(|_| !in_flight)) => gather_until = None,
            () = sleep_until_some(expiry) => return "a command on the pub/sub link timed out".to_owned(),
        }
    }
}

/// Takes an op from the Bus: a PING is due at once; a subscription change
/// is queued, the first one after a quiet spell opening a [`GATHER`] window.
fn take(op: Op, queued: &mut VecDeque<Op>, gather_until: &mut Option<Instant>, ping: &mut bool) {
    if matches!(op, Op::Ping) {
        *ping = true;
        return;
    }
    if queued.is_empty() {
        *gather_until = Some(Instant::now() + GATHER);
    }
    queued.push_back(op);
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes `bytes`, failing if Redis takes none of them for `timeout` (a
/// Redis that stopped reading would otherwise hold the link forever).
async fn write_within(conn: &mut Conn, bytes: &[u8], timeout: Duration) -> std::io::Result<()> {
    tokio::time::timeout(timeout, conn.write(bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "Redis stopped reading"))?
}

/// Writes a PING, noting it in `pending`.
async fn send_ping(
    conn: &mut Conn,
    unconfirmed: &mut VecDeque<Unconfirmed>,
    timeout: Duration,
) -> std::io::Result<()> {
    write_within(conn, &redis::cmd("PING").get_packed_command(), timeout).await?;
    unconfirmed.push_back(Unconfirmed {
        command: LinkCommand::Ping,
        remaining: 1,
        ids: Vec::new(),
        sent: Instant::now(),
    });
    Ok(())
}

/// Writes one SUBSCRIBE or UNSUBSCRIBE: the ops at the front of `queued`
/// of the first one's kind, up to [`MAX_BATCH`]; notes it in `pending`.
async fn send_command(
    conn: &mut Conn,
    queued: &mut VecDeque<Op>,
    unconfirmed: &mut VecDeque<Unconfirmed>,
    cluster: &Cluster,
    timeout: Duration,
) -> std::io::Result<()> {
    let kind = match queued.front() {
        Some(Op::Subscribe(_)) => LinkCommand::Subscribe,
        Some(Op::Unsubscribe(_)) => LinkCommand::Unsubscribe,
        Some(Op::Ping) | None => return Ok(()),
    };
    let sharded = cluster.names.sharded();
    let mut cmd = redis::cmd(match (kind == LinkCommand::Subscribe, sharded) {
        (true, false) => "SUBSCRIBE",
        (false, false) => "UNSUBSCRIBE",
        (true, true) => "SSUBSCRIBE",
        (false, true) => "SUNSUBSCRIBE",
    });
    let mut ids = Vec::new();
    let mut channels = 0;
    // On a Redis Cluster: the channels of the first one's slot only.
    let mut slot = None;
    let mut same_slot = |channel: &str| {
        if !sharded {
            return true;
        }
        let of = slot_of(channel.as_bytes());
        *slot.get_or_insert(of) == of
    };
    while channels < MAX_BATCH {
        match queued.front() {
            Some(Op::Subscribe(id)) if kind == LinkCommand::Subscribe => {
                let channel = cluster.names.id_channel(id);
                if !same_slot(&channel) {
                    break;
                }
                if let Some(Op::Subscribe(id)) = queued.pop_front() {
                    cmd.arg(channel);
                    ids.push(id);
                }
            }
            Some(Op::Unsubscribe(channel)) if kind == LinkCommand::Unsubscribe => {
                if !same_slot(channel) {
                    break;
                }
                if let Some(Op::Unsubscribe(channel)) = queued.pop_front() {
                    cmd.arg(channel);
                }
            }
            _ => break,
        }
        channels += 1;
    }
    cluster.stats.subscribe_commands.fetch_add(1, Relaxed);
    write_within(conn, &cmd.get_packed_command(), timeout).await?;
    unconfirmed.push_back(Unconfirmed {
        command: kind,
        remaining: channels,
        ids,
        sent: Instant::now(),
    });
    Ok(())
}

/// On a Redis Cluster: reads which master serves each slot, opens a link
/// to each, and SSUBSCRIBEs there that shard's broadcast channel.
async fn open_shards(cluster: &Cluster) -> Result<(Vec<(Conn, u64)>, Option<Arc<Topology>>), String> {
    let topology = cluster.read_topology().await?;
    let mut conns = Vec::with_capacity(topology.shards.len());
    for (i, shard) in topology.shards.iter().enumerate() {
        let client = cluster.shard_client(&shard.master)?;
        let mut conn = Conn::open(&client, cluster.tls())
            .await
            .map_err(|e| format!("the link to shard master {}: {e}", shard.master))?;
        let since = shard_time(&mut conn).await?;
        load_scripts(&mut conn, cluster.shard_scripts()).await?;
        conn.limit(cluster.max_message_bytes + FRAMING_BYTES);
        if let Some(broadcast) = cluster.names.shard_broadcast(&topology, i) {
            ssubscribe_broadcast(&mut conn, &broadcast).await?;
        }
        conns.push((conn, since));
    }
    Ok((conns, Some(topology)))
}

/// The shard master's `TIME` in microseconds, asked on a fresh link before
/// it subscribes anything: where the link starts having its shard's
/// messages. Every id the shard mints later is above it (ids follow the
/// shard's time), so if the link goes before it carried any, its ids
/// catch up from here rather than from the node's clock, which another
/// shard's ids set.
async fn shard_time(conn: &mut Conn) -> Result<u64, String> {
    conn.write(&redis::cmd("TIME").get_packed_command())
        .await
        .map_err(|e| e.to_string())?;
    let number = |r: &Reply| {
        r.bytes()
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|t| t.parse::<u64>().ok())
    };
    match conn.next().await? {
        Reply::Array(Some(items)) if items.len() == 2 => match (number(&items[0]), number(&items[1])) {
            (Some(secs), Some(micros)) => Ok(secs.saturating_mul(1_000_000).saturating_add(micros)),
            _ => Err(format!("unexpected answer to TIME: {items:?}")),
        },
        other => Err(format!("unexpected answer to TIME: {other:?}")),
    }
}

/// Loads `sources` (SCRIPT LOAD) on a fresh link to a shard's master,
/// before it subscribes ([`Cluster::shard_scripts`]).
async fn load_scripts(conn: &mut Conn, sources: &[String]) -> Result<(), String> {
    for source in sources {
        let load = redis::cmd("SCRIPT").arg("LOAD").arg(source).get_packed_command();
        conn.write(&load).await.map_err(|e| e.to_string())?;
        match conn.next().await? {
            Reply::Bulk(Some(_)) => {}
            other => return Err(format!("unexpected answer to SCRIPT LOAD: {other:?}")),
        }
    }
    Ok(())
}

/// SSUBSCRIBEs a shard's broadcast channel on a fresh link to its master.
async fn ssubscribe_broadcast(conn: &mut Conn, broadcast: &str) -> Result<(), String> {
    let subscribe = redis::cmd("SSUBSCRIBE").arg(broadcast).get_packed_command();
    conn.write(&subscribe).await.map_err(|e| e.to_string())?;
    match Received::of(conn.next().await?)? {
        Received::Subscribed => Ok(()),
        other => Err(format!("unexpected answer to SSUBSCRIBE: {other:?}")),
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
        if self.cluster.sentinels() {
            // Part of this context: a restart replaces it with the rest.
            ctx.spawn(watch_sentinels(Arc::clone(&self.cluster), ctx.address()).into_actor(self));
        }
    }
}

/// The sentinels announced a new master (`+switch-master`).
#[derive(Message)]
#[rtype(result = "()")]
struct MasterSwitched(String);

impl Handler<MasterSwitched> for Bus {
    type Result = ();

    fn handle(&mut self, MasterSwitched(to): MasterSwitched, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, ctx| {
            // From now on, for a while, a sentinel naming another master
            // is one that has not heard yet (see `Cluster::find_master`).
            let news = bus.cluster.announce_master(&to);
            if to == bus.cluster.master_addr() || (!news && bus.link.is_none()) {
                // Already there, or on the way: a connect that began after
                // the first announcement goes nowhere else.
                return;
            }
            tracing::warn!(
                event = "redis_switch_master",
                to = %to,
                "the sentinels switched the master; the bus reconnects there"
            );
            if bus.link.is_some() {
                bus.lost(bus.generation, "the sentinels switched the master", ctx);
            } else if std::mem::take(&mut bus.connecting) {
                // A connect in flight may have asked a sentinel before the
                // announcement and be linking to the old master (which,
                // paused and resumed, still answers as one): void it and
                // ask again. Otherwise the connect scheduled next asks.
                bus.generation += 1;
                bus.schedule_connect(ctx);
            }
        });
    }
}

/// Reads `ROLE` on a fresh link: anything but a master is refused.
async fn confirm_master(conn: &mut Conn) -> Result<(), String> {
    conn.write(&redis::cmd("ROLE").get_packed_command())
        .await
        .map_err(|e| e.to_string())?;
    match conn.next().await? {
        Reply::Array(Some(items)) if items.first().and_then(Reply::bytes) == Some(b"master") => Ok(()),
        Reply::Array(Some(items)) => Err(format!(
            "the Redis the sentinels named is a {}, not a master",
            String::from_utf8_lossy(items.first().and_then(Reply::bytes).unwrap_or(b"?"))
        )),
        other => Err(format!("unexpected answer to ROLE: {other:?}")),
    }
}

/// Follows every sentinel's `+switch-master` announcements for this
/// fleet's master and tells the Bus, for as long as the Bus runs. Every
/// sentinel, not one: the one that led the failover announces it at once,
/// the others only once they hear of it (a hello period or more later),
/// and until then they name the old master.
async fn watch_sentinels(cluster: Arc<Cluster>, bus: Addr<Bus>) {
    let sentinels = match cluster.sentinel_clients() {
        Ok(sentinels) => sentinels,
        Err(cause) => {
            tracing::error!(
                event = "sentinel_watch_lost",
                cause,
                "cannot follow the sentinels' +switch-master (link losses still make the node ask them)"
            );
            return;
        }
    };
    let watches = sentinels
        .into_iter()
        .map(|(name, client)| watch_sentinel(Arc::clone(&cluster), bus.clone(), name, client));
    futures_util::future::join_all(watches).await;
}

/// Follows one sentinel (see [`watch_sentinels`]); reconnects after any
/// failure.
async fn watch_sentinel(cluster: Arc<Cluster>, bus: Addr<Bus>, sentinel: String, client: redis::Client) {
    let master = cluster.settings.redis_sentinel_master.clone();
    let retry = Duration::from_millis(cluster.settings.reconnect_max_ms);
    let subscribe = redis::cmd("SUBSCRIBE").arg("+switch-master").get_packed_command();
    let mut failures: u32 = 0;
    while bus.connected() {
        let began = Instant::now();
        let watched = async {
            let mut conn = tokio::time::timeout(cluster.link_timeout(), Conn::open(&client, cluster.tls()))
                .await
                .map_err(|_| "connecting timed out".to_owned())??;
            conn.write(&subscribe).await.map_err(|e| e.to_string())?;
            loop {
                match Received::of(conn.next().await?)? {
                    Received::Message { payload, .. } => {
                        let text = String::from_utf8_lossy(&payload);
                        let mut words = text.split(' ');
                        if words.next() == Some(master.as_str()) {
                            let to: Vec<&str> = words.skip(2).collect();
                            bus.do_send(MasterSwitched(to.join(":")));
                        }
                    }
                    Received::Subscribed => {}
                    other => return Err::<(), String>(format!("unexpected on a sentinel: {other:?}")),
                }
            }
        };
        let ended = watched.await;
        if began.elapsed() > Duration::from_secs(10) {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        // Logged at failures 1, 2, 4, 8, ...: ever sparser while it lasts.
        if let Err(cause) = ended
            && failures.is_power_of_two()
        {
            tracing::warn!(
                event = "sentinel_watch_lost",
                sentinel,
                cause,
                failures,
                "lost a sentinel this node follows +switch-master on; again shortly \
                 (link losses still make it ask the sentinels)"
            );
        }
        tokio::time::sleep(retry).await;
    }
}

impl Supervised for Bus {
    /// After a panic: drop the link (its futures are gone with the old
    /// context); `started` makes a new one and resubscribes.
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.cluster.stats.restarts.fetch_add(1, Relaxed);
        self.cluster.stats.connected.store(false, Relaxed);
        self.connecting = false;
        self.generation += 1;
        self.attempts = 0;
        match self.link.take() {
            // Each shard's ids catch up from where its own link had them,
            // not from the node's clock (another shard's ids set it).
            Some(Link {
                shards,
                topology: Some(topology),
            }) => {
                self.cluster.shards_up(None);
                for (k, shard) in shards.iter().enumerate() {
                    let part = self.part(&topology, k);
                    self.subscribed.do_send(Subscribed::PartDown(part, shard.seen));
                }
            }
            _ => self.subscribed.do_send(Subscribed::LinkDown),
        }
        tracing::warn!(
            event = "restart",
            actor = "bus",
            "cluster bus restarted; reconnecting and resubscribing"
        );
    }
}

/// What the Redis broker tells the Bus for the Router: the first stream of
/// an id logged in here, or its last one left.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) enum Interest {
    /// `id` has a stream on this node now.
    Held(Arc<str>),
    /// `id` has no stream on this node any more.
    Released(Arc<str>),
    /// `id` was held already; confirm its subscription again (the Router
    /// restarted and may have lost the confirmation).
    Confirm(Arc<str>),
}

impl Handler<Interest> for Bus {
    type Result = ();

    fn handle(&mut self, m: Interest, ctx: &mut Context<Self>) {
        guarded(self, ctx, |bus, _| match m {
            Interest::Held(id) => {
                let back = bus.cluster.end_linger(&id);
                if back && bus.linked(&id) {
                    // Back within the linger: still subscribed.
                    bus.subscribed.do_send(Subscribed::Ids(vec![id]));
                } else if back {
                    bus.subscribed.do_send(Subscribed::NoLink(vec![id]));
                } else {
                    if let Some(occupancy) = &bus.cluster.occupancy {
                        occupancy.change(&id, true);
                    }
                    bus.send(Op::Subscribe(id));
                    bus.set_subscriptions(bus.subscriptions + 1);
                }
            }
            Interest::Confirm(id) => {
                // SUBSCRIBE again (Redis confirms a repeat too); the count
                // already has the id.
                bus.send(Op::Subscribe(id));
            }
            Interest::Released(id) => {
                let until = Instant::now() + bus.linger();
                bus.cluster.linger(id, until);
            }
        });
    }
}

impl Handler<Incoming> for Bus {
    type Result = ();

    fn handle(
        &mut self,
        Incoming {
            generation,
            shard,
            channel,
            payload,
        }: Incoming,
        ctx: &mut Context<Self>,
    ) {
        guarded(self, ctx, |bus, _| {
            // A connection being dropped still hands over what it read,
            // in order, before its LinkLost.
            if bus.current(generation, shard, false)
                && let Some(event) = bus.deliver(shard.0, &channel, &payload)
                && let Some(s) = bus.link.as_mut().and_then(|l| l.shards.get_mut(shard.0))
            {
                s.seen = s.seen.max(event);
            }
        });
    }
}

impl Bus {
    /// Hands a message from another node to the Router (`shard`: which
    /// shard's link it came over; 0 on one Redis).
    /// Answers the event id it carried, if it did.
    fn deliver(&mut self, shard: usize, channel: &[u8], payload: &[u8]) -> Option<u64> {
        let stats = &self.cluster.stats;
        let channel = String::from_utf8_lossy(channel);
        // `<instance>!join <json>` or `!leave`: another node's stream
        // joined or left; this node's own streams had its own from the
        // Router.
        if let Some((instance, kind, json)) = parse_note(payload) {
            let id = self.cluster.names.id_of(&channel);
            if let (false, Some(id), true) = (
                instance == self.cluster.instance,
                id,
                json.len() <= self.cluster.max_message_bytes,
            ) {
                self.notes.do_send(NoteFor {
                    id: Arc::from(id),
                    note: Note {
                        kind,
                        json: Arc::from(json),
                    },
                });
            }
            return None;
        }
        let parsed = parse_payload(payload).filter(|p| p.text.len() <= self.cluster.max_message_bytes);
        let Some(Payload { origin, event, text }) = parsed else {
            stats.malformed.fetch_add(1, Relaxed);
            tracing::warn!(
                event = "bus_malformed",
                channel = %channel,
                bytes = payload.len(),
                "a bus message is not \"<instance>[@<event id>] <one line>\" with a line of at most \
                 message.max_bytes; dropped, never delivered or kept (counted in /stats cluster.malformed)"
            );
            return None;
        };
        // `<instance>/<seq>` (`<instance>` alone from a node of an older
        // version): the echo of this node's own publish `seq` is how its
        // own streams get it.
        let (instance, seq) = match origin.split_once('/') {
            Some((instance, seq)) => (instance, seq.parse::<u64>().ok()),
            None => (origin, None),
        };
        // This node's own echo is delivered whatever its id: the id is the
        // one the script answered this node with (issue 40: the check
        // below once dropped it, and a publish answered 200 reached no
        // stream).
        if instance == self.cluster.instance {
            if let Some(event) = event {
                self.cluster.saw(event);
            }
            stats.echoes.fetch_add(1, Relaxed);
            if let Some(echo) = seq.and_then(|seq| self.cluster.take_awaited(seq)) {
                self.deliver_here(shard, &channel, text, event, echo);
            }
            return event;
        }
        // An event id far ahead of Redis's time would push this node's ids
        // out of reach; the script never gives one (see `MAX_AHEAD`).
        let horizon = self
            .cluster
            .redis_now_us()
            .saturating_add(MAX_AHEAD.as_micros() as u64);
        if let Some(event) = event {
            if event > horizon {
                stats.ids_ahead.fetch_add(1, Relaxed);
                tracing::warn!(
                    event = "bus_id_ahead",
                    channel = %channel,
                    event_id = event,
                    ahead_ms = (event - horizon) / 1000 + MAX_AHEAD.as_millis() as u64,
                    "a bus message's event id is more than a minute ahead of Redis's time as this node measures \
                     it; dropped (counted in /stats cluster.ids_ahead)"
                );
                return None;
            }
            self.cluster.saw(event);
        }
        let text: Arc<str> = Arc::from(text);
        let accepted = std::time::Instant::now();
        if self.cluster.names.is_broadcast(&channel) {
            self.broadcast.do_send(Broadcast {
                msg: text,
                event,
                accepted,
                limit: None,
                part: self.broadcast_part(shard),
            });
        } else if let Some(id) = self.cluster.names.id_of(&channel) {
            self.publish.do_send(Publish {
                id: id.to_owned(),
                msg: text,
                event,
                accepted,
                limit: None,
            });
        } else {
            stats.malformed.fetch_add(1, Relaxed);
            return None;
        }
        stats.received.fetch_add(1, Relaxed);
        event
    }
}

impl Bus {
    /// This node's own publish, back from Redis: its streams get it
    /// now, and the waiting `/send` or `/broadcast` is told what they got.
    fn deliver_here(&self, shard: usize, channel: &str, text: &str, event: Option<u64>, echo: AwaitedEcho) {
        let (msg, accepted, waiter) = (Arc::from(text), std::time::Instant::now(), echo.waiter);
        if self.cluster.names.is_broadcast(channel) {
            let done = self.broadcast.send(Broadcast {
                msg,
                event,
                accepted,
                limit: None,
                part: self.broadcast_part(shard),
            });
            actix_rt::spawn(async move {
                if let (Ok(Some(Ok(n))), Some(waiter)) = (done.await, waiter) {
                    let _ = waiter.send(n as u64);
                }
            });
        } else if let Some(id) = self.cluster.names.id_of(channel) {
            let done = self.publish.send(Publish {
                id: id.to_owned(),
                msg,
                event,
                accepted,
                limit: None,
            });
            actix_rt::spawn(async move {
                if let (Ok(Some(Ok(p))), Some(waiter)) = (done.await, waiter) {
                    let _ = waiter.send(p.delivered as u64);
                }
            });
        }
    }
}

impl Handler<LinkLost> for Bus {
    type Result = ();

    fn handle(
        &mut self,
        LinkLost {
            generation,
            shard,
            why,
        }: LinkLost,
        ctx: &mut Context<Self>,
    ) {
        guarded(self, ctx, |bus, ctx| {
            let sharded = bus.link.as_ref().is_some_and(|l| l.topology.is_some());
            if sharded && generation == bus.generation {
                bus.shard_lost(shard, &why, ctx);
            } else {
                bus.lost(generation, &why, ctx);
            }
        });
    }
}

impl Handler<Crash> for Bus {
    type Result = Option<()>;

    fn handle(&mut self, _: Crash, ctx: &mut Context<Self>) -> Option<()> {
        guarded(self, ctx, |_, _| panic!("fault injection: bus crash requested"))
    }
}

/// The Bus with a fake Router and no Redis (its link never comes up): the
/// unsubscribe linger, which the Bus alone decides (it fills and empties
/// the lingering table, kept in [`Cluster`] so the Hub can read it).
#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::config::Settings;
    use crate::hub::router::Published;
    use crate::stats::Stats;

    /// A Router that records what the Bus tells it.
    #[derive(Default)]
    struct FakeRouter {
        subscribed: Arc<Mutex<Vec<Arc<str>>>>,
        /// The event ids of the publishes it was handed, in order.
        published: Arc<Mutex<Vec<Option<u64>>>>,
        /// The notes it was handed.
        notes: Arc<Mutex<Vec<Handed>>>,
    }

    /// A note as the Router was handed it: id, kind, JSON.
    type Handed = (String, &'static str, String);

    impl Handler<NoteFor> for FakeRouter {
        type Result = ();
        fn handle(&mut self, m: NoteFor, _: &mut Context<Self>) {
            let NoteFor { id, note } = m;
            self.notes
                .lock()
                .unwrap()
                .push((id.to_string(), note.kind.as_str(), note.json.to_string()));
        }
    }

    impl Actor for FakeRouter {
        type Context = Context<Self>;

        /// The Router's mailbox, which the Bus's order relies on.
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.set_mailbox_capacity(crate::hub::router::MAILBOX_CAPACITY);
        }
    }

    impl Handler<Publish> for FakeRouter {
        type Result = Option<Result<Published, crate::hub::router::Busy>>;
        fn handle(&mut self, p: Publish, _: &mut Context<Self>) -> Self::Result {
            self.published.lock().unwrap().push(p.event);
            None
        }
    }

    impl Handler<Broadcast> for FakeRouter {
        type Result = Option<Result<usize, crate::hub::router::Busy>>;
        fn handle(&mut self, _: Broadcast, _: &mut Context<Self>) -> Self::Result {
            None
        }
    }

    impl Handler<HeldIds> for FakeRouter {
        type Result = actix::MessageResult<HeldIds>;
        fn handle(&mut self, _: HeldIds, _: &mut Context<Self>) -> Self::Result {
            actix::MessageResult(Vec::new())
        }
    }

    impl Handler<Subscribed> for FakeRouter {
        type Result = ();
        fn handle(&mut self, m: Subscribed, _: &mut Context<Self>) {
            if let Subscribed::Ids(ids) | Subscribed::NoLink(ids) = m {
                self.subscribed.lock().unwrap().extend(ids);
            }
        }
    }

    /// A node's command side for `settings` (Redis need not run).
    fn test_cluster(settings: &Settings) -> Arc<Cluster> {
        Arc::new(
            Cluster::new(
                &settings.cluster,
                crate::namespace::Namespaces::new(settings),
                1000,
                Arc::new(Stats::new()),
                "test".to_owned(),
            )
            .unwrap(),
        )
    }

    /// A Bus (not started) telling `router` everything.
    fn bus_of(cluster: &Arc<Cluster>, router: &Addr<FakeRouter>) -> Bus {
        Bus::new(
            Arc::clone(cluster),
            router.clone().recipient(),
            router.clone().recipient(),
            router.clone().recipient(),
            router.clone().recipient(),
            router.clone().recipient(),
        )
    }

    /// The bus's messages of an id reach the Router in the order they came
    /// from Redis, this node's own echoes among them, even when the
    /// Router's mailbox is past its capacity: an echo that waited for room
    /// while messages of other nodes went in would break the fleet's one
    /// order.
    #[actix_rt::test]
    async fn own_echoes_keep_their_place_behind_a_full_router_mailbox() {
        let mut settings = Settings::defaults();
        settings.cluster.redis_url = "redis://127.0.0.1:1".to_owned();
        let cluster = test_cluster(&settings);
        let router = FakeRouter::default();
        let published = Arc::clone(&router.published);
        let router = router.start();
        // Running, as the Router is long before the bus hears anything.
        router.send(HeldIds).await.unwrap();
        // Not started: the test hands it what the link would, all before
        // the Router runs once, as a burst from Redis does.
        let mut bus = bus_of(&cluster, &router);
        let channel = cluster.names.id_channel("a");
        let mut seq = 0;
        for event in 1..=100u64 {
            let payload = if event % 3 == 0 {
                seq += 1;
                cluster.await_echo(seq);
                format!("{}/{seq}@{event} m{event}", cluster.instance)
            } else {
                format!("other@{event} m{event}")
            };
            bus.deliver(0, channel.as_bytes(), payload.as_bytes());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while published.lock().unwrap().len() < 100 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let got: Vec<u64> = published.lock().unwrap().iter().map(|e| e.unwrap()).collect();
        assert_eq!(got, (1..=100).collect::<Vec<_>>());
        assert_eq!(cluster.stats.echoes.load(Relaxed), 33);
    }

    /// Another node's `join` and `leave` reach the Router for the id's
    /// streams, never as a message; this node's own (its streams had them)
    /// and ones that are not one line of an id's channel are dropped.
    #[actix_rt::test]
    async fn other_nodes_joins_and_leaves_reach_the_router_and_never_as_messages() {
        let mut settings = Settings::defaults();
        settings.cluster.redis_url = "redis://127.0.0.1:1".to_owned();
        let cluster = test_cluster(&settings);
        let router = FakeRouter::default();
        let (notes, published) = (Arc::clone(&router.notes), Arc::clone(&router.published));
        let router = router.start();
        router.send(HeldIds).await.unwrap();
        let mut bus = bus_of(&cluster, &router);
        let channel = cluster.names.id_channel("chat:1");
        let own = cluster.instance.clone();
        for payload in [
            r#"other!join {"sub":"alice","node":"b"}"#.to_owned(),
            format!(r#"{own}!join {{"node":"a"}}"#),
            "other!wave {}".to_owned(),
            r#"other!leave {"node":"b"}"#.to_owned(),
        ] {
            bus.deliver(0, channel.as_bytes(), payload.as_bytes());
        }
        bus.deliver(
            0,
            cluster.names.broadcast().as_bytes(),
            br#"other!join {"node":"b"}"#,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while notes.lock().unwrap().len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *notes.lock().unwrap(),
            [
                (
                    "chat:1".to_owned(),
                    "join",
                    r#"{"sub":"alice","node":"b"}"#.to_owned()
                ),
                ("chat:1".to_owned(), "leave", r#"{"node":"b"}"#.to_owned()),
            ]
        );
        // "other!wave" is no note: a message (of an older node), not lost
        // silently, but no join either.
        assert_eq!(published.lock().unwrap().len(), 1);
    }

    #[actix_rt::test]
    async fn an_id_lingers_after_its_last_stream_and_is_unsubscribed_after() {
        let mut settings = Settings::defaults();
        // Nothing listens on port 1: the link stays down, which is all the
        // linger needs.
        settings.cluster.redis_url = "redis://127.0.0.1:1".to_owned();
        settings.cluster.unsubscribe_linger_ms = 200;
        settings.cluster.reconnect_min_ms = 60_000;
        settings.cluster.reconnect_max_ms = 60_000;
        let cluster = test_cluster(&settings);
        let router = FakeRouter::default();
        let subscribed = Arc::clone(&router.subscribed);
        let router = router.start();
        let bus = bus_of(&cluster, &router).start();
        let subscriptions = || cluster.stats.subscriptions.load(Relaxed);
        let id: Arc<str> = Arc::from("a");
        bus.send(Interest::Held(Arc::clone(&id))).await.unwrap();
        assert_eq!(subscriptions(), 1);
        // Without a link, a stream need not wait for one.
        assert_eq!(*subscribed.lock().unwrap(), [Arc::clone(&id)]);
        // Its last stream leaves: it lingers, still subscribed.
        bus.send(Interest::Released(Arc::clone(&id))).await.unwrap();
        assert!(cluster.is_lingering("a"));
        assert_eq!(subscriptions(), 1);
        // Back within the linger: no new SUBSCRIBE, and its stream is
        // welcomed at once.
        bus.send(Interest::Held(Arc::clone(&id))).await.unwrap();
        assert!(!cluster.is_lingering("a"));
        assert_eq!(subscriptions(), 1);
        assert_eq!(subscribed.lock().unwrap().len(), 2);
        // Gone again, for longer than the linger: unsubscribed.
        bus.send(Interest::Released(Arc::clone(&id))).await.unwrap();
        let left = Instant::now();
        while cluster.is_lingering("a") {
            assert!(left.elapsed() < Duration::from_secs(5), "still lingering");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            left.elapsed() >= Duration::from_millis(150),
            "{:?}",
            left.elapsed()
        );
        assert_eq!(subscriptions(), 0);
    }
}
