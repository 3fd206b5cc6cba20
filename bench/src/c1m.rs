//! The million-stream run: `scripts/c1m.sh` measures it (it needs root for
//! the kernel settings and most of the box for seven minutes, so it is not a
//! `bench` subcommand) and writes `bench/results/c1m.json` in the shape of
//! every other result; this module renders it into BENCHMARKS.md, with
//! streams and memory over time as charts.

use serde_json::Value;

use super::chart::{Chart, Series};
use super::outcome::Outcome;
use super::table::{Table, thousands};

/// The section's method paragraph.
pub(crate) const HOW: &str = "`scripts/c1m.sh` (run as root: it applies what `scripts/tune-kernel.sh` recommends for \
the count and lists what it changed) starts its own `redis-server` (at nice -10) and `switchboard --processes P` on one port, P \
from the open-file limit (hard limit less 1,000 streams each: 55 processes for 1,000,000 streams at this machine's 20,000), with \
`server.workers = 1`, ticks every 60 s (one event per stream per minute, the rate of Mochiweb's million-user test: at \
10 s a million streams would be 100,000 chunks/s, which two cores cannot write at ~30 µs each) and \
`server.shutdown_timeout_ms` at 100 µs per stream. floodtest ramps to N streams (its own child processes, 10,000 \
connections per source address from 127.0.0.2 up), holds them while it POSTs `--msg-rate` messages per second to \
random held ids through the shared port (so most cross processes over Redis) and times every tick against its \
schedule; a broadcast probe goes out half-way through the hold; then the fleet gets SIGTERM with every stream held. \
Memory is sampled every 5 s (CPU is read when every stream is held and at the end of the hold): **server RSS per stream** = (sum of the fleet's RSS − the same before the \
flood) ÷ streams; **slab per pair** = growth of `Slab:` in `/proc/meminfo` ÷ streams (kernel memory for both ends); \
**box memory** = MemTotal − MemAvailable at its peak. Phases are cut from floodtest's per-second timeline: each \
message counts in the second it was sent, each tick in the second it was due; *broadcast* is from the probe's send \
to its last arrival (a second either side), *steady* the rest of the hold, *hold* both. Phase latencies are \
bucket bounds (≤ 1, 2, 5, 10, 20, 50 ms, …, 20 s), so ≤ 50 ms and ≤ 1 s are read exactly.";

/// Streams over time, in thousands.
pub(crate) const STREAMS_CHART: &str = "docs/c1m-streams.svg";
/// Memory over time.
pub(crate) const MEMORY_CHART: &str = "docs/c1m-memory.svg";

fn u(v: &Value) -> Option<u64> {
    v.as_u64()
}

fn gb(v: &Value) -> String {
    v.as_f64().map_or("—".into(), |b| format!("{:.2} GB", b / 1e9))
}

fn num(v: &Value) -> String {
    u(v).map_or_else(|| v.as_f64().map_or("—".into(), |x| format!("{x}")), thousands)
}

/// A bucket bound as text (`≤ 50`), `> 20000` past the last one.
fn bound(v: &Value) -> String {
    match (v.as_f64(), v.as_str()) {
        (Some(x), _) => format!("≤ {x}"),
        // Past the last bucket: c1m.py writes "> 20000" (JSON has no infinity).
        (None, Some(text)) => text.to_owned(),
        // The phase had nothing.
        (None, None) => "—".into(),
    }
}

fn share(v: &Value) -> String {
    v.as_f64().map_or("—".into(), |x| format!("{:.2}%", 100.0 * x))
}

/// The summary, phase and target tables.
pub(crate) fn render(o: &Outcome<Value>) -> String {
    let d = &o.data;
    let f = &d["floodtest"];
    let mut t = Table::new(&["", ""]);
    let mut row = |k: &str, v: String| t.row(vec![k.into(), v]);
    row(
        "streams target",
        format!(
            "{} over {} processes",
            num(&d["streams_target"]),
            num(&d["processes"])
        ),
    );
    row(
        "held: peak / least during the hold / at its end (`/cluster`)",
        format!(
            "{} / {} / {}",
            num(&d["streams_held_peak_cluster"]),
            num(&d["streams_held_min_during_hold"]),
            num(&d["streams_held_end_cluster"])
        ),
    );
    row(
        "floodtest: established / ended by the server / errors",
        format!(
            "{} / {} / {}",
            num(&f["established"]),
            num(&f["closed"]),
            if f["errors"].as_object().is_none_or(|m| m.is_empty()) {
                "none".to_owned()
            } else {
                f["errors"].to_string()
            }
        ),
    );
    row(
        "ramp",
        format!(
            "{} s at {} connects/s",
            d["ramp_s"],
            f["connect_rate"]
                .as_f64()
                .map_or("—".into(), |r| thousands(r.round() as u64))
        ),
    );
    row(
        "server RSS per stream, all processes: at the peak / before the broadcast",
        format!(
            "{} B / {} B",
            num(&d["server_rss_bytes_per_stream"]),
            num(&d["server_rss_bytes_per_stream_before_broadcast"])
        ),
    );
    row(
        "kernel slab per client+server pair",
        format!("{} B", num(&d["kernel_slab_bytes_per_pair"])),
    );
    row(
        "client (floodtest) RSS per stream",
        format!("{} B", num(&d["client_rss_bytes_per_stream"])),
    );
    row("box memory used, peak", gb(&d["box_memory_used_bytes"]));
    row("Redis RSS, peak", gb(&d["redis_rss_bytes"]));
    row(
        "CPU during the hold: servers / Redis (% of one core)",
        format!("{} / {}", d["server_cpu_pct"], d["redis_cpu_pct"]),
    );
    row(
        "bus links lost (and reconnected) over the run",
        num(&d["bus_links_lost"]),
    );
    let m = &f["messages"];
    row(
        "messages, whole run: sent / received / lost / send errors",
        format!(
            "{} / {} / {} / {}",
            num(&m["sent"]),
            num(&m["received"]),
            num(&m["lost"]),
            num(&m["send_errors"])
        ),
    );
    let lat = &f["latency_ms"];
    row(
        "message latency, whole run: p50 / p99 / max",
        format!("{} / {} / {} ms", lat["p50"], lat["p99"], lat["max"]),
    );
    let tick = &f["tick_lag_ms"];
    row(
        "ticks, whole run: arrived, lag p50 / p99 / max",
        format!(
            "{}, {} / {} / {} ms",
            num(&f["ticks"]),
            tick["p50"],
            tick["p99"],
            tick["max"]
        ),
    );
    let bc = &f["broadcast"];
    row(
        "broadcast: received, last arrival, `/broadcast` answered in",
        format!(
            "{}, {} ms, {} ms",
            num(&bc["received"]),
            bc["last_ms"],
            d["broadcast"]["answer_ms"]
        ),
    );
    row(
        "drain: SIGTERM to exit, exit code (shutdown_timeout_ms)",
        format!(
            "{} ms, {} ({})",
            num(&d["drain_ms"]),
            d["exit_code"],
            num(&d["shutdown_timeout_ms"])
        ),
    );
    let mut s = t.render();

    let mut p = Table::new(&[
        "phase",
        ">seconds with events",
        ">messages sent",
        ">lost",
        ">latency p50 / p99 / max ms",
        ">within 50 ms",
        ">ticks",
        ">tick lag p50 / p99 / max ms",
        ">within 1 s",
    ]);
    for name in ["ramp", "steady", "broadcast", "hold", "drain"] {
        let ph = &d["phases"][name];
        if ph.is_null() {
            continue;
        }
        let (m, t) = (&ph["messages"], &ph["ticks"]);
        p.row(vec![
            name.to_owned(),
            num(&ph["seconds"]),
            num(&m["sent"]),
            num(&m["lost"]),
            format!(
                "{} / {} / {}",
                bound(&m["latency_ms_p50_at_most"]),
                bound(&m["latency_ms_p99_at_most"]),
                bound(&m["latency_ms_max_at_most"])
            ),
            share(&m["share_within_50ms"]),
            num(&t["arrived"]),
            format!(
                "{} / {} / {}",
                bound(&t["lag_ms_p50_at_most"]),
                bound(&t["lag_ms_p99_at_most"]),
                bound(&t["lag_ms_max_at_most"])
            ),
            share(&t["share_within_1s"]),
        ]);
    }
    s += "\n";
    s += &p.render();

    let mut g = Table::new(&["target", "measured", "met"]);
    for t in d["targets"].as_array().into_iter().flatten() {
        g.row(vec![
            t["target"].as_str().unwrap_or_default().to_owned(),
            t["measured"].as_str().unwrap_or_default().to_owned(),
            if t["met"].as_bool() == Some(true) {
                "met".into()
            } else {
                "**not met**".into()
            },
        ]);
    }
    s += "\n";
    s += &g.render();
    match d["kernel_changes"].as_array().filter(|k| !k.is_empty()) {
        Some(k) => {
            s += "\nKernel settings the run changed:\n\n";
            for c in k {
                s += &format!("- `{}`\n", c.as_str().unwrap_or_default());
            }
        }
        None => {
            s += "\nThe run changed no kernel setting: each was already at what `scripts/tune-kernel.sh \
                  --connections N` recommends (an earlier run as root applied them; they last until reboot).\n";
        }
    }
    if let Some(k) = d["kernel_in_effect"].as_array().filter(|k| !k.is_empty()) {
        s += "\nIn effect during the run:\n\n";
        for c in k {
            s += &format!("- `{}`\n", c.as_str().unwrap_or_default());
        }
    }
    s += &format!(
        "\n![Streams held during the run]({STREAMS_CHART})\n\n![Memory during the run]({MEMORY_CHART})\n"
    );
    s
}

/// Streams, and memory by part, against seconds since the flood started.
pub(crate) fn charts(o: &Outcome<Value>) -> (Chart, Chart) {
    let samples: Vec<&Value> = o.data["samples"].as_array().into_iter().flatten().collect();
    let t = |s: &Value| s["t"].as_f64().unwrap_or(0.0);
    let streams = Chart {
        title: "Streams held (/cluster), c1m.sh".into(),
        x_label: "seconds since the flood started".into(),
        y_label: "streams, thousands".into(),
        series: vec![Series {
            name: "streams".into(),
            points: samples
                .iter()
                .filter_map(|s| Some((t(s), s["streams"].as_f64()? / 1000.0)))
                .collect(),
        }],
    };
    let part = |name: &str, key: &str| Series {
        name: name.into(),
        points: samples
            .iter()
            .filter_map(|s| Some((t(s), s[key].as_f64()? / 1e9)))
            .collect(),
    };
    let memory = Chart {
        title: "Memory, c1m.sh".into(),
        x_label: "seconds since the flood started".into(),
        y_label: "GB".into(),
        series: vec![
            part("box used", "box_used"),
            part("kernel slab", "slab"),
            part("servers RSS", "server_rss"),
            part("floodtest RSS", "client_rss"),
        ],
    };
    (streams, memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outcome() -> Outcome<Value> {
        Outcome {
            benchmark: "c1m".into(),
            smoke: false,
            command: "scripts/c1m.sh --json bench/results/c1m.json".into(),
            tools: vec![],
            commit: "abc".into(),
            started_unix: 0,
            elapsed_s: 1.0,
            notes: vec![],
            data: json!({
                "streams_target": 1000, "processes": 2, "server_rss_bytes_per_stream": 1234,
                "floodtest": {"established": 1000, "closed": 1000, "errors": {},
                              "messages": {"sent": 5, "received": 5, "lost": 0, "send_errors": 0}},
                "phases": {"hold": {"seconds": 3,
                    "messages": {"sent": 5, "lost": 0, "latency_ms_p50_at_most": 1.0,
                                 "latency_ms_p99_at_most": 50.0, "latency_ms_max_at_most": 50.0,
                                 "share_within_50ms": 1.0},
                    "ticks": {"arrived": 9, "lag_ms_p99_at_most": 1000.0, "share_within_1s": 1.0}}},
                "targets": [{"target": "held", "measured": "1,000", "met": true},
                            {"target": "rss", "measured": "1,234 B", "met": false}],
                "samples": [{"t": 5.0, "streams": 500, "box_used": 1e9, "slab": 2e8,
                             "server_rss": 1e8, "client_rss": 1e8},
                            {"t": 10.0, "streams": 1000, "box_used": 2e9, "slab": 4e8,
                             "server_rss": 2e8, "client_rss": 2e8}],
            }),
        }
    }

    #[test]
    fn renders_the_tables_from_the_json() {
        let md = render(&outcome());
        assert!(md.contains("| streams target"), "{md}");
        assert!(md.contains("1,000 over 2 processes"), "{md}");
        assert!(md.contains("1,234 B"), "{md}");
        assert!(md.contains("| hold "), "{md}");
        assert!(md.contains("≤ 1 / ≤ 50 / ≤ 50"), "{md}");
        assert!(md.contains("| rss "), "{md}");
        assert!(md.contains("**not met**"), "{md}");
        assert!(md.contains("100.00%"), "{md}");
    }

    #[test]
    fn charts_have_streams_and_four_memory_parts() {
        let (streams, memory) = charts(&outcome());
        assert_eq!(streams.series[0].points, vec![(5.0, 0.5), (10.0, 1.0)]);
        assert_eq!(memory.series.len(), 4);
        assert_eq!(memory.series[0].points[1], (10.0, 2.0));
    }
}
