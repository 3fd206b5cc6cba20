//! `bench soak`: switchboard under a mixed, hostile load for a long while.
//! floodtest holds a population of streams that churn (each closes after a
//! random lifetime and opens again) while it routes messages to them; beside
//! it the harness keeps a slowloris population (request heads sent a byte at
//! a time, refused at the head timeout and started again) and a population
//! that never reads (streams with a tiny receive buffer that are sent large
//! messages until the server cuts them, replaced as they age). Every sample
//! period it reads the server's RSS, open descriptors and `/stats`. What must
//! hold: RSS flat after warm-up, the healthy streams lose nothing, and
//! descriptors and `connections.active` return to their baseline once the
//! load stops.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::chart::{Chart, Series};
use super::flood::{Flood, FloodSpec, FloodSummary, Transport, errors_text};
use super::outcome::{Outcome, Recorder};
use super::process::{self, TempDir};
use super::servers::{Server, ServerKind};
use super::table::{Table, fixed, thousands, whole};
use super::{Common, client, max_streams, procfs};
use switchboard_tools::cli::parse_duration;

/// How flat RSS must stay after warm-up: (max − min) ÷ min.
pub(crate) const GOAL_RSS_FLAT: f64 = 0.05;

/// Time for descriptors and `connections.active` to settle once the load
/// stops (slow readers' sockets linger while the kernel drains them).
const SETTLE: Duration = Duration::from_secs(15);

/// Size of each message sent to the never-reading streams (just under the
/// default `message.max_bytes`). Linux lets the server's send buffer grow to
/// `tcp_wmem`'s maximum (4 MiB here) before the stream's own pending bound
/// (64 KiB) comes into play, so a never-reader is cut after some 1,100 of
/// them.
const NEVER_READ_MESSAGE: usize = 4000;

/// A never-reading stream is replaced after this long.
const NEVER_READ_LIFE: Duration = Duration::from_secs(60);

/// How often the hostile populations are tended (a slowloris byte each).
const TEND: Duration = Duration::from_millis(500);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
A fresh switchboard (2 workers, default settings: 5 s head timeout, 64 KiB pending bound). floodtest holds \
the healthy streams with `--lifetime`: each closes after a random 0.5-1.5 × lifetime and opens again (same \
id), and is no message target for its last second; it routes stamped messages at the given rate to random \
open streams. The harness adds a **slowloris** population (each connection sends `GET /test/sl<k> \
HTTP/1.1` at once, then its headers one byte every 0.5 s; the server answers 408 at the head timeout and the \
connection is started again) and a **never-reading** population (streams with a 4 KiB receive buffer that never read, \
sent 4,000-byte messages at the given rate until the server cuts them as too slow; each is replaced after \
60 s). Every sample period: server RSS (`/proc/PID/status`), open descriptors (`/proc/PID/fd`) and \
`/stats`. **RSS drift** = (max − min) ÷ min over the samples after warm-up. **lost** = healthy messages \
accepted − arrived. After the load stops the harness waits up to 15 s for descriptors and \
`connections.active` to return to their values before the load.";

/// `bench soak` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// How long the load runs [default: 30m; --smoke: 2m].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Healthy streams held (and churned) [default: 15000].
    #[arg(long, default_value_t = 15_000)]
    pub streams: u64,
    /// A healthy stream's mean lifetime before it closes and opens again
    /// [default: 60s; --smoke: 20s].
    #[arg(long, value_parser = parse_duration)]
    pub lifetime: Option<Duration>,
    /// Routed messages per second to the healthy streams.
    #[arg(long, default_value_t = 500.0)]
    pub msg_rate: f64,
    /// Slowloris connections kept open.
    #[arg(long, default_value_t = 200)]
    pub slowloris: u64,
    /// Never-reading streams kept open.
    #[arg(long, default_value_t = 5)]
    pub never_readers: u64,
    /// Messages per second sent to the never-reading streams, over one
    /// keep-alive connection (the kernel buffers some 4 MiB for each before
    /// the server's pending bound is hit).
    #[arg(long, default_value_t = 300.0)]
    pub never_reader_rate: f64,
    /// Time between samples [default: 10s; --smoke: 5s].
    #[arg(long, value_parser = parse_duration)]
    pub sample: Option<Duration>,
    /// Samples before this are warm-up, not judged [default: a quarter of
    /// the duration, at least 30 s; --smoke: half].
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// How the streams are opened: floodtest's `--transport` (chunked,
    /// sse, ws).
    #[arg(long, value_enum, default_value_t = Transport::Chunked)]
    pub transport: Transport,
}

/// What `bench soak` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct SoakData {
    /// Healthy streams.
    pub streams: u64,
    /// Their mean lifetime, s.
    pub lifetime_s: f64,
    /// Healthy messages per second.
    pub msg_rate: f64,
    /// Slowloris connections kept.
    pub slowloris: u64,
    /// Never-reading streams kept.
    pub never_readers: u64,
    /// Load duration, s.
    pub duration_s: f64,
    /// Warm-up, s.
    pub warmup_s: f64,
    /// Before the load.
    pub baseline: Sample,
    /// Every sample period during the load.
    pub samples: Vec<Sample>,
    /// After the load stopped and things settled (or the settle time passed).
    pub after: Sample,
    /// Seconds from the load's end until `after`.
    pub settled_s: f64,
    /// (max − min) ÷ min of RSS after warm-up.
    pub rss_drift: Option<f64>,
    /// Slowloris heads the server refused (408).
    pub slowloris_refused: u64,
    /// Never-reading streams opened in all.
    pub never_readers_opened: u64,
    /// Messages sent to never-reading streams.
    pub never_reader_msgs: u64,
    /// floodtest's summary (the healthy streams).
    pub flood: FloodSummary,
}

/// The server at one moment.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Sample {
    /// Seconds since the load started (negative: before).
    pub t_s: f64,
    /// Server RSS, bytes.
    pub rss: u64,
    /// Server's open descriptors.
    pub fds: u64,
    /// `connections.active`.
    pub streams: u64,
    /// `connections.slow_disconnects`.
    pub slow_disconnects: u64,
    /// `connections.bad_heads`.
    pub bad_heads: u64,
    /// `messages.delivered`, `.written`, `.dropped`.
    pub delivered: u64,
    /// See `delivered`.
    pub written: u64,
    /// See `delivered`.
    pub dropped: u64,
}

/// Runs `bench soak`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let duration = c.pick(args.duration, Duration::from_secs(1800), Duration::from_secs(120));
    let lifetime = c.pick(args.lifetime, Duration::from_secs(60), Duration::from_secs(20));
    let sample = c.pick(args.sample, Duration::from_secs(10), Duration::from_secs(5));
    let warmup = args.warmup.unwrap_or_else(|| {
        let share = if c.smoke { duration / 2 } else { duration / 4 };
        share.max(Duration::from_secs(30))
    });
    let hostile = args.slowloris + args.never_readers;
    let max = max_streams();
    if args.streams == 0 || args.streams + hostile > max {
        bail!(
            "--streams plus the hostile populations must be between 1 and {max} (the open-file limit less a margin)"
        );
    }
    if warmup >= duration {
        bail!("--warmup must be shorter than --duration");
    }
    super::check_positive("--msg-rate", args.msg_rate)?;
    super::check_positive("--never-reader-rate", args.never_reader_rate)?;
    let dir = TempDir::new("soak")?;
    let mut rec = Recorder::new("soak", c.smoke);
    println!(
        "soak: {} churning streams ({lifetime:?} lifetime), {} msg/s, {} slowloris, {} never-readers, for {duration:?}",
        thousands(args.streams),
        args.msg_rate,
        args.slowloris,
        args.never_readers
    );
    let data = measure(args, duration, lifetime, sample, warmup, dir.path(), &mut rec)?;
    println!(
        "  RSS drift {} after warm-up; lost {}; descriptors {} → {} (baseline {})",
        data.rss_drift
            .map_or("n/a".into(), |d| format!("{:.1}%", d * 100.0)),
        data.flood.messages.lost,
        data.samples.iter().map(|s| s.fds).max().unwrap_or(0),
        data.after.fds,
        data.baseline.fds
    );
    let outcome = rec.finish(data);
    outcome.publish(&c.out, &render(&outcome))
}

fn measure(
    args: &Args,
    duration: Duration,
    lifetime: Duration,
    period: Duration,
    warmup: Duration,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<SoakData> {
    let server = Server::start(ServerKind::Switchboard)?;
    rec.tool(&server.command);
    let pid = server.pids()[0];
    let addr = server.addr();
    let started = Instant::now();
    let read = |t0: Instant| read_sample(pid, addr, t0);
    let baseline = read(started)?;

    let spec = FloodSpec {
        url: server.url("/test/h{n}"),
        count: args.streams,
        rate: 5000.0,
        duration,
        msg_rate: args.msg_rate,
        send_url: None,
        lifetime: Some(lifetime),
        stats_url: None,
        transport: args.transport,
        tls_ca: None,
    };
    let mut flood = Flood::start(&spec, dir, "soak")?;
    rec.tool(&flood.command);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(HostileCounts::default());
    let hostile = {
        let (stop, counts, end) = (Arc::clone(&stop), Arc::clone(&counts), started + duration);
        let (slow, never, rate) = (args.slowloris, args.never_readers, args.never_reader_rate);
        std::thread::spawn(move || hostile_load(addr, slow, never, rate, end, &stop, &counts))
    };

    let mut samples = Vec::new();
    let mut next = started + period;
    while Instant::now() < started + duration && !flood.exited() {
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(200));
        if let Err(e) = process::pause(wait) {
            // Interrupted: the hostile thread sees the flag too; floodtest
            // and the server are stopped as they are dropped.
            stop.store(true, Relaxed);
            let _ = hostile.join();
            flood.stop()?;
            return Err(e);
        }
        if Instant::now() >= next {
            samples.push(read(started)?);
            next += period;
        }
    }
    stop.store(true, Relaxed);
    let hostile_result = hostile.join();
    let summary = flood.finish()?;
    if hostile_result.is_err() {
        rec.note("the hostile-load thread panicked".into());
    }
    let ended = Instant::now();
    let mut after = read(started)?;
    while (after.fds > baseline.fds || after.streams > baseline.streams) && ended.elapsed() < SETTLE {
        std::thread::sleep(Duration::from_millis(250));
        after = read(started)?;
    }
    let settled_s = ended.elapsed().as_secs_f64();
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    let judged: Vec<u64> = samples
        .iter()
        .filter(|s| s.t_s >= warmup.as_secs_f64())
        .map(|s| s.rss)
        .collect();
    Ok(SoakData {
        streams: args.streams,
        lifetime_s: lifetime.as_secs_f64(),
        msg_rate: args.msg_rate,
        slowloris: args.slowloris,
        never_readers: args.never_readers,
        duration_s: duration.as_secs_f64(),
        warmup_s: warmup.as_secs_f64(),
        baseline,
        samples,
        after,
        settled_s,
        rss_drift: drift(&judged),
        slowloris_refused: counts.refused.load(Relaxed),
        never_readers_opened: counts.never_opened.load(Relaxed),
        never_reader_msgs: counts.never_msgs.load(Relaxed),
        flood: summary,
    })
}

/// (max − min) ÷ min, or `None` for fewer than two samples.
pub(crate) fn drift(values: &[u64]) -> Option<f64> {
    let (min, max) = (values.iter().min()?, values.iter().max()?);
    (values.len() >= 2 && *min > 0).then(|| (max - min) as f64 / *min as f64)
}

/// The server's RSS, descriptors and `/stats` counts now.
fn read_sample(pid: u32, addr: SocketAddr, t0: Instant) -> anyhow::Result<Sample> {
    let stats = client::get_json(addr, "/stats")?;
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    Ok(Sample {
        t_s: t0.elapsed().as_secs_f64(),
        rss: procfs::rss_bytes(&[pid])?,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64,
        streams: n(&stats["connections"]["active"]),
        slow_disconnects: n(&stats["connections"]["slow_disconnects"]),
        bad_heads: n(&stats["connections"]["bad_heads"]),
        delivered: n(&stats["messages"]["delivered"]),
        written: n(&stats["messages"]["written"]),
        dropped: n(&stats["messages"]["dropped"]),
    })
}

/// What the hostile populations did.
#[derive(Default)]
struct HostileCounts {
    /// Slowloris connections the server ended (its 408).
    refused: AtomicU64,
    /// Never-reading streams opened.
    never_opened: AtomicU64,
    /// Messages sent to them.
    never_msgs: AtomicU64,
}

/// One slowloris connection: how far into its head it got.
struct Slow {
    conn: Option<TcpStream>,
    sent: usize,
}

/// The head a slowloris connection sends: the request line at once (so the
/// lean path takes it and checks the headers as they come), then the headers
/// a byte at a time, never finishing before the head timeout.
fn slow_head(k: u64) -> Vec<u8> {
    format!(
        "GET /test/sl{k} HTTP/1.1\r\nHost: x\r\nX-Slow: {}",
        "z".repeat(200)
    )
    .into_bytes()
}

/// How much of [`slow_head`] goes in the first write: the request line.
fn slow_line_len(head: &[u8]) -> usize {
    head.iter()
        .position(|&b| b == b'\n')
        .map_or(head.len(), |i| i + 1)
}

/// Keeps `slow` slowloris connections and `never` never-reading streams
/// until `end` or `stop`, and sends `rate` large messages per second to the
/// never-readers.
fn hostile_load(
    addr: SocketAddr,
    slow: u64,
    never: u64,
    rate: f64,
    end: Instant,
    stop: &AtomicBool,
    counts: &HostileCounts,
) {
    use std::io::{Read, Write};
    let mut slows: Vec<Slow> = (0..slow).map(|_| Slow { conn: None, sent: 0 }).collect();
    let mut nevers: Vec<Option<(TcpStream, Instant)>> = (0..never).map(|_| None).collect();
    let started = Instant::now();
    let mut msgs = 0u64;
    let body = "n".repeat(NEVER_READ_MESSAGE);
    let mut publisher = client::KeepAlive::new(addr);
    while Instant::now() < end && !stop.load(Relaxed) && !process::interrupted() {
        let round = Instant::now();
        for (k, s) in slows.iter_mut().enumerate() {
            let head = slow_head(k as u64);
            let conn = match &mut s.conn {
                Some(c) => c,
                slot => {
                    s.sent = 0;
                    match TcpStream::connect(addr) {
                        Ok(c) => {
                            let _ = c.set_nonblocking(true);
                            slot.insert(c)
                        }
                        Err(_) => continue,
                    }
                }
            };
            let mut buf = [0u8; 512];
            let ended = match conn.read(&mut buf) {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
                Err(_) => true,
            };
            let next = if s.sent == 0 {
                slow_line_len(&head)
            } else {
                s.sent + 1
            };
            if ended || s.sent >= head.len() || conn.write_all(&head[s.sent..next]).is_err() {
                counts.refused.fetch_add(u64::from(ended), Relaxed);
                s.conn = None;
                continue;
            }
            s.sent = next;
        }
        for (k, n) in nevers.iter_mut().enumerate() {
            if n.as_ref().is_some_and(|(_, at)| at.elapsed() < NEVER_READ_LIFE) {
                continue;
            }
            *n = open_never_reader(addr, k).map(|c| (c, Instant::now()));
            counts.never_opened.fetch_add(u64::from(n.is_some()), Relaxed);
        }
        // Large messages to random never-readers, at the asked rate.
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        while msgs < due && never > 0 {
            let k = msgs % never;
            msgs += 1;
            if publisher.post(&format!("/send/nr{k}"), &body).is_ok() {
                counts.never_msgs.fetch_add(1, Relaxed);
            }
        }
        std::thread::sleep(TEND.saturating_sub(round.elapsed()));
    }
    // Their sockets close here, as the load stops.
    drop((slows, nevers));
    let _ = std::io::stdout().flush();
}

/// A stream that will never be read, with a 4 KiB receive buffer so the
/// server's pending bound is soon reached.
fn open_never_reader(addr: SocketAddr, k: usize) -> Option<TcpStream> {
    use std::io::Write;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.set_recv_buffer_size(4096).ok()?;
    socket.connect(&addr.into()).ok()?;
    let mut c: TcpStream = socket.into();
    c.write_all(format!("GET /test/nr{k} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    Some(c)
}

/// RSS and descriptors over time, for the report's charts.
pub(crate) fn charts(d: &SoakData) -> (Chart, Chart) {
    let minutes = |s: &Sample| s.t_s / 60.0;
    let rss = Chart {
        title: "switchboard RSS during the soak".into(),
        x_label: "minutes".into(),
        y_label: "RSS, MiB".into(),
        series: vec![Series {
            name: "RSS".into(),
            points: d
                .samples
                .iter()
                .map(|s| (minutes(s), s.rss as f64 / (1u64 << 20) as f64))
                .collect(),
        }],
    };
    let fds = Chart {
        title: "switchboard descriptors and streams during the soak".into(),
        x_label: "minutes".into(),
        y_label: "count".into(),
        series: vec![
            Series {
                name: "open fds".into(),
                points: d.samples.iter().map(|s| (minutes(s), s.fds as f64)).collect(),
            },
            Series {
                name: "streams".into(),
                points: d.samples.iter().map(|s| (minutes(s), s.streams as f64)).collect(),
            },
        ],
    };
    (rss, fds)
}

/// The summary table and the sample table.
pub(crate) fn render(o: &Outcome<SoakData>) -> String {
    let d = &o.data;
    let f = &d.flood;
    let mut t = Table::new(&["", ""]);
    let row = |t: &mut Table, k: &str, v: String| t.row(vec![k.into(), v]);
    row(
        &mut t,
        "load",
        format!(
            "{} churning streams ({} s mean lifetime), {} msg/s; {} slowloris; {} never-readers; {} s",
            thousands(d.streams),
            whole(d.lifetime_s),
            whole(d.msg_rate),
            d.slowloris,
            d.never_readers,
            whole(d.duration_s)
        ),
    );
    row(
        &mut t,
        "RSS drift after warm-up",
        match d.rss_drift {
            Some(x) => format!(
                "{}% (warm-up {} s; goal ≤ {}%)",
                fixed(x * 100.0, 1),
                whole(d.warmup_s),
                whole(GOAL_RSS_FLAT * 100.0)
            ),
            None => "not enough samples".into(),
        },
    );
    row(
        &mut t,
        "healthy messages",
        format!(
            "sent {}, received {}, lost {}; p99 {} ms",
            thousands(f.messages.sent),
            thousands(f.messages.received),
            thousands(f.messages.lost),
            f.latency_ms.p99.map_or("n/a".into(), |x| fixed(x, 2))
        ),
    );
    row(
        &mut t,
        "healthy streams",
        format!(
            "opened {} times, churned {}, closed by the server {}, open errors {}",
            thousands(f.established),
            thousands(f.churned),
            thousands(f.closed),
            errors_text(&f.errors)
        ),
    );
    row(
        &mut t,
        "hostile",
        format!(
            "{} slowloris heads refused (408); {} never-readers opened, {} large messages to them, {} cut as too slow",
            thousands(d.slowloris_refused),
            thousands(d.never_readers_opened),
            thousands(d.never_reader_msgs),
            thousands(d.after.slow_disconnects)
        ),
    );
    row(
        &mut t,
        "message books at the end",
        format!(
            "delivered {} = written {} + dropped {}{}",
            thousands(d.after.delivered),
            thousands(d.after.written),
            thousands(d.after.dropped),
            if d.after.delivered == d.after.written + d.after.dropped {
                ""
            } else {
                " (**unbalanced**)"
            }
        ),
    );
    row(
        &mut t,
        "descriptors / streams",
        format!(
            "baseline {} / {}; peak {} / {}; {} s after the load {} / {}",
            d.baseline.fds,
            d.baseline.streams,
            d.samples.iter().map(|s| s.fds).max().unwrap_or(0),
            d.samples.iter().map(|s| s.streams).max().unwrap_or(0),
            fixed(d.settled_s, 1),
            d.after.fds,
            d.after.streams
        ),
    );
    let mut out = t.render();
    let mut s = Table::new(&[">t s", ">RSS MiB", ">fds", ">streams", ">slow cut", ">bad heads"]);
    for x in &d.samples {
        s.row(vec![
            whole(x.t_s),
            fixed(x.rss as f64 / (1u64 << 20) as f64, 1),
            thousands(x.fds),
            thousands(x.streams),
            thousands(x.slow_disconnects),
            thousands(x.bad_heads),
        ]);
    }
    out += "\n<details><summary>Every sample</summary>\n\n";
    out += &s.render();
    out += "\n</details>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_range_over_minimum() {
        assert_eq!(drift(&[100, 105, 102]), Some(0.05));
        assert_eq!(drift(&[100]), None);
        assert_eq!(drift(&[]), None);
    }

    #[test]
    fn renders_books_and_samples() {
        let mut d = SoakData {
            streams: 15_000,
            lifetime_s: 60.0,
            msg_rate: 500.0,
            duration_s: 120.0,
            rss_drift: Some(0.012),
            ..SoakData::default()
        };
        d.samples.push(Sample {
            t_s: 10.0,
            rss: 20 << 20,
            fds: 15_300,
            streams: 15_050,
            ..Sample::default()
        });
        d.after = Sample {
            delivered: 10,
            written: 7,
            dropped: 3,
            ..Sample::default()
        };
        let text = render(&Recorder::new("soak", false).finish(d));
        assert!(text.contains("1.2%"), "{text}");
        assert!(text.contains("delivered 10 = written 7 + dropped 3"), "{text}");
        assert!(!text.contains("unbalanced"), "{text}");
        assert!(text.contains("15,300"), "{text}");
    }
}
