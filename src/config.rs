//! Typed settings: `config/default.toml` (compiled in) < `--config FILE` <
//! `SWITCHBOARD__SECTION__KEY` environment variables.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The documented defaults, the base layer of every configuration.
const DEFAULTS: &str = include_str!("../config/default.toml");

/// Why the settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A file or variable could not be read or has the wrong type.
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    /// A value has the right type but makes no sense.
    #[error("configuration: {key}: {reason}")]
    Invalid {
        /// The offending key, e.g. `server.extra_ports`.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Every setting of the server. `config/default.toml` documents each key.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Listening and connection handling.
    pub server: ServerSettings,
    /// Streams (`GET /test/{id}`).
    pub stream: StreamSettings,
    /// Routed messages.
    pub message: MessageSettings,
    /// What a publisher may queue, and repeated publishes.
    pub publish: PublishSettings,
    /// Who may publish and subscribe.
    pub auth: AuthSettings,
    /// Browser access (CORS).
    pub http: HttpSettings,
    /// Messages kept per id for clients that reconnect.
    pub history: HistorySettings,
    /// The Redis bus between processes.
    pub cluster: ClusterSettings,
    /// Limits per client address.
    pub limits: LimitSettings,
    /// The application's endpoints: the subscribe hook.
    pub hooks: HookSettings,
    /// `[namespaces.<name>]`: policies of their own for the ids
    /// `<name>:<rest>`.
    #[serde(default)]
    pub namespaces: std::collections::BTreeMap<String, NamespaceSettings>,
    /// Logging.
    pub log: LogSettings,
    /// Test-only switches.
    pub debug: DebugSettings,
}

/// `[server]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on.
    pub host: String,
    /// Main port; 0 picks a free one.
    pub port: u16,
    /// More ports, as "8001-8099,9000"; see [`switchboard_ports::parse_ports`].
    pub extra_ports: String,
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    /// Listen backlog.
    pub backlog: u32,
    /// `SO_REUSEPORT` on every listener, so several processes share the ports.
    pub reuse_port: bool,
    /// Server processes a parent starts on the same ports (1: just this one).
    pub processes: usize,
    /// Most concurrent non-stream HTTP connections.
    pub max_connections: usize,
    /// Time allowed for a complete request head.
    pub head_timeout_ms: u64,
    /// Largest request head on the stream path (lean and fallback).
    pub max_head_bytes: usize,
    /// Time allowed for a whole request body, from the end of its head.
    pub body_timeout_ms: u64,
    /// Keep-alive for ordinary HTTP connections; 0 disables it.
    pub keep_alive_ms: u64,
    /// Upper bound on a graceful shutdown.
    pub shutdown_timeout_ms: u64,
    /// PROXY protocol headers from a load balancer: off, v1, v2 or any.
    pub proxy_protocol: ProxyProtocol,
    /// PEM certificate chain for TLS ("": no TLS).
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Ports that serve TLS, as `extra_ports` lists them; "": every port.
    pub tls_ports: String,
    /// Address of the internal listener for operators (`/metrics`,
    /// `/stats`, `/cluster`, the dashboard, `/admin/*`).
    pub admin_host: String,
    /// Port of the internal listener; 0 picks a free one (logged).
    pub admin_port: u16,
    /// The public listeners serve the operator pages too.
    pub admin_public: bool,
    /// A file the server writes, once it serves, with the addresses it
    /// bound ("": none). For scripts and tests that start it on port 0.
    pub address_file: String,
}

/// `server.proxy_protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    /// No header: the socket's peer is the client.
    Off,
    /// Every connection starts with a v1 (text) header.
    V1,
    /// Every connection starts with a v2 (binary) header.
    V2,
    /// Either.
    Any,
}

/// Addresses and networks, as `http.trusted_proxies` and
/// `limits.exempt` list them (`"10.0.0.0/8, 192.0.2.7, ::1"`).
#[derive(Debug, Clone, Default)]
pub struct Nets(Vec<IpNet>);

impl Nets {
    /// Parses a comma-separated list; an address alone is a /32 (/128).
    pub fn parse(list: &str) -> Result<Nets, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("{s:?} is not an address or a network (\"10.0.0.0/8\")"))
            })
            .collect::<Result<_, _>>()
            .map(Nets)
    }

    /// Whether `ip` is in one of them (an IPv4 address mapped into IPv6
    /// counts as itself).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `[limits]`: per client address; 0 turns one off.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Most open streams per address.
    pub streams_per_ip: u32,
    /// New streams per address per second.
    pub stream_opens_per_ip_per_s: u32,
    /// New streams an address may open at once; 0 (or not set): as many
    /// as the rate ([`LimitSettings::stream_opens`]).
    #[serde(default)]
    pub stream_opens_burst: u32,
    /// `/send` and `/broadcast` per address per second.
    pub publishes_per_ip_per_s: u32,
    /// Publishes an address may send at once; 0 (or not set): as many as
    /// the rate ([`LimitSettings::publishes`]).
    #[serde(default)]
    pub publishes_burst: u32,
    /// TLS handshakes per address per second, on the TLS ports.
    pub tls_handshakes_per_ip_per_s: u32,
    /// Handshakes an address may start at once; 0 (or not set): as many
    /// as the rate ([`LimitSettings::tls_handshakes`]).
    #[serde(default)]
    pub tls_handshakes_burst: u32,
    /// Addresses and networks no limit applies to.
    pub exempt: String,
}

/// A rate per client address with its burst resolved: `per_s` a second,
/// and `burst` at once when the bucket is full (0 `per_s`: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    /// Admitted per second, once the burst is spent.
    pub(crate) per_s: u32,
    /// Admitted at once from a full bucket.
    pub(crate) burst: u32,
}

impl Rate {
    /// `per_s` a second in bursts of `burst`, where a burst of 0 (left
    /// unset) follows the rate: an operator who lowers a rate lowers what
    /// gets through at once with it, instead of keeping a burst sized for
    /// another rate.
    pub(crate) fn of(per_s: u32, burst: u32) -> Rate {
        Rate {
            per_s,
            burst: if burst == 0 { per_s } else { burst },
        }
    }
}

impl LimitSettings {
    /// `stream_opens_per_ip_per_s` and its burst.
    pub(crate) fn stream_opens(&self) -> Rate {
        Rate::of(self.stream_opens_per_ip_per_s, self.stream_opens_burst)
    }

    /// `publishes_per_ip_per_s` and its burst.
    pub(crate) fn publishes(&self) -> Rate {
        Rate::of(self.publishes_per_ip_per_s, self.publishes_burst)
    }

    /// `tls_handshakes_per_ip_per_s` and its burst.
    pub(crate) fn tls_handshakes(&self) -> Rate {
        Rate::of(self.tls_handshakes_per_ip_per_s, self.tls_handshakes_burst)
    }
}

/// `[stream]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSettings {
    /// Tick period.
    pub tick_interval_ms: u64,
    /// Most open streams.
    pub max_streams: usize,
    /// Longest id.
    pub max_id_len: usize,
    /// Per-stream bound on unsent output.
    pub max_pending_bytes: usize,
    /// The `retry:` hint sent first on an SSE stream.
    pub sse_retry_ms: u64,
    /// Longest a long-poll waits for a message before it answers empty.
    pub poll_timeout_ms: u64,
    /// How long a long-poll client stays present after its answer.
    pub poll_linger_ms: u64,
}

impl StreamSettings {
    /// `tick_interval_ms` as a duration.
    pub(crate) fn tick_interval(&self) -> Duration {
        Duration::from_millis(self.tick_interval_ms)
    }

    /// `poll_timeout_ms` as a duration.
    pub(crate) fn poll_timeout(&self) -> Duration {
        Duration::from_millis(self.poll_timeout_ms)
    }

    /// `poll_linger_ms` as a duration.
    pub(crate) fn poll_linger(&self) -> Duration {
        Duration::from_millis(self.poll_linger_ms)
    }
}

/// `[message]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MessageSettings {
    /// Largest message body.
    pub max_bytes: usize,
}

/// `[publish]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PublishSettings {
    /// Most deliveries accepted and not yet taken by their streams, across
    /// every stream of the process (`/stats` `publish.backlog`).
    pub max_backlog: u64,
    /// How long `/send` and `/broadcast` wait for room in the backlog
    /// before they answer 503 with `Retry-After`.
    pub wait_ms: u64,
    /// How long an `Idempotency-Key` is remembered.
    pub idempotency_ttl_ms: u64,
}

/// `[auth]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Bearer token for publishing; empty: open to loopback clients, and to
    /// every client only with `publish_open` or when no listener is bound
    /// beyond loopback.
    pub publish_token: String,
    /// No token and a listener beyond loopback: publishing stays open to
    /// every client anyway (the operator accepts the risk).
    pub publish_open: bool,
    /// Bearer token that opens the operator pages on the public listeners;
    /// empty: none does.
    pub admin_token: String,
    /// HS256 secret subscriber tokens are signed with; empty: none.
    pub subscribe_secret: String,
    /// A PEM public key (RSA, EC P-256/P-384, Ed25519) subscriber tokens
    /// may be signed with; empty: none. With neither, streams are open.
    pub subscribe_public_key_file: String,
    /// An identity provider's JWKS (http:// or https://) whose keys
    /// subscriber tokens may be signed with, chosen by their `kid`; empty:
    /// none.
    pub jwks_url: String,
    /// How often the JWKS is fetched again, in milliseconds.
    pub jwks_refresh_ms: u64,
    /// What a subscriber token's `aud` must be; empty: `aud` is not checked.
    pub subscribe_audience: String,
    /// What a subscriber token's `iss` must be; empty: `iss` is not checked.
    pub subscribe_issuer: String,
}

/// `[http]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Origins allowed by CORS: comma-separated, `*` for any; empty for none.
    pub cors_origins: String,
    /// Proxies whose `X-Forwarded-For` is believed: addresses and
    /// networks, comma-separated; empty: none.
    pub trusted_proxies: String,
}

impl HttpSettings {
    /// A CORS list is set: answers depend on the page's origin.
    pub(crate) fn cors_enabled(&self) -> bool {
        !self.cors_origins.trim().is_empty()
    }

    /// Whether a request from `origin` gets CORS headers.
    pub(crate) fn allows_origin(&self, origin: &[u8]) -> bool {
        self.cors_origins
            .split(',')
            .map(str::trim)
            .any(|allowed| allowed == "*" || allowed.as_bytes() == origin)
    }
}

/// `[history]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySettings {
    /// Messages kept per id; 0 keeps none.
    pub size: usize,
    /// How long a message is kept.
    pub ttl_ms: u64,
}

impl std::fmt::Debug for AuthSettings {
    /// Never prints the token itself: the start-up line logs the settings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = if self.publish_token.is_empty() {
            "<none>"
        } else {
            "<set>"
        };
        let secret = if self.subscribe_secret.is_empty() {
            "<none>"
        } else {
            "<set>"
        };
        let admin = if self.admin_token.is_empty() {
            "<none>"
        } else {
            "<set>"
        };
        f.debug_struct("AuthSettings")
            .field("publish_token", &token)
            .field("publish_open", &self.publish_open)
            .field("admin_token", &admin)
            .field("subscribe_secret", &secret)
            .field("subscribe_public_key_file", &self.subscribe_public_key_file)
            .field("jwks_url", &redact_endpoint(&self.jwks_url))
            .field("jwks_refresh_ms", &self.jwks_refresh_ms)
            .field("subscribe_audience", &self.subscribe_audience)
            .field("subscribe_issuer", &self.subscribe_issuer)
            .finish()
    }
}

/// `[cluster]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Redis URL; empty means one process on its own (unless sentinels
    /// are set). With sentinels, only its credentials and db are used.
    pub redis_url: String,
    /// `host:port,host:port,...` of Redis Sentinels; empty: not used.
    pub redis_sentinels: String,
    /// Seed nodes of a Redis Cluster (`redis://`/`rediss://` URLs or
    /// `host:port`, comma-separated); empty: not used. Exclusive with
    /// `redis_url` and the sentinels.
    pub redis_cluster_nodes: String,
    /// The master's name the sentinels monitor.
    pub redis_sentinel_master: String,
    /// The sentinels' password; empty: none.
    pub redis_sentinel_password: String,
    /// The sentinels speak TLS.
    pub redis_sentinel_tls: bool,
    /// PEM file of the certificate authorities Redis's and the sentinels'
    /// TLS certificates are checked against; empty: the system's roots.
    pub redis_ca_file: String,
    /// Replicas that must have a publish (`WAIT n`) before it answers 200;
    /// 0: none.
    pub redis_wait_replicas: u32,
    /// This node's name; empty means `<hostname>-<pid>`.
    pub node_name: String,
    /// Start of every channel and key name.
    pub prefix: String,
    /// Longest wait for one Redis command.
    pub command_timeout_ms: u64,
    /// First reconnect delay.
    pub reconnect_min_ms: u64,
    /// Largest reconnect delay.
    pub reconnect_max_ms: u64,
    /// Time subscribed after the last local stream of an id left.
    pub unsubscribe_linger_ms: u64,
    /// Heartbeat period.
    pub heartbeat_interval_ms: u64,
    /// Heartbeat lifetime in Redis.
    pub heartbeat_ttl_ms: u64,
}

impl ClusterSettings {
    /// Whether a Redis bus is configured.
    pub fn enabled(&self) -> bool {
        !self.redis_url.is_empty() || !self.redis_sentinels.is_empty() || self.redis_cluster()
    }

    /// Whether the fleet's engine is a Redis Cluster (`redis_cluster_nodes`).
    pub fn redis_cluster(&self) -> bool {
        !self.redis_cluster_nodes.trim().is_empty()
    }

    /// The Redis Cluster's seed nodes as URLs: `host:port` becomes
    /// `redis://host:port`.
    pub fn cluster_seeds(&self) -> Vec<String> {
        self.redis_cluster_nodes
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.contains("://") {
                    s.to_owned()
                } else {
                    format!("redis://{s}")
                }
            })
            .collect()
    }

    /// Whether anything speaks TLS to Redis: a `rediss://` URL or seed,
    /// or `redis_sentinel_tls`.
    pub fn tls(&self) -> bool {
        self.master_tls() || self.redis_sentinel_tls || self.cluster_tls()
    }

    /// Whether the Redis Cluster's seeds are `rediss://` ones.
    pub fn cluster_tls(&self) -> bool {
        self.cluster_seeds().iter().any(|s| s.starts_with("rediss://"))
    }

    /// Whether `redis_url` names a TLS address (`rediss://`, as redis-rs
    /// reads it).
    pub fn master_tls(&self) -> bool {
        redis::Client::open(self.redis_url.as_str()).is_ok_and(|c| {
            matches!(
                c.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            )
        })
    }

    /// The certificates of `redis_ca_file` (`None` when it is empty: the
    /// system's roots), or why they cannot be used.
    pub fn ca_certificates(&self) -> Result<Option<Vec<u8>>, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        if self.redis_ca_file.is_empty() {
            return Ok(None);
        }
        let pem = std::fs::read(&self.redis_ca_file)
            .map_err(|e| format!("cannot read {:?}: {e}", self.redis_ca_file))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{:?} is not PEM certificates: {e}", self.redis_ca_file))?;
        if certs.is_empty() {
            return Err(format!(
                "{:?} holds no certificate (\"-----BEGIN CERTIFICATE-----\")",
                self.redis_ca_file
            ));
        }
        Ok(Some(pem))
    }

    /// The sentinels' addresses, when they are set.
    pub fn sentinels(&self) -> Vec<(String, u16)> {
        self.redis_sentinels
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                let (host, port) = s.rsplit_once(':')?;
                Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
            })
            .collect()
    }
}

impl std::fmt::Debug for ClusterSettings {
    /// Never prints a password inside the URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("redis_url", &redact_url(&self.redis_url))
            .field("redis_sentinels", &self.redis_sentinels)
            .field(
                "redis_cluster_nodes",
                &self
                    .cluster_seeds()
                    .iter()
                    .map(|s| redact_url(s))
                    .collect::<Vec<_>>(),
            )
            .field("redis_sentinel_master", &self.redis_sentinel_master)
            .field(
                "redis_sentinel_password",
                &if self.redis_sentinel_password.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("redis_sentinel_tls", &self.redis_sentinel_tls)
            .field("redis_ca_file", &self.redis_ca_file)
            .field("redis_wait_replicas", &self.redis_wait_replicas)
            .field("node_name", &self.node_name)
            .field("prefix", &self.prefix)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .field("reconnect_min_ms", &self.reconnect_min_ms)
            .field("reconnect_max_ms", &self.reconnect_max_ms)
            .field("unsubscribe_linger_ms", &self.unsubscribe_linger_ms)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("heartbeat_ttl_ms", &self.heartbeat_ttl_ms)
            .finish()
    }
}

/// `redis://user:secret@host` as `redis://user:<redacted>@host`.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split_once(':').map_or("", |(u, _)| u);
            format!("{}{user}:<redacted>{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Whether `url` (empty: none) is one the HTTP client can call: http:// or
/// https:// with a host.
fn check_endpoint(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Ok(());
    }
    let shown = redact_endpoint(url);
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{shown:?} is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(format!("{shown:?} is not an http:// or https:// URL"));
    }
    Ok(())
}

/// An application's endpoint as logs may show it: its password (as
/// [`redact_url`]) and its query (which may carry a key) redacted.
pub(crate) fn redact_endpoint(url: &str) -> String {
    let url = redact_url(url);
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<redacted>"),
        None => url,
    }
}

/// `[hooks]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HookSettings {
    /// Where a stream request is POSTed before it is admitted (after its
    /// token); empty: no hook.
    pub subscribe_url: String,
    /// Request headers passed on to the hook (names, comma-separated).
    pub forward_headers: String,
    /// How long a hook call may take, in milliseconds.
    pub timeout_ms: u64,
    /// What a hook that fails (no answer in time, an answer other than
    /// 2xx, 401 or 403) decides.
    pub on_failure: OnHookFailure,
    /// Most hook calls at once; past it 503.
    pub max_in_flight: usize,
    /// How long an admission is remembered per (id, credentials), in
    /// milliseconds; 0: every stream request asks.
    pub cache_ms: u64,
    /// Where events (`id_occupied`, `id_vacated`, `stream_joined`,
    /// `stream_left`) are POSTed in signed batches; empty: none.
    pub events_url: String,
    /// The events sent for ids outside every namespace (comma-separated).
    pub events: String,
    /// The HMAC-SHA256 key each batch is signed with (needed with
    /// `events_url`).
    pub secret: String,
    /// Most events waiting to be sent; past it new ones are dropped, and
    /// counted.
    pub events_queue: usize,
}

/// `[namespaces.<name>]`: each key left out is the server-wide setting's.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSettings {
    /// Messages kept per id (`history.size`'s meaning).
    pub history_size: Option<usize>,
    /// How long, in milliseconds (`history.ttl_ms`'s).
    pub history_ttl_ms: Option<u64>,
    /// Whether a stream needs a subscriber token (when a key is
    /// configured); false: the namespace's ids are open.
    pub token_required: Option<bool>,
    /// Whether `hooks.subscribe_url` is asked for the namespace's streams.
    pub subscribe_hook: Option<bool>,
    /// The events `hooks.events_url` is sent for the namespace's ids
    /// (comma-separated, `hooks.events`' meaning; empty: none).
    pub webhooks: Option<String>,
    /// Whether the namespace's streams get `join` and `leave` events, and
    /// `/presence/{id}` lists its subjects.
    pub presence_events: Option<bool>,
    /// Most streams of one of its ids at once (0: no limit).
    pub max_streams_per_id: Option<usize>,
}

impl std::fmt::Debug for HookSettings {
    /// Never prints a password or query inside the URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookSettings")
            .field("subscribe_url", &redact_endpoint(&self.subscribe_url))
            .field("forward_headers", &self.forward_headers)
            .field("timeout_ms", &self.timeout_ms)
            .field("on_failure", &self.on_failure)
            .field("max_in_flight", &self.max_in_flight)
            .field("cache_ms", &self.cache_ms)
            .field("events_url", &redact_endpoint(&self.events_url))
            .field("events", &self.events)
            .field("secret", &if self.secret.is_empty() { "" } else { "<set>" })
            .field("events_queue", &self.events_queue)
            .finish()
    }
}

/// `hooks.on_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnHookFailure {
    /// 503 with `Retry-After`.
    Refuse,
    /// Admitted as if the hook had said yes.
    Admit,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// tracing filter directives.
    pub level: String,
    /// Output format.
    pub format: LogFormat,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[debug]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DebugSettings {
    /// Enables `/admin/crash/*`.
    pub fault_injection: bool,
}

impl Settings {
    /// The compiled-in defaults only: no file, no environment. Tests start here.
    pub fn defaults() -> Self {
        // unwrap: default.toml is part of the build and covered by tests.
        Self::build(None, false, |_| {}).expect("config/default.toml is valid")
    }

    /// Defaults, then `file` if given, then `SWITCHBOARD__*` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
        Self::build(file, true, |_| {})
    }

    /// [`Settings::load`], then `flags` (command-line options) on top, and
    /// only then the validation.
    pub fn load_then(file: Option<&Path>, flags: impl FnOnce(&mut Settings)) -> Result<Self, SettingsError> {
        Self::build(file, true, flags)
    }

    fn build(
        file: Option<&Path>,
        env: bool,
        flags: impl FnOnce(&mut Settings),
    ) -> Result<Self, SettingsError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
        if let Some(path) = file {
            builder = builder.add_source(File::from(path).required(true));
        }
        if env {
            builder = builder.add_source(
                Environment::with_prefix("SWITCHBOARD")
                    .prefix_separator("__")
                    .separator("__"),
                // No try_parsing: values stay strings until serde converts
                // them to the field's type, so a token like "007" is kept as
                // written instead of becoming the number 7.
            );
        }
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        flags(&mut settings);
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let invalid = |key, reason: &str| {
            Err(SettingsError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.server.host.parse::<IpAddr>().is_err() {
            return invalid(
                "server.host",
                "must be an IP address such as 127.0.0.1 or 0.0.0.0",
            );
        }
        let extra = parse_ports(&self.server.extra_ports).map_err(|reason| SettingsError::Invalid {
            key: "server.extra_ports",
            reason,
        })?;
        let mut seen = std::collections::HashSet::from([self.server.port]);
        if let Some(dup) = extra.iter().find(|p| !seen.insert(**p)) {
            return invalid(
                "server.extra_ports",
                &format!("port {dup} is listed twice (or is server.port)"),
            );
        }
        if self.server.max_connections == 0 {
            return invalid("server.max_connections", "must be at least 1");
        }
        self.validate_admin(&seen)?;
        self.validate_tls(&seen)?;
        if let Err(e) = Nets::parse(&self.http.trusted_proxies) {
            return invalid("http.trusted_proxies", &e);
        }
        if let Err(e) = Nets::parse(&self.limits.exempt) {
            return invalid("limits.exempt", &e);
        }
        let l = &self.limits;
        for (key, rate, burst) in [
            (
                "limits.stream_opens_burst",
                l.stream_opens_per_ip_per_s,
                l.stream_opens_burst,
            ),
            (
                "limits.publishes_burst",
                l.publishes_per_ip_per_s,
                l.publishes_burst,
            ),
            (
                "limits.tls_handshakes_burst",
                l.tls_handshakes_per_ip_per_s,
                l.tls_handshakes_burst,
            ),
        ] {
            if burst != 0 && burst < rate {
                return invalid(
                    key,
                    "must be at least the rate per second it goes with (or 0: the rate)",
                );
            }
        }
        if self.server.head_timeout_ms < 1000 {
            // actix-web computes the deadline from a clock it updates every
            // 500 ms; a shorter timeout can land in the past and never fire.
            return invalid("server.head_timeout_ms", "must be at least 1000");
        }
        if self.server.body_timeout_ms < 100 {
            return invalid("server.body_timeout_ms", "must be at least 100");
        }
        if self.server.max_head_bytes < 256 {
            return invalid("server.max_head_bytes", "must be at least 256");
        }
        if self.stream.tick_interval_ms == 0 {
            return invalid("stream.tick_interval_ms", "must be at least 1");
        }
        if self.stream.max_id_len == 0 || self.stream.max_id_len > 1024 {
            return invalid("stream.max_id_len", "must be between 1 and 1024");
        }
        if self.stream.max_pending_bytes < 1024 {
            return invalid("stream.max_pending_bytes", "must be at least 1024");
        }
        if self.message.max_bytes == 0 || self.message.max_bytes > 16 * 1024 * 1024 {
            return invalid("message.max_bytes", "must be between 1 and 16777216");
        }
        if self.publish.max_backlog == 0 {
            return invalid("publish.max_backlog", "must be at least 1");
        }
        if self.publish.idempotency_ttl_ms < 1000 {
            return invalid("publish.idempotency_ttl_ms", "must be at least 1000");
        }
        if self.stream.sse_retry_ms == 0 {
            return invalid("stream.sse_retry_ms", "must be at least 1");
        }
        if !(100..=600_000).contains(&self.stream.poll_timeout_ms) {
            return invalid("stream.poll_timeout_ms", "must be 100 to 600000");
        }
        if self.stream.poll_linger_ms > 600_000 {
            return invalid("stream.poll_linger_ms", "must be at most 600000");
        }
        if self.history.size > 100_000 {
            return invalid("history.size", "must be at most 100000");
        }
        if self.history.size > 0 && self.history.ttl_ms == 0 {
            return invalid(
                "history.ttl_ms",
                "must be at least 1 when history.size is above 0",
            );
        }
        if let Some(bad) = self.http.cors_origins.split(',').map(str::trim).find(|o| {
            !o.is_empty()
                && *o != "*"
                && !(o.starts_with("http://") || o.starts_with("https://") || *o == "null")
        }) {
            return invalid(
                "http.cors_origins",
                &format!("{bad:?} is not an origin (scheme://host[:port], \"null\" or \"*\")"),
            );
        }
        self.validate_cluster()?;
        self.validate_namespaces()?;
        for (key, url) in [
            ("auth.jwks_url", &self.auth.jwks_url),
            ("hooks.subscribe_url", &self.hooks.subscribe_url),
            ("hooks.events_url", &self.hooks.events_url),
        ] {
            if let Err(e) = check_endpoint(url.trim()) {
                return invalid(key, &e);
            }
        }
        let hooks = &self.hooks;
        if let Err(e) = crate::events::EventSet::parse(&hooks.events) {
            return invalid("hooks.events", &e);
        }
        if !hooks.events_url.trim().is_empty() {
            if hooks.secret.len() < 16 {
                return invalid(
                    "hooks.secret",
                    "must be at least 16 bytes when hooks.events_url is set (every batch is signed with it)",
                );
            }
            if hooks.events_queue == 0 || hooks.events_queue > 10_000_000 {
                return invalid("hooks.events_queue", "must be between 1 and 10000000");
            }
        }
        if !hooks.subscribe_url.is_empty() || !hooks.events_url.trim().is_empty() {
            if hooks.timeout_ms == 0 || hooks.timeout_ms > 60_000 {
                return invalid("hooks.timeout_ms", "must be between 1 and 60000");
            }
            if hooks.max_in_flight == 0 {
                return invalid("hooks.max_in_flight", "must be at least 1");
            }
        }
        if let Some(bad) = hooks.forward_headers.split(',').map(str::trim).find(|h| {
            !h.is_empty()
                && !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }) {
            return invalid("hooks.forward_headers", &format!("{bad:?} is not a header name"));
        }
        if self.message.max_bytes + 64 > self.stream.max_pending_bytes {
            return invalid(
                "message.max_bytes",
                "must be at least 64 below stream.max_pending_bytes, or no message would fit",
            );
        }
        Ok(())
    }

    /// The application's HTTP endpoints: `auth.jwks_url`,
    /// `hooks.subscribe_url`, `hooks.events_url` (empty: not set).
    pub(crate) fn endpoints(&self) -> [&str; 3] {
        [
            self.auth.jwks_url.trim(),
            self.hooks.subscribe_url.trim(),
            self.hooks.events_url.trim(),
        ]
    }

    /// The `[namespaces.<name>]` rules: names, and keys that need others.
    fn validate_namespaces(&self) -> Result<(), SettingsError> {
        let invalid = |key, reason: String| Err(SettingsError::Invalid { key, reason });
        let keyed = !self.auth.subscribe_secret.is_empty()
            || !self.auth.subscribe_public_key_file.is_empty()
            || !self.auth.jwks_url.trim().is_empty();
        for (name, ns) in &self.namespaces {
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| crate::id::is_id_byte(b) && b != b':')
            {
                return invalid(
                    "namespaces",
                    format!(
                        "{name:?} is not a namespace name (1 to 64 of A-Za-z0-9 . _ ~ -; its ids are {name}:<rest>)"
                    ),
                );
            }
            let size = ns.history_size.unwrap_or(self.history.size);
            if size > 100_000 {
                return invalid(
                    "namespaces.*.history_size",
                    format!("[namespaces.{name}]: must be at most 100000"),
                );
            }
            if size > 0 && ns.history_ttl_ms.unwrap_or(self.history.ttl_ms) == 0 {
                return invalid(
                    "namespaces.*.history_ttl_ms",
                    format!("[namespaces.{name}]: must be at least 1 when its history size is above 0"),
                );
            }
            if ns.token_required == Some(true) && !keyed {
                return invalid(
                    "namespaces.*.token_required",
                    format!(
                        "[namespaces.{name}]: no key to check tokens with (auth.subscribe_secret, \
                         auth.subscribe_public_key_file or auth.jwks_url)"
                    ),
                );
            }
            if ns.subscribe_hook == Some(true) && self.hooks.subscribe_url.trim().is_empty() {
                return invalid(
                    "namespaces.*.subscribe_hook",
                    format!("[namespaces.{name}]: hooks.subscribe_url is not set"),
                );
            }
            if ns.max_streams_per_id.is_some_and(|n| n > 10_000_000) {
                return invalid(
                    "namespaces.*.max_streams_per_id",
                    format!("[namespaces.{name}]: must be at most 10000000 (0: no limit)"),
                );
            }
            if let Some(events) = &ns.webhooks {
                match crate::events::EventSet::parse(events) {
                    Err(e) => {
                        return invalid("namespaces.*.webhooks", format!("[namespaces.{name}]: {e}"));
                    }
                    Ok(set) if !set.is_empty() && self.hooks.events_url.trim().is_empty() => {
                        return invalid(
                            "namespaces.*.webhooks",
                            format!("[namespaces.{name}]: hooks.events_url is not set"),
                        );
                    }
                    Ok(_) => {}
                }
            }
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Result<(), SettingsError> {
        let invalid = |key, reason: String| Err(SettingsError::Invalid { key, reason });
        let c = &self.cluster;
        let processes = self.server.processes;
        if processes == 0 || processes > 64 {
            return invalid("server.processes", "must be between 1 and 64".into());
        }
        if processes > 1 && !c.enabled() {
            return invalid(
                "server.processes",
                format!(
                    "{processes} processes need cluster.redis_url: without the Redis bus each \
                     process routes only its own streams, so a /send would silently miss the \
                     streams held by the others"
                ),
            );
        }
        if processes > 1 && self.server.port == 0 {
            return invalid(
                "server.processes",
                "needs a fixed server.port: with port 0 every process would pick a different one".into(),
            );
        }
        if !c.enabled() {
            return Ok(());
        }
        let printable = |s: &str| s.chars().all(|ch| ch.is_ascii_graphic());
        if c.redis_cluster() {
            self.validate_redis_cluster()?;
        }
        if !c.redis_url.is_empty()
            && let Err(e) = redis::Client::open(c.redis_url.as_str())
        {
            return invalid("cluster.redis_url", format!("not a Redis URL: {e}"));
        }
        if !c.redis_sentinels.is_empty() {
            let listed = c
                .redis_sentinels
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .count();
            if listed == 0 || c.sentinels().len() != listed {
                return invalid(
                    "cluster.redis_sentinels",
                    format!(
                        "must be \"host:port,host:port,...\" with a port number each, not {:?}",
                        c.redis_sentinels
                    ),
                );
            }
            if c.redis_sentinel_master.is_empty() || !printable(&c.redis_sentinel_master) {
                return invalid(
                    "cluster.redis_sentinel_master",
                    "must name the master the sentinels monitor (printable ASCII, no spaces) \
                     when cluster.redis_sentinels is set"
                        .into(),
                );
            }
        }
        if let Ok(client) = redis::Client::open(c.redis_url.as_str())
            && let redis::ConnectionAddr::TcpTls { insecure: true, .. } = client.get_connection_info().addr()
        {
            return invalid(
                "cluster.redis_url",
                "#insecure is not supported: Redis's certificate is always checked; for a \
                 private certificate authority set cluster.redis_ca_file"
                    .into(),
            );
        }
        if c.redis_sentinel_tls && c.redis_sentinels.is_empty() {
            return invalid(
                "cluster.redis_sentinel_tls",
                "is set but cluster.redis_sentinels is empty: there are no sentinels to speak TLS to".into(),
            );
        }
        if !c.redis_ca_file.is_empty() && !c.tls() {
            return invalid(
                "cluster.redis_ca_file",
                "is set but nothing speaks TLS to Redis: use a rediss:// cluster.redis_url \
                 (the master) or cluster.redis_sentinel_tls (the sentinels)"
                    .into(),
            );
        }
        if let Err(e) = c.ca_certificates() {
            return invalid("cluster.redis_ca_file", e);
        }
        if c.prefix.is_empty() || c.prefix.len() > 64 || !printable(&c.prefix) {
            return invalid(
                "cluster.prefix",
                "must be 1 to 64 printable ASCII characters, no spaces".into(),
            );
        }
        if c.node_name.len() > 128 || !printable(&c.node_name) {
            return invalid(
                "cluster.node_name",
                "must be at most 128 printable ASCII characters, no spaces".into(),
            );
        }
        if c.command_timeout_ms < 10 {
            return invalid("cluster.command_timeout_ms", "must be at least 10".into());
        }
        if c.reconnect_min_ms == 0 {
            return invalid("cluster.reconnect_min_ms", "must be at least 1".into());
        }
        if c.reconnect_max_ms < c.reconnect_min_ms {
            return invalid(
                "cluster.reconnect_max_ms",
                "must be at least cluster.reconnect_min_ms".into(),
            );
        }
        if c.heartbeat_interval_ms < 10 {
            return invalid("cluster.heartbeat_interval_ms", "must be at least 10".into());
        }
        if c.heartbeat_ttl_ms <= c.heartbeat_interval_ms {
            return invalid(
                "cluster.heartbeat_ttl_ms",
                "must be above cluster.heartbeat_interval_ms".into(),
            );
        }
        Ok(())
    }

    /// `cluster.redis_cluster_nodes`: seeds that are Redis addresses, all
    /// over TLS or none, and nothing that only a single Redis can do.
    fn validate_redis_cluster(&self) -> Result<(), SettingsError> {
        let invalid = |key, reason: String| Err(SettingsError::Invalid { key, reason });
        let c = &self.cluster;
        const KEY: &str = "cluster.redis_cluster_nodes";
        if !c.redis_url.is_empty() {
            return invalid(
                KEY,
                "is set with cluster.redis_url: a fleet runs on one Redis (redis_url, or \
                 sentinels) or on a Redis Cluster (redis_cluster_nodes), not both; empty one of them"
                    .into(),
            );
        }
        if !c.redis_sentinels.is_empty() {
            return invalid(
                KEY,
                "is set with cluster.redis_sentinels: a Redis Cluster fails over by itself, \
                 without sentinels; empty one of them"
                    .into(),
            );
        }
        let seeds = c.cluster_seeds();
        for seed in &seeds {
            let info = redis::IntoConnectionInfo::into_connection_info(seed.as_str()).map_err(|e| {
                SettingsError::Invalid {
                    key: KEY,
                    reason: format!("{:?} is not a Redis address: {e}", redact_url(seed)),
                }
            })?;
            match info.addr() {
                redis::ConnectionAddr::TcpTls { insecure: true, .. } => {
                    return invalid(
                        KEY,
                        "#insecure is not supported: Redis's certificate is always checked; for \
                         a private certificate authority set cluster.redis_ca_file"
                            .into(),
                    );
                }
                redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::TcpTls { .. } => {}
                _ => {
                    return invalid(
                        KEY,
                        format!("{:?}: a Redis Cluster node is a TCP address", redact_url(seed)),
                    );
                }
            }
        }
        if seeds.iter().any(|s| s.starts_with("rediss://"))
            && !seeds.iter().all(|s| s.starts_with("rediss://"))
        {
            return invalid(
                KEY,
                "mixes rediss:// and plain seeds: a cluster's nodes all speak TLS or none do".into(),
            );
        }
        if c.prefix.contains(['{', '}']) {
            return invalid(
                "cluster.prefix",
                "must not hold { or } with cluster.redis_cluster_nodes: the keys' hash tags \
                 (which put everything of an id in one slot) are written with them"
                    .into(),
            );
        }
        if !self.hooks.events_url.trim().is_empty() {
            return invalid(
                "hooks.events_url",
                "is not supported with cluster.redis_cluster_nodes yet (the fleet's occupancy \
                 scripts keep their state across slots); leave it empty or use one Redis"
                    .into(),
            );
        }
        Ok(())
    }

    /// `server.admin_*` and `auth.admin_token`: an address, a port of its
    /// own (not one of the public `ports`), a token that can be sent.
    fn validate_admin(&self, ports: &std::collections::HashSet<u16>) -> Result<(), SettingsError> {
        let invalid = |key, reason: String| Err(SettingsError::Invalid { key, reason });
        let s = &self.server;
        if s.admin_host.parse::<IpAddr>().is_err() {
            return invalid(
                "server.admin_host",
                "must be an IP address such as 127.0.0.1 (the default: operators on this machine only)"
                    .into(),
            );
        }
        if s.admin_port != 0 && ports.contains(&s.admin_port) {
            return invalid(
                "server.admin_port",
                format!(
                    "port {} is also server.port or in server.extra_ports; the internal listener \
                     needs a port of its own (0: a free one)",
                    s.admin_port
                ),
            );
        }
        let token = &self.auth.admin_token;
        if !token.is_empty() && !token.chars().all(|c| c.is_ascii_graphic()) {
            return invalid(
                "auth.admin_token",
                "must be printable ASCII without spaces (it is sent as a bearer token)".into(),
            );
        }
        Ok(())
    }

    /// `server.tls_*`: both files or neither, loadable, a key that is the
    /// certificate's, and TLS ports among the listening ones (`ports`).
    fn validate_tls(&self, ports: &std::collections::HashSet<u16>) -> Result<(), SettingsError> {
        let invalid = |key, reason: &str| {
            Err(SettingsError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        let s = &self.server;
        let tls_ports = parse_ports(&s.tls_ports).map_err(|reason| SettingsError::Invalid {
            key: "server.tls_ports",
            reason,
        })?;
        match (s.tls_cert_file.is_empty(), s.tls_key_file.is_empty()) {
            (true, true) if tls_ports.is_empty() => return Ok(()),
            (true, true) => {
                return invalid(
                    "server.tls_ports",
                    "needs server.tls_cert_file and server.tls_key_file",
                );
            }
            (false, true) => return invalid("server.tls_key_file", "needed with server.tls_cert_file"),
            (true, false) => return invalid("server.tls_cert_file", "needed with server.tls_key_file"),
            (false, false) => {}
        }
        // With server.port 0 (a free port picked at start) only extra
        // ports can be named.
        if let Some(p) = tls_ports.iter().find(|p| !ports.contains(p)) {
            return invalid(
                "server.tls_ports",
                &format!("port {p} is neither server.port nor in server.extra_ports"),
            );
        }
        crate::conn::tls::Acceptor::new(&s.tls_cert_file, &s.tls_key_file)
            .map(drop)
            .map_err(|e| SettingsError::Invalid {
                key: e.key,
                reason: e.reason,
            })
    }

    /// Whether a listener on `port` serves TLS.
    pub(crate) fn tls_port(&self, port: u16) -> bool {
        if self.server.tls_cert_file.is_empty() {
            return false;
        }
        let ports = parse_ports(&self.server.tls_ports).expect("validated tls_ports");
        ports.is_empty() || ports.contains(&port)
    }

    /// Main address plus one per extra port.
    pub(crate) fn listen_addrs(&self) -> Vec<SocketAddr> {
        // unwrap: validate() checked both.
        let ip: IpAddr = self.server.host.parse().expect("validated host");
        let mut ports = vec![self.server.port];
        ports.extend(parse_ports(&self.server.extra_ports).expect("validated ports"));
        ports.into_iter().map(|p| SocketAddr::new(ip, p)).collect()
    }

    /// The internal listener's address (`server.admin_host`,
    /// `server.admin_port`).
    pub(crate) fn admin_addr(&self) -> SocketAddr {
        // unwrap: validate() checked it.
        let ip: IpAddr = self.server.admin_host.parse().expect("validated admin_host");
        SocketAddr::new(ip, self.server.admin_port)
    }

    /// Worker threads to start.
    pub(crate) fn workers(&self) -> usize {
        match self.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// `server.head_timeout_ms` as a duration.
    pub(crate) fn head_timeout(&self) -> Duration {
        Duration::from_millis(self.server.head_timeout_ms)
    }

    /// `server.shutdown_timeout_ms` as a duration.
    pub(crate) fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.server.shutdown_timeout_ms)
    }
}

/// Parses "8001-8003,9000" into `[8001, 8002, 8003, 9000]` (at most
/// [`switchboard_ports::MAX_PORTS`], the most listening ports one process
/// will open). Empty means none.
pub(crate) fn parse_ports(spec: &str) -> Result<Vec<u16>, String> {
    switchboard_ports::parse_ports(spec).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let s = Settings::defaults();
        assert_eq!(s.server.port, 8000);
        assert_eq!(s.server.host, "127.0.0.1");
        assert_eq!(s.stream.tick_interval_ms, 10_000);
        assert!(!s.debug.fault_injection);
        assert!(s.auth.publish_token.is_empty());
    }

    #[test]
    fn invalid_values_are_named() {
        let mut s = Settings::defaults();
        s.server.host = "localhost:80".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.host"), "{e}");
    }

    /// Every burst is 0 (the default: it follows its rate) or at least
    /// its rate; one set below its rate is refused, naming its key.
    #[test]
    fn a_burst_is_0_or_at_least_its_rate() {
        let mut s = Settings::defaults();
        let l = &s.limits;
        assert_eq!(
            (l.stream_opens_burst, l.publishes_burst, l.tls_handshakes_burst),
            (0, 0, 0),
            "every burst follows its rate by default"
        );
        s.limits.stream_opens_per_ip_per_s = 10;
        s.limits.publishes_per_ip_per_s = 10;
        s.limits.tls_handshakes_per_ip_per_s = 10;
        s.validate().unwrap();
        type Burst = fn(&mut LimitSettings) -> &mut u32;
        let bursts: [(&str, Burst); 3] = [
            ("limits.stream_opens_burst", |l| &mut l.stream_opens_burst),
            ("limits.publishes_burst", |l| &mut l.publishes_burst),
            ("limits.tls_handshakes_burst", |l| &mut l.tls_handshakes_burst),
        ];
        for (key, burst) in bursts {
            let mut s = s.clone();
            *burst(&mut s.limits) = 5;
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
            *burst(&mut s.limits) = 10;
            s.validate().unwrap();
        }
    }

    /// A burst left unset (0) is its rate; one given stays as given, from
    /// a configuration file as well (files written when the defaults were
    /// 500 and 2,000 keep what they say).
    #[test]
    fn an_unset_burst_follows_its_rate_and_a_set_one_stays() {
        let l = Settings::defaults().limits;
        assert_eq!(l.stream_opens(), Rate { per_s: 50, burst: 50 });
        assert_eq!(
            l.publishes(),
            Rate {
                per_s: 500,
                burst: 500
            }
        );
        assert_eq!(
            l.tls_handshakes(),
            Rate {
                per_s: 500,
                burst: 500
            }
        );
        assert_eq!(Rate::of(0, 0), Rate { per_s: 0, burst: 0 }, "off stays off");
        assert_eq!(Rate::of(5, 8), Rate { per_s: 5, burst: 8 });

        let dir = std::env::temp_dir().join(format!("sb-bursts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limits.toml");
        std::fs::write(&file, "[limits]\npublishes_per_ip_per_s = 5\n").unwrap();
        let l = Settings::load(Some(&file)).unwrap().limits;
        assert_eq!(l.publishes(), Rate { per_s: 5, burst: 5 }, "not 2,000 at once");
        std::fs::write(
            &file,
            "[limits]\nstream_opens_per_ip_per_s = 50\nstream_opens_burst = 500\n\
             publishes_per_ip_per_s = 5\npublishes_burst = 2000\n",
        )
        .unwrap();
        let l = Settings::load(Some(&file)).unwrap().limits;
        assert_eq!(
            l.stream_opens(),
            Rate {
                per_s: 50,
                burst: 500
            }
        );
        assert_eq!(
            l.publishes(),
            Rate {
                per_s: 5,
                burst: 2000
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn browser_settings_are_checked() {
        let mut s = Settings::defaults();
        assert!(s.http.cors_origins.is_empty() && s.auth.subscribe_secret.is_empty());
        assert_eq!((s.history.size, s.history.ttl_ms), (64, 300_000));
        s.http.cors_origins = "https://a.example, http://127.0.0.1:3000".into();
        s.validate().unwrap();
        assert!(s.http.allows_origin(b"http://127.0.0.1:3000"));
        assert!(!s.http.allows_origin(b"http://127.0.0.1:3001"));
        s.http.cors_origins = "a.example".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("http.cors_origins") && e.contains("a.example"), "{e}");
        s.http.cors_origins = "*".into();
        assert!(s.http.allows_origin(b"http://anything"));
        s.history.ttl_ms = 0;
        assert!(s.validate().unwrap_err().to_string().contains("history.ttl_ms"));
        s.history.size = 0;
        s.validate().unwrap();
        s.history.size = 100_001;
        assert!(s.validate().unwrap_err().to_string().contains("history.size"));
    }

    #[test]
    fn extra_ports_may_not_repeat() {
        let mut s = Settings::defaults();
        s.server.extra_ports = "8001,8000".into();
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("port 8000 is listed twice")
        );
        s.server.extra_ports = "8001-8003,8002".into();
        assert!(s.validate().is_err());
        s.server.extra_ports = "8001-8003".into();
        assert!(s.validate().is_ok());
    }

    #[test]
    fn processes_need_the_bus_and_a_fixed_port() {
        let mut s = Settings::defaults();
        s.server.processes = 3;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cluster.redis_url"), "{e}");
        s.cluster.redis_url = "redis://127.0.0.1:6379".into();
        assert!(s.validate().is_ok());
        s.server.port = 0;
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("fixed server.port")
        );
        s.server.port = 8000;
        s.cluster.redis_url = "http://nope".into();
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.redis_url")
        );
    }

    #[test]
    fn tls_settings_are_checked_at_start() {
        let mut s = Settings::defaults();
        s.cluster.redis_url = "redis://127.0.0.1:6379".into();
        s.cluster.redis_sentinel_tls = true;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cluster.redis_sentinel_tls"), "{e}");
        s.cluster.redis_sentinel_tls = false;
        let dir = std::env::temp_dir().join(format!("sb-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        s.cluster.redis_ca_file = ca.display().to_string();
        // Nothing speaks TLS yet.
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("nothing speaks TLS"), "{e}");
        s.cluster.redis_url = "rediss://redis.example:6380".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
        s.cluster.redis_ca_file.clear();
        assert!(s.validate().is_ok(), "rediss:// with the system's roots");
        s.cluster.redis_url = "rediss://redis.example:6380/#insecure".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("#insecure is not supported"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sentinels_are_host_port_pairs_with_a_master_name() {
        let mut s = Settings::defaults();
        s.cluster.redis_sentinels = "10.0.0.1:26379, sentinel-b:26380,[::1]:26381".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("cluster.redis_sentinel_master"), "{e}");
        s.cluster.redis_sentinel_master = "mymaster".into();
        s.validate().unwrap();
        assert!(s.cluster.enabled(), "sentinels alone turn cluster mode on");
        assert_eq!(
            s.cluster.sentinels(),
            [
                ("10.0.0.1".to_owned(), 26379),
                ("sentinel-b".to_owned(), 26380),
                ("::1".to_owned(), 26381)
            ]
        );
        for bad in ["10.0.0.1", "a:b", "a:1,,b", ",", "a:70000"] {
            s.cluster.redis_sentinels = bad.into();
            let e = s
                .validate()
                .map(|()| String::new())
                .unwrap_or_else(|e| e.to_string());
            assert!(e.contains("cluster.redis_sentinels"), "{bad:?}: {e}");
        }
        s.cluster.redis_sentinel_password = "hunter2".into();
        assert!(!format!("{:?}", s.cluster).contains("hunter2"));
    }

    #[test]
    fn a_redis_clusters_seeds_are_checked_and_conflicts_named() {
        let mut s = Settings::defaults();
        s.cluster.redis_cluster_nodes = "127.0.0.1:7001, redis://:pw@10.0.0.2:7002".into();
        s.validate().unwrap();
        assert!(s.cluster.enabled() && s.cluster.redis_cluster());
        assert_eq!(
            s.cluster.cluster_seeds(),
            ["redis://127.0.0.1:7001", "redis://:pw@10.0.0.2:7002"]
        );
        assert!(!format!("{:?}", s.cluster).contains(":pw@"), "{:?}", s.cluster);
        let refused = |f: fn(&mut Settings)| {
            let mut s = Settings::defaults();
            s.cluster.redis_cluster_nodes = "127.0.0.1:7001".into();
            f(&mut s);
            match s.validate() {
                Err(SettingsError::Invalid { key, reason }) => format!("{key}: {reason}"),
                other => panic!("{other:?}"),
            }
        };
        let e = refused(|s| s.cluster.redis_url = "redis://127.0.0.1:6379".into());
        assert!(
            e.starts_with("cluster.redis_cluster_nodes") && e.contains("redis_url"),
            "{e}"
        );
        let e = refused(|s| {
            s.cluster.redis_sentinels = "127.0.0.1:26379".into();
            s.cluster.redis_sentinel_master = "m".into();
        });
        assert!(
            e.starts_with("cluster.redis_cluster_nodes") && e.contains("sentinels"),
            "{e}"
        );
        let e = refused(|s| s.cluster.redis_cluster_nodes = "rediss://a:1,redis://b:2".into());
        assert!(e.contains("mixes rediss://"), "{e}");
        let e = refused(|s| s.cluster.redis_cluster_nodes = "rediss://a:1/#insecure".into());
        assert!(e.contains("#insecure"), "{e}");
        let e = refused(|s| s.cluster.redis_cluster_nodes = "unix:///tmp/redis.sock".into());
        assert!(e.contains("TCP address"), "{e}");
        let e = refused(|s| s.cluster.redis_cluster_nodes = "http://a:1".into());
        assert!(e.contains("not a Redis address"), "{e}");
        let e = refused(|s| s.cluster.prefix = "sb{x}".into());
        assert!(e.starts_with("cluster.prefix"), "{e}");
        let e = refused(|s| {
            s.hooks.events_url = "http://127.0.0.1:1/events".into();
            s.hooks.secret = "0123456789abcdef".into();
        });
        assert!(e.starts_with("hooks.events_url"), "{e}");
        // More than one process needs a fleet: a Redis Cluster is one.
        let mut s = Settings::defaults();
        s.cluster.redis_cluster_nodes = "127.0.0.1:7001".into();
        s.server.processes = 2;
        s.server.port = 8000;
        s.validate().unwrap();
        // WAIT follows each publish to its id's master.
        s.cluster.redis_wait_replicas = 1;
        s.validate().unwrap();
    }

    #[test]
    fn cluster_errors_name_their_key() {
        let key_of = |f: fn(&mut Settings)| {
            let mut s = Settings::defaults();
            s.cluster.redis_url = "redis://127.0.0.1:6379".into();
            f(&mut s);
            match s.validate() {
                Err(SettingsError::Invalid { key, .. }) => key,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            key_of(|s| s.cluster.reconnect_min_ms = 0),
            "cluster.reconnect_min_ms"
        );
        assert_eq!(
            key_of(|s| s.cluster.reconnect_max_ms = 50),
            "cluster.reconnect_max_ms"
        );
        assert_eq!(
            key_of(|s| s.cluster.heartbeat_interval_ms = 5),
            "cluster.heartbeat_interval_ms"
        );
        assert_eq!(
            key_of(|s| s.cluster.heartbeat_ttl_ms = 1000),
            "cluster.heartbeat_ttl_ms"
        );
        assert_eq!(key_of(|s| s.cluster.prefix = "a b".into()), "cluster.prefix");
        assert_eq!(
            key_of(|s| s.cluster.node_name = "n\u{e9}".into()),
            "cluster.node_name"
        );
        assert_eq!(
            key_of(|s| s.cluster.command_timeout_ms = 1),
            "cluster.command_timeout_ms"
        );
    }

    #[test]
    fn redis_password_is_not_printed() {
        let mut s = Settings::defaults();
        s.cluster.redis_url = "redis://app:hunter2@10.0.0.1:6379/0".into();
        let printed = format!("{s:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(
            printed.contains("redis://app:<redacted>@10.0.0.1:6379/0"),
            "{printed}"
        );
        assert_eq!(redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
    }

    #[test]
    fn token_is_not_printed() {
        let mut s = Settings::defaults();
        s.auth.publish_token = "sekrit".into();
        s.auth.admin_token = "adminsekrit".into();
        let printed = format!("{s:?}");
        assert!(!printed.contains("sekrit"), "{printed}");
        assert!(printed.contains("admin_token: \"<set>\""), "{printed}");
    }

    #[test]
    fn the_internal_listener_is_loopback_on_a_port_of_its_own() {
        let mut s = Settings::defaults();
        assert_eq!(
            (s.server.admin_host.as_str(), s.server.admin_port),
            ("127.0.0.1", 9000)
        );
        assert!(!s.server.admin_public && !s.auth.publish_open && s.auth.admin_token.is_empty());
        s.server.admin_port = 8000;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.admin_port"), "{e}");
        s.server.admin_port = 0;
        s.server.extra_ports = "9000".into();
        s.validate().unwrap();
        s.server.admin_host = "localhost".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.admin_host"), "{e}");
        s.server.admin_host = "::1".into();
        s.auth.admin_token = "two words".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("auth.admin_token"), "{e}");
    }
}
