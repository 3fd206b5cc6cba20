//! `bench connect`: how fast streams get established when many clients
//! connect at once. floodtest starts them all in its first 10 ms tick; the
//! figure is streams established per second until all are open.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::flood::{Flood, FloodSpec, FloodSummary, Transport, errors_text};
use super::outcome::{Outcome, Recorder};
use super::process::{TempDir, pause};
use super::servers::{Server, ServerKind, Servers};
use super::table::{Table, fixed, opt, ratio, thousands, vs_nchan, whole};
use super::{Common, max_streams, procfs};
use switchboard_tools::cli::parse_duration;

/// The harness counts the server's connections this long before floodtest ends.
const CHECK_BEFORE_END: Duration = Duration::from_secs(2);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
A fresh server; floodtest with `--rate 1000000` (every connection is started in its first 10 ms tick; \
the kernel's listen backlog, 4,096 for both servers, and the server's accept loop set the pace). \
**connects/s** is floodtest's `connect_rate`: streams established (response head received) ÷ seconds \
from its start to the last one established; **time to last** = established ÷ connects/s. The harness \
does not poll while the streams connect: one `/proc/net/tcp` read takes over a second of CPU at this \
scale while connections pour in, and would take it from the servers under test. It counts the server's \
established connections once, 2 s before floodtest ends (**held at server**).";

/// `bench connect` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Streams [default: the open-file limit less 1,000, 19,000 here; --smoke: 500].
    #[arg(long)]
    pub streams: Option<u64>,
    /// floodtest's --rate: streams started per second.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub rate: f64,
    /// floodtest's whole run (it must outlast the connecting)
    /// [default: 20s; --smoke: 4s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// `--servers`: the servers to measure.
    #[command(flatten)]
    pub servers: Servers,
    /// How switchboard's streams are opened: floodtest's `--transport`
    /// (chunked, sse, ws); a peer stays on chunked.
    #[arg(long, value_enum, default_value_t = Transport::Chunked)]
    pub transport: Transport,
    /// Also each server with a subscribe hook answered by `bench-hook`
    /// (actix-web, one worker, keep-alive), right after it without:
    /// switchboard's `hooks.subscribe_url` (with `hooks.max_in_flight` and
    /// `hooks.timeout_ms` raised so that the burst waits its turn instead of
    /// being refused), Nchan's `nchan_authorize_request`. Every stream's
    /// admission asks it.
    #[arg(long)]
    pub hook: bool,
}

/// What `bench connect` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ConnectData {
    /// One row per server.
    pub rows: Vec<ConnectRow>,
}

/// One server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ConnectRow {
    /// Which server.
    pub server: ServerKind,
    /// Streams asked for.
    pub streams: u64,
    /// Established connections on the server's address near the end of the
    /// run (one `/proc/net/tcp` read, after the connecting was over).
    pub held: u64,
    /// How long that read took, ms.
    pub tcp_read_ms: f64,
    /// floodtest's summary (connect_rate, errors).
    pub flood: FloodSummary,
    /// With a subscribe hook: its calls and times (None: no hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookFigures>,
}

/// A subscribe hook's figures, from switchboard's `/metrics` after the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct HookFigures {
    /// Calls made (`switchboard_hook_calls_total`).
    pub calls: u64,
    /// Calls that failed.
    pub failures: u64,
    /// The median call's time, as the upper bound of its
    /// `switchboard_hook_seconds` bucket, ms.
    pub p50_ms: f64,
    /// The 99th percentile's, ms (the same way).
    pub p99_ms: f64,
}

/// Runs `bench connect`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let streams = c.pick(args.streams, max_streams(), 500);
    let duration = c.pick(args.duration, Duration::from_secs(20), Duration::from_secs(4));
    let servers = args.servers.chosen();
    super::check_streams(streams, args.rate)?;
    let dir = TempDir::new("connect")?;
    let mut rec = Recorder::new("connect", c.smoke);
    let mut rows = Vec::new();
    let runs = servers.iter().flat_map(|&kind| {
        let hooked = kind != ServerKind::Floor && args.hook;
        [(kind, false)].into_iter().chain(hooked.then_some((kind, true)))
    });
    for (kind, hook) in runs {
        let label = label(kind, hook);
        println!("connect: {} streams to {label}", thousands(streams));
        let transport = if kind == ServerKind::Switchboard {
            args.transport
        } else {
            Transport::Chunked
        };
        let row = measure(
            kind,
            hook,
            streams,
            args.rate,
            duration,
            transport,
            dir.path(),
            &mut rec,
        )?;
        println!(
            "  {} connects/s, {} held at the server",
            whole(row.flood.connect_rate),
            thousands(row.held)
        );
        if let Some(h) = &row.hook {
            println!(
                "  hook: {} calls, {} failed, p50 <= {} ms, p99 <= {} ms",
                thousands(h.calls),
                thousands(h.failures),
                fixed(h.p50_ms, 2),
                fixed(h.p99_ms, 2)
            );
        }
        rows.push(row);
    }
    let outcome = rec.finish(ConnectData { rows });
    outcome.publish(&c.out, &render(&outcome))
}

/// A row's name.
fn label(kind: ServerKind, hook: bool) -> String {
    if hook {
        format!("{} + subscribe hook", kind.label())
    } else {
        kind.label().to_owned()
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    kind: ServerKind,
    hook: bool,
    streams: u64,
    rate: f64,
    duration: Duration,
    transport: Transport,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<ConnectRow> {
    // The application's side, when hooked: started first, on its own port.
    let app = if hook {
        let (proc, _log, command, port) = super::servers::start_listening("bench-hook", &[], dir)?;
        rec.tool(&command);
        Some((proc, port))
    } else {
        None
    };
    let server = match &app {
        None => Server::start(kind)?,
        Some((_, port)) => Server::start_launched(
            kind,
            &super::servers::Launch {
                env: vec![
                    (
                        "SWITCHBOARD__HOOKS__SUBSCRIBE_URL",
                        format!("http://127.0.0.1:{port}/hook"),
                    ),
                    ("SWITCHBOARD__HOOKS__MAX_IN_FLIGHT", "100000".to_owned()),
                    ("SWITCHBOARD__HOOKS__TIMEOUT_MS", "30000".to_owned()),
                ],
                hook: Some(*port),
                ..Default::default()
            },
        )?,
    };
    rec.tool(&server.command);
    let spec = FloodSpec {
        url: server.url("/test/c{n}"),
        count: streams,
        rate,
        duration,
        msg_rate: 0.0,
        send_url: None,
        lifetime: None,
        stats_url: None,
        transport,
        tls_ca: None,
    };
    let mut flood = Flood::start(&spec, dir, &format!("connect-{}", kind.label()))?;
    rec.tool(&flood.command);
    let check_at = flood.started + duration.saturating_sub(CHECK_BEFORE_END);
    while Instant::now() < check_at && !flood.exited() {
        pause(Duration::from_millis(100))?;
    }
    let (held, read) = procfs::established(server.addr_v4())?;
    let summary = flood.finish()?;
    let hook = match app {
        Some(_) if kind != ServerKind::Switchboard => Some(HookFigures::default()),
        Some(_) => Some(hook_figures(
            &super::client::request(server.addr(), "GET", "/metrics", "")?.body,
        )),
        None => None,
    };
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    if held < streams {
        rec.note(format!(
            "{}: the server held {held} of {streams} connections near the end",
            kind.label()
        ));
    }
    Ok(ConnectRow {
        server: kind,
        streams,
        held,
        tcp_read_ms: read.as_secs_f64() * 1000.0,
        flood: summary,
        hook,
    })
}

/// The hook's figures in switchboard's `/metrics` text.
fn hook_figures(metrics: &str) -> HookFigures {
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    // Cumulative buckets: (upper bound in s, count up to it).
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("switchboard_hook_seconds_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    let quantile = |q: f64| {
        buckets
            .iter()
            .find(|(_, n)| total > 0.0 && *n >= q * total)
            .map_or(0.0, |(le, _)| le * 1000.0)
    };
    HookFigures {
        calls: value("switchboard_hook_calls_total") as u64,
        failures: value("switchboard_hook_failures_total") as u64,
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
    }
}

/// The table: one row per server, then the ratio of connect rates.
pub(crate) fn render(o: &Outcome<ConnectData>) -> String {
    let mut t = Table::new(&[
        "server",
        ">streams",
        ">established",
        "errors",
        ">connects/s",
        ">time to last s",
        ">held at server",
    ]);
    for r in &o.data.rows {
        t.row(vec![
            label(r.server, r.hook.is_some()),
            thousands(r.streams),
            thousands(r.flood.established),
            errors_text(&r.flood.errors),
            whole(r.flood.connect_rate),
            opt(ratio(r.flood.established as f64, r.flood.connect_rate), |x| {
                fixed(x, 2)
            }),
            thousands(r.held),
        ]);
    }
    let mut out = t.render();
    out += &vs_nchan("connects/s", |k| {
        o.data
            .rows
            .iter()
            .find(|r| r.server == k && r.hook.is_none())
            .map(|r| r.flood.connect_rate)
    });
    for r in o.data.rows.iter().filter(|r| r.hook.is_some()) {
        let plain = o
            .data
            .rows
            .iter()
            .find(|p| p.hook.is_none() && p.server == r.server);
        out += &format!(
            "\n{}: connects/s with the hook ÷ without = {}.",
            label(r.server, true),
            plain.map_or_else(
                || "n/a".to_owned(),
                |p| crate::table::times(ratio(r.flood.connect_rate, p.flood.connect_rate))
            ),
        );
        if let Some(h) = r.hook.as_ref().filter(|_| r.server == ServerKind::Switchboard) {
            out += &format!(
                " {} calls ({} failed), p50 ≤ {} ms, p99 ≤ {} ms (`switchboard_hook_seconds`' buckets: \
                 the time the hook adds to an admission).",
                thousands(h.calls),
                thousands(h.failures),
                fixed(h.p50_ms, 2),
                fixed(h.p99_ms, 2),
            );
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hooks_quantiles_are_its_buckets_upper_bounds() {
        let metrics = "switchboard_hook_calls_total 100\n\
            switchboard_hook_failures_total 2\n\
            switchboard_hook_seconds_bucket{le=\"0.001\"} 10\n\
            switchboard_hook_seconds_bucket{le=\"0.0025\"} 60\n\
            switchboard_hook_seconds_bucket{le=\"0.01\"} 98\n\
            switchboard_hook_seconds_bucket{le=\"0.1\"} 100\n\
            switchboard_hook_seconds_bucket{le=\"+Inf\"} 100\n";
        let h = hook_figures(metrics);
        assert_eq!((h.calls, h.failures), (100, 2));
        assert_eq!((h.p50_ms, h.p99_ms), (2.5, 100.0));
        assert_eq!(hook_figures(""), HookFigures::default());
    }

    #[test]
    fn renders_rows_and_ratio() {
        let row = |server, rate: f64| ConnectRow {
            server,
            streams: 19_000,
            held: 19_000,
            tcp_read_ms: 20.0,
            flood: FloodSummary {
                established: 19_000,
                connect_rate: rate,
                ..FloodSummary::default()
            },
            hook: None,
        };
        let o = Recorder::new("connect", false).finish(ConnectData {
            rows: vec![
                row(ServerKind::Switchboard, 9500.0),
                row(ServerKind::Nchan, 19_000.0),
            ],
        });
        let text = render(&o);
        let rows = crate::table::cells(&text);
        assert_eq!(
            rows[2],
            [
                "switchboard",
                "19,000",
                "19,000",
                "none",
                "9,500",
                "2.00",
                "19,000"
            ]
        );
        assert!(text.contains("switchboard ÷ Nchan = 0.50×"));
    }
}
