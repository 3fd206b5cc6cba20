//! floodtest: opens many long-lived streams at a fixed rate, counts
//! `{Active, Closed, Chunks}` like the Erlang original, and optionally routes
//! messages to the streams it holds and measures their latency.
//!
//! - [`Args`]: the command line.
//! - [`run`]: one process, or several when the open-file limit demands it
//!   ([`children`]).
//! - [`conn`]: one held stream (one small task).
//! - [`parse`]: the per-connection response parser.
//! - [`report`]: snapshots, the periodic report, the JSON summary.

mod children;
mod conn;
mod parse;
pub(crate) mod report;
mod sender;

pub use conn::now_micros;
pub use report::{ClusterNode, ClusterView, Summary};

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use rustls::ClientConfig;

use crate::cli::{parse_duration, parse_ip_list, parse_ports, split_evenly};
use crate::sys;
use crate::target::Target;
use crate::tls;
use report::Counters;

/// Connections per (source address, server address) pair above which Linux's
/// connect() slows to a crawl: it looks for a free even port first and only
/// then falls back to odd ones, so past half the ephemeral range (~14k of
/// 32768-60999) every connect scans the whole even half.
pub const PAIR_SOFT_LIMIT: u64 = 14_000;

/// `--max-opening`'s default: this many seconds of a process's rate.
const OPENING_WINDOW_S: f64 = 0.5;

/// How often `--until-drained` looks whether the server closed every stream.
const DRAIN_CHECK: Duration = Duration::from_secs(1);

/// `--max-opening`'s default is never below this.
const MIN_OPENING: u64 = 64;

/// Descriptors a process keeps for itself (stdio, epoll, sender and stats
/// connections) beyond the streams it holds.
pub const FD_RESERVE: u64 = 64;

/// Open many long-lived HTTP streams and count what arrives on them.
#[derive(Parser, Debug, Clone)]
#[command(name = "floodtest", version)]
pub struct Args {
    // The placeholder is described, not written: clap prints it as a line break.
    /// Stream URL template: the letter n in curly braces becomes the
    /// connection number (/test/c0, /test/c1, ...). http:// or https://
    /// (TLS; see --tls-ca).
    #[arg(long, required_unless_present = "urls", conflicts_with = "urls")]
    pub url: Option<String>,
    /// A file with one stream URL per line (used round-robin), like the original.
    #[arg(long, value_name = "FILE")]
    pub urls: Option<PathBuf>,
    /// Streams to open.
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub count: u64,
    /// Streams opened per second, at most (see --max-opening).
    #[arg(long, short = 'r', default_value_t = 1000.0)]
    pub rate: f64,
    /// Most streams of one process opening at once (connecting, or waiting
    /// for their response head). Past it the opener waits for one to
    /// settle, so a box that cannot keep up with --rate is ramped at the
    /// rate it sustains instead of piling up connects that end in timeouts
    /// and 408s. The summary says how long the window held the ramp back
    /// and the rate it reached. Default: half a second of this process's
    /// share of --rate, at least 64.
    #[arg(long, value_name = "N")]
    pub max_opening: Option<u64>,
    /// Total run time; the tool always stops by itself.
    #[arg(long, short = 'd', default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop before --duration once every stream has been opened and the
    /// server has closed them all (a drain, e.g. a server shut down at the
    /// end of a run whose ramp took an unknown time).
    #[arg(long)]
    pub until_drained: bool,
    /// Report period.
    #[arg(long, short = 'i', default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Connect and response-head timeout per stream.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// Source addresses to spread connections over, e.g. 127.0.0.2-127.0.0.20
    /// (bound with IP_BIND_ADDRESS_NO_PORT, so each is not capped at ~28k).
    #[arg(long, value_name = "IPS")]
    pub source_ips: Option<String>,
    /// Server ports to spread connections over, e.g. 8000-8009 (overrides the URL's port).
    #[arg(long, value_name = "PORTS")]
    pub ports: Option<String>,
    /// Allow targets that are not loopback addresses.
    #[arg(long)]
    pub allow_remote: bool,
    /// PEM certificate(s) of the authority to trust for https:// URLs
    /// (streams, --send-url, --stats-url). Default: the system's roots.
    /// The certificate must name the URL's host (an IP address or a name).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Churn: close each stream after a random time between half and one and
    /// a half of this, and open it again (same id), until the run ends. It
    /// gets no new messages for its last second, so none is lost to it.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub lifetime: Option<Duration>,
    /// The server's tick period (switchboard: `stream.tick_interval_ms`).
    /// Given, each stream measures how late every tick arrives against its
    /// schedule, welcome + k × this, and the report gives the lag's
    /// p50/p99/max.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub tick_interval: Option<Duration>,
    /// How each stream is asked for: `chunked` (a plain GET, the default),
    /// `sse` (`Accept: text/event-stream`: each event's data line is what is
    /// counted) or `ws` (a WebSocket upgrade: each text frame). Over an
    /// https:// URL each is inside TLS (`ws`: wss).
    #[arg(long, value_enum, default_value_t = Transport::Chunked)]
    pub transport: Transport,
    /// Send a PROXY protocol header (`v1` text, `v2` binary) before each
    /// stream's request, naming the stream's own address as the client's:
    /// what a server with `server.proxy_protocol` on behind a balancer gets.
    #[arg(long, value_enum, value_name = "VERSION")]
    pub proxy_protocol: Option<ProxyVersion>,
    /// Messages per second POSTed to random held streams (0: no messages).
    #[arg(long, default_value_t = 0.0)]
    pub msg_rate: f64,
    /// Where messages go; `{id}` is the stream's id (last path segment).
    /// Default: the (first) stream URL's host with `/test/` replaced by `/send/`.
    #[arg(long, value_name = "URL")]
    pub send_url: Option<String>,
    /// Server statistics to read each interval (`none` to skip). Default:
    /// `/stats` on the first stream URL's host and port (server bytes per
    /// connection). A URL whose path is `/cluster` reports the fleet instead:
    /// its totals (nodes, streams) and each node's streams. switchboard
    /// serves both on its internal listener (`server.admin_port`, 9000 by
    /// default: `http://127.0.0.1:9000/stats`), and on the streams' port
    /// only with `server.admin_public`.
    #[arg(long, value_name = "URL")]
    pub stats_url: Option<String>,
    /// Write the final summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Most streams per process; more streams run as several child processes.
    /// Default: the open-file limit less a reserve.
    #[arg(long, value_name = "N")]
    pub max_per_process: Option<u64>,
    /// Internal: run as child `I/K` and print JSON snapshots on stdout.
    #[arg(long, hide = true, value_name = "I/K")]
    pub child: Option<String>,
}

/// How a stream is asked for and read.
#[derive(
    clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// A plain GET; events are chunks (or lines of a raw body).
    #[default]
    Chunked,
    /// Server-sent events.
    Sse,
    /// WebSocket text frames.
    Ws,
}

/// `--proxy-protocol`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyVersion {
    /// `PROXY TCP4 <src> <dst> <sport> <dport>\r\n`.
    V1,
    /// The binary header, 28 bytes for IPv4 (36 + 24 for IPv6).
    V2,
}

impl ProxyVersion {
    /// The header for a connection from `src` to `dst`.
    pub fn header(self, src: std::net::SocketAddr, dst: std::net::SocketAddr) -> Vec<u8> {
        use std::net::SocketAddr::V4;
        match self {
            ProxyVersion::V1 => {
                let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
                format!(
                    "PROXY {family} {} {} {} {}\r\n",
                    src.ip(),
                    dst.ip(),
                    src.port(),
                    dst.port()
                )
                .into_bytes()
            }
            ProxyVersion::V2 => {
                let mut h = b"\r\n\r\n\0\r\nQUIT\n\x21".to_vec();
                match (src, dst) {
                    (V4(s), V4(d)) => {
                        h.extend([0x11, 0, 12]);
                        h.extend(s.ip().octets());
                        h.extend(d.ip().octets());
                    }
                    _ => {
                        h.extend([0x21, 0, 36]);
                        let v6 = |a: std::net::SocketAddr| match a.ip() {
                            std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
                            std::net::IpAddr::V6(ip) => ip.octets(),
                        };
                        h.extend(v6(src));
                        h.extend(v6(dst));
                    }
                }
                h.extend(src.port().to_be_bytes());
                h.extend(dst.port().to_be_bytes());
                h
            }
        }
    }
}

impl Transport {
    /// Its `--transport` name.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Chunked => "chunked",
            Transport::Sse => "sse",
            Transport::Ws => "ws",
        }
    }

    /// What the request adds to its head for this transport.
    pub fn request_headers(self) -> &'static str {
        match self {
            Transport::Chunked => "",
            Transport::Sse => "accept: text/event-stream\r\n",
            // A fixed key is valid: it only proves the server read it.
            Transport::Ws => {
                "upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\n\
                 sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            }
        }
    }
}

/// Everything a process needs to open its share of the streams.
pub struct Plan {
    /// Stream targets: the template (one entry) or the `--urls` list.
    pub targets: Vec<Target>,
    /// Ports to spread over (empty: the URL's own).
    pub ports: Vec<u16>,
    /// Source addresses to spread over (empty: the kernel chooses).
    pub source_ips: Vec<IpAddr>,
    /// Number of this process's first connection.
    pub first_n: u64,
    /// Streams this process opens.
    pub count: u64,
    /// Its opening rate.
    pub rate: f64,
    /// Its opening window (`--max-opening`).
    pub max_opening: u64,
    /// Its message rate.
    pub msg_rate: f64,
    /// Message target template (`{id}`).
    pub send: Option<Target>,
    /// Per-stream connect + head timeout.
    pub connect_timeout: Duration,
    /// `--lifetime`: churn streams.
    pub lifetime: Option<Duration>,
    /// `--tick-interval`: measure tick lag.
    pub tick_interval: Option<Duration>,
    /// `--transport`.
    pub transport: Transport,
    /// `--proxy-protocol`.
    pub proxy_protocol: Option<ProxyVersion>,
    /// The TLS client configuration, when a stream or message target is
    /// `https://`.
    pub tls: Option<Arc<ClientConfig>>,
}

impl Plan {
    /// The URL connection `n` uses (before `--ports`).
    pub fn target(&self, n: u64) -> &Target {
        &self.targets[(n % self.targets.len() as u64) as usize]
    }

    /// Where connection `n` goes and what it asks for.
    pub fn conn(&self, n: u64) -> (SocketAddr, String, Option<IpAddr>) {
        let t = self.target(n);
        let mut addr = t.addr;
        // Source IP varies fastest, port next: every (source, port) pair is
        // used equally, whatever the two counts are.
        let ips = self.source_ips.len().max(1) as u64;
        if !self.ports.is_empty() {
            addr.set_port(self.ports[((n / ips) % self.ports.len() as u64) as usize]);
        }
        let src = (!self.source_ips.is_empty()).then(|| self.source_ips[(n % ips) as usize]);
        (addr, t.path_for(n), src)
    }
}

/// Runs the flood described by `args`; prints reports; returns the summary.
pub fn run(args: Args) -> anyhow::Result<Summary> {
    validate(&args)?;
    let nofile = sys::raise_nofile().context("reading the open-file limit")?;
    let budget = args
        .max_per_process
        .unwrap_or(nofile.saturating_sub(FD_RESERVE))
        .max(1);
    if args.child.is_none() && args.count > budget {
        return children::run(&args, budget);
    }
    warn_port_pressure(&args);
    let (index, of) = match &args.child {
        Some(spec) => parse_child(spec)?,
        None => (0, 1),
    };
    let plan = plan(&args, index, of)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let summary = local.block_on(&rt, run_local(&args, plan))?;
    if args.child.is_none() {
        summary.print();
        if let Some(path) = &args.json {
            summary.write_json(path)?;
        }
    }
    Ok(summary)
}

fn validate(args: &Args) -> anyhow::Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a positive number of streams per second");
    }
    if !(args.msg_rate >= 0.0 && args.msg_rate.is_finite()) {
        bail!("--msg-rate must be zero or positive");
    }
    if args.interval < Duration::from_millis(100) {
        bail!("--interval must be at least 100ms");
    }
    if args.msg_rate > 0.0 && args.url.as_deref().is_some_and(|u| !u.contains("{n}")) && args.count > 1 {
        // Every stream would share one id: each message would arrive on all
        // of them and "lost" would mean nothing.
        bail!("--msg-rate needs a distinct id per stream: put {{n}} in --url");
    }
    Ok(())
}

/// Says so when the flood will run into the ephemeral-port slowdown
/// described at [`PAIR_SOFT_LIMIT`].
fn warn_port_pressure(args: &Args) {
    if args.child.is_some() {
        return;
    }
    let n = |spec: &Option<String>, f: fn(&str) -> usize| spec.as_deref().map_or(1, f).max(1) as u64;
    let ips = n(&args.source_ips, |s| parse_ip_list(s).map_or(1, |v| v.len()));
    let ports = n(&args.ports, |s| parse_ports(s).map_or(1, |v| v.len()));
    let per_pair = args.count / (ips * ports);
    if per_pair > PAIR_SOFT_LIMIT {
        eprintln!(
            "floodtest: warning: {per_pair} connections per source/destination pair; past ~{PAIR_SOFT_LIMIT} \
             connect() crawls (ephemeral ports). Spread them with --source-ips 127.0.0.2-127.0.0.9 or --ports."
        );
    }
}

fn parse_child(spec: &str) -> anyhow::Result<(u64, u64)> {
    let (i, k) = spec.split_once('/').context("--child takes I/K")?;
    let (i, k): (u64, u64) = (i.parse()?, k.parse()?);
    if k == 0 || i >= k {
        bail!("--child {spec}: need 0 <= I < K");
    }
    Ok((i, k))
}

/// This process's share (`index` of `of`) of the whole flood.
fn plan(args: &Args, index: u64, of: u64) -> anyhow::Result<Plan> {
    let targets: Vec<Target> = match (&args.url, &args.urls) {
        (Some(url), _) => vec![Target::parse(url, args.allow_remote)?],
        (None, Some(file)) => {
            let text =
                std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| Target::parse(l, args.allow_remote))
                .collect::<Result<_, _>>()?
        }
        (None, None) => bail!("give --url or --urls"),
    };
    if targets.is_empty() {
        bail!("no URLs to connect to");
    }
    let ports = match &args.ports {
        Some(spec) => parse_ports(spec).map_err(|e| anyhow::anyhow!("--ports: {e}"))?,
        None => Vec::new(),
    };
    let source_ips = match &args.source_ips {
        Some(spec) => parse_ip_list(spec).map_err(|e| anyhow::anyhow!("--source-ips: {e}"))?,
        None => Vec::new(),
    };
    if !args.allow_remote && source_ips.iter().any(|ip| !ip.is_loopback()) {
        bail!("--source-ips must be loopback addresses unless --allow-remote is given");
    }
    let send = if args.msg_rate > 0.0 {
        let url = match &args.send_url {
            Some(u) => u.clone(),
            None => {
                let t = &targets[0];
                let path = t.path.split('?').next().unwrap_or(&t.path);
                let Some(prefix) = path.rfind('/').map(|i| &path[..i]) else {
                    bail!("cannot derive --send-url from {}", t.path);
                };
                format!("{}{}/{{id}}", t.origin(), prefix.replacen("/test", "/send", 1))
            }
        };
        Some(Target::parse(&url, args.allow_remote)?)
    } else {
        None
    };
    let needs_tls = targets.iter().any(|t| t.tls) || send.as_ref().is_some_and(|t| t.tls);
    let tls = tls::client_config_if(needs_tls, args.tls_ca.as_deref())?;
    let share = |i| split_evenly(args.count, of, i);
    let first_n = (0..index).map(share).sum();
    Ok(Plan {
        targets,
        ports,
        source_ips,
        first_n,
        count: share(index),
        rate: args.rate / of as f64,
        max_opening: args
            .max_opening
            .unwrap_or_else(|| ((args.rate / of as f64) * OPENING_WINDOW_S).ceil() as u64)
            .max(if args.max_opening.is_some() {
                1
            } else {
                MIN_OPENING
            }),
        msg_rate: args.msg_rate / of as f64,
        send,
        connect_timeout: args.connect_timeout,
        lifetime: args.lifetime,
        tick_interval: args.tick_interval,
        transport: args.transport,
        proxy_protocol: args.proxy_protocol,
        tls,
    })
}

/// One process's flood on a single-threaded runtime: a small task per
/// stream, an opener pacing them, an optional message sender, a reporter.
async fn run_local(args: &Args, plan: Plan) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let counters = Rc::new(Counters::new(plan.count as usize));
    let plan = Rc::new(plan);
    let deadline = started + args.duration;
    let stats_url = if args.child.is_some() {
        None
    } else {
        report::stats_target(args, &plan.targets[0])?
    };
    let stats_tls = report::stats_tls(args, stats_url.as_ref(), plan.tls.as_ref())?;

    // Opener: R per second, in 10 ms batches, at most `max_opening` of
    // them unsettled at once. Behind schedule after a wait, it catches up
    // only as far as the window lets it.
    let opener = {
        let (plan, counters) = (Rc::clone(&plan), Rc::clone(&counters));
        tokio::task::spawn_local(async move {
            let period = Duration::from_millis(10);
            let mut tick = tokio::time::interval(period);
            let mut opened = 0u64;
            while opened < plan.count {
                tick.tick().await;
                let due = ((started.elapsed().as_secs_f64() * plan.rate) as u64 + 1).min(plan.count);
                if opened < due && opened.saturating_sub(counters.settled()) >= plan.max_opening {
                    counters.held_back(period);
                }
                while opened < due && opened.saturating_sub(counters.settled()) < plan.max_opening {
                    conn::spawn(opened, Rc::clone(&plan), Rc::clone(&counters));
                    opened += 1;
                }
            }
        })
    };
    let sender = plan
        .send
        .is_some()
        .then(|| tokio::task::spawn_local(sender::run(Rc::clone(&plan), Rc::clone(&counters), deadline)));

    let mut reporter = report::Reporter::new(args, stats_url, stats_tls);
    let mut next = started + args.interval;
    loop {
        // On a terminal the progress line moves between reports too.
        let live = reporter.is_live().then(|| Instant::now() + report::LIVE_PERIOD);
        let drain_check = args.until_drained.then(|| Instant::now() + DRAIN_CHECK);
        let wake = next
            .min(deadline)
            .min(live.unwrap_or(deadline))
            .min(drain_check.unwrap_or(deadline));
        tokio::time::sleep_until(wake.into()).await;
        let now = Instant::now();
        if now >= deadline || (args.until_drained && counters.drained(plan.count)) {
            break;
        }
        if now >= next {
            reporter.interval(&counters, started).await;
            next += args.interval;
        } else {
            reporter.show(&counters.snapshot(started));
        }
    }
    opener.abort();
    if let Some(s) = sender {
        if Instant::now() < deadline {
            // Drained early: no stream is left to send to.
            s.abort();
        }
        // The sender stops a little before the deadline so messages in flight
        // can arrive; give them a moment more.
        let _ = s.await;
    }
    Ok(reporter.finish(&counters, started).await)
}

#[cfg(test)]
mod proxy_tests {
    use super::ProxyVersion;

    #[test]
    fn proxy_headers_are_what_a_balancer_sends() {
        let (src, dst) = (
            "127.0.0.2:4000".parse().unwrap(),
            "127.0.0.1:8000".parse().unwrap(),
        );
        assert_eq!(
            ProxyVersion::V1.header(src, dst),
            b"PROXY TCP4 127.0.0.2 127.0.0.1 4000 8000\r\n"
        );
        let v2 = ProxyVersion::V2.header(src, dst);
        assert_eq!(&v2[..12], b"\r\n\r\n\0\r\nQUIT\n");
        assert_eq!(&v2[12..16], [0x21, 0x11, 0, 12]);
        assert_eq!(&v2[16..], [127, 0, 0, 2, 127, 0, 0, 1, 0x0f, 0xa0, 0x1f, 0x40]);
    }
}
