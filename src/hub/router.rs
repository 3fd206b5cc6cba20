//! The Router actor: stream id -> every open stream with that id.
//!
//! Like the Erlang original's ETS bag, one id may be open on several
//! connections; a message for the id goes to all of them. Streams register
//! themselves ([`Login`]) when they start and leave ([`Logout`]) when they
//! stop. The Router runs under a `Supervisor` on the first worker's arbiter; see
//! [`crate::supervision`] for what survives a panic.
//!
//! The Router never names the stream actor: it is generic over any actor
//! that takes the messages it sends ([`StreamActor`]: [`Deliver`],
//! [`Welcome`], [`Close`], [`Cut`]), so calls go one way (the stream knows
//! the Router, not the other way round), and unit tests drive it with a
//! fake stream. It keeps the actor's own weak address rather than a
//! type-erased recipient: a `WeakRecipient` is a boxed trait object, one
//! more allocation for every idle stream.
//!
//! It names no engine. Its [`Broker`] (see [`crate::hub::broker`]) says
//! whether an id's subscription is live at once or confirmed later
//! ([`Subscribed`]), mints and keeps a message accepted here in the step
//! that delivers it ([`Broker::keep`]), or hands over messages that already
//! have their event id ([`Publish::event`]). A resuming stream joins after
//! a read of its id's history: "subscribe first, read, merge by id". A
//! read answered at once needs nothing more; one that comes later has the
//! id's messages buffered meanwhile and merged by event id, and a floor
//! keeps the stream from being handed one it had. When a broker's link is
//! lost ([`Subscribed::LinkDown`]), the ids held here catch up from the
//! history once they are subscribed again.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Supervised, WeakAddr};
use smallvec::SmallVec;

use crate::hub::broker::{Broker, CATCH_UP_BATCH, Counts, HeldCount, Read, Subscription};
use crate::hub::history::{
    CaughtUp, FleetRead, GapCause, KeptMessage, Resume, failed_read, fleet_resume, now_us,
};
use crate::id::{ConnId, shrink_if_sparse};
use crate::stats::Stats;
use crate::supervision::{Crash, guarded};
use crate::webhooks::{Name, Webhooks};

/// Most broadcast deliveries the Router keeps queued at its streams at once,
/// so ticks, routed messages and requests of a worker wait behind at most
/// this many, not behind a whole broadcast (why 64: docs/design-notes.md,
/// "Broadcast pacing").
const FANOUT_WINDOW: usize = 64;

/// The window of a process with one worker thread, as each of a fleet's
/// processes on a small box runs: the Router refills it on its own thread,
/// and a routed message waits behind it at every hop at the process's small
/// share of the CPU (why 16: the same note).
const FANOUT_WINDOW_ONE_WORKER: usize = 16;

/// The window for a process of `workers` worker threads.
pub(crate) fn fanout_window(workers: usize) -> usize {
    if workers == 1 {
        FANOUT_WINDOW_ONE_WORKER
    } else {
        FANOUT_WINDOW
    }
}

/// An id with at most this many streams is handed its message at once (a
/// stream still owed a broadcast gets that first); one with more is handed
/// out in windows, as a broadcast is.
const AT_ONCE: usize = 64;

/// How long a stream that joined after a read of the fleet's history is
/// guarded from a message it had already (see `Router::floors`): far
/// longer than a message spends between Redis and the Router.
const FLOOR_TTL: Duration = Duration::from_secs(30);

/// How long the Router waits for that wake-up before it looks anyway.
const FANOUT_RECHECK: Duration = Duration::from_millis(100);

/// The backlog rule, for a publisher's wait and the Router's admission
/// alike: whether `need` more deliveries fit beside `backlog` under `max`.
/// An empty backlog takes anything, so a publish larger than the bound (a
/// broadcast to more streams) still goes out, alone.
pub(crate) fn fits_backlog(backlog: u64, need: u64, max: u64) -> bool {
    backlog == 0 || backlog.saturating_add(need) <= max
}

/// A broadcast's deliveries in flight, and the Router's wake-up.
pub(crate) struct InFlight {
    in_flight: AtomicUsize,
    /// Most in flight at once.
    size: usize,
    /// A full window is handed more once this few are left in flight (the
    /// delivery that brings it there wakes the Router): half of it.
    refill_at: usize,
    refill: tokio::sync::Notify,
}

impl InFlight {
    fn new(size: usize) -> Self {
        InFlight {
            in_flight: AtomicUsize::new(0),
            size,
            refill_at: size / 2,
            refill: tokio::sync::Notify::new(),
        }
    }
}

/// What the Router needs of a stream: an actor that takes its messages.
pub(crate) trait StreamActor:
    Actor<Context = Context<Self>>
    + Handler<Deliver>
    + Handler<Close>
    + Handler<Welcome>
    + Handler<Cut>
    + Handler<Note>
{
}

impl<S> StreamActor for S where
    S: Actor<Context = Context<S>>
        + Handler<Deliver>
        + Handler<Close>
        + Handler<Welcome>
        + Handler<Cut>
        + Handler<Note>
{
}

/// Whether a stream joined or left its id (`presence_events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoteKind {
    Join,
    Leave,
}

impl NoteKind {
    /// As the SSE `event:` and the bus name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NoteKind::Join => "join",
            NoteKind::Leave => "leave",
        }
    }

    /// From the bus.
    pub(crate) fn parse(name: &str) -> Option<NoteKind> {
        match name {
            "join" => Some(NoteKind::Join),
            "leave" => Some(NoteKind::Leave),
            _ => None,
        }
    }
}

/// A `join` or `leave` for a stream of its id: `{"sub", "node"}` (no
/// event id: it is not kept, and a resume does not replay it).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub(crate) struct Note {
    pub(crate) kind: NoteKind,
    /// The JSON object, one line.
    pub(crate) json: Arc<str>,
}

/// A `join` or `leave` from another node, for this node's streams of `id`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoteFor {
    pub(crate) id: Arc<str>,
    pub(crate) note: Note,
}

/// How often lingering long-poll clients whose time is up leave presence.
const LINGER_SWEEP: Duration = Duration::from_millis(250);

/// The most subjects of an id `/presence/{id}` lists (and a node writes).
pub(crate) const MAX_SUBJECTS: usize = 1_000;

/// The streams of one id. Nearly every id has one connection, kept inline.
type Streams<S> = SmallVec<[(ConnId, WeakAddr<S>); 1]>;

/// Ids with their streams, as a catch-up reads them.
type Batch<S> = Vec<(Arc<str>, Streams<S>)>;

/// A message for a stream, from `/send` or `/broadcast`.
///
/// It keeps the books itself: one that never reaches its stream's handler
/// (the stream had stopped, or stopped with it still in its mailbox) counts
/// as `messages.dropped` when it is dropped.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Deliver {
    /// One line of text (validated: no CR or LF).
    msg: Arc<str>,
    /// Its event id; `None` for a broadcast of a single process, which has
    /// none of its own (it is not kept in any history, so it is not a
    /// resume point). In cluster mode a broadcast has one (the fleet keeps
    /// broadcasts too).
    event: Option<u64>,
    /// Where it is counted dropped unless a handler takes it.
    books: Option<Arc<Stats>>,
    /// A broadcast's deliveries in flight, less this one once it is gone.
    window: Option<Arc<InFlight>>,
    /// When this node accepted the message (for the latency histogram).
    accepted: Instant,
}

impl Deliver {
    /// A message for one stream, counted dropped in `stats` unless handled.
    fn new(msg: &Arc<str>, event: Option<u64>, accepted: Instant, stats: &Arc<Stats>) -> Self {
        Deliver {
            msg: Arc::clone(msg),
            event,
            books: Some(Arc::clone(stats)),
            window: None,
            accepted,
        }
    }

    /// A broadcast's delivery, counted in `window` until it is handled or
    /// dropped.
    fn in_window(
        msg: &Arc<str>,
        event: Option<u64>,
        accepted: Instant,
        stats: &Arc<Stats>,
        window: &Arc<InFlight>,
    ) -> Self {
        window.in_flight.fetch_add(1, Relaxed);
        Deliver {
            msg: Arc::clone(msg),
            event,
            books: Some(Arc::clone(stats)),
            window: Some(Arc::clone(window)),
            accepted,
        }
    }

    /// The handler has it: the stream's sink keeps the books from here,
    /// and it has left the publish backlog. Returns the text, the event id
    /// and when it was accepted.
    pub(crate) fn arrived(mut self) -> (Arc<str>, Option<u64>, Instant) {
        if let Some(stats) = self.books.take() {
            stats.publish_backlog.fetch_sub(1, Relaxed);
        }
        (Arc::clone(&self.msg), self.event, self.accepted)
    }
}

impl Drop for Deliver {
    fn drop(&mut self) {
        if let Some(stats) = self.books.take() {
            stats.messages_dropped.fetch_add(1, Relaxed);
            stats.publish_backlog.fetch_sub(1, Relaxed);
        }
        if let Some(window) = self.window.take()
            && window.in_flight.fetch_sub(1, Relaxed) == window.refill_at + 1
        {
            window.refill.notify_one();
        }
    }
}

/// The stream may write its welcome line: the Router has it in its table
/// (in cluster mode, once its id is subscribed on the bus, or the bus is
/// down and waiting would gain nothing). Sent to every stream in cluster
/// mode, and to the streams that asked ([`LoginAt`]) otherwise.
///
/// It carries where the stream is in its id's event ids and, for one that
/// resumes, the kept messages it missed; those are counted delivered, and
/// dropped if the stream is gone before it takes them (as [`Deliver`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Welcome {
    /// Position, replay and gap.
    pub(crate) resume: Resume,
    /// A catch-up after the pub/sub link was lost, for a stream welcomed
    /// long ago: its gap and replay only.
    pub(crate) again: bool,
    /// Where the replay is counted dropped unless a handler takes it.
    books: Option<Arc<Stats>>,
}

impl Welcome {
    fn new(resume: Resume, stats: &Arc<Stats>) -> Self {
        let replayed = resume.replay.len() as u64;
        stats.messages_delivered.fetch_add(replayed, Relaxed);
        stats.history_replayed.fetch_add(replayed, Relaxed);
        if resume.gap.is_some() {
            stats.history_gaps.fetch_add(1, Relaxed);
        }
        Welcome {
            resume,
            again: false,
            books: (replayed > 0).then(|| Arc::clone(stats)),
        }
    }

    /// A catch-up ([`Welcome::again`]).
    fn again(resume: Resume, stats: &Arc<Stats>) -> Self {
        let mut welcome = Welcome::new(resume, stats);
        welcome.again = true;
        welcome
    }

    /// The handler has it: the stream keeps the books from here.
    pub(crate) fn arrived(mut self) -> Resume {
        self.books = None;
        std::mem::take(&mut self.resume)
    }
}

impl Drop for Welcome {
    fn drop(&mut self) {
        if let Some(stats) = self.books.take() {
            stats
                .messages_dropped
                .fetch_add(self.resume.replay.len() as u64, Relaxed);
        }
    }
}

/// The server is shutting down: the stream sends its final chunk and stops.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Close;

/// Hands `m` to a stream if it still runs.
///
/// The table holds weak addresses: a strong `Addr` allocates two small `Arc`s
/// of sender state per clone, ~100 bytes for every idle stream. Upgrading
/// costs those allocations only while a message is being sent.
fn send_if_alive<S, M>(stream: &WeakAddr<S>, m: M)
where
    S: StreamActor + Handler<M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    if let Some(addr) = stream.upgrade() {
        addr.do_send(m);
    }
}

/// Hands one broadcast delivery to `target` (counted in `window` if
/// given); one whose stream is gone since the broadcast came is counted
/// dropped, as it would have been had it been in its mailbox.
fn deliver_broadcast_to<S: StreamActor>(
    target: &WeakAddr<S>,
    f: &Fanout<S>,
    stats: &Arc<Stats>,
    window: Option<&Arc<InFlight>>,
) {
    match target.upgrade() {
        Some(addr) => addr.do_send(match window {
            Some(w) => Deliver::in_window(&f.msg, f.event, f.accepted, stats, w),
            None => Deliver::new(&f.msg, f.event, f.accepted, stats),
        }),
        None => {
            stats.messages_dropped.fetch_add(1, Relaxed);
            stats.publish_backlog.fetch_sub(1, Relaxed);
        }
    }
}

/// A broadcast (or a message to an id with more streams than a window)
/// being handed out, [`FANOUT_WINDOW`] deliveries at a time.
///
/// A routed message never waits for it: a stream that is still owed it
/// when a message of its id comes is handed it then, out of turn, and the
/// message right behind it ([`hand_owed`]), so each stream still gets the
/// broadcast and its id's messages in the order they came.
struct Fanout<S: Actor> {
    msg: Arc<str>,
    /// Its event id (cluster mode).
    event: Option<u64>,
    /// When this node accepted it.
    accepted: Instant,
    /// The streams held when it came, in connection-id order (so that one
    /// is found by binary search).
    targets: Vec<(ConnId, WeakAddr<S>)>,
    /// How many of `targets` have been handed theirs in turn.
    next: usize,
    /// Streams after `next` handed it out of turn: their place is skipped.
    /// Empty unless routed messages came during the broadcast.
    early: HashSet<ConnId>,
}

impl<S: Actor> Fanout<S> {
    /// Whether `conn` is still owed this broadcast: it was held when the
    /// broadcast came and has not been handed it.
    fn owes(&self, conn: ConnId) -> bool {
        self.targets
            .binary_search_by_key(&conn, |(c, _)| *c)
            .is_ok_and(|at| at >= self.next && !self.early.contains(&conn))
    }

    /// The targets not handed theirs yet, in turn.
    fn rest(&self) -> impl Iterator<Item = &WeakAddr<S>> {
        self.targets[self.next..]
            .iter()
            .filter(|(conn, _)| !self.early.contains(conn))
            .map(|(_, s)| s)
    }
}

/// Hands `stream` (`conn`) every broadcast still being handed out that it
/// is owed, oldest first, out of turn (outside the window: a routed
/// message of its id is right behind them).
fn hand_owed<S: StreamActor>(
    fanouts: &mut VecDeque<Fanout<S>>,
    conn: ConnId,
    stream: &WeakAddr<S>,
    stats: &Arc<Stats>,
) {
    for f in fanouts.iter_mut() {
        if f.owes(conn) {
            f.early.insert(conn);
            deliver_broadcast_to(stream, f, stats, None);
        }
    }
}

/// A stream leaves the table to catch up from `upto` (where its link was
/// lost): every broadcast still being handed out that it is owed is settled
/// now, out of turn, so that it never comes after the catch-up nor twice.
/// One at or before `upto` is not in the catch-up: it is handed now, ahead
/// of it. A later one is in the catch-up's replay (or its gap), so it is
/// not handed here, and leaves the books as the replay counts it.
fn settle_owed<S: StreamActor>(
    fanouts: &mut VecDeque<Fanout<S>>,
    conn: ConnId,
    stream: &WeakAddr<S>,
    stats: &Arc<Stats>,
    upto: u64,
) {
    for f in fanouts.iter_mut() {
        if f.owes(conn) {
            f.early.insert(conn);
            if f.event.is_none_or(|e| e <= upto) {
                deliver_broadcast_to(stream, f, stats, None);
            } else {
                stats.publish_backlog.fetch_sub(1, Relaxed);
                stats.messages_delivered.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// A stream waiting to be admitted (cluster mode: its id's SUBSCRIBE is
/// on its way).
struct Waiting<S: Actor> {
    conn: ConnId,
    addr: WeakAddr<S>,
    /// The event id it resumes after.
    since: Option<u64>,
    /// It carries event ids ([`LoginAt`]): in cluster mode its position
    /// comes from a read of the fleet's history.
    tracked: bool,
}

/// A stream whose read of the fleet's history is out (cluster mode).
struct Reading<S: Actor> {
    /// Which read.
    no: u64,
    /// This node's clock when the read began: where a stream that does not
    /// resume starts if the read fails.
    clock: u64,
    /// [`Router::link_epoch`] when the read began: a read that saw the
    /// pub/sub link go may have missed what came meanwhile.
    link_epoch: u64,
    stream: Waiting<S>,
    /// The id's messages (and broadcasts) that came while the read was
    /// out, in order: merged with what it finds by event id.
    buffered: Vec<KeptMessage>,
    /// A catch-up after a lost link ([`Router::catch_up`]) of a stream
    /// welcomed long before, not a new stream's first read.
    again: bool,
}

/// Routes messages to streams by id.
pub(crate) struct Router<S: StreamActor> {
    /// id -> its open streams. The key is the same `Arc` the stream holds.
    table: HashMap<Arc<str>, Streams<S>>,
    /// Total streams in `table`, for broadcast bookkeeping.
    streams: usize,
    /// Set by [`CloseAll`]: a stream that logs in afterwards is closed at once
    /// (its Login raced the shutdown).
    closing: bool,
    /// Where `messages.routed` and restarts are counted.
    stats: Arc<Stats>,
    /// `stream_joined` and `stream_left` (with `hooks.events_url`).
    webhooks: Option<Arc<Webhooks>>,
    /// The streams whose namespace sends `stream_joined` or `stream_left`,
    /// or `join` and `leave` ([`Joined`]). Empty unless one asks: nothing
    /// is kept for other streams.
    members: HashMap<ConnId, Kept<S>>,
    /// Per id of a namespace with `presence_events`: its streams' distinct
    /// token subjects here, with how many streams each.
    subjects: HashMap<Arc<str>, HashMap<Arc<str>, u32>>,
    /// This node's name, as `join` and `leave` carry it.
    node: Arc<str>,
    /// The engine: subscriptions, event ids, history, presence. Told when
    /// an id gets its first stream and loses its last one.
    broker: Arc<dyn Broker>,
    /// Every stream waits for its [`Welcome`] ([`Broker::streams_wait`]).
    streams_wait: bool,
    /// How often presence is written ([`Broker::presence_every`]).
    presence_every: Option<Duration>,
    /// Streams of ids whose subscription is on its way. They are not in
    /// `table` (no message reaches them) until [`Subscribed`] says so;
    /// then they get their [`Welcome`]. Empty at rest.
    awaiting: HashMap<Arc<str>, SmallVec<[Waiting<S>; 1]>>,
    /// The largest event id delivered here or told by the broker: up to
    /// it, this node had every message of its ids (where a catch-up starts
    /// after a lost link).
    clock: u64,
    /// Streams whose read of the history is out, by id. They are not in
    /// `table`; messages for them are buffered until the read is back.
    /// Empty at rest.
    reading: HashMap<Arc<str>, SmallVec<[Reading<S>; 1]>>,
    /// The last read's number.
    reads: u64,
    /// Ids whose count of streams here changed since this node last wrote
    /// its presence ([`Router::flush_presence`]). Empty at rest.
    presence_dirty: HashSet<Arc<str>>,
    /// The next presence write is this node's every held id (the broker
    /// lost them, or a write failed).
    presence_full: bool,
    /// The last presence write left ids with the broker: they should be
    /// there.
    presence_expected: bool,
    /// A presence write is out: the next beat waits for it (writes must
    /// not overtake each other).
    presence_flushing: bool,
    /// Streams that just joined the table after a read of the history
    /// that came later, and the id up to which they have had every
    /// message: one still on its way from the broker with an id at or
    /// below it is not handed to them again. An entry goes with the first
    /// message above it (the bus brings ids in order) or after
    /// [`FLOOR_TTL`]. Empty at rest.
    floors: HashMap<ConnId, (u64, Instant)>,
    /// The broker's link was lost at this event id (this node's clock
    /// then: it had every message of its ids up to it), and not every id
    /// has caught up since. `None` at rest.
    lost_at: Option<u64>,
    /// Ids whose streams may have missed messages while the link was down,
    /// until their subscription is confirmed on a new link and they catch
    /// up ([`Router::catch_up`]). Empty at rest.
    stale: HashMap<Arc<str>, u64>,
    /// Ids confirmed on the new link since it was lost: a stream of one
    /// may read the fleet's history. Empty at rest.
    recovered: HashSet<Arc<str>>,
    /// Times the link, or a part of it, was lost.
    link_epoch: u64,
    /// The whole link was lost (not only parts) since the last time every
    /// id caught up.
    whole_lost: bool,
    /// The parts of the link lost since then (a Redis Cluster's shards,
    /// [`Subscribed::PartDown`]), as tests of an id, each with where it had
    /// its ids' messages when it went. Empty at rest.
    lost_parts: Vec<(Part, u64)>,
    /// Broadcasts still being handed out, oldest first. Empty at rest.
    fanouts: VecDeque<Fanout<S>>,
    /// Broadcast deliveries handed out and not yet handled or dropped.
    window: Arc<InFlight>,
    /// A [`Router::pump`] is scheduled.
    pumping: bool,
    /// Long-poll clients between their polls, per id: when each one's
    /// linger ends (`stream.poll_linger_ms` after its answer). They count
    /// in the id's presence until then, or until a poll of the id takes
    /// the place back. Empty at rest.
    lingering: HashMap<Arc<str>, SmallVec<[Instant; 1]>>,
}

impl<S: StreamActor> Router<S> {
    /// An empty Router reporting into `stats`, on `broker`.
    pub(crate) fn new(stats: Arc<Stats>, broker: Arc<dyn Broker>) -> Self {
        Router {
            streams_wait: broker.streams_wait(),
            presence_every: broker.presence_every(),
            broker,
            clock: now_us(),
            reading: HashMap::new(),
            reads: 0,
            presence_dirty: HashSet::new(),
            presence_full: false,
            presence_expected: false,
            presence_flushing: false,
            floors: HashMap::new(),
            lost_at: None,
            stale: HashMap::new(),
            recovered: HashSet::new(),
            link_epoch: 0,
            whole_lost: false,
            lost_parts: Vec::new(),
            table: HashMap::new(),
            streams: 0,
            closing: false,
            stats,
            webhooks: None,
            members: HashMap::new(),
            subjects: HashMap::new(),
            node: Arc::from(""),
            awaiting: HashMap::new(),
            fanouts: VecDeque::new(),
            window: Arc::new(InFlight::new(FANOUT_WINDOW)),
            pumping: false,
            lingering: HashMap::new(),
        }
    }

    /// The same, sending `stream_joined` and `stream_left` with
    /// `webhooks` (`None`: none).
    pub(crate) fn with_webhooks(mut self, webhooks: Option<Arc<Webhooks>>) -> Self {
        self.webhooks = webhooks;
        self
    }

    /// The same, as node `node` (`join` and `leave` name it).
    pub(crate) fn with_node(mut self, node: &str) -> Self {
        self.node = Arc::from(node);
        self
    }

    /// The same with a broadcast window of `size` ([`fanout_window`]).
    pub(crate) fn with_window(mut self, size: usize) -> Self {
        self.window = Arc::new(InFlight::new(size.max(2)));
        self
    }

    /// Hands out broadcast deliveries while the window has room, oldest
    /// broadcast first; while any is left, again once the window is down to
    /// half of it (or after [`FANOUT_RECHECK`]).
    fn pump(&mut self, ctx: &mut Context<Self>) {
        self.pumping = false;
        while let Some(f) = self.fanouts.front_mut() {
            while f.next < f.targets.len() && self.window.in_flight.load(Relaxed) < self.window.size {
                let (conn, target) = &f.targets[f.next];
                f.next += 1;
                if !f.early.is_empty() && f.early.remove(conn) {
                    // Handed out of turn already.
                    continue;
                }
                deliver_broadcast_to(target, f, &self.stats, Some(&self.window));
            }
            if f.next < f.targets.len() {
                break;
            }
            self.fanouts.pop_front();
        }
        if self.fanouts.is_empty() && self.fanouts.capacity() > FANOUT_WINDOW {
            // A flood of broadcasts grew the queue; give it back.
            self.fanouts = VecDeque::new();
        }
        if !self.fanouts.is_empty() {
            self.pumping = true;
            let window = Arc::clone(&self.window);
            let refill = async move {
                let _ = tokio::time::timeout(FANOUT_RECHECK, window.refill.notified()).await;
            };
            ctx.spawn(actix::fut::wrap_future::<_, Self>(refill).map(|(), r, ctx| {
                guarded(r, ctx, Router::pump);
            }));
        }
    }

    /// Moves the awaiting streams of `id` into the table and welcomes them,
    /// each with what it resumes: what was sent while it waited is kept,
    /// so it is in the replay. A stream that carries event ids reads the
    /// history first ([`Router::start_read`]).
    fn admit(&mut self, id: &Arc<str>, ctx: &mut Context<Self>) {
        if let Some(waiting) = self.awaiting.remove(id) {
            for w in waiting {
                self.enter(Arc::clone(id), w, ctx);
            }
        }
    }

    /// A stream whose id is subscribed: into the table (with its welcome
    /// if it waits for one), or, one with event ids, first to the history.
    fn enter(&mut self, id: Arc<str>, w: Waiting<S>, ctx: &mut Context<Self>) {
        if w.tracked {
            if self.affected(&id) {
                // The link is down, or its id not subscribed again yet: a
                // read now could miss what comes before it is. It waits
                // for the id's confirmation on the new link (the broker
                // resubscribes every id waiting here).
                self.awaiting.entry(id).or_default().push(w);
                return;
            }
            self.start_read(id, w, ctx);
            return;
        }
        if self.streams_wait {
            // A plain stream shows no event ids: its welcome tells nothing
            // but that it may write its own.
            let here = Resume {
                position: self.clock,
                ..Resume::default()
            };
            send_if_alive(&w.addr, Welcome::new(here, &self.stats));
        }
        self.join(id, w.conn, w.addr);
    }

    /// Puts a stream into the table. While the link is down (or this id
    /// not subscribed again since), it will catch up with the rest.
    fn join(&mut self, id: Arc<str>, conn: ConnId, addr: WeakAddr<S>) {
        if self.affected(&id)
            && let Some(lost_at) = self.lost_at
        {
            let from = self.lost_from(&id, lost_at);
            self.mark_stale(&id, from);
        }
        self.table.entry(id).or_default().push((conn, addr));
        self.streams += 1;
    }

    /// Whether `id` is subscribed here: a stream of it is in the table or
    /// reading the fleet's history.
    fn subscribed(&self, id: &str) -> bool {
        self.table.contains_key(id) || self.reading.contains_key(id)
    }

    /// Reads the history for `w` (its id is subscribed, so every message
    /// after the read reaches this Router): "subscribe first, read, merge
    /// by id". A read answered at once welcomes it now. For one that comes
    /// later, messages of the id that come meanwhile are buffered
    /// ([`Router::buffer`]) and merged when it is back
    /// ([`Router::finish_read`]).
    fn start_read(&mut self, id: Arc<str>, w: Waiting<S>, ctx: &mut Context<Self>) {
        let read = match self.broker.read(&id, w.since) {
            Read::Now(read) => {
                let (resume, cause) = fleet_resume(read, w.since);
                self.count_gap(cause);
                send_if_alive(&w.addr, Welcome::new(resume, &self.stats));
                self.join(id, w.conn, w.addr);
                return;
            }
            Read::Later(read) => read,
        };
        self.reads += 1;
        let no = self.reads;
        let (clock, link_epoch) = (self.clock, self.link_epoch);
        self.reading.entry(Arc::clone(&id)).or_default().push(Reading {
            no,
            clock,
            link_epoch,
            stream: w,
            buffered: Vec::new(),
            again: false,
        });
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(read).map(move |r, router, ctx| {
                guarded(router, ctx, |router, ctx| router.finish_read(&id, no, r, ctx));
            }),
        );
    }

    /// A read of the fleet's history is back (`None`: it failed): the
    /// stream gets its welcome with what it missed, then what came while
    /// the read was out and after what it found, and joins the table. A
    /// failed read is a gap from where the stream was, never a silent hole.
    fn finish_read(&mut self, id: &Arc<str>, no: u64, read: Option<FleetRead>, ctx: &mut Context<Self>) {
        let Some(readers) = self.reading.get_mut(id) else {
            return;
        };
        let Some(at) = readers.iter().position(|r| r.no == no) else {
            // It logged out meanwhile.
            return;
        };
        let Reading {
            stream,
            buffered,
            clock,
            link_epoch,
            ..
        } = readers.remove(at);
        if readers.is_empty() {
            self.reading.remove(id);
        }
        if link_epoch != self.link_epoch {
            // The link went while the read was out: what came after the
            // read and before the id was subscribed again is in no buffer.
            // Read again once it is.
            self.retry_read(Arc::clone(id), stream, ctx);
            return;
        }
        let (resumed, upto) = match read {
            Some(read) => {
                let clock = read.clock;
                (fleet_resume(read, stream.since), clock)
            }
            // A gap after the client's position (it continues with what
            // came while the read was out); a new stream starts where this
            // node's clock was when the read began.
            None => {
                let position = stream.since.unwrap_or(clock);
                (failed_read(stream.since, position), position)
            }
        };
        self.hand_over(id, stream, resumed, upto, buffered, false);
    }

    /// A stream whose read is back: it gets `resumed` (what the fleet kept
    /// after its position, less what it had by its floor; any gap), then
    /// what came live while the read was out, after `upto` (the fleet's
    /// clock at the read); and it is in the table, guarded by a new floor
    /// from a message it had. `again`: a catch-up of a stream welcomed long
    /// ago ([`Welcome::again`], sent only if there is something to tell).
    fn hand_over(
        &mut self,
        id: &Arc<str>,
        stream: Waiting<S>,
        (mut resume, cause): (Resume, Option<GapCause>),
        upto: u64,
        buffered: Vec<KeptMessage>,
        again: bool,
    ) {
        let prior_floor = self.floors.get(&stream.conn).map_or(0, |(floor, _)| *floor);
        resume.replay.retain(|(ev, _)| *ev > prior_floor);
        let after = upto
            .max(prior_floor)
            .max(resume.replay.last().map_or(0, |(ev, _)| *ev));
        resume
            .replay
            .extend(buffered.into_iter().filter(|(ev, _)| *ev > after));
        let floor = resume.replay.last().map_or(after, |(ev, _)| (*ev).max(after));
        if let Some(gap) = &mut resume.gap
            && gap.next.is_none()
        {
            gap.next = resume.replay.first().map(|(ev, _)| *ev);
        }
        self.count_gap(cause);
        if !again {
            send_if_alive(&stream.addr, Welcome::new(resume, &self.stats));
        } else if !resume.replay.is_empty() || resume.gap.is_some() {
            send_if_alive(&stream.addr, Welcome::again(resume, &self.stats));
        }
        self.floors.insert(stream.conn, (floor, Instant::now()));
        self.join(Arc::clone(id), stream.conn, stream.addr);
    }

    /// A stream whose read saw the link go: it reads again, at once if its
    /// id is subscribed on the new link, or once it is.
    fn retry_read(&mut self, id: Arc<str>, w: Waiting<S>, ctx: &mut Context<Self>) {
        if !self.affected(&id) {
            self.start_read(id, w, ctx);
        } else {
            self.awaiting.entry(id).or_default().push(w);
        }
    }

    /// The link was lost (`part`: only the part of it that carries the
    /// ids `part` holds, and where it had their messages): remember where
    /// (the whole link: this node had every message of its ids up to its
    /// clock), and which ids will catch up.
    fn link_lost(&mut self, part: Option<(Part, u64)>) {
        self.link_epoch += 1;
        let lost_at = *self.lost_at.get_or_insert(self.clock);
        let ids: Vec<Arc<str>> = self.table.keys().cloned().collect();
        match part {
            None => {
                self.whole_lost = true;
                self.recovered.clear();
                for id in &ids {
                    self.mark_stale(id, lost_at);
                }
            }
            Some((part, at)) => {
                self.recovered.retain(|id| !part.holds(id));
                for id in ids.iter().filter(|id| part.holds(id)) {
                    self.mark_stale(id, at);
                }
                self.lost_parts.push((part, at));
            }
        }
    }

    /// `id`'s streams may have missed its messages after `from`: they
    /// catch up from there, or from an earlier point already noted (each
    /// id keeps its own, so a part that went twice, or a part that came
    /// back while another is down, never moves an id's point).
    fn mark_stale(&mut self, id: &Arc<str>, from: u64) {
        self.stale
            .entry(Arc::clone(id))
            .and_modify(|at| *at = (*at).min(from))
            .or_insert(from);
    }

    /// Whether `id`'s messages may be missing here: its part of the link
    /// was lost and it is not confirmed on a new one yet.
    fn affected(&self, id: &str) -> bool {
        self.lost_at.is_some()
            && !self.recovered.contains(id)
            && (self.whole_lost || self.lost_parts.iter().any(|(part, _)| part.holds(id)))
    }

    /// Where `id` catches up from: where its part of the link had its
    /// messages when it went (the lowest, if it went more than once), or
    /// `lost_at`, where the whole link went.
    fn lost_from(&self, id: &str, lost_at: u64) -> u64 {
        let parts = self
            .lost_parts
            .iter()
            .filter(|(part, _)| part.holds(id))
            .map(|(_, at)| *at)
            .min();
        match (self.whole_lost, parts) {
            (true, Some(at)) => at.min(lost_at),
            (false, Some(at)) => at,
            (_, None) => lost_at,
        }
    }

    /// `ids` are subscribed on a new link: those of them whose streams may
    /// have missed messages while it was down catch up from the fleet's
    /// history, one read per batch. Their streams leave the table
    /// meanwhile (what comes live is buffered, as for a read) and come
    /// back with a [`Welcome::again`]: what they missed, and any gap.
    fn catch_up(&mut self, ids: &[Arc<str>], ctx: &mut Context<Self>) {
        if self.lost_at.is_none() {
            return;
        }
        // By where each catches up from (its own point, see
        // `Router::mark_stale`): one read per position and batch.
        let mut batches: BTreeMap<u64, Batch<S>> = BTreeMap::new();
        for id in ids {
            self.recovered.insert(Arc::clone(id));
            if let Some(from) = self.stale.remove(id)
                && let Some(streams) = self.table.remove(id)
            {
                self.streams -= streams.len();
                batches.entry(from).or_default().push((Arc::clone(id), streams));
            }
        }
        if self.stale.is_empty() {
            // Every id caught up, or is catching up now.
            self.lost_at = None;
            self.recovered = HashSet::new();
            self.stale = HashMap::new();
            self.whole_lost = false;
            self.lost_parts = Vec::new();
        }
        for (from, batch) in batches {
            self.read_again(batch, from, ctx);
        }
    }

    /// Reads the fleet's history since `lost_at` for `batch`'s streams
    /// (out of the table, long welcomed), one read per
    /// [`CATCH_UP_BATCH`] ids; [`Router::caught_up`] hands it over.
    fn read_again(&mut self, mut batch: Vec<(Arc<str>, Streams<S>)>, lost_at: u64, ctx: &mut Context<Self>) {
        for chunk in batch.chunks_mut(CATCH_UP_BATCH) {
            self.reads += 1;
            let no = self.reads;
            let mut ids = Vec::with_capacity(chunk.len());
            for (id, streams) in chunk {
                ids.push(Arc::clone(id));
                let readers = self.reading.entry(Arc::clone(id)).or_default();
                for (conn, addr) in std::mem::take(streams) {
                    if !self.fanouts.is_empty() {
                        settle_owed(&mut self.fanouts, conn, &addr, &self.stats, lost_at);
                    }
                    readers.push(Reading {
                        no,
                        clock: lost_at,
                        link_epoch: self.link_epoch,
                        stream: Waiting {
                            conn,
                            addr,
                            since: Some(lost_at),
                            tracked: true,
                        },
                        buffered: Vec::new(),
                        again: true,
                    });
                }
            }
            let read = self.broker.catch_up(ids.clone(), lost_at);
            ctx.spawn(
                actix::fut::wrap_future::<_, Self>(read).map(move |r, router, ctx| {
                    guarded(router, ctx, |router, ctx| {
                        router.caught_up(&ids, no, lost_at, r, ctx)
                    });
                }),
            );
        }
    }

    /// A catch-up read is back (`None`: it failed): each stream of its ids
    /// gets what it missed since `lost_at` (less what it had, by its
    /// floor), any gap, and what came while the read was out, and is back
    /// in the table. If the link went again meanwhile, they go back to the
    /// table as stale, to catch up from the older point.
    fn caught_up(
        &mut self,
        ids: &[Arc<str>],
        no: u64,
        lost_at: u64,
        read: Option<CaughtUp>,
        ctx: &mut Context<Self>,
    ) {
        // Streams whose read saw another part of the link go: theirs is up,
        // so they read again at once.
        let mut again: Vec<(Arc<str>, Streams<S>)> = Vec::new();
        let (fleet, kept, clocks) = match read {
            Some(c) => (
                Some((c.clock, c.epoch, c.broadcasts)),
                c.ids.into_iter().map(Some).collect(),
                c.clocks,
            ),
            None => (None, vec![None; ids.len()], Vec::new()),
        };
        for (i, (id, kept)) in ids.iter().zip(kept).enumerate() {
            let Some(readers) = self.reading.get_mut(id) else {
                continue;
            };
            let mine: SmallVec<[Reading<S>; 1]> = {
                let (mine, rest) = std::mem::take(readers).into_iter().partition(|r| r.no == no);
                *readers = rest;
                mine
            };
            if readers.is_empty() {
                self.reading.remove(id);
            }
            for r in mine {
                if r.link_epoch != self.link_epoch && !self.affected(id) {
                    match again.last_mut() {
                        Some((last, streams)) if last == id => streams.push((r.stream.conn, r.stream.addr)),
                        _ => again.push((
                            Arc::clone(id),
                            smallvec::smallvec![(r.stream.conn, r.stream.addr)],
                        )),
                    }
                    continue;
                }
                if r.link_epoch != self.link_epoch {
                    self.lost_at = Some(self.lost_at.map_or(lost_at, |at| at.min(lost_at)));
                    self.mark_stale(id, lost_at);
                    self.table
                        .entry(Arc::clone(id))
                        .or_default()
                        .push((r.stream.conn, r.stream.addr));
                    self.streams += 1;
                    continue;
                }
                // Live messages after the link came back all have ids above
                // `lost_at`: a failed read leaves them all.
                let (resumed, upto) = match (&fleet, &kept) {
                    (Some((clock, epoch, broadcasts)), Some(id_kept)) => {
                        // A broker whose ids come over several links: each
                        // id's own clock.
                        let clock = clocks.get(i).copied().unwrap_or(*clock);
                        let read = FleetRead {
                            clock,
                            epoch: *epoch,
                            id: id_kept.clone(),
                            broadcasts: broadcasts.clone(),
                        };
                        (fleet_resume(read, Some(lost_at)), clock)
                    }
                    _ => (failed_read(Some(lost_at), lost_at), lost_at),
                };
                self.hand_over(id, r.stream, resumed, upto, r.buffered, true);
            }
        }
        if !again.is_empty() {
            self.read_again(again, lost_at, ctx);
        }
    }

    /// Whether `conn`, which joined after a read, had message `event`
    /// already; a message above its floor ends the guard.
    fn already_had(floors: &mut HashMap<ConnId, (u64, Instant)>, conn: ConnId, event: Option<u64>) -> bool {
        let (Some(event), Some((floor, _))) = (event, floors.get(&conn)) else {
            return false;
        };
        if event <= *floor {
            return true;
        }
        floors.remove(&conn);
        false
    }

    /// Keeps a message of `id` for the streams of it whose read is out.
    fn buffer(&mut self, id: &str, event: u64, msg: &Arc<str>) {
        if let Some(readers) = self.reading.get_mut(id) {
            for r in readers {
                r.buffered.push((event, Arc::clone(msg)));
            }
        }
    }

    /// How many streams of `id` this node has (open: in the table, reading
    /// the fleet's history, or waiting for the id's subscription).
    fn count(&self, id: &str) -> usize {
        self.table.get(id).map_or(0, SmallVec::len)
            + self.reading.get(id).map_or(0, SmallVec::len)
            + self.awaiting.get(id).map_or(0, SmallVec::len)
    }

    /// `id`'s presence here: its streams, and its long-poll clients
    /// between two polls ([`Router::linger`]).
    fn present(&self, id: &str) -> usize {
        self.count(id) + self.lingering.get(id).map_or(0, SmallVec::len)
    }

    /// A long-poll of `id` answered: its client counts in presence for
    /// `linger` more, unless it polls again first.
    fn linger(&mut self, id: Arc<str>, linger: Duration) {
        self.lingering
            .entry(id)
            .or_default()
            .push(Instant::now() + linger);
    }

    /// Lingering clients whose time is up leave presence. Run every
    /// [`LINGER_SWEEP`] from `started` (so a restarted Router keeps
    /// sweeping what it held: timers of its own would go with the crash).
    fn sweep_lingering(&mut self) {
        if self.lingering.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut left = Vec::new();
        self.lingering.retain(|id, until| {
            let before = until.len();
            until.retain(|t| *t > now);
            if until.len() != before {
                left.push(Arc::clone(id));
            }
            !until.is_empty()
        });
        shrink_if_sparse(&mut self.lingering);
        for id in &left {
            self.presence_changed(id);
        }
    }

    /// A long-poll of `id` logged in: the client that lingers longest
    /// takes its place back (it is not counted twice).
    fn unlinger(&mut self, id: &str) {
        if let Some(until) = self.lingering.get_mut(id) {
            until.remove(0);
            if until.is_empty() {
                self.lingering.remove(id);
            }
        }
    }

    /// `id`'s count of streams here changed; a broker that keeps presence
    /// hears of it at the next write, with every other change since.
    fn presence_changed(&mut self, id: &Arc<str>) {
        if self.presence_every.is_some() && !self.presence_dirty.contains(id) {
            self.presence_dirty.insert(Arc::clone(id));
        }
    }

    /// Writes this node's presence as often as the broker asks.
    fn every_heartbeat(&mut self, ctx: &mut Context<Self>) {
        if let Some(beat) = self.presence_every {
            ctx.run_interval(beat, |r, ctx| {
                guarded(r, ctx, Router::flush_presence).unwrap_or(())
            });
        }
    }

    /// Writes the counts of the ids that changed since the last write (all
    /// held ids if the broker lost them) to the broker, in one batch. A
    /// failed write is tried again at the next beat.
    fn flush_presence(&mut self, ctx: &mut Context<Self>) {
        if self.presence_flushing {
            return;
        }
        let full = std::mem::take(&mut self.presence_full);
        let ids: Vec<Arc<str>> = if full {
            self.presence_dirty.clear();
            self.table
                .keys()
                .chain(self.reading.keys())
                .chain(self.awaiting.keys())
                .chain(self.lingering.keys())
                .cloned()
                .collect::<HashSet<_>>()
                .into_iter()
                .collect()
        } else {
            self.presence_dirty.drain().collect()
        };
        if self.presence_dirty.capacity() > 1024 {
            self.presence_dirty.shrink_to_fit();
        }
        let counts: Counts = ids
            .into_iter()
            .map(|id| HeldCount {
                streams: self.present(&id),
                subjects: self.subjects.get(&id).map(|_| {
                    let subjects = self.subjects_of(&id);
                    let subjects: Vec<&str> = subjects.iter().map(|s| &**s).collect();
                    serde_json::to_string(&subjects)
                        .expect("strings serialize")
                        .into_boxed_str()
                }),
                id,
            })
            .collect();
        let expected = self.presence_expected;
        let write = self.broker.write_presence(Arc::clone(&counts), full);
        // The next beat waits for this write: writes must not overtake
        // each other (a restart drops the write and clears the flag).
        self.presence_flushing = true;
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(write).map(move |r, router, _| {
                router.presence_flushing = false;
                match r {
                    Ok(existed) => {
                        // Gone though it should be there: Redis lost it (a
                        // restart, FLUSHALL, a failover) or it expired while
                        // this node could not write. Everything again.
                        router.presence_full |= !existed && expected && !full;
                        router.presence_expected = !router.table.is_empty()
                            || !router.reading.is_empty()
                            || !router.awaiting.is_empty()
                            || !router.lingering.is_empty();
                    }
                    Err(()) if full => router.presence_full = true,
                    Err(()) => router
                        .presence_dirty
                        .extend(counts.iter().map(|c| Arc::clone(&c.id))),
                }
            }),
        );
    }

    /// Counts a gap told by its cause.
    fn count_gap(&self, cause: Option<GapCause>) {
        let s = &self.stats;
        match cause {
            None => return,
            Some(GapCause::Trimmed) => &s.gaps_trimmed,
            Some(GapCause::Epoch) => &s.gaps_epoch,
            Some(GapCause::Unknown) => &s.gaps_unknown,
            Some(GapCause::ReadFailed) => &s.gaps_read_failed,
        }
        .fetch_add(1, Relaxed);
    }

    /// Takes note of `event`, delivered here or told by the broker, and
    /// returns it: the clock then says this node had every message of its
    /// ids up to it. (The bus refuses ids far ahead of this node's clock,
    /// so one cannot push it out of reach.)
    fn witness(&mut self, event: u64) -> u64 {
        self.clock = self.clock.max(event);
        event
    }
}

/// The Router's mailbox bound: none (0). With actix's default of 16, a
/// sender past it is parked and its next `send` waits outside the mailbox
/// while `do_send`s go in: the bus's own echoes (`send`, for their answer)
/// then fell behind other nodes' later messages of the same id
/// (`do_send`), and this node's streams saw the fleet's messages in another
/// order (the Bus's test `own_echoes_keep_their_place_behind_a_full_router_
/// mailbox`). The bound held back only `send`s, which each hold their own
/// message until answered (a publisher's request, an echo's task); the
/// `do_send`s of streams and of other nodes' messages never respected it.
pub(crate) const MAILBOX_CAPACITY: usize = 0;

impl<S: StreamActor> Actor for Router<S> {
    type Context = Context<Self>;

    /// Also runs after a restart: broadcasts still being handed out go on
    /// (the scheduled [`Router::pump`] went with the old context).
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
        if !self.fanouts.is_empty() {
            self.pump(ctx);
        }
        if let Some(every) = self.broker.upkeep_every() {
            ctx.run_interval(every, |r, ctx| {
                guarded(r, ctx, |r, _| r.broker.upkeep());
            });
        }
        ctx.run_interval(LINGER_SWEEP, |r, ctx| {
            guarded(r, ctx, |r, _| r.sweep_lingering());
        });
        ctx.run_interval(FLOOR_TTL, |r, ctx| {
            guarded(r, ctx, |r, _| {
                r.floors.retain(|_, (_, since)| since.elapsed() < FLOOR_TTL);
                shrink_if_sparse(&mut r.floors);
            });
        });
        self.every_heartbeat(ctx);
    }
}

impl<S: StreamActor> Supervised for Router<S> {
    /// After a crash: count it and drop streams that died meanwhile (their
    /// Logout may have been the message that was lost).
    fn restarting(&mut self, ctx: &mut Context<Self>) {
        self.stats.router_restarts.fetch_add(1, Relaxed);
        self.pumping = false;
        let broker = Arc::clone(&self.broker);
        // Readers that died meanwhile go too (their Logout may be the
        // message lost); an id left with none is released below unless
        // the table or a waiting stream still needs it.
        let alive = |addr: &WeakAddr<S>| addr.upgrade().is_some_and(|a| a.connected());
        let mut unread = Vec::new();
        self.reading.retain(|id, readers| {
            readers.retain(|r| alive(&r.stream.addr));
            if readers.is_empty() {
                unread.push(Arc::clone(id));
            }
            !readers.is_empty()
        });
        let (reading, awaiting) = (&self.reading, &self.awaiting);
        self.table.retain(|id, streams| {
            streams.retain(|(_, stream)| stream.upgrade().is_some_and(|a| a.connected()));
            let keep = !streams.is_empty();
            // An id whose other streams are reading its history or waiting
            // for its subscription stays subscribed.
            if !keep && !reading.contains_key(id) && !awaiting.contains_key(id) {
                broker.unsubscribe(Arc::clone(id));
            }
            keep
        });
        for id in unread {
            if !self.table.contains_key(&id) && !self.awaiting.contains_key(&id) {
                self.broker.unsubscribe(id);
            }
        }
        self.streams = self.table.values().map(SmallVec::len).sum();
        // Members whose stream died meanwhile (its Logout may be the
        // message lost) have left; one whose Login is still on its way is
        // alive.
        let gone: Vec<ConnId> = self
            .members
            .iter()
            .filter(|(_, (_, _, addr))| !addr.upgrade().is_some_and(|a| a.connected()))
            .map(|(conn, _)| *conn)
            .collect();
        for conn in gone {
            self.member_left(&conn);
        }
        // A Subscribed lost with the crash must not leave streams waiting:
        // the bus confirms their ids again (a stream must not read the
        // fleet's history before its id is subscribed). Reads of the
        // fleet's history went with the old context: read again (what
        // they buffered is in what the new reads find). Presence writes
        // went too: all of it again.
        let waiting: Vec<Arc<str>> = self.awaiting.keys().cloned().collect();
        for id in &waiting {
            if self.broker.confirm(Arc::clone(id)) == Subscription::Live {
                self.admit(id, ctx);
            }
        }
        self.presence_full = self.presence_every.is_some();
        self.presence_flushing = false;
        // A catch-up is read again from where its own link was lost, as
        // a catch-up (its stream had its welcome long since).
        for (id, readers) in std::mem::take(&mut self.reading) {
            for r in readers {
                if r.again {
                    let stream = (r.stream.conn, r.stream.addr);
                    self.read_again(vec![(Arc::clone(&id), smallvec::smallvec![stream])], r.clock, ctx);
                } else {
                    self.start_read(Arc::clone(&id), r.stream, ctx);
                }
            }
        }
        tracing::warn!(
            event = "restart",
            actor = "router",
            streams = self.streams,
            "router restarted; registrations kept"
        );
    }
}

/// A stream has started and wants the messages for `id`.
pub(crate) struct Login<S: Actor> {
    /// The stream id.
    pub(crate) id: Arc<str>,
    /// Which connection (an id may have several).
    pub(crate) conn: ConnId,
    /// Where to deliver.
    pub(crate) addr: WeakAddr<S>,
}

impl<S: Actor> Message for Login<S> {
    type Result = ();
}

/// A [`Login`] of a stream that carries event ids (SSE, WebSocket,
/// `?ids=1`) or resumes: it gets a [`Welcome`] with its position (and what
/// it missed) in single mode too. A message of its own, so that the Login
/// of every plain stream stays as small as it was (its envelope is one
/// more short-lived allocation per stream).
pub(crate) struct LoginAt<S: Actor> {
    /// The login.
    pub(crate) login: Login<S>,
    /// Resume after this event id (`None`: start at the last one).
    pub(crate) since: Option<u64>,
    /// A long-poll: it takes back the place of one of its id's lingering
    /// clients ([`Logout::linger`]).
    pub(crate) poll: bool,
}

impl<S: Actor> Message for LoginAt<S> {
    type Result = ();
}

/// A stream of a namespace that sends `stream_joined` or `stream_left`
/// opened, with its token's `sub`. Sent as the stream is made, before its
/// [`Login`] and long before its [`Logout`] (from the same thread, so the
/// Router gets them in that order); only such streams send it.
pub(crate) struct Joined<S: Actor> {
    /// Its connection.
    pub(crate) conn: ConnId,
    /// Its id (the stream's own).
    pub(crate) id: Arc<str>,
    /// What the Router keeps of it, as the admission decided it.
    pub(crate) member: Box<Member>,
    /// The stream: after a Router restart, a member whose stream is gone
    /// has left (one whose Login is still on its way has not).
    pub(crate) addr: WeakAddr<S>,
}

impl<S: Actor> Message for Joined<S> {
    type Result = ();
}

/// A member stream as the Router keeps it: its id, what it asked for, and
/// the stream.
type Kept<S> = (Arc<str>, Box<Member>, WeakAddr<S>);

/// A stream the Router keeps ([`Joined`]): decided at admission (the
/// stream's `Open`), handed to the Router as the stream is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Its token's `sub`.
    pub(crate) sub: Option<Arc<str>>,
    /// Its namespace sends `stream_joined` and `stream_left`.
    pub(crate) webhooks: bool,
    /// Its namespace sends `join` and `leave` (`presence_events`).
    pub(crate) presence: bool,
}

impl<S: StreamActor> Handler<Joined<S>> for Router<S> {
    type Result = ();

    fn handle(
        &mut self,
        Joined {
            conn,
            id,
            mut member,
            addr,
        }: Joined<S>,
        ctx: &mut Context<Self>,
    ) {
        guarded(self, ctx, |r, _| {
            member.webhooks &= r.webhooks.is_some();
            if member.webhooks
                && let Some(webhooks) = &r.webhooks
            {
                webhooks.emit(Name::StreamJoined, &id, None, member.sub.clone());
            }
            if member.presence {
                r.note(&id, NoteKind::Join, member.sub.as_ref());
                if let Some(sub) = &member.sub {
                    let subjects = r.subjects.entry(Arc::clone(&id)).or_default();
                    *subjects.entry(Arc::clone(sub)).or_insert(0) += 1;
                    r.presence_changed(&id);
                }
            }
            if member.webhooks || member.presence {
                r.members.insert(conn, (id, member, addr));
            }
        });
    }
}

impl<S: StreamActor> Handler<NoteFor> for Router<S> {
    type Result = ();

    /// Another node's `join` or `leave`: to this node's streams of the id.
    fn handle(&mut self, m: NoteFor, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, _| {
            r.stats.notes_received.fetch_add(1, Relaxed);
            r.note_here(&m.id, &m.note);
        });
    }
}

/// This node's distinct subjects of an id with `presence_events` (at most
/// [`MAX_SUBJECTS`], sorted; `None` if the Router crashed).
#[derive(Message)]
#[rtype(result = "Option<Vec<Arc<str>>>")]
pub(crate) struct Subjects {
    pub(crate) id: String,
}

impl<S: StreamActor> Handler<Subjects> for Router<S> {
    type Result = Option<Vec<Arc<str>>>;

    fn handle(&mut self, Subjects { id }: Subjects, ctx: &mut Context<Self>) -> Self::Result {
        guarded(self, ctx, |r, _| r.subjects_of(&id))
    }
}

impl<S: StreamActor> Router<S> {
    /// A member stream's connection is gone: `stream_left`, and `leave`.
    fn member_left(&mut self, conn: &ConnId) {
        let Some((id, member, _)) = self.members.remove(conn) else {
            return;
        };
        shrink_if_sparse(&mut self.members);
        if member.webhooks
            && let Some(webhooks) = &self.webhooks
        {
            webhooks.emit(Name::StreamLeft, &id, None, member.sub.clone());
        }
        if member.presence {
            self.note(&id, NoteKind::Leave, member.sub.as_ref());
            if let Some(sub) = &member.sub
                && let Some(subjects) = self.subjects.get_mut(&id)
            {
                if let Some(n) = subjects.get_mut(sub) {
                    *n -= 1;
                    if *n == 0 {
                        subjects.remove(sub);
                    }
                }
                if subjects.is_empty() {
                    self.subjects.remove(&id);
                    shrink_if_sparse(&mut self.subjects);
                }
                self.presence_changed(&id);
            }
        }
    }

    /// `join` or `leave` of a stream of `id` with `sub`: to this node's
    /// streams of it, and through the broker to the other nodes'.
    fn note(&self, id: &Arc<str>, kind: NoteKind, sub: Option<&Arc<str>>) {
        // `{"sub", "node"}`, in that order (a map would sort them).
        let quoted = |s: &str| serde_json::Value::from(s).to_string();
        let json = match sub {
            Some(sub) => format!(r#"{{"sub":{},"node":{}}}"#, quoted(sub), quoted(&self.node)),
            None => format!(r#"{{"node":{}}}"#, quoted(&self.node)),
        };
        let note = Note {
            kind,
            json: Arc::from(json),
        };
        self.stats.notes_sent.fetch_add(1, Relaxed);
        self.note_here(id, &note);
        self.broker.notify(id, &note);
    }

    /// `note` to this node's streams of `id`.
    fn note_here(&self, id: &str, note: &Note) {
        if let Some(streams) = self.table.get(id) {
            for (_, stream) in streams {
                send_if_alive(stream, note.clone());
            }
        }
    }

    /// This node's distinct subjects of `id`, sorted, at most
    /// [`MAX_SUBJECTS`].
    fn subjects_of(&self, id: &str) -> Vec<Arc<str>> {
        let mut subjects: Vec<Arc<str>> = self
            .subjects
            .get(id)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        subjects.sort();
        subjects.truncate(MAX_SUBJECTS);
        subjects
    }
}

/// A stream has stopped.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Logout {
    /// The stream id it logged in with.
    pub(crate) id: Arc<str>,
    /// The connection that ended.
    pub(crate) conn: ConnId,
    /// A long-poll that gave its answer: its client still counts in the
    /// id's presence this long (`stream.poll_linger_ms`).
    pub(crate) linger: Option<Duration>,
}

/// The publish backlog is full: the message was not taken (nothing of it
/// was delivered or kept); try again once streams have taken theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy;

/// Publish `msg` to every stream of `id`. Answers how many streams it was
/// handed to and its event id, or [`Busy`] (`None` if the Router crashed
/// handling it).
#[derive(Message)]
#[rtype(result = "Option<Result<Published, Busy>>")]
pub(crate) struct Publish {
    /// Target id.
    pub(crate) id: String,
    /// One line of text, already validated.
    pub(crate) msg: Arc<str>,
    /// Its event id: `None` for a message accepted on this node (the
    /// Router mints it); the id its node minted for a message from the
    /// cluster bus (the fleet gave it): delivered as it is, never minted
    /// again.
    pub(crate) event: Option<u64>,
    /// When this node accepted it: its body read, or its arrival from the
    /// cluster bus.
    pub(crate) accepted: Instant,
    /// `publish.max_backlog` for a publisher on this node; `None` for a
    /// message from the cluster bus, which is always taken (its own node
    /// applied the bound, and refusing it here would lose it).
    pub(crate) limit: Option<u64>,
}

/// What became of a [`Publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Published {
    /// Streams it was handed to.
    pub(crate) delivered: usize,
    /// Its event id (`None`: a message of this node alone in cluster mode,
    /// while the bus is down).
    pub(crate) event: Option<u64>,
}

/// Deliver `msg` to every stream. Answers how many, or [`Busy`].
#[derive(Message)]
#[rtype(result = "Option<Result<usize, Busy>>")]
pub(crate) struct Broadcast {
    /// One line of text, already validated.
    pub(crate) msg: Arc<str>,
    /// Its event id in cluster mode, given by the fleet; `None` in a
    /// single process and while the bus is down.
    pub(crate) event: Option<u64>,
    /// When this node accepted it (as [`Publish::accepted`]).
    pub(crate) accepted: Instant,
    /// As [`Publish::limit`].
    pub(crate) limit: Option<u64>,
    /// Only the ids of this part (a Redis Cluster: the ids of the shard
    /// whose link brought this copy); `None`: every id.
    pub(crate) part: Option<Part>,
}

/// Tell every stream to end (server shutdown). Answers how many were told.
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub(crate) struct CloseAll;

/// Fault injection: the stream drops its connection at once, with no
/// final chunk or close frame, as a crash or a network failure would.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub(crate) struct Cut {
    /// The stream panics in its handler instead: what a bug there does.
    pub(crate) panic: bool,
}

/// Fault injection: cut every stream of `id`. Answers how many.
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub(crate) struct CutId {
    /// The stream id.
    pub(crate) id: String,
    /// How ([`Cut::panic`]).
    pub(crate) panic: bool,
}

impl<S: StreamActor> Handler<CutId> for Router<S> {
    type Result = Option<usize>;

    fn handle(&mut self, CutId { id, panic }: CutId, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(self, ctx, |r, _| {
            let streams = r.table.get(id.as_str()).map_or(&[][..], |s| &s[..]);
            for (_, stream) in streams {
                send_if_alive(stream, Cut { panic });
            }
            streams.len()
        })
    }
}

/// From the cluster bus: these ids are subscribed now, or its link is down
/// and nothing can be subscribed for the moment.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) enum Subscribed {
    /// SUBSCRIBE confirmed for these ids.
    Ids(Vec<Arc<str>>),
    /// The link to Redis is down: welcome every plain stream still
    /// waiting, as waiting for a SUBSCRIBE would gain them nothing (their
    /// messages from this node reach them; the others' once the link is
    /// back, when the streams held here catch up on what they missed).
    /// Streams with event ids wait for their id on the new link.
    LinkDown,
    /// No link: these ids will be subscribed with the next one. Their
    /// plain streams are welcomed.
    NoLink(Vec<Arc<str>>),
    /// The fleet's clock as a link came up: this node's clock goes at
    /// least that far, so where it says it lost a link is not before the
    /// fleet's epoch (nothing before it can be missing here).
    Clock(u64),
    /// A part of the link is down (a Redis Cluster's link to one shard),
    /// having had its ids' messages up to the event id given: as
    /// [`Subscribed::LinkDown`], for the ids `part` holds only; the others'
    /// messages still come.
    PartDown(Part, u64),
}

/// A part of the broker's link, as a test of whether it carries an id.
#[derive(Clone)]
pub(crate) struct Part(pub(crate) Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl Part {
    /// Whether this part carries `id`'s messages.
    fn holds(&self, id: &str) -> bool {
        (self.0)(id)
    }
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Part")
    }
}

impl<S: StreamActor> Handler<Subscribed> for Router<S> {
    type Result = ();

    fn handle(&mut self, m: Subscribed, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, ctx| match m {
            Subscribed::Ids(ids) => {
                if r.lost_at.is_some() {
                    for id in &ids {
                        r.recovered.insert(Arc::clone(id));
                    }
                }
                if !r.awaiting.is_empty() {
                    for id in &ids {
                        r.admit(id, ctx);
                    }
                }
                if r.lost_at.is_some() {
                    r.catch_up(&ids, ctx);
                }
            }
            Subscribed::NoLink(ids) => {
                // Plain streams need not wait for a link; streams with
                // event ids do (see `Router::enter`).
                for id in &ids {
                    r.admit(id, ctx);
                }
            }
            Subscribed::Clock(event) => {
                r.witness(event);
            }
            Subscribed::LinkDown => {
                r.link_lost(None);
                let ids: Vec<Arc<str>> = r.awaiting.keys().cloned().collect();
                for id in &ids {
                    r.admit(id, ctx);
                }
            }
            Subscribed::PartDown(part, at) => {
                let ids: Vec<Arc<str>> = r.awaiting.keys().filter(|id| part.holds(id)).cloned().collect();
                r.link_lost(Some((part, at)));
                for id in &ids {
                    r.admit(id, ctx);
                }
            }
        });
    }
}

/// Every id with a stream on this node (the bus resubscribes them).
#[derive(Message)]
#[rtype(result = "Vec<Arc<str>>")]
pub(crate) struct HeldIds;

/// How many streams of `id` this node has open (in the table, reading
/// the fleet's history or waiting for the id's subscription): for
/// `/presence`, and whether this node is among a PUBLISH's receivers.
/// Answers `None` if the Router crashed.
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub(crate) struct Count {
    /// The id.
    pub(crate) id: String,
    /// Presence: long-poll clients between their polls count too.
    pub(crate) present: bool,
}

impl<S: StreamActor> Handler<Count> for Router<S> {
    type Result = Option<usize>;

    fn handle(&mut self, Count { id, present }: Count, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(
            self,
            ctx,
            |r, _| if present { r.present(&id) } else { r.count(&id) },
        )
    }
}

impl<S: StreamActor> Handler<HeldIds> for Router<S> {
    type Result = actix::MessageResult<HeldIds>;

    fn handle(&mut self, _: HeldIds, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(
            self.table
                .keys()
                .chain(self.awaiting.keys())
                .chain(self.reading.keys().filter(|id| !self.table.contains_key(*id)))
                .cloned()
                .collect(),
        )
    }
}

impl<S: StreamActor> Handler<Login<S>> for Router<S> {
    type Result = ();

    fn handle(&mut self, m: Login<S>, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, ctx| r.login(m, None, false, ctx));
    }
}

impl<S: StreamActor> Handler<LoginAt<S>> for Router<S> {
    type Result = ();

    fn handle(&mut self, m: LoginAt<S>, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, ctx| {
            if m.poll {
                r.unlinger(&m.login.id);
            }
            r.login(m.login, m.since, true, ctx);
        });
    }
}

impl<S: StreamActor> Router<S> {
    /// Registers a stream (`tracked`: it carries event ids, and waits for
    /// its [`Welcome`] whatever the broker).
    fn login(&mut self, m: Login<S>, since: Option<u64>, tracked: bool, ctx: &mut Context<Self>) {
        if self.closing {
            send_if_alive(&m.addr, Close);
        }
        let w = Waiting {
            conn: m.conn,
            addr: m.addr,
            since,
            tracked,
        };
        self.presence_changed(&m.id);
        if self.subscribed(&m.id) {
            self.enter(m.id, w, ctx);
        } else if let Some(waiting) = self.awaiting.get_mut(&*m.id) {
            waiting.push(w);
        } else {
            match self.broker.subscribe(&m.id) {
                Subscription::Live => self.enter(m.id, w, ctx),
                Subscription::Pending => self.awaiting.entry(m.id).or_default().push(w),
            }
        }
    }
}

impl<S: StreamActor> Handler<Logout> for Router<S> {
    type Result = ();

    fn handle(&mut self, m: Logout, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, _| {
            r.presence_changed(&m.id);
            if let Some(linger) = m.linger {
                r.linger(Arc::clone(&m.id), linger);
            }
            r.floors.remove(&m.conn);
            r.member_left(&m.conn);
            let mut left = false;
            if let Some(streams) = r.table.get_mut(&*m.id) {
                let before = streams.len();
                streams.retain(|(conn, _)| *conn != m.conn);
                r.streams -= before - streams.len();
                if streams.is_empty() {
                    r.table.remove(&*m.id);
                    shrink_if_sparse(&mut r.table);
                    left = true;
                }
            }
            if let Some(readers) = r.reading.get_mut(&*m.id) {
                readers.retain(|reader| reader.stream.conn != m.conn);
                if readers.is_empty() {
                    r.reading.remove(&*m.id);
                    left = true;
                }
            }
            if left {
                if !r.subscribed(&m.id) {
                    r.stale.remove(&m.id);
                    r.broker.unsubscribe(m.id);
                }
            } else if let Some(waiting) = r.awaiting.get_mut(&*m.id) {
                waiting.retain(|w| w.conn != m.conn);
                if waiting.is_empty() {
                    r.awaiting.remove(&*m.id);
                    r.broker.unsubscribe(m.id);
                }
            }
        });
    }
}

impl<S: StreamActor> Router<S> {
    /// Whether `n` more deliveries fit in the publish backlog under
    /// `limit` ([`fits_backlog`]). The caller adds them to the
    /// backlog right before it hands them out, after anything that could
    /// panic: a restart must not leave them counted.
    fn room(&self, n: usize, limit: Option<u64>) -> Result<(), Busy> {
        let backlog = self.stats.publish_backlog.load(Relaxed);
        match limit {
            Some(max) if !fits_backlog(backlog, n as u64, max) => Err(Busy),
            _ => Ok(()),
        }
    }
}

impl<S: StreamActor> Handler<Publish> for Router<S> {
    type Result = Option<Result<Published, Busy>>;

    fn handle(&mut self, m: Publish, ctx: &mut Context<Self>) -> Self::Result {
        guarded(self, ctx, |r, ctx| {
            let held = r.table.get(m.id.as_str()).map_or(0, SmallVec::len);
            r.room(held, m.limit)?;
            r.stats.messages_routed.fetch_add(1, Relaxed);
            // A message accepted here is minted and kept now, after the
            // backlog took it; one from the broker has its id already.
            let event = match m.event {
                Some(event) => Some(event),
                None => r.broker.keep(&m.id, &m.msg),
            };
            if let Some(event) = event {
                r.witness(event);
                r.buffer(&m.id, event, &m.msg);
            }
            // Streams that had it already (they joined after a read of
            // the history) are left out. Counted before anything is
            // handed out: a delivery dropped at once leaves the backlog.
            let none = Streams::new();
            let streams = r.table.get(m.id.as_str()).unwrap_or(&none);
            let floors = &mut r.floors;
            let delivered = streams
                .iter()
                .filter(|(conn, _)| !Router::<S>::already_had(floors, *conn, event))
                .count();
            r.stats.publish_backlog.fetch_add(delivered as u64, Relaxed);
            let targets = streams
                .iter()
                .filter(|(conn, _)| !Router::<S>::already_had(floors, *conn, event));
            if delivered > AT_ONCE {
                // An id with more streams than that is handed out as a
                // broadcast is, behind those still being handed out, so
                // that it does not hold up everything else either.
                let mut targets: Vec<(ConnId, WeakAddr<S>)> = targets.cloned().collect();
                targets.sort_unstable_by_key(|(conn, _)| *conn);
                r.fanouts.push_back(Fanout {
                    msg: m.msg,
                    event,
                    accepted: m.accepted,
                    targets,
                    next: 0,
                    early: HashSet::new(),
                });
                if !r.pumping {
                    r.pump(ctx);
                }
                r.stats.messages_delivered.fetch_add(delivered as u64, Relaxed);
                return Ok(Published { delivered, event });
            }
            let fanouts = &mut r.fanouts;
            for (conn, stream) in targets {
                // It never waits for a broadcast still being handed out:
                // a stream still owed one gets it now, right ahead of it.
                if !fanouts.is_empty() {
                    hand_owed(fanouts, *conn, stream, &r.stats);
                }
                send_if_alive(stream, Deliver::new(&m.msg, event, m.accepted, &r.stats));
            }
            r.stats.messages_delivered.fetch_add(delivered as u64, Relaxed);
            Ok(Published { delivered, event })
        })
    }
}

impl<S: StreamActor> Handler<Broadcast> for Router<S> {
    type Result = Option<Result<usize, Busy>>;

    fn handle(&mut self, m: Broadcast, ctx: &mut Context<Self>) -> Self::Result {
        guarded(self, ctx, |r, ctx| {
            r.room(r.streams, m.limit)?;
            r.stats.messages_routed.fetch_add(1, Relaxed);
            let event = m.event.map(|e| r.witness(e));
            if let Some(event) = event
                && !r.reading.is_empty()
            {
                let ids: Vec<Arc<str>> = r.reading.keys().cloned().collect();
                for id in ids {
                    r.buffer(&id, event, &m.msg);
                }
            }
            let floors = &mut r.floors;
            let streams = r
                .table
                .iter()
                .filter(|(id, _)| m.part.as_ref().is_none_or(|p| p.holds(id)))
                .flat_map(|(_, streams)| streams);
            let mut targets: Vec<(ConnId, WeakAddr<S>)> = if floors.is_empty() {
                streams.cloned().collect()
            } else {
                streams
                    .filter(|(conn, _)| !Router::<S>::already_had(floors, *conn, event))
                    .cloned()
                    .collect()
            };
            targets.sort_unstable_by_key(|(conn, _)| *conn);
            let n = targets.len();
            r.stats.publish_backlog.fetch_add(n as u64, Relaxed);
            r.fanouts.push_back(Fanout {
                event,
                msg: m.msg,
                accepted: m.accepted,
                targets,
                next: 0,
                early: HashSet::new(),
            });
            if !r.pumping {
                r.pump(ctx);
            }
            r.stats.messages_delivered.fetch_add(n as u64, Relaxed);
            Ok(n)
        })
    }
}

/// The server stops and its streams are gone (their Logouts are ahead of
/// this in the mailbox): the broker finishes what waits on a timer.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stopping;

impl<S: StreamActor> Handler<Stopping> for Router<S> {
    type Result = ();

    fn handle(&mut self, _: Stopping, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, _| r.broker.stopping());
    }
}

impl<S: StreamActor> Handler<CloseAll> for Router<S> {
    type Result = Option<usize>;

    fn handle(&mut self, _: CloseAll, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(self, ctx, |r, _| {
            r.closing = true;
            // A broadcast already answered goes out whole, ahead of the
            // Close in every stream's mailbox: its deliveries arrive before
            // the final chunk, as they did before broadcasts were paced.
            for f in std::mem::take(&mut r.fanouts) {
                for target in f.rest() {
                    deliver_broadcast_to(target, &f, &r.stats, None);
                }
            }
            for (_, stream) in r.table.values().flatten() {
                send_if_alive(stream, Close);
            }
            for w in r.awaiting.values().flatten() {
                send_if_alive(&w.addr, Close);
            }
            for reader in r.reading.values().flatten() {
                send_if_alive(&reader.stream.addr, Close);
            }
            r.streams
                + r.awaiting.values().map(SmallVec::len).sum::<usize>()
                + r.reading.values().map(SmallVec::len).sum::<usize>()
        })
    }
}

impl<S: StreamActor> Handler<Crash> for Router<S> {
    type Result = Option<()>;

    fn handle(&mut self, _: Crash, ctx: &mut Context<Self>) -> Option<()> {
        guarded(self, ctx, |_, _| {
            panic!("fault injection: router crash requested")
        })
    }
}

/// A stream actor for the hub's other tests (the brokers', the Hub's): it
/// takes what it is handed, or holds it.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use actix::{Actor, Context, Handler};

    use super::Note;

    use super::{Close, Cut, Deliver, Welcome};

    /// The text and event id of each message a stream took, in order.
    pub(crate) type Took = Arc<Mutex<Vec<(String, Option<u64>)>>>;

    /// A stream that keeps the text and event id of each message.
    #[derive(Default)]
    pub(crate) struct Taker {
        pub(crate) took: Took,
        /// Holds deliveries instead (the backlog stays full).
        pub(crate) hold: bool,
        held: Vec<Deliver>,
    }

    impl Taker {
        /// A stream that holds what it is handed (`hold`) or takes it.
        pub(crate) fn new(hold: bool) -> Self {
            Taker {
                hold,
                ..Taker::default()
            }
        }
    }

    impl Actor for Taker {
        type Context = Context<Self>;
    }

    /// A `join` or `leave` is taken as `"<kind> <json>"`, without an id.
    impl Handler<Note> for Taker {
        type Result = ();
        fn handle(&mut self, n: Note, _: &mut Context<Self>) {
            let line = format!("{} {}", n.kind.as_str(), n.json);
            self.took.lock().unwrap().push((line, None));
        }
    }

    impl Handler<Deliver> for Taker {
        type Result = ();
        fn handle(&mut self, m: Deliver, _: &mut Context<Self>) {
            if self.hold {
                self.held.push(m);
                return;
            }
            let (msg, event, _) = m.arrived();
            self.took.lock().unwrap().push((msg.to_string(), event));
        }
    }

    impl Handler<Welcome> for Taker {
        type Result = ();
        fn handle(&mut self, w: Welcome, _: &mut Context<Self>) {
            w.arrived();
        }
    }

    impl Handler<Close> for Taker {
        type Result = ();
        fn handle(&mut self, _: Close, _: &mut Context<Self>) {}
    }

    impl Handler<Cut> for Taker {
        type Result = ();
        fn handle(&mut self, _: Cut, _: &mut Context<Self>) {}
    }
}

/// The Router with a fake stream actor: no sockets, milliseconds.
#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use actix::{ActorContext, Addr};

    use super::*;
    use crate::id::next_conn_id;

    /// A stream that holds every delivery it is handed until told to take
    /// them (so the publish backlog stays where a test put it), and records
    /// what it took, in order.
    #[derive(Default)]
    struct Fake {
        held: Vec<Deliver>,
        took: Arc<Mutex<Vec<String>>>,
        /// The event id of each message it took, in order.
        events: Arc<Mutex<Vec<Option<u64>>>>,
        /// The Welcomes it got.
        welcomed: Arc<Mutex<Vec<Resume>>>,
    }

    impl Actor for Fake {
        type Context = Context<Self>;
    }

    impl Handler<Note> for Fake {
        type Result = ();
        fn handle(&mut self, n: Note, _: &mut Context<Self>) {
            self.took
                .lock()
                .unwrap()
                .push(format!("{} {}", n.kind.as_str(), n.json));
        }
    }

    impl Handler<Deliver> for Fake {
        type Result = ();
        fn handle(&mut self, m: Deliver, _: &mut Context<Self>) {
            self.held.push(m);
        }
    }

    impl Handler<Welcome> for Fake {
        type Result = ();
        fn handle(&mut self, w: Welcome, _: &mut Context<Self>) {
            self.welcomed.lock().unwrap().push(w.arrived());
        }
    }

    impl Handler<Close> for Fake {
        type Result = ();
        fn handle(&mut self, _: Close, ctx: &mut Context<Self>) {
            ctx.stop();
        }
    }

    impl Handler<Cut> for Fake {
        type Result = ();
        fn handle(&mut self, _: Cut, ctx: &mut Context<Self>) {
            ctx.stop();
        }
    }

    /// How many deliveries it holds.
    #[derive(Message)]
    #[rtype(result = "usize")]
    struct Held;

    impl Handler<Held> for Fake {
        type Result = usize;
        fn handle(&mut self, _: Held, _: &mut Context<Self>) -> usize {
            self.held.len()
        }
    }

    /// Take every held delivery now.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Take;

    impl Handler<Take> for Fake {
        type Result = ();
        fn handle(&mut self, _: Take, _: &mut Context<Self>) {
            for d in self.held.drain(..) {
                let (msg, event, _) = d.arrived();
                self.took.lock().unwrap().push(msg.to_string());
                self.events.lock().unwrap().push(event);
            }
        }
    }

    /// The memory broker, keeping `size` messages per id for a minute.
    fn memory(size: usize, stats: &Arc<Stats>) -> Arc<dyn Broker> {
        let mut settings = crate::config::Settings::defaults();
        settings.history.size = size;
        settings.history.ttl_ms = 60_000;
        Arc::new(crate::hub::broker::memory::Memory::new(&settings, stats))
    }

    /// A broker as a fleet's is to the Router, with no Redis: every
    /// stream waits for its welcome, a new id's subscription is confirmed
    /// only when the test says so ([`Subscribed`]), and history reads
    /// answer later. It mints and keeps a message accepted here itself (as
    /// if its publish and its echo were one step), in a [`History`] that
    /// stands for the fleet's; what it is told is recorded, in order.
    struct FakeFleet {
        history: Mutex<crate::hub::history::History>,
        told: Arc<Mutex<Vec<String>>>,
        /// Presence writes asked for; each one never finishes.
        writes: Arc<std::sync::atomic::AtomicUsize>,
        /// How often presence is written (`None`: never).
        presence: Option<Duration>,
        /// Reads and catch-ups never answer (they are recorded).
        hold: bool,
        /// Catch-ups answer (nothing missed) after 50 ms.
        slow: bool,
    }

    impl FakeFleet {
        fn start() -> (Arc<dyn Broker>, Arc<Mutex<Vec<String>>>) {
            Self::with(false)
        }

        /// One whose reads and catch-ups stay out.
        fn holding() -> (Arc<dyn Broker>, Arc<Mutex<Vec<String>>>) {
            Self::with(true)
        }

        /// One whose catch-ups answer 50 ms later, having found nothing.
        fn slow() -> (Arc<dyn Broker>, Arc<Mutex<Vec<String>>>) {
            let (_, told) = Self::with(false);
            let fleet = FakeFleet {
                history: Mutex::new(crate::hub::history::History::new(16, Duration::from_secs(60))),
                told: Arc::clone(&told),
                writes: Arc::default(),
                presence: None,
                hold: false,
                slow: true,
            };
            (Arc::new(fleet), told)
        }

        fn with(hold: bool) -> (Arc<dyn Broker>, Arc<Mutex<Vec<String>>>) {
            let told = Arc::default();
            let fleet = FakeFleet {
                history: Mutex::new(crate::hub::history::History::new(16, Duration::from_secs(60))),
                told: Arc::clone(&told),
                writes: Arc::default(),
                presence: None,
                hold,
                slow: false,
            };
            (Arc::new(fleet), told)
        }

        fn tell(&self, line: String) {
            self.told.lock().unwrap().push(line);
        }
    }

    impl Broker for FakeFleet {
        fn streams_wait(&self) -> bool {
            true
        }
        fn subscribe(&self, id: &Arc<str>) -> Subscription {
            self.tell(format!("held {id}"));
            Subscription::Pending
        }
        fn unsubscribe(&self, id: Arc<str>) {
            self.tell(format!("released {id}"));
        }
        fn confirm(&self, id: Arc<str>) -> Subscription {
            self.tell(format!("confirm {id}"));
            Subscription::Pending
        }
        fn keep(&self, id: &str, msg: &Arc<str>) -> Option<u64> {
            let mut history = self.history.lock().unwrap();
            let event = history.next_id();
            history.record(id, event, msg);
            Some(event)
        }
        fn read(&self, id: &Arc<str>, since: Option<u64>) -> Read {
            if self.hold {
                self.tell(format!("read {id}"));
                return Read::Later(Box::pin(std::future::pending()));
            }
            let read = self.history.lock().unwrap().read(id, since);
            Read::Later(Box::pin(async move { Some(read) }))
        }
        fn catch_up(&self, ids: Vec<Arc<str>>, since: u64) -> crate::hub::broker::Later<Option<CaughtUp>> {
            if self.hold || self.slow {
                for id in &ids {
                    self.tell(format!("catch up {id}"));
                    self.tell(format!("catch up {id} from {since}"));
                }
            }
            if self.slow {
                return Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Some(CaughtUp {
                        clock: since,
                        epoch: 0,
                        broadcasts: Default::default(),
                        ids: vec![Default::default(); ids.len()],
                        clocks: Vec::new(),
                    })
                });
            }
            if self.hold {
                return Box::pin(std::future::pending());
            }
            Box::pin(async { None })
        }
        fn presence_every(&self) -> Option<Duration> {
            self.presence
        }
        fn notify(&self, _: &Arc<str>, _: &Note) {}
        fn stopping(&self) {}
        fn write_presence(
            &self,
            _: crate::hub::broker::Counts,
            _: bool,
        ) -> crate::hub::broker::Later<Result<bool, ()>> {
            self.writes.fetch_add(1, Relaxed);
            Box::pin(std::future::pending())
        }
        fn upkeep_every(&self) -> Option<Duration> {
            None
        }
        fn upkeep(&self) {}
        fn publish<'a>(
            &'a self,
            _: crate::hub::broker::Outgoing<'a>,
            _: &'a crate::hub::local::Local,
        ) -> crate::hub::broker::Publishing<'a> {
            unreachable!("the Router never publishes")
        }
        fn presence<'a>(
            &'a self,
            _: &'a str,
            _: usize,
            _: Option<Vec<Arc<str>>>,
        ) -> crate::hub::broker::LaterFrom<'a, Result<crate::hub::cluster::Presence, crate::error::ApiError>>
        {
            unreachable!("the Router never reads presence")
        }
    }

    /// A Router and `n` fake streams of id `a`, logged in.
    async fn setup(
        n: usize,
    ) -> (
        Arc<Stats>,
        Addr<Router<Fake>>,
        Vec<Addr<Fake>>,
        Vec<Arc<Mutex<Vec<String>>>>,
    ) {
        let stats = Arc::new(Stats::new());
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(16, &stats)).start();
        let (mut fakes, mut logs) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (addr, _, fake) = log_in(&router, "a", None).await;
            logs.push(fake.took);
            fakes.push(addr);
        }
        (stats, router, fakes, logs)
    }

    fn publish(msg: &str, limit: Option<u64>) -> Publish {
        publish_to("a", msg, limit)
    }

    fn publish_to(id: &str, msg: &str, limit: Option<u64>) -> Publish {
        Publish {
            id: id.into(),
            msg: Arc::from(msg),
            event: None,
            accepted: Instant::now(),
            limit,
        }
    }

    /// A fake stream of `id` logged in to `router` (`since`: with a
    /// [`LoginAt`], which gets a Welcome); its address and the fake's logs.
    async fn log_in(
        router: &Addr<Router<Fake>>,
        id: &str,
        since: Option<Option<u64>>,
    ) -> (Addr<Fake>, ConnId, Fake) {
        let fake = Fake::default();
        let logs = Fake {
            held: Vec::new(),
            took: Arc::clone(&fake.took),
            events: Arc::clone(&fake.events),
            welcomed: Arc::clone(&fake.welcomed),
        };
        let addr = fake.start();
        let conn = next_conn_id();
        let login = Login {
            id: Arc::from(id),
            conn,
            addr: addr.downgrade(),
        };
        match since {
            None => router.send(login).await.unwrap(),
            Some(since) => router
                .send(LoginAt {
                    login,
                    since,
                    poll: false,
                })
                .await
                .unwrap(),
        }
        (addr, conn, logs)
    }

    /// Publishes `msg` to `id`, answering what the Router did.
    /// What [`sent`] answers: a publish of this process, which has an id.
    struct Sent {
        delivered: usize,
        event: u64,
    }

    async fn sent(router: &Addr<Router<Fake>>, id: &str, msg: &str) -> Sent {
        let p = router
            .send(publish_to(id, msg, None))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        Sent {
            delivered: p.delivered,
            event: p.event.expect("an event id"),
        }
    }

    /// Waits (a few event-loop turns at most) until `f` holds.
    async fn eventually(mut f: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never held");
    }

    #[actix_rt::test]
    async fn the_backlog_bounds_what_publishers_queue() {
        let (stats, router, fakes, logs) = setup(3).await;
        let backlog = || stats.publish_backlog.load(Relaxed);
        let first = router.send(publish("m1", Some(4))).await.unwrap().unwrap();
        assert_eq!(first.unwrap().delivered, 3);
        // Each fake holds its delivery: they stay in the backlog.
        for f in &fakes {
            assert_eq!(f.send(Held).await.unwrap(), 1);
        }
        assert_eq!(backlog(), 3);
        // 3 more would pass 4: refused, nothing delivered or kept.
        assert_eq!(
            router.send(publish("m2", Some(4))).await.unwrap(),
            Some(Err(Busy))
        );
        assert_eq!(stats.messages_routed.load(Relaxed), 1);
        // The bus's messages are always taken.
        assert!(router.send(publish("m3", None)).await.unwrap().unwrap().is_ok());
        assert_eq!(backlog(), 6);
        for f in &fakes {
            f.send(Take).await.unwrap();
        }
        assert_eq!(backlog(), 0);
        for log in &logs {
            assert_eq!(*log.lock().unwrap(), ["m1", "m3"]);
        }
        // An empty backlog takes a message larger than the bound, alone.
        let big = router.send(publish("m4", Some(1))).await.unwrap().unwrap();
        assert_eq!(big.unwrap().delivered, 3);
        let b = Broadcast {
            msg: Arc::from("b1"),
            event: None,
            accepted: Instant::now(),
            limit: Some(1),
            part: None,
        };
        assert_eq!(router.send(b).await.unwrap(), Some(Err(Busy)));
        // A stream that stops holding deliveries: they count as dropped and
        // leave the backlog.
        fakes[0].send(Cut { panic: false }).await.unwrap();
        eventually(|| backlog() == 2).await;
        assert_eq!(stats.messages_dropped.load(Relaxed), 1);
    }

    #[actix_rt::test]
    async fn a_process_of_one_worker_hands_a_broadcast_out_in_smaller_windows() {
        assert_eq!(fanout_window(1), FANOUT_WINDOW_ONE_WORKER);
        assert_eq!(fanout_window(2), FANOUT_WINDOW);
        let stats = Arc::new(Stats::new());
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(16, &stats))
            .with_window(fanout_window(1))
            .start();
        let n = FANOUT_WINDOW + 5;
        let mut fakes = Vec::new();
        for _ in 0..n {
            fakes.push(log_in(&router, "a", None).await);
        }
        let b = Broadcast {
            msg: Arc::from("x"),
            event: None,
            accepted: Instant::now(),
            limit: None,
            part: None,
        };
        assert_eq!(router.send(b).await.unwrap(), Some(Ok(n)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut out = 0;
        for (f, _, _) in &fakes {
            out += f.send(Held).await.unwrap();
        }
        assert_eq!(out, FANOUT_WINDOW_ONE_WORKER);
        // Taking lets the rest come, in windows of that size.
        eventually(|| {
            for (f, _, _) in &fakes {
                f.do_send(Take);
            }
            fakes.iter().all(|(_, _, l)| l.took.lock().unwrap().len() == 1)
        })
        .await;
    }

    #[actix_rt::test]
    async fn a_broadcast_is_handed_out_in_windows_and_every_stream_gets_it_in_order() {
        let n = FANOUT_WINDOW * 3 + 5;
        let (stats, router, fakes, logs) = setup(n).await;
        for m in ["x", "y"] {
            let b = Broadcast {
                msg: Arc::from(m),
                event: None,
                accepted: Instant::now(),
                limit: None,
                part: None,
            };
            assert_eq!(router.send(b).await.unwrap(), Some(Ok(n)));
        }
        // The fakes hold what they got: exactly a window is out at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut out = 0;
        for f in &fakes {
            out += f.send(Held).await.unwrap();
        }
        assert_eq!(out, FANOUT_WINDOW);
        assert_eq!(stats.publish_backlog.load(Relaxed), 2 * n as u64);
        // Taking lets the rest come; in the end every stream has x then y.
        eventually(|| {
            for f in &fakes {
                f.do_send(Take);
            }
            logs.iter().all(|l| l.lock().unwrap().len() == 2)
        })
        .await;
        for log in &logs {
            assert_eq!(*log.lock().unwrap(), ["x", "y"]);
        }
        assert_eq!(stats.publish_backlog.load(Relaxed), 0);
    }

    #[actix_rt::test]
    async fn streams_of_an_id_get_its_messages_in_order_until_they_log_out() {
        let stats = Arc::new(Stats::new());
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(16, &stats)).start();
        let (a1, c1, log1) = log_in(&router, "a", None).await;
        let (a2, _, log2) = log_in(&router, "a", None).await;
        let (b, _, logb) = log_in(&router, "b", None).await;
        let mut events = Vec::new();
        for m in ["m1", "m2", "m3"] {
            let p = sent(&router, "a", m).await;
            assert_eq!(p.delivered, 2);
            events.push(Some(p.event));
        }
        assert!(events.windows(2).all(|w| w[0] < w[1]), "{events:?}");
        for f in [&a1, &a2, &b] {
            f.send(Take).await.unwrap();
        }
        for log in [&log1, &log2] {
            assert_eq!(*log.took.lock().unwrap(), ["m1", "m2", "m3"]);
            assert_eq!(*log.events.lock().unwrap(), events);
        }
        assert!(logb.took.lock().unwrap().is_empty());
        // One of a's streams leaves: the next message goes to the other.
        router
            .send(Logout {
                id: Arc::from("a"),
                conn: c1,
                linger: None,
            })
            .await
            .unwrap();
        assert_eq!(sent(&router, "a", "m4").await.delivered, 1);
        a2.send(Take).await.unwrap();
        assert_eq!(log2.took.lock().unwrap().last().map(String::as_str), Some("m4"));
        // An id nobody holds: delivered to none, still given an id and kept.
        let p = sent(&router, "nobody", "m5").await;
        assert_eq!(p.delivered, 0);
        assert_eq!(stats.messages_routed.load(Relaxed), 5);
        assert_eq!(stats.history_messages.load(Relaxed), 5);
    }

    #[actix_rt::test]
    async fn a_resuming_stream_is_welcomed_with_what_it_missed_and_told_of_a_gap() {
        let stats = Arc::new(Stats::new());
        // Two messages kept per id.
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(2, &stats)).start();
        let (_, _, fresh) = log_in(&router, "a", Some(None)).await;
        let start = fresh.welcomed.lock().unwrap()[0].position;
        let mut ids = Vec::new();
        for m in ["m1", "m2", "m3", "m4"] {
            ids.push(sent(&router, "a", m).await.event);
        }
        // After m2: m3 and m4, nothing missing.
        let (_, _, exact) = log_in(&router, "a", Some(Some(ids[1]))).await;
        let got = exact.welcomed.lock().unwrap().pop().unwrap();
        assert_eq!(got.position, ids[1]);
        assert_eq!(
            got.replay,
            vec![(ids[2], Arc::from("m3")), (ids[3], Arc::from("m4"))]
        );
        assert_eq!(got.gap, None);
        // From before m1: m1 and m2 were evicted, told with the next id.
        let (_, _, behind) = log_in(&router, "a", Some(Some(start))).await;
        let got = behind.welcomed.lock().unwrap().pop().unwrap();
        assert_eq!(got.replay.len(), 2);
        assert_eq!(
            got.gap,
            Some(crate::hub::history::Gap {
                after: start,
                next: Some(ids[2])
            })
        );
        assert_eq!(stats.history_gaps.load(Relaxed), 1);
        assert_eq!(stats.history_replayed.load(Relaxed), 4);
        // A plain stream (Login) is not welcomed without a bus.
        let (_, _, plain) = log_in(&router, "a", None).await;
        assert!(plain.welcomed.lock().unwrap().is_empty());
    }

    #[actix_rt::test]
    async fn an_event_id_from_another_node_is_kept_not_minted_again() {
        let stats = Arc::new(Stats::new());
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(16, &stats)).start();
        let (s, _, log) = log_in(&router, "a", None).await;
        let mine = sent(&router, "a", "mine").await.event;
        // A message the fleet gave an id ahead of this node's clock.
        let theirs = mine + 1_000;
        let mut m = publish_to("a", "theirs", None);
        m.event = Some(theirs);
        let p = router.send(m).await.unwrap().unwrap().unwrap();
        assert_eq!(p.event, Some(theirs));
        s.send(Take).await.unwrap();
        assert_eq!(*log.events.lock().unwrap(), [Some(mine), Some(theirs)]);
        let count = |id: &str| {
            router.send(Count {
                id: id.into(),
                present: false,
            })
        };
        assert_eq!(count("a").await.unwrap(), Some(1));
        assert_eq!(count("z").await.unwrap(), Some(0));
    }

    #[actix_rt::test]
    async fn with_a_fleet_a_new_id_waits_for_its_subscription_and_then_gets_what_it_missed() {
        let stats = Arc::new(Stats::new());
        let (fleet, told) = FakeFleet::start();
        let router = Router::<Fake>::new(Arc::clone(&stats), fleet).start();
        let start = sent(&router, "x", "before").await.event;
        // Two streams of `a`, one resuming: they wait, and the bus is told
        // once that this node holds `a`.
        let (first, c1, log1) = log_in(&router, "a", Some(Some(start))).await;
        let (_second, c2, log2) = log_in(&router, "a", None).await;
        assert_eq!(*told.lock().unwrap(), ["held a"]);
        // A message sent while they wait reaches nobody yet, and is kept.
        let p = sent(&router, "a", "while waiting").await;
        assert_eq!(p.delivered, 0);
        assert!(log1.welcomed.lock().unwrap().is_empty());
        // Subscribed: both are welcomed; the resuming one gets it replayed.
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        eventually(|| log1.welcomed.lock().unwrap().len() == 1 && log2.welcomed.lock().unwrap().len() == 1)
            .await;
        let got = log1.welcomed.lock().unwrap().pop().unwrap();
        assert_eq!(got.replay, vec![(p.event, Arc::from("while waiting"))]);
        // Now messages reach them.
        assert_eq!(sent(&router, "a", "live").await.delivered, 2);
        first.send(Take).await.unwrap();
        assert_eq!(*log1.took.lock().unwrap(), ["live"]);
        // A plain stream of another id while the broker's link is down:
        // LinkDown welcomes every plain stream still waiting.
        let (_third, _, log3) = log_in(&router, "b", None).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            log3.welcomed.lock().unwrap().is_empty(),
            "welcomed before its subscription"
        );
        router.send(Subscribed::LinkDown).await.unwrap();
        eventually(|| log3.welcomed.lock().unwrap().len() == 1).await;
        // The last stream of `a` leaves: the bus is told.
        for conn in [c1, c2] {
            router
                .send(Logout {
                    id: Arc::from("a"),
                    conn,
                    linger: None,
                })
                .await
                .unwrap();
        }
        eventually(|| told.lock().unwrap().len() == 3).await;
        assert_eq!(*told.lock().unwrap(), ["held a", "held b", "released a"]);
    }

    #[actix_rt::test]
    async fn a_message_never_waits_for_a_broadcast_yet_follows_it_on_its_stream() {
        // More streams than a window, holding what they are handed: the
        // first broadcast fills the window and the second waits whole, so
        // both are still being handed out when a message for `z` comes.
        let n = FANOUT_WINDOW * 2;
        let (stats, router, fakes, _) = setup(n).await;
        let (last, _, log) = log_in(&router, "z", None).await;
        for (text, event) in [("b0", 9), ("b", 10)] {
            let b = Broadcast {
                msg: Arc::from(text),
                event: Some(event),
                accepted: Instant::now(),
                limit: None,
                part: None,
            };
            assert_eq!(router.send(b).await.unwrap(), Some(Ok(n + 1)));
        }
        let handed = |fakes: &[Addr<Fake>]| {
            let fakes = fakes.to_vec();
            async move {
                let mut sum = 0;
                for f in &fakes {
                    sum += f.send(Held).await.unwrap();
                }
                sum
            }
        };
        let before = handed(&fakes).await;
        assert!(before <= FANOUT_WINDOW, "handed {before} of 2 × {n}");
        let mut m = publish_to("z", "after", None);
        m.event = Some(11);
        assert_eq!(router.send(m).await.unwrap().unwrap().unwrap().delivered, 1);
        // `z` has the message at once, behind the two broadcasts it was
        // owed; nobody else was handed anything more.
        assert_eq!(last.send(Held).await.unwrap(), 3);
        assert_eq!(handed(&fakes).await, before);
        last.send(Take).await.unwrap();
        assert_eq!(*log.took.lock().unwrap(), ["b0", "b", "after"]);
        assert_eq!(*log.events.lock().unwrap(), [Some(9), Some(10), Some(11)]);
        // The broadcasts go on to everyone else, and `z`'s turn is skipped:
        // nobody gets one twice, and the backlog empties.
        for _ in 0..100 {
            for f in &fakes {
                f.send(Take).await.unwrap();
            }
            if stats.publish_backlog.load(Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(stats.publish_backlog.load(Relaxed), 0);
        assert_eq!(last.send(Held).await.unwrap(), 0, "z handed a broadcast twice");
        assert_eq!(log.took.lock().unwrap().len(), 3);
    }

    /// `n` streams of `a` on a Router with `fleet`, welcomed.
    async fn welcomed(router: &Addr<Router<Fake>>, n: usize) -> Vec<(Addr<Fake>, ConnId, Fake)> {
        let mut streams = Vec::new();
        for _ in 0..n {
            streams.push(log_in(router, "a", None).await);
        }
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        eventually(|| {
            streams
                .iter()
                .all(|(_, _, l)| l.welcomed.lock().unwrap().len() == 1)
        })
        .await;
        streams
    }

    #[actix_rt::test]
    async fn a_stream_that_catches_up_is_handed_the_broadcast_it_was_owed_first_and_once() {
        let stats = Arc::new(Stats::new());
        let (fleet, _) = FakeFleet::start();
        let router = Router::<Fake>::new(Arc::clone(&stats), fleet).start();
        // More streams than a window, holding what they are handed: a
        // window of the fleet's broadcast goes out, the rest waits.
        let n = FANOUT_WINDOW * 3;
        let streams = welcomed(&router, n).await;
        let b = Broadcast {
            msg: Arc::from("b"),
            event: Some(10),
            accepted: Instant::now(),
            limit: None,
            part: None,
        };
        assert_eq!(router.send(b).await.unwrap(), Some(Ok(n)));
        // The link goes (after the broadcast came) and comes back: every
        // stream of `a` catches up from there (this fake's read fails: a
        // gap from there is told).
        router.send(Subscribed::LinkDown).await.unwrap();
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        eventually(|| {
            streams
                .iter()
                .all(|(_, _, l)| l.welcomed.lock().unwrap().len() == 2)
        })
        .await;
        // Each was handed the broadcast before its catch-up (its mailbox
        // is in order): the catch-up starts after it.
        for (s, _, _) in &streams {
            assert_eq!(
                s.send(Held).await.unwrap(),
                1,
                "the broadcast not handed before the catch-up"
            );
        }
        // And never again: the window has nobody left to hand it to.
        for _ in 0..3 {
            for (s, _, _) in &streams {
                s.send(Take).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (_, _, log) in &streams {
            assert_eq!(*log.took.lock().unwrap(), ["b"]);
        }
        assert_eq!(stats.publish_backlog.load(Relaxed), 0);
        assert_eq!(stats.messages_delivered.load(Relaxed), n as u64);
    }

    #[actix_rt::test]
    async fn a_broadcast_that_came_after_the_link_went_is_left_to_the_catch_up() {
        let stats = Arc::new(Stats::new());
        let (fleet, _) = FakeFleet::start();
        let router = Router::<Fake>::new(Arc::clone(&stats), fleet).start();
        let n = FANOUT_WINDOW * 2;
        let streams = welcomed(&router, n).await;
        router.send(Subscribed::LinkDown).await.unwrap();
        // A broadcast of the fleet's after the loss: a window of it goes
        // out at once, the rest waits.
        let b = Broadcast {
            msg: Arc::from("later"),
            event: Some(u64::MAX / 2),
            accepted: Instant::now(),
            limit: None,
            part: None,
        };
        assert_eq!(router.send(b).await.unwrap(), Some(Ok(n)));
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        eventually(|| {
            streams
                .iter()
                .all(|(_, _, l)| l.welcomed.lock().unwrap().len() == 2)
        })
        .await;
        // The streams not handed it yet are left to their catch-up, which
        // covers it (this fake's read fails: a gap from the loss is told);
        // the window hands it to nobody more.
        for _ in 0..3 {
            for (s, _, _) in &streams {
                s.send(Take).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took: usize = streams.iter().map(|(_, _, l)| l.took.lock().unwrap().len()).sum();
        assert_eq!(took, FANOUT_WINDOW);
        // The books: counted for all when it came, less those left out.
        assert_eq!(stats.publish_backlog.load(Relaxed), 0);
        assert_eq!(stats.messages_delivered.load(Relaxed), FANOUT_WINDOW as u64);
    }

    #[actix_rt::test]
    async fn a_restart_keeps_an_id_subscribed_while_a_stream_of_it_reads() {
        let stats = Arc::new(Stats::new());
        let (fleet, told) = FakeFleet::holding();
        let router = actix::Supervisor::start(move |_| Router::<Fake>::new(stats, fleet));
        let streams = welcomed(&router, 1).await;
        // Its one stream goes without a word (its Logout lost), and another
        // stream of `a` reads the history.
        streams[0].0.send(Cut { panic: false }).await.unwrap();
        let (_reader, _, _) = log_in(&router, "a", Some(Some(1))).await;
        eventually(|| told.lock().unwrap().iter().any(|l| l == "read a")).await;
        assert_eq!(router.send(Crash).await.unwrap(), None);
        // The read is made again, and `a` stays subscribed for it.
        eventually(|| told.lock().unwrap().iter().filter(|l| *l == "read a").count() == 2).await;
        assert!(
            !told.lock().unwrap().iter().any(|l| l == "released a"),
            "{:?}",
            told.lock().unwrap()
        );
    }

    /// After a Router restart, a member whose stream died meanwhile has
    /// left (its `leave` reaches the id's other streams); one whose Login is
    /// still on its way has not.
    #[actix_rt::test]
    async fn a_restart_tells_the_leave_of_a_dead_member_only() {
        let stats = Arc::new(Stats::new());
        let broker = memory(16, &stats);
        let router = actix::Supervisor::start(move |_| Router::<Fake>::new(stats, broker).with_node("n"));
        let (_listener, _, logs) = log_in(&router, "room", None).await;
        let join = |sub: &str| {
            let stream = Fake::default().start();
            let joined = Joined {
                conn: next_conn_id(),
                id: Arc::from("room"),
                member: Box::new(Member {
                    sub: Some(Arc::from(sub)),
                    webhooks: false,
                    presence: true,
                }),
                addr: stream.downgrade(),
            };
            (stream, joined)
        };
        let (pending, joined) = join("p");
        router.send(joined).await.unwrap();
        let (dead, joined) = join("d");
        router.send(joined).await.unwrap();
        dead.send(Cut { panic: false }).await.unwrap();
        eventually(|| !dead.connected()).await;
        assert_eq!(router.send(Crash).await.unwrap(), None);
        let expected = [
            r#"join {"sub":"p","node":"n"}"#,
            r#"join {"sub":"d","node":"n"}"#,
            r#"leave {"sub":"d","node":"n"}"#,
        ];
        eventually(|| logs.took.lock().unwrap().len() >= 3).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*logs.took.lock().unwrap(), expected);
        drop(pending);
    }

    /// A part of the link (a Redis Cluster's shard) with one id.
    fn part_of(id: &'static str) -> Part {
        Part(Arc::new(move |i: &str| i == id))
    }

    /// Waits until `told` has `line`.
    async fn told_line(told: &Arc<Mutex<Vec<String>>>, line: &str) {
        eventually(|| told.lock().unwrap().iter().any(|l| l == line)).await;
    }

    /// Each id catches up from its own point: a part that goes again while
    /// its id's catch-up is out keeps the earlier point (nothing between
    /// the two is skipped), and a part that goes again after its ids caught
    /// up, while another part is still down, starts from its new point
    /// (nothing they had is replayed).
    #[actix_rt::test]
    async fn each_id_catches_up_from_its_own_point() {
        let stats = Arc::new(Stats::new());
        let (fleet, told) = FakeFleet::slow();
        let router = Router::<Fake>::new(Arc::clone(&stats), fleet).start();
        let _a = welcomed(&router, 1).await;
        let _b = log_in(&router, "b", None).await;
        router.send(Subscribed::Ids(vec![Arc::from("b")])).await.unwrap();
        // a's part goes at 100, comes back; a's catch-up is out when the
        // part goes again at 500, so a is read again from 100, not 500.
        router
            .send(Subscribed::PartDown(part_of("a"), 100))
            .await
            .unwrap();
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        router
            .send(Subscribed::PartDown(part_of("a"), 500))
            .await
            .unwrap();
        told_line(&told, "catch up a from 100").await;
        tokio::time::sleep(Duration::from_millis(80)).await;
        told.lock().unwrap().clear();
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        told_line(&told, "catch up a from 100").await;
        tokio::time::sleep(Duration::from_millis(80)).await;
        // b's part goes at 200 and stays down; a's goes at 700 and comes
        // back: a catches up from 700, not from its part's earlier 100.
        router
            .send(Subscribed::PartDown(part_of("b"), 200))
            .await
            .unwrap();
        router
            .send(Subscribed::PartDown(part_of("a"), 700))
            .await
            .unwrap();
        told.lock().unwrap().clear();
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        told_line(&told, "catch up a from 700").await;
        router.send(Subscribed::Ids(vec![Arc::from("b")])).await.unwrap();
        told_line(&told, "catch up b from 200").await;
        let lines = told.lock().unwrap().clone();
        assert!(!lines.iter().any(|l| l == "catch up a from 100"), "{lines:?}");
    }

    #[actix_rt::test]
    async fn a_restart_during_a_catch_up_catches_up_again() {
        let stats = Arc::new(Stats::new());
        let (fleet, told) = FakeFleet::holding();
        let router = actix::Supervisor::start(move |_| Router::<Fake>::new(stats, fleet));
        let streams = welcomed(&router, 1).await;
        router.send(Subscribed::LinkDown).await.unwrap();
        router.send(Subscribed::Ids(vec![Arc::from("a")])).await.unwrap();
        eventually(|| told.lock().unwrap().iter().any(|l| l == "catch up a")).await;
        assert_eq!(router.send(Crash).await.unwrap(), None);
        // It catches up again, not as a new stream's first read (which
        // would end in a second welcome).
        eventually(|| told.lock().unwrap().iter().filter(|l| *l == "catch up a").count() == 2).await;
        assert!(!told.lock().unwrap().iter().any(|l| l == "read a"));
        assert_eq!(streams[0].2.welcomed.lock().unwrap().len(), 1);
    }

    #[actix_rt::test]
    async fn an_id_with_more_streams_than_a_window_is_handed_out_in_windows() {
        let n = AT_ONCE * 2;
        let (stats, router, fakes, logs) = setup(n).await;
        let (last, _, log) = log_in(&router, "z", None).await;
        for text in ["one", "two"] {
            let p = router.send(publish(text, None)).await.unwrap().unwrap().unwrap();
            assert_eq!(p.delivered, n);
        }
        let mut handed = 0;
        for f in &fakes {
            handed += f.send(Held).await.unwrap();
        }
        assert!(handed <= FANOUT_WINDOW, "handed {handed} of 2 × {n} at once");
        // Another id's message goes out at once.
        assert_eq!(sent(&router, "z", "now").await.delivered, 1);
        assert_eq!(last.send(Held).await.unwrap(), 1);
        last.send(Take).await.unwrap();
        assert_eq!(*log.took.lock().unwrap(), ["now"]);
        // Every stream of `a` gets both, in order, once the windows go round.
        for _ in 0..200 {
            for f in &fakes {
                f.send(Take).await.unwrap();
            }
            if stats.publish_backlog.load(Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for took in &logs {
            assert_eq!(*took.lock().unwrap(), ["one", "two"]);
        }
    }

    #[actix_rt::test]
    async fn a_presence_write_still_out_holds_back_the_next_one() {
        // A broker whose writes never finish (a Redis that does not
        // answer), asked every 5 ms: the first write is out, so every beat
        // after it waits instead of sending another.
        let stats = Arc::new(Stats::new());
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let fleet = FakeFleet {
            history: Mutex::new(crate::hub::history::History::new(16, Duration::from_secs(60))),
            told: Arc::default(),
            writes: Arc::clone(&writes),
            presence: Some(Duration::from_millis(5)),
            hold: false,
            slow: false,
        };
        let _router = Router::<Fake>::new(stats, Arc::new(fleet)).start();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(writes.load(Relaxed), 1, "writes overtook each other");
    }

    #[actix_rt::test]
    async fn a_stream_that_joined_after_a_read_is_not_handed_what_it_had() {
        let stats = Arc::new(Stats::new());
        let router = Router::<Fake>::new(Arc::clone(&stats), memory(16, &stats)).start();
        // As finish_read leaves it: in the table, with a floor at 20.
        let (s, conn, log) = log_in(&router, "f", None).await;
        router.send(Floor { conn, floor: 20 }).await.unwrap();
        for (event, text) in [(15, "old"), (20, "seen"), (21, "new"), (19, "late")] {
            let mut m = publish_to("f", text, None);
            m.event = Some(event);
            router.send(m).await.unwrap().unwrap().unwrap();
        }
        s.send(Take).await.unwrap();
        // Below or at the floor: not again; the first above ends the guard.
        assert_eq!(*log.took.lock().unwrap(), ["new", "late"]);
    }

    /// Test only: sets a stream's floor as a read would.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Floor {
        conn: ConnId,
        floor: u64,
    }

    impl Handler<Floor> for Router<Fake> {
        type Result = ();
        fn handle(&mut self, m: Floor, _: &mut Context<Self>) {
            self.floors.insert(m.conn, (m.floor, Instant::now()));
        }
    }
}
