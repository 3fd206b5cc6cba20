//! floodtest's numbers: live counters, periodic reports (human lines, a
//! progress bar on a terminal, or JSON lines from a child process), and the
//! final summary.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rustls::ClientConfig;
use serde_json::{Value, json};

use super::Args;
use crate::latency::{Latency, Timeline};
use crate::target::Target;

/// How often the progress line is refreshed between reports.
pub(crate) const LIVE_PERIOD: Duration = Duration::from_millis(200);

/// Why a stream could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// Connection refused.
    Refused,
    /// Connect or response head took longer than `--connect-timeout`.
    Timeout,
    /// Reset or broken pipe before the stream was established.
    Reset,
    /// EADDRINUSE / EADDRNOTAVAIL: out of source ports.
    AddrInUse,
    /// EMFILE / ENFILE: out of file descriptors.
    Emfile,
    /// The server closed before answering.
    Eof,
    /// An HTTP status other than 200.
    Status(u16),
    /// Not a readable HTTP stream.
    Protocol,
    /// The TLS handshake (or a later record) failed: a certificate the
    /// client does not trust or that does not name the host, no common
    /// version or cipher suite, an alert from the server.
    Tls,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Classifies an I/O error.
    pub fn of(e: &io::Error) -> Self {
        if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
            return ErrorKind::Tls;
        }
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => return ErrorKind::Refused,
            Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL) => return ErrorKind::AddrInUse,
            Some(libc::EMFILE | libc::ENFILE) => return ErrorKind::Emfile,
            Some(libc::ETIMEDOUT) => return ErrorKind::Timeout,
            _ => {}
        }
        match e.kind() {
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted => {
                ErrorKind::Reset
            }
            io::ErrorKind::UnexpectedEof => ErrorKind::Eof,
            io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ => ErrorKind::Other,
        }
    }

    /// The key in reports and JSON.
    pub fn name(self) -> String {
        match self {
            ErrorKind::Refused => "refused".into(),
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Reset => "reset".into(),
            ErrorKind::AddrInUse => "eaddr".into(),
            ErrorKind::Emfile => "emfile".into(),
            ErrorKind::Eof => "eof".into(),
            ErrorKind::Status(code) => format!("http_{code}"),
            ErrorKind::Protocol => "protocol".into(),
            ErrorKind::Tls => "tls".into(),
            ErrorKind::Other => "other".into(),
        }
    }
}

/// Live counts of one process (single-threaded: plain cells).
pub(crate) struct Counters {
    active: Cell<u64>,
    closed: Cell<u64>,
    /// Streams this tool closed itself (`--lifetime`) before opening again.
    churned: Cell<u64>,
    chunks: Cell<u64>,
    established: Cell<u64>,
    /// When the last stream was established (for the connect rate).
    last_established: Cell<Option<Instant>>,
    errors: RefCell<BTreeMap<ErrorKind, u64>>,
    /// Which of this process's streams are open (message targets).
    open: RefCell<Vec<bool>>,
    /// Messages the server accepted (any 2xx: Nchan answers 201 or 202).
    pub(crate) msgs_sent: Cell<u64>,
    /// Messages that failed to send.
    pub(crate) send_errors: Cell<u64>,
    /// Streams that failed sends were delivered to anyway (a cluster node
    /// answering 503 still delivers to its own streams).
    pub(crate) partial: Cell<u64>,
    msgs_received: Cell<u64>,
    /// Per send stamp: accepted (+1) less arrived (−1), the zeros dropped.
    /// What is left once sending stops: positive, answered 2xx and never
    /// received; negative, received without a 2xx (a failed answer whose
    /// publish ran after all, or a message twice). Holds only messages in
    /// flight while all is well.
    unmatched: RefCell<HashMap<u64, i32>>,
    latency: RefCell<Latency>,
    /// How late ticks arrived (`--tick-interval`).
    tick_lag: RefCell<Latency>,
    /// Send → arrival of broadcast probes (`B@<µs>`).
    broadcast: RefCell<Latency>,
    /// Messages and ticks per second.
    timeline: RefCell<Timeline>,
    /// RSS when the flood started, for client bytes per connection.
    baseline_rss: u64,
    /// How long the opening window held the opener back.
    held_back: Cell<Duration>,
}

impl Counters {
    /// Counters for `streams` streams.
    pub(crate) fn new(streams: usize) -> Self {
        Counters {
            active: Cell::new(0),
            closed: Cell::new(0),
            churned: Cell::new(0),
            chunks: Cell::new(0),
            established: Cell::new(0),
            last_established: Cell::new(None),
            errors: RefCell::new(BTreeMap::new()),
            open: RefCell::new(vec![false; streams]),
            msgs_sent: Cell::new(0),
            send_errors: Cell::new(0),
            partial: Cell::new(0),
            msgs_received: Cell::new(0),
            unmatched: RefCell::new(HashMap::new()),
            latency: RefCell::new(Latency::default()),
            tick_lag: RefCell::new(Latency::default()),
            broadcast: RefCell::new(Latency::default()),
            timeline: RefCell::new(Timeline::default()),
            baseline_rss: crate::sys::rss_bytes().unwrap_or(0),
            held_back: Cell::new(Duration::ZERO),
        }
    }

    /// The opener waited `d` for streams to settle (`--max-opening`).
    pub(crate) fn held_back(&self, d: Duration) {
        self.held_back.set(self.held_back.get() + d);
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        *self.errors.borrow_mut().entry(kind).or_default() += 1;
    }

    pub(crate) fn established(&self, i: usize) {
        self.active.set(self.active.get() + 1);
        self.established.set(self.established.get() + 1);
        self.last_established.set(Some(Instant::now()));
        self.open.borrow_mut()[i] = true;
    }

    pub(crate) fn closed(&self, i: usize) {
        self.active.set(self.active.get() - 1);
        self.closed.set(self.closed.get() + 1);
        self.open.borrow_mut()[i] = false;
    }

    /// Stream `i` is about to be closed by this tool: no new messages for it.
    pub(crate) fn leaving(&self, i: usize) {
        self.open.borrow_mut()[i] = false;
    }

    /// Stream `i` was closed by this tool (after [`Counters::leaving`]).
    pub(crate) fn churned(&self) {
        self.active.set(self.active.get() - 1);
        self.churned.set(self.churned.get() + 1);
    }

    pub(crate) fn chunk(&self) {
        self.chunks.set(self.chunks.get() + 1);
    }

    pub(crate) fn broadcast_received(&self, latency_us: u64) {
        self.broadcast.borrow_mut().record_micros(latency_us);
    }

    pub(crate) fn tick_arrived(&self, now_us: u64, lag_us: u64) {
        self.tick_lag.borrow_mut().record_micros(lag_us);
        self.timeline
            .borrow_mut()
            .tick(now_us.saturating_sub(lag_us), lag_us);
    }

    pub(crate) fn message_received(&self, sent_us: u64, latency_us: u64) {
        self.msgs_received.set(self.msgs_received.get() + 1);
        self.matched(sent_us, -1);
        self.latency.borrow_mut().record_micros(latency_us);
        self.timeline.borrow_mut().received(sent_us, latency_us);
    }

    /// Streams established and not yet closed or failed: settled, so waiting
    /// for more is pointless.
    pub(crate) fn settled(&self) -> u64 {
        self.established.get() + self.errors.borrow().values().sum::<u64>()
    }

    /// Every one of this process's `count` streams has been tried, and the
    /// server has closed every one that opened (a drain).
    pub(crate) fn drained(&self, count: u64) -> bool {
        self.settled() >= count && self.active.get() == 0 && self.closed.get() > 0
    }

    /// Is stream `i` open now?
    pub(crate) fn is_open(&self, i: usize) -> bool {
        self.open.borrow().get(i).copied().unwrap_or(false)
    }

    fn matched(&self, stamp: u64, by: i32) {
        let mut m = self.unmatched.borrow_mut();
        let n = m.entry(stamp).or_default();
        *n += by;
        if *n == 0 {
            m.remove(&stamp);
        }
    }

    /// A point-in-time copy.
    pub(crate) fn snapshot(&self, started: Instant) -> Snapshot {
        let (never_received, unrequested) = self.unmatched.borrow().values().fold((0, 0), |(p, n), &v| {
            if v > 0 {
                (p + v as u64, n)
            } else {
                (p, n + v.unsigned_abs() as u64)
            }
        });
        let active = self.active.get();
        let rss_delta = crate::sys::rss_bytes()
            .unwrap_or(0)
            .saturating_sub(self.baseline_rss);
        Snapshot {
            active,
            closed: self.closed.get(),
            churned: self.churned.get(),
            chunks: self.chunks.get(),
            established: self.established.get(),
            errors: self.errors.borrow().iter().map(|(k, v)| (k.name(), *v)).collect(),
            msgs_sent: self.msgs_sent.get(),
            send_errors: self.send_errors.get(),
            partial: self.partial.get(),
            msgs_received: self.msgs_received.get(),
            never_received,
            unrequested,
            rss_delta,
            ramp_s: self
                .last_established
                .get()
                .map_or(0.0, |t| t.duration_since(started).as_secs_f64()),
            held_back_s: self.held_back.get().as_secs_f64(),
            latency: self.latency.borrow().clone(),
            tick_lag: self.tick_lag.borrow().clone(),
            broadcast: self.broadcast.borrow().clone(),
            timeline: self.timeline.borrow().clone(),
        }
    }

    /// A message stamped `sent_us` was accepted by the server.
    pub(crate) fn message_sent(&self, sent_us: u64) {
        self.msgs_sent.set(self.msgs_sent.get() + 1);
        self.matched(sent_us, 1);
        self.timeline.borrow_mut().sent(sent_us);
    }
}

/// Counts at one moment, of one process or summed over several.
#[derive(Clone, Default)]
pub struct Snapshot {
    /// Streams open now.
    pub active: u64,
    /// Streams that were open and were closed by the other side.
    pub closed: u64,
    /// Streams closed by this tool itself to open again (`--lifetime`).
    pub churned: u64,
    /// Events (chunks) received.
    pub chunks: u64,
    /// Streams ever established.
    pub established: u64,
    /// Failed stream opens, by kind.
    pub errors: BTreeMap<String, u64>,
    /// Messages the server accepted.
    pub msgs_sent: u64,
    /// Messages that could not be sent.
    pub send_errors: u64,
    /// Of those, the deliveries the failed answers still reported (503
    /// `"delivered": n` from a cluster node whose bus is down): they arrive.
    pub partial: u64,
    /// Messages that arrived on a stream.
    pub msgs_received: u64,
    /// Accepted (2xx) and not (yet) arrived, matched by their stamp.
    pub never_received: u64,
    /// Arrived without a 2xx for them (or twice), matched by their stamp.
    pub unrequested: u64,
    /// Client RSS growth since the start.
    pub rss_delta: u64,
    /// Seconds from start until the last stream was established.
    pub ramp_s: f64,
    /// Seconds the opening window held the opener back (the most of any
    /// process).
    pub held_back_s: f64,
    /// Send → arrival latency.
    pub latency: Latency,
    /// Tick arrival − schedule (`--tick-interval`; empty without).
    pub tick_lag: Latency,
    /// Broadcast probes: send → arrival on each stream.
    pub broadcast: Latency,
    /// Messages and ticks per second.
    pub timeline: Timeline,
}

impl Snapshot {
    /// Messages that should arrive: every accepted one, and the local
    /// deliveries that failed answers reported.
    pub fn expected(&self) -> u64 {
        self.msgs_sent + self.partial
    }

    /// Adds another process's snapshot.
    pub fn add(&mut self, o: &Snapshot) {
        self.active += o.active;
        self.closed += o.closed;
        self.churned += o.churned;
        self.chunks += o.chunks;
        self.established += o.established;
        for (k, v) in &o.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        self.msgs_sent += o.msgs_sent;
        self.send_errors += o.send_errors;
        self.partial += o.partial;
        self.msgs_received += o.msgs_received;
        self.never_received += o.never_received;
        self.unrequested += o.unrequested;
        self.rss_delta += o.rss_delta;
        self.ramp_s = self.ramp_s.max(o.ramp_s);
        self.held_back_s = self.held_back_s.max(o.held_back_s);
        self.latency.merge(&o.latency);
        self.tick_lag.merge(&o.tick_lag);
        self.broadcast.merge(&o.broadcast);
        self.timeline.merge(&o.timeline);
    }

    /// The line a child process prints last.
    pub fn to_json(&self) -> Value {
        let mut j = self.progress_json();
        j["timeline"] = self.timeline.to_json();
        j
    }

    /// A child's progress line: [`Snapshot::to_json`] without the
    /// timeline, which only the final line needs (every interval would
    /// otherwise print and parse the whole run's seconds again).
    pub fn progress_json(&self) -> Value {
        json!({
            "active": self.active, "closed": self.closed, "churned": self.churned, "chunks": self.chunks,
            "established": self.established, "errors": self.errors,
            "msgs_sent": self.msgs_sent, "send_errors": self.send_errors, "partial": self.partial,
            "msgs_received": self.msgs_received, "rss_delta": self.rss_delta,
            "never_received": self.never_received, "unrequested": self.unrequested,
            "ramp_s": self.ramp_s,
            "held_back_s": self.held_back_s,
            "latency": self.latency.to_pairs(),
            "tick_lag": self.tick_lag.to_pairs(),
            "broadcast": self.broadcast.to_pairs(),
        })
    }

    /// Reads a child's line.
    pub fn from_json(v: &Value) -> Self {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Snapshot {
            active: n("active"),
            closed: n("closed"),
            churned: n("churned"),
            chunks: n("chunks"),
            established: n("established"),
            errors: v["errors"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default(),
            msgs_sent: n("msgs_sent"),
            send_errors: n("send_errors"),
            partial: n("partial"),
            msgs_received: n("msgs_received"),
            never_received: n("never_received"),
            unrequested: n("unrequested"),
            rss_delta: n("rss_delta"),
            ramp_s: v["ramp_s"].as_f64().unwrap_or(0.0),
            held_back_s: v["held_back_s"].as_f64().unwrap_or(0.0),
            latency: Latency::from_pairs(&v["latency"]),
            tick_lag: Latency::from_pairs(&v["tick_lag"]),
            broadcast: Latency::from_pairs(&v["broadcast"]),
            timeline: Timeline::from_json(&v["timeline"]),
        }
    }

    fn errors_text(&self) -> String {
        if self.errors.is_empty() {
            return "none".into();
        }
        self.errors
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What the statistics URL is, by its path: `/cluster` (the fleet) or
/// anything else (`/stats`, one server's memory figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatsKind {
    /// `/stats`: `memory.bytes_per_connection`.
    Stats,
    /// `/cluster`: `totals` and each node's `streams`.
    Cluster,
}

impl StatsKind {
    /// The kind of `target`: `Cluster` when its path (without a query) ends
    /// in `/cluster`.
    pub(crate) fn of(target: &Target) -> Self {
        let path = target.path.split('?').next().unwrap_or(&target.path);
        if path.trim_end_matches('/').ends_with("/cluster") {
            StatsKind::Cluster
        } else {
            StatsKind::Stats
        }
    }
}

/// One node of a `/cluster` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its name.
    pub name: String,
    /// Its process id, when given.
    pub pid: Option<u64>,
    /// Streams it holds.
    pub streams: u64,
}

/// A `/cluster` answer: the fleet as one of its nodes sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// `single` or `cluster`.
    pub mode: String,
    /// The node that answered.
    pub node: String,
    /// Every node, as listed (sorted by name).
    pub nodes: Vec<ClusterNode>,
    /// `totals.nodes`.
    pub total_nodes: u64,
    /// `totals.streams`.
    pub total_streams: u64,
}

impl ClusterView {
    /// Reads a `/cluster` document; `None` when it has no `totals`.
    pub fn from_json(v: &Value) -> Option<Self> {
        let totals = v.get("totals")?.as_object()?;
        let nodes = v["nodes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| ClusterNode {
                        name: n["name"].as_str().unwrap_or("?").to_owned(),
                        pid: n["pid"].as_u64(),
                        streams: n["streams"].as_u64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(ClusterView {
            mode: v["mode"].as_str().unwrap_or("?").to_owned(),
            node: v["node"].as_str().unwrap_or("?").to_owned(),
            nodes,
            total_nodes: totals.get("nodes")?.as_u64()?,
            total_streams: totals.get("streams")?.as_u64()?,
        })
    }

    /// The summary's `cluster` object.
    pub fn to_json(&self) -> Value {
        json!({
            "mode": self.mode,
            "node": self.node,
            "nodes": self.nodes.iter().map(|n| json!({
                "name": n.name, "pid": n.pid, "streams": n.streams,
            })).collect::<Vec<_>>(),
            "totals": {"nodes": self.total_nodes, "streams": self.total_streams},
        })
    }

    /// `cluster (cluster, from a-1): 4 nodes, 10000 streams; per node: a-0 (pid 7) 2510, ...`
    pub fn text(&self) -> String {
        let per_node = self
            .nodes
            .iter()
            .map(|n| match n.pid {
                Some(pid) => format!("{} (pid {pid}) {}", n.name, n.streams),
                None => format!("{} {}", n.name, n.streams),
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "cluster ({}, from {}): {} node{}, {} streams; per node: {}",
            self.mode,
            self.node,
            self.total_nodes,
            if self.total_nodes == 1 { "" } else { "s" },
            self.total_streams,
            if per_node.is_empty() {
                "none listed"
            } else {
                &per_node
            }
        )
    }
}

/// What the last statistics read gave.
#[derive(Debug, Clone, Default)]
struct ServerView {
    /// Server bytes per connection (`/stats`).
    bpc: Option<u64>,
    /// The fleet (`/cluster`).
    cluster: Option<ClusterView>,
    /// The `error` of the last answer, when it had one (503 "cluster bus
    /// unavailable"); cleared by the next good answer.
    error: Option<String>,
}

/// Prints each interval's report, for one process or for the parent of several.
pub(crate) struct Reporter {
    /// Child mode: JSON lines on stdout, nothing else.
    child: bool,
    stats_url: Option<Target>,
    /// The TLS configuration for an `https://` statistics URL.
    stats_tls: Option<Arc<ClientConfig>>,
    bar: Option<ProgressBar>,
    last: Snapshot,
    last_at: Instant,
    /// Last figures read from the statistics URL.
    server: ServerView,
    target: u64,
}

impl Reporter {
    /// A reporter for `args`; `stats_url` is the server's `/stats`, if any
    /// (read with `stats_tls` when it is `https://`).
    pub(crate) fn new(args: &Args, stats_url: Option<Target>, stats_tls: Option<Arc<ClientConfig>>) -> Self {
        let child = args.child.is_some();
        let bar = (!child && io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::new(args.count);
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} active  {msg}")
                    // unwrap: constant template.
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Reporter {
            child,
            stats_url,
            stats_tls,
            bar,
            last: Snapshot::default(),
            last_at: Instant::now(),
            server: ServerView::default(),
            target: args.count,
        }
    }

    /// One interval: print (or emit) the report.
    pub(crate) async fn interval(&mut self, counters: &super::report::Counters, started: Instant) {
        let snap = counters.snapshot(started);
        if self.child {
            child_line(&snap.progress_json());
            return;
        }
        self.report(snap).await;
    }

    /// Prints a report for `snap` (already aggregated over processes).
    pub(crate) async fn report(&mut self, snap: Snapshot) {
        self.fetch_server().await;
        let secs = self.last_at.elapsed().as_secs_f64().max(1e-9);
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
        let mut text = format!("Stats: {{{}, {}, {}}}\n", snap.active, snap.closed, snap.chunks);
        text += &format!(
            "  connects/s {:.0}  chunks/s {:.0}  errors: {}  client {} B/conn  server {} B/conn",
            rate(snap.established, self.last.established),
            rate(snap.chunks, self.last.chunks),
            snap.errors_text(),
            per_conn(snap.rss_delta, snap.active).map_or("-".into(), |b| b.to_string()),
            self.server.bpc.map_or("-".into(), |b| b.to_string()),
        );
        if let Some(line) = self.server.cluster_line() {
            text += &format!("\n  {line}");
        }
        if snap.msgs_sent + snap.send_errors > 0 {
            text += &format!(
                "\n  messages: sent {} received {} send-errors {} (delivered anyway {})  latency p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
                snap.msgs_sent,
                snap.msgs_received,
                snap.send_errors,
                snap.partial,
                snap.latency.ms(0.5),
                snap.latency.ms(0.99),
                snap.latency.max_ms(),
            );
        }
        if !snap.tick_lag.is_empty() {
            text += &format!(
                "\n  ticks: {} arrived, lag p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
                snap.tick_lag.len(),
                snap.tick_lag.ms(0.5),
                snap.tick_lag.ms(0.99),
                snap.tick_lag.max_ms(),
            );
        }
        match &self.bar {
            Some(bar) => {
                self.show(&snap);
                bar.println(text);
            }
            None => {
                println!("{text}");
                let _ = io::stdout().flush();
            }
        }
        self.last = snap;
        self.last_at = Instant::now();
    }

    /// True when a progress line is drawn (stdout is a terminal).
    pub(crate) fn is_live(&self) -> bool {
        self.bar.is_some()
    }

    /// Moves the progress line to `snap` (no-op without a terminal).
    pub(crate) fn show(&self, snap: &Snapshot) {
        if let Some(bar) = &self.bar {
            bar.set_position(snap.active);
            bar.set_message(format!("closed {} chunks {}", snap.closed, snap.chunks));
        }
    }

    /// The end of a process's run: child emits its final JSON line; otherwise
    /// builds the summary.
    pub(crate) async fn finish(&mut self, counters: &super::report::Counters, started: Instant) -> Summary {
        let snap = counters.snapshot(started);
        if self.child {
            child_line(&json!({ "final": snap.to_json() }));
        }
        // The streams are still held: the server's last figures count them.
        let read_server = !self.child;
        self.summarize(snap, started.elapsed(), 1, read_server).await
    }

    /// The summary of an aggregated final snapshot; `read_server`: read the
    /// statistics URL once more first (while the streams are still held).
    pub(crate) async fn summarize(
        &mut self,
        snap: Snapshot,
        elapsed: Duration,
        processes: u64,
        read_server: bool,
    ) -> Summary {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if read_server {
            self.fetch_server().await;
        }
        Summary {
            target: self.target,
            processes,
            duration_s: elapsed.as_secs_f64(),
            server_bytes_per_connection: self.server.bpc,
            cluster: self.server.cluster.clone(),
            server_error: self.server.error.clone(),
            snap,
        }
    }

    /// Reads the statistics URL (if any) into `self.server`; a failed read
    /// keeps the figures from before.
    pub(crate) async fn fetch_server(&mut self) {
        let Some(t) = self.stats_url.clone() else {
            return;
        };
        let kind = StatsKind::of(&t);
        let tls = self.stats_tls.clone();
        let Ok(Some(v)) = tokio::task::spawn_blocking(move || fetch_json(&t, tls.as_ref())).await else {
            return;
        };
        self.server.update(kind, &v);
    }
}

impl ServerView {
    /// Takes in one answer of the statistics URL.
    fn update(&mut self, kind: StatsKind, v: &Value) {
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            self.error = Some(e.to_owned());
            return;
        }
        match kind {
            StatsKind::Stats => {
                if let Some(b) = v["memory"]["bytes_per_connection"].as_u64() {
                    self.bpc = Some(b);
                    self.error = None;
                }
            }
            StatsKind::Cluster => {
                if let Some(c) = ClusterView::from_json(v) {
                    self.cluster = Some(c);
                    self.error = None;
                }
            }
        }
    }

    /// The report line for `/cluster` (None when it was never read).
    fn cluster_line(&self) -> Option<String> {
        match (&self.cluster, &self.error) {
            (Some(c), None) => Some(c.text()),
            (Some(c), Some(e)) => Some(format!("{} (last answer: {e})", c.text())),
            (None, Some(e)) => Some(format!("server: {e}")),
            (None, None) => None,
        }
    }
}

fn per_conn(bytes: u64, conns: u64) -> Option<u64> {
    (conns > 0).then(|| bytes / conns)
}

/// The server's `/stats` target for `args` (None with `--stats-url none`).
pub(crate) fn stats_target(args: &Args, first: &Target) -> anyhow::Result<Option<Target>> {
    match args.stats_url.as_deref() {
        Some("none") => Ok(None),
        Some(url) => Ok(Some(Target::parse(url, args.allow_remote)?)),
        None => Ok(Some(first.with_path("/stats"))),
    }
}

/// The TLS configuration for `stats_url` when it is `https://`: `have`
/// (the streams' own) or a new one.
pub(crate) fn stats_tls(
    args: &Args,
    stats_url: Option<&Target>,
    have: Option<&Arc<ClientConfig>>,
) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    match (stats_url, have) {
        (Some(t), Some(config)) if t.tls => Ok(Some(Arc::clone(config))),
        (Some(t), None) if t.tls => crate::tls::client_config_if(true, args.tls_ca.as_deref()),
        _ => Ok(None),
    }
}

/// GET a JSON document with a short timeout (over TLS with `tls` when
/// `target` is `https://`); `None` on any failure.
pub(crate) fn fetch_json(target: &Target, tls: Option<&Arc<ClientConfig>>) -> Option<Value> {
    let (addr, path) = (target.addr, &target.path);
    let tls = if target.tls { Some(tls?) } else { None };
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    let buf = crate::tls::blocking_exchange(
        addr,
        &target.host,
        tls,
        request.as_bytes(),
        Duration::from_secs(2),
    )
    .ok()?;
    let response = crate::http::parse_response(&buf).ok()??;
    serde_json::from_slice(response.body(&buf)).ok()
}

/// The final result of a flood.
pub struct Summary {
    /// Streams asked for.
    pub target: u64,
    /// Processes that held them.
    pub processes: u64,
    /// Run time.
    pub duration_s: f64,
    /// From the server's `/stats`, if it has one.
    pub server_bytes_per_connection: Option<u64>,
    /// From the server's `/cluster`, when `--stats-url` named it.
    pub cluster: Option<ClusterView>,
    /// The `error` of the statistics URL's last answer, if it had one
    /// (`/cluster` answers 503 "cluster bus unavailable" while Redis is down).
    pub server_error: Option<String>,
    /// Final counts, summed over processes.
    pub snap: Snapshot,
}

impl Summary {
    /// The `--json` document.
    pub fn to_json(&self) -> Value {
        let s = &self.snap;
        json!({
            "target": self.target,
            "processes": self.processes,
            "duration_s": self.duration_s,
            "active": s.active,
            "closed": s.closed,
            "churned": s.churned,
            "chunks": s.chunks,
            "established": s.established,
            "errors": s.errors,
            "connect_rate": if s.ramp_s > 0.0 { s.established as f64 / s.ramp_s } else { 0.0 },
            // How long `--max-opening` held the ramp back (the most of any
            // process): 0 when the box kept up with --rate.
            "ramp_held_back_s": s.held_back_s,
            "client_bytes_per_connection": per_conn(s.rss_delta, s.active),
            "server_bytes_per_connection": self.server_bytes_per_connection,
            "messages": {
                "sent": s.msgs_sent,
                "received": s.msgs_received,
                "lost": s.expected().saturating_sub(s.msgs_received),
                "send_errors": s.send_errors,
                "send_errors_delivered": s.partial,
                // Matched message by message (each sender process checks
                // its own): answered 2xx and never received; received
                // without a 2xx, or twice.
                "never_received": s.never_received,
                "received_unrequested": s.unrequested,
            },
            "latency_ms": s.latency.summary(),
            "ticks": s.tick_lag.len(),
            "tick_lag_ms": (!s.tick_lag.is_empty()).then(|| s.tick_lag.summary()),
            "broadcast": (!s.broadcast.is_empty()).then(|| json!({
                "received": s.broadcast.len(),
                "last_ms": s.broadcast.max_ms(),
                "latency_ms": s.broadcast.summary(),
            })),
            "cluster": self.cluster.as_ref().map(ClusterView::to_json),
            "server_error": self.server_error,
            // Per Unix second: messages sent then (accepted), how many of
            // them arrived and their latency; the lag of the ticks due then.
            "timeline": {
                "bounds_ms": crate::latency::TIMELINE_BOUNDS_US.map(|us| us as f64 / 1000.0),
                "seconds": s.timeline.to_json(),
            },
        })
    }

    /// The closing lines on stdout.
    pub fn print(&self) {
        let s = &self.snap;
        let j = self.to_json();
        println!("Final: {{{}, {}, {}}}", s.active, s.closed, s.chunks);
        println!(
            "  streams {}/{} in {} process(es), connect rate {:.0}/s, errors: {}",
            s.active,
            self.target,
            self.processes,
            j["connect_rate"].as_f64().unwrap_or(0.0),
            s.errors_text()
        );
        if s.held_back_s > 0.0 {
            println!(
                "  the opening window (--max-opening) held the ramp back for {:.1} s: the box sustained \
                 less than --rate",
                s.held_back_s
            );
        }
        println!(
            "  client {} B/conn, server {} B/conn",
            j["client_bytes_per_connection"], j["server_bytes_per_connection"]
        );
        if let Some(c) = &self.cluster {
            println!("  {}", c.text());
        }
        if let Some(e) = &self.server_error {
            println!("  server's last statistics answer: {e}");
        }
        if s.msgs_sent + s.send_errors > 0 {
            println!(
                "  messages sent {} received {} lost {}  latency ms: {}",
                s.msgs_sent, s.msgs_received, j["messages"]["lost"], j["latency_ms"]
            );
        }
        if !s.tick_lag.is_empty() {
            println!("  ticks {} lag ms: {}", s.tick_lag.len(), j["tick_lag_ms"]);
        }
        if !s.broadcast.is_empty() {
            println!(
                "  broadcast received by {} streams, last after {:.1} ms",
                s.broadcast.len(),
                s.broadcast.max_ms()
            );
        }
    }

    /// Writes the `--json` file.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(&self.to_json())? + "\n")?;
        Ok(())
    }
}

/// A child's line to its parent. A parent that is gone (a closed pipe)
/// ends the child quietly: nobody is left to read its figures.
fn child_line(v: &Value) {
    let mut out = io::stdout().lock();
    if writeln!(out, "{v}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str) -> Target {
        Target::parse(&format!("http://127.0.0.1:1{path}"), false).unwrap()
    }

    #[test]
    fn messages_are_matched_by_their_stamp() {
        let c = Counters::new(1);
        c.message_received(1, 10); // arrives before its 200
        c.message_sent(1);
        c.message_sent(2); // never arrives
        c.message_received(3, 10); // arrives without a 200
        c.message_sent(4);
        c.message_received(4, 10);
        c.message_received(4, 10); // twice
        let s = c.snapshot(Instant::now());
        assert_eq!((s.never_received, s.unrequested), (1, 2));
        let mut sum = Snapshot::from_json(&s.to_json());
        sum.add(&s);
        assert_eq!((sum.never_received, sum.unrequested), (2, 4));
    }

    #[test]
    fn stats_kind_by_path() {
        assert_eq!(StatsKind::of(&target("/stats")), StatsKind::Stats);
        assert_eq!(StatsKind::of(&target("/cluster")), StatsKind::Cluster);
        assert_eq!(StatsKind::of(&target("/cluster?x=1")), StatsKind::Cluster);
        assert_eq!(StatsKind::of(&target("/sb/cluster/")), StatsKind::Cluster);
        assert_eq!(StatsKind::of(&target("/clusters")), StatsKind::Stats);
    }

    #[test]
    fn reads_and_prints_the_fleet() {
        let v = json!({
            "mode": "cluster", "node": "h-1",
            "nodes": [
                {"name": "h-0", "instance": "x", "host": "h", "pid": 10, "streams": 2500, "uptime_s": 3, "addr": "a"},
                {"name": "h-1", "pid": 11, "streams": 2490},
            ],
            "totals": {"nodes": 2, "streams": 4990},
        });
        let c = ClusterView::from_json(&v).unwrap();
        assert_eq!((c.total_nodes, c.total_streams, c.nodes.len()), (2, 4990, 2));
        assert_eq!(c.nodes[0].pid, Some(10));
        assert_eq!(
            c.text(),
            "cluster (cluster, from h-1): 2 nodes, 4990 streams; per node: h-0 (pid 10) 2500, h-1 (pid 11) 2490"
        );
        assert_eq!(ClusterView::from_json(&c.to_json()), Some(c.clone()));
        assert_eq!(
            ClusterView::from_json(&json!({"error": "cluster bus unavailable"})),
            None
        );

        let mut view = ServerView::default();
        assert_eq!(view.cluster_line(), None);
        view.update(StatsKind::Cluster, &v);
        assert_eq!(view.cluster_line(), Some(c.text()));
        // A 503 keeps the last fleet and says why it is stale.
        view.update(StatsKind::Cluster, &json!({"error": "cluster bus unavailable"}));
        assert!(
            view.cluster_line()
                .unwrap()
                .ends_with("(last answer: cluster bus unavailable)")
        );
        view.update(StatsKind::Cluster, &v);
        assert_eq!(view.error, None);
        // /stats fills the bytes per connection, not the fleet.
        let mut stats = ServerView::default();
        stats.update(
            StatsKind::Stats,
            &json!({"memory": {"bytes_per_connection": 1500}}),
        );
        assert_eq!((stats.bpc, stats.cluster_line()), (Some(1500), None));
    }
}
