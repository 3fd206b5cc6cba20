//! The Stream actor: one per `GET /test/{id}` connection.
//!
//! It writes a welcome line, a tick every `stream.tick_interval_ms`, and every
//! message the Router delivers, each as one chunk holding one line:
//!
//! ```text
//! Switchboard welcomes you! Your Id: foo
//! Chunk 1 for id foo
//! Recvd msg #2: 'hello'
//! ```
//!
//! On the lean path (see [`crate::classify`]) the actor owns the socket itself,
//! so an idle stream holds no HTTP framework buffers; on the fallback path it
//! feeds actix-web's streaming body. Either way it watches for the client
//! going away ([`Watch`]) and stops at once, which logs it out of the Router.

mod sink;
mod ticker;

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{self, Poll};

use actix::{Actor, ActorContext, ActorFuture, Addr, AsyncContext, Context, Handler, WeakAddr};
use actix_rt::net::TcpStream;

pub(crate) use sink::BodyStream;
use sink::{Event, Framing, Sink, SinkError, Written};
use ticker::Tick;

use crate::config::StreamSettings;
use crate::id::{ConnId, next_conn_id};
use crate::router::{Close, Deliver, Login, Logout, Router, Welcome};
use crate::socket::CloseHandle;
use crate::stats::Stats;

/// What every stream of one server shares, through one `Arc` each stream
/// points to rather than its own copies (a cloned `Addr` alone costs ~72
/// bytes per stream).
pub(crate) struct Shared {
    /// The `[stream]` settings.
    pub(crate) settings: StreamSettings,
    /// Counters for `/stats`.
    pub(crate) stats: Arc<Stats>,
    /// The supervised Router (its address survives restarts).
    pub(crate) router: Addr<Router<Stream>>,
    /// Cluster mode: a stream waits for the Router's [`Welcome`], sent once
    /// this node is subscribed to its id in Redis, before it writes its
    /// welcome line; so a client that has read it gets every message
    /// published after, from any node.
    pub(crate) await_welcome: bool,
}

/// One streaming connection.
///
/// Kept small on purpose: the actor lives inside a tokio task cell that is
/// aligned to 128 bytes, so its size is rounded up to a multiple of 128. With
/// everything inline the cell took 640 bytes; with the cold fields boxed it
/// takes 512, and the box 48 (the README's Architecture section has the
/// per-stream breakdown).
pub(crate) struct Stream {
    /// Where events go.
    sink: Sink,
    /// A [`Flush`] is running; set while the sink holds pending bytes.
    flushing: bool,
    /// How the body is framed (chunked, or close-delimited for HTTP/1.0).
    framing: Framing,
    /// The rest.
    f: Box<Fields>,
}

/// A stream's fields that need not sit in its task cell.
struct Fields {
    /// The id the client asked for; shared with the Router's table key.
    id: Arc<str>,
    /// Tells this connection apart from others with the same id.
    conn: ConnId,
    /// Events sent so far (ticks and messages share the count, as in the original).
    seq: u64,
    /// Router address, stats and limits, shared by every stream of the server.
    shared: Arc<Shared>,
}

impl Stream {
    /// Starts a lean stream on the current worker: the actor owns `io`, whose
    /// request head has been read. The caller has reserved a stream slot.
    /// `http10`: the client spoke HTTP/1.0 and gets a close-delimited body.
    pub(crate) fn start_lean(io: TcpStream, id: Arc<str>, http10: bool, shared: Arc<Shared>) {
        let _ = io.set_nodelay(true);
        let framing = if http10 { Framing::Close } else { Framing::Chunked };
        Stream::new(id, Sink::socket(io), framing, shared, false).start();
    }

    /// Starts a fallback stream feeding an actix-web streaming body, which it
    /// returns. The caller has reserved a stream slot.
    /// `close` closes the connection under the body if the stream is cut.
    pub(crate) fn start_body(id: Arc<str>, shared: Arc<Shared>, close: Option<CloseHandle>) -> BodyStream {
        let (sink, body) = Sink::body(Arc::clone(&shared.stats), close);
        Stream::new(id, sink, Framing::Chunked, shared, true).start();
        body
    }

    fn new(id: Arc<str>, sink: Sink, framing: Framing, shared: Arc<Shared>, fallback: bool) -> Self {
        shared.stats.stream_opened(fallback);
        Stream {
            sink,
            flushing: false,
            framing,
            f: Box::new(Fields {
                id,
                conn: next_conn_id(),
                seq: 0,
                shared,
            }),
        }
    }

    /// After an event was pushed: count it and drive a flush if bytes wait;
    /// or stop the stream (client gone, or too slow: see the policy in
    /// `sink.rs`). Returns whether the stream goes on.
    fn after_write(&mut self, ctx: &mut Context<Self>, result: Result<Written, SinkError>) -> bool {
        match result {
            Ok(written) => {
                self.f.shared.stats.chunks_sent.fetch_add(1, Relaxed);
                if written == Written::Pending && !self.flushing {
                    self.flushing = true;
                    ctx.spawn(Flush);
                }
                true
            }
            Err(SinkError::Full) => {
                self.f.shared.stats.slow_disconnects.fetch_add(1, Relaxed);
                tracing::debug!(id = %self.f.id, "client not reading; pending bound reached, disconnecting");
                ctx.stop();
                false
            }
            Err(SinkError::Closed) => {
                ctx.stop();
                false
            }
        }
    }
}

impl Handler<Tick> for Stream {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.f.seq += 1;
        let max = self.f.shared.settings.max_pending_bytes;
        let tick = push_line(
            &mut self.sink,
            self.framing,
            Event::Other,
            max,
            &self.f.shared.stats,
            format_args!("Chunk {} for id {}", self.f.seq, self.f.id),
        );
        self.after_write(ctx, tick);
    }
}

/// Formats `line` plus `\n` into the worker's scratch buffer and pushes it.
fn push_line(
    sink: &mut Sink,
    framing: Framing,
    event: Event,
    max_pending: usize,
    stats: &Stats,
    line: fmt::Arguments<'_>,
) -> Result<Written, SinkError> {
    LINE.with_borrow_mut(|buf| {
        buf.clear();
        // unwrap: writing into a Vec cannot fail.
        buf.write_fmt(line).expect("format into Vec");
        buf.push(b'\n');
        sink.push_line(buf, framing, event, max_pending, stats)
    })
}

thread_local! {
    /// Scratch space for formatting one event line; one per worker thread.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Actor for Stream {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Log in before the welcome goes out: a client that has read its
        // welcome and then publishes to its own id must find itself in the
        // Router (the Login is ahead of that Send in the Router's mailbox),
        // even if this thread is descheduled right after the write.
        //
        // Nothing keeps a strong address of a stream: the Router and the
        // ticker hold weak ones (see `router::tell`), and the Watch future
        // keeps the actor running until the client goes.
        let me = ctx.address().downgrade();
        self.f.shared.router.do_send(Login {
            id: Arc::clone(&self.f.id),
            conn: self.f.conn,
            addr: me.clone(),
        });
        let max = self.f.shared.settings.max_pending_bytes;
        match self.sink.open(self.framing, max, &self.f.shared.stats) {
            Ok(Written::Pending) => {
                self.flushing = true;
                ctx.spawn(Flush);
            }
            Ok(Written::Done) => {}
            Err(_) => return ctx.stop(),
        }
        ctx.spawn(Watch);
        if !self.f.shared.await_welcome {
            self.welcome(ctx, me);
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.f.shared.router.do_send(Logout {
            id: Arc::clone(&self.f.id),
            conn: self.f.conn,
        });
        let stats = &self.f.shared.stats;
        // Messages still pending never reached the client's kernel.
        stats
            .messages_dropped
            .fetch_add(self.sink.pending_messages() as u64, Relaxed);
        stats.stream_closed();
    }
}

impl Stream {
    /// Writes the welcome line and starts the ticks (`me`: this actor, for
    /// the tick wheel; one address made per stream start, not two).
    fn welcome(&mut self, ctx: &mut Context<Self>, me: WeakAddr<Self>) {
        let max = self.f.shared.settings.max_pending_bytes;
        let line = format_args!("Switchboard welcomes you! Your Id: {}", self.f.id);
        let stats = &self.f.shared.stats;
        let welcome = push_line(&mut self.sink, self.framing, Event::Other, max, stats, line);
        if self.after_write(ctx, welcome) {
            ticker::register(me, self.f.shared.settings.tick_interval());
        }
    }
}

impl Handler<Welcome> for Stream {
    type Result = ();

    fn handle(&mut self, _: Welcome, ctx: &mut Context<Self>) {
        let me = ctx.address().downgrade();
        self.welcome(ctx, me);
    }
}

impl Handler<Deliver> for Stream {
    type Result = ();

    fn handle(&mut self, m: Deliver, ctx: &mut Context<Self>) {
        let msg = m.arrived();
        self.f.seq += 1;
        let max = self.f.shared.settings.max_pending_bytes;
        let line = push_line(
            &mut self.sink,
            self.framing,
            Event::Message,
            max,
            &self.f.shared.stats,
            format_args!("Recvd msg #{}: '{}'", self.f.seq, msg),
        );
        // Written (now or once the pending bytes drain) is counted by the
        // sink; refused, it is dropped here.
        if !self.after_write(ctx, line) {
            self.f.shared.stats.messages_dropped.fetch_add(1, Relaxed);
        }
    }
}

impl Handler<Close> for Stream {
    type Result = ();

    fn handle(&mut self, _: Close, ctx: &mut Context<Self>) {
        self.sink.finish(self.framing, &self.f.shared.stats);
        ctx.stop();
    }
}

/// Watches the client side; stops the stream when the client goes. Holds no
/// state of its own (zero-sized, so spawning it allocates nothing).
struct Watch;

impl ActorFuture<Stream> for Watch {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut Stream,
        ctx: &mut Context<Stream>,
        cx: &mut task::Context<'_>,
    ) -> Poll<()> {
        let gone = act.sink.poll_gone(cx);
        if gone.is_ready() {
            ctx.stop();
        }
        gone
    }
}

/// Drains the sink's pending bytes into the socket as the client reads them.
/// Zero-sized; spawned only while there is something pending.
struct Flush;

impl ActorFuture<Stream> for Flush {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut Stream,
        ctx: &mut Context<Stream>,
        cx: &mut task::Context<'_>,
    ) -> Poll<()> {
        match act.sink.poll_flush(cx, &act.f.shared.stats) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                act.flushing = false;
                if result.is_err() {
                    ctx.stop();
                }
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The actor runs as a tokio task whose cell is aligned to 128 bytes:
    /// header 32 + scheduler and id 16 + the future + trailer 48, rounded up.
    /// At 400 bytes of future (plus its 8-byte stage tag) the cell is 512;
    /// past that it becomes 640, and
    /// every idle stream pays 128 bytes more (measured with heaptrack).
    #[test]
    fn stream_task_cell_stays_at_512_bytes() {
        let future =
            std::mem::size_of::<actix::dev::ContextFut<super::Stream, actix::Context<super::Stream>>>();
        assert!(future <= 400, "ContextFut<Stream> is {future} bytes");
    }
}
