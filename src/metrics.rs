//! `GET /metrics`: the `/stats` counters and gauges in the Prometheus text
//! format (0.0.4), through `prometheus-client`.
//!
//! Nothing is counted twice: a collector reads the same atomics `/stats`
//! reads, at scrape time, so an idle stream touches no more than it did.
//! Counter names get `_total` from the encoder; units are in the names. In
//! cluster mode every metric carries this node's name as a `node` label.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::conn::edge::{Limits, Refused};
use crate::hub::cluster::Cluster;
use crate::stats::{Stats, rss_bytes};

/// The content type of the answer.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The exposition of `stats`; `node`: this node's name in cluster mode.
pub(crate) fn render(stats: &Arc<Stats>, cluster: Option<&Arc<Cluster>>, limits: &Arc<Limits>) -> String {
    let labels = cluster.map(|c| ("node".into(), c.node.clone().into()));
    let mut registry = Registry::with_prefix_and_labels("switchboard", labels.into_iter());
    registry.register_collector(Box::new(StatsCollector(Arc::clone(stats))));
    registry.register_collector(Box::new(LimitsCollector(Arc::clone(limits))));
    if let Some(c) = cluster {
        registry.register_collector(Box::new(ClusterCollector(Arc::clone(c))));
    }
    let mut out = String::new();
    // unwrap: writing into a String cannot fail.
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encode into String");
    out
}

/// Reads [`Limits`]' counters at scrape time.
#[derive(Debug)]
struct LimitsCollector(Arc<Limits>);

impl Collector for LimitsCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let l = &*self.0;
        let mut m = enc.encode_descriptor(
            "limits_refused",
            "Requests refused by a limit per client address ([limits]), by kind: 429, or a TLS connection closed before its handshake.",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in [
            (Refused::Streams, &l.refused_streams),
            (Refused::Opens, &l.refused_opens),
            (Refused::Publishes, &l.refused_publishes),
            (Refused::TlsHandshakes, &l.refused_tls_handshakes),
        ] {
            let labels = [("kind", kind.name())];
            ConstCounter::new(n.load(Relaxed)).encode(m.encode_family(&labels)?)?;
        }
        let (with_streams, rate_tracked) = l.tracked();
        encode_gauges(
            &mut enc,
            &[
                (
                    "limits_addresses_with_streams",
                    "Client addresses with streams open, counted for limits.streams_per_ip.",
                    with_streams as i64,
                ),
                (
                    "limits_addresses_rate_tracked",
                    "Client addresses whose opening, publishing or TLS handshake rate is tracked now.",
                    rate_tracked as i64,
                ),
            ],
        )
    }
}

/// Reads [`Stats`] at scrape time.
#[derive(Debug)]
struct StatsCollector(Arc<Stats>);

/// One counter: its name (without `_total`), help, and atomic.
type CounterSpec<'a> = (&'a str, &'a str, &'a AtomicU64);

/// One gauge: its name, help, and value now.
type GaugeSpec<'a> = (&'a str, &'a str, i64);

fn encode_counters(enc: &mut DescriptorEncoder<'_>, counters: &[CounterSpec<'_>]) -> std::fmt::Result {
    for &(name, help, value) in counters {
        let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        ConstCounter::new(value.load(Relaxed)).encode(m)?;
    }
    Ok(())
}

fn encode_gauges(enc: &mut DescriptorEncoder<'_>, gauges: &[GaugeSpec<'_>]) -> std::fmt::Result {
    for &(name, help, value) in gauges {
        let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(value).encode(m)?;
    }
    Ok(())
}

impl Collector for StatsCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &*self.0;
        let suppressed = crate::telemetry::suppressed();
        let m = enc.encode_descriptor(
            "log_lines_suppressed",
            "Log lines the rate limit dropped (each log statement writes at most 20 lines per 10 s).",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(suppressed).encode(m)?;
        let m = enc.encode_descriptor(
            "message_latency_seconds",
            "Routed message, from being accepted by this node (its body read, or its arrival from the cluster bus) to all its bytes being written to a stream's socket; one sample per stream written.",
            None,
            MetricType::Histogram,
        )?;
        s.message_latency.encode(m)?;
        let m = enc.encode_descriptor(
            "hook_seconds",
            "Subscribe hook calls, from the stream request's admission asking to the application's answer (or the failure).",
            None,
            MetricType::Histogram,
        )?;
        s.hook_seconds.encode(m)?;
        let m = enc.encode_descriptor(
            "webhook_seconds",
            "Webhook POSTs to hooks.events_url, each try of a batch, to the application's answer (or the failure).",
            None,
            MetricType::Histogram,
        )?;
        s.webhook_seconds.encode(m)?;
        let m = enc.encode_descriptor(
            "stream_lifetime_seconds",
            "How long streams lived, observed when they end.",
            None,
            MetricType::Histogram,
        )?;
        s.stream_lifetime.encode(m)?;
        let counters: [CounterSpec<'_>; 61] = [
            (
                "streams_closed",
                "Streams ended, for any reason.",
                &s.streams_closed,
            ),
            (
                "streams_fallback_opened",
                "Streams served through actix-web's streaming body instead of the lean path.",
                &s.streams_fallback,
            ),
            (
                "slow_disconnects",
                "Streams cut because the client stopped reading.",
                &s.slow_disconnects,
            ),
            (
                "chunks_sent",
                "Events written to streams (welcome, ticks, messages).",
                &s.chunks_sent,
            ),
            (
                "messages_routed",
                "Messages accepted by the Router.",
                &s.messages_routed,
            ),
            (
                "messages_delivered",
                "Message events handed to a stream.",
                &s.messages_delivered,
            ),
            (
                "messages_written",
                "Message events whose bytes all reached the kernel.",
                &s.messages_written,
            ),
            (
                "messages_dropped",
                "Message events whose stream ended before writing them.",
                &s.messages_dropped,
            ),
            (
                "publish_rejected",
                "Publishes answered 503 because the publish backlog stayed full for publish.wait_ms.",
                &s.publish_rejected,
            ),
            (
                "publish_idempotent_replays",
                "Publishes answered from an earlier request with the same Idempotency-Key, not delivered again.",
                &s.publish_replayed,
            ),
            (
                "connections_accepted",
                "Connections accepted, all kinds.",
                &s.accepted,
            ),
            (
                "panics",
                "Panics caught in this process (a connection, a stream or an actor); each is a bug to report.",
                &crate::stats::PANICS,
            ),
            (
                "bad_heads",
                "Request heads refused by switchboard's own checks (400, 408, 431).",
                &s.bad_heads,
            ),
            (
                "proxy_refused",
                "Connections refused for a missing or invalid PROXY protocol header (400).",
                &s.proxy_refused,
            ),
            (
                "tls_handshakes",
                "TLS handshakes completed on a TLS port.",
                &s.tls_handshakes,
            ),
            (
                "tls_handshake_failures",
                "TLS handshakes that failed (not TLS, nothing in common, a bad record).",
                &s.tls_handshake_failures,
            ),
            (
                "tls_handshake_timeouts",
                "TLS handshakes not finished within server.head_timeout_ms.",
                &s.tls_handshake_timeouts,
            ),
            (
                "tls_reloads",
                "SIGHUP reloads of the TLS certificate that took.",
                &s.tls_reloads,
            ),
            (
                "tls_reload_failures",
                "SIGHUP reloads of the TLS certificate that failed (the one in use stays).",
                &s.tls_reload_failures,
            ),
            (
                "accept_fd_limit_errors",
                "accept() failures for lack of file descriptors.",
                &s.accept_fd_limit,
            ),
            ("accept_errors", "Other accept() failures.", &s.accept_errors),
            (
                "router_restarts",
                "Supervised restarts of the Router after a crash.",
                &s.router_restarts,
            ),
            (
                "dispatcher_restarts",
                "Supervised restarts of the Counter actor behind /dispatcher after a crash.",
                &s.counter_restarts,
            ),
            (
                "ws_frames_ignored",
                "Data messages WebSocket clients sent (read past).",
                &s.ws_frames_ignored,
            ),
            ("ws_pings", "WebSocket pings answered.", &s.ws_pings),
            (
                "ws_protocol_errors",
                "WebSockets closed with 1002 or 1009 for a client's frame.",
                &s.ws_protocol_errors,
            ),
            (
                "tokens_refused",
                "Streams refused 401 for their subscriber token.",
                &s.tokens_refused,
            ),
            (
                "tokens_expired",
                "Streams ended when their token expired.",
                &s.tokens_expired,
            ),
            (
                "jwks_fetches",
                "Fetches of the identity provider's keys (auth.jwks_url), taken or failed.",
                &s.jwks_fetches,
            ),
            (
                "jwks_failures",
                "Fetches of auth.jwks_url that failed; the keys held were kept.",
                &s.jwks_failures,
            ),
            ("hook_calls", "Subscribe hook calls made.", &s.hook_calls),
            (
                "hook_admitted",
                "Subscribe hook calls the application answered 2xx.",
                &s.hook_admitted,
            ),
            (
                "hook_refused",
                "Subscribe hook calls the application answered 401 or 403.",
                &s.hook_refused,
            ),
            (
                "hook_failures",
                "Subscribe hook calls that failed (another status, a redirect, an answer over 64 KiB, an error, a timeout).",
                &s.hook_failures,
            ),
            (
                "hook_failures_admitted",
                "Failed subscribe hook calls admitted anyway (hooks.on_failure = admit).",
                &s.hook_failures_admitted,
            ),
            (
                "hook_busy",
                "Stream requests refused 503 past hooks.max_in_flight.",
                &s.hook_busy,
            ),
            (
                "hook_remembered",
                "Stream requests admitted by a subscribe hook's yes remembered (hooks.cache_ms).",
                &s.hook_remembered,
            ),
            (
                "per_id_refused",
                "Stream requests refused 429 past their namespace's max_streams_per_id.",
                &s.per_id_refused,
            ),
            (
                "per_id_unchecked",
                "Admissions of a limited id decided on this node's count alone (the other nodes' could not be read from Redis).",
                &s.per_id_unchecked,
            ),
            (
                "presence_events_sent",
                "join and leave events of streams on this node (namespaces with presence_events).",
                &s.notes_sent,
            ),
            (
                "presence_events_received",
                "join and leave events from other nodes, for streams on this node.",
                &s.notes_received,
            ),
            (
                "presence_events_failed",
                "join and leave events that could not be sent to the other nodes (Redis out of reach).",
                &s.notes_failed,
            ),
            (
                "webhook_events_queued",
                "Webhook events queued for hooks.events_url.",
                &s.webhook_queued,
            ),
            (
                "webhook_events_dropped",
                "Webhook events dropped: the queue (hooks.events_queue) was full.",
                &s.webhook_dropped,
            ),
            (
                "webhook_events_sent",
                "Webhook events delivered (hooks.events_url answered 2xx).",
                &s.webhook_sent,
            ),
            (
                "webhook_batches",
                "Webhook batches delivered.",
                &s.webhook_batches,
            ),
            (
                "webhook_failures",
                "Tries of a webhook batch that failed (no answer in time, an error, 5xx, 408, 429, a redirect); each is tried again.",
                &s.webhook_failures,
            ),
            (
                "webhook_events_rejected",
                "Webhook events in batches hooks.events_url refused with a 4xx (dropped).",
                &s.webhook_rejected,
            ),
            (
                "jwks_kid_unavailable",
                "Streams refused 503: their token's kid was unknown and auth.jwks_url could not be fetched in time.",
                &s.jwks_kid_unavailable,
            ),
            (
                "origins_refused",
                "WebSockets refused 403 for their Origin.",
                &s.origins_refused,
            ),
            (
                "history_replayed",
                "Kept messages sent to resuming streams.",
                &s.history_replayed,
            ),
            ("history_gaps", "Resumes told of a possible gap.", &s.history_gaps),
            (
                "history_gaps_trimmed",
                "Gaps told because history.size or history.ttl_ms let the messages go.",
                &s.gaps_trimmed,
            ),
            (
                "history_gaps_epoch",
                "Gaps told because Redis lost the fleet's history (a new epoch).",
                &s.gaps_epoch,
            ),
            (
                "history_gaps_unknown",
                "Gaps told after an event id the history never gave.",
                &s.gaps_unknown,
            ),
            (
                "history_gaps_read_failed",
                "Gaps told because the read of the fleet's history failed.",
                &s.gaps_read_failed,
            ),
            (
                "history_reads",
                "Reads of the fleet's history in Redis (cluster mode).",
                &s.history_reads,
            ),
            (
                "history_read_errors",
                "Reads of the fleet's history that failed or timed out.",
                &s.history_read_errors,
            ),
            (
                "streams_opened_sse",
                "Streams opened as server-sent events.",
                &s.streams_sse,
            ),
            (
                "streams_opened_ws",
                "Streams opened as WebSockets.",
                &s.streams_ws,
            ),
            (
                "dispatcher_count",
                "The /dispatcher Counter's last value.",
                &s.counter,
            ),
        ];
        encode_counters(&mut enc, &counters)?;
        // Streams opened, by transport: the plain ones are the rest.
        let (opened, sse, ws, poll) = (
            s.streams_opened.load(Relaxed),
            s.streams_sse.load(Relaxed),
            s.streams_ws.load(Relaxed),
            s.streams_poll.load(Relaxed),
        );
        let mut m = enc.encode_descriptor(
            "streams_opened",
            "Streams opened, by transport.",
            None,
            MetricType::Counter,
        )?;
        for (transport, n) in [
            ("chunked", opened.saturating_sub(sse + ws + poll)),
            ("sse", sse),
            ("ws", ws),
            ("poll", poll),
        ] {
            ConstCounter::new(n).encode(m.encode_family(&[("transport", transport)])?)?;
        }
        let active = s.streams_active.load(Relaxed) as i64;
        let rss = rss_bytes().unwrap_or(0) as i64;
        let baseline = s.baseline_rss.load(Relaxed) as i64;
        let gauges: [GaugeSpec<'_>; 9] = [
            ("streams_active", "Streams open now.", active),
            (
                "http_connections_active",
                "HTTP connections being served (not streams).",
                s.http_active.load(Relaxed) as i64,
            ),
            ("rss_bytes", "Resident set size of this process.", rss),
            ("baseline_rss_bytes", "RSS when ready and idle.", baseline),
            (
                "history_ids",
                "Ids with a history ring now.",
                s.history_ids.load(Relaxed) as i64,
            ),
            (
                "history_messages",
                "Messages kept in history now.",
                s.history_messages.load(Relaxed) as i64,
            ),
            (
                "jwks_keys",
                "Keys held from the identity provider's JWKS (auth.jwks_url).",
                s.jwks_keys.load(Relaxed) as i64,
            ),
            (
                "webhook_events_pending",
                "Webhook events queued or being sent now.",
                s.webhook_pending.load(Relaxed) as i64,
            ),
            (
                "publish_backlog",
                "Deliveries accepted and not yet taken by their streams (bounded by publish.max_backlog).",
                s.publish_backlog.load(Relaxed) as i64,
            ),
        ];
        encode_gauges(&mut enc, &gauges)?;
        let per_stream = if active > 0 {
            (rss - baseline).max(0) as f64 / active as f64
        } else {
            0.0
        };
        let m = enc.encode_descriptor(
            "stream_rss_bytes",
            "(RSS - baseline RSS) / streams open now; 0 without streams.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(per_stream).encode(m)?;
        let m = enc.encode_descriptor(
            "uptime_seconds",
            "Time since the server started.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.started.elapsed().as_secs_f64()).encode(m)?;
        Ok(())
    }
}

/// Reads the cluster bus's counters (`/stats` `cluster`) at scrape time.
struct ClusterCollector(Arc<Cluster>);

impl std::fmt::Debug for ClusterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ClusterCollector").field(&self.0.node).finish()
    }
}

impl Collector for ClusterCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.0.stats;
        let counters: [CounterSpec<'_>; 21] = [
            (
                "cluster_bus_restarts",
                "Supervised restarts of the cluster Bus actor after a crash.",
                &s.restarts,
            ),
            (
                "cluster_subscribe_commands",
                "SUBSCRIBE and UNSUBSCRIBE commands sent (each carries many ids).",
                &s.subscribe_commands,
            ),
            (
                "cluster_publishes",
                "PUBLISH commands Redis answered.",
                &s.publishes,
            ),
            (
                "cluster_publish_errors",
                "PUBLISH commands that failed, timed out, or were not tried because the bus was down.",
                &s.publish_errors,
            ),
            (
                "cluster_received",
                "Messages from other nodes handed to the Router.",
                &s.received,
            ),
            (
                "cluster_echoes",
                "This node's own publishes, back from Redis and ignored.",
                &s.echoes,
            ),
            (
                "cluster_malformed",
                "Bus messages that were not \"<instance> <one line>\", dropped.",
                &s.malformed,
            ),
            (
                "cluster_reconnects",
                "Times the pub/sub link to Redis was lost and made again.",
                &s.reconnects,
            ),
            (
                "cluster_resubscribed",
                "Ids subscribed again after reconnects.",
                &s.resubscribed,
            ),
            (
                "cluster_errors",
                "Failed Redis operations of any kind (connects, commands, heartbeats).",
                &s.errors,
            ),
            ("cluster_heartbeats", "Heartbeats written.", &s.heartbeats),
            (
                "cluster_name_conflicts",
                "Heartbeats that found another node's entry under this node's name.",
                &s.name_conflicts,
            ),
            (
                "cluster_master_switches",
                "Times this node moved to another Redis master the sentinels named.",
                &s.master_switches,
            ),
            (
                "cluster_stale_sentinel_answers",
                "Sentinel answers naming a master other than the one +switch-master just announced, asked again.",
                &s.stale_sentinel_answers,
            ),
            (
                "cluster_readonly",
                "Redis commands refused with READONLY (a master that became a replica).",
                &s.readonly,
            ),
            (
                "cluster_wait_short",
                "Publishes fewer replicas than cluster.redis_wait_replicas confirmed in time (503).",
                &s.wait_short,
            ),
            (
                "cluster_history_regressions",
                "Times this node found another Redis keeping the fleet's history (a failover, a restart from disk) and began a new epoch: a gap for resumes from before it.",
                &s.history_regressions,
            ),
            (
                "cluster_clock_ahead",
                "Publishes refused (503) because the fleet's clock was ahead of Redis's time past the tolerance (30 s).",
                &s.clock_ahead,
            ),
            (
                "cluster_clock_resets",
                "Times the fleet's clock or an id's history was found far ahead of Redis's time and reset with a new epoch.",
                &s.clock_resets,
            ),
            (
                "cluster_ids_ahead",
                "Bus messages from other nodes whose event id was more than a minute past Redis's time, dropped.",
                &s.ids_ahead,
            ),
            (
                "cluster_bad_state",
                "Values read back from Redis out of range or not in this version's format (node entries, presence counts, the /dispatcher count), left out or reset.",
                &s.bad_state,
            ),
        ];
        encode_counters(&mut enc, &counters)?;
        let gauges: [GaugeSpec<'_>; 2] = [
            (
                "cluster_bus_connected",
                "1 while the pub/sub link to Redis is up and subscribed, else 0.",
                i64::from(s.connected.load(Relaxed)),
            ),
            (
                "cluster_subscriptions",
                "Ids this node is subscribed to (held, or lingering).",
                s.subscriptions.load(Relaxed) as i64,
            ),
        ];
        encode_gauges(&mut enc, &gauges)?;
        let m = enc.encode_descriptor(
            "cluster_clock_skew_seconds",
            "Redis's time minus this node's, measured at each heartbeat; past 30 s either way /readyz answers 503.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.clock_skew_us.load(Relaxed) as f64 / 1e6).encode(m)?;
        Ok(())
    }
}
