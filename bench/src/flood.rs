//! floodtest as the streams' client, run the same way against every server:
//! no server statistics (`--stats-url none`), connections spread over four
//! source addresses, the summary written as JSON and read back. [`Wire`]:
//! how `bench idle` and `bench latency` carry their streams, floodtest's
//! transport over plain TCP or inside TLS.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::process::{self, Spawned, display_path, shell_line};
use super::servers::sibling;
pub(crate) use switchboard_tools::flood::Transport;

/// Source addresses floodtest spreads its connections over: Linux's connect()
/// slows to a crawl past ~14k connections between one pair of addresses.
pub(crate) const SOURCE_IPS: &str = "127.0.0.2-127.0.0.5";

/// How long floodtest may run past its `--duration` before it is stopped.
const GRACE: Duration = Duration::from_secs(30);

/// How a benchmark's streams are carried (`bench idle` and `bench latency`
/// `--transports`): floodtest's `--transport`, over plain TCP or inside TLS
/// (an `https://` URL and `--tls-ca`). One list of values rather than a
/// separate TLS flag, so a run measures exactly the pairs asked for
/// (`chunked,tls,tls-ws`) and each result row keeps one `transport` key.
#[derive(clap::ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Wire {
    /// A plain GET; events are chunks.
    #[default]
    Chunked,
    /// Server-sent events.
    Sse,
    /// WebSocket text frames.
    Ws,
    /// `chunked` inside TLS (https://).
    #[value(alias = "tls-chunked")]
    Tls,
    /// `sse` inside TLS.
    TlsSse,
    /// `ws` inside TLS (wss://).
    TlsWs,
}

impl Wire {
    /// Its `--transports` name, as tables show it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wire::Chunked => "chunked",
            Wire::Sse => "sse",
            Wire::Ws => "ws",
            Wire::Tls => "tls",
            Wire::TlsSse => "tls-sse",
            Wire::TlsWs => "tls-ws",
        }
    }

    /// floodtest's `--transport`.
    pub(crate) fn transport(self) -> Transport {
        match self {
            Wire::Chunked | Wire::Tls => Transport::Chunked,
            Wire::Sse | Wire::TlsSse => Transport::Sse,
            Wire::Ws | Wire::TlsWs => Transport::Ws,
        }
    }

    /// Inside TLS.
    pub(crate) fn tls(self) -> bool {
        matches!(self, Wire::Tls | Wire::TlsSse | Wire::TlsWs)
    }

    /// The same transport over plain TCP.
    pub(crate) fn plain(self) -> Wire {
        match self.transport() {
            Transport::Chunked => Wire::Chunked,
            Transport::Sse => Wire::Sse,
            Transport::Ws => Wire::Ws,
        }
    }
}

/// One floodtest run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FloodSpec {
    /// Stream URL template (`{n}` is the connection number).
    pub url: String,
    /// Streams.
    pub count: u64,
    /// Streams opened per second.
    pub rate: f64,
    /// Its whole run; it stops by itself then.
    pub duration: Duration,
    /// Messages per second POSTed to random streams (0: none).
    pub msg_rate: f64,
    /// Where messages go (`{id}`), when not derived from the stream URL.
    pub send_url: Option<String>,
    /// Churn: floodtest's `--lifetime` (None: streams are held).
    pub lifetime: Option<Duration>,
    /// floodtest's `--stats-url` (None: `none`, no server statistics).
    pub stats_url: Option<String>,
    /// floodtest's `--transport`.
    pub transport: Transport,
    /// floodtest's `--tls-ca`: the authority of an `https://` URL's server.
    pub tls_ca: Option<PathBuf>,
}

impl FloodSpec {
    /// Its arguments, writing the summary to `json`.
    pub(crate) fn args(&self, json: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--url".into(),
            self.url.clone(),
            "--count".into(),
            self.count.to_string(),
            "--rate".into(),
            self.rate.to_string(),
            "--duration".into(),
            format!("{}ms", self.duration.as_millis()),
            "--interval".into(),
            "5s".into(),
            "--source-ips".into(),
            SOURCE_IPS.into(),
            "--stats-url".into(),
            self.stats_url.clone().unwrap_or_else(|| "none".into()),
            "--transport".into(),
            self.transport.name().into(),
        ];
        if self.msg_rate > 0.0 {
            a.extend(["--msg-rate".into(), self.msg_rate.to_string()]);
        }
        if let Some(u) = &self.send_url {
            a.extend(["--send-url".into(), u.clone()]);
        }
        if let Some(l) = self.lifetime {
            a.extend(["--lifetime".into(), format!("{}ms", l.as_millis())]);
        }
        if let Some(ca) = &self.tls_ca {
            a.extend(["--tls-ca".into(), ca.display().to_string()]);
        }
        a.extend(["--json".into(), json.display().to_string()]);
        a
    }
}

/// A running floodtest.
pub(crate) struct Flood {
    /// The process.
    proc: Spawned,
    /// Where its summary goes.
    json: PathBuf,
    /// Its stdout and stderr.
    log: PathBuf,
    /// When it was started.
    pub started: Instant,
    /// Its `--duration`.
    duration: Duration,
    /// The command line, for the report.
    pub command: String,
}

impl Flood {
    /// Starts floodtest for `spec`, keeping its files in `dir` under `label`.
    pub(crate) fn start(spec: &FloodSpec, dir: &Path, label: &str) -> anyhow::Result<Self> {
        let exe = sibling("floodtest")?;
        let json = dir.join(format!("{label}.json"));
        let log = dir.join(format!("{label}.log"));
        let args = spec.args(&json);
        // The report shows the command with a placeholder for the temp file.
        let mut shown = args.clone();
        if let Some(last) = shown.last_mut() {
            *last = "FILE.json".into();
        }
        Ok(Flood {
            proc: Spawned::logged("floodtest", Command::new(&exe).args(&args), &log)?,
            json,
            log,
            started: Instant::now(),
            duration: spec.duration,
            command: shell_line(&display_path(&exe), &shown),
        })
    }

    /// True once it has exited.
    pub(crate) fn exited(&mut self) -> bool {
        self.proc.exited().is_some()
    }

    /// Waits for it to end by itself (bounded) and reads its summary.
    pub(crate) fn finish(mut self) -> anyhow::Result<FloodSummary> {
        let left = (self.started + self.duration + GRACE).saturating_duration_since(Instant::now());
        let Some(st) = self.proc.wait_for_exit(left)? else {
            self.proc.stop()?;
            bail!("floodtest ran {GRACE:?} past its duration:\n{}", self.log_tail());
        };
        if !st.success() {
            bail!("floodtest failed ({st}):\n{}", self.log_tail());
        }
        let text = std::fs::read_to_string(&self.json)
            .with_context(|| format!("reading floodtest's summary {}", self.json.display()))?;
        serde_json::from_str(&text).context("parsing floodtest's summary")
    }

    /// Stops it now (SIGTERM; it writes no summary then).
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        self.proc.stop()?;
        Ok(())
    }

    /// The end of its output, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        process::tail(&self.log, 15)
    }
}

/// floodtest's `--json` summary (the fields the harness uses).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct FloodSummary {
    /// Streams asked for.
    pub target: u64,
    /// Processes that held them.
    pub processes: u64,
    /// Its run time, seconds.
    pub duration_s: f64,
    /// Streams open at the end.
    pub active: u64,
    /// Streams the server closed.
    pub closed: u64,
    /// Streams floodtest closed itself to open again (`--lifetime`).
    pub churned: u64,
    /// Events received.
    pub chunks: u64,
    /// Streams ever established.
    pub established: u64,
    /// Failed opens by kind.
    pub errors: BTreeMap<String, u64>,
    /// Established streams ÷ seconds from its start to the last one established.
    pub connect_rate: f64,
    /// Routed messages.
    pub messages: Messages,
    /// Send → arrival latency of every stamped event, ms.
    pub latency_ms: LatencyMs,
    /// Arrivals of a broadcast probe (`B@<µs>`), apart from routed ones.
    pub broadcast: Option<ProbeArrivals>,
}

/// floodtest's `broadcast`: where a probe arrived, and when.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct ProbeArrivals {
    /// Streams it arrived on.
    pub received: u64,
    /// Send → arrival, ms.
    pub latency_ms: LatencyMs,
}

/// floodtest's message counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct Messages {
    /// Messages the server accepted.
    pub sent: u64,
    /// Stamped events that arrived (every arrival of a broadcast counts).
    pub received: u64,
    /// sent − received, floored at 0.
    pub lost: u64,
    /// Messages the server refused or that failed to send.
    pub send_errors: u64,
}

/// floodtest's latency summary, ms (`None`: nothing recorded).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct LatencyMs {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// Failed opens as `kind=n kind=n`, or `none`.
pub(crate) fn errors_text(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "none".into();
    }
    errors
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_are_fair_to_both_servers() {
        let spec = FloodSpec {
            url: "http://127.0.0.1:9000/test/c{n}".into(),
            count: 10_000,
            rate: 5000.0,
            duration: Duration::from_millis(35_500),
            msg_rate: 1000.0,
            send_url: Some("http://127.0.0.1:9000/send/{id}".into()),
            lifetime: None,
            stats_url: None,
            transport: Transport::Chunked,
            tls_ca: None,
        };
        let a = spec.args(Path::new("/tmp/f.json")).join(" ");
        assert!(!a.contains("--tls-ca"));
        assert!(!a.contains("--lifetime"));
        assert!(a.contains("--stats-url none"));
        assert!(a.contains("--source-ips 127.0.0.2-127.0.0.5"));
        assert!(a.contains("--duration 35500ms"));
        assert!(a.contains("--count 10000 --rate 5000"));
        assert!(a.contains("--msg-rate 1000 --send-url http://127.0.0.1:9000/send/{id}"));
        assert!(a.ends_with("--json /tmp/f.json"));
        let quiet = FloodSpec {
            msg_rate: 0.0,
            send_url: None,
            ..spec
        };
        assert!(!quiet.args(Path::new("x")).join(" ").contains("--msg-rate"));
        let churning = FloodSpec {
            lifetime: Some(Duration::from_secs(60)),
            ..quiet
        };
        assert!(
            churning
                .args(Path::new("x"))
                .join(" ")
                .contains("--lifetime 60000ms")
        );
        let fleet = FloodSpec {
            stats_url: Some("http://127.0.0.1:9000/cluster".into()),
            ..churning
        };
        assert!(
            fleet
                .args(Path::new("x"))
                .join(" ")
                .contains("--stats-url http://127.0.0.1:9000/cluster")
        );
        let tls = FloodSpec {
            url: "https://127.0.0.1:9443/test/c{n}".into(),
            tls_ca: Some("/tmp/run/bench-ca.pem".into()),
            transport: Wire::TlsWs.transport(),
            ..fleet
        };
        let a = tls.args(Path::new("x")).join(" ");
        assert!(a.contains("--url https://127.0.0.1:9443/test/c{n}"), "{a}");
        assert!(a.contains("--transport ws"), "{a}");
        assert!(a.contains("--tls-ca /tmp/run/bench-ca.pem"), "{a}");
    }

    #[test]
    fn wires_are_a_transport_over_tcp_or_tls() {
        use clap::ValueEnum as _;
        let names: Vec<&str> = Wire::value_variants().iter().map(|w| w.name()).collect();
        assert_eq!(names, ["chunked", "sse", "ws", "tls", "tls-sse", "tls-ws"]);
        for w in Wire::value_variants() {
            // The command line, the tables and the result files agree.
            assert_eq!(Wire::from_str(w.name(), false), Ok(*w));
            assert_eq!(serde_json::to_string(w).unwrap(), format!("\"{}\"", w.name()));
            assert_eq!(w.plain().transport(), w.transport());
            assert!(!w.plain().tls());
            assert_eq!(w.plain().name(), w.transport().name());
        }
        assert_eq!(Wire::from_str("tls-chunked", false), Ok(Wire::Tls));
        assert_eq!((Wire::TlsWs.tls(), Wire::TlsWs.plain()), (true, Wire::Ws));
        // Results written before TLS existed still read.
        let old: Vec<Wire> = serde_json::from_str(r#"["chunked","sse","ws"]"#).unwrap();
        assert_eq!(old, [Wire::Chunked, Wire::Sse, Wire::Ws]);
    }

    #[test]
    fn reads_floodtests_summary() {
        // The shape of flood::report::Summary::to_json.
        let text = r#"{"target":100,"processes":1,"duration_s":3.2,"active":100,"closed":0,"chunks":250,
            "established":100,"errors":{"refused":2},"connect_rate":990.5,
            "client_bytes_per_connection":1500,"server_bytes_per_connection":null,
            "messages":{"sent":40,"received":39,"lost":1,"send_errors":0},
            "latency_ms":{"p50":0.5,"p90":0.9,"p99":2.5,"p999":3.0,"max":3.1}}"#;
        let s: FloodSummary = serde_json::from_str(text).unwrap();
        assert_eq!(
            (s.established, s.messages.lost, s.latency_ms.p99),
            (100, 1, Some(2.5))
        );
        assert_eq!(errors_text(&s.errors), "refused=2");
        let empty: FloodSummary = serde_json::from_str(r#"{"latency_ms":{"p50":null,"max":null}}"#).unwrap();
        assert_eq!(empty.latency_ms.max, None);
        assert_eq!(errors_text(&empty.errors), "none");
    }
}
