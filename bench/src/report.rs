//! `bench report`: reads the JSON results and writes `BENCHMARKS.md` (the
//! machine, read now; the targets, met or not; every benchmark's method,
//! commands and tables) and `docs/bytes-per-stream.svg`.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::broadcast::{self, BroadcastData};
use super::c1m;
use super::chart::{Chart, Series, svg};
use super::cluster::{self, ClusterData};
use super::connect::{self, ConnectData};
use super::dispatcher::{self, DispatcherData, cpu_by_connections, ratios_by_connections};
use super::flood::Wire;
use super::idle::{self, IdleData};
use super::latency::{self, LatencyData};
use super::machine::{self, Machine};
use super::outcome::Outcome;
use super::process::display_path;
use super::publish_flood::{self, FloodData};
use super::servers;
use super::servers::{ServerKind, nginx_conf};
use super::soak::{self, SoakData};
use super::table::{Table, fixed, thousands, times, whole};

/// The chart's path under the output directory (and the link in the report).
pub(crate) const CHART: &str = "docs/bytes-per-stream.svg";

/// The soak's charts: RSS, and descriptors and streams, over time.
pub(crate) const SOAK_RSS_CHART: &str = "docs/soak-rss.svg";
/// See [`SOAK_RSS_CHART`].
pub(crate) const SOAK_FDS_CHART: &str = "docs/soak-fds.svg";

/// Goal: server RSS per idle stream at 19,000 streams, bytes.
pub(crate) const GOAL_RSS_PER_STREAM: f64 = 1500.0;
/// Goal: server RSS per idle SSE stream and per idle WebSocket at 19,000
/// streams, bytes (issue 12).
const GOAL_RSS_PER_SSE_STREAM: f64 = 1500.0;
const GOAL_RSS_PER_WEBSOCKET: f64 = 2000.0;
/// Goal: switchboard /dispatcher req/s ÷ nginx's.
pub(crate) const GOAL_DISPATCHER_RATIO: f64 = 1.0;
/// Goal: routed-message p99 at 10,000 streams and 1,000 messages/s, ms.
pub(crate) const GOAL_ROUTED_P99_MS: f64 = 5.0;
/// Goal: cross-process routed p99 over 4 processes joined by Redis, ms.
pub(crate) const GOAL_CLUSTER_P99_MS: f64 = 2.0;
/// Goal: one broadcast reaching all 19,000 streams, ms.
pub(crate) const GOAL_BROADCAST_MS: f64 = 200.0;
/// Long-term need: server CPU per tick chunk at 19,000 streams, µs.
pub(crate) const GOAL_US_PER_CHUNK: f64 = 8.0;

/// Streams and message rate the latency goal is stated for.
const LATENCY_GOAL_AT: (u64, f64) = (10_000, 1000.0);

/// `bench report` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory holding the benchmarks' JSON results.
    #[arg(long, value_name = "DIR", default_value = "bench/results")]
    pub results: PathBuf,
    /// Where BENCHMARKS.md and docs/bytes-per-stream.svg are written.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
}

/// Every result that exists.
#[derive(Debug, Default)]
pub(crate) struct Results {
    /// `idle.json`.
    pub idle: Option<Outcome<IdleData>>,
    /// `dispatcher.json`.
    pub dispatcher: Option<Outcome<DispatcherData>>,
    /// `latency.json`.
    pub latency: Option<Outcome<LatencyData>>,
    /// `broadcast.json`.
    pub broadcast: Option<Outcome<BroadcastData>>,
    /// `flood.json`.
    pub flood: Option<Outcome<FloodData>>,
    /// `connect.json`.
    pub connect: Option<Outcome<ConnectData>>,
    /// `soak.json`.
    pub soak: Option<Outcome<SoakData>>,
    /// `cluster.json`.
    pub cluster: Option<Outcome<ClusterData>>,
    /// `c1m.json`, written by `scripts/c1m.sh`.
    pub c1m: Option<Outcome<serde_json::Value>>,
}

impl Results {
    /// Reads whichever result files `dir` holds.
    pub(crate) fn read(dir: &Path) -> anyhow::Result<Self> {
        Ok(Results {
            idle: Outcome::read(dir, "idle")?,
            dispatcher: Outcome::read(dir, "dispatcher")?,
            latency: Outcome::read(dir, "latency")?,
            broadcast: Outcome::read(dir, "broadcast")?,
            flood: Outcome::read(dir, "flood")?,
            connect: Outcome::read(dir, "connect")?,
            soak: Outcome::read(dir, "soak")?,
            cluster: Outcome::read(dir, "cluster")?,
            c1m: Outcome::read(dir, "c1m")?,
        })
    }

    /// Is any result from a `--smoke` run?
    fn any_smoke(&self) -> bool {
        [
            self.idle.as_ref().map(|o| o.smoke),
            self.dispatcher.as_ref().map(|o| o.smoke),
            self.latency.as_ref().map(|o| o.smoke),
            self.broadcast.as_ref().map(|o| o.smoke),
            self.flood.as_ref().map(|o| o.smoke),
            self.connect.as_ref().map(|o| o.smoke),
            self.soak.as_ref().map(|o| o.smoke),
            self.cluster.as_ref().map(|o| o.smoke),
            self.c1m.as_ref().map(|o| o.smoke),
        ]
        .contains(&Some(true))
    }

    /// Each result's (benchmark, commit), for the machine section.
    fn commits(&self) -> Vec<(&str, &str)> {
        let mut v = Vec::new();
        macro_rules! push {
            ($($f:ident),*) => {$(
                if let Some(o) = &self.$f { v.push((stringify!($f), o.commit.as_str())); }
            )*};
        }
        push!(
            idle, dispatcher, latency, broadcast, flood, connect, soak, cluster, c1m
        );
        v
    }
}

/// Runs `bench report`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let results = Results::read(&args.results)?;
    let machine = machine::describe();
    let md = markdown(
        &results,
        &machine,
        &display_path(&args.results),
        &machine::commit(),
    );
    let md_path = args.out.join("BENCHMARKS.md");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    println!("wrote {}", md_path.display());
    if let Some(idle) = &results.idle {
        let chart_path = args.out.join(CHART);
        if let Some(dir) = chart_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&chart_path, svg(&bytes_chart(&idle.data)))
            .with_context(|| format!("writing {}", chart_path.display()))?;
        println!("wrote {}", chart_path.display());
    }
    if let Some(soak) = &results.soak {
        let (rss, fds) = soak::charts(&soak.data);
        for (path, chart) in [(SOAK_RSS_CHART, rss), (SOAK_FDS_CHART, fds)] {
            let path = args.out.join(path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&path, svg(&chart)).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    if let Some(o) = &results.c1m {
        let (streams, memory) = c1m::charts(o);
        for (path, chart) in [(c1m::STREAMS_CHART, streams), (c1m::MEMORY_CHART, memory)] {
            let path = args.out.join(path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&path, svg(&chart)).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    let t = targets(&results);
    println!("\n{}", targets_table(&t).render());
    Ok(())
}

/// Bytes per idle stream against stream count, one line per server.
pub(crate) fn bytes_chart(idle: &IdleData) -> Chart {
    let series = [
        (ServerKind::Switchboard, Wire::Chunked, "switchboard"),
        (ServerKind::Switchboard, Wire::Sse, "switchboard, SSE"),
        (ServerKind::Switchboard, Wire::Ws, "switchboard, WebSocket"),
        (ServerKind::Switchboard, Wire::Tls, "switchboard, TLS"),
        (ServerKind::Switchboard, Wire::TlsSse, "switchboard, SSE over TLS"),
        (
            ServerKind::Switchboard,
            Wire::TlsWs,
            "switchboard, WebSocket over TLS",
        ),
        (ServerKind::Nchan, Wire::Chunked, "Nchan"),
        (ServerKind::Nchan, Wire::Tls, "Nchan, TLS"),
    ]
    .into_iter()
    .map(|(k, t, name)| Series {
        name: name.into(),
        points: idle
            .rows
            .iter()
            .filter(|r| r.server == k && r.transport == t)
            .filter_map(|r| Some((r.streams as f64, r.rss_per_stream?)))
            .collect(),
    })
    .filter(|s| !s.points.is_empty())
    .collect();
    Chart {
        title: "Server RSS per idle stream".into(),
        x_label: "idle streams held".into(),
        y_label: "bytes of RSS per stream".into(),
        series,
    }
}

/// One target, judged.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Judged {
    /// What is measured.
    pub target: String,
    /// The goal.
    pub goal: String,
    /// What was measured (or why nothing was).
    pub measured: String,
    /// Met (`None`: not measured, or only in a smoke run).
    pub met: Option<bool>,
}

/// The targets against whatever results there are.
pub(crate) fn targets(r: &Results) -> Vec<Judged> {
    // The targets are judged at the largest stream count each benchmark
    // reached: the open-file limit less a margin (19,000 on this machine).
    let not_run = |what: &str| format!("not measured (no {what})");
    let judge = |smoke: bool, measured: String, met: bool| {
        if smoke {
            (format!("{measured} (smoke run)"), None)
        } else {
            (measured, Some(met))
        }
    };
    let mut out = Vec::new();

    let idle_sb = |t: Wire| {
        r.idle.as_ref().and_then(|o| {
            o.data
                .rows
                .iter()
                .filter(|x| x.server == ServerKind::Switchboard && x.transport == t)
                .max_by_key(|x| x.streams)
                .map(|x| (o.smoke, x))
        })
    };
    let full = thousands(idle_sb(Wire::Chunked).map_or(19_000, |(_, x)| x.streams));
    for (t, what, goal) in [
        (Wire::Chunked, "stream", GOAL_RSS_PER_STREAM),
        (Wire::Sse, "SSE stream", GOAL_RSS_PER_SSE_STREAM),
        (Wire::Ws, "WebSocket", GOAL_RSS_PER_WEBSOCKET),
    ] {
        let row = idle_sb(t);
        let full = thousands(row.map_or(19_000, |(_, x)| x.streams));
        let (measured, met) = match row.and_then(|(s, x)| Some((s, x.rss_per_stream?))) {
            Some((smoke, b)) => judge(smoke, format!("{} B", whole(b)), b <= goal),
            None => (
                not_run(&format!("idle run ({}) at {full} streams", t.name())),
                None,
            ),
        };
        out.push(Judged {
            target: format!("switchboard RSS per idle {what} at {full} streams"),
            goal: format!("≤ {} B", whole(goal)),
            measured,
            met,
        });
    }

    let (measured, met) = match &r.dispatcher {
        Some(o) if !o.data.pairs.is_empty() => {
            let ratios = ratios_by_connections(&o.data.pairs);
            let text = ratios
                .iter()
                .map(|(c, x)| format!("{} at {c} connections", times(*x)))
                .collect::<Vec<_>>()
                .join(", ");
            let ok = ratios
                .iter()
                .all(|(_, x)| x.is_some_and(|x| x >= GOAL_DISPATCHER_RATIO));
            judge(o.smoke, text + &cpu_per_request_text(&o.data.pairs), ok)
        }
        _ => (not_run("dispatcher run"), None),
    };
    out.push(Judged {
        target: "`GET /dispatcher` req/s, switchboard ÷ nginx (every connection count)".into(),
        goal: format!("≥ {GOAL_DISPATCHER_RATIO:.1}×"),
        measured,
        met,
    });

    let (n, rate) = LATENCY_GOAL_AT;
    let lat = r.latency.as_ref().and_then(|o| {
        let row = o.data.rows.iter().find(|x| {
            x.server == ServerKind::Switchboard
                && x.transport == Wire::Chunked
                && x.streams == n
                && x.msg_rate == rate
        })?;
        Some((o.smoke, row.flood.latency_ms.p99?, row.flood.messages.lost))
    });
    let (measured, met) = match lat {
        Some((smoke, p99, lost)) => judge(
            smoke,
            format!("{} ms (lost {})", fixed(p99, 2), thousands(lost)),
            p99 <= GOAL_ROUTED_P99_MS,
        ),
        None => (
            not_run(&format!(
                "latency run at {} streams, {} msg/s",
                thousands(n),
                thousands(rate as u64)
            )),
            None,
        ),
    };
    out.push(Judged {
        target: format!(
            "switchboard routed-message p99 at {} streams, {} messages/s",
            thousands(n),
            thousands(rate as u64)
        ),
        goal: format!("≤ {GOAL_ROUTED_P99_MS} ms"),
        measured,
        met,
    });

    let cl = r.cluster.as_ref().and_then(|o| {
        let row = o
            .data
            .rows
            .iter()
            .find(|x| x.redis && x.processes == 4 && x.streams == n && x.msg_rate == rate)?;
        let single = o.data.rows.iter().find(|x| !x.redis)?;
        Some((
            o.smoke,
            row.flood.latency_ms.p99?,
            row.flood.messages.lost,
            single.flood.latency_ms.p99?,
        ))
    });
    let (measured, met) = match cl {
        Some((smoke, p99, lost, single)) => judge(
            smoke,
            format!(
                "{} ms (lost {}); one process in the same run {} ms",
                fixed(p99, 2),
                thousands(lost),
                fixed(single, 2)
            ),
            p99 <= GOAL_CLUSTER_P99_MS && lost == 0,
        ),
        None => (
            not_run("cluster run over 4 processes at 10,000 streams, 1,000 msg/s"),
            None,
        ),
    };
    out.push(Judged {
        target: format!(
            "cross-process routed p99 over 4 processes + Redis, {} streams, {} messages/s",
            thousands(n),
            thousands(rate as u64)
        ),
        goal: format!("≤ {GOAL_CLUSTER_P99_MS} ms, 0 lost"),
        measured,
        met,
    });

    let bc = r.broadcast.as_ref().and_then(|o| {
        let row = o
            .data
            .rows
            .iter()
            .filter(|x| x.server == ServerKind::Switchboard && x.case.contains("/broadcast"))
            .max_by_key(|x| x.streams)?;
        Some((o.smoke, row))
    });
    let bc_full = bc.map_or(full.clone(), |(_, row)| thousands(row.streams));
    let (measured, met) = match bc {
        Some((smoke, row)) => match row.last_ms {
            Some(ms) => judge(
                smoke,
                format!(
                    "{} ms, received by {} of {}",
                    fixed(ms, 1),
                    thousands(row.received),
                    thousands(row.streams)
                ),
                ms <= GOAL_BROADCAST_MS && row.received >= row.streams,
            ),
            None => judge(smoke, "the message arrived nowhere".into(), false),
        },
        None => (not_run(&format!("broadcast run at {bc_full} streams")), None),
    };
    out.push(Judged {
        target: format!("switchboard `/broadcast` reaching all {bc_full} streams"),
        goal: format!("≤ {GOAL_BROADCAST_MS} ms, every stream"),
        measured,
        met,
    });

    let (measured, met) = match idle_sb(Wire::Chunked).and_then(|(s, x)| Some((s, x.us_per_chunk?))) {
        Some((smoke, us)) => judge(smoke, format!("{} µs", fixed(us, 2)), us <= GOAL_US_PER_CHUNK),
        None => (not_run(&format!("idle run at {full} streams")), None),
    };
    out.push(Judged {
        target: format!("switchboard CPU per tick chunk at {full} idle streams"),
        goal: format!("report (long-term need ≤ {GOAL_US_PER_CHUNK} µs)"),
        measured,
        met,
    });

    let soak = r.soak.as_ref();
    let (measured, met) = match soak.map(|o| (o.smoke, &o.data)) {
        Some((smoke, d)) => {
            let lost = d.flood.messages.lost;
            let back = d.after.fds <= d.baseline.fds && d.after.streams <= d.baseline.streams;
            let drift = d
                .rss_drift
                .map_or("n/a".into(), |x| format!("{}%", fixed(x * 100.0, 1)));
            judge(
                smoke,
                format!(
                    "RSS drift {drift}; {lost} lost; fds {} → {} (baseline {}), streams back to {}",
                    d.samples.iter().map(|s| s.fds).max().unwrap_or(0),
                    d.after.fds,
                    d.baseline.fds,
                    d.after.streams
                ),
                d.rss_drift.is_some_and(|x| x <= soak::GOAL_RSS_FLAT) && lost == 0 && back,
            )
        }
        None => (not_run("soak run"), None),
    };
    out.push(Judged {
        target: format!(
            "soak{}: churning streams, slowloris, never-readers",
            soak.map_or(String::new(), |o| format!(" ({} s)", whole(o.data.duration_s)))
        ),
        goal: "RSS flat within 5% after warm-up, nothing lost, fds and streams back to baseline".into(),
        measured,
        met,
    });
    out
}

/// `; CPU/request 0.95× nginx's at 64, 1.02× at 256 (lower is better)`, or
/// nothing for results from before CPU time was measured.
fn cpu_per_request_text(pairs: &[dispatcher::Pair]) -> String {
    let cpu = cpu_by_connections(pairs);
    if cpu.iter().all(|at| at.ratio.is_none()) {
        return String::new();
    }
    let each = cpu
        .iter()
        .enumerate()
        .map(|(i, at)| {
            let whose = if i == 0 { " nginx's" } else { "" };
            format!("{}{whose} at {}", times(at.ratio), at.connections)
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("; CPU/request {each} (lower is better)")
}

/// The targets as a table.
pub(crate) fn targets_table(t: &[Judged]) -> Table {
    let mut table = Table::new(&["target", "goal", "measured", "met?"]);
    for j in t {
        table.row(vec![
            j.target.clone(),
            j.goal.clone(),
            j.measured.clone(),
            match j.met {
                Some(true) => "met".into(),
                Some(false) => "**not met**".into(),
                None => "—".into(),
            },
        ]);
    }
    table
}

/// The whole of BENCHMARKS.md.
pub(crate) fn markdown(r: &Results, m: &Machine, results_dir: &str, commit_now: &str) -> String {
    let mut s = String::new();
    s += "# Benchmarks\n\n";
    s += &format!(
        "<!-- GENERATED by `bench report` from {results_dir}/*.json. Do not edit: run scripts/bench/all.sh. -->\n\n"
    );
    s += &format!(
        "> **Generated file — do not edit.** `scripts/bench/all.sh` measures everything (about 7 minutes \
         on the machine below) and regenerates it with `bench report` from the JSON results in \
         `{results_dir}/`. Each benchmark alone: `target/release/bench <name>`; see `bench --help`.\n\n"
    );
    if r.any_smoke() {
        s += "> **Smoke run.** Tiny counts and short durations: these numbers only show that the harness \
              works; they measure nothing.\n\n";
    }

    s += "## Machine\n\n";
    let mut mt = Table::new(&["", ""]);
    mt.row(vec![
        "CPU".into(),
        format!("{} ({} logical CPUs)", m.cpu, m.cores),
    ]);
    mt.row(vec![
        "memory".into(),
        format!("{:.1} GiB", m.mem_total as f64 / (1u64 << 30) as f64),
    ]);
    mt.row(vec!["kernel".into(), m.kernel.clone()]);
    mt.row(vec![
        "open files per process (soft/hard)".into(),
        m.open_files.clone(),
    ]);
    for (p, v) in &m.packages {
        mt.row(vec![format!("`{p}` (Debian)"), v.clone()]);
    }
    mt.row(vec!["rustc".into(), m.rustc.clone()]);
    mt.row(vec![
        "checkout when this report was written".into(),
        format!("`{commit_now}`"),
    ]);
    for (bench, commit) in r.commits() {
        mt.row(vec![
            format!("commit measured by `{bench}`"),
            format!("`{commit}`"),
        ]);
    }
    s += &mt.render();
    s += &format!(
        "\nEverything runs on this one machine over loopback: servers, clients, and the harness share the \
         {} CPUs. Both servers get {} workers. The stream client is floodtest (this repository), the \
         request client wrk; floodtest spreads connections over 127.0.0.2-127.0.0.5.\n\n",
        m.cores,
        servers::WORKERS
    );

    s += "## Targets\n\n";
    s += &targets_table(&targets(r)).render();
    s += "\n";

    s += &section(
        "Idle streams: memory and CPU",
        "idle",
        idle::HOW,
        r.idle.as_ref(),
        |o| {
            format!(
                "{}\n![Server RSS per idle stream, switchboard and Nchan]({CHART})\n",
                idle::render(o)
            )
        },
        results_dir,
    );
    s += &section(
        "`GET /dispatcher` throughput",
        "dispatcher",
        dispatcher::HOW,
        r.dispatcher.as_ref(),
        dispatcher::render,
        results_dir,
    );
    s += &section(
        "Routed-message latency",
        "latency",
        latency::HOW,
        r.latency.as_ref(),
        latency::render,
        results_dir,
    );
    s += &section(
        "Broadcast",
        "broadcast",
        broadcast::HOW,
        r.broadcast.as_ref(),
        broadcast::render,
        results_dir,
    );
    s += &section(
        "Publisher flood: backpressure",
        "flood",
        publish_flood::HOW,
        r.flood.as_ref(),
        publish_flood::render,
        results_dir,
    );
    s += &section(
        "Connect rate",
        "connect",
        connect::HOW,
        r.connect.as_ref(),
        connect::render,
        results_dir,
    );
    s += &section(
        "Soak: churn, slowloris, never-readers",
        "soak",
        soak::HOW,
        r.soak.as_ref(),
        |o| {
            format!(
                "{}\n![switchboard RSS during the soak]({SOAK_RSS_CHART})\n\n\
                 ![switchboard descriptors and streams during the soak]({SOAK_FDS_CHART})\n",
                soak::render(o)
            )
        },
        results_dir,
    );
    s += &section(
        "Cluster: routed latency across processes joined by Redis",
        "cluster",
        cluster::HOW,
        r.cluster.as_ref(),
        cluster::render,
        results_dir,
    );

    s += &section(
        "A million streams on this box: `scripts/c1m.sh`",
        "c1m",
        c1m::HOW,
        r.c1m.as_ref(),
        c1m::render,
        results_dir,
    );

    s += "## Peer configuration\n\n";
    s += &format!(
        "nginx runs as `nginx -p DIR/ -c DIR/nginx.conf -e DIR/error.log` (DIR a fresh temporary directory, \
         PORT a free port), stopped with SIGTERM to the master:\n\n```nginx\n{}```\n\n",
        nginx_conf("DIR", "PORT", None, None)
    );
    s += &format!(
        "switchboard runs as `SWITCHBOARD__SERVER__HOST=127.0.0.1 SWITCHBOARD__SERVER__PORT=PORT \
         SWITCHBOARD__SERVER__WORKERS={} SWITCHBOARD__LOG__LEVEL=warn target/release/switchboard` (every \
         other setting at its default: ticks every 10 s), stopped with SIGTERM.\n",
        servers::WORKERS
    );
    s += "\n`bench cluster` also runs `redis-server --port PORT --save '' --appendonly no --bind 127.0.0.1 \
          --dir DIR` (Debian's package), and the cluster as the same switchboard command with \
          `SWITCHBOARD__CLUSTER__REDIS_URL=redis://127.0.0.1:PORT`, `SWITCHBOARD__SERVER__WORKERS=W` and \
          `--processes N`; both are stopped with SIGTERM.\n";
    s
}

/// One benchmark's section: method, run line, tables, notes, commands.
fn section<D>(
    title: &str,
    name: &str,
    how: &str,
    outcome: Option<&Outcome<D>>,
    render: impl Fn(&Outcome<D>) -> String,
    results_dir: &str,
) -> String {
    let mut s = format!("## {title}\n\n{how}\n\n");
    let Some(o) = outcome else {
        s += &format!("Not measured yet: there is no `{results_dir}/{name}.json`.\n\n");
        return s;
    };
    s += &format!(
        "Run: `{}` — commit `{}`, {}, {:.0} s{}.\n\n",
        o.command,
        o.commit,
        utc(o.started_unix),
        o.elapsed_s,
        if o.smoke { ", **smoke run**" } else { "" }
    );
    s += &render(o);
    s += "\n";
    if !o.notes.is_empty() {
        s += "Notes from the run:\n\n";
        for n in &o.notes {
            s += &format!("- {}\n", n.replace('\n', " "));
        }
        s += "\n";
    }
    s += "<details><summary>Every server and tool command of this run</summary>\n\n```\n";
    for t in &o.tools {
        s += t;
        s += "\n";
    }
    s += "```\n\n</details>\n\n";
    s
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatcher::CounterCheck;
    use crate::outcome::Recorder;

    fn machine() -> Machine {
        Machine {
            cpu: "AMD EPYC".into(),
            cores: 2,
            mem_total: 24 << 30,
            kernel: "6.1.0".into(),
            open_files: "20000/20000".into(),
            packages: vec![("nginx".into(), "1.22.1-9".into())],
            rustc: "rustc 1.90.0".into(),
        }
    }

    fn full_results() -> Results {
        use crate::{broadcast, dispatcher, idle, latency};
        Results {
            idle: Some(Recorder::new("idle", false).finish(IdleData {
                rows: vec![
                    idle::tests::row(ServerKind::Switchboard, 19_000, 1536.0),
                    idle::tests::row(ServerKind::Nchan, 19_000, 11_300.0),
                    idle::tests::row(ServerKind::Switchboard, 1000, 1800.0),
                ],
                clock_ticks_per_sec: 100,
                not_supported: Vec::new(),
            })),
            dispatcher: Some(Recorder::new("dispatcher", false).finish(DispatcherData {
                pairs: vec![
                    dispatcher::tests::pair(64, 1, 60_000.0, 50_000.0),
                    dispatcher::tests::pair(256, 1, 40_000.0, 50_000.0),
                ],
                counter: CounterCheck::new(1_000_001, 1_000_000, 320),
                duration_s: 10,
                clock_ticks_per_sec: 100,
            })),
            latency: Some(Recorder::new("latency", false).finish(LatencyData {
                rows: vec![latency::tests::row(ServerKind::Switchboard, 2.5)],
            })),
            broadcast: Some(Recorder::new("broadcast", false).finish(BroadcastData {
                rows: vec![broadcast::tests::row(0, 19_000, 19_000, 150.0)],
            })),
            flood: None,
            connect: None,
            soak: Some(Recorder::new("soak", false).finish(SoakData {
                duration_s: 1800.0,
                rss_drift: Some(0.02),
                baseline: soak::Sample {
                    fds: 20,
                    ..soak::Sample::default()
                },
                after: soak::Sample {
                    fds: 20,
                    ..soak::Sample::default()
                },
                ..SoakData::default()
            })),
            cluster: Some(Recorder::new("cluster", false).finish(cluster::tests::data())),
            c1m: None,
        }
    }

    #[test]
    fn judges_every_target() {
        let t = targets(&full_results());
        assert_eq!(t.len(), 9);
        // No SSE or WebSocket rows in these results: not judged.
        assert!(t[1].measured.starts_with("not measured") && t[2].met.is_none());
        // 1,536 B > 1,500 B.
        assert_eq!((t[0].measured.as_str(), t[0].met), ("1,536 B", Some(false)));
        // 1.20× at 64 but 0.80× at 256.
        assert_eq!(t[3].met, Some(false));
        assert_eq!(
            t[3].measured,
            "1.20× at 64 connections, 0.80× at 256 connections; \
             CPU/request 0.80× nginx's at 64, 0.80× at 256 (lower is better)"
        );
        assert_eq!(
            (t[4].measured.as_str(), t[4].met),
            ("2.50 ms (lost 10)", Some(true))
        );
        // Over 4 processes 3.00 ms > 2 ms.
        assert_eq!(t[5].met, Some(false), "{}", t[5].measured);
        assert!(t[5].measured.starts_with("3.00 ms (lost "), "{}", t[5].measured);
        assert!(
            t[5].measured.ends_with("one process in the same run 2.00 ms"),
            "{}",
            t[5].measured
        );
        assert_eq!(t[6].met, Some(true));
        assert!(t[6].measured.contains("150.0 ms, received by 19,000 of 19,000"));
        assert_eq!((t[7].measured.as_str(), t[7].met), ("2.63 µs", Some(true)));
        assert_eq!(t[8].met, Some(true), "{}", t[8].measured);
        assert!(t[8].target.contains("(1,800 s)"), "{}", t[8].target);
        // A soak that lost a message, or drifted, or left descriptors, is not met.
        for spoil in [
            (|d: &mut SoakData| d.flood.messages.lost = 1) as fn(&mut SoakData),
            |d| d.rss_drift = Some(0.06),
            |d| d.after.fds = 21,
        ] {
            let mut r = full_results();
            if let Some(o) = r.soak.as_mut() {
                spoil(&mut o.data);
            }
            assert_eq!(targets(&r)[8].met, Some(false));
        }
    }

    #[test]
    fn missing_and_smoke_results_are_not_judged() {
        let none = targets(&Results::default());
        assert!(
            none.iter()
                .all(|j| j.met.is_none() && j.measured.starts_with("not measured"))
        );
        let mut r = full_results();
        if let Some(o) = r.dispatcher.as_mut() {
            o.smoke = true;
        }
        let t = targets(&r);
        assert_eq!(t[3].met, None);
        assert!(t[3].measured.ends_with("(smoke run)"));
        // Results from before CPU time was measured: req/s only.
        let mut r = full_results();
        if let Some(o) = r.dispatcher.as_mut() {
            for p in &mut o.data.pairs {
                p.switchboard_cpu = None;
                p.nginx_cpu = None;
            }
        }
        let t = targets(&r);
        assert_eq!(
            (t[3].measured.as_str(), t[3].met),
            ("1.20× at 64 connections, 0.80× at 256 connections", Some(false))
        );
        // A broadcast that missed one stream is not met even if fast.
        let mut r = full_results();
        if let Some(o) = r.broadcast.as_mut() {
            o.data.rows[0].received = 18_999;
        }
        assert_eq!(targets(&r)[3].met, Some(false));
    }

    #[test]
    fn document_says_it_is_generated_and_has_every_section() {
        let md = markdown(&full_results(), &machine(), "bench/results", "abc123");
        assert!(md.starts_with("# Benchmarks\n"));
        assert!(md.contains("Generated file — do not edit."));
        assert!(md.contains("| CPU "));
        assert!(md.contains("AMD EPYC (2 logical CPUs)"));
        for h in [
            "## Targets",
            "## Idle streams",
            "## `GET /dispatcher`",
            "## Routed",
            "## Broadcast",
            "## Connect rate",
            "## Soak",
            "## Cluster: routed latency",
        ] {
            assert!(md.contains(h), "missing {h}");
        }
        assert!(md.contains("](docs/soak-rss.svg)"));
        assert!(md.contains("p99: 4 processes ÷ 1 process = 1.50×."));
        assert!(md.contains("commit measured by `cluster`"));
        assert!(md.contains("Not measured yet: there is no `bench/results/connect.json`."));
        assert!(md.contains("## A million streams on this box"));
        assert!(md.contains("Not measured yet: there is no `bench/results/c1m.json`."));
        assert!(md.contains("](docs/bytes-per-stream.svg)"));
        assert!(md.contains("**not met**"));
        assert!(md.contains("listen 127.0.0.1:PORT backlog=4096;"));
        assert!(!md.contains("Smoke run."));
    }

    #[test]
    fn chart_has_a_line_per_server() {
        let r = full_results();
        let c = bytes_chart(&r.idle.unwrap().data);
        assert_eq!(c.series.len(), 2);
        assert_eq!(c.series[0].points, vec![(19_000.0, 1536.0), (1000.0, 1800.0)]);
        assert_eq!(c.series[1].points.len(), 1);
    }

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_796_022_308), "2026-11-30 07:05 UTC");
    }
}
