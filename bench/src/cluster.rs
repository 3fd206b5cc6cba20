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
use super::redis::Redis;
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
    /// `pubsub_channels` once every stream was open.
    pub channels: Option<u64>,
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
    let row = measure(&launch, Some(&redis), &load, dir.path(), &mut rec)?;
    print_row(&row);
    data.rows.push(row);
    if let Some(note) = redis.stop() {
        rec.note(note);
    }

    println!("cluster: 1 switchboard process ({WORKERS} workers), no Redis, the same load");
    let row = measure(&Launch::default(), None, &load, dir.path(), &mut rec)?;
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
    redis: Option<&Redis>,
    load: &Load,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<ClusterRow> {
    let processes = launch.processes.unwrap_or(1);
    let label = if redis.is_some() { "cluster" } else { "single" };
    let mut server = Server::start_switchboard(launch)?;
    rec.tool(&server.command);
    if redis.is_some() {
        wait_fleet(&mut server, processes)?;
        check_pids(&server, processes, rec);
    }
    let server_pids = server.pids();
    let redis_pid = redis.map(Redis::pid);
    let redis_commands_before = redis.and_then(|r| r.info_u64("total_commands_processed"));
    let redis_rss_before = redis_pid.and_then(|p| procfs::rss_bytes(&[p]).ok());
    let sampler = Sampler::start(redis_pid, server_pids.clone());

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
    let redis_cpu_before = redis_pid.and_then(|p| procfs::cpu_ticks(&[p]).ok());
    let (nodes, cluster_streams) = read_nodes(server.addr(), load.streams, &mut flood);
    if nodes.is_empty() {
        rec.note(format!("{label}: GET /cluster listed no nodes"));
    }
    let channels = redis.and_then(|r| r.info_u64("pubsub_channels"));

    let summary = flood.finish();
    let window_s = window_start.elapsed().as_secs_f64();
    let secs = |(u, s): (u64, u64)| (u + s) as f64 / load.ticks_per_sec.max(1) as f64;
    let cpu_delta = |pids: &[u32], before: Option<(u64, u64)>| {
        let after = procfs::cpu_ticks(pids).ok()?;
        Some(secs(after) - secs(before?))
    };
    let server_cpu_s = cpu_delta(&server_pids, server_cpu_before);
    let redis_cpu_s = redis_pid.and_then(|p| cpu_delta(&[p], redis_cpu_before));
    let samples = sampler.stop();
    let summary = summary?;
    let bus = if redis.is_some() {
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
    let redis_usage = redis.map(|r| RedisUsage {
        cpu_s: redis_cpu_s.unwrap_or(0.0),
        rss_before: redis_rss_before.unwrap_or(0),
        rss_max: samples.redis_max(),
        rss_mean: samples.redis_mean(),
        samples: samples.redis.len() as u64,
        commands: r
            .info_u64("total_commands_processed")
            .zip(redis_commands_before)
            .map(|(after, before)| after.saturating_sub(before)),
        channels,
    });
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    Ok(ClusterRow {
        processes,
        workers: launch.workers.unwrap_or(WORKERS),
        redis: redis.is_some(),
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
    fn start(redis: Option<u32>, server: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut s = Samples::default();
            while !flag.load(Relaxed) && !process::interrupted() {
                if let Some(pid) = redis
                    && let Ok(rss) = procfs::rss_bytes(&[pid])
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
    if r.redis { what + " + Redis" } else { what }
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
