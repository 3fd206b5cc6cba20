//! The broker seam: what the hub needs of the engine that gives a message
//! its event id, keeps it, and carries it to the nodes that hold its id.
//! Modelled on centrifuge's `Broker` and `PresenceManager` interfaces.
//!
//! - [`memory`]: one process. Subscriptions are live at once, the history
//!   is kept in this process and read at once, presence is the Router's
//!   own count.
//! - [`redis`]: a fleet on one Redis (today's cluster mode). A publish
//!   runs the fleet's script, which mints the id and keeps the message;
//!   every node's Router, this one's included, gets it from the Bus under
//!   that id. Subscriptions, history reads, catch-ups and presence writes
//!   go to Redis and answer later.
//!
//! The Router ([`super::router`]) holds a `dyn Broker` and names no
//! engine: it asks for a subscription and is told whether it is live now
//! or will be confirmed ([`Subscription`]); it asks for a history read and
//! gets it now or later ([`Read`]). The Hub ([`super::Hub`]) hands each
//! publish to [`Broker::publish`], which answers a typed [`Answer`]. A
//! third engine (a sharded Redis Cluster) implements this trait and
//! leaves the Router alone.

pub(crate) mod memory;
pub(crate) mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::hub::cluster::Presence;
use crate::hub::history::{CaughtUp, FleetRead};
use crate::hub::local::Local;
use crate::hub::router::Note;

/// An answer that comes later, polled on the asking actor's thread.
pub(crate) type Later<T> = Pin<Box<dyn Future<Output = T> + 'static>>;

/// An answer that comes later, borrowing its asker.
pub(crate) type LaterFrom<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// One id's count of streams on this node, as presence is written
/// ([`Broker::write_presence`]).
pub(crate) struct HeldCount {
    pub(crate) id: Arc<str>,
    /// Its streams here (0: none any more).
    pub(crate) streams: usize,
    /// With `presence_events`: its distinct subjects here, a JSON array
    /// of at most [`crate::hub::router::MAX_SUBJECTS`].
    pub(crate) subjects: Option<Box<str>>,
}

/// Counts of streams, as presence is written.
pub(crate) type Counts = Arc<[HeldCount]>;

/// Most ids one catch-up read covers (a SUBSCRIBE batch's).
pub(crate) const CATCH_UP_BATCH: usize = 1_000;

/// A publish's answer, to come.
pub(crate) type Publishing<'a> = LaterFrom<'a, Result<Answer, ApiError>>;

/// A message to publish, as `/send` and `/broadcast` accepted it.
pub(crate) struct Outgoing<'a> {
    /// Who it is for.
    pub(crate) target: &'a Target,
    /// One line of text, already validated.
    pub(crate) msg: &'a Arc<str>,
    /// Its `Idempotency-Key`.
    pub(crate) key: Option<String>,
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
    pub(crate) fn name(&self) -> String {
        match self {
            Target::Id(id) => format!("send:{id}"),
            Target::All => "broadcast".to_owned(),
        }
    }

    /// The id, for `/send`.
    pub(crate) fn id(&self) -> Option<&str> {
        match self {
            Target::Id(id) => Some(id),
            Target::All => None,
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
    pub(crate) outcome: std::borrow::Cow<'static, str>,
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
    /// Delivered nowhere, or not known to be (503 with `Retry-After`).
    NotDelivered(Undelivered),
}

/// Whether messages of an id reach the Router once it asked for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscription {
    /// From now on.
    Live,
    /// Once the broker confirms it with [`super::router::Subscribed`]; the
    /// id's streams wait until then.
    Pending,
}

/// A read of an id's history since a position.
pub(crate) enum Read {
    /// Read at once: nothing of the id can be on its way meanwhile.
    Now(FleetRead),
    /// On its way (`None`: it failed). Messages of the id that come
    /// meanwhile are buffered and merged by event id.
    Later(Later<Option<FleetRead>>),
}

/// The engine under the hub: see the module docs.
pub(crate) trait Broker: Send + Sync + 'static {
    /// Whether every stream waits for the Router's welcome before it
    /// writes its own (its id's subscription is confirmed later).
    fn streams_wait(&self) -> bool;

    /// This node holds a stream of `id` now.
    fn subscribe(&self, id: &Arc<str>) -> Subscription;

    /// This node holds no stream of `id` any more.
    fn unsubscribe(&self, id: Arc<str>);

    /// `id` was asked for already and its confirmation may be lost (the
    /// Router restarted).
    fn confirm(&self, id: Arc<str>) -> Subscription;

    /// Gives a message accepted on this node for `id` its event id and
    /// keeps it in the history, in the Router's step that delivers it (so
    /// ids follow the order of delivery). `None`: this broker mints ids
    /// only in its publish, and this message (one that could not go
    /// through it) goes to this node's streams alone, without one.
    fn keep(&self, id: &str, msg: &Arc<str>) -> Option<u64>;

    /// `id`'s kept messages after `since` (`None`: a new stream), asked
    /// once its subscription is live: subscribe first, read, merge by id.
    fn read(&self, id: &Arc<str>, since: Option<u64>) -> Read;

    /// After a lost link: the kept messages of `ids` (at most
    /// [`CATCH_UP_BATCH`]) and the broadcasts after `since` (`None`: the
    /// read failed).
    fn catch_up(&self, ids: Vec<Arc<str>>, since: u64) -> Later<Option<CaughtUp>>;

    /// How often the Router writes its changed counts of streams with
    /// [`Broker::write_presence`]; `None`: presence is read from the Router
    /// when asked.
    fn presence_every(&self) -> Option<Duration>;

    /// Writes this node's count of streams of each id (`full`: the counts
    /// are every id held here). Answers whether what was written before is
    /// still there (`Err`: the write failed; it is tried again).
    fn write_presence(&self, counts: Counts, full: bool) -> Later<Result<bool, ()>>;

    /// A `join` or `leave` of a stream of `id` here, for the other nodes'
    /// streams of it (this node's have it from the Router).
    fn notify(&self, id: &Arc<str>, note: &Note);

    /// The server stops, its streams gone: what waits on a timer is done
    /// now (the memory broker's lingering ids are vacated).
    fn stopping(&self);

    /// How often the Router calls [`Broker::upkeep`]; `None`: never.
    fn upkeep_every(&self) -> Option<Duration>;

    /// Periodic upkeep (a kept history's expired messages).
    fn upkeep(&self);

    /// Publishes `out` (with an `Idempotency-Key`, once per key): the
    /// broker mints its event id where it keeps it, and `here` is this
    /// node's Router, which hands it to this node's streams.
    fn publish<'a>(&'a self, out: Outgoing<'a>, here: &'a Local) -> Publishing<'a>;

    /// `/presence/{id}`, with `here` streams of it on this node (and, with
    /// `presence_events`, its subjects here).
    fn presence<'a>(
        &'a self,
        id: &'a str,
        here: usize,
        subjects: Option<Vec<Arc<str>>>,
    ) -> LaterFrom<'a, Result<Presence, ApiError>>;
}
