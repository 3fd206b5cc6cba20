//! `bench idle`: what an idle stream costs. For each server and stream
//! count: a fresh server; its RSS (all its processes) and the kernel's slab
//! before; floodtest opens N streams; once the server holds N established
//! connections and a settle time has passed, RSS and slab again; then a CPU
//! window of one tick period, with switchboard's chunk count across it.
//! The TLS transports (`tls`, `tls-sse`, `tls-ws`) run the same with the
//! streams inside TLS, to a server given a certificate made for the run.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::flood::{Flood, FloodSpec, Wire};
use super::outcome::{Outcome, Recorder};
use super::process::{self, TempDir, pause};
use super::servers::{Matrix, Server, ServerKind};
use super::table::{Table, fixed, opt, ratio, thousands, times, whole};
use super::tls::{self, TlsFiles};
use super::{Common, Ramp, client, max_streams, procfs};
use switchboard_tools::cli::parse_duration;

/// Time allowed for the streams to open beyond count ÷ rate.
const RAMP_SLACK: Duration = Duration::from_secs(30);

/// TIME_WAIT sockets that may expire between the two memory readings,
/// at least (else 1% of the streams).
const TIME_WAIT_TOLERATED: u64 = 100;

/// Margin on top of the expected time between the two memory readings when
/// deciding which TIME_WAIT sockets would expire in between.
const SPAN_MARGIN: Duration = Duration::from_secs(3);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
For each server and stream count N: a fresh server (2 workers); after it is ready and has idled for the \
settle time, *baseline* = sum of `VmRSS` over the server's processes (nginx: master and workers) and `Slab:` \
from `/proc/meminfo`. floodtest then opens N streams (5,000/s, four source addresses, `--stats-url none`). \
When `/proc/net/tcp` shows N established connections whose local end is the server's address and the \
settle time has passed again: **RSS/stream** = (RSS − baseline RSS) ÷ established streams; **slab/pair** = \
(Slab − baseline Slab) ÷ streams — kernel memory for *both* ends of each connection (client and server \
are on this machine), machine-wide, so other activity adds noise. Then a **CPU window** of one tick \
period (10 s; switchboard ticks every stream once per period): utime+stime over the server's processes \
from `/proc/PID/stat` before and after → **CPU %** of one core; for switchboard, `chunks_sent` from \
`/stats` before and after → **µs/chunk** = server CPU time ÷ chunks written, split into user + system \
time (on loopback a write's system time includes the receiving end's TCP processing, which a NIC would \
take elsewhere; `/proc` counts CPU time in 10 ms ticks, so µs/chunk is ±1 tick ÷ chunks). Nchan sends \
nothing to idle streams, so it has no µs/chunk. A TIME_WAIT socket (left by earlier runs, 60 s after each closed \
connection) frees its slab memory when it expires; before the baseline the harness reads every TIME_WAIT \
timer in `/proc/net/tcp` and, if more than 1% of N would expire before the second reading, waits for \
them first. **sockets/process** counts socket descriptors per server process \
(nginx: master first, then each worker) — how connections spread over workers. \
The TLS transports (`tls` = chunked, `tls-sse`, `tls-ws` inside TLS) open the same streams as https:// \
to a second port of the same server that serves TLS 1.2/1.3 with a P-256 certificate made for the run \
(switchboard: `server.tls_ports`; nginx: `listen ... ssl`), its first port staying plain for the \
harness's own requests; floodtest (rustls, ring, its default versions and suites) does a full \
handshake per stream, no session resumption.";

/// `bench idle` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Stream counts to measure, comma-separated (at most the open-file limit less 1,000)
    /// [default: 1000,10000 and the most (19,000 here); --smoke: 100,300].
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub counts: Option<Vec<u64>>,
    /// Servers and transports.
    #[command(flatten)]
    pub matrix: Matrix,
    /// `--rate`: streams opened per second.
    #[command(flatten)]
    pub ramp: Ramp,
    /// CPU window [default: 10s, one tick period; --smoke: 1s].
    #[arg(long, value_parser = parse_duration)]
    pub window: Option<Duration>,
    /// Idle time before each memory reading [default: 2s; --smoke: 500ms].
    #[arg(long, value_parser = parse_duration)]
    pub settle: Option<Duration>,
    /// Longest wait, before each baseline, for TIME_WAIT sockets of earlier
    /// runs that would otherwise expire (and free slab memory) between the
    /// two memory readings [default: 65s; --smoke: 0s].
    #[arg(long, value_parser = parse_duration)]
    pub drain: Option<Duration>,
    /// switchboard with a subscribe hook (`hooks.subscribe_url`) answered by
    /// `bench-hook`: every stream's admission asks it.
    #[arg(long)]
    pub hook: bool,
    /// switchboard sending webhooks (`hooks.events_url`) to `bench-hook`:
    /// `id_occupied` and `id_vacated` for every id, and what a namespace
    /// adds (`--setting SWITCHBOARD__NAMESPACES__CHAT__WEBHOOKS=...`).
    #[arg(long)]
    pub webhooks: bool,
    /// More settings for switchboard, as `SWITCHBOARD__SECTION__KEY=VALUE`
    /// (repeatable): `[namespaces.<name>]` sections, say.
    #[arg(long = "setting", value_name = "VAR=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, String)>,
    /// What switchboard's stream ids start with (`chat:` puts them in
    /// `[namespaces.chat]`); a peer's stay `i{n}`.
    #[arg(long, default_value = "")]
    pub id_prefix: String,
}

/// A `--setting`: a `SWITCHBOARD__` variable and its value.
fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if k.starts_with("SWITCHBOARD__") => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not SWITCHBOARD__SECTION__KEY=VALUE")),
    }
}

/// What `bench idle` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct IdleData {
    /// One row per (server, count).
    pub rows: Vec<IdleRow>,
    /// Units of the CPU times read from `/proc`.
    pub clock_ticks_per_sec: u64,
    /// Servers and transports asked for that were not measured: a peer's
    /// transports it is not set up for (Nchan: SSE and WebSocket, plain or
    /// TLS).
    #[serde(default)]
    pub not_supported: Vec<(ServerKind, Wire)>,
}

/// One server at one stream count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct IdleRow {
    /// Which server.
    pub server: ServerKind,
    /// How the streams were opened.
    #[serde(default)]
    pub transport: Wire,
    /// Streams asked for.
    pub streams: u64,
    /// Established connections on the server's address at the memory reading.
    pub established: u64,
    /// Seconds from starting floodtest until N were established.
    pub ramp_s: f64,
    /// Longest `/proc/net/tcp` read while waiting, ms.
    pub tcp_read_ms: f64,
    /// Server RSS before the streams, bytes.
    pub rss_baseline: u64,
    /// Server RSS with the streams, bytes.
    pub rss: u64,
    /// (rss − rss_baseline) ÷ established.
    pub rss_per_stream: Option<f64>,
    /// Machine slab before, bytes.
    pub slab_baseline: u64,
    /// Machine slab with the streams, bytes.
    pub slab: u64,
    /// IPv4 sockets in TIME_WAIT at the baseline (their expiry frees slab).
    #[serde(default)]
    pub time_wait_baseline: u64,
    /// Of those, how many expired before the memory reading (each freed
    /// a little slab memory in between).
    #[serde(default)]
    pub time_wait_expired: u64,
    /// (slab − slab_baseline) ÷ established: both ends of a connection.
    pub slab_per_pair: Option<f64>,
    /// Length of the CPU window, seconds.
    pub window_s: f64,
    /// Server CPU time (user + system) in the window, seconds.
    pub cpu_s: f64,
    /// Of which in system calls (on loopback, a write also runs the
    /// receiving end's TCP processing), seconds.
    #[serde(default)]
    pub cpu_sys_s: f64,
    /// cpu_s ÷ window_s, percent of one core.
    pub cpu_percent: f64,
    /// Chunks switchboard wrote in the window (None: Nchan).
    pub chunks: Option<u64>,
    /// Server CPU µs per chunk written.
    pub us_per_chunk: Option<f64>,
    /// Socket descriptors per server process (nginx: master, then workers).
    pub sockets: Vec<u64>,
}

/// Runs `bench idle`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let counts = c.pick(
        args.counts.clone(),
        vec![1000, 10_000, max_streams()],
        vec![100, 300],
    );
    let servers = args.matrix.servers.chosen();
    let transports = c.pick(
        args.matrix.transports.clone(),
        vec![Wire::Chunked],
        vec![Wire::Chunked, Wire::Sse, Wire::Ws],
    );
    let window = c.pick(args.window, Duration::from_secs(10), Duration::from_secs(1));
    let settle = c.pick(args.settle, Duration::from_secs(2), Duration::from_millis(500));
    let drain = c.pick(args.drain, Duration::from_secs(65), Duration::ZERO);
    let max = max_streams();
    if let Some(&n) = counts.iter().find(|&&n| n == 0 || n > max) {
        bail!("--counts: {n} is not between 1 and {max} (the open-file limit less a margin)");
    }
    super::check_positive("--rate", args.ramp.rate)?;
    let dir = TempDir::new("idle")?;
    let mut rec = Recorder::new("idle", c.smoke);
    let runs = ServerKind::runs(&servers, &transports);
    let tls_files = if runs.iter().any(|(_, w)| w.tls()) {
        Some(tls::make_certificates(dir.path())?)
    } else {
        None
    };
    let mut data = IdleData {
        rows: Vec::new(),
        clock_ticks_per_sec: procfs::clock_ticks_per_sec(),
        not_supported: ServerKind::unsupported(&servers, &transports),
    };
    for (kind, wire) in &data.not_supported {
        println!(
            "idle: {} over {}: not supported, skipped",
            kind.label(),
            wire.name()
        );
    }
    let mut failed = 0;
    for (kind, transport) in runs {
        for &n in &counts {
            println!(
                "idle: {} with {} streams ({})",
                kind.label(),
                thousands(n),
                transport.name()
            );
            let phases = Phases {
                rate: args.ramp.rate,
                drain,
                settle,
                window,
                ticks_per_sec: data.clock_ticks_per_sec,
                transport,
                tls: tls_files.as_ref().filter(|_| transport.tls()),
                hook: args.hook,
                webhooks: args.webhooks,
                settings: &args.settings,
                id_prefix: &args.id_prefix,
            };
            match measure(kind, n, &phases, dir.path(), &mut rec) {
                Ok(row) => {
                    println!(
                        "  {} B RSS/stream, {} B slab/pair, CPU {}%",
                        opt(row.rss_per_stream, whole),
                        opt(row.slab_per_pair, whole),
                        fixed(row.cpu_percent, 2)
                    );
                    data.rows.push(row);
                }
                // Interrupted: no result file, nothing more started.
                Err(e) if process::interrupted() => return Err(e),
                Err(e) => {
                    failed += 1;
                    rec.note(format!("{} at {n} streams: no result: {e:#}", kind.label()));
                }
            }
        }
    }
    let outcome = rec.finish(data);
    outcome.publish(&c.out, &render(&outcome))?;
    if failed > 0 {
        bail!("{failed} measurement(s) failed; see the notes");
    }
    Ok(())
}

/// How one measurement runs.
struct Phases<'a> {
    /// Streams opened per second.
    rate: f64,
    /// Longest wait for TIME_WAIT sockets to expire before a baseline.
    drain: Duration,
    /// Quiet time before each memory reading.
    settle: Duration,
    /// CPU window.
    window: Duration,
    /// Unit of `/proc` CPU times.
    ticks_per_sec: u64,
    /// How the streams are opened.
    transport: Wire,
    /// The run's certificates, for a TLS transport.
    tls: Option<&'a TlsFiles>,
    /// switchboard asks `bench-hook` at every admission.
    hook: bool,
    /// switchboard sends its webhooks to `bench-hook`.
    webhooks: bool,
    /// More settings for switchboard.
    settings: &'a [(String, String)],
    /// What switchboard's ids start with.
    id_prefix: &'a str,
}

fn measure(
    kind: ServerKind,
    n: u64,
    p: &Phases<'_>,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<IdleRow> {
    let (rate, settle, window) = (p.rate, p.settle, p.window);
    let switchboard = kind == ServerKind::Switchboard;
    // The application's side, when hooked (its own process: not counted).
    let app = match (p.hook || p.webhooks) && switchboard {
        true => {
            let (proc, _log, command, port) = super::servers::start_listening("bench-hook", &[], dir)?;
            rec.tool(&command);
            Some((proc, port))
        }
        false => None,
    };
    let mut launch = super::servers::Launch::default();
    if switchboard {
        // Leaked: `Launch` names its variables as `&'static str`; a few
        // bytes per measurement of one run.
        launch.env = p
            .settings
            .iter()
            .map(|(k, v)| (&*k.clone().leak(), v.clone()))
            .collect();
    }
    if let (Some((_, port)), true) = (&app, p.hook) {
        launch.env.push((
            "SWITCHBOARD__HOOKS__SUBSCRIBE_URL",
            format!("http://127.0.0.1:{port}/hook"),
        ));
    }
    if let (Some((_, port)), true) = (&app, p.webhooks) {
        launch.env.push((
            "SWITCHBOARD__HOOKS__EVENTS_URL",
            format!("http://127.0.0.1:{port}/events"),
        ));
        launch
            .env
            .push(("SWITCHBOARD__HOOKS__SECRET", "bench-webhook-secret".to_owned()));
    }
    let server = Server::start_full(kind, &launch, p.tls)?;
    rec.tool(&server.command);
    pause(settle)?;
    // From the baseline to the memory reading: open, settle, and a margin.
    let ramp_limit = Duration::from_secs_f64(n as f64 / rate) + RAMP_SLACK;
    let span = Duration::from_secs_f64(n as f64 / rate) + settle + SPAN_MARGIN;
    wait_out_time_wait(n, span, p)?;
    let pids = server.pids();
    let rss_baseline = procfs::rss_bytes(&pids)?;
    let slab_baseline = procfs::slab_bytes()?;
    let tw_timers = procfs::time_wait_left(p.ticks_per_sec)?;
    let baseline_at = Instant::now();

    let spec = FloodSpec {
        url: server.stream_url(&format!(
            "/test/{}i{{n}}",
            if switchboard { p.id_prefix } else { "" }
        )),
        count: n,
        rate,
        // Long enough for every phase; the harness stops it when done.
        duration: ramp_limit + settle + window + RAMP_SLACK,
        msg_rate: 0.0,
        send_url: None,
        lifetime: None,
        stats_url: None,
        transport: p.transport.transport(),
        tls_ca: p.tls.map(|f| f.ca.clone()),
    };
    let label = format!("idle-{}-{}-{n}", kind.label(), p.transport.name());
    let mut flood = Flood::start(&spec, dir, &label)?;
    rec.tool(&flood.command);
    let reached = server.wait_established(n, ramp_limit, || flood.exited())?;
    if !reached.complete {
        bail!(
            "only {} of {n} streams established after {:.1} s; floodtest said:\n{}",
            reached.count,
            reached.after.as_secs_f64(),
            flood.log_tail()
        );
    }
    pause(settle)?;
    // nginx's workers may have changed since the baseline only if one died.
    let pids = server.pids();
    let (established, _) = procfs::established(server.stream_addr_v4())?;
    let rss = procfs::rss_bytes(&pids)?;
    let slab = procfs::slab_bytes()?;
    let between = baseline_at.elapsed();
    let time_wait_expired = tw_timers.iter().filter(|&&l| l <= between).count() as u64;
    if time_wait_expired > tolerated_time_wait(n) {
        rec.note(format!(
            "{} at {n}: {time_wait_expired} TIME_WAIT sockets expired between the slab readings (each \
             frees slab memory): slab/pair reads low",
            kind.label()
        ));
    }
    if established != n {
        rec.note(format!(
            "{} at {n}: {established} established at the memory reading",
            kind.label()
        ));
    }

    let chunks_before = chunks_sent(&server)?;
    let cpu_before = procfs::cpu_ticks(&pids)?;
    let t = Instant::now();
    pause(window)?;
    let cpu_after = procfs::cpu_ticks(&pids)?;
    let window_s = t.elapsed().as_secs_f64();
    let chunks_after = chunks_sent(&server)?;
    let sockets = pids.iter().map(|&p| procfs::socket_fds(p).unwrap_or(0)).collect();

    flood.stop()?;
    if let Some(note) = server.stop() {
        rec.note(format!("idle at {n}: {note}"));
    }

    let secs = |after: u64, before: u64| after.saturating_sub(before) as f64 / p.ticks_per_sec as f64;
    let cpu_sys_s = secs(cpu_after.1, cpu_before.1);
    let cpu_s = secs(cpu_after.0, cpu_before.0) + cpu_sys_s;
    let chunks = chunks_before.zip(chunks_after).map(|(b, a)| a.saturating_sub(b));
    Ok(IdleRow {
        server: kind,
        transport: p.transport,
        streams: n,
        established,
        ramp_s: reached.after.as_secs_f64(),
        tcp_read_ms: reached.max_read.as_secs_f64() * 1000.0,
        rss_baseline,
        rss,
        rss_per_stream: procfs::per_stream(procfs::delta(rss_baseline, rss), established),
        slab_baseline,
        slab,
        slab_per_pair: procfs::per_stream(procfs::delta(slab_baseline, slab), established),
        time_wait_baseline: tw_timers.len() as u64,
        time_wait_expired,
        window_s,
        cpu_s,
        cpu_sys_s,
        cpu_percent: cpu_s / window_s * 100.0,
        chunks,
        us_per_chunk: chunks.and_then(|c| ratio(cpu_s * 1e6, c as f64)),
        sockets,
    })
}

/// TIME_WAIT sockets that may expire during a measurement of `n` streams
/// without mattering: 1% of them, or [`TIME_WAIT_TOLERATED`].
pub(crate) fn tolerated_time_wait(n: u64) -> u64 {
    (n / 100).max(TIME_WAIT_TOLERATED)
}

/// How long to wait so that no more than `tolerated` of the TIME_WAIT
/// sockets (time left on each: `left`) expire within the next `span`:
/// until the last of those expiring within it has gone.
pub(crate) fn time_wait_delay(left: &[Duration], span: Duration, tolerated: u64) -> Option<Duration> {
    let soon: Vec<Duration> = left.iter().copied().filter(|&l| l <= span).collect();
    (soon.len() as u64 > tolerated)
        .then(|| soon.into_iter().max().unwrap_or_default() + Duration::from_millis(500))
}

/// Waits (up to the `drain` limit) until no more than
/// [`tolerated_time_wait`] TIME_WAIT sockets would expire within `span`.
fn wait_out_time_wait(n: u64, span: Duration, p: &Phases<'_>) -> anyhow::Result<()> {
    let started = Instant::now();
    while let Some(left) = p.drain.checked_sub(started.elapsed()) {
        let timers = procfs::time_wait_left(p.ticks_per_sec)?;
        let Some(delay) = time_wait_delay(&timers, span, tolerated_time_wait(n)) else {
            return Ok(());
        };
        println!(
            "  waiting {:.1} s: TIME_WAIT sockets would expire (and free slab) mid-measurement",
            delay.min(left).as_secs_f64()
        );
        pause(delay.min(left))?;
        if delay >= left {
            break;
        }
    }
    Ok(())
}

/// switchboard's `chunks_sent`; `None` for Nchan.
fn chunks_sent(server: &Server) -> anyhow::Result<Option<u64>> {
    if server.kind != ServerKind::Switchboard {
        return Ok(None);
    }
    let stats = client::get_json(server.addr(), "/stats")?;
    Ok(stats["chunks_sent"].as_u64())
}

/// The tables: one row per measurement, then Nchan ÷ switchboard per count.
pub(crate) fn render(o: &Outcome<IdleData>) -> String {
    let mut t = Table::new(&[
        "server",
        "transport",
        ">streams",
        ">established",
        ">RSS idle MiB",
        ">RSS B/stream",
        ">slab B/pair",
        ">CPU % (window)",
        ">chunks",
        ">µs/chunk (user+sys)",
        "sockets/process",
        ">ramp s",
        ">/proc/net/tcp read ms",
    ]);
    for r in &o.data.rows {
        t.row(vec![
            r.server.label().into(),
            r.transport.name().into(),
            thousands(r.streams),
            thousands(r.established),
            fixed(r.rss_baseline as f64 / (1024.0 * 1024.0), 1),
            opt(r.rss_per_stream, whole),
            opt(r.slab_per_pair, whole),
            format!("{} ({:.0} s)", fixed(r.cpu_percent, 2), r.window_s),
            r.chunks.map_or("n/a".into(), thousands),
            opt(r.us_per_chunk, |x| {
                let sys = r.cpu_sys_s / r.cpu_s.max(f64::MIN_POSITIVE) * x;
                format!("{} ({}+{})", fixed(x, 1), fixed(x - sys, 1), fixed(sys, 1))
            }),
            r.sockets
                .iter()
                .map(|s| thousands(*s))
                .collect::<Vec<_>>()
                .join(" / "),
            fixed(r.ramp_s, 1),
            fixed(r.tcp_read_ms, 1),
        ]);
    }
    for (kind, wire) in &o.data.not_supported {
        let mut cells = vec![kind.label().into(), wire.name().into(), "not supported".into()];
        cells.resize(13, String::new());
        t.row(cells);
    }
    let mut out = t.render();
    let mut cmp = Table::new(&[
        ">streams",
        ">switchboard B/stream",
        ">Nchan B/stream",
        ">Nchan ÷ switchboard",
    ]);
    let find = |kind, t, n| {
        o.data
            .rows
            .iter()
            .find(|r| r.server == kind && r.transport == t && r.streams == n)
            .and_then(|r| r.rss_per_stream)
    };
    let mut counts: Vec<u64> = o.data.rows.iter().map(|r| r.streams).collect();
    counts.sort_unstable();
    counts.dedup();
    for n in counts {
        let chunked = Wire::Chunked;
        if let (Some(s), Some(x)) = (
            find(ServerKind::Switchboard, chunked, n),
            find(ServerKind::Nchan, chunked, n),
        ) {
            cmp.row(vec![thousands(n), whole(s), whole(x), times(ratio(x, s))]);
        }
    }
    if !cmp.is_empty() {
        out += "\n";
        out += &cmp.render();
    }
    // switchboard over each transport, against its own chunked streams.
    let mut by_transport = Table::new(&[
        ">streams",
        ">chunked B/stream",
        ">SSE B/stream",
        ">WebSocket B/stream",
        ">SSE ÷ chunked",
        ">WebSocket ÷ chunked",
    ]);
    let mut counts: Vec<u64> = o.data.rows.iter().map(|r| r.streams).collect();
    counts.sort_unstable();
    counts.dedup();
    for n in counts {
        let sb = |t| find(ServerKind::Switchboard, t, n);
        let (c, e, w) = (sb(Wire::Chunked), sb(Wire::Sse), sb(Wire::Ws));
        if e.is_none() && w.is_none() {
            continue;
        }
        let r = |x: Option<f64>| times(x.zip(c).and_then(|(x, c)| ratio(x, c)));
        by_transport.row(vec![
            thousands(n),
            opt(c, whole),
            opt(e, whole),
            opt(w, whole),
            r(e),
            r(w),
        ]);
    }
    if !by_transport.is_empty() {
        out += "\n";
        out += &by_transport.render();
    }
    // Each server's TLS streams against its plain streams of the same
    // transport and count, measured in the same run.
    let mut by_tls = Table::new(&[
        "server",
        "transport",
        ">streams",
        ">plain B/stream",
        ">TLS B/stream",
        ">TLS − plain B/stream",
        ">TLS ÷ plain",
    ]);
    for r in o.data.rows.iter().filter(|r| r.transport.tls()) {
        let plain = find(r.server, r.transport.plain(), r.streams);
        let tls = r.rss_per_stream;
        by_tls.row(vec![
            r.server.label().into(),
            format!("{} vs {}", r.transport.name(), r.transport.plain().name()),
            thousands(r.streams),
            opt(plain, whole),
            opt(tls, whole),
            opt(tls.zip(plain).map(|(t, p)| t - p), whole),
            times(tls.zip(plain).and_then(|(t, p)| ratio(t, p))),
        ]);
    }
    if !by_tls.is_empty() {
        for (kind, wire) in o.data.not_supported.iter().filter(|(_, w)| w.tls()) {
            let mut cells = vec![kind.label().into(), wire.name().into(), "not supported".into()];
            cells.resize(7, String::new());
            by_tls.row(cells);
        }
        out += "\n";
        out += &by_tls.render();
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn row(server: ServerKind, streams: u64, per_stream: f64) -> IdleRow {
        IdleRow {
            server,
            transport: Wire::Chunked,
            streams,
            established: streams,
            ramp_s: 2.0,
            tcp_read_ms: 3.5,
            rss_baseline: 8 << 20,
            rss: (8 << 20) + (per_stream * streams as f64) as u64,
            rss_per_stream: Some(per_stream),
            slab_baseline: 100 << 20,
            slab: 110 << 20,
            slab_per_pair: Some(9000.0),
            time_wait_baseline: 0,
            time_wait_expired: 0,
            window_s: 10.0,
            cpu_s: 0.05,
            cpu_sys_s: 0.04,
            cpu_percent: 0.5,
            chunks: (server == ServerKind::Switchboard).then_some(streams),
            us_per_chunk: (server == ServerKind::Switchboard).then_some(2.63),
            sockets: vec![streams + 2],
        }
    }

    #[test]
    fn time_wait_tolerance() {
        assert_eq!(tolerated_time_wait(1000), 100);
        assert_eq!(tolerated_time_wait(19_000), 190);
        let s = Duration::from_secs;
        // 150 expire within the 8 s span: wait for the last of them.
        let mut left = vec![s(5); 100];
        left.extend(vec![s(7); 50]);
        left.extend(vec![s(40); 10_000]);
        assert_eq!(
            time_wait_delay(&left, s(8), 100),
            Some(Duration::from_millis(7500))
        );
        // Few enough, or all expiring after the span: no wait.
        assert_eq!(time_wait_delay(&left[..100], s(8), 100), None);
        assert_eq!(time_wait_delay(&left[150..], s(8), 100), None);
    }

    #[test]
    fn renders_rows_and_the_comparison() {
        let mut rec = Recorder::new("idle", false);
        rec.tool("x");
        let o = rec.finish(IdleData {
            rows: vec![
                row(ServerKind::Switchboard, 19_000, 1536.4),
                row(ServerKind::Nchan, 19_000, 11_300.0),
                row(ServerKind::Switchboard, 1000, 1700.0),
                IdleRow {
                    transport: Wire::Ws,
                    ..row(ServerKind::Switchboard, 19_000, 1843.7)
                },
            ],
            clock_ticks_per_sec: 100,
            not_supported: Vec::new(),
        });
        let text = render(&o);
        let by_transport = crate::table::cells(&text)
            .into_iter()
            .find(|r| r.len() == 6 && r[3] == "1,844")
            .expect("the by-transport table");
        assert_eq!(
            (
                by_transport[0].as_str(),
                by_transport[1].as_str(),
                by_transport[5].as_str()
            ),
            ("19,000", "1,536", "1.20×"),
            "{text}"
        );
        let rows = crate::table::cells(&text);
        assert_eq!(
            rows[2],
            [
                "switchboard",
                "chunked",
                "19,000",
                "19,000",
                "8.0",
                "1,536",
                "9,000",
                "0.50 (10 s)",
                "19,000",
                "2.6 (0.5+2.1)",
                "19,002",
                "2.0",
                "3.5"
            ]
        );
        assert_eq!(rows[3][8..10], ["n/a", "n/a"]);
        // Only the count both servers ran gets a ratio: 11,300 ÷ 1,536.4;
        // and the WebSocket row its ratio to chunked.
        assert!(text.contains("7.35×"));
        assert_eq!(text.matches('×').count(), 2);
        assert!(!text.contains("TLS"), "no TLS table without TLS rows");
    }

    #[test]
    fn tls_streams_are_set_against_plain_ones() {
        let tls = |server, wire, per_stream| IdleRow {
            transport: wire,
            ..row(server, 19_000, per_stream)
        };
        let o = Recorder::new("idle", false).finish(IdleData {
            rows: vec![
                row(ServerKind::Switchboard, 19_000, 1500.0),
                tls(ServerKind::Switchboard, Wire::Tls, 2100.0),
                tls(ServerKind::Switchboard, Wire::TlsWs, 2400.0),
                row(ServerKind::Nchan, 19_000, 11_000.0),
                tls(ServerKind::Nchan, Wire::Tls, 16_500.0),
            ],
            clock_ticks_per_sec: 100,
            not_supported: vec![(ServerKind::Nchan, Wire::TlsWs)],
        });
        let text = render(&o);
        let rows = crate::table::cells(&text);
        let tls_row = |server: &str, wire: &str| {
            rows.iter()
                .find(|r| r.len() == 7 && r[0] == server && r[1].starts_with(wire))
                .unwrap_or_else(|| panic!("{server} {wire}: {text}"))
                .clone()
        };
        assert_eq!(
            tls_row("switchboard", "tls vs"),
            [
                "switchboard",
                "tls vs chunked",
                "19,000",
                "1,500",
                "2,100",
                "600",
                "1.40×"
            ]
        );
        // No plain WebSocket row to compare with.
        assert_eq!(
            tls_row("switchboard", "tls-ws")[3..],
            ["n/a", "2,400", "n/a", "n/a"]
        );
        assert_eq!(tls_row("Nchan", "tls vs")[4..], ["16,500", "5,500", "1.50×"]);
        assert_eq!(tls_row("Nchan", "tls-ws")[2], "not supported");
        // And in the main table.
        assert!(
            rows.iter()
                .any(|r| r.len() == 13 && r[..3] == ["Nchan", "tls-ws", "not supported"])
        );
        // Result files from before TLS read with nothing unsupported.
        let old: IdleData = serde_json::from_str(r#"{"rows":[],"clock_ticks_per_sec":100}"#).unwrap();
        assert!(old.not_supported.is_empty());
    }
}
