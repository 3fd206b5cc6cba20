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
    for kind in servers {
        println!("connect: {} streams to {}", thousands(streams), kind.label());
        let transport = if kind == ServerKind::Switchboard {
            args.transport
        } else {
            Transport::Chunked
        };
        let row = measure(
            kind,
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
        rows.push(row);
    }
    let outcome = rec.finish(ConnectData { rows });
    outcome.publish(&c.out, &render(&outcome))
}

fn measure(
    kind: ServerKind,
    streams: u64,
    rate: f64,
    duration: Duration,
    transport: Transport,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<ConnectRow> {
    let server = Server::start(kind)?;
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
    })
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
            r.server.label().into(),
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
            .find(|r| r.server == k)
            .map(|r| r.flood.connect_rate)
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
