//! `bench broadcast`: one message to every stream. floodtest holds the
//! streams; once the server holds all of them, the harness POSTs one message
//! stamped `B@<µs since the epoch>` (a broadcast probe), and floodtest times
//! its arrival on every stream. The last arrival is the broadcast's time.
//!
//! With `--during-rate R` (on by default), a second floodtest holds
//! [`DURING_STREAMS`] streams of their own ids and sends them R routed
//! messages a second from just before the broadcast until after it: their
//! latency is what a routed message pays while a broadcast is handed out.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::flood::{Flood, FloodSpec, FloodSummary, Transport};
use super::outcome::{Outcome, Recorder};
use super::process::{TempDir, pause};
use super::servers::{Server, ServerKind, Servers};
use super::table::{Table, fixed, opt, ratio, thousands, times, vs_nchan};
use super::{Common, Ramp, client, max_streams};
use switchboard_tools::flood::now_micros;

/// Time allowed for the streams to open beyond count ÷ rate, at least
/// (else half of count ÷ rate): floodtest runs until this limit plus
/// [`ARRIVAL_WAIT`] whenever the streams are open, so it is kept short.
const RAMP_SLACK: Duration = Duration::from_secs(3);

/// Quiet time between the last stream opening and the message.
const SETTLE: Duration = Duration::from_secs(1);

/// floodtest keeps listening at least this long after the ramp limit, for
/// the message to arrive everywhere.
const ARRIVAL_WAIT: Duration = Duration::from_secs(3);

/// Streams of the routed load during the broadcast (taken from `--streams`).
const DURING_STREAMS: u64 = 200;

/// Time for those streams to open before the broadcast is sent.
const DURING_OPEN: Duration = Duration::from_millis(500);

/// How long the routed load goes on after the broadcast is sent.
const DURING_WINDOW: Duration = Duration::from_secs(2);

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
A fresh server per row; floodtest opens the streams (5,000/s). When `/proc/net/tcp` shows every one \
established on the server and 1 s has passed, the harness POSTs one message whose body is `@<µs since the \
epoch>`, stamped just before the request is sent. floodtest records, on every stream, arrival time − stamp. \
**last arrival** = floodtest's latency maximum: the time until the last stream had the message; \
**received** = streams that got it; **server's count** = what the POST answered (switchboard \
`delivered`, Nchan `active subscribers`); **POST answered** = when the publisher's response came back. \
**Routed during**: with `--during-rate R`, 200 of the streams are a second floodtest's, each of its own \
id, sent R routed messages a second (`POST /send/<id>`, stamped) from 0.5 s before the broadcast until \
2 s after it: their p99 and largest latency, and any lost.";

/// `bench broadcast` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Streams [default: the open-file limit less 1,000, 19,000 here; --smoke: 500].
    #[arg(long)]
    pub streams: Option<u64>,
    /// `--rate`: streams opened per second.
    #[command(flatten)]
    pub ramp: Ramp,
    /// `--servers`: the servers to measure.
    #[command(flatten)]
    pub servers: Servers,
    /// How switchboard's streams are opened: floodtest's `--transport`
    /// (chunked, sse, ws); a peer stays on chunked.
    #[arg(long, value_enum, default_value_t = Transport::Chunked)]
    pub transport: Transport,
    /// Routed messages a second to other streams while the broadcast is
    /// handed out (0: none) [default: 1000; --smoke: 100].
    #[arg(long)]
    pub during_rate: Option<f64>,
    /// Leave out the floor's row (`bench-floor`: one `write(2)` per stream
    /// from a thread per core and nothing else, this box's least time for
    /// a broadcast).
    #[arg(long)]
    pub no_floor: bool,
}

/// One way of reaching every stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Case {
    /// Which server.
    server: ServerKind,
    /// Stream path template.
    stream_path: &'static str,
    /// Where the message is POSTed.
    post_path: &'static str,
    /// Row name.
    label: &'static str,
}

/// The rows, in order.
const CASES: [Case; 4] = [
    Case {
        server: ServerKind::Switchboard,
        stream_path: "/test/b{n}",
        post_path: "/broadcast",
        label: "switchboard `/broadcast` (distinct ids)",
    },
    Case {
        server: ServerKind::Switchboard,
        stream_path: "/test/all",
        post_path: "/send/all",
        label: "switchboard `/send/all` (one id)",
    },
    Case {
        server: ServerKind::Nchan,
        stream_path: "/test/all",
        post_path: "/send/all",
        label: "Nchan `/send/all` (one channel)",
    },
    Case {
        server: ServerKind::Floor,
        stream_path: "/test/all",
        post_path: "/send/all",
        label: "the floor `/send/all`: one `write(2)` per stream (`bench-floor`)",
    },
];

/// What `bench broadcast` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct BroadcastData {
    /// One row per case.
    pub rows: Vec<BroadcastRow>,
}

/// One case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct BroadcastRow {
    /// Row name.
    pub case: String,
    /// Which server.
    pub server: ServerKind,
    /// Streams asked for.
    pub streams: u64,
    /// Established on the server when the message was sent.
    pub established: u64,
    /// The POST's status.
    pub post_status: u16,
    /// Time until the POST's answer, ms.
    pub post_ms: f64,
    /// Streams the server says it handed the message to.
    pub server_count: Option<u64>,
    /// Streams the message arrived on.
    pub received: u64,
    /// Stamp → last arrival, ms.
    pub last_ms: Option<f64>,
    /// Stamp → median arrival, ms.
    pub p50_ms: Option<f64>,
    /// floodtest's summary.
    pub flood: FloodSummary,
    /// The routed load during the broadcast, if there was one.
    #[serde(default)]
    pub during: Option<During>,
}

/// Routed messages sent while the broadcast was handed out.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct During {
    /// Messages a second.
    pub rate: f64,
    /// Accepted, arrived, lost.
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    /// Send → arrival, ms.
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Runs `bench broadcast`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let streams = c.pick(args.streams, max_streams(), 500);
    let (servers, rate) = (args.servers.chosen(), args.ramp.rate);
    super::check_streams(streams, rate)?;
    let during = c.pick(args.during_rate, 1000.0, 100.0);
    if during < 0.0 || !during.is_finite() {
        bail!("--during-rate must be 0 or more");
    }
    if during > 0.0 && streams <= DURING_STREAMS {
        bail!("--streams must be more than {DURING_STREAMS} with a --during-rate");
    }
    let dir = TempDir::new("broadcast")?;
    let mut rec = Recorder::new("broadcast", c.smoke);
    let mut rows = Vec::new();
    let floor = !args.no_floor;
    for case in CASES
        .iter()
        .filter(|k| servers.contains(&k.server) || (floor && k.server == ServerKind::Floor))
    {
        println!("broadcast: {} to {} streams", case.label, thousands(streams));
        let row = measure(case, streams, rate, during, args.transport, dir.path(), &mut rec)?;
        println!(
            "  received by {} streams, last after {} ms",
            thousands(row.received),
            opt(row.last_ms, |x| fixed(x, 1))
        );
        rows.push(row);
    }
    let outcome = rec.finish(BroadcastData { rows });
    outcome.publish(&c.out, &render(&outcome))
}

fn measure(
    case: &Case,
    streams: u64,
    rate: f64,
    during_rate: f64,
    transport: Transport,
    dir: &Path,
    rec: &mut Recorder,
) -> anyhow::Result<BroadcastRow> {
    let server = Server::start(case.server)?;
    rec.tool(&server.command);
    let (held, opening) = match during_rate > 0.0 {
        true => (streams - DURING_STREAMS, DURING_OPEN),
        false => (streams, Duration::ZERO),
    };
    // The floor routes nothing: it gets the same broadcast to as many
    // streams, with no routed load beside it.
    let during_rate = if case.server == ServerKind::Floor {
        0.0
    } else {
        during_rate
    };
    let ramp = Duration::from_secs_f64(held as f64 / rate);
    let ramp_limit = ramp + (ramp / 2).max(RAMP_SLACK);
    let transport = if case.server == ServerKind::Switchboard {
        transport
    } else {
        Transport::Chunked
    };
    let spec = FloodSpec {
        url: server.url(case.stream_path),
        count: held,
        rate,
        duration: ramp_limit + opening + ARRIVAL_WAIT,
        msg_rate: 0.0,
        send_url: None,
        lifetime: None,
        stats_url: None,
        transport,
        tls_ca: None,
    };
    let label = format!(
        "broadcast-{}-{}",
        case.server.label(),
        case.post_path.replace('/', "_")
    );
    let mut flood = Flood::start(&spec, dir, &label)?;
    rec.tool(&flood.command);
    let reached = server.wait_established(held, ramp_limit, || flood.exited())?;
    if !reached.complete {
        bail!(
            "{}: only {} of {held} streams established; floodtest said:\n{}",
            case.label,
            reached.count,
            flood.log_tail()
        );
    }
    pause(SETTLE)?;
    let routed = if during_rate > 0.0 {
        let spec = FloodSpec {
            url: server.url("/test/r{n}"),
            count: DURING_STREAMS,
            rate,
            duration: DURING_OPEN + DURING_WINDOW,
            msg_rate: during_rate,
            send_url: Some(server.url("/send/{id}")),
            lifetime: None,
            stats_url: None,
            transport,
            tls_ca: None,
        };
        let routed = Flood::start(&spec, dir, &format!("{label}-during"))?;
        rec.tool(&routed.command);
        pause(DURING_OPEN)?;
        Some(routed)
    } else {
        None
    };
    let (established, _) = super::procfs::established(server.addr_v4())?;
    let body = format!("B@{}", now_micros());
    let t = Instant::now();
    let reply = client::request(server.addr(), "POST", case.post_path, &body)?;
    let post_ms = t.elapsed().as_secs_f64() * 1000.0;
    rec.tool(&format!(
        "(the harness) POST {} with body B@<µs since the epoch>",
        server.url(case.post_path)
    ));
    let summary = flood.finish()?;
    let during = match routed {
        Some(routed) => {
            let s = routed.finish()?;
            Some(During {
                rate: during_rate,
                sent: s.messages.sent,
                received: s.messages.received,
                lost: s.messages.lost,
                p99_ms: s.latency_ms.p99,
                max_ms: s.latency_ms.max,
            })
        }
        None => None,
    };
    if let Some(note) = server.stop() {
        rec.note(note);
    }
    if !(200..300).contains(&reply.status) {
        rec.note(format!(
            "{}: the POST answered {}: {}",
            case.label,
            reply.status,
            reply.body.trim()
        ));
    }
    Ok(BroadcastRow {
        case: case.label.into(),
        server: case.server,
        streams,
        established,
        post_status: reply.status,
        post_ms,
        server_count: server_count(case.server, &reply.body),
        received: summary.broadcast.as_ref().map_or(0, |b| b.received),
        last_ms: summary.broadcast.as_ref().and_then(|b| b.latency_ms.max),
        p50_ms: summary.broadcast.as_ref().and_then(|b| b.latency_ms.p50),
        flood: summary,
        during,
    })
}

/// How many streams the server says it handed the message to:
/// switchboard's `{"delivered": n}`, Nchan's `active subscribers: n` line.
pub(crate) fn server_count(server: ServerKind, body: &str) -> Option<u64> {
    match server {
        ServerKind::Switchboard | ServerKind::Floor => {
            serde_json::from_str::<serde_json::Value>(body).ok()?["delivered"].as_u64()
        }
        ServerKind::Nchan => body
            .lines()
            .find_map(|l| l.trim().strip_prefix("active subscribers:"))
            .and_then(|n| n.trim().parse().ok()),
    }
}

/// The table: one row per case, then the last-arrival ratio.
pub(crate) fn render(o: &Outcome<BroadcastData>) -> String {
    let mut t = Table::new(&[
        "case",
        ">streams",
        ">established",
        ">server's count",
        ">received",
        ">last arrival ms",
        ">median arrival ms",
        ">POST answered ms",
        ">routed during: p99 / max ms",
        ">routed during: sent / lost",
    ]);
    for r in &o.data.rows {
        t.row(vec![
            r.case.clone(),
            thousands(r.streams),
            thousands(r.established),
            r.server_count.map_or("n/a".into(), thousands),
            thousands(r.received),
            opt(r.last_ms, |x| fixed(x, 1)),
            opt(r.p50_ms, |x| fixed(x, 1)),
            fixed(r.post_ms, 1),
            r.during.as_ref().map_or("—".into(), |d| {
                format!(
                    "{} / {}",
                    opt(d.p99_ms, |x| fixed(x, 1)),
                    opt(d.max_ms, |x| fixed(x, 1))
                )
            }),
            r.during.as_ref().map_or("—".into(), |d| {
                format!("{} / {}", thousands(d.sent), thousands(d.lost))
            }),
        ]);
    }
    let mut out = t.render();
    out += &vs_nchan("Last arrival, `/send/all`", |k| {
        o.data
            .rows
            .iter()
            .find(|r| r.server == k && r.case.contains("/send/all"))
            .and_then(|r| r.last_ms)
    });
    out += &vs_nchan("Routed p99 during the broadcast, `/send/all`", |k| {
        o.data
            .rows
            .iter()
            .find(|r| r.server == k && r.case.contains("/send/all"))
            .and_then(|r| r.during.as_ref()?.p99_ms)
    });
    out += &vs_floor(&o.data.rows);
    out
}

/// Every server's `/send/all` last arrival against the floor's, and the
/// floor's against Nchan's (the least a ratio to Nchan can be on this box).
fn vs_floor(rows: &[BroadcastRow]) -> String {
    let last = |k| {
        rows.iter()
            .find(|r| r.server == k && r.case.contains("/send/all"))
            .and_then(|r| r.last_ms)
    };
    let Some(floor) = last(ServerKind::Floor) else {
        return String::new();
    };
    let mut parts = Vec::new();
    for k in [ServerKind::Switchboard, ServerKind::Nchan] {
        if let Some(x) = last(k) {
            parts.push(format!("{} ÷ the floor = {}", k.label(), times(ratio(x, floor))));
        }
    }
    if let Some(n) = last(ServerKind::Nchan) {
        parts.push(format!("the floor ÷ Nchan = {}", times(ratio(floor, n))));
    }
    format!("\nLast arrival, `/send/all`: {}.\n", parts.join("; "))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn row(case: usize, streams: u64, received: u64, last_ms: f64) -> BroadcastRow {
        BroadcastRow {
            case: CASES[case].label.into(),
            server: CASES[case].server,
            streams,
            established: streams,
            post_status: 200,
            post_ms: 12.5,
            server_count: Some(streams),
            received,
            last_ms: Some(last_ms),
            p50_ms: Some(last_ms / 2.0),
            flood: FloodSummary::default(),
            during: None,
        }
    }

    #[test]
    fn reads_what_servers_answer() {
        assert_eq!(
            server_count(ServerKind::Switchboard, r#"{"delivered":19000}"#),
            Some(19_000)
        );
        assert_eq!(server_count(ServerKind::Switchboard, "oops"), None);
        let nchan = "queued messages: 1\nlast requested: -1 sec. ago\nactive subscribers: 19000\n\
                     last message id: 1796022308:0\n";
        assert_eq!(server_count(ServerKind::Nchan, nchan), Some(19_000));
        assert_eq!(server_count(ServerKind::Nchan, ""), None);
    }

    #[test]
    fn renders_cases() {
        let o = Recorder::new("broadcast", false).finish(BroadcastData {
            rows: vec![
                row(0, 19_000, 19_000, 80.0),
                row(1, 19_000, 19_000, 60.0),
                row(2, 19_000, 18_990, 120.0),
            ],
        });
        let text = render(&o);
        assert_eq!(text.lines().filter(|l| l.starts_with("| switchboard")).count(), 2);
        assert!(text.contains("18,990"));
        assert!(text.contains("switchboard ÷ Nchan = 0.50×"));
        assert!(!text.contains("floor"), "no floor row, no floor ratio");
    }

    #[test]
    fn the_floor_row_gives_ratios_to_the_floor() {
        let o = Recorder::new("broadcast", false).finish(BroadcastData {
            rows: vec![
                row(1, 19_000, 19_000, 300.0),
                row(2, 19_000, 19_000, 400.0),
                row(3, 19_000, 19_000, 200.0),
            ],
        });
        let text = render(&o);
        assert!(text.contains("switchboard ÷ the floor = 1.50×"), "{text}");
        assert!(text.contains("Nchan ÷ the floor = 2.00×"), "{text}");
        assert!(text.contains("the floor ÷ Nchan = 0.50×"), "{text}");
    }
}
