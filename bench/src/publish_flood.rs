//! `bench flood`: a publisher faster than the streams. floodtest holds the
//! streams and reads everything; a few connections pipeline `POST
//! /broadcast` as fast as they are answered; the harness samples the
//! server's RSS and `/healthz`, counts the answers by status, and after the
//! flood waits for the books to balance (every accepted delivery written
//! or dropped). With `--baseline PATH` another switchboard binary (the
//! previous build) is measured the same way in the same run.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::client;
use super::flood::{Flood, FloodSpec, Transport};
use super::outcome::{Outcome, Recorder};
use super::process::{TempDir, pause};
use super::servers::{Launch, Server};
use super::table::{Table, fixed, opt, thousands};
use super::{Common, procfs};
use switchboard_tools::cli::parse_duration;

/// Streams opened per second.
const RATE: f64 = 5000.0;

/// Time allowed for the streams to open beyond count ÷ rate.
const RAMP_SLACK: Duration = Duration::from_secs(10);

/// Requests a publisher writes before it reads their answers.
const PIPELINE: usize = 32;

/// The broadcast body: 100 bytes.
const BODY: &str =
    "flood-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567";

/// How often RSS and `/healthz` are sampled.
const SAMPLE: Duration = Duration::from_millis(100);

/// How long after the flood the books may take to balance.
const DRAIN_MAX: Duration = Duration::from_secs(30);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
A fresh server (2 workers, default settings: `publish.max_backlog` 200,000, `publish.wait_ms` 2,000) per \
row; floodtest opens the streams (5,000/s) and reads everything. Once they are established and 1 s has \
passed, *RSS before* is read; then the publishers, each one keep-alive connection, write 32 pipelined \
`POST /broadcast` (100-byte body) at a time and read the 32 answers, for the flood's duration. Every 100 ms \
the harness reads the server's RSS (**peak**) and times a `GET /healthz` on a new connection (**slowest \
/healthz**). After the flood it polls `/stats` until `messages.delivered = written + dropped` (**drain**, \
at most 30 s), then reads **RSS after**, 1 s later. A baseline row is the same run of another switchboard \
binary (`--baseline`), the previous build.";

/// `bench flood` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Streams held [default: 2,000; --smoke: 200].
    #[arg(long)]
    pub streams: Option<u64>,
    /// Connections pipelining broadcasts.
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// How long they publish [default: 8s; --smoke: 2s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Another switchboard binary measured the same way in the same run,
    /// after this build's (the previous build, e.g. from a `git worktree`
    /// built with `cargo build --release`).
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<PathBuf>,
}

/// What `bench flood` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct FloodData {
    /// This build first, then the baseline.
    pub rows: Vec<FloodRow>,
}

/// One server binary under the flood.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct FloodRow {
    /// `this build`, or the baseline's path.
    pub build: String,
    /// Streams held.
    pub streams: u64,
    /// Publishing connections.
    pub publishers: usize,
    /// Flood length, s.
    pub duration_s: f64,
    /// `POST /broadcast` answers by status.
    pub answers: BTreeMap<u16, u64>,
    /// Server RSS once the streams were open, bytes.
    pub rss_before: u64,
    /// Highest RSS sampled from the flood's start to the drain's end.
    pub rss_peak: u64,
    /// RSS 1 s after the drain (or its limit).
    pub rss_after: u64,
    /// Flood end → books balanced, s (`None`: not within 30 s).
    pub drain_s: Option<f64>,
    /// Slowest `/healthz` during the flood, ms (`None`: one failed).
    pub healthz_max_ms: Option<f64>,
    /// `/stats` `messages.delivered` at the end.
    pub delivered: u64,
}

/// Runs `bench flood`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let streams = c.pick(args.streams, 2000, 200);
    let duration = c.pick(args.duration, Duration::from_secs(8), Duration::from_secs(2));
    super::check_streams(streams, RATE)?;
    if args.publishers == 0 {
        bail!("--publishers must be at least 1");
    }
    let dir = TempDir::new("flood")?;
    let mut rec = Recorder::new("flood", c.smoke);
    let mut builds = vec![("this build".to_owned(), None)];
    if let Some(b) = &args.baseline {
        if !b.is_file() {
            bail!("--baseline {}: no such file", b.display());
        }
        builds.push((b.display().to_string(), Some(b.clone())));
    }
    let mut rows = Vec::new();
    for (label, binary) in builds {
        println!(
            "flood: {label}, {} streams, {} publishers for {duration:?}",
            thousands(streams),
            args.publishers
        );
        let launch = Launch {
            binary,
            ..Launch::default()
        };
        let row = measure(
            &label,
            &launch,
            streams,
            args.publishers,
            duration,
            dir.path(),
            &mut rec,
        )?;
        println!(
            "  answers {:?}; RSS {} → peak {} → after {} MB; drain {} s",
            row.answers,
            row.rss_before / 1_000_000,
            row.rss_peak / 1_000_000,
            row.rss_after / 1_000_000,
            opt(row.drain_s, |x| fixed(x, 1))
        );
        rows.push(row);
    }
    let outcome = rec.finish(FloodData { rows });
    outcome.publish(&c.out, &render(&outcome))
}

fn measure(
    label: &str,
    launch: &Launch,
    streams: u64,
    publishers: usize,
    duration: Duration,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<FloodRow> {
    let server = Server::start_switchboard(launch)?;
    rec.tool(&server.command);
    let ramp_limit = Duration::from_secs_f64(streams as f64 / RATE) + RAMP_SLACK;
    let spec = FloodSpec {
        url: server.url("/test/flood{n}"),
        count: streams,
        rate: RATE,
        duration: ramp_limit + duration + DRAIN_MAX + Duration::from_secs(5),
        msg_rate: 0.0,
        send_url: None,
        lifetime: None,
        stats_url: None,
        transport: Transport::Chunked,
        tls_ca: None,
    };
    let mut flood = Flood::start(&spec, dir, &format!("flood-{}", rows_label(label)))?;
    rec.tool(&flood.command);
    let reached = server.wait_established(streams, ramp_limit, || flood.exited())?;
    if !reached.complete {
        bail!(
            "{label}: only {} of {streams} streams established; floodtest said:\n{}",
            reached.count,
            flood.log_tail()
        );
    }
    pause(Duration::from_secs(1))?;
    let rss = || procfs::rss_bytes(&server.pids()).unwrap_or(0);
    let rss_before = rss();
    let answers: Arc<[AtomicU64; 600]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
    let end = Instant::now() + duration;
    let addr = server.addr();
    let threads: Vec<_> = (0..publishers)
        .map(|_| {
            let answers = Arc::clone(&answers);
            std::thread::spawn(move || publish_until(addr, end, &answers))
        })
        .collect();
    rec.tool(&format!(
        "(the harness) {publishers} connections pipelining {PIPELINE} POST {} (100-byte body) at a time",
        server.url("/broadcast")
    ));
    let (mut peak, mut health) = (rss_before, Some(0.0f64));
    while Instant::now() < end {
        peak = peak.max(rss());
        let t = Instant::now();
        let ok = client::request(addr, "GET", "/healthz", "").is_ok_and(|r| r.status == 200);
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        health = health.filter(|_| ok).map(|h| h.max(ms));
        pause(SAMPLE)?;
    }
    for t in threads {
        if let Err(e) = t
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a publisher panicked")))
        {
            rec.note(format!("{label}: a publisher stopped early: {e:#}"));
        }
    }
    let drained = Instant::now();
    let mut drain_s = None;
    let mut delivered = 0;
    while drained.elapsed() < DRAIN_MAX {
        peak = peak.max(rss());
        if let Ok(st) = client::get_json(addr, "/stats") {
            let m = &st["messages"];
            let n = |k: &str| m[k].as_u64().unwrap_or(0);
            delivered = n("delivered");
            if n("written") + n("dropped") == delivered {
                drain_s = Some(drained.elapsed().as_secs_f64());
                break;
            }
        }
        pause(SAMPLE)?;
    }
    pause(Duration::from_secs(1))?;
    let rss_after = rss();
    flood.stop()?;
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    Ok(FloodRow {
        build: label.to_owned(),
        streams,
        publishers,
        duration_s: duration.as_secs_f64(),
        answers: answers
            .iter()
            .enumerate()
            .filter_map(|(s, n)| {
                let n = n.load(Relaxed);
                (n > 0).then_some((s as u16, n))
            })
            .collect(),
        rss_before,
        rss_peak: peak,
        rss_after,
        drain_s,
        healthz_max_ms: health,
        delivered,
    })
}

/// A file-name-safe form of a row's label.
fn rows_label(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// One publisher: pipelined broadcasts on one connection until `end`.
fn publish_until(addr: SocketAddr, end: Instant, answers: &[AtomicU64; 600]) -> anyhow::Result<()> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.set_nodelay(true)?;
    let one = format!(
        "POST /broadcast HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let batch = one.repeat(PIPELINE);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while Instant::now() < end {
        conn.write_all(batch.as_bytes())?;
        let mut left = PIPELINE;
        while left > 0 {
            while let Some((status, len)) = client::next_reply(&buf) {
                answers[usize::from(status).min(599)].fetch_add(1, Relaxed);
                buf.drain(..len);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
            if left == 0 {
                break;
            }
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(())
}

/// The table: one row per build.
pub(crate) fn render(o: &Outcome<FloodData>) -> String {
    let mut t = Table::new(&[
        "build",
        ">streams",
        ">publishers × s",
        ">answered 200",
        ">answered 503",
        ">other",
        ">RSS before MB",
        ">RSS peak MB",
        ">RSS after MB",
        ">drain s",
        ">slowest /healthz ms",
    ]);
    let mb = |b: u64| fixed(b as f64 / 1e6, 1);
    for r in &o.data.rows {
        let count = |s: u16| r.answers.get(&s).copied().unwrap_or(0);
        let other: u64 = r
            .answers
            .iter()
            .filter(|(s, _)| !matches!(s, 200 | 503))
            .map(|(_, n)| n)
            .sum();
        t.row(vec![
            r.build.clone(),
            thousands(r.streams),
            format!("{} × {}", r.publishers, fixed(r.duration_s, 0)),
            thousands(count(200)),
            thousands(count(503)),
            thousands(other),
            mb(r.rss_before),
            mb(r.rss_peak),
            mb(r.rss_after),
            opt(r.drain_s, |x| fixed(x, 1)),
            opt(r.healthz_max_ms, |x| fixed(x, 1)),
        ]);
    }
    let mut out = t.render();
    if let [now, before] = &o.data.rows[..] {
        let growth = |r: &FloodRow| r.rss_peak.saturating_sub(r.rss_before) as f64;
        out += &format!(
            "\nRSS growth during the flood: this build {} MB, baseline {} MB.\n",
            fixed(growth(now) / 1e6, 1),
            fixed(growth(before) / 1e6, 1)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_both_builds() {
        let row = |build: &str, ok: u64, refused: u64, peak: u64| FloodRow {
            build: build.into(),
            streams: 2000,
            publishers: 4,
            duration_s: 8.0,
            answers: [(200, ok), (503, refused)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            rss_before: 10_000_000,
            rss_peak: peak,
            rss_after: 12_000_000,
            drain_s: Some(0.5),
            healthz_max_ms: Some(3.0),
            delivered: ok * 2000,
        };
        let o = Recorder::new("flood", false).finish(FloodData {
            rows: vec![
                row("this build", 300, 60, 14_000_000),
                row("../prev", 30_000, 0, 510_000_000),
            ],
        });
        let text = render(&o);
        assert!(text.contains("| this build |"), "{text}");
        assert!(text.contains("30,000"), "{text}");
        assert!(text.contains("this build 4.0 MB, baseline 500.0 MB"), "{text}");
    }
}
