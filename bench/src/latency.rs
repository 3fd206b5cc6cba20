//! `bench latency`: routed-message latency with many streams open. floodtest
//! holds the streams, POSTs stamped messages to random ones of them at a
//! fixed rate (over keep-alive connections) and times each from its stamp to
//! its arrival on the stream.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::flood::{Flood, FloodSpec, FloodSummary, Wire, errors_text};
use super::outcome::{Outcome, Recorder};
use super::process::TempDir;
use super::servers::{Matrix, Server, ServerKind};
use super::table::{Table, fixed, opt, thousands, vs_nchan};
use super::tls::{self, TlsFiles};
use super::{Common, Ramp, max_streams};
use switchboard_tools::cli::parse_duration;

/// Time allowed for the streams to open beyond count ÷ rate before sending
/// starts (floodtest starts sending once every stream is open).
const CONNECT_SLACK: Duration = Duration::from_secs(2);

/// floodtest stops sending this long before its end so the last messages arrive.
const DRAIN: Duration = Duration::from_secs(1);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
A fresh server; floodtest opens the streams (5,000/s, distinct ids) and, once they are all open, POSTs \
messages to random streams it holds at the given rate over 4 keep-alive connections (switchboard: \
`/send/{id}`; Nchan: its publisher, `--send-url .../send/{id}`). Each message body is `@<send time, µs since \
the epoch>`; the stream that receives it records arrival − send time (HDR histogram). **p50/p99/max** are \
over every message that arrived; **lost** = accepted by the server − arrived. switchboard also ticks every \
stream every 10 s during the run, as in production. The TLS transports (`tls`, `tls-sse`, `tls-ws`) \
hold the streams and POST the messages over https:// to the server's TLS port (as in `bench idle`).";

/// `bench latency` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Streams held [default: 10000; --smoke: 300].
    #[arg(long)]
    pub streams: Option<u64>,
    /// Messages per second [default: 1000; --smoke: 100].
    #[arg(long)]
    pub msg_rate: Option<f64>,
    /// How long messages are sent [default: 30s; --smoke: 3s].
    #[arg(long, value_parser = parse_duration)]
    pub send_for: Option<Duration>,
    /// `--rate`: streams opened per second.
    #[command(flatten)]
    pub ramp: Ramp,
    /// Servers and transports.
    #[command(flatten)]
    pub matrix: Matrix,
}

/// What `bench latency` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct LatencyData {
    /// One row per server.
    pub rows: Vec<LatencyRow>,
}

/// One server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct LatencyRow {
    /// Which server.
    pub server: ServerKind,
    /// How the streams were opened.
    #[serde(default)]
    pub transport: Wire,
    /// Streams asked for.
    pub streams: u64,
    /// Messages per second asked for.
    pub msg_rate: f64,
    /// Seconds from floodtest's start until the server held every stream
    /// (None: it never did).
    pub all_open_s: Option<f64>,
    /// floodtest's summary.
    pub flood: FloodSummary,
}

/// Runs `bench latency`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let streams = c.pick(args.streams, 10_000, 300);
    let msg_rate = c.pick(args.msg_rate, 1000.0, 100.0);
    let send_for = c.pick(args.send_for, Duration::from_secs(30), Duration::from_secs(3));
    let servers = args.matrix.servers.chosen();
    let max = max_streams();
    if !(2..=max).contains(&streams) {
        bail!("--streams must be between 2 and {max} (the open-file limit less a margin)");
    }
    super::check_positive("--msg-rate", msg_rate)?;
    super::check_positive("--rate", args.ramp.rate)?;
    let dir = TempDir::new("latency")?;
    let mut rec = Recorder::new("latency", c.smoke);
    let mut rows = Vec::new();
    let transports = args.matrix.transports.clone().unwrap_or(vec![Wire::Chunked]);
    let runs = ServerKind::runs(&servers, &transports);
    let tls_files = if runs.iter().any(|(_, w)| w.tls()) {
        Some(tls::make_certificates(dir.path())?)
    } else {
        None
    };
    for (kind, wire) in ServerKind::unsupported(&servers, &transports) {
        rec.note(format!(
            "{} over {}: not supported, not measured",
            kind.label(),
            wire.name()
        ));
    }
    for (kind, transport) in runs {
        println!(
            "latency: {} with {} streams ({}), {msg_rate} messages/s for {send_for:?}",
            kind.label(),
            thousands(streams),
            transport.name()
        );
        let load = Load {
            streams,
            msg_rate,
            rate: args.ramp.rate,
            send_for,
            transport,
        };
        let certs = tls_files.as_ref().filter(|_| transport.tls());
        let row = measure(kind, &load, certs, dir.path(), &mut rec)?;
        println!(
            "  sent {} received {} p99 {} ms",
            row.flood.messages.sent,
            row.flood.messages.received,
            opt(row.flood.latency_ms.p99, |x| fixed(x, 2))
        );
        rows.push(row);
    }
    let outcome = rec.finish(LatencyData { rows });
    outcome.publish(&c.out, &render(&outcome))
}

/// What one measurement puts on a server.
struct Load {
    streams: u64,
    msg_rate: f64,
    /// Streams opened per second.
    rate: f64,
    send_for: Duration,
    transport: Wire,
}

fn measure(
    kind: ServerKind,
    load: &Load,
    tls: Option<&TlsFiles>,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<LatencyRow> {
    let Load {
        streams,
        msg_rate,
        rate,
        send_for,
        transport,
    } = *load;
    let server = Server::start_tls(kind, tls)?;
    rec.tool(&server.command);
    let ramp = Duration::from_secs_f64(streams as f64 / rate) + CONNECT_SLACK;
    let spec = FloodSpec {
        url: server.stream_url("/test/l{n}"),
        count: streams,
        rate,
        duration: ramp + send_for + DRAIN,
        msg_rate,
        send_url: Some(server.stream_url("/send/{id}")),
        lifetime: None,
        stats_url: None,
        transport: transport.transport(),
        tls_ca: tls.map(|f| f.ca.clone()),
    };
    let label = format!("latency-{}-{}", kind.label(), transport.name());
    let mut flood = Flood::start(&spec, dir, &label)?;
    rec.tool(&flood.command);
    let reached = server.wait_established(streams, spec.duration, || flood.exited())?;
    let all_open_s = reached.complete.then_some(reached.after.as_secs_f64());
    if !reached.complete {
        rec.note(format!(
            "{}: only {} of {streams} streams were open at once",
            kind.label(),
            reached.count
        ));
    }
    let summary = flood.finish()?;
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    Ok(LatencyRow {
        server: kind,
        transport,
        streams,
        msg_rate,
        all_open_s,
        flood: summary,
    })
}

/// The table: one row per server, then the p99 ratio.
pub(crate) fn render(o: &Outcome<LatencyData>) -> String {
    let mut t = Table::new(&[
        "server",
        "transport",
        ">streams",
        ">msg/s",
        ">sent",
        ">received",
        ">lost",
        ">send errors",
        ">p50 ms",
        ">p90 ms",
        ">p99 ms",
        ">p99.9 ms",
        ">max ms",
        "stream errors",
    ]);
    for r in &o.data.rows {
        let f = &r.flood;
        let ms = |x: Option<f64>| opt(x, |v| fixed(v, 2));
        t.row(vec![
            r.server.label().into(),
            r.transport.name().into(),
            thousands(r.streams),
            thousands(r.msg_rate.round() as u64),
            thousands(f.messages.sent),
            thousands(f.messages.received),
            thousands(f.messages.lost),
            thousands(f.messages.send_errors),
            ms(f.latency_ms.p50),
            ms(f.latency_ms.p90),
            ms(f.latency_ms.p99),
            ms(f.latency_ms.p999),
            ms(f.latency_ms.max),
            errors_text(&f.errors),
        ]);
    }
    let mut out = t.render();
    out += &vs_nchan("p99", |k| {
        o.data
            .rows
            .iter()
            .find(|r| r.server == k && r.transport == Wire::Chunked)
            .and_then(|r| r.flood.latency_ms.p99)
    });
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::flood::{LatencyMs, Messages};

    pub(crate) fn row(server: ServerKind, p99: f64) -> LatencyRow {
        LatencyRow {
            server,
            transport: Wire::Chunked,
            streams: 10_000,
            msg_rate: 1000.0,
            all_open_s: Some(2.1),
            flood: FloodSummary {
                established: 10_000,
                active: 10_000,
                messages: Messages {
                    sent: 30_000,
                    received: 29_990,
                    lost: 10,
                    send_errors: 0,
                },
                latency_ms: LatencyMs {
                    p50: Some(0.4),
                    p90: Some(0.9),
                    p99: Some(p99),
                    p999: Some(p99 * 2.0),
                    max: Some(p99 * 3.0),
                },
                ..FloodSummary::default()
            },
        }
    }

    #[test]
    fn renders_rows_and_ratio() {
        let o = Recorder::new("latency", false).finish(LatencyData {
            rows: vec![row(ServerKind::Switchboard, 2.0), row(ServerKind::Nchan, 4.0)],
        });
        let text = render(&o);
        let rows = crate::table::cells(&text);
        assert_eq!(
            rows[2],
            [
                "switchboard",
                "chunked",
                "10,000",
                "1,000",
                "30,000",
                "29,990",
                "10",
                "0",
                "0.40",
                "0.90",
                "2.00",
                "4.00",
                "6.00",
                "none"
            ]
        );
        assert!(text.contains("switchboard ÷ Nchan = 0.50×"));
    }
}
