//! Process-wide counters behind `GET /stats`. Plain atomics: every worker,
//! the Router and the Counter bump them without talking to each other.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};

use serde_json::{Value, json};

/// Panics in this process since it started, wherever they happened: a
/// connection's task, a stream, a supervised actor. Each is caught where it
/// happened (tokio drops the task, a supervised actor restarts) and
/// counted here by the hook [`count_panics`] installs, so none is silent.
/// Process-wide, like the panic hook itself.
pub(crate) static PANICS: AtomicU64 = AtomicU64::new(0);

/// Installs (once per process) a panic hook that counts in [`PANICS`] and
/// then runs the hook that was there before (the log line of
/// `telemetry::init`, or Rust's default).
pub(crate) fn count_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Relaxed);
            previous(info);
        }));
    });
}

/// Counters for one server. Shared by `Arc`; each field is bumped where the
/// event happens.
#[derive(Debug)]
pub(crate) struct Stats {
    /// When the server started, for `uptime_s`.
    pub(crate) started: Instant,
    /// RSS once the server was ready and held no connection; the base of
    /// `memory.bytes_per_connection`.
    pub(crate) baseline_rss: AtomicU64,
    /// Streams open now (lean and fallback); also the stream-limit gate.
    pub(crate) streams_active: AtomicUsize,
    /// Streams ever opened.
    pub(crate) streams_opened: AtomicU64,
    /// Streams ever closed, for any reason.
    pub(crate) streams_closed: AtomicU64,
    /// Streams served through actix-web's streaming body (not the lean path).
    pub(crate) streams_fallback: AtomicU64,
    /// Streams closed because the client stopped reading (pending bound hit).
    pub(crate) slow_disconnects: AtomicU64,
    /// Event chunks written to streams (welcome, ticks, messages).
    pub(crate) chunks_sent: AtomicU64,
    /// Messages accepted by the Router (`/send` and `/broadcast`).
    pub(crate) messages_routed: AtomicU64,
    /// Message events handed to a stream (what `/send` and `/broadcast`
    /// answer as `delivered`). Each ends in exactly one of `written` and
    /// `dropped`; at rest `delivered = written + dropped`.
    pub(crate) messages_delivered: AtomicU64,
    /// Message events whose bytes all reached the kernel (lean) or actix-web
    /// (fallback): what the client receives if it reads.
    pub(crate) messages_written: AtomicU64,
    /// Message events handed to a stream that ended before writing them
    /// (gone, closing, or cut as too slow with them pending).
    pub(crate) messages_dropped: AtomicU64,
    /// Deliveries the Router has accepted and no stream has taken yet (in a
    /// stream's mailbox, or a broadcast's not yet handed out): what a
    /// publisher has queued. Bounded by `publish.max_backlog`.
    pub(crate) publish_backlog: AtomicU64,
    /// `/send` and `/broadcast` answered 503 because the backlog stayed
    /// full for `publish.wait_ms`.
    pub(crate) publish_rejected: AtomicU64,
    /// `/send` and `/broadcast` answered from an earlier request with the
    /// same `Idempotency-Key`, not delivered again.
    pub(crate) publish_replayed: AtomicU64,
    /// Mirror of the Counter actor's value, for reading without a round trip.
    pub(crate) counter: AtomicU64,
    /// Times the Router was restarted after a crash.
    pub(crate) router_restarts: AtomicU64,
    /// Times the Counter was restarted after a crash.
    pub(crate) counter_restarts: AtomicU64,
    /// Connections actix-web is serving now (not streams, not connections
    /// whose first request line is still being read).
    pub(crate) http_active: AtomicUsize,
    /// Connections accepted, all kinds.
    pub(crate) accepted: AtomicU64,
    /// accept() failures because the process ran out of file descriptors.
    pub(crate) accept_fd_limit: AtomicU64,
    /// Other accept() failures.
    pub(crate) accept_errors: AtomicU64,
    /// Request heads refused by switchboard's own checks (400, 408, 431): on
    /// the lean paths, and the stream rules of actix-web's fallback route.
    pub(crate) bad_heads: AtomicU64,
    /// Connections refused for a missing or invalid PROXY protocol header
    /// (`server.proxy_protocol` on).
    pub(crate) proxy_refused: AtomicU64,
    /// TLS handshakes completed on a TLS port.
    pub(crate) tls_handshakes: AtomicU64,
    /// TLS handshakes (or records before the head) that failed: not TLS, no
    /// common version or cipher suite, a bad record.
    pub(crate) tls_handshake_failures: AtomicU64,
    /// TLS handshakes not finished within `server.head_timeout_ms`.
    pub(crate) tls_handshake_timeouts: AtomicU64,
    /// SIGHUP reloads of the TLS certificate that took.
    pub(crate) tls_reloads: AtomicU64,
    /// SIGHUP reloads that failed (the certificate in use stayed).
    pub(crate) tls_reload_failures: AtomicU64,
    /// Streams opened as server-sent events.
    pub(crate) streams_sse: AtomicU64,
    /// Streams opened as WebSockets.
    pub(crate) streams_ws: AtomicU64,
    /// Long-polls opened (`?transport=poll`): each poll is a stream that
    /// ends with its answer.
    pub(crate) streams_poll: AtomicU64,
    /// WebSocket data messages clients sent (ignored: a stream only sends).
    pub(crate) ws_frames_ignored: AtomicU64,
    /// WebSocket pings answered.
    pub(crate) ws_pings: AtomicU64,
    /// WebSocket streams closed for a malformed (1002) or oversized (1009) client frame.
    pub(crate) ws_protocol_errors: AtomicU64,
    /// Streams refused for their subscriber token (401).
    pub(crate) tokens_refused: AtomicU64,
    /// Streams ended because their token expired.
    pub(crate) tokens_expired: AtomicU64,
    /// Fetches of `auth.jwks_url`, taken or failed.
    pub(crate) jwks_fetches: AtomicU64,
    /// Fetches of `auth.jwks_url` that failed (the keys held were kept).
    pub(crate) jwks_failures: AtomicU64,
    /// Keys held from `auth.jwks_url` now.
    pub(crate) jwks_keys: AtomicU64,
    /// Streams refused 503 because their token's `kid` was unknown and
    /// the keys could not be fetched in time.
    pub(crate) jwks_kid_unavailable: AtomicU64,
    /// Subscribe hook calls made.
    pub(crate) hook_calls: AtomicU64,
    /// Calls the application answered 2xx.
    pub(crate) hook_admitted: AtomicU64,
    /// Calls the application answered 401 or 403.
    pub(crate) hook_refused: AtomicU64,
    /// Calls that failed (another status, a redirect, an answer too long,
    /// an error, a timeout).
    pub(crate) hook_failures: AtomicU64,
    /// Failed calls admitted anyway (`hooks.on_failure = "admit"`).
    pub(crate) hook_failures_admitted: AtomicU64,
    /// Stream requests refused 503 past `hooks.max_in_flight`.
    pub(crate) hook_busy: AtomicU64,
    /// Stream requests admitted by a yes remembered (`hooks.cache_ms`).
    pub(crate) hook_remembered: AtomicU64,
    /// How long the subscribe hook's calls took.
    pub(crate) hook_seconds: Histogram,
    /// Webhook events queued (`hooks.events_url`).
    pub(crate) webhook_queued: AtomicU64,
    /// Events queued or being sent now.
    pub(crate) webhook_pending: AtomicU64,
    /// Events dropped: the queue (`hooks.events_queue`) was full.
    pub(crate) webhook_dropped: AtomicU64,
    /// Events delivered (the application answered 2xx).
    pub(crate) webhook_sent: AtomicU64,
    /// Batches delivered.
    pub(crate) webhook_batches: AtomicU64,
    /// Tries of a batch that failed (each is tried again).
    pub(crate) webhook_failures: AtomicU64,
    /// Events in batches the application refused with a 4xx (dropped).
    pub(crate) webhook_rejected: AtomicU64,
    /// How long the webhook POSTs took.
    pub(crate) webhook_seconds: Histogram,
    /// Stream requests refused past their namespace's
    /// `max_streams_per_id`.
    pub(crate) per_id_refused: AtomicU64,
    /// Admissions of a limited id decided on this node's count alone: the
    /// other nodes' could not be read from Redis.
    pub(crate) per_id_unchecked: AtomicU64,
    /// `join` and `leave` events of streams here (`presence_events`).
    pub(crate) notes_sent: AtomicU64,
    /// `join` and `leave` events from other nodes, for streams here.
    pub(crate) notes_received: AtomicU64,
    /// `join` and `leave` events that could not be sent to the other
    /// nodes (Redis out of reach).
    pub(crate) notes_failed: AtomicU64,
    /// WebSocket streams refused for their Origin (403).
    pub(crate) origins_refused: AtomicU64,
    /// Ids with a history ring now (set by the Router).
    pub(crate) history_ids: AtomicU64,
    /// Messages kept in history now (set by the Router).
    pub(crate) history_messages: AtomicU64,
    /// Kept messages replayed to resuming streams.
    pub(crate) history_replayed: AtomicU64,
    /// Resumes told of a gap (messages after their id may be gone).
    pub(crate) history_gaps: AtomicU64,
    /// Of those: trimmed by `history.size`, expired, or from before the
    /// history began.
    pub(crate) gaps_trimmed: AtomicU64,
    /// Of those: from before the fleet's epoch (Redis lost its data).
    pub(crate) gaps_epoch: AtomicU64,
    /// Of those: after an id the history never gave.
    pub(crate) gaps_unknown: AtomicU64,
    /// Of those: the read of the fleet's history failed.
    pub(crate) gaps_read_failed: AtomicU64,
    /// Cluster mode: reads of the fleet's history in Redis (one per
    /// stream that carries event ids, when it starts or resumes).
    pub(crate) history_reads: AtomicU64,
    /// Of those, failed or timed out.
    pub(crate) history_read_errors: AtomicU64,
    /// Their time in microseconds, summed (÷ `history_reads`: the mean).
    pub(crate) history_read_us: AtomicU64,
    /// Seconds from a routed message being accepted by this node (its
    /// `/send` or `/broadcast` body read, or its arrival from the cluster
    /// bus) to all its bytes being with a stream's socket; one sample per
    /// stream written. Replays from history are not in it.
    pub(crate) message_latency: Histogram,
    /// Seconds each stream lived, observed when it ends.
    pub(crate) stream_lifetime: Histogram,
}

/// Upper bounds of the message latency buckets, in seconds: 100 µs to 5 s.
const LATENCY_BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Upper bounds of the stream lifetime buckets, in seconds: 1 s to a day.
const LIFETIME_BUCKETS: [f64; 12] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 10800.0, 21600.0, 86400.0,
];

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    /// All zero, clock starting now.
    pub(crate) fn new() -> Self {
        Stats {
            started: Instant::now(),
            baseline_rss: AtomicU64::new(0),
            streams_active: AtomicUsize::new(0),
            streams_opened: AtomicU64::new(0),
            streams_closed: AtomicU64::new(0),
            streams_fallback: AtomicU64::new(0),
            slow_disconnects: AtomicU64::new(0),
            chunks_sent: AtomicU64::new(0),
            messages_routed: AtomicU64::new(0),
            messages_delivered: AtomicU64::new(0),
            messages_written: AtomicU64::new(0),
            messages_dropped: AtomicU64::new(0),
            publish_backlog: AtomicU64::new(0),
            publish_rejected: AtomicU64::new(0),
            publish_replayed: AtomicU64::new(0),
            counter: AtomicU64::new(0),
            router_restarts: AtomicU64::new(0),
            counter_restarts: AtomicU64::new(0),
            http_active: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            accept_fd_limit: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            bad_heads: AtomicU64::new(0),
            proxy_refused: AtomicU64::new(0),
            tls_handshakes: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
            tls_handshake_timeouts: AtomicU64::new(0),
            tls_reloads: AtomicU64::new(0),
            tls_reload_failures: AtomicU64::new(0),
            streams_sse: AtomicU64::new(0),
            streams_ws: AtomicU64::new(0),
            streams_poll: AtomicU64::new(0),
            ws_frames_ignored: AtomicU64::new(0),
            ws_pings: AtomicU64::new(0),
            ws_protocol_errors: AtomicU64::new(0),
            tokens_refused: AtomicU64::new(0),
            tokens_expired: AtomicU64::new(0),
            jwks_fetches: AtomicU64::new(0),
            jwks_failures: AtomicU64::new(0),
            jwks_keys: AtomicU64::new(0),
            jwks_kid_unavailable: AtomicU64::new(0),
            hook_calls: AtomicU64::new(0),
            hook_admitted: AtomicU64::new(0),
            hook_refused: AtomicU64::new(0),
            hook_failures: AtomicU64::new(0),
            hook_failures_admitted: AtomicU64::new(0),
            hook_busy: AtomicU64::new(0),
            hook_remembered: AtomicU64::new(0),
            hook_seconds: Histogram::new(&LATENCY_BUCKETS),
            webhook_queued: AtomicU64::new(0),
            webhook_pending: AtomicU64::new(0),
            webhook_dropped: AtomicU64::new(0),
            webhook_sent: AtomicU64::new(0),
            webhook_batches: AtomicU64::new(0),
            webhook_failures: AtomicU64::new(0),
            webhook_rejected: AtomicU64::new(0),
            webhook_seconds: Histogram::new(&LATENCY_BUCKETS),
            per_id_refused: AtomicU64::new(0),
            per_id_unchecked: AtomicU64::new(0),
            notes_sent: AtomicU64::new(0),
            notes_received: AtomicU64::new(0),
            notes_failed: AtomicU64::new(0),
            origins_refused: AtomicU64::new(0),
            history_ids: AtomicU64::new(0),
            history_messages: AtomicU64::new(0),
            history_replayed: AtomicU64::new(0),
            history_gaps: AtomicU64::new(0),
            gaps_trimmed: AtomicU64::new(0),
            gaps_epoch: AtomicU64::new(0),
            gaps_unknown: AtomicU64::new(0),
            gaps_read_failed: AtomicU64::new(0),
            history_reads: AtomicU64::new(0),
            history_read_errors: AtomicU64::new(0),
            history_read_us: AtomicU64::new(0),
            message_latency: Histogram::new(&LATENCY_BUCKETS),
            stream_lifetime: Histogram::new(&LIFETIME_BUCKETS),
        }
    }

    /// Records the idle RSS, once the server is ready to serve.
    pub(crate) fn set_baseline(&self) {
        self.baseline_rss.store(rss_bytes().unwrap_or(0), Relaxed);
    }

    /// Takes a stream slot if fewer than `max` are open. The slot is given
    /// back by [`Stats::stream_closed`]; the caller starts the stream at once.
    pub(crate) fn try_reserve_stream(&self, max: usize) -> bool {
        self.streams_active
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
            .is_ok()
    }

    /// A reserved slot became a running stream.
    pub(crate) fn stream_opened(&self, fallback: bool) {
        self.streams_opened.fetch_add(1, Relaxed);
        if fallback {
            self.streams_fallback.fetch_add(1, Relaxed);
        }
    }

    /// A running stream ended; it lived `lifetime`.
    pub(crate) fn stream_closed(&self, lifetime: std::time::Duration) {
        // Timed before it is counted, so a reader that sees it counted
        // sees it timed too (on x86; the counters are Relaxed, not an order).
        self.stream_lifetime.observe(lifetime);
        self.streams_active.fetch_sub(1, Relaxed);
        self.streams_closed.fetch_add(1, Relaxed);
    }

    /// A message's bytes are all with a stream's socket; `accepted`: when
    /// this node took it (`None` for a replay from history, which is
    /// counted but not timed).
    pub(crate) fn message_written(&self, accepted: Option<Instant>) {
        // Timed before it is counted, so a reader that sees it counted
        // sees it timed too (on x86; the counters are Relaxed, not an order).
        if let Some(t) = accepted {
            self.message_latency.observe(t.elapsed());
        }
        self.messages_written.fetch_add(1, Relaxed);
    }

    /// Streams open now.
    pub(crate) fn streams_active(&self) -> usize {
        self.streams_active.load(Relaxed)
    }

    /// Non-stream HTTP connections open now.
    pub(crate) fn http_active(&self) -> usize {
        self.http_active.load(Relaxed)
    }

    /// The `/stats` document.
    /// Time since the server started.
    pub(crate) fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    pub(crate) fn snapshot(&self) -> Value {
        let active = self.streams_active.load(Relaxed);
        let rss = rss_bytes().unwrap_or(0);
        let baseline = self.baseline_rss.load(Relaxed);
        let per_conn = (active > 0).then(|| rss.saturating_sub(baseline) / active as u64);
        let get = |a: &AtomicU64| a.load(Relaxed);
        json!({
            "panics": PANICS.load(Relaxed),
            "connections": {
                "active": active,
                "opened": get(&self.streams_opened),
                "closed": get(&self.streams_closed),
                "fallback": get(&self.streams_fallback),
                "slow_disconnects": get(&self.slow_disconnects),
                "http_active": self.http_active.load(Relaxed),
                "accepted": get(&self.accepted),
                "bad_heads": get(&self.bad_heads),
                "proxy_refused": get(&self.proxy_refused),
            },
            "tls": {
                "handshakes": get(&self.tls_handshakes),
                "handshake_failures": get(&self.tls_handshake_failures),
                "handshake_timeouts": get(&self.tls_handshake_timeouts),
                "reloads": get(&self.tls_reloads),
                "reload_failures": get(&self.tls_reload_failures),
            },
            "accept": {
                "fd_limit": get(&self.accept_fd_limit),
                "errors": get(&self.accept_errors),
            },
            "transports": {
                "sse_opened": get(&self.streams_sse),
                "ws_opened": get(&self.streams_ws),
                "poll_opened": get(&self.streams_poll),
                "ws_frames_ignored": get(&self.ws_frames_ignored),
                "ws_pings": get(&self.ws_pings),
                "ws_protocol_errors": get(&self.ws_protocol_errors),
            },
            "auth": {
                "tokens_refused": get(&self.tokens_refused),
                "tokens_expired": get(&self.tokens_expired),
                "jwks_fetches": get(&self.jwks_fetches),
                "jwks_failures": get(&self.jwks_failures),
                "jwks_keys": get(&self.jwks_keys),
                "jwks_kid_unavailable": get(&self.jwks_kid_unavailable),
                "origins_refused": get(&self.origins_refused),
            },
            "hooks": {
                "calls": get(&self.hook_calls),
                "admitted": get(&self.hook_admitted),
                "refused": get(&self.hook_refused),
                "failures": get(&self.hook_failures),
                "failures_admitted": get(&self.hook_failures_admitted),
                "busy": get(&self.hook_busy),
                "remembered": get(&self.hook_remembered),
                "events_queued": get(&self.webhook_queued),
                "events_pending": get(&self.webhook_pending),
                "events_dropped": get(&self.webhook_dropped),
                "events_sent": get(&self.webhook_sent),
                "events_batches": get(&self.webhook_batches),
                "events_failures": get(&self.webhook_failures),
                "events_rejected": get(&self.webhook_rejected),
            },
            "per_id": {
                "refused": get(&self.per_id_refused),
                "unchecked": get(&self.per_id_unchecked),
            },
            "presence_events": {
                "sent": get(&self.notes_sent),
                "received": get(&self.notes_received),
                "failed": get(&self.notes_failed),
            },
            "history": {
                "ids": get(&self.history_ids),
                "messages": get(&self.history_messages),
                "replayed": get(&self.history_replayed),
                "gaps": get(&self.history_gaps),
                "gaps_by_cause": {
                    "trimmed": get(&self.gaps_trimmed),
                    "epoch": get(&self.gaps_epoch),
                    "unknown": get(&self.gaps_unknown),
                    "read_failed": get(&self.gaps_read_failed),
                },
                "reads": get(&self.history_reads),
                "read_errors": get(&self.history_read_errors),
                "read_seconds": get(&self.history_read_us) as f64 / 1e6,
            },
            "chunks_sent": get(&self.chunks_sent),
            "messages": {
                "routed": get(&self.messages_routed),
                "delivered": get(&self.messages_delivered),
                "written": get(&self.messages_written),
                "dropped": get(&self.messages_dropped),
            },
            "publish": {
                "backlog": get(&self.publish_backlog),
                "rejected": get(&self.publish_rejected),
                "idempotent_replays": get(&self.publish_replayed),
            },
            "counter": get(&self.counter),
            "memory": {
                "rss_bytes": rss,
                "baseline_rss_bytes": baseline,
                "bytes_per_connection": per_conn,
            },
            "actors": {
                "router": { "restarts": get(&self.router_restarts) },
                "counter": { "restarts": get(&self.counter_restarts) },
            },
            "uptime_s": self.started.elapsed().as_secs(),
        })
    }
}

/// A histogram of durations with fixed buckets, observed without a lock.
///
/// prometheus-client's own `Histogram` takes a mutex per observation; the
/// latency histogram is observed on every message written, by every worker
/// at once (a broadcast to 19,000 streams is 19,000 observations within
/// ~200 ms), so it is a row of atomics here, and prometheus-client writes
/// the exposition ([`Histogram::encode`]). A scrape during observations may
/// see `_sum` a few observations apart from the buckets; `_count` is the
/// sum of the buckets, so the two always agree.
#[derive(Debug)]
pub(crate) struct Histogram {
    /// Upper bounds, in seconds, ascending.
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last is above every
    /// bound (`+Inf`).
    counts: Box<[AtomicU64]>,
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        // The first bucket whose bound is at least `secs` (`le`).
        let i = self.bounds.partition_point(|&b| b < secs);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Writes the buckets, `_sum` (seconds) and `_count`.
    pub(crate) fn encode(&self, mut m: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().map(|c| c.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        m.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }
}

/// Resident set size of this process, from `VmRSS` in `/proc/self/status`.
pub(crate) fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_limit_is_exact() {
        let s = Stats::new();
        assert!(s.try_reserve_stream(2));
        assert!(s.try_reserve_stream(2));
        assert!(!s.try_reserve_stream(2));
        s.stream_closed(std::time::Duration::from_secs(1));
        assert!(s.try_reserve_stream(2));
        assert_eq!(s.streams_active(), 2);
    }

    #[test]
    fn histogram_buckets_are_upper_bounds() {
        use std::time::Duration;
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(1000)); // le="0.001"
        h.observe(Duration::from_micros(1001));
        h.observe(Duration::from_millis(10)); // le="0.01"
        h.observe(Duration::from_secs(3)); // +Inf
        let counts: Vec<u64> = h.counts.iter().map(|c| c.load(Relaxed)).collect();
        assert_eq!(counts, [1, 2, 1]);
        assert_eq!(h.sum_ns.load(Relaxed), 3_012_001_000);
    }

    #[test]
    fn rss_is_readable() {
        assert!(rss_bytes().unwrap() > 0);
    }
}
