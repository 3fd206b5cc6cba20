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
//! On the lean path (see [`crate::conn::classify`]) the actor owns the socket itself,
//! so an idle stream holds no HTTP framework buffers; on the fallback path it
//! feeds actix-web's streaming body. Either way it watches for the client
//! going away ([`Watch`]) and stops at once, which logs it out of the Router.

mod head;
mod sink;
mod ticker;
mod ws;

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{self, Poll};
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, ActorFuture, Addr, AsyncContext, Context, Handler, WeakAddr};
use actix_rt::net::TcpStream;

pub(crate) use head::Head;
pub(crate) use sink::BodyStream;
pub(crate) use sink::Framing;
use sink::{Counted, Sink, SinkError, Written};
use ticker::Tick;
use tungstenite::protocol::frame::coding::Control;

use crate::config::StreamSettings;
use crate::conn::handshake::{StreamRequest, Transport};
use crate::conn::socket::CloseHandle;
use crate::error::CorsAnswer;
use crate::hub::history::Resume;
use crate::hub::router::{
    Close, Cut, Deliver, Joined, Login, LoginAt, Logout, Note, NoteKind, Router, Welcome,
};
use crate::id::{ConnId, conn_age, next_conn_id};
use crate::stats::Stats;

/// How long a WebSocket that sent its close frame waits for the client's.
const WS_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How long a long-poll's written answer may wait for the client to read
/// it before the connection is cut.
const POLL_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// Reads of the client side per turn of the watcher before it yields.
const WATCH_READS: usize = 16;

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
    /// The limits per client address, the same handle as the
    /// [`Admission`](crate::admission::Admission)'s (a counted stream gives
    /// its place back when it stops).
    pub(crate) limits: Arc<crate::conn::edge::Limits>,
    /// `max_streams_per_id`: a stream of a limited id gives its place
    /// back when it stops.
    pub(crate) per_id: Arc<crate::per_id::PerId>,
}

/// Which path a stream came in by, which decides who writes its response
/// head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// The lean path: the stream owns its socket and writes its head.
    Lean,
    /// actix-web's fallback route: actix-web writes the head.
    Fallback,
}

/// A stream request that passed every check: what it asked for, whether
/// its page origin gets CORS headers, and how long its token has left.
pub(crate) struct Open {
    /// Transport, HTTP version, resume point, `ids`.
    pub(crate) req: StreamRequest,
    /// What CORS says to the page's origin, decided at admission: the
    /// lean path's response head writes it (actix-web's middleware writes
    /// a fallback's).
    pub(crate) cors: CorsAnswer,
    /// Bytes the client sent right behind its head: a WebSocket client's
    /// first frames, read as frames once the stream starts.
    pub(crate) early: Vec<u8>,
    /// The stream ends then (its subscriber token expires).
    pub(crate) expires: Option<Duration>,
    /// Where `limits.streams_per_ip` counted it, if it did.
    pub(crate) counted: Option<crate::conn::edge::Slot>,
    /// Its namespace sends `stream_joined` and `stream_left`, or has
    /// `presence_events`: the Router keeps it ([`Joined`]).
    pub(crate) member: Option<Box<crate::hub::router::Member>>,
}

/// What an event is, for SSE's `event:` line.
#[derive(Debug, Clone, Copy)]
enum EventKind {
    Welcome,
    Tick,
    Message,
    Gap,
    End,
    Join,
    Leave,
}

impl EventKind {
    fn name(self) -> &'static str {
        match self {
            EventKind::Welcome => "welcome",
            EventKind::Tick => "tick",
            EventKind::Message => "message",
            EventKind::Gap => "gap",
            EventKind::End => "end",
            EventKind::Join => "join",
            EventKind::Leave => "leave",
        }
    }
}

/// One streaming connection.
///
/// Kept small on purpose: the actor lives inside a tokio task cell that is
/// aligned to 128 bytes, so its size is rounded up to a multiple of 128;
/// what need not be inline is boxed ([`Core`], [`Tracking`]), and the test
/// below keeps the cell at 512 bytes (docs/architecture.md has
/// the per-stream breakdown).
pub(crate) struct Stream {
    /// Where events go.
    sink: Sink,
    /// A [`Flush`] is running; set while the sink holds pending bytes.
    flushing: bool,
    /// How the body is framed (chunked, or close-delimited for HTTP/1.0 and
    /// WebSocket).
    framing: Framing,
    /// How events are written.
    transport: Transport,
    /// `?ids=1`: plain lines and WebSocket frames start with the event id.
    ids: bool,
    /// What only SSE, WebSocket and resuming streams need; `None` for a
    /// plain stream, which pays nothing for them.
    tracking: Option<Box<Tracking>>,
    /// Its id, connection, count and the server's shared parts.
    core: Box<Core>,
    /// Where `limits.streams_per_ip` counted it (its address gets the
    /// place back when it stops).
    limit_slot: Option<crate::conn::edge::Slot>,
}

/// What every stream has, boxed out of its task cell.
struct Core {
    /// The id the client asked for; shared with the Router's table key.
    id: Arc<str>,
    /// Tells this connection apart from others with the same id.
    conn: ConnId,
    /// Events sent so far (ticks and messages share the count, as in the original).
    seq: u64,
    /// Router address, stats and limits, shared by every stream of the server.
    shared: Arc<Shared>,
}

/// What SSE, WebSocket and resuming streams track: their event position
/// and WebSocket frame state.
struct Tracking {
    /// The event id of the last message this stream was given (or where
    /// it started): every event carries it, so a client that reconnects
    /// with it resumes exactly after what it has.
    position: u64,
    /// The event id it resumes after, until the Router's Welcome.
    since: Option<u64>,
    /// WebSocket: a client frame half read.
    ws: Option<Box<ws::Inbox>>,
    /// WebSocket: our close frame is sent; nothing else goes out.
    closing: bool,
    /// Long-poll: the answer's bytes so far (its budget is half of
    /// `stream.max_pending_bytes`).
    poll_bytes: u32,
    /// Long-poll: how far its answer is.
    poll: PollFlags,
}

/// A long-poll's answer, written as it comes: its start
/// (`{"id":..,"messages":[`) with the first message or at the end, each
/// message as a piece of its own (so each is counted written or dropped
/// as a stream's message is, and no batch is held here), then its tail
/// (`],"last_event_id":N,"gap":B}`) once the messages already on their way
/// have joined the first ([`EndPoll`]), at the timeout, or when the stream
/// is ended from this side. Bits in one byte, beside `poll_bytes`, so that
/// [`Tracking`] stays in a 48-byte allocation for every tracked stream.
#[derive(Default, Clone, Copy)]
struct PollFlags(u8);

impl PollFlags {
    /// The answer's start is written.
    const STARTED: u8 = 1;
    /// The resume said messages may be missing before these.
    const GAP: u8 = 2;
    /// The tail is due ([`EndPoll`] spawned once, however many messages come).
    const ENDING: u8 = 4;
    /// The tail is written: nothing more goes in; the stream stops once
    /// the answer is with the kernel.
    const DONE: u8 = 8;
    /// The Router's Welcome came: the answer knows where the id stands.
    const WELCOMED: u8 = 16;
    /// The answer's end came before the Welcome: it ends with it.
    const DUE: u8 = 32;
    /// The answer reached its byte budget: later messages wait for the
    /// next poll (they are kept, or a gap tells of them).
    const FULL: u8 = 64;
    /// `?wait=0`: a question of where the id stands; no linger after it.
    const AT_ONCE: u8 = 128;

    fn has(self, flag: u8) -> bool {
        self.0 & flag != 0
    }

    fn set(&mut self, flag: u8) {
        self.0 |= flag;
    }
}

impl Stream {
    /// Starts a lean stream on the current worker: the actor owns `io`,
    /// whose request head has been read, and writes its response head. The
    /// stream was admitted (`Admission::admit_stream`).
    pub(crate) fn start_lean(io: TcpStream, id: Arc<str>, open: Open, shared: Arc<Shared>) {
        let _ = io.set_nodelay(true);
        Stream::launch(id, Sink::socket(io), open, shared, Via::Lean);
    }

    /// [`Stream::start_lean`] on a TLS connection.
    pub(crate) fn start_lean_tls(
        io: TcpStream,
        session: crate::conn::tls::Session,
        id: Arc<str>,
        open: Open,
        shared: Arc<Shared>,
    ) {
        let _ = io.set_nodelay(true);
        Stream::launch(id, Sink::tls(io, session), open, shared, Via::Lean);
    }

    /// Starts a fallback stream feeding an actix-web streaming body, which it
    /// returns; actix-web writes the response head ([`Head`]). The stream
    /// was admitted (`Admission::admit_stream`).
    /// `close` closes the connection under the body if the stream is cut.
    pub(crate) fn start_body(
        id: Arc<str>,
        open: Open,
        shared: Arc<Shared>,
        close: Option<CloseHandle>,
    ) -> BodyStream {
        let (sink, body) = Sink::body(Arc::clone(&shared.stats), close);
        Stream::launch(id, sink, open, shared, Via::Fallback);
        body
    }

    /// Writes the response head on the lean path (and SSE's `retry:`),
    /// arms the token's expiry, and starts the actor.
    fn launch(id: Arc<str>, sink: Sink, open: Open, shared: Arc<Shared>, via: Via) {
        let transport = open.req.transport;
        match transport {
            Transport::Plain => {}
            Transport::Sse => drop(shared.stats.streams_sse.fetch_add(1, Relaxed)),
            Transport::Ws => drop(shared.stats.streams_ws.fetch_add(1, Relaxed)),
            Transport::Poll => drop(shared.stats.streams_poll.fetch_add(1, Relaxed)),
        }
        // The lean path writes the response head; actix-web writes a
        // fallback's (`routes::stream`) and frames its body itself: the
        // sink writes chunks.
        let head = (via == Via::Lean).then(|| Head::of(&open));
        let framing = head.as_ref().map_or(Framing::Chunked, Head::framing);
        let needs_tracking = transport != Transport::Plain || open.req.ids || open.req.since.is_some();
        let retry = (transport == Transport::Sse).then_some(shared.settings.sse_retry_ms);
        let mut stream = Stream::new(id, sink, framing, shared, via == Via::Fallback);
        stream.limit_slot = open.counted;
        stream.transport = transport;
        stream.ids = open.req.ids;
        stream.tracking = needs_tracking.then(|| {
            Box::new(Tracking {
                position: 0,
                since: open.req.since,
                ws: None,
                closing: false,
                poll_bytes: 0,
                poll: PollFlags::default(),
            })
        });
        let max = stream.core.shared.settings.max_pending_bytes;
        let stats = Arc::clone(&stream.core.shared.stats);
        // Formatted in the worker's scratch buffer: no allocation per
        // stream, even a transient one (see `classify::PEEK_BYTES`).
        let mut opened = Ok(Written::Done);
        if let Some(head) = head {
            opened = LINE.with_borrow_mut(|buf| {
                buf.clear();
                head.write(buf);
                stream.sink.open(buf, max, &stats)
            });
        }
        if let (Ok(_), Some(ms)) = (opened, retry) {
            let line = format!("retry: {ms}\n\n");
            opened = stream
                .sink
                .push_line(line.as_bytes(), framing, Counted::Other, max, &stats);
        }
        let member = open.member;
        // Runs at once, on this worker, with the actor's context.
        Stream::create(move |ctx| {
            // Before the stream's Login (sent when it starts) and its
            // Logout (when it is dropped), from this thread: the Router gets
            // it first.
            if let Some(member) = member {
                stream.core.shared.router.do_send(Joined {
                    conn: stream.core.conn,
                    id: Arc::clone(&stream.core.id),
                    member,
                    addr: ctx.address().downgrade(),
                });
            }
            match opened {
                Ok(Written::Pending) => {
                    stream.flushing = true;
                    ctx.spawn(Flush);
                }
                Ok(Written::Done) => {}
                Err(_) => ctx.stop(),
            }
            // Frames a WebSocket client sent right behind its handshake.
            if opened.is_ok() && stream.transport == Transport::Ws && !open.early.is_empty() {
                stream.ws_input(ctx, &open.early);
            }
            if stream.transport == Transport::Poll {
                let most = stream.core.shared.settings.poll_timeout();
                // The worker's wheel, not a timer per poll: its first Tick
                // ends the poll, with or without the Router's Welcome.
                ticker::register_poll(ctx.address().downgrade(), most);
                match open.req.wait_ms.map(Duration::from_millis) {
                    // A shorter wait, asked for: a timer of its own, which
                    // ends it once the Welcome said where the id stands.
                    Some(wait) if wait < most => {
                        if wait.is_zero()
                            && let Some(tracking) = stream.tracking.as_mut()
                        {
                            tracking.poll.set(PollFlags::AT_ONCE);
                        }
                        ctx.run_later(wait, |s: &mut Stream, ctx| s.poll_end(ctx, false));
                    }
                    _ => {}
                }
            }
            if let Some(left) = open.expires {
                ctx.run_later(left, |s: &mut Stream, ctx| {
                    s.core.shared.stats.tokens_expired.fetch_add(1, Relaxed);
                    s.end(ctx, ws::POLICY, "token expired", Some("Token expired"));
                });
            }
            stream
        });
    }

    fn new(id: Arc<str>, sink: Sink, framing: Framing, shared: Arc<Shared>, fallback: bool) -> Self {
        shared.stats.stream_opened(fallback);
        Stream {
            sink,
            flushing: false,
            framing,
            transport: Transport::Plain,
            ids: false,
            tracking: None,
            core: Box::new(Core {
                id,
                conn: next_conn_id(),
                seq: 0,
                shared,
            }),
            limit_slot: None,
        }
    }

    /// After an event was pushed: count it and drive a flush if bytes wait;
    /// or stop the stream (client gone, or too slow: see the policy in
    /// `sink.rs`). Returns whether the stream goes on.
    fn after_write(&mut self, ctx: &mut Context<Self>, result: Result<Written, SinkError>) -> bool {
        match result {
            Ok(written) => {
                self.core.shared.stats.chunks_sent.fetch_add(1, Relaxed);
                if written == Written::Pending && !self.flushing {
                    self.flushing = true;
                    ctx.spawn(Flush);
                }
                true
            }
            Err(SinkError::Full) => {
                self.core.shared.stats.slow_disconnects.fetch_add(1, Relaxed);
                tracing::debug!(id = %self.core.id, "client not reading; pending bound reached, disconnecting");
                ctx.stop();
                false
            }
            Err(SinkError::Closed) => {
                ctx.stop();
                false
            }
        }
    }

    /// Writes one event in the stream's format: `line` is its text (the
    /// plain line). Returns whether the stream goes on (a WebSocket that
    /// has sent its close frame writes nothing more: false).
    fn emit(
        &mut self,
        ctx: &mut Context<Self>,
        kind: EventKind,
        counted: Counted,
        line: fmt::Arguments<'_>,
    ) -> bool {
        if self.tracking.as_ref().is_some_and(|tracking| tracking.closing) {
            return false;
        }
        let position = self.tracking.as_ref().map_or(0, |tracking| tracking.position);
        let (transport, ids, framing) = (self.transport, self.ids, self.framing);
        let max = self.core.shared.settings.max_pending_bytes;
        let (sink, stats) = (&mut self.sink, &self.core.shared.stats);
        let written = LINE.with_borrow_mut(|buf| {
            buf.clear();
            // unwrap (each write): writing into a Vec cannot fail.
            match transport {
                Transport::Plain => {
                    if ids {
                        write!(buf, "{position} ").expect("format into Vec");
                    }
                    buf.write_fmt(line).expect("format into Vec");
                    buf.push(b'\n');
                    sink.push_line(buf, framing, counted, max, stats)
                }
                Transport::Sse => {
                    write!(buf, "id: {position}\nevent: {}\ndata: ", kind.name()).expect("format into Vec");
                    buf.write_fmt(line).expect("format into Vec");
                    buf.extend_from_slice(b"\n\n");
                    sink.push_line(buf, framing, counted, max, stats)
                }
                // A long-poll writes no events, only its answer
                // (`Stream::poll_message`, `Stream::poll_end`).
                Transport::Poll => Ok(Written::Done),
                Transport::Ws => {
                    // Room for the frame header, written once the length is known.
                    buf.extend_from_slice(&[0; 10]);
                    if ids {
                        write!(buf, "{position} ").expect("format into Vec");
                    }
                    buf.write_fmt(line).expect("format into Vec");
                    let mut head = [0u8; 10];
                    let n = ws::header(ws::TEXT, buf.len() - 10, &mut head);
                    buf[10 - n..10].copy_from_slice(&head[..n]);
                    sink.push_line(&buf[10 - n..], Framing::Close, counted, max, stats)
                }
            }
        });
        self.after_write(ctx, written)
    }

    /// Writes raw bytes (a WebSocket control frame).
    fn emit_raw(&mut self, ctx: &mut Context<Self>, bytes: &[u8]) -> bool {
        let max = self.core.shared.settings.max_pending_bytes;
        let written = self.sink.push_line(
            bytes,
            Framing::Close,
            Counted::Other,
            max,
            &self.core.shared.stats,
        );
        self.after_write(ctx, written)
    }

    /// Ends the stream from this side: a WebSocket sends a close frame with
    /// `code` and `reason` and waits a moment for the client's; other
    /// transports write `line` (if any) and the end of the body.
    fn end(&mut self, ctx: &mut Context<Self>, code: u16, reason: &str, line: Option<&str>) {
        if self.transport == Transport::Poll {
            // What arrived so far is its answer; the client polls again
            // (and learns then why it may not). Before its Welcome it
            // knows nothing to answer with: it closes, and the client
            // polls again from where it was.
            if self
                .tracking
                .as_ref()
                .is_some_and(|t| t.poll.has(PollFlags::WELCOMED))
            {
                self.poll_end(ctx, false);
            } else {
                ctx.stop();
            }
            return;
        }
        if self.transport == Transport::Ws {
            let frame = ws::close(code, reason);
            if self.tracking.as_ref().is_some_and(|tracking| tracking.closing) || !self.emit_raw(ctx, &frame)
            {
                return;
            }
            if let Some(tracking) = &mut self.tracking {
                tracking.closing = true;
            }
            ctx.run_later(WS_CLOSE_WAIT, |_, ctx| ctx.stop());
            return;
        }
        if let Some(line) = line {
            self.emit(ctx, EventKind::End, Counted::Other, format_args!("{line}"));
        }
        self.sink.finish(self.framing, &self.core.shared.stats);
        ctx.stop();
    }

    /// Bytes a WebSocket client sent. Returns whether to keep reading.
    fn ws_input(&mut self, ctx: &mut Context<Self>, bytes: &[u8]) -> bool {
        let Some(tracking) = self.tracking.as_mut() else {
            return true;
        };
        let inbox = tracking.ws.get_or_insert_with(Box::default);
        let mut actions = Vec::new();
        inbox.feed(bytes, &mut actions);
        if inbox.is_idle() {
            tracking.ws = None;
        }
        let closing = tracking.closing;
        let stats = Arc::clone(&self.core.shared.stats);
        for action in actions {
            match action {
                ws::Action::Ignored => drop(stats.ws_frames_ignored.fetch_add(1, Relaxed)),
                ws::Action::Pong(payload) => {
                    stats.ws_pings.fetch_add(1, Relaxed);
                    if !closing && !self.emit_raw(ctx, &ws::control(Control::Pong, &payload)) {
                        return false;
                    }
                }
                ws::Action::Close(code) => {
                    if !closing {
                        // Echo the client's code (the inbox let through only
                        // codes that may be sent, and 1005 for none).
                        let frame = if ws::sendable(code) {
                            ws::close(code, "")
                        } else {
                            ws::control(Control::Close, &[])
                        };
                        self.emit_raw(ctx, &frame);
                    }
                    ctx.stop();
                    return false;
                }
                ws::Action::Fail(code, reason) => {
                    stats.ws_protocol_errors.fetch_add(1, Relaxed);
                    tracing::debug!(id = %self.core.id, code, reason, "WebSocket client broke the protocol; closing");
                    if !closing {
                        self.emit_raw(ctx, &ws::close(code, reason));
                    }
                    ctx.stop();
                    return false;
                }
            }
        }
        true
    }
}

impl Handler<Tick> for Stream {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        if self.transport == Transport::Poll {
            // A poll gets no ticks: this is its timeout
            // (`ticker::register_poll`).
            self.poll_end(ctx, true);
            return;
        }
        self.core.seq += 1;
        let (seq, id) = (self.core.seq, Arc::clone(&self.core.id));
        self.emit(
            ctx,
            EventKind::Tick,
            Counted::Other,
            format_args!("Chunk {seq} for id {id}"),
        );
    }
}

thread_local! {
    /// Scratch space for formatting one event; one per worker thread.
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
        let login = Login {
            id: Arc::clone(&self.core.id),
            conn: self.core.conn,
            addr: me.clone(),
        };
        match &self.tracking {
            None => self.core.shared.router.do_send(login),
            Some(tracking) => self.core.shared.router.do_send(LoginAt {
                login,
                since: tracking.since,
                poll: self.transport == Transport::Poll,
            }),
        }
        ctx.spawn(Watch);
        // A stream with event ids waits for the Router's Welcome, which
        // says where it starts (and what it missed).
        if !self.core.shared.await_welcome && self.tracking.is_none() {
            self.welcome(ctx, me, Resume::default());
        }
    }
}

/// A stream's registrations are given back when the actor is dropped, not
/// in `stopped()`: a panic inside one of its handlers drops the actor
/// without calling `stopped()`, and its Router entry, counters and
/// per-address slot must not leak with it (issue 40).
impl Drop for Stream {
    fn drop(&mut self) {
        // A long-poll that gave its answer lingers in presence: its
        // client is expected back.
        let answered = self
            .tracking
            .as_ref()
            .is_some_and(|t| t.poll.has(PollFlags::DONE) && !t.poll.has(PollFlags::AT_ONCE));
        let linger = self.core.shared.settings.poll_linger();
        self.core.shared.router.do_send(Logout {
            id: Arc::clone(&self.core.id),
            conn: self.core.conn,
            linger: (answered && !linger.is_zero()).then_some(linger),
        });
        let stats = &self.core.shared.stats;
        // Messages still pending never reached the client's kernel.
        stats
            .messages_dropped
            .fetch_add(self.sink.pending_messages() as u64, Relaxed);
        stats.stream_closed(conn_age(self.core.conn));
        if let Some(slot) = self.limit_slot {
            self.core.shared.limits.stream_closed(slot);
        }
        self.core.shared.per_id.closed(&self.core.id);
    }
}

impl Stream {
    /// Writes the welcome line, then (resuming) a gap notice and the kept
    /// messages it missed, and starts the ticks (`me`: this actor, for the
    /// tick wheel; one address made per stream start, not two).
    fn welcome(&mut self, ctx: &mut Context<Self>, me: WeakAddr<Self>, resume: Resume) {
        if let Some(tracking) = &mut self.tracking {
            tracking.position = resume.position;
        }
        if self.transport == Transport::Poll {
            // No welcome line and no ticks: what it missed is its answer
            // now; if nothing, it waits for the next message (unless its
            // wait is already over).
            self.catch_up(ctx, resume, true);
            if let Some(tracking) = self.tracking.as_mut() {
                tracking.poll.set(PollFlags::WELCOMED);
                if tracking.poll.has(PollFlags::DUE) {
                    self.poll_end_soon(ctx);
                }
            }
            return;
        }
        let id = Arc::clone(&self.core.id);
        let ok = self.emit(
            ctx,
            EventKind::Welcome,
            Counted::Other,
            format_args!("Switchboard welcomes you! Your Id: {id}"),
        );
        let ok = self.catch_up(ctx, resume, ok);
        if ok {
            ticker::register(me, self.core.shared.settings.tick_interval());
        }
    }

    /// Writes a gap notice (if any) and the kept messages of `resume`:
    /// after the welcome line, or (cluster mode) when the stream catches
    /// up on what it missed while the node's link to Redis was down.
    /// `ok`: the stream can still write (if not, the messages are counted
    /// dropped). Returns whether everything was written.
    fn catch_up(&mut self, ctx: &mut Context<Self>, resume: Resume, mut ok: bool) -> bool {
        if self.transport == Transport::Poll {
            // A gap is told in the answer (`"gap": true`), which comes
            // with the kept messages, or when the next one arrives: a
            // gap with nothing kept does not answer at once (with no
            // history at all it would, for every poll, and the client
            // would spin). Kept messages past the answer's byte budget
            // wait for the next poll (from the last one written).
            if let Some(tracking) = self.tracking.as_mut()
                && resume.gap.is_some()
                && !tracking.poll.has(PollFlags::DONE)
            {
                tracking.poll.set(PollFlags::GAP);
            }
            for (event, msg) in resume.replay {
                if !self.poll_message(ctx, &msg, Some(event), None) {
                    break;
                }
            }
            return ok;
        }
        if let (true, Some(gap)) = (ok, resume.gap) {
            let after = gap.after;
            ok = match gap.next {
                Some(next) => self.emit(
                    ctx,
                    EventKind::Gap,
                    Counted::Other,
                    format_args!(
                        "Gap: messages after event {after} may be missing; history resumes at event {next}"
                    ),
                ),
                None => self.emit(
                    ctx,
                    EventKind::Gap,
                    Counted::Other,
                    format_args!("Gap: messages after event {after} may be missing; new messages follow"),
                ),
            };
        }
        let total = resume.replay.len();
        for (i, (event, msg)) in resume.replay.into_iter().enumerate() {
            if !ok {
                // Not written: dropped, as a refused Deliver is.
                let left = (total - i) as u64;
                self.core.shared.stats.messages_dropped.fetch_add(left, Relaxed);
                break;
            }
            ok = self.message(ctx, &msg, Some(event), None);
        }
        ok
    }

    /// Writes one message; one refused is counted dropped here (one
    /// written is counted by the sink).
    /// `accepted`: when this node took it, for the latency histogram
    /// (`None`: a replay from history).
    fn message(
        &mut self,
        ctx: &mut Context<Self>,
        msg: &str,
        event: Option<u64>,
        accepted: Option<Instant>,
    ) -> bool {
        if self.transport == Transport::Poll {
            return self.poll_message(ctx, msg, event, accepted);
        }
        if let (Some(tracking), Some(event)) = (&mut self.tracking, event) {
            tracking.position = tracking.position.max(event);
        }
        self.core.seq += 1;
        let seq = self.core.seq;
        let ok = self.emit(
            ctx,
            EventKind::Message,
            Counted::Message(accepted),
            format_args!("Recvd msg #{seq}: '{msg}'"),
        );
        if !ok {
            self.core.shared.stats.messages_dropped.fetch_add(1, Relaxed);
        }
        ok
    }
}

/// A long-poll's answer.
impl Stream {
    /// Writes one message into the answer (its start first, if this is
    /// the first), and has the answer end soon ([`Stream::poll_end_soon`]).
    /// Returns whether it was written. A live message (`accepted`) that
    /// was not is counted dropped; the client's next poll gets it from
    /// history (or is told of a gap). A replay (`accepted` `None`) past
    /// the answer's byte budget stops there, uncounted: the next poll
    /// starts from the last one written.
    fn poll_message(
        &mut self,
        ctx: &mut Context<Self>,
        msg: &str,
        event: Option<u64>,
        accepted: Option<Instant>,
    ) -> bool {
        let Some(tracking) = self.tracking.as_mut() else {
            return false;
        };
        let refuse = |stream: &Stream| {
            if accepted.is_some() {
                stream.core.shared.stats.messages_dropped.fetch_add(1, Relaxed);
            }
            false
        };
        if tracking.poll.has(PollFlags::DONE) || tracking.poll.has(PollFlags::FULL) {
            return refuse(self);
        }
        let first = !tracking.poll.has(PollFlags::STARTED);
        let budget = self.core.shared.settings.max_pending_bytes / 2;
        let (framing, max) = (self.framing, self.core.shared.settings.max_pending_bytes);
        let (sink, stats, id) = (&mut self.sink, &self.core.shared.stats, &self.core.id);
        let used = tracking.poll_bytes as usize;
        let written = LINE.with_borrow_mut(|buf| {
            buf.clear();
            if first {
                poll_start(buf, id);
            } else {
                buf.push(b',');
            }
            buf.extend_from_slice(b"{\"event_id\":");
            match event {
                Some(event) => write!(buf, "{event}").expect("format into Vec"),
                None => buf.extend_from_slice(b"null"),
            }
            buf.extend_from_slice(b",\"data\":");
            // unwrap: a string always serializes.
            serde_json::to_writer(&mut *buf, msg).expect("a string serializes");
            buf.push(b'}');
            // The first message always goes (its bytes are bounded by
            // message.max_bytes, below the pending bound); later ones
            // only within the budget, so that a large replay cannot make
            // every answer too big to send, poll after poll.
            if !first && used + buf.len() > budget {
                return None;
            }
            Some((
                buf.len(),
                sink.push_line(buf, framing, Counted::Message(accepted), max, stats),
            ))
        });
        let Some((len, written)) = written else {
            tracking.poll.set(PollFlags::FULL);
            return refuse(self);
        };
        tracking.poll_bytes = tracking.poll_bytes.saturating_add(len as u32);
        tracking.poll.set(PollFlags::STARTED);
        if written.is_err() {
            self.after_write(ctx, written);
            return refuse(self);
        }
        if let Some(event) = event {
            tracking.position = tracking.position.max(event);
        }
        self.after_write(ctx, written);
        self.poll_end_soon(ctx);
        true
    }

    /// Has the answer end once the actor has handled what is in its
    /// mailbox now ([`EndPoll`]), so messages already there join it.
    fn poll_end_soon(&mut self, ctx: &mut Context<Self>) {
        if let Some(tracking) = self.tracking.as_mut()
            && !tracking.poll.has(PollFlags::ENDING)
        {
            tracking.poll.set(PollFlags::ENDING);
            // Not a zero timer: the timer wheel's millisecond would be
            // most of a poll's latency on loopback.
            ctx.spawn(EndPoll);
        }
    }

    /// Writes the answer's tail (and its start, if no message came) and
    /// ends the response; the stream stops once it is with the kernel.
    /// Before the Router's Welcome a poll does not know where its id
    /// stands: it waits for it (a `?wait` timer, or `?wait=0`), unless
    /// `force` (its timeout: the Welcome has not come in
    /// `stream.poll_timeout_ms`, a cluster bus down), when it answers
    /// with nothing, from where it asked (`since`, or `null`).
    fn poll_end(&mut self, ctx: &mut Context<Self>, force: bool) {
        let Some(tracking) = self.tracking.as_mut() else {
            ctx.stop();
            return;
        };
        if tracking.poll.has(PollFlags::DONE) {
            return;
        }
        let welcomed = tracking.poll.has(PollFlags::WELCOMED);
        if !welcomed && !force {
            tracking.poll.set(PollFlags::DUE);
            return;
        }
        tracking.poll.set(PollFlags::DONE);
        let position = if welcomed {
            Some(tracking.position)
        } else {
            tracking.since
        };
        let (gap, empty) = (
            tracking.poll.has(PollFlags::GAP),
            !tracking.poll.has(PollFlags::STARTED),
        );
        let (framing, max) = (self.framing, self.core.shared.settings.max_pending_bytes);
        let (sink, stats, id) = (&mut self.sink, &self.core.shared.stats, &self.core.id);
        let written = LINE.with_borrow_mut(|buf| {
            buf.clear();
            if empty {
                poll_start(buf, id);
            }
            match position {
                Some(at) => write!(buf, "],\"last_event_id\":{at},\"gap\":{gap}}}"),
                None => write!(buf, "],\"last_event_id\":null,\"gap\":{gap}}}"),
            }
            .expect("format into Vec");
            sink.push_line(buf, framing, Counted::Other, max, stats)
        });
        if !self.after_write(ctx, written) {
            return;
        }
        self.sink.finish(self.framing, &self.core.shared.stats);
        if !self.sink.is_pending() {
            ctx.stop();
            return;
        }
        // The answer waits for the client to read it ([`Flush`] stops the
        // stream once it has); one that never does is cut.
        if !self.flushing {
            self.flushing = true;
            ctx.spawn(Flush);
        }
        ctx.run_later(POLL_FLUSH_WAIT, |_, ctx| ctx.stop());
    }
}

/// A long-poll answer's start: `{"id":<id>,"messages":[`.
fn poll_start(buf: &mut Vec<u8>, id: &str) {
    buf.extend_from_slice(b"{\"id\":");
    // unwrap: a string always serializes.
    serde_json::to_writer(&mut *buf, id).expect("a string serializes");
    buf.extend_from_slice(b",\"messages\":[");
}

impl Handler<Welcome> for Stream {
    type Result = ();

    fn handle(&mut self, w: Welcome, ctx: &mut Context<Self>) {
        let again = w.again;
        let resume = w.arrived();
        if again {
            self.catch_up(ctx, resume, true);
        } else {
            let me = ctx.address().downgrade();
            self.welcome(ctx, me, resume);
        }
    }
}

impl Handler<Deliver> for Stream {
    type Result = ();

    fn handle(&mut self, m: Deliver, ctx: &mut Context<Self>) {
        let (msg, event, accepted) = m.arrived();
        self.message(ctx, &msg, event, Some(accepted));
    }
}

impl Handler<Note> for Stream {
    type Result = ();

    /// `join` or `leave` of another stream of its id: SSE `event: join`
    /// with the JSON as its data; a line or text frame `Join: <json>`.
    fn handle(&mut self, note: Note, ctx: &mut Context<Self>) {
        let kind = match note.kind {
            NoteKind::Join => EventKind::Join,
            NoteKind::Leave => EventKind::Leave,
        };
        let json = &note.json;
        let _ = match (self.transport, note.kind) {
            // A long-poll's answer holds messages only.
            (Transport::Poll, _) => true,
            (Transport::Sse, _) => self.emit(ctx, kind, Counted::Other, format_args!("{json}")),
            (_, NoteKind::Join) => self.emit(ctx, kind, Counted::Other, format_args!("Join: {json}")),
            (_, NoteKind::Leave) => self.emit(ctx, kind, Counted::Other, format_args!("Leave: {json}")),
        };
    }
}

impl Handler<Close> for Stream {
    type Result = ();

    fn handle(&mut self, _: Close, ctx: &mut Context<Self>) {
        self.end(ctx, ws::GOING_AWAY, "server shutting down", None);
    }
}

impl Handler<Cut> for Stream {
    type Result = ();

    fn handle(&mut self, cut: Cut, ctx: &mut Context<Self>) {
        assert!(!cut.panic, "fault injection: a stream panics in a handler");
        ctx.stop();
    }
}

/// Watches the client side: stops the stream when the client goes, and
/// reads what a WebSocket client sends. Holds no state of its own
/// (zero-sized, so spawning it allocates nothing).
struct Watch;

impl ActorFuture<Stream> for Watch {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut Stream,
        ctx: &mut Context<Stream>,
        cx: &mut task::Context<'_>,
    ) -> Poll<()> {
        for _ in 0..WATCH_READS {
            let mut scratch = [0u8; 64];
            let read = act.sink.poll_read(cx, &mut scratch, &act.core.shared.stats);
            // A TLS stream's read may have had TLS answer (a warning alert)
            // behind pending bytes: drive them out.
            if act.sink.is_pending() && !act.flushing {
                act.flushing = true;
                ctx.spawn(Flush);
            }
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    ctx.stop();
                    return Poll::Ready(());
                }
                // Anything else a client sends after its head is ignored.
                Poll::Ready(Some(n)) => {
                    if act.transport == Transport::Ws && !act.ws_input(ctx, &scratch[..n]) {
                        return Poll::Ready(());
                    }
                }
            }
        }
        // More to read: let the other tasks of this worker run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Ends a long-poll's answer ([`Stream::poll_end`]) the next time the
/// actor's spawned futures are polled: after the messages its mailbox
/// holds now. Zero-sized.
struct EndPoll;

impl ActorFuture<Stream> for EndPoll {
    type Output = ();

    fn poll(
        self: Pin<&mut Self>,
        act: &mut Stream,
        ctx: &mut Context<Stream>,
        _: &mut task::Context<'_>,
    ) -> Poll<()> {
        act.poll_end(ctx, false);
        Poll::Ready(())
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
        match act.sink.poll_flush(cx, &act.core.shared.stats) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                act.flushing = false;
                let answered = act.tracking.as_ref().is_some_and(|t| t.poll.has(PollFlags::DONE));
                if result.is_err() || answered {
                    ctx.stop();
                }
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// At 400 bytes of future the task cell is 512; past that it becomes
    /// 640, and every idle stream pays 128 bytes more (docs/design-notes.md).
    ///
    /// The limit is the release layout's. tokio's socket is 8 bytes larger
    /// in a debug build (what `cargo test` compiles), so the socket's own
    /// size is taken out: everything else in the future may be 368 bytes,
    /// the release socket 32.
    #[test]
    fn stream_task_cell_stays_at_512_bytes() {
        use std::mem::size_of;
        let future = size_of::<actix::dev::ContextFut<super::Stream, actix::Context<super::Stream>>>();
        let socket = size_of::<actix_rt::net::TcpStream>();
        assert!(
            future - socket <= 400 - 32,
            "ContextFut<Stream> is {future} bytes, of which the socket {socket}"
        );
        if !cfg!(debug_assertions) {
            assert_eq!(socket, 32, "tokio's socket changed size: recheck the limit");
        }
    }
}
