//! `bench cluster`: routed-message latency across several switchboard
//! processes joined by Redis, beside one process on its own, in the same
//! run. The harness starts its own `redis-server`, then `switchboard
//! --processes N` on one shared port (SO_REUSEPORT spreads the streams over
//! the processes, and each POST lands on any of them, so most messages cross
//! processes through Redis), drives it as `bench latency` does, and samples
//! Redis's CPU time and RSS meanwhile; then the same load against a single
//! switchboard with no Redis.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::flood::{Flood, FloodSpec, FloodSummary, Transport, errors_text};
use super::outcome::{Outcome, Recorder};
use super::process::{self, TempDir};
use super::redis::{Redis, RedisCluster};
use super::servers::{Launch, Server, WORKERS};
use super::table::{Table, fixed, opt, ratio, thousands, times};
use super::{Common, Ramp, client, max_streams, procfs};
use switchboard_tools::cli::parse_duration;

/// Time allowed for the streams to open beyond count ÷ rate.
const CONNECT_SLACK: Duration = Duration::from_secs(2);

/// floodtest stops sending this long before its end so the last messages arrive.
const DRAIN: Duration = Duration::from_secs(1);

/// Longest wait for every process of the fleet to show in `/cluster`.
const FLEET_LIMIT: Duration = Duration::from_secs(30);

/// Longest wait for `/cluster` to count every stream once they are all
/// established (nodes refresh their entry every heartbeat, 1 s by default).
const COUNT_LIMIT: Duration = Duration::from_secs(5);

/// How often Redis's and the servers' RSS are read during a run.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Most `/stats` requests made to find every node's bus counters (each lands
/// on a process the kernel picks).
const STATS_TRIES: u32 = 80;

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
Two setups in one run, with the same load. **Cluster**: a fresh `redis-server` (no persistence) and \
`switchboard --processes N` with `SWITCHBOARD__CLUSTER__REDIS_URL` pointing at it: N server processes on \
one port (SO_REUSEPORT), each with W worker threads; the harness waits until `GET /cluster` lists all N. \
**Single**: one switchboard with 2 workers and no Redis. floodtest opens the streams (5,000/s, distinct \
ids, from 127.0.0.2-127.0.0.5); the kernel spreads them over the processes. Once they are all open it POSTs \
stamped messages to random streams at the given rate over 4 keep-alive connections to the same port, each \
taken by whichever process the kernel picks, so with N processes about (N−1)/N of the messages reach their \
stream through Redis. **p50/p99/max** are arrival − send time over every message that arrived; **lost** = \
accepted − arrived. **crossed** = messages the nodes got from the bus and delivered (`cluster.received` in \
each node's `/stats`, summed). **CPU %** is user + system time (`/proc/PID/stat`, all threads; for the \
cluster the parent and its N server processes) from the moment every stream was open to floodtest's end, \
as a share of one core; **Redis RSS** is the largest `VmRSS` read every 250 ms over the whole run. Everything \
shares the machine's CPUs: the servers, Redis, floodtest and the harness.";

/// `bench cluster` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Streams held [default: 10000; --smoke: 400].
    #[arg(long)]
    pub streams: Option<u64>,
    /// Messages per second [default: 1000; --smoke: 100].
    #[arg(long)]
    pub msg_rate: Option<f64>,
    /// How long messages are sent [default: 30s; --smoke: 10s].
    #[arg(long, value_parser = parse_duration)]
    pub send_for: Option<Duration>,
    /// `--rate`: streams opened per second.
    #[command(flatten)]
    pub ramp: Ramp,
    /// Server processes in the cluster setup (`switchboard --processes`).
    #[arg(long, default_value_t = 4)]
    pub processes: u32,
    /// Worker threads of each cluster process (the single process has 2).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// How the streams are opened: floodtest's `--transport` (chunked,
    /// sse, ws).
    #[arg(long, value_enum, default_value_t = Transport::Chunked)]
    pub transport: Transport,
    /// Also run the processes on a Redis Cluster of three masters and
    /// three replicas (`cluster.redis_cluster_nodes`), in the same run.
    #[arg(long)]
    pub redis_cluster: bool,
}

/// What the nodes of one setup run on.
#[derive(Clone, Copy)]
enum Backend<'a> {
    /// Nothing: one process.
    None,
    /// One Redis.
    One(&'a Redis),
    /// A Redis Cluster.
    Cluster(&'a RedisCluster),
}

impl<'a> Backend<'a> {
    fn nodes(self) -> Vec<&'a Redis> {
        match self {
            Backend::None => Vec::new(),
            Backend::One(r) => vec![r],
            Backend::Cluster(c) => c.nodes.iter().collect(),
        }
    }

    /// The nodes that take the publishes: the one Redis, or the masters.
    fn masters(self) -> Vec<&'a Redis> {
        match self {
            Backend::None => Vec::new(),
            Backend::One(r) => vec![r],
            Backend::Cluster(c) => c.masters(),
        }
    }

    fn is_some(self) -> bool {
        !matches!(self, Backend::None)
    }
}

/// What `bench cluster` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct ClusterData {
    /// The cluster row, then the single-process row.
    pub rows: Vec<ClusterRow>,
    /// `redis_version` from `INFO`.
    pub redis_version: String,
    /// Unit of `/proc` CPU times.
    pub clock_ticks_per_sec: u64,
}

/// One setup.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct ClusterRow {
    /// Server processes (1: on its own, no Redis).
    pub processes: u32,
    /// Worker threads per process.
    pub workers: u32,
    /// Joined by Redis.
    pub redis: bool,
    /// ... a Redis Cluster's (three masters, three replicas).
    pub redis_cluster: bool,
    /// Streams asked for.
    pub streams: u64,
    /// Messages per second asked for.
    pub msg_rate: f64,
    /// Seconds from floodtest's start until the server(s) held every stream
    /// (None: they never did).
    pub all_open_s: Option<f64>,
    /// Each node's streams as `/cluster` listed them once all were open.
    pub nodes: Vec<NodeStreams>,
    /// `/cluster`'s `totals.streams` then.
    pub cluster_streams: Option<u64>,
    /// The nodes' bus counters after the run (cluster only).
    pub bus: Option<Bus>,
    /// Seconds from every stream open to floodtest's end: the CPU window.
    pub window_s: f64,
    /// Server CPU time over the window, seconds (all its processes).
    pub server_cpu_s: Option<f64>,
    /// Largest server RSS (all its processes) seen during the run, bytes.
    pub server_rss_max: Option<u64>,
    /// Redis during the run (cluster only).
    pub redis_usage: Option<RedisUsage>,
    /// floodtest's summary.
    pub flood: FloodSummary,
}

/// One node of `/cluster`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct NodeStreams {
    /// Its name.
    pub name: String,
    /// Its PID.
    pub pid: Option<u32>,
    /// Streams it held.
    pub streams: u64,
}

/// The `cluster` counters of every node's `/stats`, summed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct Bus {
    /// Nodes whose `/stats` was read.
    pub nodes_read: u32,
    /// PUBLISHes to Redis.
    pub publishes: u64,
    /// PUBLISHes that failed.
    pub publish_errors: u64,
    /// Messages from the bus delivered to local streams.
    pub received: u64,
    /// Own publishes that came back and were ignored.
    pub echoes: u64,
    /// Reconnects to Redis.
    pub reconnects: u64,
    /// Bus errors.
    pub errors: u64,
}

/// Redis during one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct RedisUsage {
    /// User + system CPU time over the window, seconds.
    pub cpu_s: f64,
    /// RSS before floodtest started, bytes.
    pub rss_before: u64,
    /// Largest RSS seen during the run, bytes.
    pub rss_max: u64,
    /// Mean of the RSS samples during the run, bytes.
    pub rss_mean: u64,
    /// RSS samples read.
    pub samples: u64,
    /// `total_commands_processed` over the whole run.
    pub commands: Option<u64>,
    /// `pubsub_channels` once every stream was open (a Redis Cluster's
    /// masters: `pubsubshard_channels`, summed).
    pub channels: Option<u64>,
    /// Each master's part (one Redis: itself).
    pub shards: Vec<ShardUsage>,
}

/// One master during a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct ShardUsage {
    /// Its port.
    pub port: u16,
    /// Publish scripts it ran (`cmdstat_evalsha` calls) over the window.
    pub publishes: u64,
    /// Its CPU time (`used_cpu_user` + `used_cpu_sys`) over the window, s.
    pub cpu_s: f64,
    /// `used_memory` before the server started, once every stream was
    /// open, and after the run, bytes.
    pub memory: [u64; 3],
}

/// Runs `bench cluster`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let streams = c.pick(args.streams, 10_000, 400);
    let msg_rate = c.pick(args.msg_rate, 1000.0, 100.0);
    let send_for = c.pick(args.send_for, Duration::from_secs(30), Duration::from_secs(10));
    let max = max_streams();
    if !(2..=max).contains(&streams) {
        // The single process and the one floodtest process hold them all.
        bail!("--streams must be between 2 and {max} (the open-file limit less a margin)");
    }
    if !(2..=64).contains(&args.processes) {
        bail!("--processes must be between 2 and 64");
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    super::check_positive("--msg-rate", msg_rate)?;
    super::check_positive("--rate", args.ramp.rate)?;
    // Before anything starts: a missing Redis says how to install it.
    super::servers::find_program("redis-server").with_context(super::redis::install_hint)?;
    let load = Load {
        streams,
        msg_rate,
        rate: args.ramp.rate,
        send_for,
        ticks_per_sec: procfs::clock_ticks_per_sec(),
        transport: args.transport,
    };
    let dir = TempDir::new("cluster")?;
    let mut rec = Recorder::new("cluster", c.smoke);
    let mut data = ClusterData {
        clock_ticks_per_sec: load.ticks_per_sec,
        ..ClusterData::default()
    };

    println!(
        "cluster: {} switchboard processes ({} each) + Redis, {} streams, {msg_rate} messages/s for {send_for:?}",
        args.processes,
        count(args.workers, "worker"),
        thousands(streams)
    );
    let redis = Redis::start()?;
    rec.tool(&redis.command);
    data.redis_version = redis
        .info()
        .ok()
        .and_then(|i| i.into_iter().find(|(k, _)| k == "redis_version").map(|(_, v)| v))
        .unwrap_or_else(|| "unknown".into());
    let launch = Launch {
        processes: Some(args.processes),
        workers: Some(args.workers),
        redis_url: Some(redis.url()),
        ..Launch::default()
    };
    let row = measure(&launch, Backend::One(&redis), &load, dir.path(), &mut rec)?;
    print_row(&row);
    data.rows.push(row);
    if let Some(note) = redis.stop() {
        rec.note(note);
    }

    if args.redis_cluster {
        println!(
            "cluster: {} switchboard processes + a Redis Cluster (3 masters, 3 replicas), the same load",
            args.processes
        );
        let redis = RedisCluster::start()?;
        for n in &redis.nodes {
            rec.tool(&n.command);
        }
        rec.tool(&redis.command);
        let launch = Launch {
            processes: Some(args.processes),
            workers: Some(args.workers),
            env: vec![("SWITCHBOARD__CLUSTER__REDIS_CLUSTER_NODES", redis.seeds())],
            ..Launch::default()
        };
        let row = measure(&launch, Backend::Cluster(&redis), &load, dir.path(), &mut rec)?;
        print_row(&row);
        data.rows.push(row);
        for note in redis.stop() {
            rec.note(note);
        }
    }

    println!("cluster: 1 switchboard process ({WORKERS} workers), no Redis, the same load");
    let row = measure(&Launch::default(), Backend::None, &load, dir.path(), &mut rec)?;
    print_row(&row);
    data.rows.push(row);

    let outcome = rec.finish(data);
    outcome.publish(&c.out, &render(&outcome))
}

/// The load both setups get.
struct Load {
    streams: u64,
    msg_rate: f64,
    rate: f64,
    send_for: Duration,
    ticks_per_sec: u64,
    transport: Transport,
}

fn print_row(row: &ClusterRow) {
    println!(
        "  sent {} received {} p50 {} ms p99 {} ms max {} ms{}",
        row.flood.messages.sent,
        row.flood.messages.received,
        opt(row.flood.latency_ms.p50, |x| fixed(x, 2)),
        opt(row.flood.latency_ms.p99, |x| fixed(x, 2)),
        opt(row.flood.latency_ms.max, |x| fixed(x, 2)),
        row.redis_usage.as_ref().map_or(String::new(), |r| format!(
            "; Redis CPU {} s, RSS max {:.1} MiB",
            fixed(r.cpu_s, 2),
            mib(r.rss_max)
        )),
    );
}

/// One setup: `launch` (joined by `redis` when given) under `load`.
fn measure(
    launch: &Launch,
    backend: Backend<'_>,
    load: &Load,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<ClusterRow> {
    let processes = launch.processes.unwrap_or(1);
    let label = match backend {
        Backend::None => "single",
        Backend::One(_) => "cluster",
        Backend::Cluster(_) => "redis-cluster",
    };
    let redis = backend.nodes();
    let masters = backend.masters();
    let memory_before: Vec<u64> = masters
        .iter()
        .map(|m| m.info_u64("used_memory").unwrap_or(0))
        .collect();
    let mut server = Server::start_switchboard(launch)?;
    rec.tool(&server.command);
    if backend.is_some() {
        wait_fleet(&mut server, processes)?;
        check_pids(&server, processes, rec);
    }
    let server_pids = server.pids();
    let redis_pids: Vec<u32> = redis.iter().map(|r| r.pid()).collect();
    let sum_info = |key: &str| -> Option<u64> { redis.iter().map(|r| r.info_u64(key)).sum::<Option<u64>>() };
    let redis_commands_before = sum_info("total_commands_processed");
    let redis_rss_before = (!redis_pids.is_empty())
        .then(|| procfs::rss_bytes(&redis_pids).ok())
        .flatten();
    let sampler = Sampler::start(redis_pids.clone(), server_pids.clone());

    let ramp = Duration::from_secs_f64(load.streams as f64 / load.rate) + CONNECT_SLACK;
    let spec = FloodSpec {
        url: server.url("/test/r{n}"),
        count: load.streams,
        rate: load.rate,
        duration: ramp + load.send_for + DRAIN,
        msg_rate: load.msg_rate,
        send_url: Some(server.url("/send/{id}")),
        lifetime: None,
        stats_url: Some(server.url("/cluster")),
        transport: load.transport,
        tls_ca: None,
    };
    let mut flood = Flood::start(&spec, dir, &format!("cluster-{label}"))?;
    rec.tool(&flood.command);
    let reached = server.wait_established(load.streams, spec.duration, || flood.exited())?;
    let all_open_s = reached.complete.then_some(reached.after.as_secs_f64());
    if !reached.complete {
        rec.note(format!(
            "{label}: only {} of {} streams were open at once",
            reached.count, load.streams
        ));
    }
    // The CPU window: from every stream open (floodtest then starts sending) to its end.
    let window_start = Instant::now();
    let server_cpu_before = procfs::cpu_ticks(&server_pids).ok();
    let redis_cpu_before = (!redis_pids.is_empty())
        .then(|| procfs::cpu_ticks(&redis_pids).ok())
        .flatten();
    let shard_before: Vec<(u64, f64, u64)> = masters.iter().map(|m| shard_counters(m)).collect();
    let (nodes, cluster_streams) = read_nodes(server.addr(), load.streams, &mut flood);
    if nodes.is_empty() {
        rec.note(format!("{label}: GET /cluster listed no nodes"));
    }
    let channels = match backend {
        Backend::Cluster(_) => masters
            .iter()
            .map(|m| m.info_u64("pubsubshard_channels"))
            .sum::<Option<u64>>(),
        _ => sum_info("pubsub_channels"),
    };

    let summary = flood.finish();
    let window_s = window_start.elapsed().as_secs_f64();
    let secs = |(u, s): (u64, u64)| (u + s) as f64 / load.ticks_per_sec.max(1) as f64;
    let cpu_delta = |pids: &[u32], before: Option<(u64, u64)>| {
        let after = procfs::cpu_ticks(pids).ok()?;
        Some(secs(after) - secs(before?))
    };
    let server_cpu_s = cpu_delta(&server_pids, server_cpu_before);
    let redis_cpu_s = (!redis_pids.is_empty())
        .then(|| cpu_delta(&redis_pids, redis_cpu_before))
        .flatten();
    let shards: Vec<ShardUsage> = masters
        .iter()
        .zip(&shard_before)
        .zip(&memory_before)
        .map(|((m, (calls, cpu, open)), before)| {
            let (calls_after, cpu_after, after) = shard_counters(m);
            ShardUsage {
                port: m.port,
                publishes: calls_after.saturating_sub(*calls),
                cpu_s: cpu_after - cpu,
                memory: [*before, *open, after],
            }
        })
        .collect();
    let samples = sampler.stop();
    let summary = summary?;
    let bus = if backend.is_some() {
        Some(read_bus(server.addr(), processes))
    } else {
        None
    };
    if let Some(b) = &bus
        && b.nodes_read < processes
    {
        rec.note(format!(
            "{label}: read the bus counters of {} of {processes} nodes",
            b.nodes_read
        ));
    }
    let redis_usage = backend.is_some().then(|| RedisUsage {
        cpu_s: redis_cpu_s.unwrap_or(0.0),
        rss_before: redis_rss_before.unwrap_or(0),
        rss_max: samples.redis_max(),
        rss_mean: samples.redis_mean(),
        samples: samples.redis.len() as u64,
        commands: sum_info("total_commands_processed")
            .zip(redis_commands_before)
            .map(|(after, before)| after.saturating_sub(before)),
        channels,
        shards,
    });
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    Ok(ClusterRow {
        processes,
        workers: launch.workers.unwrap_or(WORKERS),
        redis: backend.is_some(),
        redis_cluster: matches!(backend, Backend::Cluster(_)),
        streams: load.streams,
        msg_rate: load.msg_rate,
        all_open_s,
        nodes,
        cluster_streams,
        bus,
        window_s,
        server_cpu_s,
        server_rss_max: samples.server.iter().copied().max(),
        redis_usage,
        flood: summary,
    })
}

/// Polls `GET /cluster` until it lists `n` nodes in cluster mode.
fn wait_fleet(server: &mut Server, n: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::from("no answer");
    while started.elapsed() < FLEET_LIMIT {
        if let Some(st) = server.exited() {
            bail!(
                "switchboard --processes {n} exited ({st}):\n{}",
                server.log_tail(20)
            );
        }
        match client::request(server.addr(), "GET", "/cluster", "") {
            Ok(r) => {
                if r.status == 200
                    && let Ok(v) = serde_json::from_str::<Value>(&r.body)
                    && v["mode"] == "cluster"
                    && v["totals"]["nodes"].as_u64() == Some(u64::from(n))
                {
                    return Ok(());
                }
                last = format!("{} {}", r.status, r.body);
            }
            Err(e) => last = e.to_string(),
        }
        process::pause(Duration::from_millis(100))?;
    }
    bail!(
        "GET /cluster did not list {n} nodes within {FLEET_LIMIT:?}; last answer: {last}\n{}",
        server.log_tail(20)
    )
}

/// Notes when the PIDs `/cluster` lists are not the parent's children.
fn check_pids(server: &Server, n: u32, rec: &mut Recorder) {
    let children: Vec<u32> = procfs::children_of(server.main_pid());
    let listed: Vec<u32> = client::get_json(server.addr(), "/cluster")
        .ok()
        .and_then(|v| {
            v["nodes"].as_array().map(|a| {
                a.iter()
                    .filter_map(|n| n["pid"].as_u64().and_then(|p| u32::try_from(p).ok()))
                    .collect()
            })
        })
        .unwrap_or_default();
    let mut sorted = listed.clone();
    sorted.sort_unstable();
    if children.len() != n as usize || sorted != children {
        rec.note(format!(
            "switchboard's parent ({}) has children {children:?}; /cluster lists pids {listed:?}",
            server.main_pid()
        ));
    }
}

/// Each node's streams from `/cluster`, once its total reaches `streams`
/// (or [`COUNT_LIMIT`] passes, or floodtest is gone); and that total.
fn read_nodes(addr: SocketAddr, streams: u64, flood: &mut Flood) -> (Vec<NodeStreams>, Option<u64>) {
    let started = Instant::now();
    let mut best = (Vec::new(), None);
    loop {
        if let Ok(v) = client::get_json(addr, "/cluster") {
            let nodes = v["nodes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|n| NodeStreams {
                            name: n["name"].as_str().unwrap_or("?").to_owned(),
                            pid: n["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
                            streams: n["streams"].as_u64().unwrap_or(0),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let total = v["totals"]["streams"].as_u64();
            best = (nodes, total);
            if total.is_some_and(|t| t >= streams) {
                return best;
            }
        }
        if started.elapsed() >= COUNT_LIMIT
            || flood.exited()
            || process::pause(Duration::from_millis(200)).is_err()
        {
            return best;
        }
    }
}

/// The `cluster` counters of every node's `/stats`: each request lands on
/// a process the kernel picks, so up to [`STATS_TRIES`] are made until `n`
/// distinct nodes have answered.
fn read_bus(addr: SocketAddr, n: u32) -> Bus {
    let mut seen: BTreeMap<String, Value> = BTreeMap::new();
    for _ in 0..STATS_TRIES {
        if seen.len() >= n as usize {
            break;
        }
        if let Ok(v) = client::get_json(addr, "/stats")
            && let Some(node) = v["cluster"]["node"].as_str()
        {
            seen.insert(node.to_owned(), v["cluster"].clone());
        }
    }
    let sum = |k: &str| seen.values().map(|c| c[k].as_u64().unwrap_or(0)).sum();
    Bus {
        nodes_read: seen.len() as u32,
        publishes: sum("publishes"),
        publish_errors: sum("publish_errors"),
        received: sum("received"),
        echoes: sum("echoes"),
        reconnects: sum("reconnects"),
        errors: sum("errors"),
    }
}

/// RSS readings taken by a thread while a run goes on.
#[derive(Debug, Default)]
struct Samples {
    /// Redis's RSS, bytes.
    redis: Vec<u64>,
    /// The server processes' summed RSS, bytes.
    server: Vec<u64>,
}

impl Samples {
    fn redis_max(&self) -> u64 {
        self.redis.iter().copied().max().unwrap_or(0)
    }

    fn redis_mean(&self) -> u64 {
        let n = self.redis.len() as u64;
        self.redis.iter().sum::<u64>().checked_div(n).unwrap_or(0)
    }
}

/// Reads RSS every [`SAMPLE_EVERY`] until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Samples>,
}

impl Sampler {
    fn start(redis: Vec<u32>, server: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut s = Samples::default();
            while !flag.load(Relaxed) && !process::interrupted() {
                if !redis.is_empty()
                    && let Ok(rss) = procfs::rss_bytes(&redis)
                {
                    s.redis.push(rss);
                }
                if let Ok(rss) = procfs::rss_bytes(&server) {
                    s.server.push(rss);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            s
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> Samples {
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// `1 worker`, `4 workers`; `1 process`, `4 processes`.
fn count(n: u32, one: &str) -> String {
    let many = if one.ends_with('s') { "es" } else { "s" };
    format!("{n} {one}{}", if n == 1 { "" } else { many })
}

/// The setup's name in the table.
fn setup(r: &ClusterRow) -> String {
    let what = format!(
        "{} × {}",
        count(r.processes, "process"),
        count(r.workers, "worker")
    );
    match (r.redis, r.redis_cluster) {
        (true, true) => what + " + Redis Cluster",
        (true, false) => what + " + Redis",
        _ => what,
    }
}

/// A master's publish scripts run (`cmdstat_evalsha` calls), its CPU
/// seconds (`used_cpu_user` + `used_cpu_sys`) and its `used_memory`.
fn shard_counters(m: &Redis) -> (u64, f64, u64) {
    let info = m.info_all().unwrap_or_default();
    let get = |key: &str| info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let calls = get("cmdstat_evalsha")
        .and_then(|v| v.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let cpu = ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .filter_map(|k| get(k)?.parse::<f64>().ok())
        .sum();
    let memory = get("used_memory").and_then(|v| v.parse().ok()).unwrap_or(0);
    (calls, cpu, memory)
}

/// The table: the cluster row and the single-process row, then each node's
/// streams, the crossing share and the p99 ratio.
pub(crate) fn render(o: &Outcome<ClusterData>) -> String {
    let mut t = Table::new(&[
        "setup",
        ">streams",
        ">msg/s",
        ">sent",
        ">received",
        ">lost",
        ">send errors",
        ">p50 ms",
        ">p99 ms",
        ">max ms",
        ">crossed",
        ">server CPU %",
        ">Redis CPU %",
        ">Redis RSS MiB",
        "stream errors",
    ]);
    let pct = |cpu: Option<f64>, r: &ClusterRow| {
        opt(cpu.and_then(|c| ratio(c * 100.0, r.window_s)), |x| fixed(x, 1))
    };
    for r in &o.data.rows {
        let f = &r.flood;
        let ms = |x: Option<f64>| opt(x, |v| fixed(v, 2));
        let redis = r.redis_usage.as_ref();
        t.row(vec![
            setup(r),
            thousands(r.streams),
            thousands(r.msg_rate.round() as u64),
            thousands(f.messages.sent),
            thousands(f.messages.received),
            thousands(f.messages.lost),
            thousands(f.messages.send_errors),
            ms(f.latency_ms.p50),
            ms(f.latency_ms.p99),
            ms(f.latency_ms.max),
            r.bus.as_ref().map_or("—".into(), |b| thousands(b.received)),
            pct(r.server_cpu_s, r),
            redis.map_or("—".into(), |u| pct(Some(u.cpu_s), r)),
            redis.map_or("—".into(), |u| fixed(mib(u.rss_max), 1)),
            errors_text(&f.errors),
        ]);
    }
    let mut out = t.render();
    out += "\n";
    for r in &o.data.rows {
        let m = &r.flood.messages;
        let books = if m.sent == m.received && m.send_errors == 0 {
            "sent = received".to_owned()
        } else {
            format!(
                "**sent {} ≠ received {}** ({} send errors)",
                thousands(m.sent),
                thousands(m.received),
                thousands(m.send_errors)
            )
        };
        let nodes = if r.nodes.is_empty() {
            "no nodes listed".to_owned()
        } else {
            r.nodes
                .iter()
                .map(|n| format!("{} {}", n.name, thousands(n.streams)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out += &format!("- {}: {books}; streams per node: {nodes}", setup(r));
        if let Some(b) = &r.bus {
            out += &format!(
                "; crossed processes {} of {} ({}), {} PUBLISHes, {} publish errors, {} reconnects \
                 (bus counters of {} nodes)",
                thousands(b.received),
                thousands(m.received),
                opt(ratio(b.received as f64 * 100.0, m.received as f64), |x| format!(
                    "{}%",
                    fixed(x, 0)
                )),
                thousands(b.publishes),
                thousands(b.publish_errors),
                thousands(b.reconnects),
                b.nodes_read
            );
        }
        if let Some(u) = &r.redis_usage {
            out += &format!(
                "; Redis {} s CPU, RSS {:.1} MiB before → max {:.1} MiB (mean {:.1}, {} samples), {} commands, {} channels",
                fixed(u.cpu_s, 2),
                mib(u.rss_before),
                mib(u.rss_max),
                mib(u.rss_mean),
                u.samples,
                u.commands.map_or("n/a".into(), thousands),
                u.channels.map_or("n/a".into(), thousands),
            );
        }
        out += "\n";
    }
    let p99 = |redis: bool| {
        o.data
            .rows
            .iter()
            .find(|r| r.redis == redis)
            .and_then(|r| Some((r.processes, r.flood.latency_ms.p99?)))
    };
    if let (Some((n, c)), Some((_, s))) = (p99(true), p99(false)) {
        out += &format!("\np99: {n} processes ÷ 1 process = {}.\n", times(ratio(c, s)));
    }
    let latency = |cluster: bool| {
        o.data
            .rows
            .iter()
            .find(|r| r.redis && r.redis_cluster == cluster)
            .map(|r| (r.flood.latency_ms.p50, r.flood.latency_ms.p99))
    };
    if let (Some((Some(c50), Some(c99))), Some((Some(o50), Some(o99)))) = (latency(true), latency(false)) {
        out += &format!(
            "\nRedis Cluster ÷ one Redis: p50 {}, p99 {}.\n",
            times(ratio(c50, o50)),
            times(ratio(c99, o99))
        );
    }
    for r in o.data.rows.iter().filter(|r| r.redis) {
        let Some(u) = &r.redis_usage else {
            continue;
        };
        if u.shards.is_empty() {
            continue;
        }
        let total: u64 = u.shards.iter().map(|x| x.publishes).sum();
        let mean = total as f64 / u.shards.len() as f64;
        let max = u.shards.iter().map(|x| x.publishes).max().unwrap_or(0);
        let each: Vec<String> = u
            .shards
            .iter()
            .map(|x| {
                format!(
                    ":{} {} publishes, {} s CPU ({} ms per 1,000), used_memory {:.1} → {:.1} → {:.1} MiB",
                    x.port,
                    thousands(x.publishes),
                    fixed(x.cpu_s, 2),
                    opt(ratio(x.cpu_s * 1e6, x.publishes as f64), |v| fixed(v, 1)),
                    mib(x.memory[0]),
                    mib(x.memory[1]),
                    mib(x.memory[2])
                )
            })
            .collect();
        out += &format!(
            "\n{}, per master (before the server → every stream open → after the run): {}; max ÷ mean publishes \
             per master = {}.\n",
            setup(r),
            each.join("; "),
            opt(ratio(max as f64, mean), |v| fixed(v, 3))
        );
    }
    if !o.data.redis_version.is_empty() {
        out += &format!("\nRedis {}.\n", o.data.redis_version);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::flood::{LatencyMs, Messages};

    pub(crate) fn row(redis: bool, p99: f64) -> ClusterRow {
        ClusterRow {
            processes: if redis { 4 } else { 1 },
            workers: if redis { 1 } else { 2 },
            redis,
            redis_cluster: false,
            streams: 10_000,
            msg_rate: 1000.0,
            all_open_s: Some(2.2),
            nodes: if redis {
                (0..4)
                    .map(|i| NodeStreams {
                        name: format!("h-{i}"),
                        pid: Some(100 + i),
                        streams: 2500,
                    })
                    .collect()
            } else {
                vec![NodeStreams {
                    name: "h-1".into(),
                    pid: Some(99),
                    streams: 10_000,
                }]
            },
            cluster_streams: Some(10_000),
            bus: redis.then_some(Bus {
                nodes_read: 4,
                publishes: 30_000,
                received: 22_500,
                ..Bus::default()
            }),
            window_s: 31.0,
            server_cpu_s: Some(15.5),
            server_rss_max: Some(80 << 20),
            redis_usage: redis.then_some(RedisUsage {
                cpu_s: 3.1,
                rss_before: 8 << 20,
                rss_max: 12 << 20,
                rss_mean: 11 << 20,
                samples: 140,
                commands: Some(40_000),
                channels: Some(10_000),
                shards: Vec::new(),
            }),
            flood: FloodSummary {
                established: 10_000,
                active: 10_000,
                messages: Messages {
                    sent: 30_000,
                    received: 30_000,
                    lost: 0,
                    send_errors: 0,
                },
                latency_ms: LatencyMs {
                    p50: Some(0.5),
                    p90: Some(1.0),
                    p99: Some(p99),
                    p999: Some(p99 * 2.0),
                    max: Some(p99 * 3.0),
                },
                ..FloodSummary::default()
            },
        }
    }

    pub(crate) fn data() -> ClusterData {
        ClusterData {
            rows: vec![row(true, 3.0), row(false, 2.0)],
            redis_version: "7.0.15".into(),
            clock_ticks_per_sec: 100,
        }
    }

    #[test]
    fn renders_both_setups_and_the_ratio() {
        let o = Recorder::new("cluster", false).finish(data());
        let text = render(&o);
        let rows = crate::table::cells(&text);
        assert_eq!(
            rows[2],
            [
                "4 processes × 1 worker + Redis",
                "10,000",
                "1,000",
                "30,000",
                "30,000",
                "0",
                "0",
                "0.50",
                "3.00",
                "9.00",
                "22,500",
                "50.0",
                "10.0",
                "12.0",
                "none"
            ]
        );
        assert_eq!(rows[3][0], "1 process × 2 workers");
        assert_eq!(rows[3][10], "—");
        assert_eq!(rows[3][12], "—");
        assert!(text.contains("p99: 4 processes ÷ 1 process = 1.50×."), "{text}");
        assert!(text.contains("streams per node: h-0 2,500, h-1 2,500"), "{text}");
        assert!(
            text.contains("crossed processes 22,500 of 30,000 (75%)"),
            "{text}"
        );
        assert!(text.contains("sent = received"), "{text}");
        assert!(text.contains("Redis 7.0.15."), "{text}");
    }

    #[test]
    fn says_when_messages_went_missing() {
        let mut d = data();
        d.rows[0].flood.messages.received = 29_999;
        d.rows[0].nodes.clear();
        let text = render(&Recorder::new("cluster", false).finish(d));
        assert!(text.contains("**sent 30,000 ≠ received 29,999**"), "{text}");
        assert!(text.contains("no nodes listed"), "{text}");
    }

    #[test]
    fn round_trips_through_json() {
        let d = data();
        let back: ClusterData = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn plurals() {
        assert_eq!(count(1, "process"), "1 process");
        assert_eq!(count(4, "process"), "4 processes");
        assert_eq!(count(1, "worker"), "1 worker");
        assert_eq!(count(2, "worker"), "2 workers");
    }

    #[test]
    fn samples_summarise() {
        let s = Samples {
            redis: vec![10, 30, 20],
            server: vec![],
        };
        assert_eq!((s.redis_max(), s.redis_mean()), (30, 20));
        assert_eq!(Samples::default().redis_mean(), 0);
    }
}
