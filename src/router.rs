//! The Router actor: stream id -> every open stream with that id.
//!
//! Like the Erlang original's ETS bag, one id may be open on several
//! connections; a message for the id goes to all of them. Streams register
//! themselves ([`Login`]) when they start and leave ([`Logout`]) when they
//! stop. The Router runs under a `Supervisor` on the first worker's arbiter; see
//! [`crate::supervision`] for what survives a panic.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use actix::{Actor, Context, Handler, Message, Supervised, WeakAddr};
use smallvec::SmallVec;

use crate::id::ConnId;
use crate::stats::Stats;
use crate::stream::{Close, Deliver, Stream};
use crate::supervision::guarded;

/// Below this many slots the table is never shrunk (shrinking costs a rehash).
const SHRINK_MIN_CAPACITY: usize = 1024;

/// The streams of one id. Nearly every id has one connection, kept inline.
type Streams = SmallVec<[(ConnId, WeakAddr<Stream>); 1]>;

/// Hands `m` to a stream if it still runs.
///
/// The table holds weak addresses: a strong `Addr` allocates two small `Arc`s
/// of sender state per clone, ~100 bytes for every idle stream. Upgrading
/// costs those allocations only while a message is being sent.
fn tell<M>(stream: &WeakAddr<Stream>, m: M)
where
    M: Message + std::marker::Send + 'static,
    M::Result: std::marker::Send,
    Stream: Handler<M>,
{
    if let Some(addr) = stream.upgrade() {
        addr.do_send(m);
    }
}

/// Routes messages to streams by id.
pub struct Router {
    /// id -> its open streams. The key is the same `Arc` the stream holds.
    table: HashMap<Arc<str>, Streams>,
    /// Total streams in `table`, for broadcast bookkeeping.
    streams: usize,
    /// Set by [`CloseAll`]: a stream that logs in afterwards is closed at once
    /// (its Login raced the shutdown).
    closing: bool,
    /// Where `messages.routed` and restarts are counted.
    stats: Arc<Stats>,
}

impl Router {
    /// An empty Router reporting into `stats`.
    pub fn new(stats: Arc<Stats>) -> Self {
        Router {
            table: HashMap::new(),
            streams: 0,
            closing: false,
            stats,
        }
    }

    /// Gives memory back once most of a large table has left: a `HashMap`
    /// keeps its peak capacity otherwise.
    fn maybe_shrink(&mut self) {
        let cap = self.table.capacity();
        if cap > SHRINK_MIN_CAPACITY && self.table.len() < cap / 4 {
            self.table.shrink_to_fit();
        }
    }
}

impl Actor for Router {
    type Context = Context<Self>;
}

impl Supervised for Router {
    /// After a crash: count it and drop streams that died meanwhile (their
    /// Logout may have been the message that was lost).
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.stats.router_restarts.fetch_add(1, Relaxed);
        self.table.retain(|_, streams| {
            streams.retain(|(_, stream)| stream.upgrade().is_some_and(|a| a.connected()));
            !streams.is_empty()
        });
        self.streams = self.table.values().map(SmallVec::len).sum();
        tracing::warn!(streams = self.streams, "router restarted; registrations kept");
    }
}

/// A stream has started and wants the messages for `id`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Login {
    /// The stream id.
    pub id: Arc<str>,
    /// Which connection (an id may have several).
    pub conn: ConnId,
    /// Where to deliver.
    pub addr: WeakAddr<Stream>,
}

/// A stream has stopped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Logout {
    /// The stream id it logged in with.
    pub id: Arc<str>,
    /// The connection that ended.
    pub conn: ConnId,
}

/// Deliver `msg` to every stream of `id`. Answers how many streams it was
/// handed to (`None` if the Router crashed handling it).
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub struct Send {
    /// Target id.
    pub id: String,
    /// One line of text, already validated.
    pub msg: Arc<str>,
}

/// Deliver `msg` to every stream. Answers how many.
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub struct Broadcast {
    /// One line of text, already validated.
    pub msg: Arc<str>,
}

/// Tell every stream to end (server shutdown). Answers how many were told.
#[derive(Message)]
#[rtype(result = "Option<usize>")]
pub struct CloseAll;

/// Fault injection: panic inside the handler.
#[derive(Message)]
#[rtype(result = "Option<()>")]
pub struct Crash;

impl Handler<Login> for Router {
    type Result = ();

    fn handle(&mut self, m: Login, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, _| {
            if r.closing {
                tell(&m.addr, Close);
            }
            r.table.entry(m.id).or_default().push((m.conn, m.addr));
            r.streams += 1;
        });
    }
}

impl Handler<Logout> for Router {
    type Result = ();

    fn handle(&mut self, m: Logout, ctx: &mut Context<Self>) {
        guarded(self, ctx, |r, _| {
            if let Some(streams) = r.table.get_mut(&*m.id) {
                let before = streams.len();
                streams.retain(|(conn, _)| *conn != m.conn);
                r.streams -= before - streams.len();
                if streams.is_empty() {
                    r.table.remove(&*m.id);
                    r.maybe_shrink();
                }
            }
        });
    }
}

impl Handler<Send> for Router {
    type Result = Option<usize>;

    fn handle(&mut self, m: Send, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(self, ctx, |r, _| {
            r.stats.messages_routed.fetch_add(1, Relaxed);
            let Some(streams) = r.table.get(m.id.as_str()) else {
                return 0;
            };
            for (_, stream) in streams {
                tell(
                    stream,
                    Deliver {
                        msg: Arc::clone(&m.msg),
                    },
                );
            }
            streams.len()
        })
    }
}

impl Handler<Broadcast> for Router {
    type Result = Option<usize>;

    fn handle(&mut self, m: Broadcast, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(self, ctx, |r, _| {
            r.stats.messages_routed.fetch_add(1, Relaxed);
            for (_, stream) in r.table.values().flatten() {
                tell(
                    stream,
                    Deliver {
                        msg: Arc::clone(&m.msg),
                    },
                );
            }
            r.streams
        })
    }
}

impl Handler<CloseAll> for Router {
    type Result = Option<usize>;

    fn handle(&mut self, _: CloseAll, ctx: &mut Context<Self>) -> Option<usize> {
        guarded(self, ctx, |r, _| {
            r.closing = true;
            for (_, stream) in r.table.values().flatten() {
                tell(stream, Close);
            }
            r.streams
        })
    }
}

impl Handler<Crash> for Router {
    type Result = Option<()>;

    fn handle(&mut self, _: Crash, ctx: &mut Context<Self>) -> Option<()> {
        guarded(self, ctx, |_, _| {
            panic!("fault injection: router crash requested")
        })
    }
}
